"""The self-imitation loop and its command line.

    python -m trainers.sil --env envs:Libero-Spatial-v0 --env-kwargs '{"cameras": [], "task_state": true}' \\
        --init-policy checkpoints/flow_libero_spatial_state.pt \\
        --prior-data data/libero_spatial_expert_train.h5

Each iteration the envs run ``steps_per_iteration`` vector steps with the policy (the weight average
when ``ema_decay`` > 0; sampled actions unless ``deterministic_collect``), autoresetting; every
episode that ends is kept, chunk-step by chunk-step, if it succeeded (the env's ``success``, else
termination), then ``updates_per_iteration`` gradient steps of the imitation loss follow
(``trainers/sil/algorithm.py``). A checkpoint holds the policy (the average), the trained weights,
the optimizer, the random streams and the success buffer; on resume the envs start new episodes (the
unfinished ones are dropped), as SAC's and PPO's do. One process only.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput
from trainers.bc import check_compatible, check_observation_keys
from trainers.callbacks import Callback
from trainers.config import parse_cli
from trainers.env_contract import chunk_size, episode_success
from trainers.optim import EMA_KEY, BadUpdateGuard, restore_ema
from trainers.rollout import RESUME_SEED_STRIDE, Collector, Rollout
from trainers.run import Run, RunConfig
from trainers.sac.replay import obs_row
from trainers.sil.algorithm import SILConfig, SuccessRows, chosen, sil_update


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


class EpisodeRows:
    """Each env's chunk-steps of its unfinished episode; ``close`` hands them over when it ends."""

    def __init__(self, num_envs: int) -> None:
        self.open: list[list[tuple[dict[str, Any], np.ndarray, np.ndarray]]] = [[] for _ in range(num_envs)]

    def push(self, rollout: Rollout) -> list[tuple[list, bool]]:
        """Take one collected vector step; returns ``(rows, success)`` of every episode it ended."""
        ended = []
        stats = {int(ep["env"]): ep for ep in rollout.episodes}
        for i in range(rollout.num_envs):
            valid = rollout.valid[0, i].numpy()
            if valid.any():
                self.open[i].append(
                    (obs_row(rollout.observations[0], i), rollout.actions[0, i].numpy(), valid)
                )
            term = bool(rollout.terminated[0, i])
            if term or bool(rollout.truncated[0, i]):
                ended.append((self.open[i], episode_success(stats.get(i, {}), term)))
                self.open[i] = []
        return ended


def train(
    run_config: RunConfig, config: SILConfig, callbacks: list[Callback] | None = None
) -> dict[str, float]:
    """Train by self-imitation until ``run_config.total_steps`` env steps; returns the final metrics."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise BadInput("--algo sil runs in one process; start it without torchrun (or --nproc-per-node 1)")
    if run_config.loop != "sync":
        raise BadInput(
            f"--algo sil has the sync loop only (--loop async is SAC's), got --loop {run_config.loop}"
        )
    run = Run("sil", run_config, config, callbacks)
    env = None
    try:
        env = run.make_env(autoreset="same_step")
        policy = run.make_policy(env, use_critic=False)
        if not callable(getattr(policy, "imitation_loss", None)):
            raise BadInput(
                f"self-imitation trains a policy's imitation_loss; {type(policy).__name__} has none"
            )
        prior = None
        if config.prior_data:  # read and checked before any env step
            prior = load_prior(config.prior_data, policy, env.single_observation_space, chunk_size(env) or 1)
        optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate)
        sampler = torch.Generator().manual_seed(run_config.seed + 1)  # the placebo's shuffles
        extra = run.restore(policy, optimizer, {"sampler": sampler})
        resumed = run.counters["iteration"] > 0
        ema = restore_ema(policy, config.ema_decay, extra, resumed, sharded=False)
        successes = SuccessRows(config.buffer_size)
        if extra.get("successes") is not None:
            successes.load_state_dict(extra["successes"])
        guard = BadUpdateGuard(config.max_bad_updates)
        collector = Collector(env, policy)
        collector.reset(seed=run_config.seed + RESUME_SEED_STRIDE * run.counters["iteration"])
        episodes_rows = EpisodeRows(env.num_envs)
        if ema is not None:
            ema.swap()  # the average collects (and is evaluated and saved)
        while not run.finished:
            env_steps, episodes, ended = 0, [], []
            for _ in range(config.steps_per_iteration):
                rollout = collector.collect(1, deterministic=config.deterministic_collect, record_obs=True)
                env_steps += int(rollout.valid.sum())
                episodes += rollout.episodes
                ended += episodes_rows.push(rollout)
            flags = chosen([success for _, success in ended], config.placebo, sampler)
            for (rows, _), keep in zip(ended, flags):
                if keep:
                    successes.add(rows)
            if ema is not None:
                ema.swap()  # train the trained weights
            steps = []
            has_data = len(successes) > 0 or prior is not None
            if has_data and len(successes) >= config.learning_starts:
                rng = np.random.default_rng([run_config.seed, run.counters["iteration"]])
                policy.train()
                steps = [
                    sil_update(policy, optimizer, prior, successes, config, rng, guard, ema)
                    for _ in range(config.updates_per_iteration)
                ]
                policy.eval()
            run.checkpoints.extra = {"successes": successes.state_dict()}
            if ema is not None:  # the average is collected with, evaluated and saved as the policy
                ema.swap()
                run.checkpoints.extra[EMA_KEY] = ema.state_dict()
            metrics = (
                {f"train/{k}": float(torch.stack([s[k] for s in steps]).mean()) for k in steps[0]}
                if steps
                else {}
            )
            metrics.update({
                "train/success_rows": len(successes), "train/success_episodes": successes.episodes,
                "train/kept_this_iteration": int(sum(flags)),
            })  # fmt: skip
            run.end_iteration(env_steps, episodes, metrics)
        env.close()
        env = None
        return run.finish()
    finally:
        if env is not None:
            env.close()
        run.close()


def main(argv: list[str] | None = None) -> dict[str, float]:
    configs = parse_cli({"run": RunConfig, "sil": SILConfig}, argv, description=__doc__)
    return train(configs["run"], configs["sil"])
