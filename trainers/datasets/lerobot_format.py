"""The LeRobotDataset v3.0 layout: paths, default features and key names (no I/O here).

    meta/info.json                 codebase_version "v3.0", fps, robot_type, totals, chunks_size,
                                   data_files_size_in_mb, video_files_size_in_mb, splits,
                                   data_path / video_path templates, features {name: {dtype, shape,
                                   names[, info]}}
    meta/stats.json                per feature: min, max, mean, std, count, q01 ... q99
    meta/tasks.parquet             one row per task: column task_index, the task string as the
                                   pandas index (column "__index_level_0__" on disk)
    meta/episodes/chunk-CCC/file-FFF.parquet
                                   one row per episode: episode_index, tasks (list of strings),
                                   length, data/chunk_index, data/file_index, dataset_from_index,
                                   dataset_to_index (global frame rows [from, to)), per video key
                                   videos/<key>/chunk_index, file_index, from_timestamp,
                                   to_timestamp (seconds in its file), meta/episodes/chunk_index,
                                   meta/episodes/file_index, stats/<feature>/<stat>
    data/chunk-CCC/file-FFF.parquet
                                   one row per frame: the non-video features (vectors as
                                   fixed-size lists, shape-(1,) features as scalars, "image"
                                   features as {bytes: PNG, path}), timestamp (frame_index / fps),
                                   frame_index, episode_index, index (global), task_index
    videos/<key>/chunk-CCC/file-FFF.mp4
                                   the frames of consecutive episodes, back to back

A new file is started when the current one reaches its size target (``*_files_size_in_mb``) and a
new chunk folder every ``chunks_size`` files. An episode never spans two files.
"""

from __future__ import annotations

from nets.errors import BadInput

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_FILES_SIZE_MB = 100
VIDEO_FILES_SIZE_MB = 200
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
EPISODES_PATH = f"{EPISODES_DIR}/{CHUNK_FILE}.parquet"
DATA_PATH = f"data/{CHUNK_FILE}.parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"

# the per-frame bookkeeping every LeRobot dataset has
INDEX_FEATURES: dict[str, dict] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}

# Our observation keys -> the LeRobot feature names LIBERO datasets use for them; the first is
# what we write: the names of HuggingFaceVLA/libero and of LeRobot's LIBERO env (image2: the
# wrist camera), so a policy trained on an export runs in LeRobot's LIBERO evaluation as is.
OBS_ALIASES: dict[str, tuple[str, ...]] = {
    "image": (
        "observation.images.image",
        "observation.images.agentview",
        "observation.images.agentview_rgb",
        "observation.images.front",
        "image",
        "images.agentview_rgb",
    ),
    "wrist_image": (
        "observation.images.image2",
        "observation.images.wrist_image",
        "observation.images.wrist",
        "observation.images.eye_in_hand_rgb",
        "wrist_image",
        "images.wrist_rgb",
    ),
    "proprio": ("observation.state", "state"),
}
ACTION_ALIASES = ("action", "actions")
REWARD, DONE, SUCCESS = "next.reward", "next.done", "next.success"
SIM_STATE = "sim_state"  # not under "observation.": LeRobot policies take every observation.* as input

# names of LIBERO's 8-D state (our proprio) and 7-D action, as HuggingFaceVLA/libero has them
LIBERO_STATE_NAMES = [
    *("eef_pos_x", "eef_pos_y", "eef_pos_z"),
    *("eef_axisangle_x", "eef_axisangle_y", "eef_axisangle_z"),
    *("gripper_qpos_0", "gripper_qpos_1"),
]
LIBERO_ACTION_NAMES = ["x", "y", "z", "rot_x", "rot_y", "rot_z", "gripper"]
IMAGE_NAMES = ["height", "width", "channels"]


def next_file(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """The (chunk, file) after this one: a new chunk folder every ``chunks_size`` files."""
    return (chunk_index + 1, 0) if file_index + 1 >= chunks_size else (chunk_index, file_index + 1)


def image_hw(feature: dict) -> tuple[int, int]:
    """(height, width) of an image or video feature, whichever order its shape is in."""
    info = feature.get("info") or {}
    if "video.height" in info and "video.width" in info:
        return int(info["video.height"]), int(info["video.width"])
    shape, names = list(feature["shape"]), feature.get("names") or []
    if len(shape) != 3:
        raise BadInput(f"an image feature has a 3-D shape, got {shape}")
    channels_first = str(names[0]).startswith("channel") if names else shape[0] in (1, 3, 4)
    if channels_first:
        return int(shape[1]), int(shape[2])  # (C, H, W)
    return int(shape[0]), int(shape[1])
