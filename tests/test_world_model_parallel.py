"""``torchrun -m trainers.world_model`` (issue 49) on CPU with gloo: two ranks, each computing the loss of
half of every batch, take the steps one process takes (DDP, and FSDP2 with activation checkpointing); rank 0
alone writes; the two-rank checkpoint resumes in one process exactly; a batch that does not split over the
ranks is refused before any work."""

from __future__ import annotations

import pytest
import test_world_model_cosmos_train as cosmos
import test_world_model_train as opensora
import torch

from nets.errors import BadInput
from tests.test_trainers_parallel import _torchrun
from trainers.checkpoint import load_checkpoint
from trainers.metrics import read_metrics

COMMON = ["--eval-every", "2", "--log-every", "1", "--checkpoint-every", "2", "--keep-checkpoints", "0"]


def _close(a: dict, b: dict, atol: float = 1e-5, rtol: float = 0.0) -> None:
    """Equal up to summation order: Adam (eps 1e-15) moves the few weights whose gradient is near zero by
    ~1e-6 between the two processes' orders."""
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=rtol, msg=key)


def _bundle_weights(bundle) -> dict[str, torch.Tensor]:
    """The DiT weights in a bundle: OpenSora's safetensors, or the Cosmos checkpoint (net., net_ema.)."""
    from safetensors.torch import load_file

    from trainers.world_model.cosmos_model import DIT_FILE

    if (bundle / DIT_FILE).exists():
        return {k: v.float() for k, v in torch.load(bundle / DIT_FILE, weights_only=True).items()}
    return load_file(bundle / "model-00001-of-00001.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, data_parallel", [("opensora", "ddp"), ("opensora", "fsdp"), ("cosmos", "fsdp")]
)
def test_torchrun_world_model_over_two_ranks_takes_the_one_process_steps(tmp_path, backend, data_parallel):
    tests = opensora if backend == "opensora" else cosmos
    demos = tests.synthetic_demos(tmp_path / "demos.h5", episodes=3)
    for steps in (2, 4):  # one process: the bundle after 2 steps, the run to 4
        tests.main(tests.args(tmp_path, demos, "--steps", str(steps), *COMMON, out=f"one{steps}"))
    extra = ["--data-parallel", data_parallel]
    if data_parallel == "fsdp":
        extra.append("--activation-checkpointing")
    two = tests.args(tmp_path, demos, "--steps", "2", *COMMON, *extra, out="two")
    stdout = _torchrun("-m", "trainers.world_model", *two, timeout=240)
    assert stdout.count("world model: 2 steps") == 1  # rank 0 alone reports

    # the checkpoint after 2 steps: whole tensors, the one-process layout, the same weights, EMA, Adam state
    one = load_checkpoint(tmp_path / "one4.run" / "checkpoints" / "iter_000002.pt")
    both = load_checkpoint(tmp_path / "two.run" / "checkpoints" / "iter_000002.pt")
    _close(both["model"], one["model"])
    _close(both["ema"], one["ema"])
    assert both["optimizer"]["param_groups"] == one["optimizer"]["param_groups"]
    for i, state in one["optimizer"]["state"].items():
        _close(both["optimizer"]["state"][i], state)
    assert max(s["exp_avg"].abs().max() for s in one["optimizer"]["state"].values()) > 1e-4  # it learned
    assert both["counters"]["iteration"] == 2  # and the same draws, from one stream:
    assert torch.equal(both["rng"]["generators"]["world_model"], one["rng"]["generators"]["world_model"])
    # the bundle rank 0 wrote from the whole (FSDP: gathered) weights (Cosmos': bf16, one rounding step apart)
    _close(_bundle_weights(tmp_path / "two"), _bundle_weights(tmp_path / "one2"), rtol=1e-2)

    # rank 0 alone wrote the metrics: each row once, the losses of the whole batch
    rows = {name: read_metrics(tmp_path / f"{name}.run") for name in ("one4", "two")}
    assert [r["iteration"] for r in rows["two"]] == [0, 1, 2]
    for a, b in zip(rows["one4"], rows["two"]):
        for key in b:
            if key.startswith(("train/", "eval/")):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key

    # the two-rank run resumed in one process ends where the one-process run ended
    tests.main(["--resume", str(tmp_path / "two.run"), "--steps", "4", "--no-progress", "--overwrite"])
    end_one = load_checkpoint(tmp_path / "one4.run" / "checkpoints" / "iter_000004.pt")
    end_two = load_checkpoint(tmp_path / "two.run" / "checkpoints" / "iter_000004.pt")
    _close(end_two["model"], end_one["model"])
    _close(end_two["ema"], end_one["ema"])


def test_activation_checkpointing_in_one_process_takes_the_same_steps(tmp_path):
    """Recomputing each block's activations in backward changes memory, not the steps."""
    demos = opensora.synthetic_demos(tmp_path / "demos.h5", episodes=2)
    for name, extra in (("plain", []), ("recompute", ["--activation-checkpointing"])):
        opensora.main(opensora.args(tmp_path, demos, "--steps", "2", *extra, out=name))
    plain = load_checkpoint(tmp_path / "plain.run" / "checkpoints" / "iter_000002.pt")
    recompute = load_checkpoint(tmp_path / "recompute.run" / "checkpoints" / "iter_000002.pt")
    _close(recompute["model"], plain["model"], atol=1e-6)
    assert max(s["exp_avg"].abs().max() for s in plain["optimizer"]["state"].values()) > 1e-4  # it learned


def test_a_batch_that_does_not_split_over_the_ranks_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    demos = opensora.synthetic_demos(tmp_path / "demos.h5", episodes=2)
    with pytest.raises(BadInput, match="batch_size=6 .* does not split over 4 ranks"):
        opensora.main(opensora.args(tmp_path, demos, "--batch-size", "6", "--steps", "1"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demos.h5"]
