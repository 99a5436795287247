"""Evaluate a policy on a vector env: one episode per env per round, optionally with an mp4."""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np

from policies.base import ActionChunkPolicy
from trainers.rollout import Collector, episode_summary

MAX_VIDEO_ENVS = 4  # envs shown side by side in the eval video


def evaluate(
    policy: ActionChunkPolicy,
    env: gym.vector.VectorEnv,
    num_episodes: int,
    *,
    seed: int = 0,
    deterministic: bool = True,
    max_steps: int = 100_000,
    video_path: str | Path | None = None,
    video_fps: int = 20,
) -> dict[str, float]:
    """Mean episode statistics over ``num_episodes`` episodes.

    Every round resets all envs (seeds ``seed + episode index``) and keeps the first episode of
    each, so short episodes are not over-represented. With ``video_path`` the first round is
    recorded from ``env.render()`` (envs made with ``render_mode="rgb_array"``), up to four envs
    side by side. Returns ``return``, ``length``, ``episodes`` and whatever the env reports
    (``success``, ``success_once``...).
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    n = env.num_envs
    collector = Collector(env, policy, bootstrap="none", reset_finished=False)
    episodes: list[dict[str, float]] = []
    frames: list[np.ndarray] = []
    for start in range(0, num_episodes, n):
        collector.reset(seed=seed + start)
        record = video_path is not None and start == 0 and _grab(env, frames)
        rollout = collector.collect(
            max_steps,
            deterministic=deterministic,
            until_all_done=True,
            on_step=(lambda: _grab(env, frames)) if record else None,
        )
        first: dict[int, dict[str, float]] = {}
        for ep in rollout.episodes:  # in step order: the first one seen per env is its first episode
            first.setdefault(int(ep["env"]), ep)
        episodes += [first[i] for i in sorted(first)][: num_episodes - start]
    if frames and video_path is not None:
        write_video(video_path, frames, video_fps)
    return episode_summary(episodes)


def _grab(env: gym.vector.VectorEnv, frames: list[np.ndarray]) -> bool:
    """Append the current frame of up to four envs, side by side; False if the env cannot render."""
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
    frames.append(np.concatenate([np.asarray(im, np.uint8) for im in list(images)[:MAX_VIDEO_ENVS]], axis=1))
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
