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


def tile_chunk(frames_per_env: Sequence[np.ndarray | None], columns: int | None = None) -> list[np.ndarray]:
    """Grid frames of one chunk step from ``info["frames"]`` (per env: its sub-step frames [k, H, W, 3]).

    Grid frame k tiles every env's frame k; an env that ran fewer sub-steps (its episode ended)
    keeps showing its last frame, an env that ran none (None or empty) is black.
    """
    shaped = [f for f in frames_per_env if f is not None and len(f)]
    if not shaped:
        return []
    blank = np.zeros_like(shaped[0][0])
    steps = max(len(f) for f in shaped)
    out = []
    for k in range(steps):
        images = [blank if f is None or not len(f) else f[min(k, len(f) - 1)] for f in frames_per_env]
        out.append(tile(images, columns))
    return out


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
