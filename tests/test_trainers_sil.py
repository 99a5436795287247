"""Self-imitation from success (``trainers/sil``) on the counting env: it learns, keeps only
successes (or, as the placebo, as many episodes chosen without the reward), mixes the prior data in,
resumes its buffer and weight average, and refuses bad settings before any env step."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from nets.errors import BadInput
from trainers.checkpoint import latest_checkpoint
from trainers.datasets.demos import Episode, write_demos
from trainers.optim import EMA_KEY
from trainers.sil import SILConfig, SuccessRows
from trainers.sil.algorithm import chosen
from trainers.sil.train import main as sil_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# goals 3, 4, 5, 6 (reachable in the 10-step limit) and 20 (never)
ENV = ["--env", "SacCounting-v0", "--env-kwargs", '{"chunk_size": 2}', "--num-envs", "4"]
POLICY = ["--policy", "gaussian", "--policy-kwargs", json.dumps({"hidden_sizes": [16], "squash": True})]
FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--eval-episodes", "10", "--eval-num-envs", "2"]


@pytest.fixture(autouse=True)
def _counting():
    if "SacCounting-v0" not in gym.registry:
        gym.register("SacCounting-v0", vector_entry_point="counting_env:CountingVectorEnv")


def _sil(run_dir, *extra):
    return sil_main([*ENV, *POLICY, *FAST, "--run-dir", str(run_dir), *extra])


def test_self_imitation_learns_to_walk(tmp_path):
    """A new squashed Gaussian's mean action is 0, so deterministically it never walks; its samples
    walk half the time and reach the near goals. Imitating the successful episodes moves the mean
    forward: the four reachable goals of five (0.8) deterministically, and the buffer holds forward
    steps."""
    final = _sil(tmp_path / "run", "--total-steps", "1200", "--steps-per-iteration", "5",
                 "--updates-per-iteration", "8", "--batch-size", "64", "--learning-rate", "3e-3",
                 "--ema-decay", "0", "--eval-at-start")  # fmt: skip
    assert final["eval/success"] >= 0.7, final
    assert final["train/success_episodes"] > 0 and np.isfinite(final["train/sil_loss"])
    buffer = latest_checkpoint(tmp_path / "run")[1]["extra"]["successes"]
    assert (buffer["actions"][..., 0][buffer["valid"]] > 0).mean() > 0.6


def test_the_placebo_keeps_as_many_episodes_chosen_without_the_reward():
    flags = [True, False, False, True, False, False, False, True]
    g = torch.Generator().manual_seed(0)
    assert chosen(flags, False, g) == flags
    draws = [chosen(flags, True, g) for _ in range(50)]
    assert all(sum(d) == 3 for d in draws)
    assert any(d != flags for d in draws)
    assert chosen([], True, g) == []


def test_success_rows_keep_the_newest_and_round_trip():
    rows = SuccessRows(capacity=5)

    def episode(n, start):
        return [({"proprio": np.full(2, start + t, np.float32), "instruction": f"s{start + t}"},
                 np.zeros((2, 2), np.float32), np.ones(2, bool), t) for t in range(n)]  # fmt: skip

    rows.add(episode(3, 0))
    rows.add(episode(4, 10))
    assert len(rows) == 5 and rows.episodes == 2
    assert rows.obs["proprio"][:, 0].tolist() == [2, 10, 11, 12, 13]
    assert rows.obs["instruction"] == ["s2", "s10", "s11", "s12", "s13"]
    assert rows.lags.tolist() == [2, 0, 1, 2, 3] and rows.rows_added == 7
    empty = SuccessRows(capacity=5)
    empty.load_state_dict(SuccessRows(capacity=5).state_dict())
    assert len(empty) == 0 and empty.episodes == 0
    again = SuccessRows(capacity=5)
    again.load_state_dict(rows.state_dict())
    np.testing.assert_array_equal(again.obs["proprio"], rows.obs["proprio"])
    with pytest.raises(BadInput, match="differ in length"):
        again.load_state_dict({**rows.state_dict(), "valid": rows.valid[:2]})


def _demos(tmp_path, action_dim=2):
    eps = []
    for goal in (3, 4):
        pos = np.arange(goal, dtype=np.float32)
        eps.append(Episode(
            obs={"image": np.zeros((goal, 2, 2, 3), np.uint8),
                 "proprio": np.stack([pos, np.full(goal, goal)], 1)},
            actions=np.ones((goal, 1, action_dim), np.float32), valid=np.ones((goal, 1), bool),
            rewards=np.zeros((goal, 1), np.float32), instruction=f"walk {goal} cells", success=True,
        ))  # fmt: skip
    return write_demos(tmp_path / f"demos{action_dim}.h5", eps, {"env": "SacCounting-v0", "chunk_size": 1})


def test_prior_data_is_imitated_and_a_resume_keeps_buffer_and_average(tmp_path):
    """With prior demos the first updates need no success. A run resumed with no updates ends with the
    policy (the average) and the trained weights of its checkpoint, and the buffer it had."""
    demos = _demos(tmp_path)
    args = ["--prior-data", str(demos), "--steps-per-iteration", "5", "--batch-size", "16",
            "--ema-decay", "0.9", "--eval-every", "-1", "--checkpoint-every", "1"]  # fmt: skip
    first = _sil(tmp_path / "run", *args, "--total-steps", "80")
    assert first["train/prior_share"] == pytest.approx(1.0) or first["train/success_rows"] > 0
    before = latest_checkpoint(tmp_path / "run")[1]
    _sil(tmp_path / "run", *args, "--total-steps", "160", "--updates-per-iteration", "0",
         "--resume", str(tmp_path / "run"))  # fmt: skip
    after = latest_checkpoint(tmp_path / "run")[1]
    assert after["counters"]["iteration"] > before["counters"]["iteration"]
    for name, value in before["policy"]["state_dict"].items():
        torch.testing.assert_close(after["policy"]["state_dict"][name], value, rtol=0, atol=0)
    for name, value in before["extra"][EMA_KEY].items():
        torch.testing.assert_close(after["extra"][EMA_KEY][name], value, rtol=0, atol=0)
    kept, now = before["extra"]["successes"], after["extra"]["successes"]
    assert now["episodes"] >= kept["episodes"]
    np.testing.assert_array_equal(now["actions"][: len(kept["actions"])], kept["actions"])


def test_bad_settings_are_refused_before_any_env_step(tmp_path):
    with pytest.raises(BadInput, match="prior_ratio"):
        SILConfig(prior_ratio=1.0)
    with pytest.raises(BadInput, match="ema_decay"):
        SILConfig(ema_decay=1.0)
    with pytest.raises(BadInput, match="max_policy_lag must be >= 0"):
        SILConfig(max_policy_lag=-1)
    with pytest.raises(BadInput, match="demonstrated chunks are 2 x 3"):
        _sil(tmp_path / "b", "--prior-data", str(_demos(tmp_path, action_dim=3)))
    assert not (tmp_path / "b" / "checkpoints").exists()


def test_warm_up_clones_the_prior_before_any_env_step_and_is_not_redone_on_resume(tmp_path):
    """``warmup_updates`` are behaviour cloning on the prior data alone, after the evaluation at start
    and before any env step: with no update after them the policy walks like the forward-walking
    demos. They are logged once, and a resumed run does not repeat them."""
    demos = _demos(tmp_path)
    args = ["--prior-data", str(demos), "--warmup-updates", "60", "--updates-per-iteration", "0",
            "--batch-size", "16", "--learning-rate", "3e-3", "--ema-decay", "0", "--steps-per-iteration", "5",
            "--checkpoint-every", "1"]  # fmt: skip
    first = _sil(tmp_path / "run", *args, "--total-steps", "40", "--eval-at-start")
    assert first["train/updates"] == 60 and first["train/updates_per_chunk"] == 0
    assert first["eval/success"] >= 0.7, first
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    warm = [r for r in rows if "train/warmup_updates" in r]
    assert (
        len(warm) == 1 and warm[0]["train/warmup_updates"] == 60 and np.isfinite(warm[0]["train/warmup_loss"])
    )
    start = [i for i, r in enumerate(rows) if "eval/success" in r][0]  # the new policy, before it
    assert start < rows.index(warm[0]) and rows[start]["eval/episode_len"] > first["eval/episode_len"]
    again = _sil(tmp_path / "run", *args, "--total-steps", "80", "--resume", str(tmp_path / "run"))
    assert again["train/updates"] == 60
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert sum("train/warmup_updates" in line for line in rows) == 1


def test_warm_up_needs_prior_data():
    with pytest.raises(BadInput, match="warmup_updates"):
        SILConfig(warmup_updates=10)
    with pytest.raises(BadInput, match="warmup_updates must be >= 0"):
        SILConfig(warmup_updates=-1, prior_data="demos.h5")


def test_balance_tasks_draws_every_task_equally_and_survives_a_round_trip():
    """90 rows of one task and 10 of another: uniform draws follow the rows, balanced draws the tasks;
    a buffer restored from its state draws the same rows from the same generator state."""
    rows = SuccessRows(capacity=1000)
    for task, n in (("often", 90), ("rarely", 10)):
        rows.add([({"proprio": np.zeros(2, np.float32), "instruction": task},
                   np.zeros((2, 2), np.float32), np.ones(2, bool), 0) for _ in range(n)])  # fmt: skip
    rare = np.array([t == "rarely" for t in rows.obs["instruction"]])
    uniform = rows.sample(20_000, np.random.default_rng(0))
    balanced = rows.sample(20_000, np.random.default_rng(0), balance_tasks=True)
    assert rare[uniform].mean() == pytest.approx(0.1, abs=0.01)
    assert rare[balanced].mean() == pytest.approx(0.5, abs=0.015)
    again = SuccessRows(capacity=1000)
    again.load_state_dict(rows.state_dict())
    np.testing.assert_array_equal(
        again.sample(50, np.random.default_rng(1), True), rows.sample(50, np.random.default_rng(1), True)
    )
    no_text = SuccessRows(capacity=10)
    no_text.add([({"proprio": np.zeros(2, np.float32)}, np.zeros((2, 2), np.float32), np.ones(2, bool), 0)])
    with pytest.raises(BadInput, match="instruction"):
        no_text.sample(4, np.random.default_rng(0), balance_tasks=True)


def test_balance_tasks_trains_and_needs_an_instruction(tmp_path):
    out = _sil(tmp_path / "run", "--balance-tasks", "--total-steps", "120", "--steps-per-iteration", "5")
    assert out["train/success_rows"] > 0 and np.isfinite(out["train/sil_loss"])
    with pytest.raises(BadInput, match="'instruction' observation"):
        sil_main(["--env", "Pendulum-v1", "--policy", "gaussian", *FAST, "--balance-tasks",
                  "--run-dir", str(tmp_path / "p")])  # fmt: skip
    assert not (tmp_path / "p" / "checkpoints").exists()
