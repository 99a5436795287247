"""RL trainers over any ``gymnasium.vector.VectorEnv`` with an ``ActionChunkPolicy``.

``rollout.Collector`` collects, ``ppo`` and ``grpo`` hold each algorithm's math and update,
``parallel`` runs them data parallel under ``torchrun``.
This package never imports ``envs``.
"""

from trainers.grpo import GRPOConfig, grpo_update
from trainers.optim import BadUpdateGuard
from trainers.ppo import PPOConfig, compute_advantages, ppo_update
from trainers.rollout import Collector, Rollout, episode_summary

__all__ = [
    "BadUpdateGuard",
    "Collector",
    "GRPOConfig",
    "PPOConfig",
    "Rollout",
    "compute_advantages",
    "episode_summary",
    "grpo_update",
    "ppo_update",
]
