"""Cosmos Policy's LIBERO latent sequence: what each of the 9 latent frames holds, how the 33-frame
video is built, and how vectors are written into and read out of latent frames.

    latent  0      1        2      3        4        5               6             7               8
            blank  proprio  wrist  primary  actions  future proprio  future wrist  future primary  value

Frame 0 is one black pixel frame (the Wan VAE's causal first frame); every other latent frame is 4
pixel frames: images repeated 4 times, black frames where a vector goes (its latent is overwritten
after encoding). A vector ``v`` (length n) is written by tiling: the frame's ``C x H x W`` values,
flattened channel-major, become ``v[i mod n]``; it is read back as the mean over its copies (index
``i mod n`` groups). Actions ``[16, 7]`` are flattened row-major; the value is a scalar filling the frame.
Policy mode conditions on frames 0-3 (clean) and generates 4-8; actions, future state and value come
out of one denoising run. The world model conditions on 0-4 (state and action) and generates 5-8; the
value function conditions on 0-7 and generates 8 (``CONDITION_FRAMES``, also the training split).
"""

from __future__ import annotations

import torch

FRAMES = (
    "blank",
    "proprio",
    "wrist",
    "primary",
    "action",
    "future_proprio",
    "future_wrist",
    "future_primary",
    "value",
)
NUM_LATENT_FRAMES = len(FRAMES)  # 9
NUM_VIDEO_FRAMES = 1 + 4 * (NUM_LATENT_FRAMES - 1)  # 33
PIXELS_PER_LATENT = 4
POLICY_CONDITION_FRAMES = 4  # blank, proprio, wrist, primary
INDEX = {name: i for i, name in enumerate(FRAMES)}
# clean leading frames of each conditional distribution: p(a, s', V | s), p(s', V | s, a), p(V | s, a, s')
CONDITION_FRAMES = {"policy": POLICY_CONDITION_FRAMES, "world_model": 5, "value": 8}


def build_video(
    wrist: torch.Tensor,
    primary: torch.Tensor,
    future_wrist: torch.Tensor | None = None,
    future_primary: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pixel video ``[B, 3, 33, S, S]`` in [-1, 1] from uint8 images ``[B, S, S, 3]``: black blank /
    vector frames, each image 4 times; the future image slots hold ``future_*`` (training targets)
    or, when not given, copies of the current images (what the sampler starts from)."""

    def frames(image: torch.Tensor) -> torch.Tensor:
        x = image.permute(0, 3, 1, 2).float() / 127.5 - 1  # [B, 3, S, S]
        return x[:, :, None].expand(-1, -1, PIXELS_PER_LATENT, -1, -1)

    b, s = wrist.shape[0], wrist.shape[1]
    black = torch.full((b, 3, PIXELS_PER_LATENT, s, s), -1.0, device=wrist.device)
    future_wrist = wrist if future_wrist is None else future_wrist
    future_primary = primary if future_primary is None else future_primary
    content = {"wrist": frames(wrist), "primary": frames(primary), "future_wrist": frames(future_wrist),
               "future_primary": frames(future_primary)}  # fmt: skip
    parts = [black[:, :, :1]] + [content.get(name, black) for name in FRAMES[1:]]
    return torch.cat(parts, dim=2)


def write_vector(latents: torch.Tensor, frame: int, vector: torch.Tensor) -> torch.Tensor:
    """Copy of ``latents [B, C, T, H, W]`` with latent frame ``frame`` filled by ``vector [B, n]``
    tiled over the frame's ``C * H * W`` values (channel-major)."""
    b, c, _, h, w = latents.shape
    size = c * h * w
    n = vector.shape[1]
    tiled = vector.to(latents.dtype).repeat(1, -(-size // n))[:, :size]
    out = latents.clone()
    out[:, :, frame] = tiled.reshape(b, c, h, w)
    return out


def read_vector(latents: torch.Tensor, frame: int, n: int) -> torch.Tensor:
    """Mean ``[B, n]`` of the copies of an n-vector tiled into latent frame ``frame`` (summed in
    float64, so identical copies read back exactly)."""
    flat = latents[:, :, frame].flatten(1)
    mean = group_sum(flat.double(), n) / group_count(flat.shape[1], n, flat.device).double()
    return mean.to(latents.dtype)


def group_sum(flat: torch.Tensor, n: int) -> torch.Tensor:
    """Sum ``[B, n]`` of ``flat [B, size]`` over the positions ``i`` with ``i mod n == j``."""
    size = flat.shape[1]
    index = (torch.arange(size, device=flat.device) % n).expand(flat.shape[0], -1)
    return torch.zeros(flat.shape[0], n, dtype=flat.dtype, device=flat.device).scatter_add_(1, index, flat)


def group_count(size: int, n: int, device: torch.device) -> torch.Tensor:
    """How many of ``size`` tiled positions hold each of the n elements, ``[n]``."""
    return torch.bincount(torch.arange(size, device=device) % n, minlength=n).float()


def minmax_normalize(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Per-dimension ``2 (x - min) / (max - min) - 1`` (Cosmos Policy's ``rescale_data``)."""
    return 2 * (x - low) / (high - low) - 1


def minmax_unnormalize(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Inverse of ``minmax_normalize``: ``0.5 (x + 1) (max - min) + min``."""
    return 0.5 * (x + 1) * (high - low) + low
