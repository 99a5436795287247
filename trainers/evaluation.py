"""Evaluate a policy on a vector env: one episode per env per round, optionally with an mp4 grid."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from policies.base import ActionChunkPolicy
from trainers.rollout import Collector, episode_summary

MAX_VIDEO_ENVS = 8  # envs shown in the eval video: one row of up to 4, two rows beyond that
VIDEO_COLUMNS = 4


def evaluate(
    policy: ActionChunkPolicy,
    env: gym.vector.VectorEnv,
    num_episodes: int,
    **kwargs: Any,
) -> dict[str, float]:
    """Mean episode statistics of ``evaluate_episodes`` (same arguments): ``return``,
    ``length``, ``episodes`` and whatever the env reports (``success``, ``success_once``...)."""
    return episode_summary(evaluate_episodes(policy, env, num_episodes, **kwargs))


def evaluate_episodes(
    policy: ActionChunkPolicy,
    env: gym.vector.VectorEnv,
    num_episodes: int,
    *,
    seed: int = 0,
    deterministic: bool = True,
    max_steps: int = 100_000,
    video_path: str | Path | None = None,
    video_fps: int = 20,
) -> list[dict[str, Any]]:
    """The statistics of ``num_episodes`` episodes, one dict each.

    Every round resets all envs and keeps the first episode of each, so short episodes are not
    over-represented. Envs with ``initial_frames`` (this project's) start from a permutation of
    those frames drawn with ``seed``, so ``num_episodes = len(initial_frames)`` runs each frame
    once; each episode then also has ``frame`` (its id) and ``task``. Other envs are reset with
    seeds ``seed + episode index``. With ``video_path`` the first round is recorded from
    ``env.render()`` (envs made with ``render_mode="rgb_array"``), up to 8 envs in a grid.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    n = env.num_envs
    frames = getattr(env, "initial_frames", None) or None
    order = np.random.default_rng(seed).permutation(len(frames)) if frames is not None else None
    collector = Collector(env, policy, bootstrap="none", reset_finished=False)
    episodes: list[dict[str, Any]] = []
    images: list[np.ndarray] = []
    for start in range(0, num_episodes, n):
        ids = None
        if order is not None:
            ids = [int(order[(start + i) % len(order)]) for i in range(n)]
            collector.reset(seed=seed + start, options={"initial_frames": ids})
        else:
            collector.reset(seed=seed + start)
        record = video_path is not None and start == 0 and _grab(env, images)
        rollout = collector.collect(
            max_steps,
            deterministic=deterministic,
            until_all_done=True,
            on_step=(lambda: _grab(env, images)) if record else None,
        )
        first: dict[int, dict[str, Any]] = {}
        for ep in rollout.episodes:  # in step order: the first one seen per env is its first episode
            first.setdefault(int(ep["env"]), ep)
        for i in sorted(first)[: num_episodes - start]:
            ep = dict(first[i])
            if ids is not None:
                ep["frame"] = ids[i]
                ep["task"] = getattr(frames[ids[i]], "task", "")
            episodes.append(ep)
    if images and video_path is not None:
        write_video(video_path, images, video_fps)
    return episodes


def video_grid(images: list[np.ndarray], columns: int = VIDEO_COLUMNS) -> np.ndarray:
    """HxWx3 images (same size) tiled in rows of ``columns``; a short last row is padded black."""
    columns = min(columns, len(images))
    rows = -(-len(images) // columns)
    blank = np.zeros_like(images[0])
    tiles = list(images) + [blank] * (rows * columns - len(images))
    return np.concatenate(
        [np.concatenate(tiles[r * columns : (r + 1) * columns], axis=1) for r in range(rows)], axis=0
    )


def _grab(env: gym.vector.VectorEnv, frames: list[np.ndarray]) -> bool:
    """Append the current frame of up to 8 envs as a grid; False if the env cannot render."""
    try:
        images = env.render()
    except Exception as e:  # a missing renderer (pygame, GL) must not stop training
        warnings.warn(f"eval video disabled: env.render() failed ({type(e).__name__}: {e})", stacklevel=2)
        return False
    if images is None:
        warnings.warn(
            "eval video disabled: env.render() returned None (render_mode not rgb_array?)", stacklevel=2
        )
        return False
    if isinstance(images, np.ndarray) and images.ndim == 3:
        images = [images]
    frames.append(video_grid([np.asarray(im, np.uint8) for im in list(images)[:MAX_VIDEO_ENVS]]))
    return True


def write_video(path: str | Path, frames: list[np.ndarray], fps: int = 20) -> Path:
    """Write HxWx3 uint8 frames as an H.264 mp4, atomically (temp name, then rename)."""
    import imageio.v3 as iio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.partial.mp4")
    iio.imwrite(tmp, np.stack(frames), fps=fps, codec="libx264", macro_block_size=1, extension=".mp4")
    tmp.replace(path)
    return path
