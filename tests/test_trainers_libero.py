"""GRPO on the real LIBERO simulator with a small image policy: collect, update, checkpoint,
resume, evaluate with a video, through the command line."""

from __future__ import annotations

import json

import imageio.v3 as iio
import pytest
from conftest import requires_libero

from trainers import checkpoint as ckpt
from trainers.grpo import train as grpo_train
from trainers.metrics import read_metrics

pytestmark = requires_libero

ENV_KWARGS = {
    "chunk_size": 4,
    "image_size": 32,
    "max_episode_steps": 12,
    "task_ids": [0],
    "envs_per_worker": 2,
}
POLICY_KWARGS = {"hidden_sizes": [32], "squash": True, "log_std_init": -1.0}


@pytest.mark.slow
def test_grpo_on_libero_spatial_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps(ENV_KWARGS),
        "--policy", "gaussian", "--policy-kwargs", json.dumps(POLICY_KWARGS),
        "--num-envs", "2", "--group-size", "2", "--log-prob-level", "element", "--learning-rate", "1e-3",
        "--no-dynamic-sampling", "--eval-episodes", "2", "--run-dir", str(run_dir),
        "--no-progress", "--torch-threads", "1",
    ]  # fmt: skip
    first = grpo_train.main([*args, "--total-steps", "24"])  # one round: 2 envs x 12 sub-steps
    assert first["iteration"] == 1 and 0.0 <= first["eval/success"] <= 1.0
    assert first["eval/episode_len"] == 12.0  # nobody solves the task by chance in 12 steps
    _, data = ckpt.latest_checkpoint(run_dir)
    assert data["counters"] == {**data["counters"], "iteration": 1, "env_steps": 24}

    final = grpo_train.main(["--resume", str(run_dir), "--total-steps", "48", "--no-progress"])
    assert final["iteration"] == 2
    _, data = ckpt.latest_checkpoint(run_dir)
    assert data["counters"]["env_steps"] == 48
    assert data["policy"]["name"] == "policies.gaussian:GaussianPolicy"

    rows = read_metrics(run_dir)
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["iteration"] for r in train_rows] == [1, 2]
    assert all(r["env/episode_len"] == 12.0 and r["env/success_once"] == 0.0 for r in train_rows)
    # no episode succeeds in 12 steps: every score is 0, so the advantages and the loss are 0, but
    # the update still runs (dynamic sampling, off here, would have masked both groups)
    assert all(r["train/updates"] == 1 and r["train/loss"] == 0.0 for r in train_rows)
    videos = sorted((run_dir / "videos").glob("*.mp4"))
    assert len(videos) == 2
    frames = iio.imread(videos[-1])
    assert frames.shape[1:] == (32, 64, 3) and frames.shape[0] == 12 // 4 + 1  # reset + one frame per chunk
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_sac_from_the_clone_with_expert_prior_data(tmp_path):
    """The SAC recipe's path on the real simulator: prior data from the scripted expert (one action
    per step, re-chunked to K = 8), the repository's state-based clone as the actor, RLPD batches,
    offline steps, the BC term, and a held-out evaluation."""
    from trainers import demos
    from trainers.sac import train as sac_train

    state = {"cameras": [], "task_state": True, "task_ids": [0], "init_states": [0, 1]}
    demos.main(
        ["--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps({**state, "chunk_size": None}),
         "--num-envs", "2", "--episodes", "2", "--out", str(tmp_path / "demos.h5")]
    )  # fmt: skip
    weak = "checkpoints/bc_libero_spatial_state_weak.pt"
    final = sac_train.main(
        ["--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps({**state, "max_episode_steps": 48}),
         "--eval-env-kwargs", json.dumps({**state, "init_states": [40]}), "--init-policy", weak,
         "--policy-kwargs", '{"log_std_bounds": [-20.0, -1.5]}', "--num-envs", "2", "--total-steps", "96",
         "--steps-per-iteration", "3", "--learning-starts", "4", "--batch-size", "16", "--warmup", "policy",
         "--prior-data", str(tmp_path / "demos.h5"), "--offline-steps", "2", "--bc-coef", "0.1",
         "--n-step", "2", "--no-learn-alpha", "--init-alpha", "1e-5",
         "--critic-layer-norm", "--eval-episodes", "1", "--run-dir", str(tmp_path / "run"),
         "--no-progress", "--torch-threads", "1", "--no-video"]
    )  # fmt: skip
    assert final["train/bc_loss"] > 0 and final["train/alpha"] == pytest.approx(1e-5)
    assert 0.0 <= final["eval/success"] <= 1.0 and final["iteration"] == 2
    buffer = ckpt.latest_checkpoint(tmp_path / "run")[1]["extra"]["buffer"]
    assert set(buffer["obs"]) == {"proprio", "task_state", "instruction"} and buffer["actions"].shape[1:] == (
        8,
        7,
    )
