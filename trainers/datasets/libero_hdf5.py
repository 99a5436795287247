"""LIBERO's demonstration files (robomimic's HDF5 layout), read into ``Demos``.

The LIBERO datasets are one file per task, ``<task name>_demo.hdf5``, written by LIBERO's
``scripts/create_dataset.py`` (which replays the collected demonstrations in the simulator):

    data/                    attrs: problem_info (JSON with problem_name, language_instruction),
                             env_args (JSON), bddl_file_name, env_name, macros_image_convention
                             ("opengl" or "opencv": robosuite's image rows), num_demos, total
    data/demo_<i>/           attrs: num_samples, model_file (the MJCF), init_state
        actions              float64 [T, 7]
        states               float64 [T, S]  flattened MuJoCo state (time, qpos, qvel)
        obs/agentview_rgb    uint8 [T, H, W, 3]  main camera, as robosuite returned it
        obs/eye_in_hand_rgb  uint8 [T, H, W, 3]  wrist camera, same
        obs/ee_pos [T, 3], obs/ee_ori [T, 3] (axis-angle), obs/ee_states [T, 6],
        obs/gripper_states [T, 2], obs/joint_states [T, 7]
        robot_states, rewards, dones   [T] (1 at the last step)

robomimic's own names for the same things (``obs/agentview_image``, ``obs/robot0_eye_in_hand_image``,
``obs/robot0_eef_pos``, ``robot0_eef_quat`` (xyzw), ``robot0_gripper_qpos``) are read too.

What we return, per demo, is an ``Episode`` recorded one action per step (K = 1):

* ``image`` / ``wrist_image``: upright, i.e. the orientation of our LIBERO env's observations
  (``envs/libero``: robosuite's raw OpenGL render rotated by 180 degrees, ``[::-1, ::-1]``, the
  convention of OpenVLA, openpi and LeRobot's LIBERO datasets). Files whose
  ``macros_image_convention`` is "opencv" hold rows already flipped vertically; they are mirrored
  left-right to the same result.
* ``proprio``: ``ee_pos``, ``ee_ori``, ``gripper_states`` (8 values), which is our env's proprio
  (end-effector position, its axis-angle, the two finger positions).
* actions: LIBERO's, unchanged and the same as our env's: delta end-effector position (3) and
  rotation (3, axis-angle) for the OSC controller, scaled to [-1, 1], and the gripper in [-1, 1]
  (-1 open, +1 close).
* ``sim_states``: the MuJoCo state each observation shows.

Alignment. ``create_dataset.py`` stores, at index t, the action a_t, the state s_t that a_t was
applied to, and the observation *after* a_t. A policy acts on what it sees before acting, so by
default (``align=True``) step t of our episode is the observation after a_t with the next action
a_{t+1} and the state s_{t+1} (the state that observation shows): T - 1 steps per demo.
``align=False`` keeps the file's own pairing (observation t, action t, state s_t).

Files are opened through ``trainers.safe_hdf5`` (external links, external storage and virtual
datasets are refused; no dataset declaring more than the file can hold is read), and the files of a
folder must resolve inside it (a symlink out of the folder is refused).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nets.errors import BadInput
from trainers.datasets.demos import Demos, Episode, check_numbers, text
from trainers.datasets.paths import inside

FORMAT = "libero-hdf5"
# image keys of LIBERO's files (and robomimic's robosuite names for them) -> our observation keys
IMAGE_KEYS = {
    "agentview_rgb": "image",
    "agentview_image": "image",
    "eye_in_hand_rgb": "wrist_image",
    "robot0_eye_in_hand_image": "wrist_image",
}
SUFFIXES = (".hdf5", ".h5")
Read = Callable[[Any], np.ndarray]  # SafeHDF5.read: a whole dataset, its declared size checked


def _text(value: Any) -> str:
    if isinstance(value, bytes | np.bytes_):
        return text(bytes(value), "a LIBERO file's text attribute")
    if isinstance(value, np.ndarray) and value.dtype.kind in "SUO":
        return "".join(_text(v) for v in value.ravel())
    return str(value)


def is_libero_file(f: Any) -> bool:
    """True for an open h5py file in robomimic's layout (a ``data`` group of ``demo_<i>``)."""
    data = f.get("data")
    return data is not None and hasattr(data, "keys") and any(k.startswith("demo_") for k in data.keys())


def _demo_names(group: Any) -> list[str]:
    names = [k for k in group.keys() if k.startswith("demo_") and k[5:].isdigit()]
    return sorted(names, key=lambda k: int(k[5:]))


