"""Demonstration datasets: read the formats the field uses, export ours.

Readers (all return ``trainers.datasets.demos.Demos``, so behaviour cloning trains on any of them):

* our demos HDF5 (``demos``; ``python -m trainers.demos`` collects them),
* LIBERO's HDF5 demonstration files, one file or a folder of them (``libero_hdf5``),
* LeRobotDataset v3.0 folders (``lerobot_read``), e.g. the LIBERO sets HuggingFaceVLA/libero.

Writers: LeRobot v3.0 (``lerobot_write``: fine-tune pi0.5 or a LeRobot policy on demos made
here) and a world-model bundle's ``dataset/`` (``world_model``: initial frames and trajectories in
RLinf's layout). ``load_demos`` tells the formats apart from the path. Command line::

    python -m trainers.datasets info PATH
    python -m trainers.datasets export-lerobot --demos demos.h5 --out datasets/my_libero
    python -m trainers.datasets export-wm --demos demos.h5 --out bundles/my_bundle

LeRobot needs the ``datasets`` extra (pyarrow, pandas); everything else only the core dependencies.

The readers take datasets from other people, and trust no size or path a file declares: HDF5 files
are read through ``trainers.safe_hdf5`` (no external links, external storage or virtual datasets;
no dataset declaring more than the file can hold), every file a dataset folder names or holds must
resolve inside it (``paths``: templates with ``../``, symlinks out are refused), and decoded video
frames and PNG images must have the size ``info.json`` declares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nets.errors import BadInput, reading
from nets.files import regular_file
from trainers.datasets.demos import FORMAT as DEMOS_FORMAT
from trainers.datasets.demos import Demos, read_demos
from trainers.datasets.lerobot_read import read_lerobot
from trainers.datasets.lerobot_write import write_lerobot
from trainers.datasets.libero_hdf5 import read_libero_hdf5
from trainers.datasets.paths import inside
from trainers.datasets.world_model import write_world_model_dataset

FORMATS = ("vla-gym-demos", "libero-hdf5", "lerobot-v3")
EXPECTED = (
    "a vla-gym demos HDF5 file (python -m trainers.demos), a LIBERO/robomimic HDF5 demonstration file "
    "(data/demo_<i>/...) or a folder of them, or a LeRobot v3.0 dataset folder (meta/info.json)"
)


def _hdf5_format(path: Path) -> str | None:
    import h5py

    from trainers.datasets.libero_hdf5 import is_libero_file
    from trainers.safe_hdf5 import SafeHDF5

    if not h5py.is_hdf5(regular_file(path)):  # h5py would open (and wait on) a FIFO
        return None
    with SafeHDF5(path) as h:  # a file that links outside itself is refused here already
        f = h.file
        if f.attrs.get("format") == DEMOS_FORMAT:
            return "vla-gym-demos"
        if is_libero_file(f):
            return "libero-hdf5"
    return None


def detect_format(path: str | Path) -> str:
    """Which of ``FORMATS`` ``path`` holds; a ValueError saying what was expected otherwise."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no demonstration dataset at {path} (expected {EXPECTED})")
    if path.is_dir():
        if (path / "meta" / "info.json").is_file():
            return "lerobot-v3"
        files = sorted(p for p in path.iterdir() if p.suffix in (".hdf5", ".h5"))
        if files and all(_hdf5_format(inside(path, f.name, "file")) == "libero-hdf5" for f in files):
            return "libero-hdf5"
        found = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
        raise BadInput(f"{path}: a folder with {found}; expected {EXPECTED}")
    kind = _hdf5_format(path)
    if kind is None:
        raise BadInput(f"{path} is not a demonstration dataset this project reads; expected {EXPECTED}")
    return kind


def load_demos(path: str | Path, **options: Any) -> Demos:
    """Read demonstrations in any of ``FORMATS``. ``options`` go to the format's reader
    (``align`` for LIBERO files; ``keys``, ``episodes`` for LeRobot; ``progress`` for both)."""
    kind = detect_format(path)
    if kind == "vla-gym-demos" and options:
        raise TypeError(f"options {sorted(options)} do not apply to a vla-gym demos file")
    with reading(path):  # what h5py, numpy or pyarrow raise on malformed content: named as the file's
        if kind == "vla-gym-demos":
            return read_demos(path)
        if kind == "libero-hdf5":
            return read_libero_hdf5(path, **options)
        return read_lerobot(path, **options)


__all__ = [
    "FORMATS",
    "detect_format",
    "load_demos",
    "read_libero_hdf5",
    "read_lerobot",
    "write_lerobot",
    "write_world_model_dataset",
]
