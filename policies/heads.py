"""Heads added on top of pretrained VLAs for RL (not part of the public checkpoints)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .torsos import ACTIVATIONS


class ValueHead(nn.Module):
    """RLinf's critic MLP: ``in_dim -> hidden... -> out_dim``, the activation between layers, no
    bias on the last layer. Hidden layers are Kaiming-normal (fan_out, ReLU gain), the output layer
    N(0, 0.02), biases zero. OpenVLA-OFT: hidden (512, 128), GELU; pi0.5: (1024, 512, 256), ReLU."""

    def __init__(
        self,
        in_dim: int,
        hidden: Sequence[int] = (512, 128),
        out_dim: int = 1,
        activation: str = "gelu",
        bias_last: bool = False,
    ):
        super().__init__()
        sizes = [in_dim, *hidden]
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            linear = nn.Linear(n_in, n_out)
            nn.init.kaiming_normal_(linear.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(linear.bias)
            layers += [linear, ACTIVATIONS[activation]()]
        last = nn.Linear(sizes[-1], out_dim, bias=bias_last)
        nn.init.normal_(last.weight, std=0.02)
        if bias_last:
            nn.init.zeros_(last.bias)
        self.mlp = nn.Sequential(*layers, last)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.mlp(features.float())
