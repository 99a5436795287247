"""Write ``Demos`` as a LeRobotDataset v3.0 folder (layout: ``lerobot_format``).

One frame per executed step: LeRobot datasets pair every action with the observation it was chosen
from, so the demos must have been recorded one action per step (chunk_size 1: ``trainers.demos``
with ``--env-kwargs '{"chunk_size": null}'``); chunked demos only have an observation per chunk.

What goes where:

* ``image`` -> ``observation.images.image``, ``wrist_image`` -> ``observation.images.image2``,
  ``proprio`` -> ``observation.state`` (the names of HuggingFaceVLA/libero and of LeRobot's LIBERO
  env), the action -> ``action`` (env units), rewards -> ``next.reward``, the last step ->
  ``next.done`` (and ``next.success`` if the episode succeeded), the instruction -> the frame's task;
  ``sim_states`` (when the demos have them) -> ``sim_state``. Other observation keys only when
  asked for (``obs_keys``), as ``observation.<key>`` (``observation.images.<key>`` for images):
  LeRobot policies take every ``observation.*`` feature as an input, and e.g. ``task_state`` is
  privileged information.
* Images keep our orientation (upright, like the LIBERO LeRobot datasets) and go to AV1 videos
  (LeRobot's default encoding) or, with ``video=False``, to lossless PNGs inside the parquet files.
* ``info.json`` also has a ``vla_gym`` entry (our key -> feature names, the demos' attributes),
  and the episodes table ``vla_gym/task`` and ``vla_gym/initial_frame``; LeRobot ignores them.

Data and video files roll over at their size targets (a new chunk folder every ``chunks_size``
files); the episodes metadata is one file. The folder appears complete or not at all: everything
is written into a staging folder beside ``out`` and renamed at the end.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nets.errors import BadInput
from nets.files import atomic_folder, check_output, only_entries
from trainers.datasets import lerobot_format as fmt
from trainers.datasets import stats as st
from trainers.datasets.demos import Demos, Episode
from trainers.datasets.extras import pandas, pyarrow
from trainers.datasets.video import CODEC_NAMES, DEFAULT_CODEC, VideoWriter, concat_videos

STANDARD_KEYS = ("image", "wrist_image", "proprio")


@dataclass
class _Feature:
    key: str  # ours: an observation key, or "action", "reward", "done", "success", "sim_state"
    name: str  # LeRobot's
    kind: str  # "video", "image" (PNG in the parquet) or "vector"
    spec: dict[str, Any]  # the info.json entry


@dataclass
class _Frames:
    """One episode as LeRobot frames: every array ``[T, ...]``."""

    columns: dict[str, np.ndarray]  # by our key (see _Feature.key)
    task: str
    source: Episode


def _is_image(value: np.ndarray) -> bool:
    return value.dtype == np.uint8 and value.ndim == 4 and value.shape[-1] == 3


def _episode_frames(n: int, ep: Episode, obs_keys: list[str]) -> _Frames:
    if ep.actions.ndim != 3 or ep.actions.shape[1] != 1:
        raise BadInput(
            f"episode {n}: LeRobot datasets hold one observation per action, these demos have chunks of "
            f"{ep.actions.shape[1] if ep.actions.ndim == 3 else '?'} actions with one observation per "
            "chunk: record the demos with chunk_size 1 (--env-kwargs '{\"chunk_size\": null}')"
        )
    keep = ep.valid[:, 0].astype(bool)
    if not keep.any():
        raise BadInput(f"episode {n} has no executed step")
    columns = {key: ep.obs[key][keep] for key in obs_keys}
    columns["action"] = ep.actions[keep, 0]
    columns["reward"] = ep.rewards[keep, 0].astype(np.float32)
    t = int(keep.sum())
    columns["done"] = np.arange(t) == t - 1
    columns["success"] = columns["done"] & bool(ep.success)
    if ep.sim_states is not None:
        columns["sim_state"] = np.asarray(ep.sim_states, np.float64)[keep]
    lengths = {k: len(v) for k, v in columns.items()}
    if len(set(lengths.values())) != 1:
        raise BadInput(f"episode {n}: arrays of different lengths {lengths}")
    task = ep.instruction or ep.task
    if not task:
        raise BadInput(
            f"episode {n} has neither an instruction nor a task: LeRobot frames need a task string"
        )
    return _Frames(columns, task, ep)


def _vector_names(key: str, dim: int, meta: dict[str, Any]) -> list[str]:
    libero = "libero" in str(meta.get("env", "")).lower() or meta.get("format") == "libero-hdf5"
    if libero and key == "proprio" and dim == len(fmt.LIBERO_STATE_NAMES):
        return list(fmt.LIBERO_STATE_NAMES)
    if libero and key == "action" and dim == len(fmt.LIBERO_ACTION_NAMES):
        return list(fmt.LIBERO_ACTION_NAMES)
    return [f"{key}_{i}" for i in range(dim)]


def _features(
    first: _Frames, obs_keys: list[str], video: bool, fps: float, codec: str, meta: dict
) -> list[_Feature]:
    out = []
    for key, value in first.columns.items():
        if key in obs_keys:
            if _is_image(value):
                name = fmt.OBS_ALIASES[key][0] if key in fmt.OBS_ALIASES else f"observation.images.{key}"
            else:
                name = fmt.OBS_ALIASES[key][0] if key in fmt.OBS_ALIASES else f"observation.{key}"
        else:
            name = {"action": "action", "reward": fmt.REWARD, "done": fmt.DONE, "success": fmt.SUCCESS}.get(
                key, fmt.SIM_STATE
            )
        if _is_image(value):
            h, w = value.shape[1:3]
            spec: dict[str, Any] = {"dtype": "video" if video else "image", "shape": [h, w, 3]}
            spec["names"] = list(fmt.IMAGE_NAMES)
            if video:
                spec["info"] = {
                    "video.height": h,
                    "video.width": w,
                    "video.codec": CODEC_NAMES[codec],
                    "video.pix_fmt": "yuv420p",
                    "video.is_depth_map": False,
                    "video.fps": fps,
                    "video.channels": 3,
                    "has_audio": False,
                }
            out.append(_Feature(key, name, "video" if video else "image", spec))
            continue
        if value.ndim > 2:
            raise BadInput(
                f"observation {key!r} has frames of shape {value.shape[1:]}: LeRobot export takes images "
                "(uint8 H x W x 3) and vectors"
            )
        dim = 1 if value.ndim == 1 else value.shape[1]
        names = None if value.ndim == 1 else _vector_names(key, dim, meta)
        spec = {"dtype": str(value.dtype), "shape": [dim], "names": names}
        out.append(_Feature(key, name, "vector", spec))
    return out


def _png(image: np.ndarray) -> bytes:
    import imageio.v3 as iio

    return iio.imwrite("<bytes>", image, extension=".png")


def _column(pa: Any, feature: _Feature, values: np.ndarray) -> Any:
    if feature.kind == "image":
        struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        return pa.array([{"bytes": _png(img), "path": None} for img in values], type=struct)
    if feature.spec["shape"] == [1]:  # LeRobot: a shape-(1,) feature is a scalar column
        return pa.array(values.reshape(len(values)))
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


class _DataFiles:
    """``data/`` parquet files, a new one when the current would pass the size target."""

    def __init__(self, root: Path, limit_mb: float, chunks_size: int) -> None:
        self.root, self.limit, self.chunks_size = root, limit_mb * 1024 * 1024, chunks_size
        self.index = (0, 0)
        self.tables: list[Any] = []
        self.bytes = 0

    def add(self, table: Any) -> tuple[int, int]:
        if self.tables and self.bytes + table.nbytes > self.limit:
            self.flush()
            self.index = fmt.next_file(*self.index, self.chunks_size)
        self.tables.append(table)
        self.bytes += table.nbytes
        return self.index

    def flush(self) -> None:
        if not self.tables:
            return
        pa, pq = pyarrow()
        path = self.root / fmt.DATA_PATH.format(chunk_index=self.index[0], file_index=self.index[1])
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(self.tables), path, compression="snappy")
        self.tables, self.bytes = [], 0


class _VideoFiles:
    """``videos/<key>/`` mp4 files of one feature. Each episode is encoded on its own; the episodes
    of one file are joined when the next one would pass the size target (as LeRobot decides it:
    file size so far + the episode's), or at the end."""

    def __init__(
        self, root: Path, feature: _Feature, fps: float, codec: str, limit_mb: float, chunks: int
    ) -> None:
        self.root, self.feature, self.fps, self.codec = root, feature, fps, codec
        self.limit, self.chunks_size = limit_mb * 1024 * 1024, chunks
        self.index = (0, 0)
        self.segments: list[Path] = []  # the current file's episodes, encoded
        self.bytes = self.frames = self.encoded = 0
        self.scratch = root / ".segments" / feature.name

    def add(self, frames: np.ndarray) -> dict[str, Any]:
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.encoded += 1
        segment = self.scratch / f"episode-{self.encoded:06d}.mp4"
        writer = VideoWriter(segment, frames.shape[1], frames.shape[2], self.fps, self.codec)
        try:
            writer.write(frames)
            writer.close()
        except BaseException:
            writer.abort()
            raise
        size = segment.stat().st_size
        if self.segments and self.bytes + size >= self.limit:  # this episode starts the next file
            self.close()
            self.index = fmt.next_file(*self.index, self.chunks_size)
        start = self.frames
        self.segments.append(segment)
        self.bytes += size
        self.frames += len(frames)
        prefix = f"videos/{self.feature.name}"
        return {
            f"{prefix}/chunk_index": self.index[0],
            f"{prefix}/file_index": self.index[1],
            f"{prefix}/from_timestamp": start / self.fps,
            f"{prefix}/to_timestamp": self.frames / self.fps,
        }

    def close(self) -> None:
        """Join the current file's episodes into its place in ``videos/``."""
        if self.segments:
            rel = fmt.VIDEO_PATH.format(
                video_key=self.feature.name, chunk_index=self.index[0], file_index=self.index[1]
            )
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            concat_videos(self.segments, self.root / rel)
        self.segments, self.bytes, self.frames = [], 0, 0


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))


