"""Videos of rollouts: tile per-env frames into one grid and write an mp4."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def tile(images: Sequence[np.ndarray], columns: int | None = None) -> np.ndarray:
    """Lay ``images`` (each uint8 HxWx3, same size) out in a grid, row by row, black where empty."""
    n = len(images)
    columns = columns or int(np.ceil(np.sqrt(n)))
    rows = -(-n // columns)
    h, w, c = images[0].shape
    grid = np.zeros((rows * h, columns * w, c), np.uint8)
    for i, img in enumerate(images):
        r, col = divmod(i, columns)
        grid[r * h : (r + 1) * h, col * w : (col + 1) * w] = img
    return grid


def write_mp4(path: str | os.PathLike, frames: Sequence[np.ndarray], fps: int = 20) -> Path:
    """Write uint8 HxWx3 ``frames`` to an H.264 mp4 (ffmpeg from the imageio-ffmpeg wheel)."""
    import imageio.v2 as imageio

    if not frames:
        raise ValueError("write_mp4: no frames")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".partial.mp4")
    with imageio.get_writer(tmp, fps=fps, codec="libx264", macro_block_size=1, ffmpeg_log_level="error") as w:
        for frame in frames:
            w.append_data(np.ascontiguousarray(frame))
    tmp.replace(path)
    return path
