"""The env side of self-imitation: each env's chunk-steps until its episode ends, and the acting
loop of the async loop's actor process (``trainers/actors/``).

In the async loop (``loop="async"``) the actor process runs ``sil_actor_loop`` with the weight
average (or the trained weights when ``ema_decay`` is 0) at most ``max_policy_lag`` learner updates
old, and sends every episode that ends; the learner keeps the successes and updates meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainers.actors.link import STOP, LaggedPolicy
from trainers.actors.process import ActorSpec, Send
from trainers.curriculum import TaskCurriculum
from trainers.env_contract import episode_success, start_options
from trainers.restarts import FailureRestarts, uniform_frames
from trainers.rollout import Collector, Rollout
from trainers.sac.replay import obs_row
from trainers.sil.algorithm import SILConfig

Row = tuple[dict[str, Any], np.ndarray, np.ndarray, int]
"""One chunk-step: ``(obs_row, action [K, D], valid [K], policy lag)``."""


class EpisodeRows:
    """Each env's chunk-steps of its unfinished episode; ``push`` hands them over when it ends."""

    def __init__(self, num_envs: int) -> None:
        self.open: list[list[Row]] = [[] for _ in range(num_envs)]

    def push(self, rollout: Rollout, lag: int = 0) -> list[tuple[list[Row], bool]]:
        """Take one collected vector step (its chunks chosen ``lag`` learner updates late); returns
        ``(rows, success)`` of every episode it ended."""
        ended = []
        stats = {int(ep["env"]): ep for ep in rollout.episodes}
        for i in range(rollout.num_envs):
            valid = rollout.valid[0, i].numpy()
            if valid.any():
                self.open[i].append(
                    (obs_row(rollout.observations[0], i), rollout.actions[0, i].numpy(), valid, lag)
                )
            term = bool(rollout.terminated[0, i])
            if term or bool(rollout.truncated[0, i]):
                ended.append((self.open[i], episode_success(stats.get(i, {}), term)))
                self.open[i] = []
        return ended


@dataclass
class SILActorSpec(ActorSpec):
    """What self-imitation's acting loop needs beside the policy (picklable)."""

    sil: SILConfig  # how to collect (deterministic_collect) and where to restart (failure_restarts...)
    keep_failures: bool  # the placebo chooses among every ended episode: send their rows too
    curriculum: TaskCurriculum | None = None  # task_curriculum: the learner's, copied; draws the starts here


RESTART_STREAM = 7  # the failure restarts' random stream: [seed, RESTART_STREAM]


def start_draw(
    env: Any, curriculum: TaskCurriculum | None, config: SILConfig, seed: int
) -> tuple[Callable[[int], list] | None, FailureRestarts | None]:
    """Where finished envs restart (None: the env draws): the curriculum's draw, with
    ``config.failure_restarts`` of them in failed episodes' states (``restart_pool``,
    ``restart_depth``); and the restarts' pool to ``observe``."""
    draw = curriculum.draw if curriculum is not None else None
    if not config.failure_restarts:
        return draw, None
    base = draw or uniform_frames(len(env.initial_frames), seed)
    restarts = FailureRestarts(
        config.failure_restarts, config.restart_pool, env.num_envs, base, seed=[seed, RESTART_STREAM],
        depth=config.restart_depth,
    )  # fmt: skip
    return restarts.draw, restarts


def sil_actor_loop(spec: SILActorSpec, env: Any, lagged: LaggedPolicy, counters: Any, send: Send) -> None:
    """The actor process's loop: ``send(ended episodes, env steps, episodes' stats)`` per vector step;
    a failed episode's rows are left out (empty) unless ``keep_failures``."""
    curriculum = spec.curriculum
    if curriculum is not None:  # a stream of its own each (re)start, as the envs' seed
        curriculum.reseed(spec.seed)
    draw, restarts = start_draw(env, curriculum, spec.sil, spec.seed)
    collector = Collector(env, lagged, start_frames=draw)
    collector.reset(seed=spec.seed, options=start_options(draw(env.num_envs)) if draw else None)
    rows = EpisodeRows(env.num_envs)
    observe = restarts.observe if restarts is not None else None
    while not counters[STOP]:
        rollout = collector.collect(
            1, deterministic=spec.sil.deterministic_collect, record_obs=True, on_step=observe
        )
        ended = rows.push(rollout, lagged.last_lag)
        if curriculum is not None:
            curriculum.record(rollout.episodes)
        if not spec.keep_failures:
            ended = [(chunks if success else [], success) for chunks, success in ended]
        send(ended, int(rollout.valid.sum()), rollout.episodes)