def is_lerobot_folder(folder: Path) -> bool:
    """Whether ``folder`` is a LeRobot dataset (its ``meta/info.json``) holding nothing else at the
    top: the only folder ``--overwrite`` may replace."""
    own = {"meta", "data", "videos", "images", "README.md", ".gitattributes"}
    return only_entries(folder, own) and (folder / fmt.INFO_PATH).is_file()


def write_lerobot(
    demos: Demos,
    out: str | Path,
    *,
    fps: float = 20,
    video: bool = True,
    codec: str = DEFAULT_CODEC,
    obs_keys: list[str] | None = None,
    robot_type: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    chunks_size: int = fmt.CHUNKS_SIZE,
    data_files_size_in_mb: float = fmt.DATA_FILES_SIZE_MB,
    video_files_size_in_mb: float = fmt.VIDEO_FILES_SIZE_MB,
) -> Path:
    """Write ``demos`` (recorded one action per step) as a LeRobot v3.0 dataset folder ``out``.

    ``fps`` is the control rate (LIBERO: 20 Hz). ``obs_keys`` picks the observations (default: those
    of ``image``, ``wrist_image`` and ``proprio`` the demos have, else all). See the module doc.
    """
    pa, pq = pyarrow()
    pd = pandas()
    out = check_output(out, overwrite=overwrite, ours=is_lerobot_folder, what="a LeRobot dataset")
    if not demos.episodes:
        raise BadInput("no episodes to export")
    if not fps > 0:
        raise BadInput(f"fps must be > 0, got {fps}")
    fps = int(fps) if float(fps).is_integer() else float(fps)
    available = list(demos.episodes[0].obs)
    if obs_keys is None:
        obs_keys = [k for k in STANDARD_KEYS if k in available] or available
    missing = [k for k in obs_keys if k not in available]
    if missing:
        raise KeyError(f"observation keys {missing} are not in the demos (they have {available})")
    frames = [_episode_frames(n, ep, obs_keys) for n, ep in enumerate(demos.episodes)]
    features = _features(frames[0], obs_keys, video, fps, codec, demos.meta)
    for n, ep in enumerate(frames):
        shapes = {f.key: ep.columns[f.key].shape[1:] if f.key in ep.columns else None for f in features}
        want = {f.key: frames[0].columns[f.key].shape[1:] for f in features}
        if shapes != want or set(ep.columns) != set(frames[0].columns):
            raise BadInput(f"episode {n} has observations {shapes}, episode 0 has {want}: they must match")

    out.parent.mkdir(parents=True, exist_ok=True)
    # staging folder, fsynced, then swapped in: on overwrite the old folder goes only once the new
    # one is complete (nets.files.atomic_folder)
    with atomic_folder(out) as staging:
        videos = {
            f.key: _VideoFiles(staging, f, fps, codec, video_files_size_in_mb, chunks_size)
            for f in features
            if f.kind == "video"
        }
        _write(staging, demos, frames, features, videos, fps, robot_type, chunks_size, data_files_size_in_mb,
               video_files_size_in_mb, progress, pa, pq, pd)  # fmt: skip
    return out


