"""Registered ids through their one-env view (``gym.make``) pass gymnasium's and Stable-Baselines3's
env checkers: LIBERO-Spatial and the world models (SB3's checker needs the instruction text
dropped). The other LIBERO ids are the same env class over other task lists: each suite's scenes
build, reset and step, and each id's spaces match Spatial's."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from conftest import requires_libero
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401
from envs.libero import SUITE_IDS
from envs.world_models import WORLD_MODEL_IDS
from envs.world_models.tiny import write_tiny_bundle

sb3_env_checker = pytest.importorskip("stable_baselines3.common.env_checker")
LIBERO_KWARGS = {"image_size": 48, "max_episode_steps": 24, "task_ids": [0]}  # 48 px: SB3 needs >= 36


def check_both(make, sb3: bool = True) -> None:
    env = make(include_instruction=True)
    check_env(env.unwrapped)
    env.close()
    if not sb3:
        return
    env = make(include_instruction=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SB3 reports problems as warnings: make them failures
        sb3_env_checker.check_env(env.unwrapped, warn=True)
    env.close()


@pytest.mark.slow
@requires_libero
def test_libero_spatial_passes_both_checkers():
    check_both(lambda **kw: gym.make("Libero-Spatial-v0", **LIBERO_KWARGS, **kw))


@pytest.mark.slow
@requires_libero
def test_every_libero_suite_builds_resets_and_steps():
    """One env per suite (its first task) in one ``Libero-130-v0`` vector env; every suite id has
    Spatial's spaces and its own tasks."""
    import numpy as np

    ids = {suite: gym.make_vec(env_id, num_envs=1, cameras=()) for env_id, suite in SUITE_IDS.items()}
    try:
        spatial = ids["spatial"]
        for suite, env in ids.items():
            assert env.single_observation_space == spatial.single_observation_space, suite
            assert env.single_action_space == spatial.single_action_space, suite
        firsts = [0, 500, 1000, 1500, 2000]  # task 0 of Spatial, Object, Goal, 10 and 90 in the 130 list
        frames = ids["130"].initial_frames
        assert [frames[i].meta["suite"] for i in firsts] == [
            f"libero_{s}" for s in ("spatial", "object", "goal", "10", "90")
        ]
        assert [frames[i].instruction for i in firsts] == [
            ids[s].initial_frames[0].instruction for s in ("spatial", "object", "goal", "10", "90")
        ]
    finally:
        for env in ids.values():
            env.close()
    env = gym.make_vec(
        "Libero-130-v0", num_envs=len(firsts), cameras=(), chunk_size=2, autoreset_mode="Disabled"
    )
    try:
        obs, _ = env.reset(options={"initial_frames": firsts})
        assert obs in env.observation_space
        obs, reward, term, trunc, info = env.step(np.zeros(env.action_space.shape, np.float32))
        assert obs in env.observation_space and info["chunk_valid"].all() and not (term | trunc).any()
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("env_id", list(WORLD_MODEL_IDS))
def test_world_model_ids_pass_both_checkers(env_id, tmp_path):
    backend = "cosmos" if env_id.startswith("Cosmos") else "opensora"
    bundle = write_tiny_bundle(backend, tmp_path / backend)
    kwargs = {"model_dir": bundle, "image_size": (48, 48), "model_options": {"num_steps": 2}}
    check_both(lambda **kw: gym.make(env_id, **kwargs, **kw))
