"""The success classifier of the world-model envs (RLinf's ``ResnetRM``), at any width.

A ResNet-18 binary classifier in the d2l layout: a 7x7 stem, four stages of two residual blocks
(``w, 2w, 4w, 8w`` channels with base width ``w``; the first block of stages 2-4 halves the
resolution and has a 1x1 shortcut conv), global average pooling and one linear unit. ``w = 64`` is
RLinf's real network (11.2 M parameters); a narrower one (e.g. 16: 0.7 M) has the same 127 keys
(``net.0.0.weight`` ... ``net.7.bias``) with smaller tensors, so both are written and loaded the same
way and ``from_checkpoint`` reads the width off the stem's shape. Frames come in as RGB in [-1, 1],
any size; the score is ``round(sigmoid(logit))``.

The envs use it frozen (``frozen=True``, the default: always eval mode, BatchNorm statistics fixed);
``trainers.reward_model`` trains one with ``frozen=False``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nets.errors import BadInput
from nets.safe_load import torch_load

NUM_KEYS = 127  # entries of a resnet_rm.pth state dict (weights, biases, BatchNorm buffers)
DEFAULT_WIDTH = 64  # RLinf's ResNet-18
STEM_KEY = "net.0.0.weight"  # [width, 3, 7, 7]: where a checkpoint says its width


class Residual(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); every conv has a bias."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv3 = nn.Conv2d(in_channels, channels, 1, stride=stride) if stride != 1 else None
        self.bn1 = nn.BatchNorm2d(channels)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.conv3 is None else self.conv3(x)))


def check_width(width: object) -> int:
    """``width`` as an int >= 1, else a ``ValueError`` saying what is expected."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise BadInput(
            f"reward model width: expected a positive int (base channels; {DEFAULT_WIDTH} is RLinf's "
            f"ResNet-18), got {width!r}"
        )
    return width


class ResnetRewardModel(nn.Module):
    """Frame -> success score in {0, 1}.

    Args:
        width: base channels (stages have ``width * (1, 2, 4, 8)``); 64 is RLinf's network.
        frozen: always in eval mode (``train()`` is a no-op), as the envs use it; False for training.
    """

    def __init__(self, width: int = DEFAULT_WIDTH, frozen: bool = True) -> None:
        super().__init__()
        w = check_width(width)
        self.width, self.frozen = w, frozen
        stem = nn.Sequential(nn.Conv2d(3, w, 7, stride=2, padding=3), nn.BatchNorm2d(w), nn.ReLU(),
                             nn.MaxPool2d(3, stride=2, padding=1))  # fmt: skip
        stages = [nn.Sequential(Residual(w, w), Residual(w, w))]
        for c_in, c_out in ((w, 2 * w), (2 * w, 4 * w), (4 * w, 8 * w)):
            stages.append(nn.Sequential(Residual(c_in, c_out, stride=2), Residual(c_out, c_out)))
        self.net = nn.Sequential(stem, *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, 1))
        self.eval()

    def train(self, mode: bool = True) -> ResnetRewardModel:  # a frozen reward: BatchNorm stays in eval
        return super().train(mode and not self.frozen)

    def logits(self, frames: torch.Tensor) -> torch.Tensor:
        """The logit ``[B]`` of frames ``[B, 3, H, W]`` in [-1, 1] (clamped), with gradients."""
        if frames.ndim != 4 or frames.shape[1] != 3:
            raise BadInput(f"reward model: expected frames [B, 3, H, W], got {list(frames.shape)}")
        x = frames.float().clamp(-1.0, 1.0).to(self.net[-1].weight.device)
        return self.net(x)[:, 0]

    def probability(self, frames: torch.Tensor) -> torch.Tensor:
        """``sigmoid(logit)`` ``[B]`` of frames ``[B, 3, H, W]`` in [-1, 1] (clamped, cast to fp32)."""
        with torch.no_grad():
            return torch.sigmoid(self.logits(frames))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Success score ``round(sigmoid(logit))`` in {0., 1.}, shape ``[B]``."""
        return torch.round(self.probability(frames))

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        trust_pickle: bool = False,
        width: int | None = None,
    ) -> ResnetRewardModel:
        """Load ``resnet_rm.pth`` (a state dict, or ``{"model_state_dict": state_dict}``), strictly,
        as plain data (``trust_pickle=True``: a full unpickle, for files you trust). The width comes
        from the file; ``width`` given and different is an error."""
        path = Path(path)
        if width is not None:
            check_width(width)
        if not path.is_file():
            raise FileNotFoundError(f"reward model checkpoint not found: {path} (expected resnet_rm.pth)")
        data = torch_load(path, numpy=True, trust_pickle=trust_pickle)
        state = data.get("model_state_dict", data) if isinstance(data, dict) else None
        if not isinstance(state, dict):
            raise BadInput(
                f"{path}: expected a state dict or {{'model_state_dict': ...}}, got {type(data).__name__}"
            )
        found = checkpoint_width(state)
        if found is None:
            raise BadInput(
                f"{path} is not a ResnetRM checkpoint: expected '{STEM_KEY}' of shape [width, 3, 7, 7] "
                f"among {NUM_KEYS} 'net.*' keys, got keys {sorted(state)[:4]}..."
            )
        if width is not None and width != found:
            raise BadInput(f"{path}: reward model of width {found}, expected width {width}")
        bad = nonfinite_entries(state)
        if bad:
            raise BadInput(
                f"{path}: expected a reward model with finite weights, got NaN or inf in {bad[:4]}"
                f"{' and more' if len(bad) > 4 else ''}; it would score every frame NaN (refused)"
            )
        model = cls(width=found)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise BadInput(
                f"{path} is not a ResnetRM checkpoint ({NUM_KEYS} 'net.*' keys expected): {e}"
            ) from e
        return model.to(device)


def nonfinite_entries(state: dict) -> list[str]:
    """The names of the floating-point tensors of ``state`` holding a NaN or an inf."""
    floats = {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    return [name for name, value in floats.items() if not bool(torch.isfinite(value).all())]


def checkpoint_width(state: dict) -> int | None:
    """The base width a ``resnet_rm.pth`` state dict was made with (None: no stem conv found)."""
    stem = state.get(STEM_KEY)
    shape = tuple(getattr(stem, "shape", ()))
    return int(shape[0]) if len(shape) == 4 and shape[1:] == (3, 7, 7) and shape[0] >= 1 else None
