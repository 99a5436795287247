"""GRPO with the DAPO options: ``algorithm`` holds the math and the update, ``train`` the training
loop with group resets and dynamic sampling, and the command line (``python -m trainers.grpo --help``)."""

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

__all__ = [
    "GRPOConfig",
    "episode_scores",
    "group_advantages",
    "group_seeds",
    "groups_to_resample",
    "grpo_update",
    "keep_groups",
    "make_optimizer",
]
