"""Read a LeRobotDataset v3.0 folder into ``Demos`` (layout: ``lerobot_format``).

Each LeRobot episode becomes an ``Episode`` recorded one action per step (K = 1): observation t
with the action of frame t. Features map to our observation keys by name: a dataset written by
``write_lerobot`` says its own mapping (``info.json``'s ``vla_gym`` entry); otherwise the names
the LIBERO LeRobot datasets use (``lerobot_format.OBS_ALIASES``: ``observation.images.image`` ->
``image``, ``observation.images.image2`` or ``.wrist_image`` -> ``wrist_image``,
``observation.state`` -> ``proprio``; ``physical-intelligence/libero``'s bare ``image``,
``wrist_image``, ``state``), and any other ``observation.images.<x>`` / ``observation.<x>``
becomes ``<x>``. ``keys={"image": "observation.images.front", ...}`` overrides it.

Images are returned as stored. The LIBERO LeRobot datasets (HuggingFaceVLA/libero,
physical-intelligence/libero) store them upright, the orientation of our env, which is why
LeRobot's own LIBERO env rotates its raw renders by 180 degrees to match them. Their actions are
LIBERO's (7-D delta end-effector pose, gripper -1 open / +1 close), the same as our env's.

Rewards come from ``next.reward`` (else 0), success from ``next.success`` (else from a positive
reward; else the episode counts as successful: published demonstrations are). Video frames are
found by timestamp: frame ``round((from_timestamp + timestamp) * fps)`` of the episode's file.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nets.budget import check_memory
from nets.errors import BadInput
from nets.field_types import check_value
from nets.files import read_json, regular_file
from trainers.datasets import lerobot_format as fmt
from trainers.datasets.demos import Demos, Episode, check_numbers, text
from trainers.datasets.extras import pyarrow
from trainers.datasets.paths import inside
from trainers.datasets.video import read_ranges

FORMAT = "lerobot-v3"


def read_info(root: Path) -> dict[str, Any]:
    """``meta/info.json``, checked to be a v3 dataset with the entries we need."""
    path = inside(root, fmt.INFO_PATH, "metadata file")
    if not path.is_file():
        raise FileNotFoundError(f"{root} is not a LeRobot dataset folder: {fmt.INFO_PATH} is missing")
    info = read_json(path, "LeRobot dataset", "a JSON object (its metadata)")
    if not isinstance(info, dict):
        raise BadInput(f"{path}: expected a JSON object, got a JSON {type(info).__name__}")
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3."):
        raise BadInput(
            f"{root}: LeRobot dataset codebase_version {version or '(none)'!r}; this reader reads "
            f"{fmt.CODEBASE_VERSION} (convert v2.1 datasets with LeRobot's "
            "`python -m lerobot.datasets.v30.convert_dataset_v21_to_v30`)"
        )
    missing = [k for k in ("fps", "features", "data_path") if k not in info]
    if missing:
        raise BadInput(f"{path}: missing entries {missing}")
    features = info["features"]
    if not isinstance(features, dict):
        raise BadInput(
            f"{path}: expected features as a JSON object {{name: {{dtype, shape, ...}}}}, got a "
            f"JSON {type(features).__name__} ({_short(features)})"
        )
    bad = {n: spec for n, spec in features.items() if not isinstance(spec, dict) or "dtype" not in spec}
    if bad:
        name, spec = next(iter(bad.items()))
        raise BadInput(
            f"{path}: expected each feature as a JSON object with a dtype, got features[{name!r}] = "
            f"{_short(spec)}"
        )
    fps = info["fps"]
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps < float("inf"):
        raise BadInput(f"{path}: expected fps as a positive number, got {_short(fps)}")
    checks = [(f"{k}", info[k], t) for k, t in INFO_ENTRIES.items() if k in info]
    own = info.get("vla_gym")
    if isinstance(own, dict):
        checks += [(f"vla_gym.{k}", own[k], t) for k, t in VLA_GYM_ENTRIES.items() if k in own]
    for name, spec in features.items():
        checks += [(f"features[{name!r}].{k}", spec[k], t) for k, t in FEATURE_ENTRIES.items() if k in spec]
    for where, value, annotation in checks:
        try:
            check_value(annotation, value)
        except ValueError as e:
            raise BadInput(f"{path}: {where}: {e}, got {_short(value)}") from None
    return info


# the entries of info.json this reader uses, and what each must be
INFO_ENTRIES: dict[str, Any] = {
    "data_path": str,
    "video_path": str | None,
    "robot_type": str | None,
    "vla_gym": dict[str, Any] | None,
    "features": dict[str, Any],
}
VLA_GYM_ENTRIES: dict[str, Any] = {"obs_keys": dict[str, str] | None, "demos": dict[str, Any] | None}
FEATURE_ENTRIES: dict[str, Any] = {
    "dtype": str,
    "shape": Sequence[int],
    "names": list | dict | None,
    "info": dict[str, Any] | None,
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _parquet(path: Path, what: str, columns: list[str] | None = None, schema: bool = False) -> Any:
    """``pq.read_table(path, columns=columns)`` (``schema``: only ``pq.read_schema``); a file pyarrow
    cannot read (truncated, not parquet) is a ``ValueError`` naming it."""
    pa, pq = pyarrow()
    regular_file(path)
    try:
        if schema:
            return pq.read_schema(path)
        meta = pq.read_metadata(path)  # the footer only: what the row groups decode to, checked first
        decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        check_memory(decoded, f"{path}: {meta.num_rows:,} rows ({what})")
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise BadInput(
            f"{path}: expected a parquet file (the dataset's {what}), got one pyarrow cannot read "
            f"({type(e).__name__}: {e}); is it truncated?"
        ) from None


def feature_mapping(info: dict[str, Any], keys: dict[str, str] | None = None) -> dict[str, str]:
    """Our observation key -> LeRobot feature name."""
    features = info["features"]
    own = (info.get("vla_gym") or {}).get("obs_keys")
    if keys is None and own:
        mapping = dict(own)
    else:
        mapping = {}
        for ours, names in fmt.OBS_ALIASES.items():
            found = next((n for n in names if n in features), None)
            if found is not None:
                mapping[ours] = found
        taken = set(mapping.values())
        for name, spec in features.items():
            if name in taken or spec.get("dtype") == "string":
                continue
            for prefix in ("observation.images.", "observation."):
                if name.startswith(prefix) and name[len(prefix) :] not in mapping:
                    mapping[name[len(prefix) :]] = name
                    break
        if keys:  # an explicit mapping wins, also over the default name of the same feature
            mapping = {k: v for k, v in mapping.items() if v not in keys.values()}
            mapping.update(keys)
    unknown = {k: v for k, v in mapping.items() if v not in features}
    if unknown:
        raise KeyError(f"features {unknown} are not in the dataset (it has {sorted(features)})")
    return mapping


def _task_strings(root: Path) -> dict[int, str]:
    path = inside(root, fmt.TASKS_PATH, "metadata file")
    if not path.is_file():
        raise FileNotFoundError(f"{root}: {fmt.TASKS_PATH} is missing")
    table = _parquet(path, "task list")
    index_cols = [
        c for c in (table.schema.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)
    ]
    text_col = next((c for c in [*index_cols, "task", "__index_level_0__"] if c in table.column_names), None)
    if text_col is None or "task_index" not in table.column_names:
        raise BadInput(f"{path}: expected a task_index column and the task strings, got {table.column_names}")
    return dict(zip(table["task_index"].to_pylist(), table[text_col].to_pylist()))


def _episodes_table(root: Path) -> dict[str, list]:
    pa, _ = pyarrow()
    files = [
        inside(root, f.relative_to(root), "episodes metadata file")
        for f in sorted((root / fmt.EPISODES_DIR).glob("*/*.parquet"))
    ]
    if not files:
        raise FileNotFoundError(f"{root}: no episodes metadata ({fmt.EPISODES_DIR}/chunk-*/file-*.parquet)")
    tables = [_parquet(f, "episodes metadata") for f in files]
    names = [c for c in tables[0].column_names if not c.startswith("stats/")]
    table = pa.concat_tables(
        [t.select([c for c in names if c in t.column_names]) for t in tables], promote_options="default"
    )
    needed = ["episode_index", "length", "data/chunk_index", "data/file_index"]
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise BadInput(f"{root}: the episodes metadata lacks columns {missing}")
    return {c: table[c].to_pylist() for c in table.column_names}


def _template(root: Path, info: dict[str, Any], key: str, **fields: Any) -> str:
    """``info[key]`` (``data_path``, ``video_path``) filled in: a path in the dataset (checked by
    ``inside`` where it is opened). Only ``fields`` may appear, as ``{name}`` or ``{name:03d}``
    (widths up to 99): no attribute or index lookups, no widths that would fill memory."""
    template = info[key]
    refusal = (
        f"{root}: {fmt.INFO_PATH}'s {key} {template!r} is not a path template this reader fills "
        f"(fields {sorted(fields)} as {{name}} or {{name:03d}})"
    )
    if not isinstance(template, str):
        raise BadInput(refusal)
    try:
        for _, name, spec, conversion in string.Formatter().parse(template):
            if name is not None and (
                name not in fields or conversion or not re.fullmatch(r"0?[1-9]?[0-9]?d?", spec or "")
            ):
                field = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                raise BadInput(f"{refusal}: {{{field}}}")
        return template.format(**fields)
    except (KeyError, IndexError, AttributeError, ValueError) as e:
        raise BadInput(str(e) if str(e).startswith(refusal) else f"{refusal}: {e}") from None


def _check_lengths(
    root: Path, table: dict[str, list], rows: list[int], per_episode: dict[int, dict[str, np.ndarray]]
) -> None:
    """Every array read for an episode has the length its metadata says."""
    for r in rows:
        e, length = table["episode_index"][r], int(table["length"][r])
        lengths = {n: len(v) for n, v in per_episode[e].items()}
        if set(lengths.values()) != {length}:
            raise BadInput(f"{root}: episode {e} has length {length} in its metadata, its frames {lengths}")


def _cell(table: dict[str, list], column: str, row: int, default: Any) -> Any:
    value = table[column][row] if column in table else None
    return default if value is None else value


def _image_size(data: bytes, where: str) -> tuple[int, int]:
    """(height, width) of an encoded image, read from its header (nothing decoded)."""
    import io

    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, bytes):
        raise BadInput(f"{where}: an image without its bytes (images stored as paths are not read)")
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError) as e:
        raise BadInput(f"{where}: an image that cannot be read ({e})") from None
    return height, width


def _to_numpy(column: Any, spec: dict[str, Any], where: str) -> np.ndarray:
    """A parquet column -> ``[N, ...]`` array (images decoded to uint8 HWC)."""
    pa, _ = pyarrow()
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if spec.get("dtype") == "image":
        import imageio.v3 as iio

        hw = fmt.image_hw(spec)
        images = []
        for n, item in enumerate(column.to_pylist()):
            size = _image_size(item["bytes"], where)  # from the header: checked before decoding
            if size != hw:
                raise BadInput(
                    f"{where}: image {n} is {size[0]}x{size[1]} (height x width), not the "
                    f"{hw[0]}x{hw[1]} that {fmt.INFO_PATH} declares; refused"
                )
            image = iio.imread(item["bytes"])
            if image.dtype != np.uint8:
                raise BadInput(
                    f"{where}: image {n} is {image.dtype} (a 16-bit image, such as a depth camera's?); "
                    "images are read as 8-bit RGB or greyscale and would wrap around: convert it"
                )
            images.append(image)
        if not images:
            return np.zeros((0, *hw, 3), np.uint8)
        out = np.stack(
            [img[..., :3] if img.ndim == 3 else np.repeat(img[..., None], 3, -1) for img in images]
        )
        return out.astype(np.uint8)
    if (
        pa.types.is_fixed_size_list(column.type)
        or pa.types.is_list(column.type)
        or pa.types.is_large_list(column.type)
    ):
        flat = column.flatten().to_numpy(zero_copy_only=False)
        if len(column) and len(flat) % len(column):
            raise BadInput(f"{where}: rows of different lengths")
        return flat.reshape(len(column), -1) if len(column) else flat.reshape(0, 0)
    return column.to_numpy(zero_copy_only=False)


def read_lerobot(
    path: str | Path,
    *,
    keys: dict[str, str] | None = None,
    episodes: Sequence[int] | None = None,
    progress: bool = True,
) -> Demos:
    """Read a LeRobot v3 dataset folder (all episodes, or those of ``episodes``)."""
    from tqdm.auto import tqdm

    pa, _ = pyarrow()
    root = Path(path)
    info = read_info(root)
    features, fps = info["features"], float(info["fps"])
    mapping = feature_mapping(info, keys)
    action = next((n for n in fmt.ACTION_ALIASES if n in features), None)
    if action is None:
        raise KeyError(f"{root}: no action feature (expected one of {list(fmt.ACTION_ALIASES)})")
    extras = {
        k: n
        for k, n in (("reward", fmt.REWARD), ("success", fmt.SUCCESS), ("sim_state", fmt.SIM_STATE))
        if n in features
    }
    wanted = {**mapping, "action": action, **extras}  # our key -> feature
    tasks = _task_strings(root)
    table = _episodes_table(root)
    rows = list(range(len(table["episode_index"])))
    if episodes is not None:
        by_index = {e: r for r, e in enumerate(table["episode_index"])}
        absent = [e for e in episodes if e not in by_index]
        if absent:
            raise BadInput(f"{root}: episodes {absent} are not in the dataset ({len(by_index)} episodes)")
        rows = [by_index[e] for e in episodes]

    # the images the selected episodes declare, decoded whole: checked against memory first
    frames = sum(max(int(table["length"][r]), 0) for r in rows)
    image_bytes = sum(
        frames * int(np.prod(fmt.image_hw(features[n]))) * 3
        for n in set(wanted.values())
        if features[n]["dtype"] in ("image", "video")
    )
    check_memory(image_bytes, f"{root}: {frames:,} frames of {len(rows)} episodes with their images")

    # per-frame columns, file by file
    parquet = list(dict.fromkeys(n for n in wanted.values() if features[n]["dtype"] != "video"))
    per_episode: dict[int, dict[str, np.ndarray]] = {table["episode_index"][r]: {} for r in rows}
    files = sorted({(table["data/chunk_index"][r], table["data/file_index"][r]) for r in rows})
    for chunk, file in tqdm(files, desc="LeRobot data", disable=not progress or len(files) < 3, leave=False):
        rel = _template(root, info, "data_path", chunk_index=chunk, file_index=file)
        fpath = inside(root, rel, "data file")
        if not fpath.is_file():
            raise FileNotFoundError(f"{root}: data file {rel} is missing")
        cols = [*parquet, "episode_index", "frame_index", "task_index"]
        schema = _parquet(fpath, "data file", schema=True)
        absent = [c for c in cols if c not in schema.names]
        if absent:
            raise BadInput(f"{fpath}: missing columns {absent}")
        data = _parquet(fpath, "data file", cols)
        # sort by (episode, frame) once, then each episode is one slice
        order = np.lexsort((data["frame_index"].to_numpy(), data["episode_index"].to_numpy()))
        data = data.take(pa.array(order))
        ep_col = data["episode_index"].to_numpy()
        starts = np.flatnonzero(np.r_[True, ep_col[1:] != ep_col[:-1]])
        for start, stop in zip(starts, [*starts[1:], len(ep_col)]):
            ep = int(ep_col[start])
            if ep not in per_episode:
                continue
            sel = data.slice(start, stop - start)
            arrays = {n: _to_numpy(sel[n], features[n], f"{fpath}: {n}") for n in parquet}
            arrays["task_index"] = sel["task_index"].to_numpy()
            per_episode[ep] = arrays

    _check_lengths(root, table, rows, per_episode)  # before a video frame is allocated for them

    # video frames, each file decoded once
    for name in dict.fromkeys(n for n in wanted.values() if features[n]["dtype"] == "video"):
        if not info.get("video_path"):
            raise BadInput(f"{root}: feature {name!r} is a video but info.json has no video_path")
        height, width = fmt.image_hw(features[name])
        groups: dict[tuple[int, int], list[int]] = {}
        for r in rows:
            key = (table[f"videos/{name}/chunk_index"][r], table[f"videos/{name}/file_index"][r])
            groups.setdefault(key, []).append(r)
        for (chunk, file), members in tqdm(groups.items(), desc=name, disable=not progress, leave=False):
            rel = _template(root, info, "video_path", video_key=name, chunk_index=chunk, file_index=file)
            vpath = inside(root, rel, "video file")
            ranges = []
            for r in members:
                start = int(round(table[f"videos/{name}/from_timestamp"][r] * fps))
                length = int(table["length"][r])
                span = table[f"videos/{name}/to_timestamp"][r] * fps - start
                if abs(span - length) > 1:
                    raise BadInput(
                        f"{vpath}: episode {table['episode_index'][r]} has {length} frames but its video "
                        f"timestamps span {span:.1f} frames"
                    )
                ranges.append((start, start + length))
            declared = f"that {fmt.INFO_PATH} declares for {name!r}"
            for r, frames in zip(members, read_ranges(vpath, height, width, ranges, declared)):
                per_episode[table["episode_index"][r]][name] = frames

    _check_lengths(root, table, rows, per_episode)
    out = []
    for r in rows:
        e = table["episode_index"][r]
        arrays = per_episode[e]
        length = int(table["length"][r])
        for name in (action, *extras.values()):
            check_numbers(np.asarray(arrays[name]), f"{root}: episode {e} {name}")  # before any cast
        act = np.asarray(arrays[action], np.float32).reshape(length, 1, -1)
        reward = (
            np.asarray(arrays[extras["reward"]], np.float32).reshape(length)
            if "reward" in extras
            else np.zeros(length, np.float32)
        )
        if "success" in extras:
            success = bool(np.asarray(arrays[extras["success"]]).any())
        else:
            success = bool(reward.sum() > 0) if "reward" in extras else True
        task_index = int(arrays["task_index"][0])
        if task_index not in tasks:
            raise BadInput(f"{root}: episode {e} has task_index {task_index}, not in {fmt.TASKS_PATH}")
        out.append(
            Episode(
                obs={ours: arrays[name] for ours, name in mapping.items()},
                actions=act,
                valid=np.ones((length, 1), bool),
                rewards=reward[:, None],
                instruction=text(tasks[task_index], f"{root}: {fmt.TASKS_PATH} task {task_index}"),
                task=str(_cell(table, "vla_gym/task", r, "") or ""),
                initial_frame=int(_cell(table, "vla_gym/initial_frame", r, -1)),
                success=success,
                sim_states=np.asarray(arrays[extras["sim_state"]], np.float64)
                if "sim_state" in extras
                else None,
            )
        )
    meta = dict((info.get("vla_gym") or {}).get("demos") or {})
    meta.update(
        format=FORMAT,
        source=str(root),
        fps=info["fps"],
        robot_type=info.get("robot_type"),
        features=mapping,
        chunk_size=1,
        action_dim=int(out[0].actions.shape[-1]) if out else 0,
    )
    return Demos(meta, out)
