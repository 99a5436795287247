"""The loss math PPO and GRPO share: log-prob levels, the clipped surrogate and its diagnostics,
masked means and normalization.

Shapes: M samples (chunk-steps), K sub-steps per chunk, E log-prob elements per sub-step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch

from nets.errors import BadInput

LogProbLevel = Literal["element", "step", "chunk"]
LOG_PROB_LEVELS = ("element", "step", "chunk")
MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps a wild ratio finite; never reached in a healthy run


def masked_mean(x: torch.Tensor, mask: torch.Tensor, weight_sum: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` (broadcast to ``x``) is true or weighted.

    ``weight_sum``: divide by this instead of the sum of ``mask``'s weights; in a data-parallel
    update the sum over every rank's minibatch, which makes the result this rank's share of the
    mean over all of them (``trainers/parallel.py``).
    """
    w = mask.to(x.dtype).expand_as(x)
    total = w.sum() if weight_sum is None else weight_sum.to(x.dtype)
    return (x * w).sum() / total.clamp_min(1e-12)


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
    raise BadInput(f"log_prob_level must be one of {LOG_PROB_LEVELS}, got {level!r}")


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
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    weight_sum: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Diagnostics of a batch of log-ratios at their level (0-dim tensors): mean ratio, approx KL
    (k3 as SB3 and CleanRL, k1 as RLinf) and clip fraction (ratio outside the clip range, as SB3).
    ``weight_sum``: as in ``masked_mean``."""
    with torch.no_grad():
        lr = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        r = torch.exp(lr)
        outside = ((r < 1.0 - clip_low) | (r > 1.0 + clip_high)).to(r.dtype)
        return {
            "ratio": masked_mean(r, mask, weight_sum),
            "approx_kl": masked_mean((r - 1.0) - lr, mask, weight_sum),
            "approx_kl_k1": masked_mean(-lr, mask, weight_sum),
            "clip_fraction": masked_mean(outside, mask, weight_sum),
        }


def _policy_masks(
    old_log_probs: torch.Tensor,
    valid: torch.Tensor,
    level: LogProbLevel,
    adv_width: int,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``policy_loss``'s old log-probs at ``level``, the mask of its ratio statistics and the
    (weighted) mask of its loss grid."""
    old, mask = to_level(old_log_probs, valid, level)
    grid = loss_grid_mask(valid, level, adv_width).to(old.dtype)
    if weights is not None:
        grid = grid * weights[:, None, None]
    return old, mask, grid


def policy_loss_weights(
    old_log_probs: torch.Tensor,
    valid: torch.Tensor,
    level: LogProbLevel,
    adv_width: int,
    weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The weight sums ``policy_loss`` divides by, known before the forward pass: ``"grid"`` (the
    loss and ``clip_active``) and ``"level"`` (the ratio statistics; also entropy and KL at the
    same level). Summed over ranks, they make ``policy_loss(..., weight_sums=...)`` each rank's
    share of the loss over every rank's minibatch."""
    old, mask, grid = _policy_masks(old_log_probs, valid, level, adv_width, weights)
    loss_shape = torch.broadcast_shapes(old.shape, (old.shape[0], adv_width, 1))
    return {
        "grid": grid.expand(loss_shape).sum(),
        "level": mask.to(old.dtype).expand_as(old).sum(),
        "chunk": valid.any(-1).to(old.dtype).sum(),
    }


def chunk_kl(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    valid: torch.Tensor,
    weight_sum: torch.Tensor | None = None,
) -> torch.Tensor:
    """The approximate KL (k3) to the collecting policy per chunk-step: of each chunk's joint
    log-ratio (summed over its executed sub-steps and elements), averaged over the chunk-steps.
    What ``target_kl`` is compared with, whatever the loss's level: per element, a 40-element
    chunk's KL would be 40 times what the threshold says. For K = 1 it is SB3's ``approx_kl``."""
    with torch.no_grad():
        new, mask = to_level(new_log_probs, valid, "chunk")
        old, _ = to_level(old_log_probs, valid, "chunk")
        lr = (new - old).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        return masked_mean(torch.exp(lr) - 1.0 - lr, mask, weight_sum)


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
    weight_sums: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss of a minibatch and its diagnostics (0-dim tensors).

    ``new/old_log_probs`` ``[M, K, E]`` are reduced to ``level``; ``advantages`` ``[M, U]`` (U = 1 or K)
    are broadcast over the ratio's grid; ``valid`` ``[M, K]``; the loss is the mean over valid grid
    entries, each weighted by ``weights[m]`` if given (GRPO's per-trajectory averaging).
    ``weight_sums`` (``policy_loss_weights`` summed over ranks) replace the local denominators.
    """
    sums = weight_sums or {}
    new, _ = to_level(new_log_probs, valid, level)
    old, mask, grid = _policy_masks(old_log_probs, valid, level, advantages.shape[-1], weights)
    log_ratio = new - old
    loss, active = clipped_surrogate(log_ratio, advantages[..., None], clip_low, clip_high, dual_clip)
    grid = grid.to(loss.dtype)
    stats = ratio_stats(log_ratio, mask, clip_low, clip_high, sums.get("level"))
    stats["approx_kl_chunk"] = chunk_kl(new_log_probs, old_log_probs, valid, sums.get("chunk"))
    stats["clip_active"] = masked_mean(active.to(loss.dtype).detach(), grid, sums.get("grid"))
    return masked_mean(loss, grid, sums.get("grid")), stats


def normalize(
    x: torch.Tensor,
    mask: torch.Tensor,
    eps: float,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the masked entries (unbiased std, as ``torch.std``).

    ``reduce`` sums its argument over ranks (``trainers.parallel.all_reduce_sum``): mean and
    std are then those of every rank's entries together.
    """
    m = mask.to(x.dtype).expand_as(x)
    n, total = m.sum(), (x * m).sum()
    if reduce is not None:
        n, total = reduce(torch.stack([n, total]))
    if n < 2:
        return x
    mean = total / n
    squares = (((x - mean) * m) ** 2).sum()
    var = (squares if reduce is None else reduce(squares)) / (n - 1)
    return (x - mean) / (var.sqrt() + eps)


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(target - pred) / Var(target)`` over the masked entries (nan when Var(target) = 0)."""
    m = mask.expand_as(target)
    t, p = target[m].double(), pred[m].double()
    if t.numel() < 2:
        return math.nan
    var = t.var()
    return math.nan if var == 0 else float(1.0 - (t - p).var() / var)
