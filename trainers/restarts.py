"""Restarts in the states where failed episodes went: practise the part of a task the policy fails.

A share of the finished envs restart, instead of at a start frame, in a state that a recent failed
episode passed through: one of the last ``pool`` failed episodes is chosen uniformly, then one of its
chunk boundaries uniformly (not its last, where it ended) among the first ``depth`` share of them (1: any;
0: the first, one chunk in, which replays the start it failed from). The rest restart where ``base``
draws (the env's frames uniformly, or a curriculum's draw).

The env supplies the states: at every step ``info["restart_frame"][i]`` is an ``InitialFrame`` from
which a reset continues env ``i``'s episode where the chunk left it (LIBERO:
``restart_frames_in_info=True``, ``envs/libero/env.py``), with ``meta["from_restart"]`` saying whether
that episode itself began at such a frame. Only episodes that began at a start frame feed the pool,
so restarts do not drift into ever later states of ever shorter budgets. The collector restarts the
finished envs at ``draw``'s frames (``trainers.rollout.Collector``, ``start_frames``) and calls
``observe`` with every step's info (``on_step``). The pool is not checkpointed: a resumed run starts
with it empty.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nets.errors import BadInput

RESTART_KEY = "restart_frame"


class FailureRestarts:
    """The pool of failed episodes' states and the start draw that mixes them in.

    Args:
        share: the share of restarts drawn from the pool once it holds an episode, in [0, 1).
        pool: how many of the latest failed episodes are kept.
        num_envs: the vector env's ``num_envs``.
        base: ``base(n)`` gives ``n`` start frame ids for the other restarts.
        seed: the draw's random stream (``np.random.default_rng``'s seed).
        depth: how far into a failed episode a restart may go, in [0, 1]: its first
            ``max(1, ceil(depth * n))`` of ``n`` chunk boundaries.
    """

    def __init__(
        self,
        share: float,
        pool: int,
        num_envs: int,
        base: Callable[[int], Sequence[Any]],
        seed: int | Sequence[int],
        depth: float = 1.0,
    ) -> None:
        if not 0.0 <= share < 1.0:
            raise BadInput(f"failure restarts: share must be in [0, 1), got {share}")
        if pool < 1:
            raise BadInput(f"failure restarts: pool must be >= 1 episode, got {pool}")
        if not 0.0 <= depth <= 1.0:
            raise BadInput(f"failure restarts: depth must be in [0, 1], got {depth}")
        self.share, self.base, self.depth = float(share), base, float(depth)
        self.failed: deque[list[Any]] = deque(maxlen=int(pool))
        self.open: list[list[Any]] = [[] for _ in range(num_envs)]
        self.rng = np.random.default_rng(seed)
        self.drawn = self.restarted = 0

    def observe(self, info: dict[str, Any]) -> None:
        """Keep each env's states of this step; an episode that ended here without success joins
        the pool (its states before the end)."""
        frames = info.get(RESTART_KEY)
        if frames is None:
            raise BadInput(
                f"failure restarts need the env to report info[{RESTART_KEY!r}] at every step (LIBERO: "
                f"env_kwargs restart_frames_in_info true); this env's info has {sorted(info)!r:.300}"
            )
        ended = np.asarray(info.get("_episode", np.zeros(len(self.open), bool)), bool)
        success = np.asarray((info.get("episode") or {}).get("success", np.zeros(len(self.open))), bool)
        for i, frame in enumerate(frames):
            if ended[i]:
                if not success[i] and self.open[i]:
                    self.failed.append(self.open[i])
                self.open[i] = []
            elif frame is not None and not frame.meta.get("from_restart", False):
                self.open[i].append(frame)

    def draw(self, count: int) -> list[Any]:
        """``count`` starts: pool states (``InitialFrame``s) at ``share``, else ``base``'s frame ids."""
        from_pool = self.rng.random(count) < self.share if self.failed else np.zeros(count, bool)
        base = iter(self.base(int((~from_pool).sum())))
        out = []
        for pick in from_pool:
            if pick:
                episode = self.failed[int(self.rng.integers(len(self.failed)))]
                reach = max(1, math.ceil(self.depth * len(episode)))
                out.append(episode[int(self.rng.integers(reach))])
            else:
                out.append(next(base))
        self.drawn += count
        self.restarted += int(from_pool.sum())
        return out


def uniform_frames(num_frames: int, seed: int) -> Callable[[int], list[int]]:
    """``draw(n)``: ``n`` start frame ids among ``num_frames``, uniformly, as the env draws them."""
    rng = np.random.default_rng(seed)
    return lambda n: [int(i) for i in rng.integers(0, num_frames, size=n)]
