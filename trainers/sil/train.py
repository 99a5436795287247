"""The self-imitation loop and its command line.

    python -m trainers.sil --env envs:Libero-Spatial-v0 --env-kwargs '{"cameras": [], "task_state": true}' \\
        --init-policy checkpoints/flow_libero_spatial_state.pt \\
        --prior-data data/libero_spatial_expert_train.h5

With ``warmup_updates`` the run first imitates the prior data alone for that many updates (after the
evaluation at start, before any env step; within ``max_minutes``). Each iteration the envs run
``steps_per_iteration`` vector steps with the policy (the weight average
when ``ema_decay`` > 0; sampled actions unless ``deterministic_collect``), autoresetting; every
episode that ends is kept, chunk-step by chunk-step, if it succeeded (the env's ``success``, else
termination), then ``updates_per_iteration`` gradient steps of the imitation loss follow
(``trainers/sil/algorithm.py``). A checkpoint holds the policy (the average), the trained weights,
the optimizer, the random streams and the success buffer (and the curriculum's counts with
``task_curriculum``); on resume the envs start new episodes (the
unfinished ones are dropped), as SAC's and PPO's do. One process only. With ``failure_restarts`` a
share of the finished envs continue recent failed episodes from one of their states
(``trainers/restarts.py``; the pool of those states is not checkpointed).

``--loop async``: an actor process steps the envs with the weight average while this process (the
learner) updates (``trainers/actors/``, ``trainers/sil/actors.py``): the ended episodes come through
a queue, and the average goes back every ``weight_sync_every`` updates. An iteration is still
``steps_per_iteration`` vector steps, whose successes join the buffer when the iteration ends (the
placebo shuffles among them as in the sync loop); the learner does up to ``updates_per_iteration``
updates while they are stepped, on the data of the iterations before, so the envs and the updates
overlap. Each kept chunk-step records its policy lag. Its checkpoints resume it (buffer, learner,
counters); how many updates an iteration gets depends on timing, so an async run is not bit-exact.
"""

from __future__ import annotations

import functools
import os
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from nets.errors import BadInput
from trainers.actors import EnvActor, module_weights
from trainers.bc import check_compatible, check_observation_keys
from trainers.callbacks import Callback
from trainers.config import parse_cli
from trainers.curriculum import TaskCurriculum
from trainers.env_contract import chunk_size, frame_tasks, start_options
from trainers.optim import EMA_KEY, BadUpdateGuard, restore_ema
from trainers.rollout import RESUME_SEED_STRIDE, Collector
from trainers.run import Run, RunConfig
from trainers.sil.actors import EpisodeRows, SILActorSpec, sil_actor_loop, start_draw
from trainers.sil.algorithm import ChunkRows, SILConfig, chosen, sil_update
from trainers.sil.value import SuccessValue

WARMUP_STREAM = 1  # spawn key of the warm-up's minibatch stream (iterations use [seed, iteration])


def load_prior(path: str, policy: Any, obs_space: Any, k: int) -> dict[str, Any]:
    """The prior demonstrations as imitation rows (``Demos.chunks``), checked against the policy."""
    from trainers.datasets import load_demos

    demos = load_demos(path)
    if not demos.episodes:
        raise BadInput(f"{path}: no episodes to imitate")
    obs_keys = list(getattr(obs_space, "spaces", {"obs": obs_space}))
    demo_keys = [*demos.episodes[0].obs, "instruction"]
    check_observation_keys(policy, demo_keys, obs_keys, path)
    rows = demos.chunks([key for key in obs_keys if key in demo_keys], k)
    check_compatible(rows, policy, obs_space, path)
    return rows


