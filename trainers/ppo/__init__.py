"""PPO: ``algorithm`` holds the math and the update, ``train`` the training loop and command line
(``python -m trainers.ppo --help``)."""

from trainers.ppo.algorithm import (
    PPOConfig,
    compute_advantages,
    gae,
    make_optimizer,
    policy_loss,
    ppo_update,
    value_loss,
)

__all__ = [
    "PPOConfig",
    "compute_advantages",
    "gae",
    "make_optimizer",
    "policy_loss",
    "ppo_update",
    "value_loss",
]