def _write(staging: Path, demos: Demos, frames: list[_Frames], features: list[_Feature],
           videos: dict[str, _VideoFiles], fps: float, robot_type: str | None, chunks_size: int,
           data_mb: float, video_mb: float, progress: bool, pa: Any, pq: Any, pd: Any) -> None:  # fmt: skip
    from tqdm.auto import tqdm

    tasks: dict[str, int] = {}
    data = _DataFiles(staging, data_mb, chunks_size)
    episode_rows: list[dict[str, Any]] = []
    # whole-dataset statistics: vectors from all their values, images merged from the episodes'
    vectors: dict[str, list[np.ndarray]] = {f.name: [] for f in features if f.kind == "vector"}
    image_parts: dict[str, list[dict]] = {f.name: [] for f in features if f.kind != "vector"}
    index_columns: dict[str, list[np.ndarray]] = {k: [] for k in fmt.INDEX_FEATURES}
    total = 0
    for n, ep in enumerate(tqdm(frames, desc="LeRobot export", disable=not progress, unit="episode")):
        t = len(ep.columns["action"])
        task_index = tasks.setdefault(ep.task, len(tasks))
        index = {
            "timestamp": (np.arange(t) / fps).astype(np.float32),
            "frame_index": np.arange(t, dtype=np.int64),
            "episode_index": np.full(t, n, np.int64),
            "index": np.arange(total, total + t, dtype=np.int64),
            "task_index": np.full(t, task_index, np.int64),
        }
        row: dict[str, Any] = {"episode_index": n, "tasks": [ep.task], "length": t}
        arrays = {}
        for f in features:
            values = ep.columns[f.key]
            if f.kind == "vector":
                vectors[f.name].append(values)
            if f.kind == "video":
                row.update(videos[f.key].add(values))
            else:
                arrays[f.name] = _column(pa, f, values)
        for k, v in index.items():
            arrays[k] = pa.array(v)
            index_columns[k].append(v)
        chunk, file = data.add(pa.table(arrays))
        row.update({"data/chunk_index": chunk, "data/file_index": file})
        row.update({"dataset_from_index": total, "dataset_to_index": total + t})
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        row.update({"vla_gym/task": ep.source.task, "vla_gym/initial_frame": int(ep.source.initial_frame)})
        ep_stats = _stats({f.name: (f, ep.columns[f.key]) for f in features}, index)
        for name, parts in image_parts.items():
            parts.append(ep_stats[name])
        for name, s in ep_stats.items():
            for stat, value in s.items():
                row[f"stats/{name}/{stat}"] = np.asarray(value).tolist()
        episode_rows.append(row)
        total += t
    data.flush()
    for v in videos.values():
        v.close()
    shutil.rmtree(staging / ".segments", ignore_errors=True)

    meta_dir = staging / "meta"
    episodes_path = staging / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_path.parent.mkdir(parents=True, exist_ok=True)
    columns = {key: [r[key] for r in episode_rows] for key in episode_rows[0]}
    pq.write_table(pa.table(columns), episodes_path, compression="snappy")
    task_names = list(tasks)
    pd.DataFrame({"task_index": range(len(task_names))}, index=pd.Index(task_names, dtype=object)).to_parquet(
        staging / fmt.TASKS_PATH
    )
    stats = {name: st.feature_stats(np.concatenate(v)) for name, v in vectors.items()}
    stats.update({name: st.aggregate(parts) for name, parts in image_parts.items()})
    stats.update({k: st.feature_stats(np.concatenate(v)) for k, v in index_columns.items()})
    stats = {name: stats[name] for name in [*(f.name for f in features), *fmt.INDEX_FEATURES]}
    (meta_dir / "stats.json").write_text(json.dumps(st.to_json(stats), indent=4))
    feature_specs = {f.name: f.spec for f in features}
    feature_specs.update({k: dict(v) for k, v in fmt.INDEX_FEATURES.items()})
    info = {
        "codebase_version": fmt.CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": len(frames),
        "total_frames": total,
        "total_tasks": len(task_names),
        "chunks_size": chunks_size,
        "data_files_size_in_mb": data_mb,
        "video_files_size_in_mb": video_mb,
        "fps": fps,
        "splits": {"train": f"0:{len(frames)}"},
        "data_path": fmt.DATA_PATH,
        "video_path": fmt.VIDEO_PATH if videos else None,
        "features": feature_specs,
        "vla_gym": {
            "obs_keys": {f.key: f.name for f in features if f.name.startswith("observation.")},
            "demos": _json_safe(demos.meta),
        },
    }
    (meta_dir / "info.json").write_text(json.dumps(info, indent=4))


def _stats(features: dict[str, tuple[_Feature, np.ndarray]], index: dict[str, np.ndarray]) -> dict[str, dict]:
    out = {}
    for name, (f, values) in features.items():
        out[name] = st.image_stats(values) if f.kind in ("image", "video") else st.feature_stats(values)
    for name, values in index.items():
        out[name] = st.feature_stats(values)
    return out
