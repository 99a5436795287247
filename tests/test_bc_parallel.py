"""Data-parallel behaviour cloning (``torchrun -m trainers.bc``, ``trainers/parallel.py``) on CPU with gloo.

Two ranks walk the same shuffled epochs and each trains on its half of every minibatch: their weights,
losses and evaluation must be those of one process with the same (global) ``--batch-size``, with DDP
and with FSDP2 (with activation checkpointing). The demos are cut into chunks with masked tails, so
the ranks' shares hold different numbers of executed sub-steps, and the last minibatch has a single
row, so one rank has no share in it. A tiny OpenVLA-OFT (its vision blocks and LLaMA layers as FSDP
units) clones through torchrun FSDP2 as well.
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from tests.test_trainers_parallel import FAST, _assert_close, _torchrun
from trainers import bc, parallel
from trainers.checkpoint import latest_checkpoint
from trainers.datasets.demos import Episode, read_demos, write_demos
from trainers.metrics import read_metrics

ENV_ID = "BcCounting-v0"
ENV = f"tests.test_bc_parallel:{ENV_ID}"  # torchrun's ranks import this module to register the env

if ENV_ID not in gym.registry:
    gym.register(ENV_ID, vector_entry_point="tests.counting_env:CountingVectorEnv")


def _demos(path) -> str:
    """Counting-env episodes recorded one action per step (cut into chunks of 2 by the env's
    chunk size: each episode's last chunk has one executed sub-step)."""
    rng = np.random.default_rng(0)
    episodes = []
    for goal in (5, 6, 4, 7, 7):
        pos = np.arange(goal, dtype=np.float32)
        proprio = np.stack([pos, np.full(goal, goal)], 1).astype(np.float32)
        actions = np.tanh(proprio @ rng.normal(size=(2, 2)) * 0.3)[:, None, :].astype(np.float32)
        episodes.append(
            Episode(
                obs={"image": np.zeros((goal, 2, 2, 3), np.uint8) + pos[:, None, None, None].astype(np.uint8),
                     "proprio": proprio},
                actions=actions, valid=np.ones((goal, 1), bool), rewards=np.zeros((goal, 1), np.float32),
                instruction="walk", success=True,
            )
        )  # fmt: skip
    return str(write_demos(path, episodes, {"env": ENV_ID, "chunk_size": 1}))


def _args(demos: str, run_dir, *extra: str) -> list[str]:
    return [
        "--demos", demos, "--env", ENV, "--env-kwargs", '{"chunk_size": 2}', "--num-envs", "2",
        "--policy", "gaussian", "--policy-kwargs", '{"hidden_sizes": [16]}', "--epochs", "2",
        "--batch-size", "6", "--val-fraction", "0.2", "--image-shift", "0", "--learning-rate", "3e-3",
        "--eval-episodes", "3", "--checkpoint-every", "0", "--no-tensorboard", "--run-dir", str(run_dir),
        *extra, *FAST,
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_torchrun_bc_over_two_ranks_equals_one_process(tmp_path, data_parallel):
    demos = _demos(tmp_path / "demos.h5")
    train, _ = bc.split_episodes(read_demos(demos), 0.2, seed=0)
    assert len(train.chunks(["proprio"], 2)["actions"]) % 6 == 1  # a last minibatch of one row

    one = bc.main(_args(demos, tmp_path / "one"))
    extra = ["--data-parallel", "fsdp", "--activation-checkpointing"] if data_parallel == "fsdp" else []
    stdout = _torchrun("-m", "trainers.bc", *_args(demos, tmp_path / "two", *extra))

    assert stdout.count("summary: ") == 1  # rank 0 alone reports and writes
    single, both = latest_checkpoint(tmp_path / "one")[1], latest_checkpoint(tmp_path / "two")[1]
    assert both["counters"] == {**single["counters"], "elapsed": both["counters"]["elapsed"]}
    _assert_close(both["policy"]["state_dict"], single["policy"]["state_dict"], atol=1e-6)
    adam = single["optimizer"]["state"][0]  # 2 epochs of 5 minibatches, with gradients: it learned
    assert adam["step"] == 10 and adam["exp_avg"].abs().max() > 1e-4

    rows = {
        name: [r for r in read_metrics(tmp_path / name) if "train/bc_loss" in r] for name in ("one", "two")
    }
    assert [r["iteration"] for r in rows["two"]] == [1, 2]
    for a, b in zip(rows["one"], rows["two"]):
        for key in ("train/bc_loss", "train/val_loss", "train/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), key
    episodes = [
        json.loads(line) for line in (tmp_path / "two" / "eval_episodes.jsonl").read_text().splitlines()
    ]
    alone = [json.loads(line) for line in (tmp_path / "one" / "eval_episodes.jsonl").read_text().splitlines()]
    assert [e["return"] for e in episodes] == [e["return"] for e in alone] and len(episodes) == 3
    assert one["eval/return"] == pytest.approx(np.mean([e["return"] for e in alone]))


def test_a_batch_size_that_does_not_split_over_the_ranks_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="batch_size=6 .* does not split over 4 ranks"):
        bc.main(
            ["--demos", str(tmp_path / "missing.h5"), "--batch-size", "6", "--run-dir", str(tmp_path / "x")]
        )
    assert not any(tmp_path.iterdir()) and parallel.world_size() == 1


@pytest.mark.slow
def test_torchrun_fsdp_bc_of_a_tiny_openvla_oft_equals_one_process(tmp_path):
    from policies.openvla_oft.tiny import write_tiny_openvla
    from tests.test_bc_vla import ENV_ID as VLA_ENV
    from tests.test_bc_vla import _demos as vla_demos

    model = write_tiny_openvla(tmp_path / "oft")
    demos = str(vla_demos(tmp_path / "demos.h5", episodes=2, steps=2))  # 4 rows: 2 minibatches of 2
    kwargs = {"model_path": str(model), "action_head": "l1", "new_action_head": True}
    common = [
        "--demos", demos, "--env", f"tests.test_bc_vla:{VLA_ENV}", "--num-envs", "2",
        "--policy", "openvla_oft", "--policy-kwargs", json.dumps(kwargs), "--epochs", "1",
        "--batch-size", "2", "--val-fraction", "0", "--image-shift", "0", "--eval-every", "-1",
        # the split is under test, not the recipe: settings under which Adam's first steps are well
        # conditioned (the tiny recipe's 3e-3 without clipping moves elements whose gradient is near
        # Adam's eps by 1e-4 between the two processes' summation orders)
        "--learning-rate", "1e-3", "--weight-decay", "0", "--max-grad-norm", "1.0",
        "--no-tensorboard", *FAST,
    ]  # fmt: skip
    bc.main([*common, "--run-dir", str(tmp_path / "one")])
    fsdp = ["--data-parallel", "fsdp", "--activation-checkpointing"]
    stdout = _torchrun("-m", "trainers.bc", *common, *fsdp, "--run-dir", str(tmp_path / "two"), timeout=300)
    assert stdout.count("summary: ") == 1
    single, both = latest_checkpoint(tmp_path / "one")[1], latest_checkpoint(tmp_path / "two")[1]
    assert both["counters"]["iteration"] == 1 and both["counters"]["env_steps"] == 4 * 4
    _assert_close(both["policy"]["state_dict"], single["policy"]["state_dict"], atol=1e-5)
    (row,) = [r for r in read_metrics(tmp_path / "two") if "train/bc_loss" in r]
    assert row["train/bc_loss"] == pytest.approx(read_metrics(tmp_path / "one")[0]["train/bc_loss"], rel=1e-5)
