"""OpenVLA-OFT's proprioception input: the robot state as one more token after the image patches.

The policy normalises the state with the checkpoint's ``proprio`` statistics (``binned.normalize``,
BOUNDS_Q99, clipped to [-1, 1], as OFT's LIBERO deployment does); the projector maps it to the
LLM's width by ``fc1 -> GELU -> fc2`` (the released ``ProprioProjector``'s names ``fc1`` / ``fc2``),
and the token is appended to the projected patches: ``[BOS] [patches] [proprio] [text ...]``.

On disk the projector is a file beside the model folder, as OFT's fine-tuning script writes it:
``proprio_projector--<step>_checkpoint.pt`` (a state dict, names with DDP's ``module.`` prefix in the
released files), read without running code from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from nets.errors import BadInput

from ..pretrained import load_strict
from .action_heads import find_component_file, read_component_state

PROPRIO_FILE_PATTERN = "proprio_projector--*checkpoint.pt"


class ProprioProjector(nn.Module):
    """Normalised state ``[B, P]`` -> one token ``[B, 1, hidden]``."""

    def __init__(self, hidden_size: int, proprio_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.act_fn1 = nn.GELU()

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act_fn1(self.fc1(proprio)))[:, None]


def proprio_stats(
    norm_stats: dict[str, Any], unnorm_key: str, proprio_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``proprio`` q01 and q99 of ``norm_stats[unnorm_key]``; missing or of another size than the
    env's ``proprio`` observation is a ``ValueError`` naming both."""
    stats = norm_stats[unnorm_key].get("proprio")
    if not isinstance(stats, dict) or not {"q01", "q99"} <= set(stats):
        raise BadInput(
            f"use_proprio: the statistics {unnorm_key!r} have no proprio q01/q99 (OpenVLA-OFT normalises "
            "the state with them); fine-tune from demos with a 'proprio' observation, or pass norm_stats"
        )
    q01 = torch.tensor(stats["q01"], dtype=torch.float32)
    q99 = torch.tensor(stats["q99"], dtype=torch.float32)
    if not len(q01) == len(q99) == proprio_dim:
        raise BadInput(
            f"use_proprio: the statistics {unnorm_key!r} are for a {len(q01)}-D proprio, "
            f"the env's 'proprio' observation is {proprio_dim}-D"
        )
    return q01, q99


def load_proprio_projector(folder: Path, hidden: int, proprio_dim: int, new: bool) -> ProprioProjector:
    """The folder's projector (loaded strictly), or a freshly initialised one when there is none and
    ``new`` (fine-tuning a model that was trained without the state)."""
    projector = ProprioProjector(hidden, proprio_dim)
    path = find_component_file(folder, PROPRIO_FILE_PATTERN, "proprio projectors")
    if path is None:
        if not new:
            raise FileNotFoundError(
                f"use_proprio: {folder} has no {PROPRIO_FILE_PATTERN} (OpenVLA-OFT's proprio projector); "
                "pass new_proprio_projector=True to start a fresh one (to fine-tune it)"
            )
        return projector
    try:
        load_strict(projector, read_component_state(path, "proprio projector"), f"proprio projector {path}")
    except ValueError as e:
        raise BadInput(
            f"{e} (the policy's projector maps a {proprio_dim}-D proprio to {hidden}-wide tokens)"
        ) from None
    return projector
