"""What the learner and its actor process share: the policy's weights in shared memory, their
version, and the counters both sides read, under one lock."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from policies.base import ActionChunk, ActionChunkPolicy

# slots of ActorLink.counters (int64, guarded by ActorLink.lock)
UPDATES, ONLINE_UPDATES, PUBLISHED, ACTING, WAITING, STOP = range(6)

Weights = Callable[[], dict[str, torch.Tensor]]
"""Gives the weights the actor should act with (called only when they are copied)."""


def module_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A module's state that acting reads (parameters and buffers), detached, on the CPU."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


class ActorLink:
    """A shared-memory copy of the policy's weights (``snapshot``, set by ``share``), its version
    (the learner's update count when it was copied) and the counters, under one lock.

    The learner copies its weights in every ``sync_every`` updates (``updated``), and at once when
    the actor waits for newer ones (``updated`` or, with no update to do, ``serve``); the actor
    loads the newest copy before it chooses each chunk (``refresh``)."""

    def __init__(self, ctx: Any) -> None:
        self.lock = ctx.Lock()
        self.counters = ctx.RawArray("q", 6)
        self.snapshot: dict[str, torch.Tensor] | None = None

    # learner side
    def share(self, weights: dict[str, torch.Tensor], updates: int) -> None:
        """The first snapshot: ``weights`` (from ``module_weights``) in shared memory, at version
        ``updates``."""
        self.snapshot = weights
        for tensor in self.snapshot.values():
            tensor.share_memory_()
        with self.lock:
            self.counters[UPDATES] = self.counters[PUBLISHED] = self.counters[ACTING] = updates

    def updated(self, weights: Weights, updates: int, online: int, sync_every: int) -> None:
        """Count a finished update (``online``: those done for collected data); publish the weights
        when ``sync_every`` have passed since the last copy, or when the actor waits for them."""
        with self.lock:
            self.counters[UPDATES], self.counters[ONLINE_UPDATES] = updates, online
        if updates - self.counters[PUBLISHED] >= sync_every or self.counters[WAITING]:
            self.publish(weights, updates)

    def serve(self, weights: Weights, updates: int) -> None:
        """With no update to do: publish the weights if the actor waits for newer ones."""
        if self.counters[WAITING]:
            self.publish(weights, updates)

    def publish(self, weights: Weights, updates: int) -> None:
        if self.counters[PUBLISHED] == updates:
            return
        new = weights()
        with self.lock:
            for key, tensor in self.snapshot.items():
                tensor.copy_(new[key])
            self.counters[PUBLISHED] = updates

    # actor side
    def refresh(self, policy: ActionChunkPolicy) -> None:
        """Load the newest published weights into ``policy`` (call with ``lock`` held)."""
        if self.counters[PUBLISHED] != self.counters[ACTING]:
            policy.load_state_dict(self.snapshot, strict=False)
            self.counters[ACTING] = self.counters[PUBLISHED]


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
