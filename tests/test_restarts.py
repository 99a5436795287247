"""Failure restarts (``trainers/restarts.py``): failed episodes' states feed the pool, a share of the
finished envs restart there and continue, restarted episodes do not feed it; self-imitation with
``failure_restarts`` (sync and async) restarts envs and refuses bad settings with the setting's name.
LIBERO's restart frames are checked against its own continuation in ``tests/test_libero_restarts.py``."""

import json

import numpy as np
import pytest
from counting_env import ConstantPolicy, CountingVectorEnv, counting_frames

from nets.errors import BadInput
from trainers.env_contract import start_options
from trainers.restarts import FailureRestarts, uniform_frames
from trainers.rollout import Collector
from trainers.sil import SILConfig
from trainers.sil.train import main as sil_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _collect(share: float, steps: int = 60, depth: float = 1.0):
    """Goal 3 (reached in 3 sub-steps) and goal 20 (never, in the 10-step limit), always walking."""
    env = CountingVectorEnv(
        num_envs=4, chunk_size=2, autoreset_mode="Disabled", frames=counting_frames((3, 20)),
        restart_frames_in_info=True,
    )  # fmt: skip
    restarts = FailureRestarts(share, 8, env.num_envs, uniform_frames(2, seed=1), seed=2, depth=depth)
    collector = Collector(env, ConstantPolicy(env.single_observation_space, env.single_action_space),
                          start_frames=restarts.draw)  # fmt: skip
    collector.reset(options=start_options(restarts.draw(env.num_envs)))
    rollout = collector.collect(steps, record_obs=True, on_step=restarts.observe)
    env.close()
    return restarts, rollout


def test_failed_episodes_feed_the_pool_and_restarted_envs_continue_from_them():
    restarts, rollout = _collect(share=0.5)
    assert restarts.failed, "the goal-20 episodes fail and are kept"
    for episode in restarts.failed:  # every state of a failed episode from a start frame, not its end
        assert [f.task for f in episode] == ["walk/20"] * len(episode)
        assert [f.meta["resume_pos"] for f in episode] == list(range(2, 10, 2))
        assert not any(f.meta["from_restart"] for f in episode)
    restarted = [ep for ep in rollout.episodes if "frame" not in ep]  # no start frame id: a restart
    assert 0.3 < restarts.restarted / restarts.drawn < 0.7 and restarted
    assert all(ep["success"] == 0 for ep in restarted)  # goal 20 stays out of reach from any state
    # each continues its episode: what the 10-step limit had left after 2, 4, 6 or 8 sub-steps
    assert {ep["length"] for ep in restarted} <= {2.0, 4.0, 6.0, 8.0} and len(restarts.failed) <= 8


@pytest.mark.parametrize(("depth", "lengths"), [(0.0, {8.0}), (0.5, {6.0, 8.0})])
def test_depth_keeps_restarts_early_in_the_failed_episodes(depth, lengths):
    """Failed episodes pass boundaries 2, 4, 6, 8: depth 0 restarts at the first (8 steps left of the
    10-step limit), depth 0.5 at one of the first two (8 or 6 left)."""
    restarts, rollout = _collect(share=0.5, steps=120, depth=depth)
    restarted = {ep["length"] for ep in rollout.episodes if "frame" not in ep}
    assert restarted == lengths


def test_without_a_share_every_start_is_a_start_frame():
    restarts, rollout = _collect(share=0.0)
    assert restarts.restarted == 0 and all("frame" in ep for ep in rollout.episodes)


def test_bad_settings_and_an_env_without_restart_frames_are_named():
    with pytest.raises(BadInput, match=r"share must be in \[0, 1\)"):
        FailureRestarts(1.0, 8, 2, uniform_frames(2, 0), 0)
    with pytest.raises(BadInput, match="pool must be >= 1"):
        FailureRestarts(0.5, 0, 2, uniform_frames(2, 0), 0)
    for depth in (-0.1, 1.5):
        with pytest.raises(BadInput, match=rf"depth must be in \[0, 1\], got {depth}"):
            FailureRestarts(0.5, 8, 2, uniform_frames(2, 0), 0, depth=depth)
        with pytest.raises(BadInput, match=rf"restart_depth must be in \[0, 1\], got {depth}"):
            SILConfig(failure_restarts=0.5, restart_depth=depth)
    with pytest.raises(BadInput, match="restart_frames_in_info"):
        FailureRestarts(0.5, 8, 2, uniform_frames(2, 0), 0).observe({"chunk_valid": np.ones((2, 2))})
    with pytest.raises(BadInput, match="failure_restarts must be in"):
        SILConfig(failure_restarts=-0.1)
    with pytest.raises(BadInput, match="placebo chooses without the reward, but failure_restarts"):
        SILConfig(failure_restarts=0.5, placebo=True)


ENV = ["--env", "counting_env:SacCounting-v0", "--num-envs", "4"]
RESTART_ENV = [*ENV, "--env-kwargs", '{"chunk_size": 2, "restart_frames_in_info": true}']
POLICY = ["--policy", "gaussian", "--policy-kwargs", json.dumps({"hidden_sizes": [16], "squash": True})]
FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--eval-episodes", "10", "--eval-num-envs", "2"]
LEARN = ["--steps-per-iteration", "5", "--updates-per-iteration", "8", "--batch-size", "64",
         "--learning-rate", "3e-3", "--ema-decay", "0", "--failure-restarts", "0.5",
         "--restart-depth", "0.5"]  # fmt: skip


@pytest.mark.parametrize("loop", ["sync", "async"])
def test_self_imitation_restarts_failed_episodes(tmp_path, loop):
    out = sil_main([*RESTART_ENV, *POLICY, *FAST, "--run-dir", str(tmp_path / "run"), "--total-steps", "600",
                    "--loop", loop, *LEARN])  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    shares = [r["train/restart_share"] for r in rows if "train/restart_share" in r]
    assert shares and max(shares) > 0 and out["train/success_episodes"] > 0
    restarted = [
        r["train/success_from_restarts"] for r in rows if r.get("train/success_from_restarts") is not None
    ]
    assert restarted and all(0.0 <= s <= 1.0 for s in restarted)


def test_self_imitation_refuses_restarts_it_cannot_make(tmp_path):
    with pytest.raises(BadInput, match="failure_restarts restarts finished envs itself"):
        sil_main([*RESTART_ENV, *POLICY, *FAST, *LEARN, "--autoreset-mode", "same_step",
                  "--run-dir", str(tmp_path / "q")])  # fmt: skip
    assert not (tmp_path / "q").exists()
    with pytest.raises(BadInput, match="restart_frames_in_info"):  # at the first step
        sil_main([*ENV, "--env-kwargs", '{"chunk_size": 2}', *POLICY, *FAST, *LEARN,
                  "--run-dir", str(tmp_path / "p")])  # fmt: skip
