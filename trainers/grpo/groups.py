"""GRPO's groups: where they start (one common start per group of ``group_size`` consecutive envs),
which carry signal (DAPO dynamic sampling), and the batch assembled from the kept ones.

Envs with start frames (``trainers.env_contract``; this project's) get one frame id per group
through the ``initial_frames`` reset option; any other env gets one seed per group (``group_seeds``), which
gymnasium's Sync/Async vector envs pass to each sub-env. Starts are a function of (seed, iteration,
round) and of the per-task counts below, which are checkpointed, so a resumed run draws what the
uninterrupted run would have drawn.

Two options need the task of each frame (``frame.task``):

* ``same_task_iters = M > 1``: group g keeps one task for M iterations, with a new start of that
  task each time. Every frame stays equally likely; an env that rebuilds its scene on a task switch
  (LIBERO: 0.8 s instead of 0.14 s for a reset within the task) rarely has to.
* ``weighting="informative"``: tasks are drawn in proportion to the share of their past groups that
  carried signal (scores not all equal), Laplace-smoothed: ``(kept + 1) / (groups + 2)``. Starts
  where the policy always succeeds or always fails then take fewer env steps. The weights change
  at the start of each M-iteration block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from nets.errors import BadInput
from trainers import parallel
from trainers.env_contract import frame_tasks, initial_frames, start_options
from trainers.rollout import Rollout

Weighting = Literal["uniform", "informative"]


def group_seeds(seed: int, num_envs: int, group_size: int) -> list[int]:
    """Per-env reset seeds giving every env of a group the same start: ``[s, s, .., s+1, s+1, ..]``."""
    num_groups(num_envs, group_size)
    return [seed + i // group_size for i in range(num_envs)]


def num_groups(num_envs: int, group_size: int) -> int:
    """``num_envs // group_size``; an error unless the envs split into whole groups."""
    if num_envs % group_size:
        raise BadInput(f"num_envs={num_envs} is not a multiple of group_size={group_size}")
    return num_envs // group_size


def keep_groups(
    scores: torch.Tensor,
    group_size: int,
    low: float | None = None,
    high: float | None = None,
    tol: float = 1e-8,
) -> torch.Tensor:
    """DAPO dynamic sampling: True for the groups worth training on ``[N // G]``.

    A group is dropped when its scores are all equal (its advantages are all 0), and, with
    bounds, when its mean score is outside ``[low, high]`` (RLinf ``filter_rewards``).
    """
    groups = scores.reshape(num_groups(scores.numel(), group_size), group_size)
    keep = (groups.amax(1) - groups.amin(1)) > tol
    mean = groups.mean(1)
    if low is not None:
        keep &= mean >= low
    if high is not None:
        keep &= mean <= high
    return keep


def groups_to_resample(
    scores: torch.Tensor, group_size: int, low: float | None = None, high: float | None = None
) -> list[int]:
    """Indices of the groups dynamic sampling drops: run them again (new samples from the same
    starts) and replace their envs' rollouts, until enough groups carry signal."""
    return torch.nonzero(~keep_groups(scores, group_size, low, high)).flatten().tolist()


