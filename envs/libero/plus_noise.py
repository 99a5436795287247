"""LIBERO-Plus sensor noise: five image corruptions of the agent-view camera at ten severities.

LIBERO-Plus (arXiv 2510.13626) names a noise level ``N`` in 1..50: ``(N - 1) // 10`` picks the kind
(motion blur, Gaussian blur, zoom blur, fog, glass blur, the ImageNet-C corruptions of Hendrycks and
Dietterich 2019) and ``(N - 1) % 10 + 1`` the severity, with the parameters LIBERO-Plus gives each
severity (``SEVERITIES``). Only the agent-view image is corrupted; the wrist image and the state are
not. Written here with numpy and scipy (the original calls ImageMagick through Wand and
scikit-image, neither of which we install):

* motion blur: a one-sided line of ``radius`` pixels with Gaussian weights (``sigma``) at a random
  angle in [-45, 45] degrees, as ImageMagick's ``MotionBlurImage``;
* Gaussian blur: ``sigma`` pixels, edges repeated (scikit-image's ``gaussian``);
* zoom blur: the mean of the image and of centre crops zoomed back by each factor;
* fog: a diamond-square plasma fractal (side: the next power of two, cropped) added and rescaled;
* glass blur: Gaussian blur, local random pixel swaps within ``delta`` pixels, blur again.

The pixel sizes are LIBERO-Plus's for its 256-pixel images, scaled by ``image width / 256`` (so a
128-pixel render sees the same blur relative to the scene). Randomness (the motion angle, the fog,
the swaps) comes from the ``rng`` the caller passes: the env seeds one per episode.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from nets.errors import BadInput

KINDS = ("motion_blur", "gaussian_blur", "zoom_blur", "fog", "glass_blur")
REFERENCE_SIZE = 256  # the image width LIBERO-Plus's pixel sizes are for
SEVERITIES: dict[str, list] = {
    "motion_blur": [
        (5, 2),
        (8, 3),
        (10, 4),
        (12, 5),
        (15, 6),
        (18, 8),
        (20, 10),
        (25, 12),
        (30, 15),
        (35, 20),
    ],
    "gaussian_blur": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],  # sigma
    "zoom_blur": [  # (largest zoom, step): factors 1, 1 + step, ... below the largest
        (1.11, 0.01),
        (1.16, 0.01),
        (1.21, 0.02),
        (1.26, 0.02),
        (1.31, 0.03),
        (1.36, 0.01),
        (1.41, 0.01),
        (1.46, 0.02),
        (1.51, 0.02),
        (1.56, 0.03),
    ],  # fmt: skip
    "fog": [
        (0.5, 3),
        (1.0, 2.8),
        (1.5, 2.5),
        (2.0, 2.2),
        (2.5, 2.0),
        (3.0, 1.8),
        (3.5, 1.6),
        (4.0, 1.5),
        (4.5, 1.4),
        (5.0, 1.3),
    ],  # (strength, decay of the fractal's roughness)  # fmt: skip
    "glass_blur": [
        (0.5, 1, 3),
        (0.7, 1, 3),
        (0.9, 2, 3),
        (1.0, 2, 2),
        (1.1, 3, 2),
        (1.3, 3, 2),
        (1.5, 4, 2),
        (1.8, 4, 2),
        (2.2, 5, 1),
        (2.5, 5, 1),
    ],  # (sigma, delta, iterations)  # fmt: skip
}


def noise_kind(level: int) -> tuple[str, int]:
    """LIBERO-Plus's noise level (1..50) as (kind, severity 1..10)."""
    if not isinstance(level, int | np.integer) or not 1 <= level <= 50:
        raise BadInput(f"a LIBERO-Plus noise level is an int in [1, 50], got {level!r}")
    return KINDS[(int(level) - 1) // 10], (int(level) - 1) % 10 + 1


def corrupt(image: np.ndarray, level: int, rng: np.random.Generator) -> np.ndarray:
    """``image`` (uint8 H x W x 3) with LIBERO-Plus noise ``level`` applied, uint8 of the same shape."""
    kind, severity = noise_kind(level)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise BadInput(f"sensor noise needs a uint8 H x W x 3 image, got {image.dtype} {image.shape}")
    x = image.astype(np.float64) / 255.0
    scale = image.shape[1] / REFERENCE_SIZE
    params = SEVERITIES[kind][severity - 1]
    if kind == "motion_blur":
        out = _motion_blur(x, params[0] * scale, params[1] * scale, rng.uniform(-45, 45))
    elif kind == "gaussian_blur":
        out = _gaussian(x, params * scale)
    elif kind == "zoom_blur":
        top, step = params
        factors = np.arange(1, top, step)
        out = (x + sum(_clipped_zoom(x, z) for z in factors)) / (len(factors) + 1)
    elif kind == "fog":
        strength, decay = params
        side = 1 << int(np.ceil(np.log2(max(image.shape[:2]))))
        haze = _plasma_fractal(side, decay, rng)[: image.shape[0], : image.shape[1], None]
        peak = x.max()
        out = (x + strength * haze) * peak / (peak + strength)
    else:
        sigma, delta, iterations = params
        glass = _swap_locally(
            _to_uint8(_gaussian(x, sigma * scale)), max(1, round(delta * scale)), iterations, rng
        )
        out = _gaussian(glass / 255.0, sigma * scale)
    return _to_uint8(out)


def _to_uint8(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, 0, 1) * 255).astype(np.uint8)


