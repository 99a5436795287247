"""GRPO with the DAPO options: ``algorithm`` holds the math and the update, ``groups`` the group
logic (where each group starts, which groups carry signal, the batch of kept groups), ``train``
the training loop with dynamic sampling, and the command line (``python -m trainers.grpo --help``)."""

from trainers.grpo.algorithm import (
    VARIANTS,
    GRPOConfig,
    episode_scores,
    first_episode_truncated,
    group_advantages,
    grpo_update,
    imitation_weights,
    make_optimizer,
    overlong_penalty,
    shuffle_scores,
)
from trainers.grpo.groups import (
    GroupStarts,
    group_reset,
    group_seeds,
    groups_to_resample,
    keep_groups,
    select_envs,
)

__all__ = [
    "VARIANTS",
    "GRPOConfig",
    "GroupStarts",
    "episode_scores",
    "first_episode_truncated",
    "group_advantages",
    "group_seeds",
    "group_reset",
    "groups_to_resample",
    "grpo_update",
    "imitation_weights",
    "keep_groups",
    "make_optimizer",
    "overlong_penalty",
    "select_envs",
    "shuffle_scores",
]
