"""The actor process and the learner's handle on it (``EnvActor``)."""

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

import torch
import torch.multiprocessing as tmp

from nets.processes import die_with_parent, without_main_module
from policies.base import ActionChunkPolicy
from trainers.actors.link import STOP, ActorLink, LaggedPolicy, module_weights
from trainers.env_contract import frame_tasks

Send = Callable[..., None]
"""``send(*payload)``: one message to the learner, which ``EnvActor.receive`` returns as a tuple."""
ActorLoop = Callable[[Any, Any, LaggedPolicy, Any, Send], None]
"""``loop(spec, env, lagged, counters, send)``: the algorithm's acting loop in the actor process
(a module-level function: it is pickled); it returns once ``counters[STOP]`` is set."""


@dataclass
class ActorSpec:
    """How the actor process acts, once the learner has built the policy (picklable). An algorithm
    subclasses it with what its acting loop needs."""

    policy: ActionChunkPolicy | None  # the learner's policy (a copy without its generator is sent)
    seed: int  # env reset seed and the actor's sampling streams
    max_policy_lag: int


class EnvActor:
    """The learner's handle on the actor process.

    Built, it starts the process, which makes the envs of ``run_config`` (in ``autoreset`` mode;
    ``nice`` added to its niceness first, which its simulator workers inherit) and reports their spaces
    (``single_observation_space``, ``single_action_space``: what the learner builds the policy
    for; ``metadata``: the env's ``chunk_size`` entry, where it has one; ``frame_tasks``: the task of
    each start frame, or None: ``trainers.env_contract.frame_tasks``). ``start(spec, updates,
    weights)`` then shares the weights the actor acts with and runs ``loop`` there. ``receive``
    returns the payload of one message (one vector step), or None when none arrived within
    ``timeout``. An exception in the actor (a bad env setting while it makes
    the envs, a simulator error) is raised here with its type where that is a built-in one
    (``ValueError``, ``ImportError``...) and its message, the actor's traceback as a note; any other
    type is a ``RuntimeError`` with the traceback, and so is an actor that died. ``close`` stops it.
    """

    def __init__(
        self,
        run_config: Any,
        loop: ActorLoop,
        name: str,
        nice: int = 0,
        queue_size: int = 64,
        timeout: float = 600.0,
        autoreset: str = "same_step",
    ) -> None:
        ctx = tmp.get_context("spawn")
        self.name = name
        self.link = ActorLink(ctx)
        self.queue, self.control = ctx.Queue(maxsize=queue_size), ctx.Queue()
        args = (run_config, nice, self.link, self.queue, self.control, loop, autoreset)
        self.process = ctx.Process(target=_actor_main, args=args, name=name)
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
            raise RuntimeError(f"the {name} process made no env within {timeout:.0f} s")
        _, self.single_observation_space, self.single_action_space, self.metadata, self.frame_tasks = message

    def start(self, spec: ActorSpec, updates: int, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Share ``weights`` (default: ``spec.policy``'s own; version ``updates``) and let the actor
        act with a copy of ``spec.policy`` that loads them."""
        self.link.share(weights if weights is not None else module_weights(spec.policy), updates)
        policy = copy.deepcopy(spec.policy).cpu()
        policy.generator = None
        self.control.put((dataclasses.replace(spec, policy=policy), self.link.snapshot))

    def receive(self, timeout: float) -> tuple | None:
        message = self._get(timeout)
        return None if message is None else message[1:]

    def _get(self, timeout: float) -> tuple | None:
        try:
            message = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
        except queue_module.Empty:
            if not self.process.is_alive():
                raise RuntimeError(
                    f"the {self.name} process died (exit code {self.process.exitcode}) without a word"
                ) from None
            return None
        if message[0] == "error":  # a built-in exception type raised again as itself, else RuntimeError
            _, text, name, what = message
            cls = getattr(builtins, name, None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                raise RuntimeError(f"the {self.name} process failed:\n{text}")
            error = cls(what)
            error.add_note(f"(raised in the {self.name} process:\n{text})")
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


def _actor_main(
    run_config: Any, nice: int, link: ActorLink, out: Any, control: Any, loop: ActorLoop, autoreset: str
) -> None:
    """The actor process: make the envs (``autoreset`` mode) and report their spaces and start frames'
    tasks; once the learner sends the policy, run the algorithm's ``loop`` with it (lagged) until told
    to stop."""
    die_with_parent()
    signal.signal(signal.SIGTERM, _exit_on_term)
    torch.set_num_threads(1)
    if nice:
        os.nice(nice)
    counters, env, learner = link.counters, None, os.getppid()
    try:
        env = run_config.make_env(run_config.num_envs, autoreset=autoreset)
        known = {k: env.metadata[k] for k in ("chunk_size",) if k in env.metadata}
        out.put(("spaces", env.single_observation_space, env.single_action_space, known, frame_tasks(env)))
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
        with link.lock:  # the weights shared at start (the learner's may be other ones: an average)
            policy.load_state_dict(link.snapshot, strict=False)
        lagged = LaggedPolicy(policy, link, spec.max_policy_lag)
        loop(spec, env, lagged, counters, lambda *payload: out.put(("step", *payload)))
    except BaseException as error:
        if not counters[STOP] and os.getppid() == learner:  # tell a learner that is still there
            try:  # plain data only: the learner rebuilds a built-in exception type
                out.put(("error", traceback.format_exc(), type(error).__name__, str(error)), timeout=10.0)
            except queue_module.Full:  # it has read nothing for 10 s: it is stuck or going
                pass
    finally:
        # a dead learner (SIGTERM from die_with_parent) reads nothing more: exit without waiting to
        # flush the queue into a pipe that may be full
        if os.getppid() != learner:
            out.cancel_join_thread()
        if env is not None:
            env.close()


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
