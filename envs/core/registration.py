"""Register a chunked vector env under one id, for both ``gym.make`` and ``gym.make_vec``."""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode

from envs.core.single import SingleEnvView


def make_single(vector_entry_point: str, **kwargs: Any) -> SingleEnvView:
    """Build the one-env view of a registered chunked vector env."""
    if kwargs.pop("autoreset_mode", AutoresetMode.DISABLED) != AutoresetMode.DISABLED:
        raise ValueError("the one-env view (gym.make) has no autoreset; use gym.make_vec for autoreset modes")
    creator = load_env_creator(vector_entry_point)
    return SingleEnvView(creator(num_envs=1, autoreset_mode=AutoresetMode.DISABLED, **kwargs))


def register_env(env_id: str, vector_entry_point: str, **kwargs: Any) -> None:
    """Register ``env_id``: ``gym.make_vec`` builds the native vector env, ``gym.make`` its one-env view."""
    gym.register(
        id=env_id,
        entry_point=functools.partial(make_single, vector_entry_point),
        vector_entry_point=vector_entry_point,
        kwargs={"env_id": env_id, **kwargs},
    )
