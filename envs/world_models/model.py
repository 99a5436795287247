"""What a world-model backend gives the shared env loop: first frames in, imagined frames out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class WorldModel(Protocol):
    """A batched, action-conditioned video model the world-model env drives.

    Per-env state is a dict of tensors whose leading dimension is the env batch (the env indexes,
    stores, serializes and offloads it; the model never keeps per-env state itself). Noise comes
    from the CPU ``generator`` the env owns, so runs are reproducible and the env's state can be
    saved and restored exactly.

    Attributes:
        image_size: (H, W) of the frames the model takes and makes.
        frames_per_step: frames generated per ``generate`` call, one per action (RLinf: 8).
        action_dim: size of one action (LIBERO: 7).
        action_low, action_high: the range of the actions the model was trained on, a number or one
            per dimension (the env's action space; LIBERO's delta pose and gripper: -1 to 1).
    """

    image_size: tuple[int, int]
    frames_per_step: int
    action_dim: int
    action_low: float | Sequence[float]
    action_high: float | Sequence[float]

    def start(self, images: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Per-env state for episodes starting at ``images`` ``[n, 3, H, W]`` float32 in [-1, 1]."""
        ...

    def generate(
        self, state: dict[str, torch.Tensor], actions: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Imagine the next frames.

        Args:
            state: per-env state from ``start`` or a previous ``generate`` (leading dim n).
            actions: ``[n, frames_per_step, action_dim]`` float32, LIBERO units (gripper -1 open,
                +1 close); the model applies its own normalization or scaling.
            generator: CPU generator for all the noise drawn.

        Returns:
            frames ``[n, frames_per_step, 3, H, W]`` float32 in about [-1, 1], and the new state.
        """
        ...

    def to(self, device: torch.device | str) -> WorldModel:
        """Move every network (and cached constant) to ``device``; return self."""
        ...

    @property
    def device(self) -> torch.device: ...
