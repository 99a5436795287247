"""The success classifier both world-model envs use as their reward (RLinf's ``ResnetRM``).

A ResNet-18 binary classifier in the d2l layout: a 7x7 stem, four stages of two residual blocks
(64, 128, 256, 512 channels; the first block of stages 2-4 halves the resolution and has a 1x1
shortcut conv), global average pooling and one linear unit. Module names follow the checkpoint
``resnet_rm.pth`` exactly (``net.0.0.weight`` ... ``net.7.bias``, 127 entries), so it loads with
``strict=True``. Frames come in as RGB in [-1, 1], any size; the score is ``round(sigmoid(logit))``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nets.safe_load import torch_load

NUM_KEYS = 127  # entries of a resnet_rm.pth state dict (weights, biases, BatchNorm buffers)


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


class ResnetRewardModel(nn.Module):
    """Frame -> success score in {0, 1}. Always runs in fp32 and eval mode (BatchNorm frozen)."""

    def __init__(self) -> None:
        super().__init__()
        stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.MaxPool2d(3, stride=2, padding=1))  # fmt: skip
        stages = [nn.Sequential(Residual(64, 64), Residual(64, 64))]
        for c_in, c_out in ((64, 128), (128, 256), (256, 512)):
            stages.append(nn.Sequential(Residual(c_in, c_out, stride=2), Residual(c_out, c_out)))
        self.net = nn.Sequential(stem, *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1))
        self.eval()

    def train(self, mode: bool = True) -> ResnetRewardModel:  # a frozen reward: BatchNorm stays in eval
        return super().train(False)

    def probability(self, frames: torch.Tensor) -> torch.Tensor:
        """``sigmoid(logit)`` ``[B]`` of frames ``[B, 3, H, W]`` in [-1, 1] (clamped, cast to fp32)."""
        if frames.ndim != 4 or frames.shape[1] != 3:
            raise ValueError(f"reward model: expected frames [B, 3, H, W], got {list(frames.shape)}")
        with torch.no_grad():
            x = frames.float().clamp(-1.0, 1.0).to(self.net[-1].weight.device)
            return torch.sigmoid(self.net(x))[:, 0]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Success score ``round(sigmoid(logit))`` in {0., 1.}, shape ``[B]``."""
        return torch.round(self.probability(frames))

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str | torch.device = "cpu", trust_pickle: bool = False
    ) -> ResnetRewardModel:
        """Load ``resnet_rm.pth`` (a state dict, or ``{"model_state_dict": state_dict}``), strictly,
        as plain data (``trust_pickle=True``: a full unpickle, for files you trust)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"reward model checkpoint not found: {path} (expected resnet_rm.pth)")
        data = torch_load(path, numpy=True, trust_pickle=trust_pickle)
        state = data.get("model_state_dict", data) if isinstance(data, dict) else None
        if not isinstance(state, dict):
            raise ValueError(
                f"{path}: expected a state dict or {{'model_state_dict': ...}}, got {type(data).__name__}"
            )
        model = cls()
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ValueError(
                f"{path} is not a ResnetRM checkpoint ({NUM_KEYS} 'net.*' keys expected): {e}"
            ) from e
        return model.to(device)


def relative_rewards(
    scores: torch.Tensor, previous: torch.Tensor, coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLinf's relative reward over one chunk: ``r_i = coef * c_i - coef * c_{i-1}``.

    ``scores`` ``[N, K]`` in {0, 1}, ``previous`` ``[N]`` (``coef * c`` of the last frame before the
    chunk, 0 after a reset). Returns ``(rewards [N, K], new previous [N])``; an episode's return
    telescopes to ``coef * c`` of its last frame.
    """
    scaled = coef * scores
    before = torch.cat([previous[:, None], scaled[:, :-1]], dim=1)
    return scaled - before, scaled[:, -1]
