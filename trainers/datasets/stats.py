"""Feature statistics in LeRobot's form (``meta/stats.json`` and the episodes' ``stats/...`` columns).

Per feature: ``min``, ``max``, ``mean``, ``std`` (population), ``count`` (``[frames]``) and the
quantiles ``q01 q10 q50 q90 q99``, each reduced over frames. Images are per channel, scaled to
[0, 1], with shape ``(3, 1, 1)``; a scalar feature's statistics have shape ``(1,)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
MAX_FRAMES, MAX_SIDE = 16, 64  # image statistics: from a sample of frames and pixels


def _summary(values: np.ndarray, frames: int) -> dict[str, np.ndarray]:
    """Statistics over axis 0 of ``values`` ``[M, ...]``."""
    out = {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": values.mean(axis=0),
        "std": values.std(axis=0),
        "count": np.array([frames]),
    }
    for name, q in QUANTILES.items():
        out[name] = np.quantile(values, q, axis=0)
    return out


def feature_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics of a numeric feature ``[N]`` or ``[N, D]`` over its N frames."""
    values = np.asarray(values, np.float64)
    if values.ndim == 1:
        values = values[:, None]
    return _summary(values.reshape(len(values), -1), len(values))


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel statistics of uint8 frames ``[N, H, W, 3]``, in [0, 1], shaped ``(3, 1, 1)``.

    Like LeRobot's, they come from a sample: at most ``MAX_FRAMES`` evenly spaced frames, strided
    to at most ``MAX_SIDE`` pixels a side (``count`` is still N).
    """
    n, h, w = frames.shape[:3]
    picks = np.unique(np.linspace(0, n - 1, min(n, MAX_FRAMES)).round().astype(np.int64))
    step = max(1, -(-max(h, w) // MAX_SIDE))
    pixels = frames[picks, ::step, ::step].reshape(-1, frames.shape[-1]).astype(np.float64) / 255.0
    return {k: v if k == "count" else v.reshape(-1, 1, 1) for k, v in _summary(pixels, n).items()}


def aggregate(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Statistics of the union of the sets ``parts`` describe (LeRobot's way of merging episodes):
    exact count, min, max, mean and pooled std; quantiles as the count-weighted mean of the parts'."""
    counts = np.array([float(np.asarray(p["count"]).reshape(-1)[0]) for p in parts])
    weights = (counts / counts.sum()).reshape(-1, *[1] * np.ndim(parts[0]["mean"]))
    means = np.stack([p["mean"] for p in parts])
    mean = (weights * means).sum(0)
    var = (weights * (np.stack([p["std"] for p in parts]) ** 2 + (means - mean) ** 2)).sum(0)
    out = {
        "min": np.min([p["min"] for p in parts], axis=0),
        "max": np.max([p["max"] for p in parts], axis=0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": np.array([int(counts.sum())]),
    }
    for name in QUANTILES:
        out[name] = (weights * np.stack([p[name] for p in parts])).sum(0)
    return out


def to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    return {key: {name: np.asarray(v).tolist() for name, v in s.items()} for key, s in stats.items()}
