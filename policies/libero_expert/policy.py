"""The scripted LIBERO pick-and-place expert as an ``ActionChunkPolicy``.

It reads the privileged observation ``task_state`` of ``LiberoVectorEnv(task_state=True)``, unpacked
by the named fields its space carries (``FieldBox.fields``, so the layout lives in the env alone:
``envs/libero/task_state.py``), and keeps one phase machine per env,
restarted whenever an observation has ``episode_step == 0``. It is deterministic; ``act`` returns
no log-probs and the policy cannot be trained (``evaluate`` raises).

``action_noise`` > 0 adds Gaussian noise of that standard deviation to the translation (the first three
dimensions) of the actions ``act`` sends when called with ``deterministic=False`` (drawn from the policy's
generator, ``seed``; the phase machine corrects it at the next step): demonstrations whose actions are not
a function of what the camera sees, which an action-conditioned world model needs to learn what actions
do (``python -m trainers.demos --no-deterministic --policy-kwargs '{"action_noise": 0.5}'``).

Chunks: the machine is a per-step controller. With K > 1 it plans the chunk from one observation
by holding that step's action K times (zero-order hold), which is coarser: record demonstrations
with ``chunk_size=None`` and let behaviour cloning cut them into chunks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from nets.errors import BadInput
from policies.base import ActionChunk, ActionChunkPolicy, PolicyEval
from policies.libero_expert.machine import PickPlaceMachine
from policies.torso_policy import box_chunk_shape

# the task_state fields the phase machine reads (the env names the layout: ``space.fields``)
REQUIRED_FIELDS = (
    "supported", "episode_step", "eef_pos", "eef_quat", "gripper_qpos", "obj_pos", "obj_quat",
    "obj_local_center", "obj_local_half", "target_pos", "target_top", "goal_in", "ring_height",
    "ring_free", "ring_free_low",
)  # fmt: skip


def unpack_task_state(vector: np.ndarray, fields: tuple[tuple[str, int], ...]) -> dict[str, np.ndarray]:
    """One env's ``task_state`` vector -> named float64 fields (``fields``: the space's layout)."""
    out, i = {}, 0
    for name, n in fields:
        out[name] = np.asarray(vector[i : i + n], np.float64)
        i += n
    return out


class LiberoExpert(ActionChunkPolicy):
    """Scripted pick-and-place for LIBERO tasks whose goal is one ``On`` / ``In`` predicate.

    Args:
        observation_space: a Dict with ``task_state``, a space that names its ``fields``.
        action_space: LIBERO's 7-d Box, ``(7,)`` or ``(K, 7)``.
        action_noise: the standard deviation of the noise on the translation dimensions of sampled
            actions (``act(..., deterministic=False)``; 0: none, the default).
        **machine_options: ``PickPlaceMachine`` settings (gains, heights, retries).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        action_noise: float = 0.0,
        **machine_options: Any,
    ):
        super().__init__()
        state = (
            observation_space.spaces.get("task_state") if isinstance(observation_space, spaces.Dict) else None
        )
        fields = getattr(state, "fields", None)
        missing = [f for f in REQUIRED_FIELDS if f not in dict(fields or ())]
        if state is None or fields is None or missing:
            raise BadInput(
                "LiberoExpert needs the observation 'task_state' with named fields (a space with "
                f"``fields``, missing {missing}): make the env with task_state=True (got {observation_space})"
            )
        self.fields = tuple(fields)
        self.chunk_size, self.action_dim = box_chunk_shape(action_space)
        if self.action_dim != 7:
            raise BadInput(f"LiberoExpert drives LIBERO's 7-d actions, got an action space {action_space}")
        self.log_prob_dim = self.action_dim
        if not (isinstance(action_noise, (int, float)) and 0 <= action_noise < float("inf")):
            raise BadInput(f"LiberoExpert: action_noise: expected a finite value >= 0, got {action_noise!r}")
        self.action_noise = float(action_noise)
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
            s = unpack_task_state(vector, self.fields)
            if s["episode_step"][0] == 0:
                self.machines[i].reset()
            if s["supported"][0] < 0.5:
                actions[i, :, 6] = -1.0  # stay still, gripper open
                self.unsupported_steps += 1
                continue
            actions[i] = np.clip(self.machines[i].act(s), -1.0, 1.0)  # held for the whole chunk
        if self.action_noise > 0 and not deterministic:  # exploration noise on the translation only
            noise = torch.randn(actions.shape[:2] + (3,), generator=self._rng(torch.device("cpu")))
            actions[..., :3] = np.clip(actions[..., :3] + self.action_noise * noise.numpy(), -1.0, 1.0)
        return ActionChunk(torch.as_tensor(actions))

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        raise NotImplementedError("LiberoExpert is scripted: it has nothing to train")

    def value(self, obs: Any) -> torch.Tensor:
        raise NotImplementedError("LiberoExpert is scripted: it has no value function")
