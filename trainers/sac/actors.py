"""The env side of SAC: warm-up actions, the transitions one collected vector step completes, and
the asynchronous loop's actor process.

In the sync loop (``loop="sync"``, ``trainers/sac/train.py``) the learner's own process steps the
envs, then updates, in turn. In the async loop (``loop="async"``) an ``EnvActor`` process owns the
envs (local simulator workers, or Ray env actors when ``env_kwargs`` ask for them) and a copy of the
actor network; the learner's process owns the replay buffer, the critics and the optimizer:

    actor process:   [snapshot v] act -> env.step -> n-step transitions --queue--> learner process
    learner process: queue -> replay buffer -> gradient_steps updates per vector step -> publish v'

* **Weights** go back through one shared-memory copy of the policy (``ActorLink``): the learner
  copies its weights into it every ``weight_sync_every`` updates (and at once when the actor waits
  for them); the actor loads the newest copy before it chooses each chunk.
* **Policy lag**: a chunk is chosen with weights at most ``max_policy_lag`` learner updates old
  (the update counter is read under the same lock as the choice, so the bound is exact); each
  stored transition records the lag of its chunk.
* **Lead**: the actor runs at most ``max_actor_lead`` vector steps ahead of the learner's updates for
  them, so a run keeps ``gradient_steps`` updates per vector step, as the sync loop does, with the
  env step and the updates overlapped.

A learner that dies takes the actor with it (``nets.processes.die_with_parent``; its simulator
workers see their pipes close and exit); an actor that dies is an error in the learner, which then
stops. Env workers that die are restarted by the env, as in the sync loop.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import os
import queue as queue_module
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
import torch.multiprocessing as tmp

from nets.processes import die_with_parent, without_main_module
from policies.base import ActionChunk, ActionChunkPolicy
from policies.torso_policy import box_bounds, box_chunk_shape
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


# ---------------------------------------------------------------------- shared between the processes
# slots of ActorLink.counters (int64, guarded by ActorLink.lock)
UPDATES, ONLINE_UPDATES, PUBLISHED, ACTING, WAITING, STOP = range(6)


class ActorLink:
    """What the learner and the actor process share: a shared-memory copy of the policy's weights
    (``snapshot``, set by ``share``), its version (the learner's update count when it was copied)
    and the counters both sides read, under one lock."""

    def __init__(self, ctx: Any) -> None:
        self.lock = ctx.Lock()
        self.counters = ctx.RawArray("q", 6)
        self.snapshot: dict[str, torch.Tensor] | None = None

    # learner side
    def share(self, policy: ActionChunkPolicy, updates: int) -> None:
        """The first snapshot: the policy's weights in shared memory, at version ``updates``."""
        self.snapshot = _weights(policy)
        for tensor in self.snapshot.values():
            tensor.share_memory_()
        with self.lock:
            self.counters[UPDATES] = self.counters[PUBLISHED] = self.counters[ACTING] = updates

    def updated(self, policy: ActionChunkPolicy, updates: int, online: int, sync_every: int) -> None:
        """Count a finished update; publish the weights when ``sync_every`` have passed since the
        last copy, or when the actor waits for newer ones."""
        with self.lock:
            self.counters[UPDATES], self.counters[ONLINE_UPDATES] = updates, online
        if updates - self.counters[PUBLISHED] >= sync_every or self.counters[WAITING]:
            self.publish(policy, updates)

    def serve(self, policy: ActionChunkPolicy, updates: int) -> None:
        """With no update to do: publish the weights if the actor waits for newer ones."""
        if self.counters[WAITING]:
            self.publish(policy, updates)

    def publish(self, policy: ActionChunkPolicy, updates: int) -> None:
        if self.counters[PUBLISHED] == updates:
            return
        weights = _weights(policy)
        with self.lock:
            for key, tensor in self.snapshot.items():
                tensor.copy_(weights[key])
            self.counters[PUBLISHED] = updates

    # actor side
    def refresh(self, policy: ActionChunkPolicy) -> None:
        """Load the newest published weights into ``policy`` (call with ``lock`` held)."""
        if self.counters[PUBLISHED] != self.counters[ACTING]:
            policy.load_state_dict(self.snapshot, strict=False)
            self.counters[ACTING] = self.counters[PUBLISHED]


def _weights(policy: ActionChunkPolicy) -> dict[str, torch.Tensor]:
    """The policy's state that acting reads (parameters and buffers), detached, on the CPU."""
    return {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}


class LaggedPolicy(ActionChunkPolicy):
    """The actor process's policy: before each choice it loads the newest published weights and,
    if they are more than ``max_lag`` updates behind the learner, waits for fresher ones. The
    check and the choice hold the link's lock, so the learner's update count cannot move between
    them; ``last_lag`` is the lag of the last choice."""

    def __init__(self, policy: ActionChunkPolicy, link: ActorLink, max_lag: int) -> None:
        super().__init__()
        self.policy, self.link, self.max_lag = policy, link, max_lag
        self.chunk_size, self.action_dim = policy.chunk_size, policy.action_dim
        self.last_lag = 0

    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        link, counters = self.link, self.link.counters
        while True:
            with link.lock:
                link.refresh(self.policy)
                lag = counters[UPDATES] - counters[ACTING]
                if lag <= self.max_lag or counters[STOP]:
                    counters[WAITING] = 0
                    self.last_lag = lag
                    return self.policy.act(obs, deterministic)
                counters[WAITING] = 1
            time.sleep(0.001)


@dataclass
class ActorSpec:
    """How the actor process acts, once the learner has built the policy (picklable)."""

    policy: ActionChunkPolicy | None  # the learner's policy (a copy without its generator is sent)
    seed: int  # env reset seed and the actor's sampling streams
    n_step: int
    gamma: float
    gradient_steps: int
    learning_starts: int
    buffer_capacity: int
    buffered: int  # transitions already in the buffer (a resumed run)
    warmup: str
    max_policy_lag: int
    max_actor_lead: int


class EnvActor:
    """The learner's handle on the actor process.

    Built, it starts the process, which makes the envs of ``run_config`` (``nice`` added to its
    niceness first, which its simulator workers inherit) and reports their single spaces
    (``single_observation_space``, ``single_action_space``: what the learner builds the policy
    for). ``start(spec, updates)`` then shares the policy's weights and lets it act. ``receive``
    returns ``(transitions, env steps, episodes)`` of one vector step, or None when none arrived
    within ``timeout``. An exception in the actor (a bad env setting while it makes the envs, a
    simulator error) is raised here with its type where that is a built-in one (``ValueError``,
    ``ImportError``...) and its message, the actor's traceback as a note; any other type is a
    ``RuntimeError`` with the traceback, and so is an actor that died.
    ``close`` stops it.
    """

    def __init__(self, run_config: Any, nice: int = 0, queue_size: int = 64, timeout: float = 600.0) -> None:
        ctx = tmp.get_context("spawn")
        self.link = ActorLink(ctx)
        self.queue, self.control = ctx.Queue(maxsize=queue_size), ctx.Queue()
        args = (run_config, nice, self.link, self.queue, self.control)
        self.process = ctx.Process(target=_actor_main, args=args, name="sac-actor")
        with without_main_module():
            self.process.start()
        self._closed = False
        deadline = time.monotonic() + timeout
        message = None
        try:
            while message is None and time.monotonic() < deadline:
                message = self._get(1.0)
        finally:
            if message is None:  # an error, or no answer: the process goes too
                self.close()
        if message is None:
            raise RuntimeError(f"the SAC actor process made no env within {timeout:.0f} s")
        _, self.single_observation_space, self.single_action_space = message

    def start(self, spec: ActorSpec, updates: int) -> None:
        """Share ``spec.policy``'s weights (version ``updates``) and let the actor act."""
        self.link.share(spec.policy, updates)
        policy = copy.deepcopy(spec.policy).cpu()
        policy.generator = None
        self.control.put((dataclasses.replace(spec, policy=policy), self.link.snapshot))

    def receive(self, timeout: float) -> tuple[list[Transition], int, list[dict]] | None:
        message = self._get(timeout)
        if message is None:
            return None
        _, rows, env_steps, episodes = message
        return rows, env_steps, episodes

    def _get(self, timeout: float) -> tuple | None:
        try:
            message = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
        except queue_module.Empty:
            if not self.process.is_alive():
                raise RuntimeError(
                    f"the SAC actor process died (exit code {self.process.exitcode}) without a word"
                ) from None
            return None
        if message[0] == "error":  # a built-in exception type raised again as itself, else RuntimeError
            _, text, name, what = message
            cls = getattr(builtins, name, None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                raise RuntimeError(f"the SAC actor process failed:\n{text}")
            error = cls(what)
            error.add_note(f"(raised in the SAC actor process:\n{text})")
            raise error
        return message

    def close(self, timeout: float = 60.0) -> None:
        """Stop the actor (it finishes its vector step and closes its envs) and wait for it; kill
        it after ``timeout`` seconds. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.link.counters[STOP] = 1
        deadline = time.monotonic() + timeout
        while self.process.is_alive() and time.monotonic() < deadline:
            try:  # drain, so the actor's queue thread can flush and the process exit
                self.queue.get(timeout=0.1)
            except queue_module.Empty:
                pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        for q in (self.queue, self.control):
            q.close()
            q.cancel_join_thread()


def _actor_main(run_config: Any, nice: int, link: ActorLink, out: Any, control: Any) -> None:
    """The actor process: make the envs and report their spaces; once the learner sends the policy,
    step the envs with it (lagged) and send each vector step's transitions, until told to stop."""
    die_with_parent()
    signal.signal(signal.SIGTERM, _exit_on_term)
    torch.set_num_threads(1)
    if nice:
        os.nice(nice)
    counters, env = link.counters, None
    try:
        env = run_config.make_env(run_config.num_envs, autoreset="same_step")
        out.put(("spaces", env.single_observation_space, env.single_action_space))
        received = None
        while received is None and not counters[STOP]:
            try:
                received = control.get(timeout=0.1)
            except queue_module.Empty:
                pass
        if received is None:
            return
        spec, link.snapshot = received
        policy = spec.policy
        policy.seed(spec.seed)
        with link.lock:
            link.refresh(policy)
        lagged = LaggedPolicy(policy, link, spec.max_policy_lag)
        sac_space = getattr(policy, "sac_action_space", env.single_action_space)
        decode = getattr(policy, "decode", None) if sac_space is not env.single_action_space else None
        warmup = UniformPolicy(sac_space, torch.Generator().manual_seed(spec.seed + 2), decode)
        collector = Collector(env, warmup if spec.warmup == "uniform" else lagged)
        collector.reset(seed=spec.seed)
        writer = NStepWriter(env.num_envs, spec.n_step, spec.gamma)
        stored, live_steps = spec.buffered, 0  # the buffer's size as the learner will see it
        while not counters[STOP]:
            started = min(stored, spec.buffer_capacity) >= spec.learning_starts
            # at most max_actor_lead vector steps ahead of the learner's updates for them
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
            out.put(("step", rows, int(rollout.valid.sum()), rollout.episodes))
    except BaseException as error:
        if not counters[STOP]:  # plain data only: the learner rebuilds a built-in exception type
            out.put(("error", traceback.format_exc(), type(error).__name__, str(error)))
    finally:
        if env is not None:
            env.close()


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


__all__ = [
    "ActorLink",
    "ActorSpec",
    "EnvActor",
    "LaggedPolicy",
    "RESUME_SEED_STRIDE",
    "UniformPolicy",
    "step_transitions",
]
