"""The Ray plumbing the Ray-actor vector envs share: joining the cluster, placing one actor per share
of the envs in a placement group, mapping env indices to actors, releasing them. Ray is imported
only when an ``ActorSet`` is built."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import numpy as np

from envs.core.errors import bad_input, check_int, describe

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
            'Ray-actor envs need Ray: pip install "vla-gym[ray]" (or pip install "ray>=2.40")'
        ) from None
    return ray


class ActorHost:
    """Base of what runs inside an actor: the env ``build()`` makes, or the exception it raised,
    re-raised by ``describe`` (the driver's first call), so a bad argument reaches the caller as
    the env's own error instead of a dead actor."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.error: Exception | None = None
        try:
            self.env = build()
        except Exception as e:
            self.env, self.error = None, e

    def describe(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return {}

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
        try:
            ray.get(self.group.ready(), timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.release()
            raise RuntimeError(
                f"{name}: the Ray cluster did not place {num_actors} actors of {self.bundle} "
                f"({placement}) within {ready_timeout_s:g} s"
            ) from None

    def start(self, cls: type, args: list[tuple]) -> list[Any]:
        """One actor of ``cls`` per bundle, actor j built with ``args[j]``. Ray restarts a dead one
        (``max_restarts``) and never retries a call on it: the env decides what a lost call means."""
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
        return self.hosts

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
        return self.ray.get([host.pid.remote() for host in self.hosts])

    def release(self) -> None:
        """Close the actors' envs, kill the actors, remove the placement group."""
        ray = self.ray
        hosts, self.hosts = self.hosts, []
        if hosts and ray.is_initialized():
            try:
                ray.get([host.close.remote() for host in hosts], timeout=30)
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
        raise ValueError(
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
