"""What the trainers may assume about a vector env: the contract a third-party env implements to
get every trainer feature. Each part is optional; a plain gymnasium vector env (CartPole) gets the
defaults and trains as it is.

* **Action chunks.** ``env.metadata["chunk_size"] = K`` says one ``step`` runs a chunk of K
  sub-step actions, ``single_action_space = Box(low, high, (K, D))``; ``None`` says one action
  per step, whatever the action shape. Without that key a 2-d ``Box`` action is read as a chunk.
  (Metadata, not an attribute: gymnasium's vector wrappers forward ``metadata`` but not attributes.)
* **Sub-step detail.** A chunked env reports ``info["chunk_rewards"]`` (float ``[N, K]``) and
  ``info["chunk_valid"]`` (bool ``[N, K]``: the sub-steps that ran; after an episode ends inside a
  chunk the rest is not run). The step's ``reward`` is then only a summary. Without them, sub-step 0
  holds the step's reward and is the only valid one. ``info["chunk_success"]`` (bool ``[N, K]``), the
  env's own success signal per sub-step, is what ``trainers.reward_model`` labels frames with (a
  plain env can give ``info["success"]`` or ``info["is_success"]`` per step instead).
* **Episode statistics.** ``info["episode"]`` with an ``info["_episode"]`` mask (gymnasium's
  ``RecordEpisodeStatistics`` layout, also under ``info["final_info"]``), e.g. ``success``;
  without ``success`` an episode succeeded when it terminated.
* **Start frames.** ``env.initial_frames``: a sequence of start states (each may name its
  ``task``); ``reset(options={"initial_frames": [id per env]})`` starts env i at frame ``ids[i]``,
  and in ``Disabled`` autoreset mode ``options={"reset_mask": mask, "initial_frames": ids}`` resets
  only the masked envs (``ids`` then lists one frame per masked env). GRPO groups, held-out
  evaluation and demo collection use them; without frames they fall back to seeds. An env that
  reports ``info["initial_frame_id"]`` (with its ``_initial_frame_id`` mask) at every (re)start lets
  the collector name each episode's start frame, which the task curriculum (``trainers/curriculum.py``)
  counts successes by.
* **Restart frames.** ``info["restart_frame"]``, per env that ran, a frame that ``reset`` takes to
  continue that env's episode where the step left it (its ``meta["from_restart"]`` true when that
  episode itself began at one): failure restarts (``trainers/restarts.py``) practise from the states
  of failed episodes with them. Ours: LIBERO with ``restart_frames_in_info=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from nets.errors import BadInput


def chunk_size(env: gym.vector.VectorEnv) -> int | None:
    """K when one step of ``env`` runs a chunk of K sub-step actions, else None."""
    space = env.single_action_space
    if "chunk_size" in env.metadata:
        k = env.metadata["chunk_size"]
        if k is not None and not (isinstance(space, gym.spaces.Box) and space.shape[:1] == (k,)):
            raise BadInput(f"env metadata says chunk_size {k}, but its action space is {space}")
        return None if k is None else int(k)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 2:
        return int(space.shape[0])
    return None


def initial_frames(env: gym.vector.VectorEnv) -> Sequence[Any] | None:
    """The env's start frames, or None when it has none (read through vector wrappers)."""
    frames = getattr(env, "initial_frames", None)
    if frames is None:
        frames = getattr(getattr(env, "unwrapped", None), "initial_frames", None)
    return frames if frames is not None and len(frames) > 0 else None


def frame_tasks(env: gym.vector.VectorEnv) -> list[str] | None:
    """The task of every start frame (``frame.task``), or None when there are no frames or they
    do not all say."""
    frames = initial_frames(env)
    if frames is None:
        return None
    tasks = [getattr(frames[i], "task", "") for i in range(len(frames))]
    return tasks if all(tasks) else None


def start_ids(frames: Sequence[Any]) -> list[Any]:
    """Start frames for ``reset(options={"initial_frames": ...})``: integer ids as ``int``, frame
    objects (ours: ``InitialFrame``) as they are."""
    return [int(f) if isinstance(f, int | np.integer) else f for f in frames]


def start_options(frame_ids: Sequence[Any], reset_mask: np.ndarray | None = None) -> dict[str, Any]:
    """``reset`` options that start envs at ``frame_ids`` (ids or frames: ``start_ids``; all envs,
    or the ``reset_mask`` ones)."""
    options: dict[str, Any] = {"initial_frames": start_ids(frame_ids)}
    if reset_mask is not None:
        options["reset_mask"] = np.asarray(reset_mask, bool).copy()
    return options


def chunk_detail(info: dict[str, Any], reward: Any, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-sub-step rewards (0 where not run) and validity, both ``[n, k]``."""
    if "chunk_rewards" not in info and "chunk_valid" not in info:  # one action per step
        rewards, valid = np.zeros((n, k), np.float32), np.zeros((n, k), bool)
        rewards[:, 0], valid[:, 0] = np.asarray(reward, np.float32).reshape(n), True
        return rewards, valid
    rewards = np.asarray(info.get("chunk_rewards", np.zeros((n, k))), np.float32)
    valid = np.asarray(info["chunk_valid"], bool) if "chunk_valid" in info else np.ones((n, k), bool)
    if rewards.shape != (n, k) or valid.shape != (n, k):
        raise BadInput(
            f"info chunk_rewards / chunk_valid have shapes {rewards.shape} / {valid.shape}, expected {(n, k)}"
        )
    return np.where(valid, rewards, 0.0).astype(np.float32), valid.copy()


_RENAME = {"r": "return", "l": "length", "t": None}  # RecordEpisodeStatistics keys


def episode_stats(info: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Env index -> the statistics the env reports for the episode that ended there
    (``info["episode"]`` or ``info["final_info"]["episode"]``; ``r``/``l`` renamed)."""
    for source in (info, info.get("final_info") or {}):
        episode, mask = source.get("episode"), source.get("_episode")
        if not isinstance(episode, dict) or mask is None:
            continue
        out: dict[int, dict[str, float]] = {}
        for i in np.flatnonzero(np.asarray(mask, bool)):
            stats = {}
            for key, values in episode.items():
                name = _RENAME.get(key, key)
                if name is not None and not key.startswith("_"):
                    stats[name] = float(np.asarray(values)[i])
            out[int(i)] = stats
        return out
    return {}


def episode_success(stats: dict[str, float], terminated: bool) -> bool:
    """An episode's success: what the env reports, else whether it terminated."""
    return bool(stats["success"]) if "success" in stats else bool(terminated)
