"""What a run leaves for a person: evaluations that cover an env's initial frames, per-task tables,
the learning curve, summary.md and the video grid."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from policies import GaussianPolicy
from tests.counting_env import CountingVectorEnv
from trainers.evaluation import evaluate, evaluate_episodes, video_grid
from trainers.grpo import train as grpo_train
from trainers.report import evaluation_table

COUNTING_ID = "TestCounting-v0"
if COUNTING_ID not in gym.registry:
    gym.register(COUNTING_ID, vector_entry_point="tests.counting_env:CountingVectorEnv")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_evaluation_runs_each_initial_frame_once():
    env = CountingVectorEnv(num_envs=2, autoreset_mode="Disabled")  # 5 frames, goals 3 4 5 6 20
    policy = GaussianPolicy(env.single_observation_space, env.single_action_space)
    episodes = evaluate_episodes(policy, env, 5, seed=3)
    assert sorted(ep["frame"] for ep in episodes) == [0, 1, 2, 3, 4]
    assert {ep["task"] for ep in episodes} == {f"walk/{g}" for g in (3, 4, 5, 6, 20)}
    stats = evaluate(policy, env, 5, seed=3)  # frame and task are not averaged
    assert stats["episodes"] == 5 and "frame" not in stats and "task" not in stats
    assert stats["success"] == np.mean([ep["success"] for ep in episodes])


def test_evaluation_table_counts_per_task_with_wilson_intervals():
    eps = [{"task": "suite/a", "success_once": 1.0}] * 3 + [{"task": "suite/b", "success_once": 0.0}]
    table = "\n".join(evaluation_table(eps))
    assert "| a | 3/3 = 100.0% [0.44, 1.00] |" in table
    assert "| b | 0/1 = 0.0% [0.00, 0.79] |" in table
    assert "**3/4 = 75.0% [0.30, 0.95]**" in table


def test_video_grid_rows_of_four_padded_black():
    images = [np.full((2, 3, 3), i + 1, np.uint8) for i in range(5)]
    grid = video_grid(images)
    assert grid.shape == (4, 12, 3)
    assert grid[0, 9, 0] == 4 and grid[2, 0, 0] == 5 and grid[2, 3:].max() == 0
    assert video_grid(images[:2]).shape == (2, 6, 3)


def test_run_writes_summary_learning_curve_and_evaluations_before_and_after(tmp_path):
    run_dir = tmp_path / "run"
    grpo_train.main(
        [
            "--env", COUNTING_ID, "--env-kwargs", '{"chunk_size": 4}', "--num-envs", "4",
            "--group-size", "2", "--total-steps", "200", "--eval-at-start", "--eval-episodes", "5",
            "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard", "--no-video",
        ]
    )  # fmt: skip
    rows = [json.loads(line) for line in (run_dir / "eval_episodes.jsonl").read_text().splitlines()]
    steps = sorted({r["env_step"] for r in rows})
    assert steps[0] == 0 and len(steps) == 2 and steps[1] >= 200
    for step in steps:
        assert sorted(r["frame"] for r in rows if r["env_step"] == step) == [0, 1, 2, 3, 4]
    summary = (run_dir / "summary.md").read_text()
    assert "## Evaluation before training (5 episodes" in summary
    assert f"## Evaluation after {steps[1]} env steps" in summary
    assert "**Change on the 5 initial frames evaluated before and after:" in summary
    assert "| 20 | 0/1 = 0.0%" in summary  # the 20-cell walk cannot succeed within 10 steps
    assert "[`learning_curve.png`](learning_curve.png)" in summary
    png = (run_dir / "learning_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_policies_load_on_their_own_keys_and_resume_as_built(tmp_path):
    """A policy reads only the observation keys it was trained on (an eval env may render more);
    a run started from another run's policy resumes with that policy's class and arguments."""
    from gymnasium import spaces

    from trainers.checkpoint import load_policy

    base = ["--env", COUNTING_ID, "--env-kwargs", '{"chunk_size": 4}', "--num-envs", "4", "--group-size", "2",
            "--eval-every", "-1", "--no-progress", "--no-tensorboard", "--no-video"]  # fmt: skip
    grpo_train.main([*base, "--total-steps", "40", "--policy-kwargs", '{"hidden_sizes": [16]}',
                     "--run-dir", str(tmp_path / "a")])  # fmt: skip
    env = CountingVectorEnv(num_envs=1)
    wider = spaces.Dict({**env.single_observation_space.spaces, "depth": spaces.Box(0, 1, (3,))})
    policy = load_policy(tmp_path / "a", wider, env.single_action_space)
    assert sorted(policy.torso.kinds) == ["image", "instruction", "proprio"]
    with pytest.raises(ValueError, match=r"the env has no \['proprio'\]"):
        narrow = spaces.Dict({k: v for k, v in wider.spaces.items() if k != "proprio"})
        load_policy(tmp_path / "a", narrow, env.single_action_space)

    b = [
        *base,
        "--init-policy",
        str(tmp_path / "a"),
        "--run-dir",
        str(tmp_path / "b"),
        "--checkpoint-every",
        "1",
    ]
    grpo_train.main([*b, "--total-steps", "40"])
    final = grpo_train.main([*b, "--total-steps", "80", "--resume", str(tmp_path / "b")])
    assert final["iteration"] > 1
    assert load_policy(tmp_path / "b", wider, env.single_action_space).torso.trunk[0].out_features == 16


def test_evaluation_refills_finished_envs_and_runs_no_extra_episode(tmp_path):
    """DISABLED mode: a finished env starts the next frame at once; nothing runs beyond the
    frames asked for, and the video shows each env's first episode (frozen once it ended)."""
    import imageio.v3 as iio

    env = CountingVectorEnv(num_envs=2, autoreset_mode="Disabled")  # goals 3 4 5 6 20
    policy = GaussianPolicy(env.single_observation_space, env.single_action_space, log_std_init=-5.0)
    with torch.no_grad():
        policy.mean_head.bias.fill_(1.0)  # always forward: episode length = goal (20: 10, truncated)
    video = tmp_path / "eval.mp4"
    episodes = evaluate_episodes(policy, env, 3, frame_ids=[4, 1, 0], video_path=video, progress=True)
    assert sorted((ep["frame"], ep["length"], ep["success"]) for ep in episodes) == [
        (0, 3, 1.0),
        (1, 4, 1.0),
        (4, 10, 0.0),
    ]
    assert env.steps_run.sum() == 3 + 4 + 10  # no env played an episode nobody asked for
    frames = iio.imread(video)
    assert len(frames) == 2  # the start, then the chunk in which both first episodes ended


