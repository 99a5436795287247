"""The Ray plumbing the Ray-actor vector envs share: joining the cluster, placing one actor per share
of the envs in a placement group, mapping env indices to actors, waiting for their answers under a
deadline, restarting a lost one, releasing them. Ray is imported only when an ``ActorSet`` is built.

Every call on an actor has a deadline (``gather``): an actor that died, or has not answered by then
(hung, or stopped with SIGSTOP), is lost: a silent one is killed (``ray.kill``), Ray starts a fresh
one with the same arguments, and the next call on it first waits until the fresh one answers
(``host``). The envs decide what a lost actor means for their episodes (truncated with
``worker_restarted``, as the local worker pool does).
"""

from __future__ import annotations

import functools
import os
import socket
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from envs.core.errors import bad_input, check_int, describe
from nets.errors import BadInput

PLACEMENTS = {
    "pack": "PACK",
    "spread": "SPREAD",
    "strict_pack": "STRICT_PACK",
    "strict_spread": "STRICT_SPREAD",
}
ACTOR_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "runtime_env", "accelerator_type")


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            'ray_actors asks for envs on Ray actors, which need Ray: pip install "vla-gym[ray]" '
            '(or pip install "ray>=2.40")'
        ) from None
    return ray


class FreshActor(RuntimeError):
    """A call reached an actor that Ray restarted since the driver last heard from it: the envs'
    state it held is gone (the driver reports them lost, as for an actor that died in a call)."""


def needs_state(method: Callable) -> Callable:
    """An actor method that works on the envs' state: refused (``FreshActor``) by an actor that
    Ray restarted on its own until the driver has taken it up (``describe``)."""

    @functools.wraps(method)
    def call(self: ActorHost, *args: Any, **kwargs: Any) -> Any:
        if not self.adopted:
            raise FreshActor(f"Ray restarted this actor (pid {os.getpid()}) since the driver's last call")
        return method(self, *args, **kwargs)

    return call


