"""Image resizing in front of VLA vision towers; uint8 in, uint8 out (what replays store)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nets.errors import BadInput


def _check(images: torch.Tensor) -> None:
    if images.dtype != torch.uint8 or images.ndim != 5 or images.shape[-1] != 3:
        raise BadInput(f"expected uint8 images [B, n, H, W, 3], got {images.dtype} {tuple(images.shape)}")


def resize_images(images: torch.Tensor, size: int, center_crop: float | None = None) -> torch.Tensor:
    """uint8 ``[B, n, H, W, 3]`` -> uint8 ``[B, n, size, size, 3]``: optional center crop keeping the
    fraction ``center_crop`` of the area (OpenVLA's LIBERO evaluation: 0.9), then a bicubic
    antialiased resize (images already at ``size`` without a crop pass through untouched)."""
    _check(images)
    b, n, h, w, _ = images.shape
    if center_crop is None and (h, w) == (size, size):
        return images
    x = images.flatten(0, 1).permute(0, 3, 1, 2).float()
    if center_crop is not None:
        side = math.sqrt(center_crop)
        ch, cw = round(h * side), round(w * side)
        top, left = (h - ch) // 2, (w - cw) // 2
        x = x[:, :, top : top + ch, left : left + cw]
    x = F.interpolate(x, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
    x = x.round().clamp(0, 255).to(torch.uint8)
    return x.permute(0, 2, 3, 1).reshape(b, n, size, size, 3)


def resize_with_pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[B, n, H, W, 3]`` -> uint8 ``[B, n, size, size, 3]``: bilinear resize keeping the aspect
    ratio, then zero padding centred on both sides (openpi's ``resize_with_pad``)."""
    _check(images)
    b, n, h, w, _ = images.shape
    if (h, w) == (size, size):
        return images
    scale = size / max(h, w)
    nh, nw = round(h * scale), round(w * scale)
    x = images.flatten(0, 1).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False)
    x = x.round().clamp(0, 255).to(torch.uint8)
    top, left = (size - nh) // 2, (size - nw) // 2
    x = F.pad(x, (left, size - nw - left, top, size - nh - top))
    return x.permute(0, 2, 3, 1).reshape(b, n, size, size, 3)