def _instruction(attrs: Any, path: Path) -> str:
    info = attrs.get("problem_info")
    if info is not None:
        text = json.loads(_text(info)).get("language_instruction", "")
        text = "".join(text) if isinstance(text, list) else str(text)
        if text.strip().strip('"'):
            return text.strip().strip('"')
    # the file name is the task name: "pick_up_the_bowl_demo.hdf5" -> "pick up the bowl"
    return path.stem.removesuffix("_demo").replace("_", " ")


def _task_key(attrs: Any, path: Path) -> str:
    """``"<suite folder>/<task name>"``, the task key of our LIBERO env (``libero_spatial/...``)."""
    bddl = attrs.get("bddl_file_name")
    if bddl is not None:
        bddl_path = Path(_text(bddl))
        return f"{bddl_path.parent.name}/{bddl_path.stem}"
    return path.stem.removesuffix("_demo")


def upright(images: np.ndarray, convention: str) -> np.ndarray:
    """Images ``[T, H, W, 3]`` as robosuite stored them -> our env's upright orientation."""
    if convention == "opengl":  # rows bottom to top: rotate by 180 degrees
        return np.ascontiguousarray(images[:, ::-1, ::-1])
    if convention == "opencv":  # robosuite already flipped the rows: mirror the columns
        return np.ascontiguousarray(images[:, :, ::-1])
    raise BadInput(f"macros_image_convention must be 'opengl' or 'opencv', got {convention!r}")


def _array(read: Read, g: Any, key: str, where: str) -> np.ndarray:
    if key not in g:
        raise BadInput(f"{where}: missing dataset {key!r} (a LIBERO demo has actions, states, obs/...)")
    return _numbers(read, g[key], f"{where}: {key}")


def _numbers(read: Read, dataset: Any, where: str) -> np.ndarray:
    """A numeric dataset, refused (naming it) unless it holds real numbers: a complex or string
    array would otherwise be cast to float without a word."""
    array = np.asarray(read(dataset))
    check_numbers(array, where)
    return array


def quat_xyzw_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """``[T, 4]`` xyzw quaternions -> ``[T, 3]`` axis * angle, angle = 2 acos(w) (robosuite's
    ``quat2axisangle``, which LIBERO used for ``ee_ori`` and our env for its proprio)."""
    q = np.asarray(quat, np.float64)
    w = np.clip(q[:, 3], -1.0, 1.0)
    s = np.sqrt(1.0 - w * w)
    scale = np.divide(2.0 * np.arccos(w), s, out=np.zeros_like(s), where=~np.isclose(s, 0.0))
    return q[:, :3] * scale[:, None]


