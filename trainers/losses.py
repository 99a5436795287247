"""The loss math PPO and GRPO share: log-prob levels, the clipped surrogate and its diagnostics,
masked means and normalization.

Shapes: M samples (chunk-steps), K sub-steps per chunk, E log-prob elements per sub-step.
"""

from __future__ import annotations

import math
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


def policy_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    level: LogProbLevel,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss of a minibatch and its diagnostics (0-dim tensors).

    ``new/old_log_probs`` ``[M, K, E]`` are reduced to ``level``; ``advantages`` ``[M, U]`` (U = 1 or K)
    are broadcast over the ratio's grid; ``valid`` ``[M, K]``; the loss is the mean over valid grid
    entries, each weighted by ``weights[m]`` if given (GRPO's per-trajectory averaging).
    """
    new, mask = to_level(new_log_probs, valid, level)
    old, _ = to_level(old_log_probs, valid, level)
    log_ratio = new - old
    loss, active = clipped_surrogate(log_ratio, advantages[..., None], clip_low, clip_high, dual_clip)
    grid = loss_grid_mask(valid, level, advantages.shape[-1]).to(loss.dtype)
    if weights is not None:
        grid = grid * weights[:, None, None]
    stats = ratio_stats(log_ratio, mask, clip_low, clip_high)
    stats["clip_active"] = masked_mean(active.to(loss.dtype).detach(), grid)
    return masked_mean(loss, grid), stats


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
