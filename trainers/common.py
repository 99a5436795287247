"""Pieces PPO and GRPO share: log-prob levels, the clipped surrogate, masked means, minibatches,
and the guard that skips non-finite updates.

Shapes: M samples (chunk-steps), K sub-steps per chunk, E log-prob elements per sub-step.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Literal

import torch

LogProbLevel = Literal["element", "step", "chunk"]
LOG_PROB_LEVELS = ("element", "step", "chunk")
MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps a wild ratio finite; never reached in a healthy run


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` (broadcast to ``x``) is true or weighted."""
    w = mask.to(x.dtype).expand_as(x)
    return (x * w).sum() / w.sum().clamp_min(1e-12)


def to_level(
    elem: torch.Tensor, valid: torch.Tensor, level: LogProbLevel
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce element values ``[M, K, E]`` (log-probs, entropies) to ``level``, keeping three dims.

    Returns ``(x, mask)``: element ``[M, K, E]``, step ``[M, K, 1]`` (sum over E) or chunk ``[M, 1, 1]``
    (sum over the executed sub-steps and E), and the matching mask (``valid`` ``[M, K]`` or, for
    chunk, "any sub-step executed"). Sub-steps that were not executed never count: their actions
    did not reach the env.
    """
    v = valid[..., None]
    if level == "element":
        return elem, v
    if level == "step":
        return elem.sum(-1, keepdim=True), v
    if level == "chunk":
        return (elem * v).sum((-1, -2), keepdim=True), valid.any(-1)[:, None, None]
    raise ValueError(f"log_prob_level must be one of {LOG_PROB_LEVELS}, got {level!r}")


def loss_grid_mask(valid: torch.Tensor, level: LogProbLevel, adv_width: int) -> torch.Tensor:
    """Mask of the grid on which per-sample losses live: ratio ``[M, a, b]`` x advantages ``[M, U, 1]``.

    A chunk-level ratio against one advantage per chunk (U = 1) gives one loss per chunk; every
    other combination gives one loss per executed sub-step (and element).
    """
    if level == "chunk" and adv_width == 1:
        return valid.any(-1)[:, None, None]
    return valid[..., None]


def clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped objective, per element, as a loss: ``max(-A r, -A clip(r, 1-lo, 1+hi))``.

    With ``dual_clip = c`` (> 1) the loss of negative-advantage elements is capped at ``c |A|``.
    Returns ``(loss, clipped_active)``: the loss broadcast over ``log_ratio`` and ``advantages``, and
    where the clipped branch (or the dual cap) is the one in force.
    """
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    active = clipped > unclipped
    if dual_clip is not None:
        cap = -dual_clip * advantages  # = c |A| where A < 0
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        active = active | capped
    return loss, active


def ratio_stats(
    log_ratio: torch.Tensor, mask: torch.Tensor, clip_low: float, clip_high: float
) -> dict[str, torch.Tensor]:
    """Diagnostics of a batch of log-ratios at their level (0-dim tensors): mean ratio, approx KL
    (k3 as SB3 and CleanRL, k1 as RLinf) and clip fraction (ratio outside the clip range, as SB3)."""
    with torch.no_grad():
        lr = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        r = torch.exp(lr)
        outside = ((r < 1.0 - clip_low) | (r > 1.0 + clip_high)).to(r.dtype)
        return {
            "ratio": masked_mean(r, mask),
            "approx_kl": masked_mean((r - 1.0) - lr, mask),
            "approx_kl_k1": masked_mean(-lr, mask),
            "clip_fraction": masked_mean(outside, mask),
        }


def normalize(x: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the masked entries (unbiased std, as ``torch.std``)."""
    m = mask.to(x.dtype).expand_as(x)
    n = m.sum()
    if n < 2:
        return x
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / (n - 1)
    return (x - mean) / (var.sqrt() + eps)


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(target - pred) / Var(target)`` over the masked entries (nan when Var(target) = 0)."""
    m = mask.expand_as(target)
    t, p = target[m].double(), pred[m].double()
    if t.numel() < 2:
        return math.nan
    var = t.var()
    return math.nan if var == 0 else float(1.0 - (t - p).var() / var)


def flatten_time(x: torch.Tensor) -> torch.Tensor:
    """``[T, N, ...] -> [T * N, ...]`` (sample m = t * N + n)."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def minibatches(
    num_samples: int, batch_size: int | None, generator: torch.Generator | None
) -> Iterator[torch.Tensor]:
    """Shuffled index batches covering ``range(num_samples)`` once; the last one may be smaller."""
    perm = torch.randperm(num_samples, generator=generator)
    size = num_samples if batch_size is None else batch_size
    for start in range(0, num_samples, size):
        yield perm[start : start + size]


def fused_ok(params: list[torch.Tensor]) -> bool | None:
    """Whether torch's fused Adam/AdamW kernel takes these parameters (float, CPU or CUDA);
    None lets torch choose."""
    if not params:
        return None
    return (
        all(
            p.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
            and p.device.type in ("cpu", "cuda")
            for p in params
        )
        or None
    )


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


class BadUpdateGuard:
    """Skips an update whose loss or gradient norm is NaN/inf, with a warning; raises after
    ``max_in_a_row`` skips in a row (a run that only produces NaNs should stop, not crawl on).

    Keep one guard for a whole training run so the count carries across rollouts.
    """

    def __init__(self, max_in_a_row: int = 10) -> None:
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0
        self.total = 0

    def ok(self, loss: torch.Tensor, grad_norm: torch.Tensor | None = None) -> bool:
        """True if the update may go ahead; counts (and maybe raises) otherwise. One host sync."""
        values = loss.detach().reshape(1)
        if grad_norm is not None:
            values = torch.cat([values, grad_norm.detach().reshape(1).to(values.dtype)])
        if bool(torch.isfinite(values).all()):
            self.in_a_row = 0
            return True
        bad_loss = not bool(torch.isfinite(loss.detach()))
        what = f"loss {loss.item()}" if bad_loss else f"gradient norm {float(grad_norm)}"
        self.in_a_row += 1
        self.total += 1
        if self.in_a_row >= self.max_in_a_row:
            raise RuntimeError(
                f"{self.in_a_row} updates in a row had a non-finite {what.split()[0]} (last: {what}); "
                "stopping. Lower the learning rate, check the rewards and the policy's log-probs."
            )
        warnings.warn(
            f"skipping a minibatch update: non-finite {what} ({self.in_a_row} in a row)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False


def step_optimizer(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float | None,
    guard: BadUpdateGuard,
) -> tuple[bool, torch.Tensor]:
    """Backward, clip gradients, step; skip (and zero the gradients) if the loss or the gradient
    norm is not finite. Returns ``(stepped, grad_norm)`` (the norm as a 0-dim tensor, so that
    callers can average it without a host sync per minibatch)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in optimizer_params(optimizer) if p.grad is not None]
    if not params:
        return False, torch.zeros(())
    norm = torch.nn.utils.clip_grad_norm_(params, math.inf if max_grad_norm is None else max_grad_norm)
    if not guard.ok(loss, norm):
        optimizer.zero_grad(set_to_none=True)
        return False, norm.detach()
    optimizer.step()
    return True, norm.detach()
