"""The checkpoints kept in the repository load for the env they were trained on and act."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

import envs  # noqa: F401  (registers the LIBERO ids)
from policies.gaussian import GaussianPolicy
from trainers.checkpoint import load_policy

ROOT = Path(__file__).resolve().parent.parent


@requires_libero
@pytest.mark.slow
@pytest.mark.parametrize("name", ["bc_libero_spatial_state.pt", "bc_libero_spatial_state_weak.pt"])
def test_bc_libero_spatial_state_checkpoints_act(name):
    env = gym.make_vec(
        "Libero-Spatial-v0", num_envs=2, cameras=(), task_state=True, chunk_size=8, autoreset_mode="Disabled"
    )
    try:
        policy = load_policy(
            ROOT / "checkpoints" / name,
            env.single_observation_space,
            env.single_action_space,
        )
        obs, _ = env.reset(seed=0, options={"initial_frames": [0, 120]})
        actions = policy.act(obs, deterministic=True).actions.numpy()
        env.step(actions.astype(np.float32))
    finally:
        env.close()
    assert isinstance(policy, GaussianPolicy) and policy.squash and policy.value_head is None
    assert actions.shape == (2, 8, 7) and np.isfinite(actions).all() and np.abs(actions).max() <= 1.0
