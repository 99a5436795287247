"""Q ensemble over (observation, action chunk): N critics as one batched MLP.

Every member reads the same encoded observation (one ``make_torso`` encoder without a trunk:
vectors, images, instructions) concatenated with the flattened chunk ``[K * D]`` in normalised
units (``[-1, 1]`` on a bounded Box, as SB3's SAC stores actions). Member ``n``'s MLP is
``Linear -> [LayerNorm] -> act -> ... -> Linear(1)``; the N members' layers are stacked and run
with one ``baddbmm`` per layer, so 10 critics cost about as much as one wide one. Init per member
is ``nn.Linear``'s own (uniform in ``+-1/sqrt(fan_in)``), so at N = 2 each member is SB3's critic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from nets.errors import BadInput
from policies.torsos import ACTIVATIONS, make_torso


class QEnsemble(nn.Module):
    """``forward(obs, actions) -> [N, B]``: each member's Q of the batch.

    Args:
        observation_space: the env's single observation space.
        action_shape: ``(K, D)`` of one chunk.
        n_critics: ensemble members N.
        hidden_sizes: each member's hidden layers.
        activation: a name of ``policies.torsos.ACTIVATIONS``.
        layer_norm: LayerNorm after each hidden Linear (RLPD), with a per-member affine.
        torso_kwargs: extra ``make_torso`` arguments for the observation encoder.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_shape: tuple[int, int],
        n_critics: int = 2,
        hidden_sizes: Sequence[int] = (256, 256),
        activation: str = "relu",
        layer_norm: bool = False,
        torso_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if n_critics < 1:
            raise BadInput(f"n_critics must be >= 1, got {n_critics}")
        if activation not in ACTIVATIONS:
            raise BadInput(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.encoder = make_torso(observation_space, hidden_sizes=(), **(torso_kwargs or {}))
        self.n_critics, self.layer_norm = n_critics, layer_norm
        self.activation = ACTIVATIONS[activation]()
        sizes = [self.encoder.out_dim + int(math.prod(action_shape)), *hidden_sizes, 1]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        self.norm_scales, self.norm_shifts = nn.ParameterList(), nn.ParameterList()
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(n_in)
            self.weights.append(nn.Parameter(torch.empty(n_critics, n_in, n_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n_critics, 1, n_out).uniform_(-bound, bound)))
        if layer_norm:
            for n_out in hidden_sizes:
                self.norm_scales.append(nn.Parameter(torch.ones(n_critics, 1, n_out)))
                self.norm_shifts.append(nn.Parameter(torch.zeros(n_critics, 1, n_out)))

    def forward(self, obs: Any, actions: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, B]``, or ``[len(members), B]`` for those members only (a REDQ target's subset)."""
        x = torch.cat([self.encoder(obs), actions.reshape(actions.shape[0], -1)], dim=-1)

        def pick(p: torch.Tensor) -> torch.Tensor:
            return p if members is None else p[members]

        n = self.n_critics if members is None else len(members)
        h = x.unsqueeze(0).expand(n, *x.shape)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(pick(b), h, pick(w))
            if i < last:
                if self.layer_norm:
                    scale, shift = pick(self.norm_scales[i]), pick(self.norm_shifts[i])
                    h = nn.functional.layer_norm(h, h.shape[-1:]) * scale + shift
                h = self.activation(h)
        return h.squeeze(-1)
