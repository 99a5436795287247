"""GRPO with the DAPO options: ``algorithm`` holds the math and the update, ``starts`` where each
group starts, ``train`` the training loop with dynamic sampling, and the command line
(``python -m trainers.grpo --help``)."""

from trainers.grpo.algorithm import (
    GRPOConfig,
    episode_scores,
    group_advantages,
    group_seeds,
    groups_to_resample,
    grpo_update,
    keep_groups,
    make_optimizer,
)
from trainers.grpo.starts import GroupStarts, group_reset

__all__ = [
    "GRPOConfig",
    "GroupStarts",
    "episode_scores",
    "group_advantages",
    "group_seeds",
    "group_reset",
    "groups_to_resample",
    "grpo_update",
    "keep_groups",
    "make_optimizer",
]