def test_paired_change_counts_frames_that_flipped():
    from trainers.report import paired_change

    before = [{"frame": i, "success_once": float(i < 2)} for i in range(6)]  # 0 1 succeed
    after = [{"frame": i, "success_once": float(i in (1, 2, 3, 4))} for i in range(6)]
    (line,) = paired_change(before, after)
    assert "+33.3%" in line and "3 turned into successes, 1 into failures" in line
    assert "p = 0.625" in line  # exact two-sided McNemar, 3 vs 1
    assert paired_change(before, [{"frame": 9, "success_once": 1.0}]) == []


def test_evaluation_refill_resets_finished_envs_together():
    env = CountingVectorEnv(num_envs=4, autoreset_mode="Disabled")  # goals 3 4 5 6 20
    policy = GaussianPolicy(env.single_observation_space, env.single_action_space, log_std_init=-5.0)
    with torch.no_grad():
        policy.mean_head.bias.fill_(1.0)
    calls = []
    reset = env.reset
    env.reset = lambda **kw: calls.append(kw) or reset(**kw)
    episodes = evaluate_episodes(policy, env, 9, frame_ids=[0, 1, 2, 3, 4, 0, 1, 2, 3])
    assert sorted(ep["frame"] for ep in episodes) == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    assert env.steps_run.sum() == sum(ep["length"] for ep in episodes)
    masks = [c["options"]["reset_mask"] for c in calls[1:]]
    assert all(m.sum() >= 2 for m in masks[:-1])  # finished envs wait for one another


def test_learning_curve_weighs_iterations_by_their_episodes():
    from trainers.report import _moving_average

    # one lucky episode, then nine failures in one iteration: 0.1, not a fall from 1.0 to 0.5
    assert _moving_average([1.0, 0.0], [1, 9], 10) == [1.0, 0.1]
    assert _moving_average([1.0, 0.0, 0.5], [1, 1, 2], 2) == [1.0, 0.5, pytest.approx(1 / 3)]
    first, second = _moving_average([1.0, 0.0], [1, 9], 10, min_weight=10)  # drawn from 10 episodes on
    assert math.isnan(first) and second == 0.1
