"""RLinf's recipe end to end: GRPO in a (tiny) Cosmos world model, evaluation in the LIBERO simulator."""

from __future__ import annotations

import json

import imageio.v3 as iio
import pytest
from conftest import requires_libero

from envs.world_models.tiny import write_tiny_bundle
from trainers.grpo import train as grpo_train
from trainers.metrics import read_metrics

pytestmark = requires_libero


@pytest.mark.slow
def test_grpo_in_the_world_model_evaluated_in_the_simulator(tmp_path):
    bundle = write_tiny_bundle("cosmos", tmp_path / "cosmos")
    size = [32, 48]
    wm_kwargs = {"model_dir": str(bundle), "image_size": size, "model_options": {"num_steps": 2},
                 "max_episode_steps": 16, "reward_coef": 5.0}  # fmt: skip
    # what CosmosWorldModelEnv.sim_env_kwargs() gives, plus a short episode on one task
    sim_kwargs = {"image_size": size, "cameras": ["agentview"], "proprio": False, "chunk_size": 8,
                  "max_episode_steps": 16, "task_ids": [0]}  # fmt: skip
    run_dir = tmp_path / "run"
    args = [
        "--env", "envs:CosmosWM-LiberoSpatial-v0", "--env-kwargs", json.dumps(wm_kwargs),
        "--eval-env", "envs:Libero-Spatial-v0", "--eval-env-kwargs", json.dumps(sim_kwargs),
        "--policy", "gaussian", "--policy-kwargs", json.dumps({"hidden_sizes": [32], "squash": True}),
        "--num-envs", "4", "--group-size", "2", "--total-steps", "64", "--no-dynamic-sampling",
        "--eval-episodes", "2", "--run-dir", str(run_dir), "--no-progress", "--torch-threads", "1",
    ]  # fmt: skip
    final = grpo_train.main(args)
    assert final["iteration"] == 1
    train = [r for r in read_metrics(run_dir) if "train/loss" in r]
    assert len(train) == 1 and train[0]["env/episode_len"] == 16  # the tiny reward model never says success
    # the evaluation ran in the simulator: LIBERO frames at the world model's size, 2 chunks long
    assert final["eval/episode_len"] == 16.0
    frames = iio.imread(sorted((run_dir / "videos").glob("*.mp4"))[-1])
    assert frames.shape[1:] == (32, 96, 3) and frames.shape[0] == 16 // 8 + 1