def train(
    run_config: RunConfig, config: SILConfig, callbacks: list[Callback] | None = None
) -> dict[str, float]:
    """Train by self-imitation until ``run_config.total_steps`` env steps; returns the final metrics."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise BadInput("--algo sil runs in one process; start it without torchrun (or --nproc-per-node 1)")
    # a curriculum and failure restarts restart finished envs themselves, at the starts they draw
    chooser = next((name for name in ("task_curriculum", "failure_restarts") if getattr(config, name)), "")
    autoreset = "disabled" if chooser else "same_step"
    if chooser and run_config.autoreset_mode not in ("auto", "disabled"):
        raise BadInput(
            f"sil {chooser} restarts finished envs itself: autoreset_mode must be 'auto' or "
            f"'disabled', got {run_config.autoreset_mode!r}"
        )
    run = Run("sil", run_config, config, callbacks)
    asynchronous = run_config.loop == "async"
    env = actor = None
    try:
        if asynchronous:  # the envs live in the actor process, which reports their spaces
            actor = EnvActor(run_config, sil_actor_loop, "sil-actor", config.actor_nice, autoreset=autoreset)
        else:
            env = run.make_env(autoreset=autoreset)
        spaces = actor if asynchronous else env
        policy = run.make_policy(spaces, use_critic=False)
        if not callable(getattr(policy, "imitation_loss", None)):
            raise BadInput(
                f"self-imitation trains a policy's imitation_loss; {type(policy).__name__} has none"
            )
        if config.failure_share and not getattr(policy, "outcome_conditioned", False):
            raise BadInput(
                f"sil failure_share {config.failure_share} labels rows by outcome: the policy must be an "
                f'outcome-conditioned flow policy (policy_kwargs {{"outcome_conditioned": true}}), '
                f"got {type(policy).__name__} without it"
            )
        obs_keys = getattr(spaces.single_observation_space, "spaces", {})
        if config.balance_tasks and "instruction" not in obs_keys:
            raise BadInput(
                f"sil balance_tasks tells tasks apart by the 'instruction' observation; the env's are "
                f"{sorted(obs_keys)}"
            )
        prior = None
        if config.prior_data:  # read and checked before any env step
            obs_space = spaces.single_observation_space
            prior = load_prior(config.prior_data, policy, obs_space, chunk_size(spaces) or 1)
        optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate)
        sampler = torch.Generator().manual_seed(run_config.seed + 1)  # the placebo's shuffles
        extra = run.restore(policy, optimizer, {"sampler": sampler})
        resumed = run.counters["iteration"] > 0
        ema = restore_ema(policy, config.ema_decay, extra, resumed, sharded=False)
        successes = ChunkRows(config.buffer_size)
        if extra.get("successes") is not None:
            successes.load_state_dict(extra["successes"])
        keep_failures = bool(config.failure_share or config.value_weighting)
        failures = ChunkRows(config.buffer_size) if keep_failures else None
        if failures is not None and extra.get("failures") is not None:
            failures.load_state_dict(extra["failures"])
        curriculum = None
        if config.task_curriculum:  # async: the actor draws with a copy; this one mirrors it for the logs
            tasks = actor.frame_tasks if asynchronous else frame_tasks(env)
            if tasks is None:
                raise BadInput(
                    "sil task_curriculum draws starts by task: the env's start frames must name their task "
                    "(env.initial_frames[i].task); this env has none"
                )
            curriculum = TaskCurriculum(
                tasks, config.curriculum_floor, config.curriculum_window, run_config.seed
            )
            if extra.get("curriculum") is not None:
                curriculum.load_state_dict(extra["curriculum"])
        value = SuccessValue(policy, config.learning_rate) if config.value_weighting else None
        if value is not None and extra.get("value") is not None:
            value.load_checkpoint_state(extra["value"])
        guard = BadUpdateGuard(config.max_bad_updates)
        value_guard = BadUpdateGuard(config.max_bad_updates)
        done = {"updates": int(extra.get("updates", 0))}
        drawn: dict[str, np.ndarray | None] = {"weights": None}  # value_weighting: the successes' weights

        def can_update() -> bool:
            has_data = len(successes) > 0 or prior is not None
            return has_data and len(successes) >= config.learning_starts

        def update(rng: np.random.Generator) -> dict[str, torch.Tensor]:
            done["updates"] += 1
            out = sil_update(
                policy, optimizer, prior, successes, config, rng, guard, ema, failures, drawn["weights"]
            )
            due = value is not None and done["updates"] % config.value_every == 0
            if due and len(successes) + len(failures):
                out["value_loss"] = value.update(successes, failures, config.batch_size, rng, value_guard)
            return out

        def reweigh() -> None:
            """value_weighting: every kept success's weight 1 - V(s), by the current V."""
            if value is not None:
                drawn["weights"] = value.weights(successes) if len(successes) else None

        def keep(ended: list[tuple[list, bool]]) -> int:
            """The successes among ``ended`` join the buffer (the placebo: as many episodes chosen
            without the reward), the others the failures' when they are kept; returns how many
            episodes joined the successes."""
            flags = chosen([success for _, success in ended], config.placebo, sampler)
            for (rows, _), kept in zip(ended, flags):
                if kept:
                    successes.add(rows)
                elif failures is not None:
                    failures.add(rows)
            return int(sum(flags))

        def end_iteration(env_steps: int, episodes: list, kept: int, steps: list) -> None:
            """Save, evaluate and log (the average, swapped in, is the policy)."""
            run.checkpoints.extra = {"successes": successes.state_dict(), "updates": done["updates"]}
            if failures is not None:
                run.checkpoints.extra["failures"] = failures.state_dict()
            if value is not None:
                run.checkpoints.extra["value"] = value.checkpoint_state()
            if curriculum is not None:
                run.checkpoints.extra["curriculum"] = curriculum.state_dict()
            if ema is not None:  # the trained weights travel beside the average
                run.checkpoints.extra[EMA_KEY] = ema.state_dict()
            policy.eval()
            keys = dict.fromkeys(k for s in steps for k in s)  # value_loss: only in the steps that updated V
            metrics = {f"train/{k}": float(torch.stack([s[k] for s in steps if k in s]).mean()) for k in keys}
            if drawn["weights"] is not None:
                metrics["train/success_weight_mean"] = float(drawn["weights"].mean())
            if curriculum is not None:  # the most and the least practised task's share of the starts
                shares = curriculum.task_weights()
                metrics["train/curriculum_share_max"] = float(shares.max())
                metrics["train/curriculum_share_min"] = float(shares.min())
            if config.failure_restarts:  # restarted episodes start at no start frame (no ``frame``)
                metrics.update(restart_metrics(episodes))
            metrics.update({
                "train/success_rows": len(successes), "train/success_episodes": successes.episodes,
                **({"train/failure_rows": len(failures)} if failures is not None else {}),
                "train/kept_this_iteration": kept, "train/updates": done["updates"],
                # gradient steps per chunk-step kept, the warm-up's aside (over the whole run)
                "train/updates_per_chunk": (done["updates"] - min(done["updates"], config.warmup_updates))
                / max(successes.rows_added, 1),
            })  # fmt: skip
            if asynchronous and len(successes):
                metrics.update({
                    "train/policy_lag_mean": float(successes.lags.mean()),
                    "train/policy_lag_max": float(successes.lags.max()),
                })  # fmt: skip
            run.end_iteration(env_steps, episodes, metrics)

        if not resumed and config.warmup_updates:  # a longer clone first: the prior data alone
            # a stream of its own (an entropy list [seed, 0, 0] would equal iteration 0's [seed, 0])
            rng = np.random.default_rng(np.random.SeedSequence(run_config.seed, spawn_key=(WARMUP_STREAM,)))
            warm_up(policy, config, rng, update, run)
        env_seed = run_config.seed + RESUME_SEED_STRIDE * run.counters["iteration"]
        if ema is not None:
            ema.swap()  # the policy holds the average (it collects, is evaluated and saved) but to train
        if not asynchronous:  # collect, then update, in turn
            draw, restarts = start_draw(env, curriculum, config, env_seed)
            collector = Collector(env, policy, start_frames=draw)
            collector.reset(seed=env_seed, options=start_options(draw(env.num_envs)) if draw else None)
            episodes_rows = EpisodeRows(env.num_envs)
            observe = restarts.observe if restarts is not None else None
            while not run.finished:
                env_steps, episodes, ended = 0, [], []
                for _ in range(config.steps_per_iteration):
                    rollout = collector.collect(
                        1, deterministic=config.deterministic_collect, record_obs=True, on_step=observe
                    )
                    env_steps += int(rollout.valid.sum())
                    episodes += rollout.episodes
                    ended += episodes_rows.push(rollout)
                    if curriculum is not None:
                        curriculum.record(rollout.episodes)
                if ema is not None:
                    ema.swap()  # train the trained weights
                kept = keep(ended)  # the successes of this iteration join before its updates
                reweigh()
                steps = []
                if can_update():
                    rng = np.random.default_rng([run_config.seed, run.counters["iteration"]])
                    policy.train()
                    steps = [update(rng) for _ in range(config.updates_per_iteration)]
                if ema is not None:
                    ema.swap()  # the average again
                end_iteration(env_steps, episodes, kept, steps)
        else:  # the actor process steps the envs; here: keep, update, publish the average
            weights = functools.partial(_acting_weights, policy, ema)
            spec = SILActorSpec(
                policy=policy, seed=env_seed, max_policy_lag=config.max_policy_lag, sil=config,
                keep_failures=config.placebo or keep_failures, curriculum=curriculum,
            )  # fmt: skip
            actor.start(spec, done["updates"], weights())
            while not run.finished:
                env_steps, episodes, ended, steps, received = 0, [], [], [], 0
                rng = np.random.default_rng([run_config.seed, run.counters["iteration"]])
                if ema is not None:
                    ema.swap()  # train the trained weights
                reweigh()  # the successes kept at the end of the iteration before
                policy.train()
                while received < config.steps_per_iteration:
                    busy = can_update() and len(steps) < config.updates_per_iteration
                    message = actor.receive(timeout=0.0 if busy else 0.05)
                    if message is not None:
                        new_ended, new_steps, new_episodes = message
                        ended, env_steps = ended + new_ended, env_steps + new_steps
                        episodes += new_episodes
                        if curriculum is not None:
                            curriculum.record(new_episodes)
                        received += 1
                    if busy:
                        steps.append(update(rng))
                        n = done["updates"]
                        actor.link.updated(weights, n, n, config.weight_sync_every)
                    else:
                        actor.link.serve(weights, done["updates"])
                if ema is not None:
                    ema.swap()  # the average again
                end_iteration(env_steps, episodes, keep(ended), steps)
            actor.close()
        if env is not None:
            env.close()
            env = None
        return run.finish()
    finally:
        if actor is not None:
            actor.close()
        if env is not None:
            env.close()
        run.close()


