"""The update engine (``trainers/update.py``) on its own, in one process: row selection, the
minibatch count, metric means, the target-KL early stop and the bad-update guard. Its data-parallel
side is checked through PPO and GRPO in ``test_trainers_parallel.py`` and ``test_trainers_fsdp.py``."""

from __future__ import annotations

import math
import warnings

import torch

from policies.base import PolicyEval
from trainers import update
from trainers.optim import BadUpdateGuard
from trainers.parallel import Evaluate


class Line(torch.nn.Module):
    """``y = w x``; ``evaluate`` returns the prediction as the "log-prob"."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        return PolicyEval(self.w * replay["x"], None, None)


def _run(loss_fn, n_epochs=3, batch_size=4, target_kl=None, guard=None):
    model = Line()
    x = torch.arange(10.0)
    rows = update.select({"y": 2 * x}, {"x": x}, x % 2 == 0, blank_masks=("y",))  # 5 rows
    metrics = update.optimize(
        rows,
        torch.optim.SGD(model.parameters(), lr=1e-3),
        loss_fn,
        evaluator=Evaluate(model),
        device=torch.device("cpu"),
        n_epochs=n_epochs,
        batch_size=batch_size,
        target_kl=target_kl,
        max_grad_norm=None,
        guard=guard or BadUpdateGuard(),
        generator=torch.Generator().manual_seed(0),
        weight_sums=lambda data: {},
    )
    return rows, model, metrics


def _mse(batch: update.Minibatch):
    (out,) = batch.evaluate(batch.replay)
    loss = ((out.log_probs - batch.data["y"]) ** 2).mean()
    return loss, {"rows": torch.tensor(float(len(batch.data["y"])))}


def test_minibatches_cover_the_rows_once():
    gen = torch.Generator().manual_seed(0)
    assert [len(i) for i in update.minibatches(10, 4, gen)] == [4, 4, 2]
    assert [len(i) for i in update.minibatches(3, 4, gen, num_batches=4)] == [1, 1, 1, 0]
    assert sorted(torch.cat(list(update.minibatches(10, 3, gen))).tolist()) == list(range(10))


def test_optimize_steps_every_minibatch_and_averages_metrics():
    rows, model, m = _run(_mse)
    assert (rows.count, rows.total) == (5, 5.0) and rows.data["y"].tolist() == [0, 4, 8, 12, 16]
    assert m["updates"] == 3 * math.ceil(5 / 4) and m["skipped_updates"] == 0 and m["early_stop"] == 0
    assert m["rows"] == 2.5  # minibatches of 4 and 1 rows
    assert 0 < model.w.item() < 2 and m["loss"] > 0 and m["grad_norm"] > 0


def test_early_stop_ends_the_update_before_the_step():
    def loss_fn(batch):
        if batch.kl_exceeded(torch.tensor(0.2)):
            return None
        return _mse(batch)

    _, model, m = _run(loss_fn, target_kl=0.1)
    assert m["early_stop"] == 1 and m["updates"] == 0 and model.w.item() == 0
    _, _, m = _run(loss_fn, target_kl=0.2)  # 0.2 <= 1.5 * 0.2: no stop
    assert m["early_stop"] == 0 and m["updates"] == 6


def test_non_finite_losses_are_skipped():
    def loss_fn(batch):
        loss, metrics = _mse(batch)
        return loss * float("nan"), metrics

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, model, m = _run(loss_fn, n_epochs=1, guard=BadUpdateGuard(max_in_a_row=5))
    assert m["updates"] == 0 and m["skipped_updates"] == 2 and model.w.item() == 0
