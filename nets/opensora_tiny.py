"""Tiny random OpenSora checkpoints in the real on-disk formats, for CPU tests and smoke runs.

Same architectures and loaders as the real bundle (``RLinf/RLinf-OpenSora-LIBERO-Spatial``); only the
numbers shrink: STDiT3 hidden 64, 2+2 blocks (about 0.36 M parameters), an ``AutoencoderKL`` with 16
channels that still downsamples 8x.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nets.opensora_checkpoint import save_stdit3
from nets.opensora_stdit3 import STDiT3, STDiT3Config
from nets.opensora_vae import SDXL_VAE_CONFIG


def tiny_stdit3_config() -> STDiT3Config:
    return STDiT3Config(hidden_size=64, depth=2, num_heads=2, caption_channels=16, model_max_length=4)


def tiny_vae_config() -> dict:
    """``AutoencoderKL`` keyword arguments: the SDXL VAE's four down/up blocks (8x) and 4 latent channels,
    at 16 channels and one layer per block."""
    return {
        **SDXL_VAE_CONFIG,
        "block_out_channels": [16, 16, 16, 16],
        "layers_per_block": 1,
        "norm_num_groups": 4,
        "sample_size": 32,
    }


def build_tiny_stdit3(seed: int = 0) -> STDiT3:
    """A tiny STDiT3 with random, non-degenerate weights (no zero-initialized gates or outputs)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return STDiT3(tiny_stdit3_config()).eval()


def write_tiny_stdit3(directory: str | Path, *, shards: int = 2, seed: int = 0) -> Path:
    """Save a tiny STDiT3 as HF ``save_pretrained`` does (``nets.opensora_checkpoint.save_stdit3``);
    returns the folder."""
    return save_stdit3(build_tiny_stdit3(seed), directory, shards=shards)


def write_tiny_vae(directory: str | Path, *, seed: int = 0) -> Path:
    """Save a tiny random ``AutoencoderKL`` with diffusers ``save_pretrained``; returns the folder."""
    from diffusers import AutoencoderKL

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKL(**tiny_vae_config())
    vae.save_pretrained(directory)
    return Path(directory)
