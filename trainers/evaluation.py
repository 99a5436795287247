"""Evaluate a policy on a vector env: one episode per env per round, optionally with an mp4 grid."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from nets.errors import BadInput
from policies.base import ActionChunkPolicy
from trainers import parallel
from trainers.env_contract import initial_frames, start_options
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
    frame_ids: Sequence[int] | None = None,
    progress: bool = False,
    shard: tuple[int, int] = (0, 1),
) -> list[dict[str, Any]]:
    """The statistics of ``num_episodes`` episodes, one dict each.

    Envs with ``initial_frames`` (this project's) play ``frame_ids`` (default: the first
    ``num_episodes`` of a permutation of all frames drawn with ``seed``, so ``num_episodes =
    len(initial_frames)`` runs each frame once); each episode then also has ``frame`` (its id) and
    ``task``. In DISABLED autoreset mode an env that finishes starts the next frame at once (no env
    waits for the slowest one), frames in id order so that consecutive episodes of an env mostly
    share a task (LIBERO then reuses the built scene). Other envs play rounds: every round resets
    all envs with seeds ``seed + episode index`` and keeps each env's first episode. With
    ``video_path`` the first episode of up to 8 envs is recorded from ``env.render()`` (envs made
    with ``render_mode="rgb_array"``) as a grid. ``progress`` shows a bar with the success so far.

    ``shard=(rank, world_size)``: play only this rank's contiguous share of those episodes (the
    same frames, or the same seeds ``seed + episode index``); the shares of all ranks together are
    the single-process episodes, so a deterministic policy gives the same results (for envs that
    seed env i of a reset with ``seed + i``, as gymnasium's Sync/Async vector envs do).
    """
    if num_episodes < 1:
        raise BadInput(f"num_episodes must be >= 1, got {num_episodes}")
    frames = initial_frames(env)
    if frame_ids is None and frames is not None:
        order = np.random.default_rng(seed).permutation(len(frames))
        frame_ids = [int(order[i % len(order)]) for i in range(num_episodes)]
    elif frame_ids is not None:
        if frames is None:
            raise BadInput("frame_ids needs an env with initial_frames (this project's envs)")
        frame_ids = [int(i) for i in frame_ids][:num_episodes]
        num_episodes = len(frame_ids)
    share = parallel.shard(num_episodes, *shard)
    if frame_ids is not None:
        frame_ids = frame_ids[share.start : share.stop]
    elif shard[1] > 1:  # episode j of the whole evaluation is reset with seed + j
        seed += share.start
    num_episodes = len(share)
    if num_episodes == 0:
        return []
    collector = Collector(env, policy, bootstrap="none", reset_finished=False)
    bar = _bar(num_episodes, progress)
    recorder = _VideoRecorder(env) if video_path is not None else None
    try:
        if frame_ids is not None and collector.autoreset_mode == AutoresetMode.DISABLED:
            episodes = _refill(
                collector, sorted(frame_ids), frames, seed, deterministic, max_steps, recorder, bar
            )
        else:
            episodes = _rounds(
                collector, frame_ids, frames, num_episodes, seed, deterministic, max_steps, recorder, bar
            )
    finally:
        if bar is not None:
            bar.close()
    if recorder is not None and recorder.images and video_path is not None:
        write_video(video_path, recorder.images, video_fps)
    return episodes


def _refill(
    collector: Collector,
    ids: list[int],
    frames: Any,
    seed: int,
    deterministic: bool,
    max_steps: int,
    recorder: _VideoRecorder | None,
    bar: Any,
) -> list[dict[str, Any]]:
    """Frames ``ids`` played as a queue: a finished env takes the next frame. A reset holds up every
    env (one call to the vector env), so finished envs wait until they are half of the envs (or
    the only ones left) and are reset together, in parallel."""
    n = collector.num_envs
    playing = [ids[i % len(ids)] for i in range(n)]  # more envs than frames: the extra ones idle
    busy = np.arange(n) < len(ids)
    queue = ids[n:]
    collector.reset(seed=seed, options=start_options(playing))
    if recorder is not None:
        recorder.start(min(n, len(ids)))
    steps = np.zeros(n, np.int64)
    idle = np.zeros(n, bool)  # finished, waiting for the next frame
    episodes: list[dict[str, Any]] = []
    while busy.any():  # (after a step with no env busy, the idle ones were reset)
        rollout = collector.collect(1, deterministic=deterministic)
        if recorder is not None:
            recorder.grab()
        steps += busy
        ended = np.zeros(n, bool)
        for ep in rollout.episodes:
            i = int(ep["env"])
            if busy[i]:
                ended[i] = True
                episodes.append(_with_frame(ep, playing[i], frames))
        ended |= busy & (steps >= max_steps)  # never ends on its own: counted as unfinished
        if recorder is not None:
            recorder.freeze(ended)
        busy &= ~ended
        idle |= ended
        restart = np.flatnonzero(idle)[: len(queue)]
        if len(restart) and (2 * idle.sum() >= n or not busy.any()):
            mask = np.zeros(n, bool)
            mask[restart] = True
            for i in restart:
                playing[i] = queue.pop(0)
            collector.reset(options=start_options([playing[i] for i in restart], reset_mask=mask))
            busy[restart], idle[restart], steps[restart] = True, False, 0
        _advance(bar, episodes, int(ended.sum()))
    return episodes


def _rounds(
    collector: Collector,
    frame_ids: list[int] | None,
    frames: Any,
    num_episodes: int,
    seed: int,
    deterministic: bool,
    max_steps: int,
    recorder: _VideoRecorder | None,
    bar: Any,
) -> list[dict[str, Any]]:
    """Rounds of all envs reset together; the first episode of each env counts."""
    n = collector.num_envs
    episodes: list[dict[str, Any]] = []
    for start in range(0, num_episodes, n):
        ids = None
        if frame_ids is not None:
            ids = [frame_ids[(start + i) % len(frame_ids)] for i in range(n)]
            collector.reset(seed=seed + start, options=start_options(ids))
        else:
            collector.reset(seed=seed + start)
        record = recorder is not None and start == 0 and recorder.start(n)
        rollout = collector.collect(
            max_steps,
            deterministic=deterministic,
            until_all_done=True,
            on_step=recorder.grab if record else None,
        )
        first: dict[int, dict[str, Any]] = {}
        for ep in rollout.episodes:  # in step order: the first one seen per env is its first episode
            first.setdefault(int(ep["env"]), ep)
        new = [
            _with_frame(first[i], ids[i], frames) if ids is not None else dict(first[i])
            for i in sorted(first)[: num_episodes - start]
        ]
        episodes += new
        _advance(bar, episodes, len(new))
    return episodes


def _with_frame(ep: dict[str, Any], frame_id: int, frames: Any) -> dict[str, Any]:
    return {**ep, "frame": frame_id, "task": getattr(frames[frame_id], "task", "")}


def _bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(
        total=total, unit="episode", desc="evaluate", dynamic_ncols=True, mininterval=1.0, file=sys.stderr
    )


def _advance(bar: Any, episodes: list[dict[str, Any]], count: int) -> None:
    if bar is None or count == 0:
        return
    key = "success" if episodes and "success" in episodes[0] else "return"
    values = [float(ep.get(key, 0.0)) for ep in episodes]
    bar.set_postfix({key: f"{np.mean(values):.3g}"}, refresh=False)
    bar.update(count)


class _VideoRecorder:
    """Grid frames of the first episode of up to ``MAX_VIDEO_ENVS`` envs; an env whose first
    episode ended keeps showing its last frame. Disables itself if the env cannot render."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        self.env = env
        self.images: list[np.ndarray] = []
        self.last: list[np.ndarray] = []
        self.frozen = np.zeros(0, bool)
        self.on = False

    def start(self, count: int) -> bool:
        self.frozen = np.zeros(min(count, MAX_VIDEO_ENVS), bool)
        self.on = True
        self.grab()
        return self.on

    def grab(self, info: dict[str, Any] | None = None) -> None:
        """Add the current frame (``info``, the step's, is not needed: ``Collector.collect``'s hook)."""
        if not self.on:
            return
        try:
            rendered = self.env.render()
        except Exception as e:  # a missing renderer (pygame, GL) must not stop training
            warnings.warn(f"eval video disabled: env.render() failed ({type(e).__name__}: {e})", stacklevel=2)
            self.on = False
            return
        if rendered is None:
            warnings.warn(
                "eval video disabled: env.render() returned None (render_mode not rgb_array?)", stacklevel=2
            )
            self.on = False
            return
        if isinstance(rendered, np.ndarray) and rendered.ndim == 3:
            rendered = [rendered]
        current = [np.asarray(im, np.uint8) for im in list(rendered)[: len(self.frozen)]]
        if not self.last:
            self.last = current
        self.last = [old if self.frozen[i] else current[i] for i, old in enumerate(self.last)]
        self.images.append(video_grid(self.last))

    def freeze(self, ended: np.ndarray) -> None:
        """Envs whose first episode just ended stop changing in the video; all frozen: stop."""
        self.frozen |= ended[: len(self.frozen)]
        if self.frozen.all():
            self.on = False


def video_grid(images: list[np.ndarray], columns: int = VIDEO_COLUMNS) -> np.ndarray:
    """HxWx3 images (same size) tiled in rows of ``columns``; a short last row is padded black."""
    columns = min(columns, len(images))
    rows = -(-len(images) // columns)
    blank = np.zeros_like(images[0])
    tiles = list(images) + [blank] * (rows * columns - len(images))
    return np.concatenate(
        [np.concatenate(tiles[r * columns : (r + 1) * columns], axis=1) for r in range(rows)], axis=0
    )


def write_video(path: str | Path, frames: list[np.ndarray], fps: int = 20) -> Path:
    """Write HxWx3 uint8 frames as an H.264 mp4, atomically (``trainers.files.write_atomic``)."""
    import imageio.v3 as iio

    from trainers.files import write_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    video = iio.imwrite(
        "<bytes>", np.stack(frames), fps=fps, codec="libx264", macro_block_size=1, extension=".mp4"
    )
    return write_atomic(path, video)
