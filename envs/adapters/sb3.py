"""A Stable-Baselines3 ``VecEnv`` over a gymnasium 1.x vector env (ours or any other).

SB3 only runs its own ``VecEnv`` type and has no adapter for ``gymnasium.vector.VectorEnv``. This
one bridges the two conventions:

* ``step`` returns ``(obs, rewards, dones, infos)`` with ``dones = terminated | truncated``, a list of
  per-env info dicts with ``TimeLimit.truncated`` and ``terminal_observation``, and the reset
  observation already in ``obs`` where an episode ended (SB3's autoreset);
* the wrapped env must autoreset in ``SAME_STEP`` mode (``final_obs`` becomes
  ``terminal_observation``) or be ``DISABLED`` with ``reset_mask`` support (finished envs are
  reset by the adapter right after the step); ``NEXT_STEP`` cannot be bridged without losing a step;
* ``seed()`` and ``set_options()`` apply at the next ``reset()``; per-env ``{"initial_frame": x}``
  options become our ``initial_frames`` reset option;
* SB3 cannot take ``Text`` observations: ``instruction="drop"`` (default) removes them,
  ``"encode"`` turns them into a ``Box`` of byte codes (``uint8``, zero-padded);
* ``info["episode"]`` holds SB3's ``{"r", "l", "t"}`` at an episode's end (``l`` in adapter steps)
  and ``info["is_success"]`` the env's success, so SB3's logger shows return and success rate; the
  env's own statistics stay under ``info["episode_stats"]``.

Requires the ``sb3`` extra (``pip install "vla-gym[sb3]"``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from envs.adapters.text import TEXT_MODES, TextObservations, text_keys
from nets.errors import BadInput

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError('envs.adapters.sb3 needs Stable-Baselines3: pip install "vla-gym[sb3]"') from e


class SB3VecEnv(VecEnv):
    """SB3 ``VecEnv`` view of a gymnasium vector env in SAME_STEP or DISABLED autoreset mode.

    Args:
        venv: e.g. ``gym.make_vec("Libero-Spatial-v0", 8, autoreset_mode="SameStep")`` or
            ``gym.make_vec("CartPole-v1", 8, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})``.
        instruction: what to do with ``Text`` observation keys: ``"drop"`` or ``"encode"``.
        instruction_length: bytes kept when encoding (longer texts are cut).
    """

    def __init__(
        self, venv: gym.vector.VectorEnv, *, instruction: str = "drop", instruction_length: int = 128
    ):
        mode = getattr(venv, "autoreset_mode", None) or venv.metadata.get("autoreset_mode")
        if mode not in (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED):
            raise BadInput(
                f"SB3VecEnv: expected a vector env with autoreset_mode SAME_STEP or DISABLED, got {mode}; "
                "make it with autoreset_mode='SameStep' (ours) or vector_kwargs={'autoreset_mode': ...}"
            )
        if instruction not in TEXT_MODES:
            raise BadInput(f"SB3VecEnv: instruction must be one of {TEXT_MODES}, got {instruction!r}")
        self.venv, self.mode = venv, AutoresetMode(mode)
        # steps and resets go through the text conversion; attributes are read from ``venv``
        self._env = (
            TextObservations(venv, instruction, instruction_length)
            if text_keys(venv.single_observation_space)
            else venv
        )
        super().__init__(venv.num_envs, self._env.single_observation_space, venv.single_action_space)
        self._actions: np.ndarray | None = None
        self._steps = np.zeros(self.num_envs, np.int64)
        self._started = np.full(self.num_envs, time.perf_counter())

    def _row(self, obs: Any, i: int) -> Any:
        return {k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i]

    # ---------------------------------------------------------------- reset and step
    def reset(self) -> Any:
        seeds = None if all(s is None for s in self._seeds) else [int(s or 0) for s in self._seeds]
        obs, info = self._env.reset(seed=seeds, options=self._merged_options())
        self.reset_infos = self._per_env(info)
        self._reset_seeds()
        self._reset_options()
        self._steps[:] = 0
        self._started[:] = time.perf_counter()
        return obs

    def _merged_options(self) -> dict[str, Any]:
        """SB3's per-env option dicts -> one vector-env options dict."""
        frames = [opts.get("initial_frame") for opts in self._options]
        rest = [{k: v for k, v in opts.items() if k != "initial_frame"} for opts in self._options]
        if any(r != rest[0] for r in rest):
            raise BadInput(
                "SB3VecEnv: reset options other than 'initial_frame' must be the same for every env"
            )
        merged = dict(rest[0])
        if any(f is not None for f in frames):
            if any(f is None for f in frames):
                raise BadInput("SB3VecEnv: give 'initial_frame' for every env or for none")
            merged["initial_frames"] = frames
        return merged

    def step_async(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions)
        expected = (self.num_envs, *self.action_space.shape)
        if self.action_space.shape is not None and actions.shape != expected:
            raise BadInput(
                f"SB3VecEnv: bad actions: expected shape {expected} (num_envs, *action_space.shape), "
                f"received shape {actions.shape}"
            )
        self._actions = actions

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        if self._actions is None:
            raise RuntimeError("SB3VecEnv: step_wait() without step_async()")
        actions, self._actions = self._actions, None
        obs, rewards, terminated, truncated, info = self._env.step(actions)
        dones = np.logical_or(terminated, truncated)
        infos = self._per_env(info)
        self._steps += 1
        now = time.perf_counter()
        done_ids = np.flatnonzero(dones)
        if self.mode == AutoresetMode.SAME_STEP:
            final_obs, final_info = info.get("final_obs"), self._per_env(info.get("final_info", {}))
            for i in done_ids:
                infos[i] = {**final_info[i], **infos[i]}
                infos[i]["terminal_observation"] = final_obs[i]
        elif len(done_ids):  # DISABLED: keep the terminal rows, then reset those envs only
            for i in done_ids:
                infos[i]["terminal_observation"] = self._row(obs, i)
            mask = np.zeros(self.num_envs, bool)
            mask[done_ids] = True
            obs, _ = self._env.reset(options={"reset_mask": mask})
        for i in done_ids:
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            stats = infos[i].pop("episode", None)
            if stats is not None:
                infos[i]["episode_stats"] = stats
                if "success" in stats:
                    infos[i]["is_success"] = bool(stats["success"])
            infos[i]["episode"] = {
                "r": float(stats["return"]) if stats else np.nan,
                "l": int(self._steps[i]),
                "t": round(now - self._started[i], 6),
            }
            self._steps[i], self._started[i] = 0, now
        return obs, np.asarray(rewards, np.float32), dones, infos

    def _per_env(self, info: dict[str, Any]) -> list[dict[str, Any]]:
        """gymnasium's dict of arrays with ``_key`` masks -> one dict per env."""
        out: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for key, value in info.items():
            if key.startswith("_") or key in ("final_obs", "final_info"):
                continue
            mask = info.get("_" + key, np.ones(self.num_envs, bool))
            nested = self._per_env(value) if isinstance(value, dict) else None
            for i in np.flatnonzero(mask):
                out[i][key] = nested[i] if nested is not None else value[i]
        return out

    # ---------------------------------------------------------------- attributes, rendering
    def _sub_envs(self) -> Sequence[gym.Env] | None:
        """The per-env ``gym.Env`` objects of a ``SyncVectorEnv``; None for other vector envs."""
        return getattr(self.venv, "envs", None)

    def _indices(self, indices: Any) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        return [int(indices)] if isinstance(indices, int | np.integer) else [int(i) for i in indices]

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        """Per-env attributes of a sync vector env; the vector env's own attribute otherwise
        (a native vector env has no per-env objects: every index sees the same value)."""
        idx = self._indices(indices)
        envs = self._sub_envs()
        if envs is not None:
            return [getattr(envs[i], attr_name) for i in idx]
        return [getattr(self.venv, attr_name)] * len(idx)

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        envs = self._sub_envs()
        if envs is not None:
            for i in self._indices(indices):
                setattr(envs[i].unwrapped, attr_name, value)
        else:
            setattr(self.venv, attr_name, value)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        idx = self._indices(indices)
        envs = self._sub_envs()
        if envs is not None:
            return [getattr(envs[i], method_name)(*args, **kwargs) for i in idx]
        result = getattr(self.venv, method_name)(*args, **kwargs)  # one call for the whole batch
        return [result] * len(idx)

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        envs = self._sub_envs()
        out = []
        for i in self._indices(indices):
            env, wrapped = (envs[i] if envs is not None else None), False
            while isinstance(env, gym.Wrapper) and not wrapped:
                wrapped, env = isinstance(env, wrapper_class), env.env
            out.append(wrapped)
        return out

    def get_images(self) -> Sequence[np.ndarray | None]:
        images = self.venv.render()
        return [None] * self.num_envs if images is None else list(images)

    def close(self) -> None:
        self.venv.close()
