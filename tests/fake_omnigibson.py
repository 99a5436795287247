"""A FAKE OmniGibson for tests only: it implements exactly the ``B1KBackend`` calls that
``envs.b1k.B1KVectorEnv`` makes, with made-up, deterministic dynamics. It simulates nothing of
BEHAVIOR-1K (OmniGibson needs Isaac Sim and an RTX GPU, so the real one cannot run on CPU machines).

Its answers have OmniGibson's shapes and formats: flattened observations with RGBA uint8 torch
camera images under the R1Pro sensor names and a 256-D torch proprio vector. The made-up world:

* proprio: base velocity = action[0:3], torso / arm joints = the last commanded positions, each
  gripper's two fingers at ``(g + 1) / 2 * 0.025`` for gripper command g;
* cameras: channel 0 = (10 * instance + step) mod 256, channel 1 = camera number, alpha 255;
* goal: groundings ``[[p0, p1, p2], [p3, p4]]``; predicate j turns true (for good) once a base
  x-velocity command exceeds ``THRESHOLDS[j]``; instance 1 starts with p0 already true; success when
  every predicate of a grounding is true; reward 0.1 per predicate turning true;
* ``timeout``: OmniGibson's own truncation after that many steps (None: never).

Every call is recorded in ``calls`` as ``(method, args)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from envs.b1k.backend import StepResult
from envs.b1k.layout import CAMERAS, PROPRIO_KEY, PROPRIO_SIZE, PROPRIO_SLICES

GROUNDINGS = [[0, 1, 2], [3, 4]]
THRESHOLDS = [0.1, 0.3, 0.5, 0.2, 0.6]


class FakeOmniGibson:
    """Fake ``B1KBackend`` (see the module docstring)."""

    def __init__(
        self,
        instances: tuple[int, ...] = (0, 1, 2, 7),
        max_steps: int = 40,
        timeout: int | None = None,
        image_size: int | None = None,
    ) -> None:
        self._instances, self._max_steps, self.timeout = list(instances), max_steps, timeout
        self.forced_image_size = image_size  # return this size instead of the configured one
        self.calls: list[tuple[str, tuple]] = []
        self.envs: list[dict[str, Any]] = []

    # ---------------------------------------------------------------- task data
    def instances(self, task: str) -> list[int]:
        return list(self._instances)

    def instruction(self, task: str) -> str:
        return task.replace("_", " ")

    def max_steps(self, task: str) -> int:
        return self._max_steps

    # ---------------------------------------------------------------- simulation
    def load(self, task: str, num_envs: int, image_size: int) -> None:
        self.calls.append(("load", (task, num_envs, image_size)))
        self.image_size = self.forced_image_size or image_size
        self.envs = [self._fresh(0) for _ in range(num_envs)]

    def _fresh(self, instance: int) -> dict[str, Any]:
        true = np.zeros(5, bool)
        true[0] = instance == 1
        return {"instance": instance, "t": 0, "joints": np.zeros(23, np.float32), "true": true}

    def reset_to_instance(self, env_idx: int, instance: int) -> dict[str, Any]:
        self.calls.append(("reset_to_instance", (env_idx, instance)))
        self.envs[env_idx] = self._fresh(instance)
        return self.observe(env_idx, record=False)

    def step(self, env_ids: list[int], actions: np.ndarray, get_obs: bool) -> StepResult:
        self.calls.append(("step", (list(env_ids), np.array(actions), get_obs)))
        reward, terminated, truncated = [], [], []
        for i, action in zip(env_ids, actions):
            env = self.envs[i]
            before = env["true"].sum()
            env["true"] |= action[0] > np.asarray(THRESHOLDS)
            env["joints"], env["t"] = np.asarray(action, np.float32).copy(), env["t"] + 1
            reward.append(0.1 * (env["true"].sum() - before))
            terminated.append(self._success(i))
            truncated.append(self.timeout is not None and env["t"] >= self.timeout)
        obs = [self.observe(i, record=False) for i in env_ids] if get_obs else None
        done = np.asarray(terminated)
        return StepResult(obs, np.asarray(reward, np.float32), done, np.asarray(truncated), done.copy())

    def _success(self, i: int) -> bool:
        return any(self.envs[i]["true"][g].all() for g in GROUNDINGS)

    def observe(self, env_idx: int, record: bool = True) -> dict[str, Any]:
        if record:
            self.calls.append(("observe", (env_idx,)))
        env, s = self.envs[env_idx], self.image_size
        obs: dict[str, Any] = {}
        for n, name in enumerate(CAMERAS.values()):
            image = torch.zeros(s, s, 4, dtype=torch.uint8)
            image[..., 0] = (10 * env["instance"] + env["t"]) % 256
            image[..., 1] = n
            image[..., 3] = 255
            obs[f"{name}::rgb"] = image
        proprio = np.zeros(PROPRIO_SIZE, np.float32)
        a, p = env["joints"], PROPRIO_SLICES
        proprio[p["base_qvel"]] = a[0:3]
        proprio[p["trunk_qpos"]] = a[3:7]
        proprio[p["arm_left_qpos"]] = a[7:14]
        proprio[p["arm_right_qpos"]] = a[15:22]
        proprio[p["gripper_left_qpos"]] = (a[14] + 1) / 2 * 0.025
        proprio[p["gripper_right_qpos"]] = (a[22] + 1) / 2 * 0.025
        obs[PROPRIO_KEY] = torch.from_numpy(proprio)
        return obs

    def goal_predicates(self, env_idx: int) -> list[list[bool]]:
        true = self.envs[env_idx]["true"]
        return [[bool(true[j]) for j in g] for g in GROUNDINGS]

    def close(self) -> None:
        self.calls.append(("close", ()))
