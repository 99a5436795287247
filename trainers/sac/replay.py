"""Replay memory for SAC: a preallocated ring buffer and the n-step chunk returns written into it.

A row is one transition over ``n`` chunk-steps of one env: the observation a chunk was chosen
from, that chunk ``[K, D]`` (env units), the discounted reward of every sub-step executed from there
on ``sum_j gamma^j r_j``, the bootstrap discount ``gamma^(sub-steps executed)`` (0 when the episode
terminated) and the observation to bootstrap from (the final observation of an episode that ended).
A chunk that ran only part of its sub-steps (the episode ended inside it) is exact: its discount
counts the sub-steps that ran (Q-chunking's unbiased n-step backup over executed actions).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from nets.errors import BadInput

MEMORY_FRACTION = 0.8  # a buffer may take at most this share of the memory available when it is built


def available_memory() -> int | None:
    """Bytes of memory available now (``MemAvailable`` of /proc/meminfo), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _fields(space: spaces.Space) -> tuple[bool, dict[str, spaces.Space]]:
    """``(is_dict, key -> part)``: a Dict space's parts, or the whole space under ``"obs"``."""
    if isinstance(space, spaces.Dict):
        return True, dict(space.spaces)
    return False, {"obs": space}


def obs_row(obs: Any, i: int | None = None) -> dict[str, Any]:
    """One env's observation as ``{key: array or str}``: entry ``i`` of a batched observation, or
    an unbatched one (``i`` None). Arrays are copied (vector envs may reuse their buffers)."""
    parts = obs if isinstance(obs, Mapping) else {"obs": obs}
    out = {}
    for key, value in parts.items():
        item = value if i is None else value[i]
        out[key] = item if isinstance(item, str) else np.array(item)
    return out


@dataclass
class Transition:
    obs: dict[str, Any]
    action: np.ndarray  # [K, D]
    reward: float  # sum_j gamma^j r_j over the executed sub-steps
    discount: float  # gamma^(executed sub-steps), 0 after a termination
    next_obs: dict[str, Any]
    lag: int = 0  # learner updates between the weights that chose the action and the choice (async)


@dataclass
class ChunkStep:
    """What one env did in one chunk-step (before its n-step return is known)."""

    obs: dict[str, Any]
    action: np.ndarray  # [K, D]
    rewards: np.ndarray  # [K]
    valid: np.ndarray  # [K] bool, a prefix of the chunk
    lag: int = 0  # policy lag of the choice (async loop)


class NStepWriter:
    """Per env, the last ``n_step`` chunk-steps; ``push`` returns the transitions they complete."""

    def __init__(self, num_envs: int, n_step: int, gamma: float) -> None:
        if n_step < 1:
            raise BadInput(f"n_step must be >= 1, got {n_step}")
        self.n_step, self.gamma = n_step, gamma
        self.pending: list[list[ChunkStep]] = [[] for _ in range(num_envs)]

    def push(
        self, env: int, step: ChunkStep, next_obs: dict[str, Any], terminated: bool, truncated: bool
    ) -> list[Transition]:
        """Add env ``env``'s chunk-step; ``next_obs`` is the observation after it (the final one if
        the episode ended in it). An ended episode flushes every pending step."""
        pending = self.pending[env]
        pending.append(step)
        if terminated or truncated:
            out = [self._transition(pending[j:], next_obs, terminated) for j in range(len(pending))]
            pending.clear()
            return out
        if len(pending) == self.n_step:
            out = [self._transition(pending, next_obs, False)]
            pending.pop(0)
            return out
        return []

    def _transition(self, steps: list[ChunkStep], next_obs: dict[str, Any], terminated: bool) -> Transition:
        ret, executed = 0.0, 0
        for step in steps:
            for r in np.asarray(step.rewards, np.float64)[np.asarray(step.valid, bool)]:
                ret += self.gamma**executed * float(r)
                executed += 1
        discount = 0.0 if terminated else self.gamma**executed
        return Transition(steps[0].obs, steps[0].action, ret, discount, next_obs, steps[0].lag)


@dataclass
class Batch:
    """Sampled rows: observations as a vector env batches them (dict of arrays, strings as a tuple)."""

    obs: Any
    actions: torch.Tensor  # [B, K, D]
    rewards: torch.Tensor  # [B]
    discounts: torch.Tensor  # [B]
    next_obs: Any
    prior: torch.Tensor  # [B] bool: rows from the prior data

    @staticmethod
    def cat(a: Batch, b: Batch) -> Batch:
        def join(x: Any, y: Any) -> Any:
            if isinstance(x, dict):
                return {k: join(x[k], y[k]) for k in x}
            return x + y if isinstance(x, tuple) else np.concatenate([x, y])

        return Batch(
            join(a.obs, b.obs),
            torch.cat([a.actions, b.actions]),
            torch.cat([a.rewards, b.rewards]),
            torch.cat([a.discounts, b.discounts]),
            join(a.next_obs, b.next_obs),
            torch.cat([a.prior, b.prior]),
        )


