"""The one-env view: ``gym.make(id)`` returns a plain ``gymnasium.Env`` over a 1-env vector env."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from envs.core.errors import bad_input
from envs.core.vector_env import ChunkedVectorEnv
from nets.errors import BadInput


class SingleEnvView(gym.Env):
    """A ``gymnasium.Env`` backed by a ``ChunkedVectorEnv`` with one env and no autoreset.

    ``reset(options=...)`` takes ``initial_frame`` (an int id or an ``InitialFrame``). ``info`` holds
    the per-sub-step detail of the chunk (``chunk_rewards``, ``chunk_valid``) and, at the end of an
    episode, ``episode`` statistics.
    """

    def __init__(self, vector_env: ChunkedVectorEnv) -> None:
        if vector_env.num_envs != 1 or vector_env.autoreset_mode != AutoresetMode.DISABLED:
            raise BadInput("SingleEnvView needs a vector env with num_envs=1 and autoreset_mode DISABLED")
        self.vector_env = vector_env
        self.observation_space = vector_env.single_observation_space
        self.action_space = vector_env.single_action_space
        self.metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
        self.render_mode = vector_env.render_mode
        self._done = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None:  # refused as the vector env refuses it, before any RNG is reseeded
            seed = self.vector_env._seed_int(seed)
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = sorted(set(options) - {"initial_frame"})
        if unknown:
            raise bad_input(self.vector_env.env_id, "reset option", "only 'initial_frame'", unknown)
        vec_options = {}
        if "initial_frame" in options:
            vec_options["initial_frames"] = [options["initial_frame"]]
        obs, info = self.vector_env.reset(seed=seed, options=vec_options)
        self._done = False
        return _unbatch_obs(obs), _unbatch_info(info)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError(
                f"{self.vector_env.env_id}: step() after the episode ended; call reset() first"
            )
        obs, reward, terminated, truncated, info = self.vector_env.step(np.asarray(action)[None])
        self._done = bool(terminated[0] or truncated[0])
        return (
            _unbatch_obs(obs),
            float(reward[0]),
            bool(terminated[0]),
            bool(truncated[0]),
            _unbatch_info(info),
        )

    def render(self) -> np.ndarray | None:
        images = self.vector_env.render()
        return None if images is None else images[0]

    def close(self) -> None:
        self.vector_env.close()


def _unbatch_obs(obs: dict[str, Any]) -> dict[str, Any]:
    return {k: v[0] for k, v in obs.items()}


def _unbatch_info(info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get("_" + key)
        if mask is not None and not mask[0]:
            continue
        out[key] = _unbatch_info(value) if isinstance(value, dict) else value[0]
    return out
