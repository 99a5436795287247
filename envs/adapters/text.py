"""Drop or encode the ``Text`` observation keys of a vector env (e.g. ``instruction``).

Stable-Baselines3 and TorchRL only take array observations: a tuple of strings cannot be stacked
into a tensor. ``TextObservations`` removes the ``Text`` keys of a ``Dict`` observation
(``mode="drop"``) or turns each into a ``Box(0, 255, (length,), uint8)`` of UTF-8 byte codes,
zero-padded and cut at ``length`` bytes (``mode="encode"``). It works in every autoreset mode and
converts ``info["final_obs"]`` rows too (SAME_STEP). ``TextObservation`` does the same for one env
(``gym.make``), e.g. for SB3's ``check_env`` and ``make_vec_env``::

    env = TextObservation(gym.make("Libero-Spatial-v0", cameras=(), chunk_size=None), "encode")
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space

from nets.errors import BadInput

TEXT_MODES = ("drop", "encode")


def text_keys(space: spaces.Space) -> list[str]:
    """The keys of a ``Dict`` space that hold ``Text``; empty for any other space."""
    if not isinstance(space, spaces.Dict):
        return []
    return [k for k, s in space.spaces.items() if isinstance(s, spaces.Text)]


def encode_text(text: str, length: int) -> np.ndarray:
    """UTF-8 byte codes of ``text``, cut at ``length`` bytes and zero-padded: ``uint8 (length,)``."""
    codes = np.zeros(length, np.uint8)
    data = text.encode("utf-8")[:length]
    codes[: len(data)] = np.frombuffer(data, np.uint8)
    return codes


def without_text(space: spaces.Dict, mode: str, length: int) -> spaces.Dict:
    """``space`` with its ``Text`` keys dropped or turned into ``Box(0, 255, (length,), uint8)``."""
    if mode not in TEXT_MODES:
        raise BadInput(f"text mode must be one of {TEXT_MODES}, got {mode!r}")
    if not isinstance(length, int) or length < 1:
        raise BadInput(f"text length must be a positive int, got {length!r}")
    keys = text_keys(space)
    parts = {k: s for k, s in space.spaces.items() if k not in keys}
    if mode == "encode":
        parts.update({k: spaces.Box(0, 255, (length,), np.uint8) for k in keys})
    return spaces.Dict(parts)


class TextObservation(gym.ObservationWrapper):
    """One env whose ``Text`` observation keys are dropped or encoded (``TextObservations``'s
    conversion for ``gym.make`` envs).

    Args:
        env: a gymnasium env with a ``Dict`` observation space.
        mode: ``"drop"`` (remove the keys) or ``"encode"`` (``uint8`` byte codes).
        length: bytes kept per text when encoding.
    """

    def __init__(self, env: gym.Env, mode: str = "drop", length: int = 128):
        if not isinstance(env.observation_space, spaces.Dict):
            raise BadInput(f"TextObservation needs a Dict observation space, got {env.observation_space}")
        super().__init__(env)
        self.mode, self.length = mode, length
        self.keys = text_keys(env.observation_space)
        self.observation_space = without_text(env.observation_space, mode, length)

    def observation(self, observation: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in observation.items() if k not in self.keys}
        if self.mode == "encode":
            out.update({k: encode_text(observation[k], self.length) for k in self.keys})
        return out


class TextObservations(VectorWrapper):
    """A vector env whose ``Text`` observation keys are dropped or encoded as byte arrays.

    Args:
        env: any gymnasium vector env with a ``Dict`` observation space.
        mode: ``"drop"`` (remove the keys) or ``"encode"`` (``uint8`` byte codes).
        length: bytes kept per text when encoding.
    """

    def __init__(self, env: VectorEnv, mode: str = "drop", length: int = 128):
        single = without_text(env.single_observation_space, mode, length)
        super().__init__(env)
        self.mode, self.length = mode, length
        self.keys = text_keys(env.single_observation_space)
        self.single_observation_space = single
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)
        # TorchRL reads the mode as an attribute; wrappers do not forward attributes.
        mode_ = getattr(env, "autoreset_mode", None) or env.metadata.get("autoreset_mode")
        self.autoreset_mode = AutoresetMode(mode_) if mode_ is not None else None

    def convert(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Batched observations ``{key: [N, ...]}`` of the wrapped env -> this env's."""
        out = {k: v for k, v in obs.items() if k not in self.keys}
        if self.mode == "encode":
            out.update({k: np.stack([encode_text(t, self.length) for t in obs[k]]) for k in self.keys})
        return out

    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """One env's observation (e.g. a ``final_obs`` row) -> this env's."""
        batched = {k: [v] if k in self.keys else np.asarray(v)[None] for k, v in row.items()}
        return {k: v[0] for k, v in self.convert(batched).items()}

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return self.convert(obs), info

    def step(self, actions: Any):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        if "final_obs" in info:
            final = np.full(self.num_envs, None, dtype=object)
            for i, row in enumerate(info["final_obs"]):
                if row is not None:
                    final[i] = self.convert_row(row)
            info = {**info, "final_obs": final}
        return self.convert(obs), rewards, terminated, truncated, info
