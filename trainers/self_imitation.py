"""Self-imitation: keep the chunk-steps of episodes that beat their baseline, and add their
negative log-likelihood to the policy loss (Oh et al. 2018, "Self-Imitation Learning", with the
baseline of GRPO: the group's mean score).

Under a sparse success reward these are the successful episodes of groups that also failed: the
policy is pulled toward what it did when it succeeded, including its own recoveries, for as long
as they stay in the buffer (not only in the iteration they were collected), which is what makes it
sample-efficient. The buffer holds the policy's replay records (``evaluate`` recomputes their
log-probs under the current weights); the oldest chunk-steps are dropped first.
"""

from __future__ import annotations

from typing import Any

import torch

from trainers.losses import masked_mean
from trainers.rollout import Rollout


class SuccessBuffer:
    """Replay records of the chunk-steps of chosen episodes, at most ``capacity`` rows (FIFO)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"self-imitation buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.replay: dict[str, torch.Tensor] = {}
        self.valid = torch.zeros(0, 0, dtype=torch.bool)

    def __len__(self) -> int:
        return int(self.valid.shape[0])

    def add(self, rollout: Rollout, envs: torch.Tensor) -> int:
        """Store the first-episode chunk-steps of the envs where ``envs`` ``[N]`` is True; returns
        how many rows were added."""
        mask = rollout.first_episode & envs.to(rollout.first_episode.device)[None, :, None]  # [T, N, K]
        rows = mask.any(-1).reshape(-1)  # sample m = t * N + n
        if not rows.any():
            return 0
        new = {k: v.reshape(-1, *v.shape[2:])[rows].cpu() for k, v in rollout.replay.items()}
        valid = mask.reshape(-1, mask.shape[-1])[rows].cpu()
        if not self.replay:
            self.replay, self.valid = new, valid
        else:
            self.replay = {k: torch.cat([self.replay[k], new[k]])[-self.capacity :] for k in self.replay}
            self.valid = torch.cat([self.valid, valid])[-self.capacity :]
        return int(valid.shape[0])

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A uniform minibatch (with replacement): replay records and the executed sub-steps ``[B, K]``."""
        idx = torch.randint(len(self), (batch_size,), generator=generator)
        return {k: v[idx] for k, v in self.replay.items()}, self.valid[idx]

    def state_dict(self) -> dict[str, Any]:
        return {"replay": self.replay, "valid": self.valid}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.replay, self.valid = dict(state["replay"]), state["valid"]


def imitation_nll(
    log_probs: torch.Tensor, valid: torch.Tensor, weight_sum: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean negative log-likelihood ``[B, K, E] -> ()`` over the executed sub-steps' elements
    (``weight_sum``: their count over all ranks, see ``masked_mean``)."""
    return -masked_mean(log_probs, valid[..., None], weight_sum)
