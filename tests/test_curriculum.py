"""The task curriculum (``trainers/curriculum.py``): tasks the policy fails get more starts; the
collector restarts finished envs where it says and tells each episode's start frame; self-imitation
with ``task_curriculum`` (sync and async) practises the failed task most, resumes the counts, and
refuses bad settings before any env step."""

import json

import numpy as np
import pytest
import torch
from counting_env import ConstantPolicy, CountingVectorEnv

from nets.errors import BadInput
from trainers.checkpoint import latest_checkpoint
from trainers.curriculum import TaskCurriculum
from trainers.env_contract import start_options
from trainers.rollout import Collector
from trainers.sil import SILConfig
from trainers.sil.train import main as sil_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# goals 3, 4, 5, 6 (reachable in the 10-step limit) and 20 (never): tasks walk/3 ... walk/20
ENV = ["--env", "counting_env:SacCounting-v0", "--env-kwargs", '{"chunk_size": 2}', "--num-envs", "4"]
POLICY = ["--policy", "gaussian", "--policy-kwargs", json.dumps({"hidden_sizes": [16], "squash": True})]
FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--eval-episodes", "10", "--eval-num-envs", "2"]
LEARN = ["--steps-per-iteration", "5", "--updates-per-iteration", "8", "--batch-size", "64",
         "--learning-rate", "3e-3", "--ema-decay", "0", "--task-curriculum"]  # fmt: skip


def _episodes(frame: int, successes: list[bool]) -> list[dict]:
    return [{"frame": frame, "success": float(s)} for s in successes]


def test_failed_tasks_get_most_starts_and_the_state_round_trips():
    cur = TaskCurriculum(["a", "a", "b", "c"], floor=0.1, window=4, seed=0)
    assert np.allclose(cur.task_weights(), 1 / 3)  # no episodes yet: every task alike
    cur.record(_episodes(0, [False] * 3) + _episodes(1, [True] * 4))  # a: the last 4 of 7 count
    unknown = [{"success": 1.0}, {"frame": 9, "success": 1.0}]  # no frame, or not the env's: ignored
    cur.record(_episodes(2, [False] * 4) + unknown)
    rates = cur.success_rates()
    assert np.allclose(rates, [5 / 6, 1 / 6, 1 / 2])  # (s + 1) / (n + 2)
    shares = cur.task_weights()
    assert np.allclose(shares, np.array([1 / 6, 5 / 6, 1 / 2]) / (1 / 6 + 5 / 6 + 1 / 2))
    draws = np.array(cur.draw(6000))
    assert set(draws) == {0, 1, 2, 3}
    seen = [np.isin(draws, [0, 1]).mean(), (draws == 2).mean(), (draws == 3).mean()]
    assert np.allclose(seen, shares, atol=0.03)
    assert abs((draws == 0).mean() - (draws == 1).mean()) < 0.03  # a task's frames alike

    copy = TaskCurriculum(["a", "a", "b", "c"], floor=0.1, window=4, seed=1)
    copy.load_state_dict(cur.state_dict())
    assert copy.draw(50) == cur.draw(50) and np.allclose(copy.success_rates(), cur.success_rates())

    solved = TaskCurriculum(["a", "b"], floor=0.1, window=50, seed=0)
    solved.record(_episodes(0, [True] * 30))  # 1 - 31/32 is below the floor: a keeps 0.1
    assert np.allclose(solved.task_weights(), np.array([0.1, 0.5]) / 0.6)


def test_curriculum_bad_settings_are_named():
    with pytest.raises(BadInput, match="floor must be in"):
        TaskCurriculum(["a"], floor=0.0, window=4, seed=0)
    with pytest.raises(BadInput, match="window must be"):
        TaskCurriculum(["a"], floor=0.1, window=0, seed=0)
    with pytest.raises(BadInput, match="name their task"):
        TaskCurriculum([], floor=0.1, window=4, seed=0)
    with pytest.raises(BadInput, match="names tasks"):
        TaskCurriculum(["a"], 0.1, 4, 0).load_state_dict(TaskCurriculum(["b"], 0.1, 4, 0).state_dict())
    with pytest.raises(BadInput, match="curriculum_floor"):
        SILConfig(curriculum_floor=1.5)
    with pytest.raises(BadInput, match="placebo"):
        SILConfig(task_curriculum=True, placebo=True)


