"""Cosmos training noise levels and the per-level loss weight (pure math, shared by the Cosmos Policy's
SFT and the Cosmos world model's action-conditioned post-training).

Noise levels are EDM sigmas (``x_sigma = x0 + sigma * eps``), the space the sampler works in
(``nets.cosmos_sampler``: rectified-flow preconditioning, ``t = sigma / (1 + sigma)``).

* ``sample_sigma_logit_normal``: a logit-normal rectified-flow time ``u = sigmoid(n)``, ``n ~ N(0, 1)``,
  shifted towards high noise with ``t = s u / (1 + (s - 1) u)``; as a sigma ``t / (1 - t) = s exp(n)``,
  a log-normal of median ``s``. Predict2.5 uses ``s = 5``; the Predict2 action-conditioned world
  model ``s = 2``.
* ``sample_sigma_predict2`` (the Cosmos Policy recipe on Cosmos-Predict2): with probability 0.7 the base
  model's log-normal, ``ln sigma ~ N(ln 4, 1.2^2)``, else ``sigma ~ U[1, 85]``.

Loss weight ``w(sigma)``: ``"rf"`` (default) ``(1 + sigma)^2 / sigma^2 = 1 / c_out^2`` of the
rectified-flow preconditioning, so ``w (D - x0)^2`` equals the velocity error ``(F - (eps - x0))^2``
(Predict2.5's uniform-weight flow-matching loss, and Predict2's RF-scaled EDM loss); ``"edm"``
``(sigma^2 + 1) / sigma^2``, the EDM weight with sigma_data = 1.
"""

from __future__ import annotations

import math

import torch

from nets.errors import BadInput

LOGNORMAL_MEAN, LOGNORMAL_STD = math.log(4.0), 1.2  # Predict2 base model (LIBERO config): median sigma 4
UNIFORM_FRACTION, UNIFORM_LOW, UNIFORM_HIGH = 0.3, 1.0, 85.0
LOGIT_NORMAL_SHIFT = 5.0  # Predict2.5
PREDICT2_WORLD_MODEL_SHIFT = 2.0  # Predict2's action-conditioned post-training
WEIGHTINGS = ("rf", "edm")


def sample_sigma_logit_normal(
    n: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    *,
    shift: float = LOGIT_NORMAL_SHIFT,
) -> torch.Tensor:
    """``n`` sigmas (float32) from shifted logit-normal rectified-flow times (t kept below 1 - 1e-6):
    ``shift * exp(N(0, 1))``, median ``shift``."""
    u = torch.sigmoid(torch.randn(n, generator=generator, device=device, dtype=torch.float64))
    t = (shift * u / (1 + (shift - 1) * u)).clamp(max=1 - 1e-6)
    return (t / (1 - t)).float()


def logit_normal_quantiles(n: int, shift: float = LOGIT_NORMAL_SHIFT) -> torch.Tensor:
    """``n`` evenly spaced quantiles (float32) of ``shift * exp(N(0, 1))``: fixed levels spread like the
    training draws (held-out measurements)."""
    p = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    return (shift * torch.exp(torch.special.ndtri(p))).float()


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
    """``n`` sigmas (float32) of the Cosmos Policy's hybrid distribution and which came from the uniform
    branch (bool ``[n]``)."""
    uniform = torch.rand(n, generator=generator, device=device) < uniform_fraction
    normal = torch.randn(n, generator=generator, device=device, dtype=torch.float64)
    box = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
    sigma = torch.where(uniform, low + (high - low) * box, torch.exp(p_mean + p_std * normal))
    return sigma.float(), uniform


def loss_weight(sigma: torch.Tensor, weighting: str = "rf") -> torch.Tensor:
    """Per-sample weight of the squared x0 error at noise level ``sigma``."""
    if weighting == "rf":
        return (1 + sigma) ** 2 / sigma**2
    if weighting == "edm":
        return (sigma**2 + 1) / sigma**2
    raise BadInput(f"loss weighting must be one of {WEIGHTINGS}, got {weighting!r}")