def _gaussian(x: np.ndarray, sigma: float) -> np.ndarray:
    return ndimage.gaussian_filter(x, sigma=(sigma, sigma, 0), mode="nearest", truncate=4.0)


def _motion_blur(x: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """Each pixel the Gaussian-weighted mean of the pixels up to ``radius`` behind it along ``angle``."""
    steps = np.arange(int(np.ceil(radius)) + 1, dtype=np.float64)
    weights = np.exp(-(steps**2) / (2 * max(sigma, 1e-6) ** 2))
    weights /= weights.sum()
    dy, dx = np.sin(np.radians(angle)), np.cos(np.radians(angle))
    out = np.zeros_like(x)
    for step, weight in zip(steps, weights, strict=True):
        out += weight * ndimage.shift(x, (step * dy, step * dx, 0), order=1, mode="nearest")
    return out


def _clipped_zoom(x: np.ndarray, factor: float) -> np.ndarray:
    """The centre of ``x`` zoomed by ``factor`` back to its size (bilinear)."""
    h, w = x.shape[:2]
    ch, cw = int(np.ceil(h / factor)), int(np.ceil(w / factor))
    top, left = (h - ch) // 2, (w - cw) // 2
    zoomed = ndimage.zoom(x[top : top + ch, left : left + cw], (factor, factor, 1), order=1)
    trim_top, trim_left = (zoomed.shape[0] - h) // 2, (zoomed.shape[1] - w) // 2
    return zoomed[trim_top : trim_top + h, trim_left : trim_left + w]


def _plasma_fractal(side: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    """A ``side`` x ``side`` (a power of two) diamond-square height map in [0, 1]."""
    grid = np.zeros((side, side))
    step, wibble = side, 100.0
    while step >= 2:
        half = step // 2
        corners = grid[0:side:step, 0:side:step]
        square = corners + np.roll(corners, -1, axis=0)
        square = square + np.roll(square, -1, axis=1)
        grid[half:side:step, half:side:step] = square / 4 + wibble * rng.uniform(
            -wibble, wibble, square.shape
        )
        centres = grid[half:side:step, half:side:step]
        corners = grid[0:side:step, 0:side:step]
        across = centres + np.roll(centres, 1, axis=0) + corners + np.roll(corners, -1, axis=1)
        grid[0:side:step, half:side:step] = across / 4 + wibble * rng.uniform(-wibble, wibble, across.shape)
        down = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=0)
        grid[half:side:step, 0:side:step] = down / 4 + wibble * rng.uniform(-wibble, wibble, down.shape)
        step //= 2
        wibble /= decay
    grid -= grid.min()
    return grid / grid.max()


def _swap_locally(image: np.ndarray, delta: int, iterations: int, rng: np.random.Generator) -> np.ndarray:
    """Glass: every interior pixel, bottom-right to top-left, swapped with one within ``delta``."""
    x = image.copy()
    h, w = x.shape[:2]
    for _ in range(iterations):
        rows = range(h - delta, delta, -1)
        cols = range(w - delta, delta, -1)
        offsets = rng.integers(-delta, delta, size=(len(rows), len(cols), 2))
        for i, r in enumerate(rows):
            for j, c in enumerate(cols):
                dx, dy = offsets[i, j]
                r2, c2 = r + dy, c + dx
                x[r, c], x[r2, c2] = x[r2, c2].copy(), x[r, c].copy()
    return x
