"""The GRPO training loop and its command line.

    python -m trainers.grpo --env CartPole-v1 --num-envs 32 --group-size 8 --learning-rate 1e-3
    python -m trainers.grpo --env envs:Libero-Spatial-v0 --num-envs 8 --group-size 4 --policy binned

Each iteration is one round (or, with ``resample_rounds``, several) of group rollouts: the envs are
reset so that every group of ``group_size`` consecutive envs starts from the same state, each env
plays one episode (what follows its first done is masked), and ``grpo_update`` trains on
group-normalized episode scores. Where groups start is ``trainers/grpo/groups.py``: a function of
``(seed, iteration, round)`` and of checkpointed counts, so a resumed run repeats exactly what the
uninterrupted run would have done.

Data parallel: ``torchrun --nproc-per-node N -m trainers.grpo ...`` (``trainers/parallel.py``).
Each rank holds whole groups (its envs must split into groups); the starts of a round are drawn
for all ``num_envs`` and rank r takes its groups' share of them, so the ranks' groups start
where the single process's would. Each rank resamples (DAPO) its own groups; the per-task counts
behind ``start_weighting`` are merged over ranks after each iteration. The self-imitation buffer
gathers every rank's successes, so all ranks hold the single process's buffer (and rank 0's
checkpoint the whole of it: ``trainers/self_imitation.py``).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from nets.errors import BadInput
from trainers import parallel
from trainers.callbacks import Callback
from trainers.config import parse_cli
from trainers.grpo.algorithm import (
    GRPOConfig,
    episode_scores,
    grpo_update,
    imitation_weights,
    make_optimizer,
    shuffle_scores,
)
from trainers.grpo.groups import GroupStarts, keep_groups, select_envs
from trainers.optim import BadUpdateGuard
from trainers.rollout import Collector, Rollout, update_running_obs_stats
from trainers.run import Run, RunConfig
from trainers.self_imitation import SuccessBuffer

MAX_ROUND_STEPS = 100_000  # policy steps of one round when rollout_steps = 0 (episodes must end)


def collect_groups(
    collector: Collector, config: GRPOConfig, starts: GroupStarts, iteration: int
) -> tuple[Rollout, int, list[dict[str, float]], dict[str, float]]:
    """One iteration's group rollouts, with DAPO resampling of groups that carry no signal.

    Returns the batch, the env steps executed, every env's first episode of every round, and
    sampling metrics.
    """
    env, G = collector.env, config.group_size
    num_groups = env.num_envs // G
    steps = config.rollout_steps or MAX_ROUND_STEPS
    kept: list[tuple[Rollout, int]] = []  # (round rollout, group index) with signal
    dropped: list[tuple[Rollout, int]] = []
    env_steps, episodes, first_kept = 0, [], float("nan")
    rounds = 0
    while True:
        collector.reset(**starts.reset_kwargs(iteration, rounds))
        rollout = collector.collect(steps, until_all_done=config.rollout_steps == 0)
        env_steps += int(rollout.valid.sum())
        first: dict[int, dict[str, float]] = {}
        for ep in rollout.episodes:
            first.setdefault(int(ep["env"]), ep)
        episodes += list(first.values())
        scores = episode_scores(rollout.rewards, rollout.first_episode)
        keep = keep_groups(scores, G, config.score_low, config.score_high)
        starts.record(keep)
        if rounds == 0:
            first_kept = keep.float().mean().item()
        if not config.dynamic_sampling or config.resample_rounds == 0:
            kept = [(rollout, g) for g in range(num_groups)]
            break
        kept += [(rollout, g) for g in range(num_groups) if keep[g]]
        dropped += [(rollout, g) for g in range(num_groups) if not keep[g]]
        rounds += 1
        if len(kept) >= num_groups or rounds > config.resample_rounds:
            break
    chosen = (kept + dropped)[:num_groups]  # dropped groups fill up; the update masks them
    batch = select_envs([(ro, range(g * G, (g + 1) * G)) for ro, g in chosen])
    metrics = {"rollout/rounds": float(max(rounds, 1)), "rollout/groups_with_signal_first_round": first_kept}
    return batch, env_steps, episodes, metrics


def episode_limit(env: Any) -> int:
    """The env's episode limit in sub-steps: its ``max_episode_steps`` or its spec's."""
    limit = getattr(env, "max_episode_steps", None)
    if not isinstance(limit, int):
        limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
    if not isinstance(limit, int) or limit < 1:
        raise BadInput(
            "overlong 'punish' needs the episode limit: the env states none (max_episode_steps); "
            "give --overlong-max-steps"
        )
    return limit


def train(
    run_config: RunConfig, config: GRPOConfig, callbacks: list[Callback] | None = None
) -> dict[str, float]:
    """Train with GRPO until ``run_config.total_steps`` env steps; returns the final metrics.
    ``callbacks`` (``trainers/callbacks.py``) run after the run's evaluation and checkpointing."""
    if run_config.num_envs % config.group_size:
        raise BadInput(f"num_envs={run_config.num_envs} must be a multiple of group_size={config.group_size}")
    run = Run("grpo", run_config, config, callbacks, group_size=config.group_size)
    env = None
    try:
        env = run.make_env(autoreset="disabled_native")  # finished envs stay frozen where the env allows it
        if config.overlong == "punish" and config.overlong_max_steps is None:
            config = dataclasses.replace(config, overlong_max_steps=episode_limit(env))
        policy = run.make_policy(env, use_critic=False)
        shuffle = torch.Generator().manual_seed(run_config.seed)
        generators = {"shuffle": shuffle}
        ref_policy = None
        if config.kl_beta > 0:  # frozen copy of the initial policy (restored as such on resume)
            ref_policy = copy.deepcopy(policy).requires_grad_(False)
        run.shard(policy)  # fsdp (after the copy, a plain module): before the optimizer
        optimizer = make_optimizer(policy, config)
        starts = GroupStarts(
            env,
            config.group_size,
            run_config.seed,
            config.same_task_iters,
            config.start_weighting,
            shard=(run.rank, run.world_size),
        )
        extra = run.restore(policy, optimizer, generators)
        evaluator = run.data_parallel(policy)  # after restore: DDP starts from rank 0's weights
        if ref_policy is not None:
            ref_policy.load_state_dict(extra.get("ref_policy", ref_policy.state_dict()))
            parallel.broadcast_module(ref_policy)
        if "starts" in extra:
            starts.load_state_dict(extra["starts"])
        sil = SuccessBuffer(config.sil_capacity) if config.sil_coef > 0 else None
        if sil is not None and "sil" in extra:
            sil.load_state_dict(extra["sil"])
        guard = BadUpdateGuard(config.max_bad_updates)
        collector = Collector(env, policy, bootstrap="none", reset_finished=False)

        while not run.finished:
            with run.gathered():  # fsdp: whole parameters for policy.act
                batch, env_steps, episodes, sampling = collect_groups(
                    collector, config, starts, run.counters["iteration"]
                )
            starts.merge_ranks()  # every rank's per-task counts (several ranks)
            if config.placebo:
                batch = shuffle_scores(batch, shuffle)
            if sil is not None:  # episodes that beat their group's mean score (all ranks' rows)
                scores = episode_scores(batch.rewards, batch.first_episode)
                weights = imitation_weights(
                    scores, config.group_size, config.std, config.adv_eps, config.sil_baseline
                )
                sampling["rollout/sil_added"] = float(sil.add(batch, weights > 0, weights))
                sampling["rollout/sil_buffer"] = float(len(sil))
            metrics = grpo_update(
                policy,
                optimizer,
                batch,
                config,
                ref_policy=ref_policy,
                generator=shuffle,
                guard=guard,
                sil=sil,
                evaluator=evaluator,
            )
            update_running_obs_stats(policy, batch)
            run.checkpoints.extra = {"starts": starts.state_dict()}  # checkpointed with the run
            if ref_policy is not None:
                run.checkpoints.extra["ref_policy"] = ref_policy.state_dict()
            if sil is not None:
                run.checkpoints.extra["sil"] = sil.state_dict()
            run.end_iteration(
                env_steps, episodes, {**sampling, **{f"train/{k}": v for k, v in metrics.items()}}
            )
        env.close()  # frees the simulators before the final evaluation starts its own
        return run.finish()
    finally:
        if env is not None:
            env.close()
        run.close()  # after an error too: the folder's lock is released


def main(argv: list[str] | None = None) -> dict[str, float]:
    configs = parse_cli({"run": RunConfig, "grpo": GRPOConfig}, argv, description=__doc__)
    return train(configs["run"], configs["grpo"])
