"""Frames as the reward model sees them, and augmentations toward a world model's frames.

A world model's frames differ from the renderer's: they are decoded by a VAE (softer edges, lost
fine texture), slightly shifted or scaled from where the simulator would draw things, and their
colours drift. Training on renders alone would teach the classifier details the world model never
draws. Each augmentation below is drawn per frame:

* shift: translate by up to ``shift`` pixels in each direction (edge pixels repeat);
* colour: brightness, contrast and saturation scaled by ``1 +- colour``;
* blur: with probability ``blur_p`` a Gaussian blur of sigma in ``blur_sigma``, or (half of those)
  a down-and-up resampling by a factor in [0.35, 0.75] (VAE-like loss of detail);
* noise: Gaussian pixel noise of std ``noise`` (in [-1, 1] units).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Augment:
    """Augmentation strengths (see the module docstring); ``Augment.off()`` changes nothing."""

    shift: int = 12
    colour: float = 0.2
    blur_p: float = 0.6
    blur_sigma: tuple[float, float] = (0.5, 2.0)
    noise: float = 0.02

    @classmethod
    def off(cls) -> Augment:
        return cls(shift=0, colour=0.0, blur_p=0.0, noise=0.0)


def resize_frames(frames: np.ndarray, size: tuple[int, int], batch: int = 256) -> np.ndarray:
    """uint8 ``[M, H, W, 3]`` -> uint8 ``[M, size[0], size[1], 3]`` (bilinear; unchanged when equal)."""
    if tuple(frames.shape[1:3]) == tuple(size):
        return frames
    out = np.empty((len(frames), *size, 3), np.uint8)
    for i in range(0, len(frames), batch):
        x = torch.from_numpy(frames[i : i + batch]).permute(0, 3, 1, 2).float()
        y = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False, antialias=True)
        out[i : i + batch] = y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return out


def to_model_input(frames: torch.Tensor) -> torch.Tensor:
    """uint8 ``[B, H, W, 3]`` -> float ``[B, 3, H, W]`` in [-1, 1], as the world-model envs feed it."""
    return frames.permute(0, 3, 1, 2).float() / 127.5 - 1.0


def augment(x: torch.Tensor, cfg: Augment, generator: torch.Generator) -> torch.Tensor:
    """Augment a batch ``[B, 3, H, W]`` in [-1, 1] (a new tensor; ``x`` is not changed)."""
    b = x.shape[0]

    def uniform(low: float, high: float, n: int = b) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=generator)

    if cfg.shift > 0:
        x = _shift(x, cfg.shift, generator)
    if cfg.colour > 0:
        c = cfg.colour
        x = (
            x * uniform(1 - c, 1 + c)[:, None, None, None] + uniform(-c, c)[:, None, None, None]
        )  # contrast, brightness
        grey = x.mean(1, keepdim=True)
        x = grey + (x - grey) * uniform(1 - c, 1 + c)[:, None, None, None]  # saturation
    if cfg.blur_p > 0:
        chosen = torch.rand(b, generator=generator) < cfg.blur_p
        resample = torch.rand(b, generator=generator) < 0.5
        gauss = torch.nonzero(chosen & ~resample).flatten()
        down = torch.nonzero(chosen & resample).flatten().tolist()
        x = x.clone()
        if len(gauss):
            x[gauss] = _gaussian_blur(x[gauss], uniform(*cfg.blur_sigma, n=len(gauss)))
        for i in down:
            x[i] = _resample(x[i : i + 1], float(uniform(0.35, 0.75, n=1)))[0]
    if cfg.noise > 0:
        x = x + cfg.noise * torch.randn(x.shape, generator=generator)
    return x.clamp(-1.0, 1.0)


def _shift(x: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate every frame by its own (dy, dx) in [-max_shift, max_shift], repeating the edges."""
    b, _, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4, mode="replicate")
    offsets = torch.randint(0, 2 * max_shift + 1, (b, 2), generator=generator)
    return torch.stack(
        [padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets.tolist())]
    )


def _gaussian_blur(x: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian blur of each frame with its own sigma (one grouped conv per direction)."""
    b, c, h, w = x.shape
    radius = int(math.ceil(3 * float(sigmas.max())))
    taps = torch.arange(-radius, radius + 1, dtype=x.dtype)
    kernel = torch.exp(-(taps[None] ** 2) / (2 * sigmas[:, None] ** 2))
    kernel = (kernel / kernel.sum(1, keepdim=True)).repeat_interleave(c, 0)  # [B*C, taps]
    y = x.reshape(1, b * c, h, w)
    y = F.conv2d(F.pad(y, (radius, radius, 0, 0), mode="replicate"), kernel[:, None, None, :], groups=b * c)
    y = F.conv2d(F.pad(y, (0, 0, radius, radius), mode="replicate"), kernel[:, None, :, None], groups=b * c)
    return y.reshape(b, c, h, w)


def _resample(x: torch.Tensor, factor: float) -> torch.Tensor:
    h, w = x.shape[-2:]
    small = F.interpolate(x, scale_factor=factor, mode="bilinear", align_corners=False, antialias=True)
    return F.interpolate(small, size=(h, w), mode="bilinear", align_corners=False)
