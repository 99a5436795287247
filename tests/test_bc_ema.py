"""The weight average of behaviour cloning (``trainers.optim.WeightEMA``, ``bc --ema-decay``): its
arithmetic, what checkpoints hold, an exact resume, and the settings it refuses."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from nets.errors import BadInput
from trainers import bc
from trainers.checkpoint import latest_checkpoint
from trainers.datasets.demos import Episode, write_demos
from trainers.optim import WeightEMA


def test_the_average_follows_each_step_and_a_swap_twice_restores_both():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    net[0].weight.requires_grad_(False)  # frozen: not averaged
    ema = WeightEMA(net, 0.9)
    assert "0.weight" not in ema.average and "1.bias" in ema.average
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    expected = {n: t.clone() for n, t in start.items()}
    for _ in range(3):
        with torch.no_grad():
            for p in net.parameters():
                if p.requires_grad:
                    p.add_(1.0)
        ema.update()
        for n, p in net.named_parameters():
            expected[n] = 0.9 * expected[n] + 0.1 * p.detach()
    trained = {n: p.detach().clone() for n, p in net.named_parameters()}
    ema.swap()
    for n, p in net.named_parameters():
        want = expected[n] if p.requires_grad else start[n]
        torch.testing.assert_close(p.detach(), want)
    with pytest.raises(RuntimeError, match="swap back"):
        ema.update()
    ema.swap()
    for n, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), trained[n])
    with pytest.raises(ValueError, match="decay"):
        WeightEMA(net, 1.0)
    with pytest.raises(ValueError, match="shape"):
        ema.load_state_dict({n: torch.zeros(1) for n in ema.average}, swapped=False)


def _demos(tmp_path):
    if "SacCounting-v0" not in gym.registry:
        gym.register("SacCounting-v0", vector_entry_point="counting_env:CountingVectorEnv")
    rng = np.random.default_rng(0)
    eps = []
    for goal in (4, 5, 6):
        pos = np.arange(goal, dtype=np.float32)
        eps.append(Episode(
            obs={"image": np.zeros((goal, 2, 2, 3), np.uint8), "proprio": np.stack([pos, pos * 2], 1)},
            actions=rng.uniform(-1, 1, (goal, 1, 2)).astype(np.float32), valid=np.ones((goal, 1), bool),
            rewards=np.zeros((goal, 1), np.float32), instruction="walk", success=True,
        ))  # fmt: skip
    return write_demos(tmp_path / "demos.h5", eps, {"env": "SacCounting-v0", "chunk_size": 1})


def _bc(path, run_dir, *extra):
    return bc.main(
        ["--demos", str(path), "--env", "SacCounting-v0", "--env-kwargs", '{"chunk_size": 1}',
         "--num-envs", "1", "--policy", "gaussian", "--policy-kwargs", json.dumps({"hidden_sizes": [8]}),
         "--val-fraction", "0", "--eval-every", "-1", "--batch-size", "4", "--learning-rate", "0.01",
         "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard", "--no-video", *extra]
    )  # fmt: skip


def test_checkpoints_hold_the_average_and_a_resumed_run_equals_an_unbroken_one(tmp_path):
    path = _demos(tmp_path)
    _bc(path, tmp_path / "plain", "--epochs", "4")
    _bc(path, tmp_path / "whole", "--epochs", "4", "--ema-decay", "0.8")
    _bc(path, tmp_path / "broken", "--epochs", "2", "--ema-decay", "0.8", "--checkpoint-every", "1")
    broken = tmp_path / "broken"
    _bc(path, broken, "--epochs", "4", "--ema-decay", "0.8", "--resume", str(broken))
    plain = latest_checkpoint(tmp_path / "plain")[1]
    whole = latest_checkpoint(tmp_path / "whole")[1]
    broken = latest_checkpoint(tmp_path / "broken")[1]
    assert whole["counters"]["iteration"] == broken["counters"]["iteration"] == 4
    trained = whole["extra"][bc.EMA_KEY]
    averaged = whole["policy"]["state_dict"]
    # the trained weights are the plain run's (averaging does not change training) ...
    for name, value in trained.items():
        torch.testing.assert_close(value, plain["policy"]["state_dict"][name].float())
    # ... and the policy entry is their average, not the same weights
    assert any(not torch.equal(averaged[name].float(), value) for name, value in trained.items())
    for key in ("policy", "extra"):
        left = whole[key]["state_dict"] if key == "policy" else whole[key][bc.EMA_KEY]
        right = broken[key]["state_dict"] if key == "policy" else broken[key][bc.EMA_KEY]
        for name, value in left.items():
            torch.testing.assert_close(right[name], value, rtol=0, atol=0)


def test_bad_average_settings_are_refused_before_training(tmp_path):
    path = _demos(tmp_path)
    with pytest.raises(BadInput, match="ema_decay must be in"):
        _bc(path, tmp_path / "a", "--epochs", "1", "--ema-decay", "1.0")
    _bc(path, tmp_path / "b", "--epochs", "1", "--ema-decay", "0.5")
    with pytest.raises(BadInput, match="same ema_decay"):
        _bc(path, tmp_path / "b", "--epochs", "2", "--ema-decay", "0", "--resume", str(tmp_path / "b"))
    _bc(path, tmp_path / "c", "--epochs", "1")
    with pytest.raises(BadInput, match="did not average"):
        _bc(path, tmp_path / "c", "--epochs", "2", "--ema-decay", "0.5", "--resume", str(tmp_path / "c"))
