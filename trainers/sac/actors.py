"""The env side of SAC: warm-up actions, the transitions one collected vector step completes, and
the acting loop of the async loop's actor process (``trainers/actors/``).

In the sync loop (``loop="sync"``, ``trainers/sac/train.py``) the learner's own process steps the
envs, then updates, in turn. In the async loop (``loop="async"``) the actor process runs
``sac_actor_loop``; the learner's process owns the replay buffer, the critics and the optimizer:

    actor process:   [snapshot v] act -> env.step -> n-step transitions --queue--> learner process
    learner process: queue -> replay buffer -> gradient_steps updates per vector step -> publish v'

* **Policy lag**: a chunk is chosen with weights at most ``max_policy_lag`` learner updates old;
  each stored transition records the lag of its chunk.
* **Lead**: the actor runs at most ``max_actor_lead`` vector steps ahead of the learner's updates for
  them, so a run keeps ``gradient_steps`` updates per vector step, as the sync loop does, with the
  env step and the updates overlapped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from policies.base import ActionChunk, ActionChunkPolicy
from policies.torso_policy import box_bounds, box_chunk_shape
from trainers.actors.link import ONLINE_UPDATES, STOP, LaggedPolicy
from trainers.actors.process import ActorSpec, Send
from trainers.rollout import RESUME_SEED_STRIDE, Collector, Rollout
from trainers.sac.replay import ChunkStep, NStepWriter, Transition, obs_row


class UniformPolicy(ActionChunkPolicy):
    """Warm-up actions: uniform in SAC's action Box, from their own generator. With ``decode`` (DSRL)
    the uniform sample is the noise, and the env gets ``decode(obs, noise)``."""

    def __init__(
        self,
        action_space: gym.spaces.Box,
        generator: torch.Generator,
        decode: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.low, self.high = box_bounds(action_space)
        self.chunk_size, self.action_dim = box_chunk_shape(action_space)
        self.generator, self.decode = generator, decode

    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        n = len(next(iter(obs.values()))) if isinstance(obs, dict) else len(obs)
        u = self.low + (self.high - self.low) * torch.rand((n, *self.low.shape), generator=self.generator)
        if self.decode is None:
            return ActionChunk(u)
        return ActionChunk(self.decode(obs, u), replay={"sac_action": u})


def step_transitions(rollout: Rollout, next_obs: Any, writer: NStepWriter, lag: int = 0) -> list[Transition]:
    """The transitions one collected vector step completes (``rollout`` holds one step); the action
    stored is the policy's ``replay["sac_action"]`` where it has one (DSRL's noise). ``lag``: the
    learner updates between the weights that chose the chunk and the choice (async loop)."""
    out = []
    obs = rollout.observations[0]
    for i in range(rollout.num_envs):
        valid = rollout.valid[0, i].numpy()
        if not valid.any():  # a NEXT_STEP reset step or a frozen env: nothing was executed
            continue
        term, trunc = bool(rollout.terminated[0, i]), bool(rollout.truncated[0, i])
        ended = term or trunc
        after = obs_row(rollout.final_observations[(0, i)]) if ended else obs_row(next_obs, i)
        action = (rollout.replay["sac_action"] if "sac_action" in rollout.replay else rollout.actions)[0, i]
        step = ChunkStep(obs_row(obs, i), action.numpy(), rollout.rewards[0, i].numpy(), valid, lag)
        out += writer.push(i, step, after, term, trunc)
    return out


@dataclass
class SACActorSpec(ActorSpec):
    """What SAC's acting loop needs beside the policy (picklable)."""

    n_step: int
    gamma: float
    gradient_steps: int
    learning_starts: int
    buffer_capacity: int
    buffered: int  # transitions already in the buffer (a resumed run)
    warmup: str
    max_actor_lead: int


def sac_actor_loop(spec: SACActorSpec, env: Any, lagged: LaggedPolicy, counters: Any, send: Send) -> None:
    """The actor process's loop: the warm-up policy until the buffer holds ``learning_starts`` rows,
    then the lagged policy, at most ``max_actor_lead`` vector steps ahead of the learner's updates
    for them; ``send(transitions, env steps, episodes)`` per vector step."""
    policy = lagged.policy
    sac_space = getattr(policy, "sac_action_space", env.single_action_space)
    decode = getattr(policy, "decode", None) if sac_space is not env.single_action_space else None
    warmup = UniformPolicy(sac_space, torch.Generator().manual_seed(spec.seed + 2), decode)
    collector = Collector(env, warmup if spec.warmup == "uniform" else lagged)
    collector.reset(seed=spec.seed)
    writer = NStepWriter(env.num_envs, spec.n_step, spec.gamma)
    stored, live_steps = spec.buffered, 0  # the buffer's size as the learner will see it
    while not counters[STOP]:
        started = min(stored, spec.buffer_capacity) >= spec.learning_starts
        while started and not counters[STOP]:
            if counters[ONLINE_UPDATES] >= spec.gradient_steps * (live_steps - spec.max_actor_lead):
                break
            time.sleep(0.001)
        if counters[STOP]:
            break
        if started:  # before: the warm-up policy (uniform, or the lagged one itself)
            collector.policy = lagged
        rollout = collector.collect(1, record_obs=True)
        lag = lagged.last_lag if collector.policy is lagged else 0
        rows = step_transitions(rollout, collector.obs, writer, lag)
        stored += len(rows)
        live_steps += min(stored, spec.buffer_capacity) >= spec.learning_starts
        send(rows, int(rollout.valid.sum()), rollout.episodes)


__all__ = ["RESUME_SEED_STRIDE", "SACActorSpec", "UniformPolicy", "sac_actor_loop", "step_transitions"]
