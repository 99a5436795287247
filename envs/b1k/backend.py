"""The calls ``B1KVectorEnv`` makes to a BEHAVIOR-1K simulator, as one small protocol.

``OmniGibsonBackend`` (``envs/b1k/omnigibson_backend.py``) implements it with OmniGibson; tests use
``tests/fake_omnigibson.py``, a fake that implements exactly these calls. Everything the env does
with the answers (observation mapping, chunking, episode bookkeeping, q-score) is the env's own code
and is tested against the fake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass
class StepResult:
    """One 30 Hz step of ``n`` envs. ``obs`` holds each env's flattened OmniGibson observation
    (``"<camera>::rgb"``, ``"robot_r1::proprio"``) when it was asked for, else None."""

    obs: list[dict[str, Any]] | None
    reward: np.ndarray  # [n] float
    terminated: np.ndarray  # [n] bool: all BDDL goal predicates hold (success)
    truncated: np.ndarray  # [n] bool: OmniGibson's own timeout
    success: np.ndarray  # [n] bool
    info: list[dict[str, Any]] = field(default_factory=list)


class B1KBackend(Protocol):
    """What a BEHAVIOR-1K simulator must do for ``B1KVectorEnv``."""

    def load(self, task: str, num_envs: int, image_size: int) -> None:
        """Build ``num_envs`` environments of ``task`` (one scene each, cameras at ``image_size``)."""

    def instances(self, task: str) -> list[int]:
        """The saved task instances (``*-tro_state.json`` ids) that episodes can start from."""

    def instruction(self, task: str) -> str:
        """The task's language instruction."""

    def max_steps(self, task: str) -> int:
        """Episode limit in 30 Hz steps (the challenge: twice the mean human demonstration length)."""

    def reset_to_instance(self, env_idx: int, instance: int) -> dict[str, Any]:
        """Load instance ``instance``'s saved state into env ``env_idx``, make it that env's reset
        state, reset, and return its flattened observation."""

    def step(self, env_ids: list[int], actions: np.ndarray, get_obs: bool) -> StepResult:
        """Apply ``actions`` ``[n, 23]`` to ``env_ids`` and advance the simulation one step."""

    def observe(self, env_idx: int) -> dict[str, Any]:
        """Env ``env_idx``'s flattened observation now (cameras rendered)."""

    def goal_predicates(self, env_idx: int) -> list[list[bool]]:
        """Truth value of every predicate of every grounding of the task's goal, now."""

    def close(self) -> None:
        """Release the environments (never ``og.shutdown()``: it exits the process)."""