def restart_metrics(episodes: list[dict[str, float]]) -> dict[str, float]:
    """failure_restarts: the share of the ended episodes that began at a restart, and the success
    of those that began at a start frame and of the restarted ones (NaN where there are none). An
    episode's start frame is known where the env reports ``initial_frame_id`` (ours do); one without
    counts as restarted."""
    restarted = [ep for ep in episodes if "frame" not in ep]
    started = [ep for ep in episodes if "frame" in ep]

    def rate(eps: list[dict[str, float]]) -> float:
        return float(np.mean([ep.get("success", 0.0) for ep in eps])) if eps else float("nan")

    return {
        "train/restart_share": len(restarted) / max(len(episodes), 1),
        "train/success_from_start_frames": rate(started),
        "train/success_from_restarts": rate(restarted),
    }


def warm_up(
    policy: torch.nn.Module,
    config: SILConfig,
    rng: np.random.Generator,
    update: Callable[[np.random.Generator], dict[str, torch.Tensor]],
    run: Run,
) -> None:
    """``config.warmup_updates`` updates before the first env step; with no successes yet each
    minibatch is all prior data, so this is behaviour cloning with the run's optimizer and average."""
    policy.train()
    losses: deque[torch.Tensor] = deque(maxlen=100)  # the last ones, for the logged loss
    bar = tqdm(
        range(config.warmup_updates), desc="warm-up on the prior data", unit="update", mininterval=1.0,
        disable=not run.config.progress,
    )  # fmt: skip
    for _ in bar:
        losses.append(update(rng)["sil_loss"])
    policy.eval()
    tail = float(torch.stack(list(losses)).mean())  # non-finite updates: BadUpdateGuard stops the run
    run.log({"train/warmup_loss": tail, "train/warmup_updates": config.warmup_updates})


def _acting_weights(policy: torch.nn.Module, ema: Any) -> dict[str, torch.Tensor]:
    """What the actor acts with: the weight average when there is one, else the trained weights."""
    if ema is not None:
        return ema.averaged_state(policy)
    return module_weights(policy)


def main(argv: list[str] | None = None) -> dict[str, float]:
    configs = parse_cli({"run": RunConfig, "sil": SILConfig}, argv, description=__doc__)
    return train(configs["run"], configs["sil"])
