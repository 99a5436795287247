"""Tiny random OpenSora checkpoints in the real on-disk formats, for CPU tests and smoke runs.

Same architectures and loaders as the real bundle (``RLinf/RLinf-OpenSora-LIBERO-Spatial``); only the
numbers shrink: STDiT3 hidden 64, 2+2 blocks (about 0.36 M parameters), an ``AutoencoderKL`` with 16
channels that still downsamples 8x.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nets.errors import BadInput
from nets.opensora_stdit3 import CONFIG_FILE, SINGLE_FILE, STDiT3, STDiT3Config
from nets.shards import INDEX_FILE


def tiny_stdit3_config() -> STDiT3Config:
    return STDiT3Config(hidden_size=64, depth=2, num_heads=2, caption_channels=16, model_max_length=4)


def tiny_vae_config() -> dict:
    """``AutoencoderKL`` keyword arguments: four down/up blocks (8x), 16 channels, 4 latent channels."""
    return {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ["DownEncoderBlock2D"] * 4,
        "up_block_types": ["UpDecoderBlock2D"] * 4,
        "block_out_channels": [16, 16, 16, 16],
        "layers_per_block": 1,
        "norm_num_groups": 4,
        "latent_channels": 4,
        "sample_size": 32,
        "scaling_factor": 0.13025,
    }


def build_tiny_stdit3(seed: int = 0) -> STDiT3:
    """A tiny STDiT3 with random, non-degenerate weights (no zero-initialized gates or outputs)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return STDiT3(tiny_stdit3_config()).eval()


def write_tiny_stdit3(directory: str | Path, *, shards: int = 2, seed: int = 0) -> Path:
    """Save a tiny STDiT3 as HF ``save_pretrained`` does; returns the folder.

    ``shards > 1`` writes ``model-0000k-of-0000n.safetensors`` plus ``model.safetensors.index.json``;
    ``shards == 1`` writes ``model.safetensors``. A ``config.json`` always goes with them.
    """
    from safetensors.torch import save_file

    if shards < 1:
        raise BadInput(f"write_tiny_stdit3: expected shards >= 1, got {shards}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = build_tiny_stdit3(seed)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    config = {"architectures": ["STDiT3"], "model_type": "STDiT3", "torch_dtype": "float32"}
    (directory / CONFIG_FILE).write_text(json.dumps({**config, **model.config.to_dict()}, indent=2))

    keys = list(state)
    if shards == 1:
        save_file(state, str(directory / SINGLE_FILE), metadata={"format": "pt"})
        return directory
    weight_map = {}
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {key: state[key] for key in keys[k::shards]}
        save_file(part, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return directory


def write_tiny_vae(directory: str | Path, *, seed: int = 0) -> Path:
    """Save a tiny random ``AutoencoderKL`` with diffusers ``save_pretrained``; returns the folder."""
    from diffusers import AutoencoderKL

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKL(**tiny_vae_config())
    vae.save_pretrained(directory)
    return Path(directory)