class ActorHost:
    """Base of what runs inside an actor: the env ``build()`` makes, or the exception it raised,
    re-raised by ``describe`` (the driver's first call), so a bad argument reaches the caller as
    the env's own error instead of a dead actor. ``describe`` is also how the driver takes up the
    actor (at the start, after a restart): until then, methods marked ``needs_state`` refuse."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.error: Exception | None = None
        self.adopted = False
        try:
            self.env = build()
        except Exception as e:
            self.env, self.error = None, e

    def describe(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        import ray

        self.adopted = True
        return {"worker": ray.get_runtime_context().get_worker_id()}  # a new one after a restart

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


class ActorSet:
    """``num_envs`` envs over ``num_actors`` actors in one placement group: actor j holds envs
    ``offsets[j]`` to ``offsets[j + 1] - 1`` (sizes differ by at most 1). Every argument is checked,
    and a request the cluster cannot meet refused, before anything is placed."""

    def __init__(
        self,
        name: str,
        num_envs: int,
        num_actors: int,
        actor_options: dict[str, Any] | None,
        placement: str,
        address: str | None,
        max_restarts: int,
        ready_timeout_s: float,
    ) -> None:
        check_int(name, "num_envs", num_envs, low=1)
        check_int(name, "ray_actors", num_actors, low=1)
        if num_actors > num_envs:
            raise bad_input(name, "ray_actors", f"at most num_envs={num_envs} actors", num_actors)
        if placement not in PLACEMENTS:
            raise bad_input(name, "ray_placement", f"one of {list(PLACEMENTS)}", describe(placement))
        actor_options = dict(actor_options or {})
        unknown = sorted(set(actor_options) - set(ACTOR_OPTIONS))
        if unknown:
            raise bad_input(name, "ray_options", f"keys among {ACTOR_OPTIONS}", unknown)
        check_int(name, "ray_max_restarts", max_restarts, low=-1)
        self.ray = ray = import_ray()
        if not ray.is_initialized():
            _check_address(name, address)
            if address:
                ray.init(address=address)
            else:  # Ray's default: a cluster started on this node, else a new local one
                ray.init(include_dashboard=False)
        self.name, self.options, self.max_restarts = name, actor_options, max_restarts
        self.sizes = [num_envs // num_actors + (j < num_envs % num_actors) for j in range(num_actors)]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.actor_of = np.repeat(np.arange(num_actors), self.sizes)
        self.bundle = _bundle(actor_options)
        _check_resources(ray, name, self.bundle, num_actors, placement)
        self.group = ray.util.placement_group([self.bundle] * num_actors, strategy=PLACEMENTS[placement])
        self.hosts: list[Any] = []
        self.workers: list[str | None] = [None] * num_actors  # each actor's Ray worker, from describe
        self.restarting: dict[int, list] = {}  # lost actor -> [the worker it had, killed], until it answers
        self.restart_timeout_s = 300.0
        self.after_restart: Callable[[int], None] | None = None  # the env's hook once a lost actor is back
        try:
            ray.get(self.group.ready(), timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.release()
            raise RuntimeError(
                f"{name}: the Ray cluster did not place {num_actors} actors of {self.bundle} "
                f"({placement}) within {ready_timeout_s:g} s"
            ) from None

    def start(self, cls: type, args: list[tuple], timeout_s: float) -> list[dict[str, Any]]:
        """One actor of ``cls`` per bundle, actor j built with ``args[j]``; returns their ``describe()``
        once all have built their envs (within ``timeout_s``, which also bounds a restart). Ray
        restarts a dead one (``max_restarts``) and never retries a call on it: the env decides what a
        lost call means."""
        remote = self.ray.remote(cls)
        strategy = self.ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy
        for j, actor_args in enumerate(args):
            options = {
                **self.options,
                "num_cpus": self.bundle.get("CPU", 0),
                "num_gpus": self.bundle.get("GPU", 0),
                "max_restarts": self.max_restarts,
                "max_task_retries": 0,
                "scheduling_strategy": strategy(self.group, placement_group_bundle_index=j),
            }
            self.hosts.append(remote.options(**options).remote(*actor_args))
        self.restart_timeout_s = timeout_s
        try:  # an env that fails to build raises its own error here
            descs = self.ray.get([host.describe.remote() for host in self.hosts], timeout=timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"{self.name}: the Ray actors did not build their envs within {timeout_s:g} s"
            ) from None
        self.workers = [desc["worker"] for desc in descs]
        return descs

    def host(self, j: int) -> Any:
        """Actor j's handle, once it answers: a lost actor is first waited for until Ray has started
        its fresh one (at most ``restart_timeout_s``), then the env's ``after_restart`` hook runs."""
        if j in self.restarting:
            self._wait_restarted(j)
        return self.hosts[j]

    def gather(
        self, refs: dict[int, Any], timeout_s: float
    ) -> tuple[dict[int, Any], dict[int, tuple[bool, str]], BaseException | None]:
        """Wait for one call per actor (``{actor: ObjectRef}``), all under one deadline ``timeout_s``
        seconds from now. Returns the results, the actors lost on the way as ``{actor: (hung,
        what)}`` (died, or no answer by the deadline: hung or stopped), and the first error an env
        raised, for the caller to raise once it has dealt with the lost actors."""
        ray = self.ray
        results: dict[int, Any] = {}
        lost: dict[int, tuple[bool, str]] = {}
        error: BaseException | None = None
        deadline = time.monotonic() + timeout_s
        waiting = list(refs.values())
        while waiting and time.monotonic() < deadline:
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=deadline - time.monotonic())
        silent = {ref.hex() for ref in waiting}
        exc = ray.exceptions
        died = (exc.RayActorError, exc.WorkerCrashedError, exc.OutOfMemoryError)
        for j, ref in refs.items():
            if ref.hex() in silent:
                lost[j] = (True, f"did not answer within {timeout_s:g} s (hung or stopped)")
                continue
            try:
                results[j] = ray.get(ref, timeout=max(10.0, deadline - time.monotonic()))
            except ray.exceptions.ActorUnavailableError as e:  # restarting, or up but unreachable
                lost[j] = (False, f"became unavailable ({type(e).__name__})")
            except died as e:
                lost[j] = (False, f"died ({type(e).__name__})")
            except ray.exceptions.GetTimeoutError:
                lost[j] = (True, f"did not answer within {timeout_s:g} s (hung or stopped)")
            except FreshActor:
                lost[j] = (False, "was restarted by Ray since the last call (its envs' state is gone)")
            except Exception as e:  # the env raised: the actor is fine
                error = error or e
        return results, lost, error

    def lose(self, j: int, hung: bool, what: str, call: str) -> None:
        """Actor j was lost during ``call`` (``gather``'s verdict): kill it if it is hung or stopped,
        so that Ray starts a fresh one, and warn. The next ``host(j)`` waits for the fresh one
        (and kills the actor then if it still answers as the old one). With ``max_restarts=0``
        nothing is restarted: ``RuntimeError``."""
        restart = self.max_restarts != 0
        if hung:
            self.ray.kill(self.hosts[j], no_restart=not restart)
        lo, hi = int(self.offsets[j]), int(self.offsets[j + 1])
        warnings.warn(
            f"{self.name}: Ray actor {j} (envs {lo}-{hi - 1}) {what} during {call}; "
            + ("killed it; " if hung else "")
            + "its envs are truncated (worker_restarted) and start again on a fresh actor",
            RuntimeWarning,
            stacklevel=4,
        )
        if not restart:
            raise RuntimeError(f"{self.name}: Ray actor {j} was lost during {call} (ray_max_restarts=0)")
        self.restarting.setdefault(j, [self.workers[j], hung])

    def _wait_restarted(self, j: int) -> None:
        old, killed = self.restarting[j]
        deadline = time.monotonic() + self.restart_timeout_s
        errors = (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"{self.name}: Ray actor {j} did not come back within {self.restart_timeout_s:g} s "
                    f"(max_restarts={self.max_restarts})"
                )
            try:  # a fresh actor's env that fails to build raises its own error here
                worker = self.ray.get(self.hosts[j].describe.remote(), timeout=left)["worker"]
            except errors:  # the old one is still going down, or the fresh one is starting
                worker, killed = old, True
            if worker != old:
                break
            if not killed:  # still the old one (unreachable for a while, not restarted): restart it
                self.ray.kill(self.hosts[j], no_restart=False)
                killed = True
            time.sleep(0.2)
        self.workers[j] = worker
        del self.restarting[j]
        if self.after_restart is not None:
            try:
                self.after_restart(j)
            except BaseException:  # not usable as the env needs it: the next call waits for another
                self.ray.kill(self.hosts[j], no_restart=False)
                self.restarting[j] = [worker, True]
                raise

    def split(self, env_ids: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``(actor, positions in env_ids, the actor's own env indices)`` for every actor involved."""
        actors = self.actor_of[env_ids]
        parts = []
        for j in np.unique(actors):
            pos = np.flatnonzero(actors == j)
            parts.append((int(j), pos, env_ids[pos] - self.offsets[j]))
        return parts

    def pids(self) -> list[int]:
        """Process ids of the actors (on their nodes); the actor classes have a ``pid`` method."""
        refs = [self.host(j).pid.remote() for j in range(len(self.hosts))]
        return self.ray.get(refs, timeout=self.restart_timeout_s)

    def release(self) -> None:
        """Close the actors' envs, kill the actors, remove the placement group."""
        ray = self.ray
        hosts, self.hosts = self.hosts, []
        restarting, self.restarting = self.restarting, {}
        if hosts and ray.is_initialized():
            try:  # lost ones are not waited for
                ray.get([h.close.remote() for j, h in enumerate(hosts) if j not in restarting], timeout=30)
            except Exception:  # a dead or hung actor: killed below anyway
                pass
            for host in hosts:
                ray.kill(host, no_restart=True)
        group, self.group = self.group, None
        if group is not None and ray.is_initialized():
            ray.util.remove_placement_group(group)


def _bundle(actor_options: dict[str, Any]) -> dict[str, float]:
    """One actor's resource request as a placement-group bundle."""
    bundle = {"CPU": float(actor_options.get("num_cpus", 1))}
    if actor_options.get("num_gpus"):
        bundle["GPU"] = float(actor_options["num_gpus"])
    if actor_options.get("memory"):
        bundle["memory"] = float(actor_options["memory"])
    bundle.update({k: float(v) for k, v in actor_options.get("resources", {}).items()})
    return bundle


def _check_resources(ray: Any, name: str, bundle: dict[str, float], count: int, placement: str) -> None:
    """Refuse, before anything is placed, a request no node (or not the whole cluster) can meet."""
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    fits = [min(int(res.get(k, 0) // v) if v else count for k, v in bundle.items()) for res in nodes]
    total = sum(fits) if placement != "strict_pack" else max(fits, default=0)
    if placement == "strict_spread":
        total = sum(1 for f in fits if f >= 1)
    if total < count:
        have = [{k: res.get(k, 0) for k in bundle} for res in nodes]
        raise BadInput(
            f"{name}: the Ray cluster cannot meet {count} actors of {bundle} ({placement}): "
            f"its nodes have {have}; lower ray_options (num_cpus, num_gpus) or ray_actors, or add nodes"
        )


def _check_address(name: str, address: str | None) -> None:
    """A ``host:port`` (or ``ray://host:port``) that does not answer is an error now, not a hang."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise bad_input(
            name, "ray_address", "'auto', 'local', 'host:port' or 'ray://host:port'", repr(address)
        )
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise ConnectionError(
            f"{name}: no Ray cluster answers at {address!r} ({e}); start one with `ray start --head` "
            "and pass its address (or leave ray_address unset for a local one)"
        ) from None
