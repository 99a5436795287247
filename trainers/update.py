"""The update engine that PPO and GRPO hand their losses to.

``select`` keeps the rows (chunk-steps) an update trains on; ``optimize`` runs the epochs over them:
shuffled minibatches, the weight sums each loss divides by, the target-KL early stop, the optimizer
step with the bad-update guard, and the metric means. An algorithm supplies its math as
``loss_fn(batch: Minibatch) -> (loss, metrics)``, written as for one process, with ``batch.counts``
passed on as the denominators of its means.

Data parallel (``trainers/parallel.py``; the evaluator is then the DDP- or FSDP-wrapped policy):
each rank holds its own rows. Every rank splits them into the same number of minibatches (set by
the row count over all ranks); a rank with no share in a minibatch evaluates a blank row (a copy of
row 0 with its masks False), so that its forward and backward still run with the others' while it
adds nothing to any loss. The denominators (``weight_sums``), the early stop and the guard's
decision are sums over ranks, so all ranks step together, and each rank's loss, its share of the
loss over the whole minibatch, is scaled by the world size because DDP averages gradients over
ranks. At world size 1 all of this reduces to the single-process update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from policies.base import PolicyEval
from trainers import parallel
from trainers.optim import BadUpdateGuard, step_optimizer

Records = dict[str, torch.Tensor]


def minibatches(
    num_samples: int,
    batch_size: int | None,
    generator: torch.Generator | None,
    num_batches: int | None = None,
) -> Iterator[torch.Tensor]:
    """Shuffled index batches covering ``range(num_samples)`` once; the last one may be smaller.

    ``num_batches``: split into exactly this many near-equal batches instead (some may be empty):
    in a data-parallel update every rank splits its own rows into the same number of minibatches.
    """
    perm = torch.randperm(num_samples, generator=generator)
    if num_batches is not None:
        yield from perm.tensor_split(num_batches)
        return
    size = num_samples if batch_size is None else batch_size
    for start in range(0, num_samples, size):
        yield perm[start : start + size]


@dataclass
class Rows:
    """The rows an update trains on, this rank's: per-row ``data`` (advantages, old log-probs,
    masks...) and the policy's ``replay`` records. Data parallel, the blank row follows them."""

    data: Records
    replay: Records
    count: int  # this rank's rows (the blank row not counted)
    total: float  # rows over all ranks


def select(data: Records, replay: Records, keep: torch.Tensor, blank_masks: tuple[str, ...]) -> Rows:
    """The rows of ``data`` and ``replay`` (one per chunk-step, ``[M, ...]``) where ``keep`` ``[M]``
    is true. Data parallel, one more row is appended: row 0 with the masks ``blank_masks`` of
    ``data`` all False (the blank row a rank evaluates when it has no share in a minibatch)."""
    idx = torch.nonzero(keep).squeeze(-1)
    count = idx.numel()
    total = float(parallel.all_reduce_sum(torch.tensor(float(count))))
    if parallel.world_size() == 1:
        blank_masks = ()
    else:
        idx = torch.cat([idx, idx.new_zeros(1)])
    data = {k: v[idx] for k, v in data.items()}
    replay = {k: v[idx] for k, v in replay.items()}
    for key in blank_masks:
        data[key][-1] = False
    return Rows(data, replay, count, total)


@dataclass
class Minibatch:
    """One minibatch as a loss function sees it: this rank's rows, on the policy's device."""

    data: Records
    replay: Records
    rows: int  # rows over all ranks
    # the weight sums over all ranks, for the denominators of the loss's means; {} at world size 1
    # (the means then divide by their own sums)
    counts: dict[str, torch.Tensor]
    evaluator: nn.Module
    target_kl: float | None

    def evaluate(self, *replays: Records) -> list[PolicyEval]:
        """``policy.evaluate`` of each replay batch in one forward (DDP wants one per backward)."""
        return parallel.evaluate(self.evaluator, *replays)

    def kl_exceeded(self, approx_kl: torch.Tensor) -> bool:
        """The early stop (SB3's rule): whether the approximate KL to the collecting policy per
        chunk-step (``trainers.losses.chunk_kl``), this rank's share summed over ranks, passes 1.5x
        ``target_kl``. The loss function then returns
        None and the update ends before this minibatch's step."""
        if self.target_kl is None:
            return False
        return float(parallel.sum_over_ranks({"approx_kl": approx_kl})["approx_kl"]) > 1.5 * self.target_kl


# the loss to minimize and the metrics to report (0-dim tensors, this rank's shares), or None to stop
LossFn = Callable[[Minibatch], tuple[torch.Tensor, dict[str, torch.Tensor]] | None]


def optimize(
    rows: Rows,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    *,
    evaluator: nn.Module,
    device: torch.device,
    n_epochs: int,
    batch_size: int | None,
    target_kl: float | None,
    max_grad_norm: float | None,
    guard: BadUpdateGuard,
    generator: torch.Generator | None,
    weight_sums: Callable[[Records], dict[str, torch.Tensor]],
) -> dict[str, float]:
    """``n_epochs`` passes of shuffled minibatches (``batch_size`` rows; None: all) over ``rows``,
    one guarded optimizer step per minibatch on ``loss_fn``'s loss.

    ``weight_sums(data)``: the sums a minibatch's means divide by, from its ``data`` alone (e.g.
    ``losses.policy_loss_weights``); data parallel, they are summed over ranks into
    ``Minibatch.counts``. Returns the mean over the steps taken of each metric (with ``"loss"``
    and ``"grad_norm"``), and ``"updates"``, ``"skipped_updates"`` and ``"early_stop"``.
    """
    world = parallel.world_size()
    num_batches = parallel.minibatch_count(rows.total, batch_size) if world > 1 else None
    sums: dict[str, torch.Tensor] = {}
    updates = skipped = 0
    stop = False
    for _ in range(n_epochs):
        for idx in minibatches(rows.count, batch_size, generator, num_batches):
            count = idx.numel()
            if world > 1 and count == 0:
                idx = torch.tensor([rows.count])  # the blank row
            data = {k: v[idx].to(device) for k, v in rows.data.items()}
            counts: dict[str, torch.Tensor] = {}
            if world > 1:
                counts = parallel.sum_over_ranks({**weight_sums(data), "rows": count})
                count = int(counts["rows"])
                if count == 0:  # this minibatch is empty on every rank
                    continue
            replay = {k: v[idx].to(device) for k, v in rows.replay.items()}
            out = loss_fn(Minibatch(data, replay, count, counts, evaluator, target_kl))
            if out is None:
                stop = True
                break
            loss, metrics = out
            # this rank's shares summed over ranks: the minibatch's values, the same on every rank
            reported = parallel.sum_over_ranks({**metrics, "loss": loss})
            # DDP averages the gradients over ranks: scaling by the world size makes that their sum
            stepped, grad_norm = step_optimizer(
                loss * world, optimizer, max_grad_norm, guard, guard_loss=reported["loss"]
            )
            updates += stepped
            skipped += not stepped
            if not stepped:
                continue
            for key, value in {**reported, "grad_norm": grad_norm}.items():  # summed as tensors: one host
                sums[key] = sums.get(key, 0.0) + value.detach()  # sync per metric at the end
        if stop:
            break
    means = {key: float(value) / max(updates, 1) for key, value in sums.items()}
    return {**means, "updates": float(updates), "skipped_updates": float(skipped), "early_stop": float(stop)}
