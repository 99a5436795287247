"""The PPO training loop and its command line.

    python -m trainers.ppo --env CartPole-v1 --total-steps 100000
    python -m trainers.ppo --env envs:Libero-Spatial-v0 --num-envs 4 --time-unit chunk
    python -m trainers.ppo --resume runs/ppo-CartPole-v1-s0-...   # continue a run

Each iteration collects ``n_steps`` policy steps from every env (episodes continue across
iterations), then runs ``ppo_update``. On resume the model, optimizer, RNGs and counters are
restored exactly; the envs start new episodes (an env's internal state is not checkpointed), seeded
from the iteration so that a resumed run is itself reproducible.

Data parallel: ``torchrun --nproc-per-node N -m trainers.ppo ...`` (``trainers/parallel.py``).
Rank r steps envs ``r * n .. (r + 1) * n - 1`` of the ``num_envs`` (n = num_envs / N) and seeds
them as the single process seeds those envs (``seed + env index``); the update runs through DDP
(or FSDP with ``--data-parallel fsdp``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trainers import parallel
from trainers.callbacks import Callback
from trainers.config import parse_cli
from trainers.optim import BadUpdateGuard
from trainers.ppo.algorithm import PPOConfig, make_optimizer, ppo_update
from trainers.rollout import RESUME_SEED_STRIDE, Collector, update_running_obs_stats
from trainers.run import Run, RunConfig


def train(
    run_config: RunConfig, config: PPOConfig, callbacks: list[Callback] | None = None
) -> dict[str, float]:
    """Train with PPO until ``run_config.total_steps`` env steps; returns the final metrics.
    ``callbacks`` (``trainers/callbacks.py``) run after the run's evaluation and checkpointing."""
    run = Run("ppo", run_config, config, callbacks)
    env = None
    try:
        env = run.make_env(autoreset="same_step")  # SB3's DummyVecEnv behaviour: no lost steps
        policy = run.make_policy(env)
        run.shard(policy)  # fsdp: before the optimizer, which holds the sharded parameters
        optimizer = make_optimizer(policy, config)
        shuffle = torch.Generator().manual_seed(run_config.seed)
        generators = {"shuffle": shuffle}
        run.restore(policy, optimizer, generators)
        evaluator = run.data_parallel(policy)  # after restore: DDP starts from rank 0's weights
        guard = BadUpdateGuard(config.max_bad_updates)
        collector = Collector(env, policy, bootstrap=config.bootstrap)
        first_env = run.rank * env.num_envs  # this rank's first env among all ranks'
        collector.reset(seed=run_config.seed + RESUME_SEED_STRIDE * run.counters["iteration"] + first_env)

        while not run.finished:
            with run.gathered():  # fsdp: whole parameters for policy.act
                rollout = collector.collect(config.n_steps)
            env_steps = int(rollout.valid.sum())  # this rank's
            all_steps = int(parallel.all_reduce_sum(torch.tensor(env_steps)))  # every rank's
            left = max(0.0, 1.0 - (run.counters["env_steps"] + all_steps) / run_config.total_steps)
            step_config = scheduled(config, left)
            for group in optimizer.param_groups:
                group["lr"] = step_config.learning_rate
            actor_on = run.counters["iteration"] >= config.critic_warmup_iters  # after the warm-up
            metrics = ppo_update(
                policy,
                optimizer,
                rollout,
                step_config,
                generator=shuffle,
                guard=guard,
                train_actor=actor_on,
                evaluator=evaluator,
            )
            metrics.update({"learning_rate": step_config.learning_rate, "clip_range": step_config.clip_high})
            update_running_obs_stats(policy, rollout)
            run.end_iteration(env_steps, rollout.episodes, {f"train/{k}": v for k, v in metrics.items()})
        env.close()  # frees the simulators before the final evaluation starts its own
        return run.finish()
    finally:
        if env is not None:
            env.close()
        run.close()  # after an error too: the folder's lock is released


def scheduled(config: PPOConfig, progress_left: float) -> PPOConfig:
    """The config with learning rate and clip range at ``progress_left`` (1 at the start, 0 at the end)."""
    changes: dict[str, Any] = {}
    if config.lr_schedule == "linear":
        changes["learning_rate"] = config.learning_rate * progress_left
    if config.clip_schedule == "linear":
        changes["clip_low"] = config.clip_low * progress_left
        changes["clip_high"] = config.clip_high * progress_left
    return dataclasses.replace(config, **changes) if changes else config


def main(argv: list[str] | None = None) -> dict[str, float]:
    configs = parse_cli({"run": RunConfig, "ppo": PPOConfig}, argv, description=__doc__)
    return train(configs["run"], configs["ppo"])
