"""The per-step baseline: a plain one-step LIBERO ``gymnasium.Env`` that renders every step.

This is what LeRobot's ``LiberoEnv`` does (one action per ``step()``, both cameras rendered after
each one), written here so the throughput benchmark can run it under gymnasium's
``AsyncVectorEnv`` in the same process as our chunked env. Not part of the library.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PlainLiberoEnv(gym.Env):
    """One LIBERO-Spatial task, one action per step, two cameras rendered every step."""

    def __init__(self, task_index: int = 0, image_size: int = 128) -> None:
        self.task_index, self.image_size = task_index, image_size
        img = gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict({"image": img, "wrist_image": img})
        self.action_space = gym.spaces.Box(-1, 1, (7,), np.float32)
        self._env = None  # built lazily, inside the worker process

    def _build(self) -> None:
        from envs.libero.install import ensure_config

        ensure_config()
        from libero.libero.envs import OffScreenRenderEnv

        from envs.libero.suites import load_init_states, suite_tasks

        task = suite_tasks("spatial")[self.task_index]
        self._init_states = load_init_states(task)
        size = self.image_size
        self._env = OffScreenRenderEnv(bddl_file_name=task.bddl_file, camera_heights=size, camera_widths=size)

    def _obs(self, raw: dict) -> dict:
        return {
            "image": raw["agentview_image"][::-1, ::-1].copy(),
            "wrist_image": raw["robot0_eye_in_hand_image"][::-1, ::-1].copy(),
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if self._env is None:
            self._build()
        np.random.seed(0)
        self._env.reset()
        raw = self._env.set_init_state(self._init_states[0])
        return self._obs(raw), {}

    def step(self, action):
        raw, reward, _, _ = self._env.step(np.asarray(action, np.float64))
        success = bool(self._env.check_success())
        return self._obs(raw), float(reward), success, False, {"is_success": success}

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
