"""OpenVLA-OFT's continuous action head: L1 regression of the normalised action chunk from the LLM's
last hidden states at the action positions.

The head reads, for each of the K steps of a chunk, the D hidden states of that step's action
positions concatenated (``D * hidden`` features) and maps them through a residual MLP to the D
normalised action values (the q01/q99 space of the checkpoint's statistics, the LIBERO gripper in
[0, 1]). The residual MLP: LayerNorm -> Linear(D * hidden, hidden) -> ReLU, two pre-LayerNorm
blocks ``x + ReLU(Linear(LayerNorm(x)))``, LayerNorm -> Linear(hidden, D). Parameter names are the
public checkpoints' (``model.layer_norm1``, ``model.fc1``, ``model.mlp_resnet_blocks.<i>.ffn.0`` /
``.ffn.1``, ``model.layer_norm2``, ``model.fc2``), so the released ``action_head--<step>_checkpoint.pt``
files load strictly.

On disk the head is a separate file beside the model folder's safetensors, as OpenVLA-OFT's
fine-tuning script writes it: ``action_head--<step>_checkpoint.pt``, a ``torch.save``d state dict
(names with the ``module.`` prefix of DDP in the released files; it is dropped on loading). It is
read without running code from the file (``nets.safe_load.torch_load``: tensors only).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from nets.errors import BadInput
from nets.files import atomic_path

HEAD_FILE_PATTERN = "action_head--*checkpoint.pt"


class ResidualBlock(nn.Module):
    """``x + ReLU(Linear(LayerNorm(x)))`` (submodules ``ffn.0`` LayerNorm, ``ffn.1`` Linear)."""

    def __init__(self, width: int):
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class ResidualMLP(nn.Module):
    """LayerNorm -> Linear -> ReLU, ``blocks`` residual blocks, LayerNorm -> Linear."""

    def __init__(self, in_features: int, width: int, out_features: int, blocks: int = 2):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(in_features)
        self.fc1 = nn.Linear(in_features, width)
        self.relu = nn.ReLU()
        self.mlp_resnet_blocks = nn.ModuleList(ResidualBlock(width) for _ in range(blocks))
        self.layer_norm2 = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1RegressionActionHead(nn.Module):
    """Hidden states ``[B, K * D, hidden]`` at the action positions -> normalised actions ``[B, K, D]``.

    Deterministic: the OFT recipe acts with the head's output. ``OpenVLAOFTPolicy`` samples around
    it (a Laplace distribution, the one whose likelihood the L1 loss is) only when asked for a
    stochastic action."""

    def __init__(self, hidden_size: int, action_dim: int, width: int | None = None):
        super().__init__()
        self.action_dim = action_dim
        self.model = ResidualMLP(hidden_size * action_dim, width or hidden_size, action_dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        b, n, h = hidden.shape
        if n % self.action_dim:
            raise BadInput(f"{n} action positions are not a whole number of {self.action_dim}-D steps")
        return self.model(hidden.reshape(b, n // self.action_dim, self.action_dim * h))


def find_head_file(folder: Path) -> Path | None:
    """The folder's ``action_head--<step>_checkpoint.pt`` (None if there is none; an error if several)."""
    return find_component_file(folder, HEAD_FILE_PATTERN, "action heads")


def read_head_state(path: Path) -> dict[str, torch.Tensor]:
    """An action head's state dict (``read_component_state``)."""
    return read_component_state(path, "action head")


def find_component_file(folder: Path, pattern: str, what: str) -> Path | None:
    """The one file of ``folder`` matching ``pattern`` (a head or projector the OFT fine-tuning
    script saves beside the model), None if there is none; several are an error naming them."""
    found = sorted(Path(folder).glob(pattern))
    if len(found) > 1:
        raise BadInput(f"{folder} holds several {what} ({', '.join(p.name for p in found)}): keep one")
    return found[0] if found else None


def read_component_state(path: Path, what: str) -> dict[str, torch.Tensor]:
    """A ``torch.save``d state dict (``what``: an action head, a proprio projector), read without
    running code from the file; the ``module.`` prefix of DDP-saved files is dropped."""
    from nets.safe_load import torch_load

    data = torch_load(path)
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()
    ):
        raise BadInput(f"{path}: expected a {what} state dict (names -> tensors)")
    return {k.removeprefix("module."): v for k, v in data.items()}


def write_head_file(head: nn.Module, folder: str | Path, step: int = 0) -> Path:
    """Write ``head``'s weights as ``<folder>/action_head--<step>_checkpoint.pt`` (atomically), the
    file name the OFT fine-tuning script writes and its deployment code (and ``find_head_file``) reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"action_head--{step}_checkpoint.pt"
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    with atomic_path(path) as p:
        torch.save(state, p)
    return path
