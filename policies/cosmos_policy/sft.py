"""The Cosmos Policy training recipe's random parts: noise levels, the policy / world-model / value split,
and the per-noise-level loss weight. ``CosmosPolicy.imitation_loss`` puts them together.

Noise levels are EDM sigmas (``x_sigma = x0 + sigma * eps``), the space our sampler works in
(``nets.cosmos_sampler``: rectified-flow preconditioning, ``t = sigma / (1 + sigma)``).

* ``"predict2"`` (Cosmos Policy on Cosmos-Predict2): with probability 0.7 the base model's log-normal,
  ``ln sigma ~ N(ln 4, 1.2^2)``, else ``sigma ~ U[1, 85]`` (the recipe's hybrid distribution, which
  puts more weight on high noise; the log-normal parameters are those of the released LIBERO config).
* ``"predict2.5"``: a logit-normal time ``u = sigmoid(n)``, ``n ~ N(0, 1)``, shifted towards high noise
  with ``t = s u / (1 + (s - 1) u)``, s = 5, where ``t`` is the rectified-flow noise fraction
  (``x_t = (1 - t) x0 + t eps``); as a sigma, ``t / (1 - t)``.

Loss weight ``w(sigma)``: ``"rf"`` (default) ``(1 + sigma)^2 / sigma^2 = 1 / c_out^2`` of the
rectified-flow preconditioning, so ``w (D - x0)^2`` equals the velocity error ``(F - (eps - x0))^2``
(Predict2.5's uniform-weight flow-matching loss, and Predict2's RF-scaled EDM loss); ``"edm"``
``(sigma^2 + 1) / sigma^2``, the EDM weight with sigma_data = 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nets.errors import BadInput

MODES = ("policy", "world_model", "value")
SPLIT = (0.5, 0.25, 0.25)  # the recipe's batch split between MODES
LOGNORMAL_MEAN, LOGNORMAL_STD = math.log(4.0), 1.2  # Predict2 base model (LIBERO config): median sigma 4
UNIFORM_FRACTION, UNIFORM_LOW, UNIFORM_HIGH = 0.3, 1.0, 85.0
LOGIT_NORMAL_SHIFT = 5.0
NOISE_KINDS = ("predict2", "predict2.5")
WEIGHTINGS = ("rf", "edm")


def sample_sigma_predict2(
    n: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    *,
    uniform_fraction: float = UNIFORM_FRACTION,
    p_mean: float = LOGNORMAL_MEAN,
    p_std: float = LOGNORMAL_STD,
    low: float = UNIFORM_LOW,
    high: float = UNIFORM_HIGH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sigmas (float32) of the hybrid distribution and which came from the uniform branch
    (bool ``[n]``)."""
    uniform = torch.rand(n, generator=generator, device=device) < uniform_fraction
    normal = torch.randn(n, generator=generator, device=device, dtype=torch.float64)
    box = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
    sigma = torch.where(uniform, low + (high - low) * box, torch.exp(p_mean + p_std * normal))
    return sigma.float(), uniform


def sample_sigma_predict2p5(
    n: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    *,
    shift: float = LOGIT_NORMAL_SHIFT,
) -> torch.Tensor:
    """``n`` sigmas (float32) from shifted logit-normal rectified-flow times (t kept below 1 - 1e-6)."""
    u = torch.sigmoid(torch.randn(n, generator=generator, device=device, dtype=torch.float64))
    t = (shift * u / (1 + (shift - 1) * u)).clamp(max=1 - 1e-6)
    return (t / (1 - t)).float()


def sample_sigma(
    kind: str, n: int, generator: torch.Generator | None, device: torch.device | str
) -> torch.Tensor:
    if kind == "predict2":
        return sample_sigma_predict2(n, generator, device)[0]
    if kind == "predict2.5":
        return sample_sigma_predict2p5(n, generator, device)
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


def loss_weight(sigma: torch.Tensor, weighting: str = "rf") -> torch.Tensor:
    """Per-sample weight of the squared x0 error at noise level ``sigma``."""
    if weighting == "rf":
        return (1 + sigma) ** 2 / sigma**2
    if weighting == "edm":
        return (sigma**2 + 1) / sigma**2
    raise BadInput(f"loss weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def check_split(split: Sequence[float]) -> tuple[float, float, float]:
    values = tuple(float(p) for p in split)
    if len(values) != 3 or any(p < 0 or not math.isfinite(p) for p in values) or values[0] <= 0:
        raise BadInput(
            f"sft_split gives the (policy, world_model, value) fractions: three finite numbers >= 0 with a "
            f"positive policy share, got {tuple(split)}"
        )
    total = sum(values)
    return tuple(p / total for p in values)  # type: ignore[return-value]
