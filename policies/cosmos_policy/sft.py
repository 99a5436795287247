"""The Cosmos Policy training recipe's random parts: noise levels, the policy / world-model / value split,
and the per-noise-level loss weight. ``CosmosPolicy.imitation_loss`` puts them together.

The noise-level samplers and the loss weight are pure math shared with the Cosmos world model's
training, so they live in ``nets.cosmos_noise`` (re-exported here): ``"predict2"`` is the recipe's hybrid
log-normal / uniform distribution, ``"predict2.5"`` Predict2.5's logit-normal times with shift 5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nets.cosmos_noise import (  # noqa: F401  (the recipe's pieces, re-exported)
    WEIGHTINGS,
    loss_weight,
    sample_sigma_logit_normal,
    sample_sigma_predict2,
)
from nets.errors import BadInput

MODES = ("policy", "world_model", "value")
SPLIT = (0.5, 0.25, 0.25)  # the recipe's batch split between MODES
NOISE_KINDS = ("predict2", "predict2.5")


def sample_sigma(
    kind: str, n: int, generator: torch.Generator | None, device: torch.device | str
) -> torch.Tensor:
    if kind == "predict2":
        return sample_sigma_predict2(n, generator, device)[0]
    if kind == "predict2.5":
        return sample_sigma_logit_normal(n, generator, device)  # Predict2.5: shift 5
    raise BadInput(f"noise distribution must be one of {NOISE_KINDS}, got {kind!r}")


def sample_modes(
    n: int,
    split: Sequence[float],
    available: Sequence[bool] = (True, True, True),
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Index into ``MODES`` ``[n]`` (long) per sample: drawn with probabilities ``split``, restricted to
    the ``available`` modes and renormalised."""
    probs = torch.tensor([p if ok else 0.0 for p, ok in zip(split, available)], dtype=torch.float64)
    if float(probs.sum()) <= 0:
        raise BadInput(
            f"no training mode left: split {tuple(split)} over available {dict(zip(MODES, available))}"
        )
    u = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
    edges = (probs.cumsum(0) / probs.sum()).to(u.device)
    return torch.searchsorted(edges, u, right=True).clamp(max=len(MODES) - 1)


def check_split(split: Sequence[float]) -> tuple[float, float, float]:
    values = tuple(float(p) for p in split)
    if len(values) != 3 or any(p < 0 or not math.isfinite(p) for p in values) or values[0] <= 0:
        raise BadInput(
            f"sft_split gives the (policy, world_model, value) fractions: three finite numbers >= 0 with a "
            f"positive policy share, got {tuple(split)}"
        )
    total = sum(values)
    return tuple(p / total for p in values)  # type: ignore[return-value]
