"""The scripted LIBERO expert in the real simulator (rendering off), and its task-state contract."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

import envs  # noqa: F401  (registers the LIBERO ids)
from envs.libero import task_state as env_task_state
from policies.libero_expert import LiberoExpert
from policies.registry import make_policy
from trainers.demos import collect_episodes


@requires_libero
def test_the_env_publishes_the_task_state_layout_in_its_space():
    env = gym.make_vec("Libero-Spatial-v0", num_envs=1, cameras=(), task_state=True)
    space = env.single_observation_space
    env.close()
    assert space["task_state"].fields == env_task_state.TASK_STATE_FIELDS
    assert space["task_state"].shape == (env_task_state.TASK_STATE_DIM,)
    LiberoExpert(space, gym.spaces.Box(-1, 1, (7,), np.float32))  # the expert reads it from there


def test_expert_refuses_envs_without_task_state():
    obs = gym.spaces.Dict(proprio=gym.spaces.Box(-1, 1, (8,), np.float32))
    with pytest.raises(ValueError, match="make the env with task_state=True"):
        LiberoExpert(obs, gym.spaces.Box(-1, 1, (7,), np.float32))
    unnamed = gym.spaces.Dict(task_state=gym.spaces.Box(-1, 1, (57,), np.float32))
    with pytest.raises(ValueError, match="named fields"):
        LiberoExpert(unnamed, gym.spaces.Box(-1, 1, (7,), np.float32))


def _expert_env(suite: str, num_envs: int = 2, **kwargs):
    options = {"chunk_size": None, "cameras": (), "task_state": True, "autoreset_mode": "Disabled", **kwargs}
    return gym.make_vec(f"Libero-{suite.capitalize()}-v0", num_envs=num_envs, **options)


@requires_libero
@pytest.mark.parametrize("suite, frames", [("spatial", [0, 257, 349]), ("object", [31, 166, 480])])
@pytest.mark.slow
def test_expert_succeeds_on_fixed_pairs(suite, frames):
    """(task, init state) pairs 50 * task + state, across tasks of the suite."""
    env = _expert_env(suite, num_envs=len(frames))
    try:
        policy = make_policy("libero_expert", env.single_observation_space, env.single_action_space)
        obs, _ = env.reset(seed=0, options={"initial_frames": frames})
        done, success = np.zeros(len(frames), bool), np.zeros(len(frames), bool)
        while not done.all():
            obs, _, term, trunc, info = env.step(policy.act(obs).actions.numpy()[:, 0])
            for i in np.flatnonzero((term | trunc) & ~done):
                success[i] = info["episode"]["success"][i]
            done |= term | trunc
    finally:
        env.close()
    assert success.all(), success


@requires_libero
def test_task_state_fields_track_the_simulator():
    env = _expert_env("spatial", num_envs=1, object_state_in_info=True, chunk_size=4)
    try:
        obs, _ = env.reset(seed=0, options={"initial_frames": [0]})
        first = obs["task_state"][0]
        obs, *_, info = env.step(np.zeros((1, 4, 7), np.float32))
    finally:
        env.close()
    named = {}
    i = 0
    for name, n in env_task_state.TASK_STATE_FIELDS:
        named[name] = obs["task_state"][0][i : i + n]
        i += n
    assert first[:2].tolist() == [1.0, 0.0]  # supported, episode_step 0 after a reset
    assert named["episode_step"][0] == 4.0
    assert named["goal_in"][0] == 0.0  # "on the plate"
    poses = info["object_state"][0]
    np.testing.assert_allclose(named["obj_pos"], poses["akita_black_bowl_1_pos"], atol=1e-5)
    np.testing.assert_allclose(named["target_pos"], poses["plate_1_pos"], atol=1e-5)
    np.testing.assert_allclose(named["eef_pos"], obs["proprio"][0][:3], atol=1e-5)


@requires_libero
@pytest.mark.slow
def test_expert_demonstrations_are_successful_episodes():
    env = _expert_env("object", num_envs=2, include_instruction=True)
    try:
        policy = LiberoExpert(env.single_observation_space, env.single_action_space)
        episodes = list(collect_episodes(env, policy, 2, seed=3))
    finally:
        env.close()
    for ep in episodes:
        assert ep.success and ep.valid.all() and ep.actions.shape[1:] == (1, 7)
        assert ep.instruction.startswith("pick up the") and "basket" in ep.instruction
        assert np.abs(ep.actions).max() <= 1.0
        assert ep.obs["task_state"][0, 1] == 0.0 and ep.obs["task_state"][-1, 1] == len(ep.actions) - 1


@requires_libero
def test_goal_suite_tasks_are_marked_unsupported():
    env = _expert_env("goal", num_envs=1)
    try:
        policy = LiberoExpert(env.single_observation_space, env.single_action_space)
        obs, _ = env.reset(seed=0, options={"initial_frames": [0]})  # "open the middle drawer ..."
        assert obs["task_state"][0, 0] == 0.0  # supported = 0
        action = policy.act(obs).actions.numpy()
    finally:
        env.close()
    np.testing.assert_array_equal(action[0, 0], [0, 0, 0, 0, 0, 0, -1])
    assert policy.unsupported_steps == 1


def _first_success_and_end(steps_after_success: int) -> tuple[int, dict, np.ndarray]:
    """The expert on frame 0 with chunks of 2: (sub-step of the first success, final episode
    statistics, success after every executed sub-step)."""
    env = _expert_env("spatial", num_envs=1, chunk_size=2, steps_after_success=steps_after_success)
    try:
        policy = make_policy("libero_expert", env.single_observation_space, env.single_action_space)
        obs, _ = env.reset(seed=0, options={"initial_frames": [0]})
        checks, rewards = [], []
        while True:
            obs, _, term, trunc, info = env.step(policy.act(obs).actions.numpy())
            valid = info["chunk_valid"][0]
            checks += info["chunk_success"][0][valid].tolist()
            rewards += info["chunk_rewards"][0][valid].tolist()
            if term[0] or trunc[0]:
                assert term[0] and not trunc[0]
                stats = {k: v[0] for k, v in info["episode"].items()}
                break
    finally:
        env.close()
    checks = np.array(checks)
    assert sum(rewards) == 1.0 and rewards[int(np.argmax(checks))] == 1.0  # reward at the first success only
    return int(np.argmax(checks)) + 1, stats, checks


@requires_libero
def test_steps_after_success_keeps_the_episode_running_past_the_success():
    first, stats, checks = _first_success_and_end(0)
    assert checks.tolist() == [False] * (first - 1) + [True] and stats["length"] == first
    later_first, later, held = _first_success_and_end(9)
    assert later_first == first  # the same episode up to the success (deterministic)
    assert later["length"] == first + 9 and len(held) == first + 9
    assert held[first - 1 :].all() and later["success"] and later["return"] == 1.0  # the bowl stays put
    with pytest.raises(ValueError, match="steps_after_success"):
        _expert_env("spatial", num_envs=1, steps_after_success=-1)


def test_action_noise_moves_only_the_translation_of_sampled_actions_and_is_seeded():
    from envs.core.spaces import FieldBox

    space = gym.spaces.Dict(task_state=FieldBox(-np.inf, np.inf, env_task_state.TASK_STATE_FIELDS))
    obs = {"task_state": np.zeros((3, env_task_state.TASK_STATE_DIM), np.float32)}  # unsupported: stay still
    act_space = gym.spaces.Box(-1, 1, (7,), np.float32)
    expert = LiberoExpert(space, act_space, action_noise=0.5)
    still = expert.act(obs).actions.numpy()  # deterministic: no noise
    assert np.array_equal(still[..., :6], np.zeros((3, 1, 6))) and (still[..., 6] == -1).all()
    expert.seed(0)
    noisy = expert.act(obs, deterministic=False).actions.numpy()
    assert (noisy[..., :3] != 0).all() and (np.abs(noisy[..., :3]) <= 1).all()
    assert np.array_equal(noisy[..., 3:], still[..., 3:])  # rotation and gripper untouched
    expert.seed(0)
    assert np.array_equal(expert.act(obs, deterministic=False).actions.numpy(), noisy)
    quiet = LiberoExpert(space, act_space)  # the default: sampled actions are the deterministic ones
    assert np.array_equal(quiet.act(obs, deterministic=False).actions.numpy(), still)
    with pytest.raises(ValueError, match="action_noise: expected a finite value >= 0"):
        LiberoExpert(space, act_space, action_noise=-0.1)