def _proprio(read: Read, obs: Any, where: str) -> np.ndarray | None:
    """Our proprio (end-effector position, its axis-angle, the two finger positions) from LIBERO's
    ``ee_pos``/``ee_ori`` (or ``ee_states``) and ``gripper_states``, or from robomimic's robosuite
    names ``robot0_eef_pos``, ``robot0_eef_quat``, ``robot0_gripper_qpos``; None if neither is there."""
    if "gripper_states" in obs and "ee_pos" in obs and "ee_ori" in obs:
        parts = [read(obs["ee_pos"]), read(obs["ee_ori"]), read(obs["gripper_states"])]
    elif "gripper_states" in obs and "ee_states" in obs:
        parts = [read(obs["ee_states"])[:, :6], read(obs["gripper_states"])]
    elif all(k in obs for k in ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")):
        quat = read(obs["robot0_eef_quat"])
        parts = [read(obs["robot0_eef_pos"]), quat_xyzw_to_axis_angle(quat), read(obs["robot0_gripper_qpos"])]
    else:
        return None
    for part in parts:
        check_numbers(np.asarray(part), f"{where}: obs (end-effector and gripper)")
    parts = [np.asarray(p, np.float32).reshape(len(p), -1) for p in parts]
    if len({len(p) for p in parts}) != 1:
        raise BadInput(f"{where}: the end-effector and gripper observations have different lengths")
    return np.concatenate(parts, axis=1)


def _read_demo(read: Read, g: Any, where: str, convention: str, align: bool) -> dict[str, Any]:
    actions = np.asarray(_array(read, g, "actions", where), np.float32)
    if actions.ndim != 2:
        raise BadInput(f"{where}: actions must be [T, action_dim], got shape {actions.shape}")
    t = len(actions)
    arrays: dict[str, np.ndarray] = {"actions": actions}
    obs_group = g.get("obs", {})
    for key, ours in IMAGE_KEYS.items():
        if key in obs_group and ours not in arrays:
            img = read(obs_group[key])
            if img.dtype != np.uint8 or img.ndim != 4 or img.shape[-1] != 3:
                raise BadInput(f"{where}: obs/{key} must be uint8 [T, H, W, 3], got {img.dtype} {img.shape}")
            arrays[ours] = upright(img, convention)
    proprio = _proprio(read, obs_group, where)
    if proprio is not None:
        arrays["proprio"] = proprio
    if "states" in g:
        arrays["sim_states"] = np.asarray(_numbers(read, g["states"], f"{where}: states"), np.float64)
    arrays["rewards"] = (
        np.asarray(_numbers(read, g["rewards"], f"{where}: rewards"), np.float32)
        if "rewards" in g
        else np.zeros(t, np.float32)
    )
    dones = np.asarray(read(g["dones"]), bool) if "dones" in g else None
    lengths = {k: len(v) for k, v in arrays.items()}
    if dones is not None:
        lengths["dones"] = len(dones)
    if len(set(lengths.values())) != 1:
        raise BadInput(f"{where}: every array must have one entry per step, got lengths {lengths}")
    success = bool(dones[-1]) if dones is not None and len(dones) else bool(arrays["rewards"].sum() > 0)
    if align:  # observation after a_t <- next action a_{t+1} and the state it shows, s_{t+1}
        arrays = {
            k: (v[1:] if k in ("actions", "sim_states", "rewards") else v[:-1]) for k, v in arrays.items()
        }
    arrays["success"] = success
    return arrays


def read_libero_hdf5(path: str | Path, *, align: bool = True, progress: bool = True) -> Demos:
    """Read a LIBERO demonstration file, or a folder of them (every ``*.hdf5``/``*.h5``, sorted).

    See the module docstring for the layout, orientation and alignment.
    """
    from trainers.safe_hdf5 import SafeHDF5

    root = Path(path)
    if root.is_dir():  # every file of a folder must be inside it (no symlink out)
        files = [inside(root, p.name, "file") for p in sorted(root.iterdir()) if p.suffix in SUFFIXES]
        if not files:
            raise FileNotFoundError(f"{root}: no LIBERO demonstration files (*.hdf5, *.h5) in this folder")
    elif root.is_file():
        files = [root]
    else:
        raise FileNotFoundError(f"no LIBERO demonstration file or folder at {root}")
    from tqdm.auto import tqdm

    episodes: list[Episode] = []
    conventions, tasks = set(), []
    for file in files:
        with SafeHDF5(file) as h:
            f = h.file
            if not is_libero_file(f):
                raise BadInput(
                    f"{file} is not a LIBERO/robomimic demonstration file: expected a 'data' group of "
                    f"'demo_<i>' groups, found top-level keys {list(f.keys())}"
                )
            data = f["data"]
            convention = _text(data.attrs.get("macros_image_convention", "opengl"))
            conventions.add(convention)
            instruction, task = _instruction(data.attrs, file), _task_key(data.attrs, file)
            tasks.append(task)
            names = _demo_names(data)
            for name in tqdm(names, desc=file.name, disable=not progress or len(names) < 20, leave=False):
                arrays = _read_demo(h.read, data[name], f"{file}: data/{name}", convention, align)
                steps = len(arrays["actions"])
                if steps == 0:
                    warnings.warn(
                        f"{file}: data/{name} has no step to keep (align={align}); skipped", stacklevel=2
                    )
                    continue
                episodes.append(
                    Episode(
                        obs={k: arrays[k] for k in ("image", "wrist_image", "proprio") if k in arrays},
                        actions=arrays["actions"][:, None, :],
                        valid=np.ones((steps, 1), bool),
                        rewards=arrays["rewards"][:, None],
                        instruction=instruction,
                        task=task,
                        success=arrays["success"],
                        sim_states=arrays.get("sim_states"),
                    )
                )
    if not episodes:
        raise BadInput(f"{root}: no demonstration steps to read")
    meta = {
        "format": FORMAT,
        "source": str(root),
        "tasks": tasks,
        "image_convention": sorted(conventions),
        "aligned": align,
        "chunk_size": 1,
        "action_dim": int(episodes[0].actions.shape[-1]),
    }
    return Demos(meta, episodes)
