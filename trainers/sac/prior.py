"""Prior data for SAC (RLPD): demonstrations or an earlier SAC run's transitions in a replay buffer.

Demonstrations come through ``trainers.datasets.load_demos`` (our HDF5, LIBERO HDF5, LeRobot v3).
Demos recorded one action per step are cut into the env's K-chunks at every start step: the starts
``j, j + K, j + 2K, ...`` of an episode form one sequence of chunk-steps (K interleaved sequences),
which goes through the same ``NStepWriter`` as online data. A successful episode's last chunk
terminates; a failed one's last chunk is dropped (the file has no observation after it to bootstrap
from), so the chunk before it ends the sequence as a truncation. Everything is checked against the
env's spaces before any env step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from nets.errors import BadInput
from trainers.sac.replay import ChunkStep, NStepWriter, ReplayBuffer, Transition


def load_prior(
    path: str | Path,
    observation_space: spaces.Space,
    action_shape: tuple[int, int],
    gamma: float,
    n_step: int,
) -> ReplayBuffer:
    """A replay buffer (``prior=True``) of the transitions in ``path``: a demonstrations dataset,
    or an earlier SAC run directory / checkpoint (its replay buffer)."""
    path = Path(path)
    if path.suffix == ".pt" or (path.is_dir() and (path / "checkpoints").is_dir()):
        return _finite(_from_run(path, observation_space, action_shape), path)
    from trainers.datasets import load_demos

    demos = load_demos(path)
    transitions = demo_transitions(demos.episodes, observation_space, action_shape, gamma, n_step, path)
    if not transitions:
        raise BadInput(f"{path}: no transition could be made from its {len(demos.episodes)} episodes")
    buffer = ReplayBuffer(observation_space, action_shape, len(transitions), prior=True)
    buffer.add(transitions)
    return _finite(buffer, path)


def _finite(buffer: ReplayBuffer, source: Any) -> ReplayBuffer:
    """``buffer`` if every number in it is finite; else a ``ValueError`` naming the field and how
    many rows hold NaN or inf (one would reach every critic target that samples it)."""
    n = len(buffer)
    fields = {"actions": buffer.actions, "rewards": buffer.rewards, "discounts": buffer.discounts}
    for name, store in (("obs", buffer.obs), ("next_obs", buffer.next_obs)):
        fields.update({f"{name}[{k!r}]": v for k, v in store.items() if k not in buffer.text})
    for name, values in fields.items():
        rows = values[:n].reshape(n, -1)
        if np.issubdtype(rows.dtype, np.floating) and not np.isfinite(rows).all():
            bad = int((~np.isfinite(rows)).any(1).sum())
            raise BadInput(f"{source}: prior data {name} holds NaN or inf in {bad} of {n} transitions")
    return buffer


def demo_transitions(
    episodes: list[Any],
    observation_space: spaces.Space,
    action_shape: tuple[int, int],
    gamma: float,
    n_step: int,
    source: Any = "prior data",
) -> list[Transition]:
    """n-step chunk transitions of ``episodes`` (``trainers.datasets.demos.Episode``) for an env with these
    spaces and chunks of ``action_shape = (K, D)``."""
    k, d = action_shape
    keys = list(observation_space.spaces) if isinstance(observation_space, spaces.Dict) else ["obs"]
    if not episodes:
        return []
    first = episodes[0]
    stored_k, stored_d = first.actions.shape[1:]
    if stored_d != d:
        raise BadInput(f"{source}: actions of {stored_d} dimensions; the env takes {d}")
    if stored_k not in (1, k):
        raise BadInput(
            f"{source}: chunks of {stored_k} actions; the env's chunk size is {k} (demos recorded one "
            "action per step can be cut into any chunk size)"
        )
    parts = (
        observation_space.spaces if isinstance(observation_space, spaces.Dict) else {"obs": observation_space}
    )
    for key in keys:
        if isinstance(parts[key], spaces.Text):
            continue
        if key not in first.obs:
            raise BadInput(
                f"{source}: the env observes {keys}; the demonstrations have no {key!r} "
                f"(they have {list(first.obs)})"
            )
        if tuple(first.obs[key].shape[1:]) != tuple(parts[key].shape):
            raise BadInput(
                f"{source}: observation {key!r} has shape {first.obs[key].shape[1:]}, "
                f"the env's {parts[key].shape}"
            )
    out: list[Transition] = []
    for ep in episodes:
        obs = [_obs_at(ep, keys, parts, t) for t in range(len(ep.actions))]
        if stored_k == k:  # chunks as recorded: one sequence
            sequences = [
                [(c, ep.actions[c], ep.rewards[c], ep.valid[c], c + 1) for c in range(len(ep.actions))]
            ]
        else:  # one action per step, cut into K-chunks at every start
            a, r, v = ep.actions[:, 0], ep.rewards[:, 0], ep.valid[:, 0]
            length = int(v.sum())
            sequences = []
            for offset in range(min(k, length)):
                seq = []
                for s in range(offset, length, k):
                    inside = np.arange(s, s + k) < length
                    idx = np.minimum(np.arange(s, s + k), length - 1)
                    chunk = np.where(inside[:, None], a[idx], 0.0).astype(np.float32)
                    seq.append((s, chunk, np.where(inside, r[idx], 0.0), inside, s + k))
                sequences.append(seq)
        end = len(obs)
        for seq in sequences:
            kept = [step for step in seq if step[4] < end or ep.success]  # a next obs, or a termination
            writer = NStepWriter(1, n_step, gamma)
            for i, (t, chunk, rewards, valid, nxt) in enumerate(kept):
                terminated = nxt >= end
                truncated = not terminated and i == len(kept) - 1
                next_obs = obs[min(nxt, end - 1)]
                step = ChunkStep(
                    obs[t], np.asarray(chunk, np.float32), np.asarray(rewards), np.asarray(valid)
                )
                out += writer.push(0, step, next_obs, terminated, truncated)
    return out


def _obs_at(ep: Any, keys: list[str], parts: dict[str, spaces.Space], t: int) -> dict[str, Any]:
    return {
        key: ep.instruction
        if isinstance(parts[key], spaces.Text)
        else np.asarray(ep.obs[key][t], parts[key].dtype)
        for key in keys
    }


def _from_run(path: Path, observation_space: spaces.Space, action_shape: tuple[int, int]) -> ReplayBuffer:
    from trainers import checkpoint as ckpt

    where, data = ckpt.latest_checkpoint(path)
    if data.get("algo") != "sac" or "buffer" not in data.get("extra", {}):
        raise BadInput(f"{where}: prior data from a run must be a SAC checkpoint with its replay buffer")
    state = data["extra"]["buffer"]
    buffer = ReplayBuffer(observation_space, action_shape, max(int(state["size"]), 1), prior=True)
    if tuple(state["actions"].shape[1:]) != tuple(action_shape):
        raise BadInput(
            f"{where}: transitions of chunk shape {tuple(state['actions'].shape[1:])}, "
            f"the env's {action_shape}"
        )
    buffer.load_state_dict(state)
    return buffer