def select_envs(parts: Sequence[tuple[Rollout, Sequence[int]]]) -> Rollout:
    """One rollout made of the envs ``idx`` of each ``(rollout, idx)`` part, side by side.

    Parts may have different lengths: shorter ones are padded at the end with steps that are not
    valid (zero rewards, no done), which every trainer ignores. Used by GRPO's dynamic sampling to
    assemble a batch from the groups kept over several collection rounds.
    """
    T = max(ro.num_steps for ro, _ in parts)

    def gather(get: Callable[[Rollout], torch.Tensor | None], time_axis: bool = True) -> torch.Tensor | None:
        pieces = []
        for ro, idx in parts:
            x = get(ro)
            if x is None:
                return None
            index = torch.as_tensor(list(idx), dtype=torch.long, device=x.device)
            if not time_axis:
                pieces.append(x[index])
                continue
            x = x[:, index]
            if x.shape[0] < T:
                pad = torch.zeros((T - x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
                x = torch.cat([x, pad])
            pieces.append(x)
        return torch.cat(pieces, dim=1 if time_axis else 0)

    episodes = []
    offset = 0
    for ro, idx in parts:
        where = {int(i): j for j, i in enumerate(idx)}
        episodes += [
            {**ep, "env": float(offset + where[int(ep["env"])])}
            for ep in ro.episodes
            if int(ep["env"]) in where
        ]
        offset += len(idx)
    first = parts[0][0]
    return Rollout(
        replay={k: gather(lambda ro, k=k: ro.replay[k]) for k in first.replay},
        actions=gather(lambda ro: ro.actions),
        log_probs=gather(lambda ro: ro.log_probs),
        values=gather(lambda ro: ro.values),
        rewards=gather(lambda ro: ro.rewards),
        valid=gather(lambda ro: ro.valid),
        terminated=gather(lambda ro: ro.terminated),
        truncated=gather(lambda ro: ro.truncated),
        first_episode=gather(lambda ro: ro.first_episode),
        bootstrap_values=gather(lambda ro: ro.bootstrap_values),
        last_values=gather(lambda ro: ro.last_values, time_axis=False),
        episodes=episodes,
    )


def group_reset(
    env: gym.vector.VectorEnv,
    group_size: int,
    seed: int,
    iteration: int,
    rnd: int,
    same_task_iters: int = 1,
    tasks: Sequence[str] | None = None,
    task_weights: dict[str, float] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, Any]:
    """``reset`` arguments that give each group of envs one common start (module docstring).

    ``tasks``: the task of each frame (``frame_tasks``), needed by ``same_task_iters > 1`` and
    ``task_weights`` (task -> relative weight; default: each task in proportion to its frames).
    ``shard=(rank, world_size)``: ``env`` is one rank's share of ``world_size`` equal ones; the
    starts are drawn for all of them and this rank's envs get their slice (one int seed for a reset
    seeds env i with ``seed + i``, gymnasium's rule, so the rank's seed moves by its first env).
    """
    rng = np.random.default_rng([seed, iteration, rnd])
    rank, world = shard
    local = env.num_envs
    n, first = local * world, local * rank  # all ranks' envs; this rank's first
    frames = initial_frames(env)
    if frames is None:
        return {"seed": group_seeds(int(rng.integers(2**31 - n)), n, group_size)[first : first + local]}
    count = num_groups(n, group_size)
    if tasks is None or (same_task_iters == 1 and task_weights is None):
        ids = rng.integers(len(frames), size=count)
    else:
        pools: dict[str, list[int]] = {}
        for i, task in enumerate(tasks):
            pools.setdefault(task, []).append(i)
        names = sorted(pools)
        weights = np.array([len(pools[t]) * (task_weights or {}).get(t, 1.0) for t in names], float)
        block = np.random.default_rng([seed, iteration // same_task_iters, 1])  # one task per block
        chosen = block.choice(len(names), size=count, p=weights / weights.sum())
        ids = np.array([pools[names[c]][rng.integers(len(pools[names[c]]))] for c in chosen])
    ids = ids.repeat(group_size)[first : first + local]
    return {"seed": int(rng.integers(2**31)) + first, "options": start_options(ids.tolist())}


class GroupStarts:
    """The starts of every round of a GRPO run, and the per-task counts that ``informative``
    weighting draws from (``state_dict`` / ``load_state_dict`` for checkpoints)."""

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        group_size: int,
        seed: int,
        same_task_iters: int = 1,
        weighting: Weighting = "uniform",
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        if weighting not in ("uniform", "informative"):
            raise BadInput(f"start weighting must be 'uniform' or 'informative', got {weighting!r}")
        self.env, self.group_size, self.seed, self.shard = env, group_size, seed, shard
        self.same_task_iters, self.weighting = same_task_iters, weighting
        needs_tasks = same_task_iters > 1 or weighting == "informative"
        self.tasks = frame_tasks(env) if needs_tasks else None
        if weighting == "informative" and self.tasks is None:
            raise BadInput(
                "start weighting 'informative' needs an env whose initial_frames say their task "
                "(frame.task); use 'uniform'"
            )
        self.counts: dict[str, list[int]] = {}  # task -> [groups with signal, groups]
        self._recent: dict[str, list[int]] = {}  # this rank's counts since the last merge_ranks
        self._weights: dict[str, float] | None = None  # of the current block
        self._block = -1
        self._last_ids: list[int] | None = None

    def reset_kwargs(self, iteration: int, rnd: int) -> dict[str, Any]:
        """``reset`` arguments for round ``rnd`` of ``iteration``."""
        if self.weighting == "informative" and iteration // self.same_task_iters != self._block:
            self._block = iteration // self.same_task_iters
            self._weights = {t: (k + 1) / (n + 2) for t, (k, n) in self.counts.items()}
        kwargs = group_reset(
            self.env,
            self.group_size,
            self.seed,
            iteration,
            rnd,
            self.same_task_iters,
            self.tasks,
            self._weights,
            self.shard,
        )
        self._last_ids = kwargs.get("options", {}).get("initial_frames")
        return kwargs

    def record(self, keep: torch.Tensor) -> None:
        """Count the groups of the last round (``keep``: which carried signal) per task."""
        if self.tasks is None or self._last_ids is None:
            return
        for g, kept in enumerate(keep.tolist()):
            task = self.tasks[self._last_ids[g * self.group_size]]
            for table in (self.counts, self._recent):
                counts = table.setdefault(task, [0, 0])
                counts[0] += int(kept)
                counts[1] += 1

    def merge_ranks(self) -> None:
        """Add the other ranks' counts recorded since the last call (several ranks: every rank
        then draws from the same weights; a no-op in a single process)."""
        parts = parallel.all_gather(self._recent)
        self._recent = {}
        for r, part in enumerate(parts):
            if r == self.shard[0]:
                continue  # already counted
            for task, (kept, groups) in part.items():
                counts = self.counts.setdefault(task, [0, 0])
                counts[0] += kept
                counts[1] += groups

    def state_dict(self) -> dict[str, Any]:
        counts = {t: list(c) for t, c in self.counts.items()}
        return {"counts": counts, "weights": self._weights, "block": self._block}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {t: list(c) for t, c in state["counts"].items()}
        self._weights, self._block = state["weights"], state["block"]
