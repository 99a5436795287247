"""The success classifier both world-model envs use as their reward (RLinf's ``ResnetRM``).

The network lives in ``nets.resnet_rm`` (shared with ``trainers.reward_model``, which trains one
for a new task); it is re-exported here. ``relative_rewards`` turns its per-frame scores into RLinf's
rewards.
"""

from __future__ import annotations

import torch

from nets.resnet_rm import NUM_KEYS, Residual, ResnetRewardModel

__all__ = ["NUM_KEYS", "Residual", "ResnetRewardModel", "relative_rewards"]


def relative_rewards(
    scores: torch.Tensor, previous: torch.Tensor, coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLinf's relative reward over one chunk: ``r_i = coef * c_i - coef * c_{i-1}``.

    ``scores`` ``[N, K]`` in {0, 1}, ``previous`` ``[N]`` (``coef * c`` of the last frame before the
    chunk, 0 after a reset). Returns ``(rewards [N, K], new previous [N])``; an episode's return
    telescopes to ``coef * c`` of its last frame.
    """
    scaled = coef * scores
    before = torch.cat([previous[:, None], scaled[:, :-1]], dim=1)
    return scaled - before, scaled[:, -1]
