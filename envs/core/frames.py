"""Initial frames: where an episode starts, for every backend.

An ``InitialFrame`` holds what a policy sees at the start (images, instruction) and, where the
backend has one, the simulator state to restore (LIBERO: the flattened MuJoCo init state). A list of
frames is a GRPO group's start, an evaluation set, or the same starts for a simulator and a world
model.

On disk a frame set uses the layout of the RLinf world-model bundles: a ``dataset/`` folder with one
``.npy`` file per trajectory, each an object array of per-frame dicts with ``image`` (uint8 HWC),
``instruction`` and ``task`` (str) and ``delta_action`` (float32 (7,)). We write one frame per file and
add ``wrist_image`` and ``sim_state`` where present; loading takes frame 0 of each file, so real
bundles (whole trajectories) load too. These files are pickles by definition: they are read with an
unpickler that builds numpy arrays, strings, numbers and containers only (``nets.safe_load``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envs.core.errors import describe
from nets.errors import BadInput, reading
from nets.files import atomic_folder

ACTION_DIM = 7  # LIBERO's action size; only stored so RLinf's loader can read ``action_dim``


@dataclass
class InitialFrame:
    """Where one episode starts.

    Attributes:
        instruction: the language instruction.
        task: a backend task key (LIBERO: ``"<suite>/<task name>"``); empty when unknown.
        image: main camera image, uint8 (H, W, 3), upright; None if not rendered yet.
        wrist_image: wrist camera image, uint8 (H, W, 3), or None.
        sim_state: backend state to restore (LIBERO: flattened MuJoCo state), or None.
        meta: free-form details (suite, task index, init-state index, ...).
    """

    instruction: str
    task: str = ""
    image: np.ndarray | None = None
    wrist_image: np.ndarray | None = None
    sim_state: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.instruction, str) or not self.instruction:
            raise BadInput(f"InitialFrame: instruction must be a non-empty str, got {self.instruction!r}")
        for name in ("image", "wrist_image"):
            img = getattr(self, name)
            if img is None:
                continue
            img = np.asarray(img)
            why = _image_problem(name, img)
            if why:
                raise BadInput(f"InitialFrame: {why}")
            setattr(self, name, img)
        if self.sim_state is not None:
            self.sim_state = np.asarray(self.sim_state, dtype=np.float64)


_FIELDS = ("instruction", "task", "image", "wrist_image", "sim_state", "meta")


def _image_problem(name: str, img: np.ndarray) -> str | None:
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3 or 0 in img.shape:
        return f"{name} must be uint8 (H, W, 3) with H, W >= 1, got shape {img.shape} dtype {img.dtype}"
    return None


def frame_problem(frame: Any) -> str | None:
    """Why ``frame`` is not a well-formed ``InitialFrame`` as its constructor makes them, or None.

    For frames read back from a saved state: unpickling sets the fields without running
    ``__post_init__``, so each is checked here (nothing is converted or changed): exactly the six
    fields, a non-empty ``instruction`` and a ``task`` string, uint8 (H, W, 3) images or None, a
    float64 ``sim_state`` array or None, a ``meta`` dict with string keys.
    """
    if type(frame) is not InitialFrame:
        return f"an InitialFrame, got {type(frame).__name__}"
    fields = getattr(frame, "__dict__", None)
    if not isinstance(fields, dict) or set(fields) != set(_FIELDS):
        got = sorted(map(str, fields)) if isinstance(fields, dict) else type(fields).__name__
        return f"an InitialFrame with the fields {list(_FIELDS)}, got {got}"
    if not isinstance(frame.instruction, str) or not frame.instruction:
        return f"instruction must be a non-empty str, got {describe(frame.instruction)}"
    if not isinstance(frame.task, str):
        return f"task must be a str, got {describe(frame.task)}"
    for name in ("image", "wrist_image"):
        img = getattr(frame, name)
        if img is None:
            continue
        if type(img) is not np.ndarray:
            return f"{name} must be a uint8 (H, W, 3) numpy array or None, got {type(img).__name__}"
        why = _image_problem(name, img)
        if why:
            return why
    state = frame.sim_state
    if state is not None and (type(state) is not np.ndarray or state.dtype != np.float64):
        got = f"dtype {state.dtype}" if isinstance(state, np.ndarray) else type(state).__name__
        return f"sim_state must be a float64 numpy array or None, got {got}"
    if type(frame.meta) is not dict or not all(isinstance(k, str) for k in frame.meta):
        return f"meta must be a dict with str keys, got {describe(frame.meta)}"
    return None


def save_initial_frames(frames: Sequence[InitialFrame], directory: str | os.PathLike) -> Path:
    """Write ``frames`` as ``directory/dataset/frame_00000.npy, ...``; return the dataset folder.

    Files are written to a staging folder first, fsynced and moved into place
    (``nets.files.atomic_folder``), so an interrupted save leaves no half-written set and a failed
    one no staging folder. An existing ``dataset/`` folder is replaced.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    target = root / "dataset"
    with atomic_folder(target) as staging:  # nets.files: fsynced, swapped in whole
        for i, frame in enumerate(frames):
            if frame.image is None:
                raise BadInput(f"save_initial_frames: frame {i} has no image (RLinf's loader needs one)")
            item: dict[str, Any] = {
                "image": frame.image,
                "instruction": frame.instruction,
                "task": frame.task or frame.instruction,
                "delta_action": np.zeros(ACTION_DIM, np.float32),
            }
            if frame.wrist_image is not None:
                item["wrist_image"] = frame.wrist_image
            if frame.sim_state is not None:
                item["sim_state"] = frame.sim_state
            if frame.meta:
                item["meta"] = dict(frame.meta)
            record = np.empty(1, dtype=object)
            record[0] = item
            np.save(staging / f"frame_{i:05d}.npy", record, allow_pickle=True)
    return target


