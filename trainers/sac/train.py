"""The SAC training loop and its command line.

    python -m trainers.sac --env Pendulum-v1 --total-steps 20000 --num-envs 1
    python -m trainers.sac --env Pendulum-v1 --policy dsrl --init-policy runs/bc-flow   # DSRL

Each vector step of the envs goes into the replay buffer (as n-step chunk transitions,
``trainers/sac/replay.py``); once it holds ``learning_starts`` transitions, every vector step is
followed by ``gradient_steps`` SAC updates (``trainers/sac/algorithm.py``), each on a batch of which
``prior_ratio`` comes from the prior data when there is some (``trainers/sac/prior.py``). An
iteration is ``steps_per_iteration`` vector steps: a metrics row, and evaluation and checkpoints
when due. A checkpoint holds the actor, critics, targets, temperature, optimizer, random streams and
the replay buffer; on resume the envs start new episodes (as PPO's do). One process only: torchrun
with several ranks is refused.

``--loop async``: an actor process steps the envs while this process (the learner) updates; the
transitions come through a queue and the weights go back every ``weight_sync_every`` updates
(``trainers/actors/``, ``trainers/sac/actors.py``). The run keeps ``gradient_steps`` updates per
vector step and records each transition's policy lag; its checkpoints resume it (buffer, learner,
counters), but the order in which data and updates meet depends on timing, so an async run is not
bit-exact.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

import gymnasium as gym
import numpy as np
import torch

from nets.errors import BadInput
from policies.base import ActionChunkPolicy
from policies.gaussian import SAC_ACTOR
from policies.torso_policy import box_chunk_shape
from trainers.actors import EnvActor, module_weights
from trainers.callbacks import Callback
from trainers.config import parse_cli
from trainers.optim import BadUpdateGuard
from trainers.rollout import Collector
from trainers.run import Run, RunConfig
from trainers.sac.actors import (
    RESUME_SEED_STRIDE,
    SACActorSpec,
    UniformPolicy,
    sac_actor_loop,
    step_transitions,
)
from trainers.sac.algorithm import Learner, SACConfig, make_optimizer, sac_update, shuffle_outcomes
from trainers.sac.prior import load_prior
from trainers.sac.replay import Batch, NStepWriter, ReplayBuffer


def train(
    run_config: RunConfig, config: SACConfig, callbacks: list[Callback] | None = None
) -> dict[str, float]:
    """Train with SAC until ``run_config.total_steps`` env steps; returns the final metrics."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise BadInput("--algo sac runs in one process; start it without torchrun (or --nproc-per-node 1)")
    run = Run("sac", run_config, config, callbacks)
    asynchronous = run_config.loop == "async"
    env = actor = None
    try:
        if asynchronous:  # the envs live in the actor process, which reports their spaces
            actor = EnvActor(run_config, sac_actor_loop, "sac-actor", config.actor_nice)
        else:
            env = run.make_env(autoreset="same_step")
        spaces = actor if asynchronous else env
        space = spaces.single_action_space
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) in (1, 2)):
            raise BadInput(
                f"SAC needs a Box action space of shape (D,) or (K, D); {run_config.env} has {space}"
            )
        shape = box_chunk_shape(space)
        new = run_config.init_policy is None and run_config.resume is None
        gaussian = run_config.policy in ("auto", "gaussian")
        policy = run.make_policy(spaces, **(SAC_ACTOR if new and gaussian else {}), use_critic=False)
        if not callable(getattr(policy, "rsample", None)) or not getattr(policy, "squash", False):
            raise BadInput(
                f"SAC trains a squashed Gaussian actor (a policy with rsample and squash=True); "
                f"got {type(policy).__name__}"
                + ("" if not hasattr(policy, "squash") else " with squash=False")
            )
        sac_space = getattr(policy, "sac_action_space", space)  # DSRL: the critics score the noise
        if sac_space is not space and config.prior_data:
            raise BadInput(
                "DSRL's critics score the noise fed to the frozen policy; prior data holds env actions "
                "(drop --prior-data, or clone the flow policy on the demos with trainers.bc)"
            )
        obs_norm = getattr(policy, "obs_norm", "off")
        critic_norm = obs_norm if config.critic_obs_norm == "actor" else "fixed"
        obs_space = spaces.single_observation_space
        learner = Learner(obs_space, sac_space, config, critic_norm).to(run.device)
        optimizer = make_optimizer(policy, learner, config)
        prior = None
        if config.prior_data:  # read and checked before any env step
            prior = load_prior(config.prior_data, obs_space, shape, config.gamma, config.n_step)
        buffer = ReplayBuffer(obs_space, box_chunk_shape(sac_space), config.buffer_size)
        sampler = torch.Generator().manual_seed(run_config.seed + 1)  # batch rows, critic subsets
        warmup = torch.Generator().manual_seed(run_config.seed + 2)
        extra = run.restore(policy, optimizer, {"sampler": sampler, "warmup": warmup})
        updates = 0
        if extra:
            learner.load_state_dict(extra["learner"])
            buffer.load_state_dict(extra["buffer"])
            updates = int(extra["updates"])
        if prior is not None and updates == 0:  # standardised by the demonstrations' statistics
            prior_obs = {k: v[: len(prior)] for k, v in prior.obs.items() if k not in prior.text}
            if obs_norm == "off" and config.actor_obs_norm == "prior":
                policy.fold_standardisation(prior_obs)  # same function, standardised inputs
                spec = run.checkpoints.spec  # checkpoints rebuild it with the statistics' buffers
                torso_kwargs = {**(spec["kwargs"].get("torso_kwargs") or {}), "obs_norm": "fixed"}
                spec["kwargs"] = {**spec["kwargs"], "torso_kwargs": torso_kwargs}
            elif obs_norm != "off" and policy.obs_stats_count() == 0:
                policy.update_obs_stats(prior_obs)
            if critic_norm != "off" and learner.critic.encoder.obs_stats_count() == 0:
                learner.update_obs_stats(prior_obs)
        target_entropy = config.target_entropy
        if target_entropy is None:  # minus the number of sampled elements per chunk (SB3: -dim(A))
            sampled = policy.chunk_size * policy.log_prob_dim if sac_space is space else sac_space.shape
            target_entropy = -float(np.prod(sampled))
        guard = BadUpdateGuard(config.max_bad_updates)

        online_rows = (
            config.batch_size if prior is None else round(config.batch_size * (1 - config.prior_ratio))
        )
        done = {"updates": updates}  # gradient steps, offline ones included
        offline_steps = config.offline_steps if prior is not None else 0  # (run before the first env step)

        def update(online: int = online_rows) -> dict[str, torch.Tensor]:
            """One gradient step on ``online`` replay rows and the rest of the batch from the prior data."""
            batch = buffer.sample(online, sampler, run.device) if online > 0 else None
            if prior is not None and online < config.batch_size:
                extra_rows = prior.sample(config.batch_size - online, sampler, run.device)
                batch = extra_rows if batch is None else Batch.cat(batch, extra_rows)
            if config.placebo:
                batch = shuffle_outcomes(batch, sampler)
            n = done["updates"]
            update_actor = n >= config.actor_starts and (n - config.actor_starts) % config.actor_every == 0
            done["updates"] += 1
            return sac_update(
                policy, learner, optimizer, batch, config, sampler, guard, target_entropy, update_actor
            )

        def store(rows: list) -> None:
            """Transitions into the buffer (and running observation statistics)."""
            buffer.add(rows)
            if obs_norm == "running" and rows:
                keys = [k for k in rows[0].obs if k not in buffer.text]
                new_obs = {k: np.stack([t.obs[k] for t in rows]) for k in keys}
                policy.update_obs_stats(new_obs)
                if critic_norm == "running":
                    learner.update_obs_stats(new_obs)

        def end_iteration(env_steps: int, episodes: list, steps_metrics: list) -> None:
            metrics = {
                **_mean(steps_metrics),
                "updates": done["updates"],
                "buffer_size": len(buffer),
                # online gradient steps per transition stored (one per env and chunk-step)
                "updates_per_chunk": (done["updates"] - offline_steps) / max(len(buffer), 1),
            }
            if asynchronous and len(buffer):  # over the rows in the buffer (the whole run until it wraps)
                lags = buffer.lags[: len(buffer)]
                metrics.update(policy_lag_mean=float(lags.mean()), policy_lag_max=float(lags.max()))
            run.checkpoints.extra = {
                "learner": learner.state_dict(),
                "buffer": buffer.state_dict(),
                "updates": done["updates"],
            }
            run.end_iteration(env_steps, episodes, {f"train/{k}": v for k, v in metrics.items()})

        if prior is not None and updates == 0 and config.offline_steps > 0:  # prior data alone first
            from tqdm import tqdm

            steps = tqdm(
                range(config.offline_steps), desc="offline pretraining", disable=not run_config.progress
            )
            offline = _mean(update(0) for _ in steps)
            run.log({f"offline/{k}": v for k, v in offline.items()})

        env_seed = run_config.seed + RESUME_SEED_STRIDE * run.counters["iteration"]
        if not asynchronous:  # collect one vector step, then its updates, in turn
            decode = getattr(policy, "decode", None) if sac_space is not space else None
            acting = UniformPolicy(sac_space, warmup, decode) if config.warmup == "uniform" else policy
            collector = Collector(env, acting)
            collector.reset(seed=env_seed)
            writer = NStepWriter(env.num_envs, config.n_step, config.gamma)
            while not run.finished:
                env_steps, episodes, steps_metrics = 0, [], []
                for _ in range(config.steps_per_iteration):
                    collector.policy = policy if len(buffer) >= config.learning_starts else acting
                    rollout = collector.collect(1, record_obs=True)
                    store(step_transitions(rollout, collector.obs, writer))
                    env_steps += int(rollout.valid.sum())
                    episodes += rollout.episodes
                    if len(buffer) >= config.learning_starts:
                        steps_metrics += [update() for _ in range(config.gradient_steps)]
                end_iteration(env_steps, episodes, steps_metrics)
        else:  # the actor process steps the envs; here: store, update, publish the weights
            actor.start(_actor_spec(config, policy, env_seed, buffer), done["updates"])
            weights = functools.partial(module_weights, policy)  # what the actor acts with
            online = 0  # gradient steps done for the vector steps received from this actor
            owed = 0  # gradient steps due for the vector steps received, not done yet
            while not run.finished:
                env_steps, episodes, steps_metrics, received = 0, [], [], 0
                while received < config.steps_per_iteration:
                    message = actor.receive(timeout=0.0 if owed else 0.05)
                    if message is not None:
                        rows, steps, new_episodes = message
                        store(rows)
                        env_steps, episodes = env_steps + steps, episodes + new_episodes
                        received += 1
                        owed += config.gradient_steps if len(buffer) >= config.learning_starts else 0
                    if owed:
                        steps_metrics.append(update())
                        owed, online = owed - 1, online + 1
                        actor.link.updated(weights, done["updates"], online, config.weight_sync_every)
                    else:
                        actor.link.serve(weights, done["updates"])
                end_iteration(env_steps, episodes, steps_metrics)
            actor.close()
        if env is not None:
            env.close()  # frees the simulators before the final evaluation starts its own
        return run.finish()
    finally:
        if actor is not None:
            actor.close()
        if env is not None:
            env.close()
        run.close()  # after an error too: the folder's lock is released


def _actor_spec(
    config: SACConfig, policy: ActionChunkPolicy, seed: int, buffer: ReplayBuffer
) -> SACActorSpec:
    return SACActorSpec(
        policy=policy,
        seed=seed,
        n_step=config.n_step,
        gamma=config.gamma,
        gradient_steps=config.gradient_steps,
        learning_starts=config.learning_starts,
        buffer_capacity=buffer.capacity,
        buffered=len(buffer),
        warmup=config.warmup,
        max_policy_lag=config.max_policy_lag,
        max_actor_lead=config.max_actor_lead,
    )


def _mean(steps: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The mean of each metric over the update steps that have it (one host sync per metric)."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    for metrics in steps:
        for key, value in metrics.items():
            sums[key] = sums[key] + value if key in sums else value
            counts[key] = counts.get(key, 0) + 1
    return {k: float(v) / counts[k] for k, v in sums.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    configs = parse_cli({"run": RunConfig, "sac": SACConfig}, argv, description=__doc__)
    return train(configs["run"], configs["sac"])
