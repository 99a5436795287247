"""Image helpers shared by backends (numpy only, so worker processes need no torch)."""

from __future__ import annotations

import numpy as np


def _axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices and weights of a linear resize along one axis (half-pixel centres)."""
    pos = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0, n_in - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, (pos - lo).astype(np.float32)


def resize_bilinear(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize an ``(H, W, C)`` image to ``size = (h, w)``; float32 out, same value range as in.

    The sampling is torch's ``F.interpolate(mode="bilinear", align_corners=False)`` without
    antialiasing, which is what RLinf applies to world-model start frames.
    """
    image = np.asarray(image, np.float32)
    h, w = size
    if image.shape[:2] == (h, w):
        return image.copy()
    top, bottom, wy = _axis(image.shape[0], h)
    left, right, wx = _axis(image.shape[1], w)
    wy, wx = wy[:, None, None], wx[None, :, None]
    rows = image[top] * (1 - wy) + image[bottom] * wy
    return rows[:, left] * (1 - wx) + rows[:, right] * wx


def to_uint8(image: np.ndarray) -> np.ndarray:
    """Round a float image in [0, 255] to uint8."""
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)