def test_the_collector_restarts_finished_envs_where_it_is_told_and_names_each_start():
    env = CountingVectorEnv(num_envs=2, chunk_size=2, autoreset_mode="Disabled")
    collector = Collector(env, ConstantPolicy(env.single_observation_space, env.single_action_space),
                          start_frames=lambda n: [1] * n)  # fmt: skip
    collector.reset(seed=0, options=start_options([0, 2]))
    episodes = collector.collect(12).episodes  # goals 3 and 5 first, then goal 4 (frame 1) only
    assert [(e["frame"], e["length"]) for e in episodes[:2]] == [(0, 3.0), (2, 5.0)]
    assert len(episodes) > 4 and all((e["frame"], e["length"]) == (1, 4.0) for e in episodes[2:])
    env.close()

    env = CountingVectorEnv(num_envs=3, chunk_size=2, autoreset_mode="SameStep")  # the env draws
    policy = ConstantPolicy(env.single_observation_space, env.single_action_space)
    episodes = Collector(env, policy).collect(20).episodes
    goals = [3, 4, 5, 6, 20]
    assert episodes and all(e["length"] == min(goals[int(e["frame"])], 10) for e in episodes)
    with pytest.raises(BadInput, match="DISABLED"):
        Collector(env, policy, start_frames=lambda n: [0] * n)
    env.close()


def test_restarts_chosen_by_the_collector_equal_the_envs_own_autoreset():
    """DISABLED autoreset with ``start_frames`` replaying the frames a SAME_STEP env drew gives the same
    rollout: observations, actions, rewards, ends and episodes."""

    def collect(mode, replay=None):
        env = CountingVectorEnv(num_envs=3, chunk_size=2, autoreset_mode=mode)
        drawn = []

        def on_step(info):
            if "initial_frame_id" in info:
                drawn.extend(
                    int(info["initial_frame_id"][i]) for i in np.flatnonzero(info["_initial_frame_id"])
                )

        queue = list(replay or [])
        chooser = None if replay is None else (lambda n: [queue.pop(0) for _ in range(n)])
        collector = Collector(env, ConstantPolicy(env.single_observation_space, env.single_action_space),
                              start_frames=chooser)  # fmt: skip
        collector.reset(seed=3, options=start_options([4, 1, 0]))
        rollout = collector.collect(25, record_obs=True, on_step=on_step)
        env.close()
        return rollout, drawn

    same_step, drawn = collect("SameStep")
    disabled, _ = collect("Disabled", drawn)
    assert len(drawn) > 5 and len(set(drawn)) > 2
    for name in ("actions", "rewards", "valid", "terminated", "truncated"):
        assert torch.equal(getattr(same_step, name), getattr(disabled, name)), name
    for a, b in zip(same_step.observations, disabled.observations, strict=True):
        assert all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
    assert same_step.episodes == disabled.episodes


def test_self_imitation_practises_the_failed_task_most_and_resumes_the_counts(tmp_path):
    out = sil_main([*ENV, *POLICY, *FAST, "--run-dir", str(tmp_path / "run"), "--total-steps", "600", *LEARN])
    assert out["train/curriculum_share_max"] > 2 * out["train/curriculum_share_min"]
    state = latest_checkpoint(tmp_path / "run")[1]["extra"]["curriculum"]["outcomes"]
    counts = {task: len(o) for task, o in state.items()}
    assert max(counts, key=counts.get) == "walk/20" and not any(state["walk/20"])  # never reached
    resumed = sil_main([*ENV, *POLICY, *FAST, "--run-dir", str(tmp_path / "run"), "--total-steps", "900",
                        *LEARN, "--resume", str(tmp_path / "run")])  # fmt: skip
    after = latest_checkpoint(tmp_path / "run")[1]["extra"]["curriculum"]["outcomes"]
    assert sum(map(len, after.values())) > sum(counts.values()) and np.isfinite(resumed["train/sil_loss"])


def test_self_imitation_curriculum_on_the_async_loop(tmp_path):
    out = sil_main([*ENV, *POLICY, *FAST, "--run-dir", str(tmp_path / "run"), "--total-steps", "600",
                    "--loop", "async", *LEARN])  # fmt: skip
    state = latest_checkpoint(tmp_path / "run")[1]["extra"]["curriculum"]["outcomes"]
    counts = {task: len(o) for task, o in state.items()}
    assert max(counts, key=counts.get) == "walk/20", counts  # the learner's copy saw the actor's episodes
    assert out["train/success_episodes"] > 0


def test_a_curriculum_is_refused_where_it_cannot_choose_the_starts(tmp_path):
    with pytest.raises(BadInput, match="name their task"):
        sil_main(["--env", "Pendulum-v1", "--policy", "gaussian", *FAST, "--task-curriculum",
                  "--run-dir", str(tmp_path / "p")])  # fmt: skip
    with pytest.raises(BadInput, match="autoreset_mode must be"):
        sil_main([*ENV, *POLICY, *FAST, "--task-curriculum", "--autoreset-mode", "same_step",
                  "--run-dir", str(tmp_path / "q")])  # fmt: skip
    assert not (tmp_path / "p" / "checkpoints").exists() and not (tmp_path / "q").exists()
