"""Self-imitation: keep the chunk-steps of episodes that beat their baseline, and add their
negative log-likelihood to the policy loss (Oh et al. 2018, "Self-Imitation Learning", with the
baseline of GRPO: the group's mean score).

Under a sparse success reward these are the successful episodes of groups that also failed: the
policy is pulled toward what it did when it succeeded, including its own recoveries, for as long
as they stay in the buffer (not only in the iteration they were collected), which is what makes it
sample-efficient. The buffer holds the policy's replay records (``evaluate`` recomputes their
log-probs under the current weights); the oldest chunk-steps are dropped first.

Data parallel (``trainers/distributed.py``): every rank holds the same buffer, the one a single
process stepping all the envs would hold. ``add`` gathers the ranks' new chunk-steps and appends
them on every rank in the single process's order (by time step, then by env over all ranks) before
the FIFO cap applies; each minibatch's rows are drawn whole from a stream that is the same on every
rank, and each rank evaluates its contiguous share of them (``grpo_update``). Rank 0's checkpoint
thus holds the whole buffer, and a run resumes from it on any number of ranks.
"""

from __future__ import annotations

from typing import Any

import torch

from trainers import distributed
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
        how many rows were added (over all ranks: every rank must call it, with its own envs)."""
        mask = rollout.first_episode & envs.to(rollout.first_episode.device)[None, :, None]  # [T, N, K]
        rows = mask.any(-1).reshape(-1)  # sample m = t * N + n
        if distributed.world_size() == 1 and not rows.any():
            return 0
        new = {k: v.reshape(-1, *v.shape[2:])[rows].cpu() for k, v in rollout.replay.items()}
        valid = mask.reshape(-1, mask.shape[-1])[rows].cpu()
        if distributed.world_size() > 1:
            new, valid = _gather_rows(new, valid, torch.nonzero(rows).squeeze(-1).cpu(), mask.shape[1])
            if valid.shape[0] == 0:  # no rank had any
                return 0
        if not self.replay:
            self.replay = {k: v[-self.capacity :] for k, v in new.items()}
            self.valid = valid[-self.capacity :]
        else:
            self.replay = {k: torch.cat([self.replay[k], new[k]])[-self.capacity :] for k in self.replay}
            self.valid = torch.cat([self.valid, valid])[-self.capacity :]
        return int(valid.shape[0])

    def draw(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The row indices ``[B]`` of a uniform minibatch (with replacement)."""
        return torch.randint(len(self), (batch_size,), generator=generator)

    def rows(self, idx: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The replay records and the executed sub-steps ``[B, K]`` of rows ``idx``."""
        return {k: v[idx] for k, v in self.replay.items()}, self.valid[idx]

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A uniform minibatch (with replacement): replay records and the executed sub-steps ``[B, K]``."""
        return self.rows(self.draw(batch_size, generator))

    def state_dict(self) -> dict[str, Any]:
        return {"replay": self.replay, "valid": self.valid}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.replay, self.valid = dict(state["replay"]), state["valid"]


def _gather_rows(
    new: dict[str, torch.Tensor], valid: torch.Tensor, samples: torch.Tensor, num_envs: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every rank's new rows (``samples``: their local sample indices ``t * num_envs + n``), in the
    order a single process stepping all ranks' envs adds them: rank r's envs follow those of the
    ranks before it (contiguous shares), so its env n is env ``offset_r + n`` of the whole batch.
    The ranks' rollouts may differ in length (GRPO collects until the rank's envs are done)."""
    parts = distributed.all_gather((new, valid, samples, num_envs))
    total_envs = sum(part[3] for part in parts)
    keys, offset = [], 0
    for _, _, m, n in parts:
        keys.append(torch.div(m, n, rounding_mode="floor") * total_envs + offset + m % n)
        offset += n
    order = torch.argsort(torch.cat(keys), stable=True)
    gathered = {k: torch.cat([part[0][k] for part in parts])[order] for k in new}
    return gathered, torch.cat([part[1] for part in parts])[order]


def imitation_nll(
    log_probs: torch.Tensor, valid: torch.Tensor, weight_sum: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean negative log-likelihood ``[B, K, E] -> ()`` over the executed sub-steps' elements
    (``weight_sum``: their count over all ranks, see ``masked_mean``)."""
    return -masked_mean(log_probs, valid[..., None], weight_sum)
