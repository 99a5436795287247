"""The success value behind self-imitation's ``value_weighting`` (Oh et al., 2018).

Oh et al.'s self-imitation imitates an action in proportion to ``max(R - V(s), 0)``: by how much
its episode's return beat what the policy usually gets from that state. With success as the only
reward, R is 1 on a successful episode and 0 on a failed one, so failures get no weight and a
successful chunk-step gets ``1 - V(s)``, where ``V(s)`` is the chance that the policy succeeds from
``s``. Steps the policy would have taken anyway (easy tasks, easy starts, the end of a grasp that
already holds) weigh little; the steps of successes from states where it usually fails weigh most.

``SuccessValue`` learns ``V`` by binary cross-entropy on the chunk-steps of every ended episode
(labelled by whether it joined the successes) and gives each kept success its weight. Its torso
starts as a copy of the policy's (the same observation encoding and features), trained apart.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from nets.errors import BadInput
from trainers.bc import batch_obs
from trainers.optim import BadUpdateGuard, step_optimizer
from trainers.sil.algorithm import ChunkRows, concat_obs

WEIGHT_BATCH = 4096  # rows per forward pass when weighing the whole success buffer


class SuccessValue(nn.Module):
    """``V(s)`` = P(success | s) under the current policy: the policy's torso (copied) and a linear head."""

    def __init__(self, policy: nn.Module, learning_rate: float) -> None:
        super().__init__()
        torso = getattr(policy, "torso", None)
        if not isinstance(torso, nn.Module) or not callable(getattr(torso, "prepare", None)):
            raise BadInput(
                f"sil value_weighting learns V(s) on the policy's torso (a small policy's observation "
                f"encoder); {type(policy).__name__} has none"
            )
        self.torso = copy.deepcopy(torso)
        self.head = nn.Linear(self.torso.out_dim, 1)
        nn.init.zeros_(self.head.weight)  # V = 0.5 everywhere at first: every success weighs the same
        nn.init.zeros_(self.head.bias)
        self.to(torso.device)
        self.optimizer = torch.optim.Adam(self.parameters(), lr=learning_rate)

    def forward(self, obs: Any) -> torch.Tensor:
        """Success logits ``[B]`` of a batch of observations."""
        return self.head(self.torso(self.torso.prepare(obs))).squeeze(-1)

    def update(
        self,
        successes: ChunkRows,
        failures: ChunkRows,
        batch_size: int,
        rng: np.random.Generator,
        guard: BadUpdateGuard,
    ) -> torch.Tensor:
        """One cross-entropy step on ``batch_size`` chunk-steps drawn uniformly from both buffers
        (so V estimates the success rate of the episodes as they come); returns the loss."""
        n_s = len(successes)
        idx = rng.integers(n_s + len(failures), size=batch_size)
        parts, labels = [], []
        for rows, picked, label in ((successes, idx[idx < n_s], 1.0), (failures, idx[idx >= n_s] - n_s, 0.0)):
            if len(picked):
                parts.append(batch_obs(rows.data["obs"], picked))
                labels.append(torch.full((len(picked),), label))
        logits = self(concat_obs(parts))
        loss = nn.functional.binary_cross_entropy_with_logits(logits, torch.cat(labels).to(logits))
        step_optimizer(loss, self.optimizer, 1.0, guard)
        return loss.detach()

    @torch.no_grad()
    def weights(self, successes: ChunkRows) -> np.ndarray:
        """Each kept success's weight ``1 - V(s)`` (float64 ``[len(successes)]``)."""
        out = []
        for start in range(0, len(successes), WEIGHT_BATCH):
            idx = np.arange(start, min(start + WEIGHT_BATCH, len(successes)))
            out.append(torch.sigmoid(-self(batch_obs(successes.data["obs"], idx))).double().cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"net": self.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
