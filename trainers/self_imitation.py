"""Self-imitation: keep the chunk-steps of episodes that beat their baseline, and add their
weighted negative log-likelihood to the policy loss (Oh et al. 2018, "Self-Imitation Learning":
the clipped advantage ``(R - b)+`` weighs each stored step, with the baseline of GRPO: the
group's mean score).

Under a sparse success reward these are the successful episodes of groups that also failed: the
policy is pulled toward what it did when it succeeded, including its own recoveries, for as long
as they stay in the buffer (not only in the iteration they were collected), which is what makes it
sample-efficient. The buffer holds the policy's replay records (``evaluate`` recomputes their
log-probs under the current weights) and each row's weight, fixed when it is stored (GRPO: the
episode's clipped group advantage, ``trainers.grpo.algorithm.imitation_weights``); the oldest
chunk-steps are dropped first.

Why the weight: with weight 1 on every stored step, the imitation gradient is the REINFORCE
gradient of the successes with no baseline (every success pulled equally, whether its start
succeeds 1 time in 8 or 7 in 8); measured on the LIBERO recipe, its direction between two
independent batches had cosine -0.08 (issue 31). With ``(R - b)+`` a success at a start the policy
already solves weighs little and a rare one much, as in the policy gradient.

The loss (``imitation_nll``) is ``sum(w * -log p) / count``: the weighted sum over the drawn rows'
executed sub-steps' elements divided by how many there are, not by the sum of the weights. So its
scale does not depend on the minibatch size, and it keeps the weights' absolute size: a minibatch of
rows barely above their baseline pulls weakly, where ``sum(w * nll) / sum(w)`` would pull it as
hard as one of rare successes (a self-normalised mean that would bring back the baseline-free
behaviour within each minibatch). With every weight 1 it is the plain mean NLL.

Data parallel (``trainers/parallel.py``): every rank holds the same buffer, the one a single
process stepping all the envs would hold. ``add`` gathers the ranks' new chunk-steps and appends
them on every rank in the single process's order (by time step, then by env over all ranks) before
the FIFO cap applies; each minibatch's rows are drawn whole from a stream that is the same on every
rank, and each rank evaluates its contiguous share of them (``grpo_update``). Rank 0's checkpoint
thus holds the whole buffer, and a run resumes from it on any number of ranks.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from nets.errors import BadInput
from trainers import parallel
from trainers.losses import masked_mean
from trainers.rollout import Rollout


class SuccessBuffer:
    """Replay records of the chunk-steps of chosen episodes and their imitation weights, at most
    ``capacity`` rows (FIFO)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise BadInput(f"self-imitation buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.replay: dict[str, torch.Tensor] = {}
        self.valid = torch.zeros(0, 0, dtype=torch.bool)
        self.weights = torch.zeros(0)  # [rows] float32: each row's weight in the imitation loss

    def __len__(self) -> int:
        return int(self.valid.shape[0])

    def add(self, rollout: Rollout, envs: torch.Tensor, weights: torch.Tensor | None = None) -> int:
        """Store the first-episode chunk-steps of the envs where ``envs`` ``[N]`` is True, each with
        its env's ``weights`` ``[N]`` entry (default 1); returns how many rows were added (over all
        ranks: every rank must call it, with its own envs)."""
        n_envs = envs.shape[0]
        mask = rollout.first_episode & envs.to(rollout.first_episode.device)[None, :, None]  # [T, N, K]
        rows = mask.any(-1).reshape(-1)  # sample m = t * N + n
        if parallel.world_size() == 1 and not rows.any():
            return 0
        new = {k: v.reshape(-1, *v.shape[2:])[rows].cpu() for k, v in rollout.replay.items()}
        valid = mask.reshape(-1, mask.shape[-1])[rows].cpu()
        env_weights = torch.ones(n_envs) if weights is None else weights.detach().float().cpu()
        weight = env_weights.repeat(mask.shape[0])[rows.cpu()]  # row m belongs to env m % N
        if parallel.world_size() > 1:
            samples = torch.nonzero(rows).squeeze(-1).cpu()
            new, valid, weight = _gather_rows(new, valid, weight, samples, mask.shape[1])
            if valid.shape[0] == 0:  # no rank had any
                return 0
        if not self.replay:
            self.replay = {k: v[-self.capacity :] for k, v in new.items()}
            self.valid = valid[-self.capacity :]
            self.weights = weight[-self.capacity :]
        else:
            self.replay = {k: torch.cat([self.replay[k], new[k]])[-self.capacity :] for k in self.replay}
            self.valid = torch.cat([self.valid, valid])[-self.capacity :]
            self.weights = torch.cat([self.weights, weight])[-self.capacity :]
        return int(valid.shape[0])

    def draw(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The row indices ``[B]`` of a uniform minibatch (with replacement)."""
        return torch.randint(len(self), (batch_size,), generator=generator)

    def rows(self, idx: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """The replay records, the executed sub-steps ``[B, K]`` and the weights ``[B]`` of rows ``idx``."""
        return {k: v[idx] for k, v in self.replay.items()}, self.valid[idx], self.weights[idx]

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """A uniform minibatch (with replacement): replay records, the executed sub-steps ``[B, K]``
        and the rows' weights ``[B]``."""
        return self.rows(self.draw(batch_size, generator))

    def state_dict(self) -> dict[str, Any]:
        return {"replay": self.replay, "valid": self.valid, "weights": self.weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a buffer. One saved before rows had weights (no ``"weights"``) is loaded with
        weight 1 on every row, which is how it was imitated then (with a warning)."""
        self.replay, self.valid = dict(state["replay"]), state["valid"]
        if "weights" in state:
            self.weights = state["weights"]
        else:
            self.weights = torch.ones(self.valid.shape[0])
            if self.valid.shape[0]:
                warnings.warn(
                    f"self-imitation buffer saved without weights (an older version): its "
                    f"{self.valid.shape[0]} rows get weight 1 (imitated without a baseline until "
                    "they leave the buffer)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if self.weights.shape[0] != self.valid.shape[0]:
            raise BadInput(
                f"self-imitation buffer state has {self.weights.shape[0]} weights for "
                f"{self.valid.shape[0]} rows"
            )


def _gather_rows(
    new: dict[str, torch.Tensor],
    valid: torch.Tensor,
    weight: torch.Tensor,
    samples: torch.Tensor,
    num_envs: int,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Every rank's new rows (``samples``: their local sample indices ``t * num_envs + n``), in the
    order a single process stepping all ranks' envs adds them: rank r's envs follow those of the
    ranks before it (contiguous shares), so its env n is env ``offset_r + n`` of the whole batch.
    The ranks' rollouts may differ in length (GRPO collects until the rank's envs are done)."""
    parts = parallel.all_gather((new, valid, weight, samples, num_envs))
    total_envs = sum(part[4] for part in parts)
    keys, offset = [], 0
    for _, _, _, m, n in parts:
        keys.append(torch.div(m, n, rounding_mode="floor") * total_envs + offset + m % n)
        offset += n
    order = torch.argsort(torch.cat(keys), stable=True)
    gathered = {k: torch.cat([part[0][k] for part in parts])[order] for k in new}
    valid, weight = (torch.cat([part[i] for part in parts])[order] for i in (1, 2))
    return gathered, valid, weight


def imitation_nll(
    log_probs: torch.Tensor,
    valid: torch.Tensor,
    weight_sum: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weighted negative log-likelihood ``[B, K, E] -> ()``: ``sum(w_b * -log p)`` over the
    executed sub-steps' elements, divided by their count (``weight_sum``: the count over all
    ranks, see ``masked_mean``), not by the sum of the weights (see the module's docstring).
    ``weights`` ``[B]``: each row's weight (default 1: the mean NLL)."""
    if weights is not None:
        log_probs = log_probs * weights.to(log_probs.dtype)[:, None, None]
    return -masked_mean(log_probs, valid[..., None], weight_sum)