class ReplayBuffer:
    """Ring buffer of ``capacity`` transitions for one observation space and chunk shape.

    Storage is allocated up front (text observations as Python strings); a buffer whose arrays would
    take more than ``MEMORY_FRACTION`` of the memory available is refused with a ``ValueError``.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_shape: tuple[int, int],
        capacity: int,
        prior: bool = False,
    ) -> None:
        if capacity < 1:
            raise BadInput(f"buffer_size must be >= 1, got {capacity}")
        self.is_dict, parts = _fields(observation_space)
        self.capacity, self.prior = int(capacity), prior
        self.text = {k for k, s in parts.items() if isinstance(s, spaces.Text)}
        row_bytes = 4 * (math.prod(action_shape) + 3)  # actions, reward, discount, lag
        for key, space in parts.items():
            if key in self.text:
                row_bytes += 2 * 64  # a pointer and a short string, roughly
            elif isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiBinary | spaces.MultiDiscrete):
                row_bytes += 2 * math.prod(space.shape) * np.dtype(space.dtype).itemsize
            else:
                raise BadInput(f"the replay buffer stores Box, Discrete and Text observations, not {space}")
        need, free = row_bytes * self.capacity, available_memory()
        if free is not None and need > MEMORY_FRACTION * free:
            raise BadInput(
                f"a replay buffer of {self.capacity} transitions needs {need / 2**30:.2f} GiB, more than "
                f"{MEMORY_FRACTION:.0%} of the {free / 2**30:.2f} GiB available: lower buffer_size"
            )

        def storage() -> dict[str, np.ndarray]:
            return {
                k: np.empty(self.capacity, object)
                if k in self.text
                else np.zeros((self.capacity, *s.shape), s.dtype)
                for k, s in parts.items()
            }

        self.obs, self.next_obs = storage(), storage()
        self.actions = np.zeros((self.capacity, *action_shape), np.float32)
        self.rewards = np.zeros(self.capacity, np.float32)
        self.discounts = np.zeros(self.capacity, np.float32)
        self.lags = np.zeros(self.capacity, np.int32)  # policy lag of each row (0 in the sync loop)
        self.pos, self.size = 0, 0

    def __len__(self) -> int:
        return self.size

    def add(self, transitions: list[Transition]) -> None:
        for t in transitions:
            i = self.pos
            for key in self.obs:
                self.obs[key][i] = t.obs[key]
                self.next_obs[key][i] = t.next_obs[key]
            self.actions[i], self.rewards[i], self.discounts[i] = t.action, t.reward, t.discount
            self.lags[i] = t.lag
            self.pos = (i + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def sample(
        self, batch_size: int, generator: torch.Generator, device: torch.device | str = "cpu"
    ) -> Batch:
        """``batch_size`` rows drawn uniformly (with replacement) with ``generator``."""
        if self.size == 0:
            raise BadInput("cannot sample from an empty replay buffer")
        idx = torch.randint(self.size, (batch_size,), generator=generator).numpy()
        return Batch(
            self._gather(self.obs, idx),
            torch.as_tensor(self.actions[idx], device=device),
            torch.as_tensor(self.rewards[idx], device=device),
            torch.as_tensor(self.discounts[idx], device=device),
            self._gather(self.next_obs, idx),
            torch.full((batch_size,), self.prior, dtype=torch.bool, device=device),
        )

    def _gather(self, store: dict[str, np.ndarray], idx: np.ndarray) -> Any:
        out = {k: tuple(v[idx]) if k in self.text else v[idx] for k, v in store.items()}
        return out if self.is_dict else out["obs"]

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The filled rows (tensors sharing the buffer's memory; strings as lists), for a checkpoint."""
        n = self.size

        def rows(store: dict[str, np.ndarray]) -> dict[str, Any]:
            return {
                k: v[:n].tolist() if k in self.text else torch.from_numpy(v[:n]) for k, v in store.items()
            }

        return {
            "pos": self.pos,
            "size": n,
            "obs": rows(self.obs),
            "next_obs": rows(self.next_obs),
            "actions": torch.from_numpy(self.actions[:n]),
            "rewards": torch.from_numpy(self.rewards[:n]),
            "discounts": torch.from_numpy(self.discounts[:n]),
            "lags": torch.from_numpy(self.lags[:n]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        n = int(state["size"])
        if not 0 <= n <= self.capacity or set(state["obs"]) != set(self.obs):
            raise BadInput(
                f"the saved replay buffer ({n} rows, keys {sorted(state['obs'])}) does not fit this one "
                f"(capacity {self.capacity}, keys {sorted(self.obs)})"
            )
        arrays = {"actions": state["actions"], "rewards": state["rewards"], "discounts": state["discounts"]}
        for part in ("obs", "next_obs"):
            arrays.update({f"{part}[{k!r}]": v for k, v in state[part].items()})
        short = {name: len(v) for name, v in arrays.items() if len(v) != n}
        if short:  # a short array would be broadcast into n copies of its rows
            raise BadInput(f"the saved replay buffer says it holds {n} rows, but holds {short}")
        for store, saved in ((self.obs, state["obs"]), (self.next_obs, state["next_obs"])):
            for key, value in saved.items():
                store[key][:n] = value if key in self.text else np.asarray(value)
        self.actions[:n] = np.asarray(state["actions"])
        self.rewards[:n] = np.asarray(state["rewards"])
        self.discounts[:n] = np.asarray(state["discounts"])
        self.lags[:n] = np.asarray(state["lags"]) if "lags" in state else 0  # saved before lags were kept
        self.pos, self.size = int(state["pos"]), n
