"""The scripted LIBERO pick-and-place expert as an ``ActionChunkPolicy``.

It reads the privileged observation ``task_state`` of ``LiberoVectorEnv(task_state=True)`` (layout
in ``TASK_STATE_FIELDS``, the same as ``envs/libero/task_state.py``; policies never import envs,
so ``tests/test_libero_expert.py`` checks that both agree) and keeps one phase machine per env,
restarted whenever an observation has ``episode_step == 0``. It is deterministic; ``act`` returns
no log-probs and the policy cannot be trained (``evaluate`` raises).

Chunks: the machine is a per-step controller. With K > 1 it plans the chunk from one observation
by holding that step's action K times (zero-order hold), which is coarser: record demonstrations
with ``chunk_size=None`` and let behaviour cloning cut them into chunks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from policies.base import ActionChunk, ActionChunkPolicy, PolicyEval
from policies.libero_expert.machine import PickPlaceMachine
from policies.torso_policy import box_chunk_shape

TASK_STATE_FIELDS: tuple[tuple[str, int], ...] = (
    ("supported", 1),
    ("episode_step", 1),
    ("eef_pos", 3),
    ("eef_quat", 4),
    ("gripper_qpos", 2),
    ("obj_pos", 3),
    ("obj_quat", 4),
    ("obj_local_center", 3),
    ("obj_local_half", 3),
    ("target_pos", 3),
    ("target_top", 1),
    ("goal_in", 1),
    ("ring_height", 8),
    ("ring_free", 8),
    ("ring_free_low", 8),
)
TASK_STATE_DIM = sum(n for _, n in TASK_STATE_FIELDS)


def unpack_task_state(vector: np.ndarray) -> dict[str, np.ndarray]:
    """One env's ``task_state`` vector -> named float64 fields."""
    out, i = {}, 0
    for name, n in TASK_STATE_FIELDS:
        out[name] = np.asarray(vector[i : i + n], np.float64)
        i += n
    return out


class LiberoExpert(ActionChunkPolicy):
    """Scripted pick-and-place for LIBERO tasks whose goal is one ``On`` / ``In`` predicate.

    Args:
        observation_space: a Dict with ``task_state`` (``(TASK_STATE_DIM,)``).
        action_space: LIBERO's 7-d Box, ``(7,)`` or ``(K, 7)``.
        **machine_options: ``PickPlaceMachine`` settings (gains, heights, retries).
    """

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Box, **machine_options: Any):
        super().__init__()
        state = (
            observation_space.spaces.get("task_state") if isinstance(observation_space, spaces.Dict) else None
        )
        if state is None or state.shape != (TASK_STATE_DIM,):
            raise ValueError(
                "LiberoExpert needs the observation 'task_state' of shape "
                f"({TASK_STATE_DIM},): make the env with task_state=True (got {observation_space})"
            )
        self.chunk_size, self.action_dim = box_chunk_shape(action_space)
        if self.action_dim != 7:
            raise ValueError(f"LiberoExpert drives LIBERO's 7-d actions, got an action space {action_space}")
        self.log_prob_dim = self.action_dim
        self.machine_options = machine_options
        self.machines: list[PickPlaceMachine] = []
        self.unsupported_steps = 0  # steps of tasks the expert cannot do (no-op actions)

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = True) -> ActionChunk:
        states = np.asarray(obs["task_state"], np.float64)
        while len(self.machines) < len(states):
            self.machines.append(PickPlaceMachine(**self.machine_options))
        actions = np.zeros((len(states), self.chunk_size, self.action_dim), np.float32)
        for i, vector in enumerate(states):
            s = unpack_task_state(vector)
            if s["episode_step"][0] == 0:
                self.machines[i].reset()
            if s["supported"][0] < 0.5:
                actions[i, :, 6] = -1.0  # stay still, gripper open
                self.unsupported_steps += 1
                continue
            actions[i] = np.clip(self.machines[i].act(s), -1.0, 1.0)  # held for the whole chunk
        return ActionChunk(torch.as_tensor(actions))

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        raise NotImplementedError("LiberoExpert is scripted: it has nothing to train")

    def value(self, obs: Any) -> torch.Tensor:
        raise NotImplementedError("LiberoExpert is scripted: it has no value function")
