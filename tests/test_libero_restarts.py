"""LIBERO's restart frames (``restart_frames_in_info``): a reset at one continues the episode as it
would have gone on (the same states, step for step, within the solver's warm start), with the step
count and the budget it had left; a malformed one is refused before anything is reset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

import envs  # noqa: F401  (registers the ids)
from envs.core import InitialFrame
from envs.libero.task_state import TASK_STATE_FIELDS
from nets.errors import BadInput

pytestmark = requires_libero

K = 8
STEP = [name for name, _ in TASK_STATE_FIELDS].index("episode_step")  # one-wide fields before it


@pytest.fixture(scope="module")
def env():
    env = gym.make_vec(
        "Libero-Spatial-v0", num_envs=1, chunk_size=K, cameras=[], task_state=True, autoreset_mode="Disabled",
        restart_frames_in_info=True, init_states=[0], task_ids=[3],
    )  # fmt: skip
    yield env
    env.close()


def _actions(n: int) -> np.ndarray:
    """Random arm motion, the gripper open for 5 chunks and then closed (both gripper states)."""
    acts = np.random.default_rng(0).uniform(-1, 1, size=(n, 1, K, 7)).astype(np.float32)
    acts[..., 6] = np.where(np.arange(n) < 5, -1.0, 1.0)[:, None, None]
    return acts


def _run(env, acts, options):
    env.reset(options=options)
    states, frames = [], []
    for a in acts:
        obs, *_, info = env.step(a)
        states.append(obs["task_state"][0].copy())
        frames.append(info["restart_frame"][0])
    return states, frames


def test_a_restart_frame_continues_the_episode(env):
    acts = _actions(10)
    states, frames = _run(env, acts, {"initial_frames": [0]})
    limit = env.unwrapped._limit[0]
    for c in (2, 6):  # gripper open, and closed
        frame = frames[c]
        assert frame.meta["resume"]["episode_step"] == (c + 1) * K and not frame.meta["from_restart"]
        obs, _ = env.reset(options={"initial_frames": [frame]})
        # read a sub-step after the episode's own sample (robosuite samples before the integration)
        assert np.abs(obs["task_state"][0] - states[c]).max() < 0.01
        assert obs["task_state"][0, STEP] == (c + 1) * K and env.unwrapped._limit[0] == limit - (c + 1) * K
        for j in range(c + 1, len(acts)):
            obs, *_, info = env.step(acts[j])
            assert np.abs(obs["task_state"][0] - states[j]).max() < 1e-5, (c, j)
        assert info["restart_frame"][0].meta["from_restart"]


def test_a_bad_restart_frame_is_refused_before_any_reset(env):
    _, frames = _run(env, _actions(3), {"initial_frames": [0]})
    good = frames[1]
    for resume, match in (
        ({**good.meta["resume"], "episode_step": 10_000}, r"\(got .*'episode_step': 10000"),
        ({**good.meta["resume"], "gripper_state": [3.0, -1.0]}, r"\(got .*'gripper_state': \[3\.0, -1\.0\]"),
        ({"gripper_state": [1.0, -1.0]}, r"\(got \{'gripper_state': \[1\.0, -1\.0\]\}\)"),
    ):
        bad = InitialFrame(good.instruction, task=good.task, sim_state=good.sim_state,
                           meta={**good.meta, "resume": resume})  # fmt: skip
        with pytest.raises(BadInput, match=match):
            env.reset(options={"initial_frames": [bad]})
    obs, *_ = env.step(np.zeros(env.action_space.shape, np.float32))  # the episode went on where it was
    assert obs["task_state"][0, STEP] == 4 * K


def test_a_restart_keeps_the_arm_where_the_episode_had_it_under_a_robot_pose_option():
    """LIBERO-Plus's robot pose applies at an episode's own start, not again at its restart."""
    env = gym.make_vec(
        "Libero-Spatial-v0", num_envs=1, chunk_size=K, cameras=[], task_state=True, autoreset_mode="Disabled",
        restart_frames_in_info=True, init_states=[0], task_ids=[3], robot_pose=7,
    )  # fmt: skip
    try:
        acts = _actions(4)
        states, frames = _run(env, acts, {"initial_frames": [0]})
        env.reset(options={"initial_frames": [frames[1]]})
        for j in (2, 3):
            obs, *_ = env.step(acts[j])
            assert np.abs(obs["task_state"][0] - states[j]).max() < 1e-5
    finally:
        env.close()
