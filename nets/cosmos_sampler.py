"""Cosmos sampling: Karras sigmas, rectified-flow preconditioning and the "2AB" solver.

The sampler state lives in EDM space, ``x_sigma = x0 + sigma * eps`` with sigma from 80 down to
0.002. The DiT is a rectified-flow model: at ``t = sigma / (1 + sigma)`` its input is
``(1 - t) * x_sigma`` and ``x0 = (1 - t) * x_sigma - t * F``. Conditioned latent frames are replaced
by the clean condition latent (input and output) and get the tiny timestep of ``sigma = 1e-4``.

"2AB" is a second-order Adams-Bashforth step in log-sigma: Euler for the first step, then the
multistep update below, which is DPM-Solver++(2M) (Heun variant) with ``lambda = -log(sigma)``.
A final clean evaluation at ``sigma_min`` gives the sample. Scheduler arithmetic is float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from nets.cosmos_dit import CosmosDiT
from nets.errors import BadInput

SIGMA_MIN = 0.002
SIGMA_MAX = 80.0
SIGMA_CONDITIONAL = 1e-4  # noise level the condition frames are labelled with

X0Fn = Callable[[torch.Tensor, float], torch.Tensor]


def karras_sigmas(
    num_steps: int, sigma_min: float = SIGMA_MIN, sigma_max: float = SIGMA_MAX, rho: float = 7.0
) -> torch.Tensor:
    """``num_steps + 1`` sigmas (float64) from ``sigma_max`` to ``sigma_min``, Karras spacing."""
    if num_steps < 1:
        raise BadInput(f"expected num_steps >= 1, got {num_steps}")
    ramp = torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (hi + ramp * (lo - hi)) ** rho


def rf_x0(
    dit: CosmosDiT,
    x_sigma: torch.Tensor,
    sigma: float | torch.Tensor,
    x0_cond: torch.Tensor,
    cond_mask: torch.Tensor,
    action: torch.Tensor | None,
    context: torch.Tensor | None = None,
    sigma_conditional: float = SIGMA_CONDITIONAL,
) -> torch.Tensor:
    """One denoiser evaluation: the x0 estimate ``[B, C, T, H, W]`` (fp32) at noise level ``sigma``
    (a float for the whole batch, or a ``[B]`` tensor of per-sample levels, as training draws them).

    ``cond_mask [B, T]`` marks latent frames that are replaced by ``x0_cond`` (frame-replace
    conditioning), labelled with the timestep of ``sigma_conditional`` (the Cosmos Policy: 0). The
    DiT runs in its own dtype (inputs and per-frame timesteps are cast to it).
    """
    if isinstance(sigma, torch.Tensor):  # per sample: [B] -> broadcast over [B, C, T, H, W] and [B, T]
        t_b = (sigma / (1.0 + sigma)).to(x_sigma.device, torch.float32)
        t, t_bt = t_b.reshape(-1, 1, 1, 1, 1), t_b[:, None]
    else:
        t = t_bt = sigma / (1.0 + sigma)
    t_cond = sigma_conditional / (1.0 + sigma_conditional)
    mask = cond_mask[:, None, :, None, None].to(x_sigma.dtype)
    net_in = mask * x0_cond + (1 - mask) * ((1 - t) * x_sigma)
    t_frame = cond_mask * t_cond + (1 - cond_mask) * t_bt  # [B, T]
    out = dit(net_in.to(dit.dtype), t_frame.to(dit.dtype), action, context, cond_mask).float()
    x0 = (1 - t) * x_sigma - t * out
    return mask * x0_cond + (1 - mask) * x0


def guided_x0_fn(
    dit: CosmosDiT,
    x0_cond: torch.Tensor,
    cond_mask: torch.Tensor,
    action: torch.Tensor,
    context: torch.Tensor | None = None,
    guidance: float = 7.0,
    evaluate_uncond: bool = False,
) -> X0Fn:
    """The x0 function the sampler calls, with Cosmos' CFG ``x0 = x0_c + g * (x0_c - x0_u)``.

    For this conditioner the unconditional branch gets exactly the same inputs (same zero text, same
    action, same condition frame), so ``x0_u == x0_c`` and CFG is a no-op. ``evaluate_uncond=True``
    still runs that second pass (RLinf's cost: 2 DiT calls per step); otherwise it is skipped.
    """

    def x0_fn(x_sigma: torch.Tensor, sigma: float) -> torch.Tensor:
        x0_c = rf_x0(dit, x_sigma, sigma, x0_cond, cond_mask, action, context)
        if not evaluate_uncond:
            return x0_c
        x0_u = rf_x0(dit, x_sigma, sigma, x0_cond, cond_mask, action, context)
        return x0_c + guidance * (x0_c - x0_u)

    return x0_fn


def step_2ab(
    x: torch.Tensor, x0: torch.Tensor, x0_prev: torch.Tensor | None, sigmas: list[float], i: int
) -> torch.Tensor:
    """One 2AB step from ``sigmas[i]`` to ``sigmas[i + 1]``: Euler in x0 form when there is no
    previous x0 estimate, else the second-order multistep update (the docstring above)."""
    s_prev, s, s_next = (sigmas[i - 1] if i else None), sigmas[i], sigmas[i + 1]
    if x0_prev is None:
        ratio = s_next / s
        return ratio * x + (1 - ratio) * x0
    h = math.log(s / s_next)
    r = math.log(s_prev / s) / h
    phi1 = -math.expm1(-h) / h
    phi2 = (1 - phi1) / h
    return math.exp(-h) * x + h * (phi1 * x0 + (phi2 / r) * (x0 - x0_prev))


def sample_2ab(x0_fn: X0Fn, x_init: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Run the 2AB solver from ``x_init`` (at ``sigmas[0]``) and return the final clean x0 (fp32).

    ``len(sigmas) - 1`` solver steps plus one final evaluation at ``sigmas[-1]``: that is
    ``len(sigmas)`` calls of ``x0_fn(x, sigma)``. The state is kept in float64.
    """
    s = [float(v) for v in sigmas]
    x = x_init.double()
    x0_prev = None
    for i in range(len(s) - 1):
        x0 = x0_fn(x.float(), s[i]).double()
        x = step_2ab(x, x0, x0_prev, s, i)
        x0_prev = x0
    return x0_fn(x.float(), s[-1]).float()
