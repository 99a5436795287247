"""Optional dependencies of the dataset formats, imported when a format needs them.

LeRobot datasets are parquet tables: reading needs ``pyarrow``, writing also ``pandas`` (LeRobot
reads ``meta/tasks.parquet`` as a pandas frame indexed by the task strings, and pandas writes that
index the way LeRobot expects). Both come with the ``datasets`` extra. Videos are encoded and
decoded with the ffmpeg binary of ``imageio-ffmpeg``, a core dependency.
"""

from __future__ import annotations

from typing import Any

EXTRA = 'pip install "vla-gym[datasets]"'


def pyarrow() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or an ImportError naming the extra."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(f"LeRobot datasets (parquet files) need pyarrow: {EXTRA}") from e
    return pa, pq


def pandas() -> Any:
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError(f"writing LeRobot datasets needs pandas: {EXTRA}") from e
    return pd


def ffmpeg_exe() -> str:
    """The ffmpeg binary shipped by imageio-ffmpeg (it has libsvtav1, libdav1d and libx264)."""
    try:
        import imageio_ffmpeg
    except ImportError as e:  # pragma: no cover - a core dependency
        raise ImportError("LeRobot videos need imageio-ffmpeg: pip install imageio-ffmpeg") from e
    return imageio_ffmpeg.get_ffmpeg_exe()