def load_initial_frames(directory: str | os.PathLike, *, trust_pickle: bool = False) -> list[InitialFrame]:
    """Read a frame set written by ``save_initial_frames`` or an RLinf bundle's ``dataset/``.

    ``directory`` may be the ``dataset/`` folder or its parent. Files are read in sorted order; of
    each trajectory only frame 0 is used. A file whose pickle asks for anything but numpy arrays,
    strings, numbers and containers is refused (``UnsafeFileError``) unless ``trust_pickle=True``.
    """
    from nets.safe_load import load_npy  # imports torch: only when a frame set is read

    root = Path(directory)
    folder = root / "dataset" if (root / "dataset").is_dir() else root
    files = sorted(folder.glob("*.npy"))
    if not files:
        raise FileNotFoundError(f"load_initial_frames: no *.npy files in {folder}")
    frames = []
    for f in files:
        with reading(f):  # what numpy raises on a malformed file, named as this file's
            frames.append(_frame_from_record(load_npy(f, trust_pickle=trust_pickle), f))
    for key in ("image", "wrist_image"):  # one set, one camera size: not a shape error mid-episode
        shapes = {
            f: getattr(frame, key).shape
            for f, frame in zip(files, frames, strict=True)
            if getattr(frame, key) is not None
        }
        if len(set(shapes.values())) > 1:
            first = next(iter(shapes.values()))
            odd = next(f for f, shape in shapes.items() if shape != first)
            raise BadInput(
                f"{odd}: {key} of shape {shapes[odd]}, but {files[0].name} and others have {first}: "
                "the frames of one set must share their image size"
            )
    return frames


def _text(value: Any, where: str) -> Any:
    """Bytes decoded as UTF-8 (else a ``BadInput`` naming ``where``); anything else unchanged."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{where}: bytes that are not UTF-8 text ({e})") from None


def _uint8_image(image: Any, where: str) -> np.ndarray | None:
    """An image as uint8: uint8 as it is, integers inside [0, 255] cast; anything else (floats,
    integers out of range) a ``ValueError``, never a silent wrap-around (300.7 -> 44)."""
    if image is None:
        return None
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise BadInput(f"{where}: expected an H x W x 3 image, got shape {array.shape}")
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if np.issubdtype(array.dtype, np.integer) and array.size and 0 <= array.min() and array.max() <= 255:
        return np.ascontiguousarray(array, dtype=np.uint8)
    low, high = (array.min(), array.max()) if array.size and array.dtype.kind in "iuf" else (None, None)
    raise BadInput(
        f"{where}: the image must be uint8 (or integers in [0, 255]); got {array.dtype} "
        f"with values in [{low}, {high}]"
    )


def _frame_from_record(record: Any, path: Path) -> InitialFrame:
    if len(record) == 0 or not isinstance(record[0], dict):
        raise BadInput(f"{path}: expected a sequence of per-frame dicts, got {type(record)}")
    item = record[0]
    text = _text(item.get("instruction", item.get("task")), f"{path}: instruction")
    if not isinstance(text, str):
        raise BadInput(f"{path}: frame 0 has neither an 'instruction' nor a 'task' string")
    image = item.get("image")
    if image is None:  # RLinf's rule: the first 3-D array stands in for a missing "image"
        image = next((v for v in item.values() if isinstance(v, np.ndarray) and v.ndim == 3), None)
    task = item.get("task", "")
    return InitialFrame(
        instruction=text,
        task=str(_text(task, f"{path}: task")),
        image=_uint8_image(image, f"{path}: image"),
        wrist_image=_uint8_image(item.get("wrist_image"), f"{path}: wrist_image"),
        sim_state=item.get("sim_state"),
        meta=dict(item.get("meta", {})),
    )
