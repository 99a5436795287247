"""The networks a run trains: an STDiT3 (trainable) and its frozen SDXL-style VAE, from an ``--init-from``
bundle or fresh, with what the bundle fixes (frame size, chunk, condition frames, action statistics).

The networks are ``nets``' (``nets.opensora_stdit3``, ``nets.opensora_vae``, loaded by
``nets.opensora_checkpoint``): the same code the env runs, so a bundle written from them loads there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput
from nets.files import read_json
from nets.opensora_checkpoint import load_action_stats, load_stdit3
from nets.opensora_stdit3 import STDiT3, STDiT3Config
from nets.opensora_vae import SDXLVAE
from trainers.world_model.config import WorldModelConfig

TRAINING_FILE = "training.json"  # what a bundle this command wrote was trained on
BUNDLE_FORMAT = "vla-gym-world-model-bundle"
STATS_FILE = "dataset_statistics.json"
REWARD_FILE = "resnet_rm.pth"
# RLinf's published OpenSora bundles (no training.json) imagine 256x256 frames, 8 per step
RLINF_IMAGE_SIZE, RLINF_CHUNK = (256, 256), 8


@dataclass
class Networks:
    """What training starts from. ``image_size`` None: any (a fresh model takes the demos' size)."""

    dit: STDiT3
    vae: SDXLVAE
    image_size: tuple[int, int] | None
    chunk: int
    init_from: Path | None = None
    init_stats: tuple[torch.Tensor, torch.Tensor] | None = None  # the bundle's q01, q99
    init_reward: Path | None = None
    init_record: dict[str, Any] = field(default_factory=dict)  # the bundle's training.json

    @property
    def condition_frames(self) -> int:
        return self.dit.config.pad_action_num

    @property
    def action_dim(self) -> int:
        return self.dit.config.action_dim


def bundle_record(folder: Path) -> dict[str, Any]:
    """A bundle's ``training.json`` as checked data ({} when it has none, as RLinf's bundles)."""
    path = folder / TRAINING_FILE
    if not path.is_file():
        return {}
    data = read_json(path, "bundle training record")
    if not isinstance(data, dict) or data.get("format") != BUNDLE_FORMAT:
        raise BadInput(f"{path}: expected a JSON object with format {BUNDLE_FORMAT!r}")
    size, chunk = data.get("image_size"), data.get("chunk")
    ok_size = isinstance(size, list) and len(size) == 2 and all(type(s) is int and s > 0 for s in size)
    if not ok_size or type(chunk) is not int or chunk < 1:
        raise BadInput(
            f"{path}: expected image_size [height, width] and chunk (ints), got {size!r}, {chunk!r}"
        )
    return data


def load_init_bundle(cfg: WorldModelConfig, device: torch.device) -> Networks:
    """The STDiT3, VAE, action statistics and reward model of the ``--init-from`` bundle, checked
    against the settings (frame size, chunk, condition frames)."""
    root = Path(cfg.init_from or "")
    if not root.is_dir():
        raise BadInput(f"--init-from {root}: no such bundle folder")
    for rel in ("config.json", "vae/config.json"):
        if not (root / rel).is_file():
            raise BadInput(f"--init-from {root}: not an OpenSora bundle (no {rel})")
    record = bundle_record(root)
    size = tuple(record["image_size"]) if record else RLINF_IMAGE_SIZE
    chunk = record["chunk"] if record else RLINF_CHUNK
    origin = f"{root / TRAINING_FILE}" if record else "RLinf's OpenSora bundles"
    if cfg.image_size is not None and tuple(cfg.image_size) != size:
        raise BadInput(
            f"--image-size {list(cfg.image_size)} does not fit --init-from {root}, trained on "
            f"{size[0]}x{size[1]} frames ({origin})"
        )
    if cfg.chunk != chunk:
        raise BadInput(
            f"--chunk {cfg.chunk} does not fit --init-from {root}, trained with chunks of {chunk} ({origin})"
        )
    dit = load_stdit3(root, dtype=torch.float32, device=device)
    if cfg.condition_frames != dit.config.pad_action_num:
        raise BadInput(
            f"--condition-frames {cfg.condition_frames} does not fit --init-from {root}: its STDiT3 takes "
            f"{dit.config.pad_action_num} (pad_action_num in config.json)"
        )
    vae = SDXLVAE.from_pretrained(root / "vae", dtype=torch.float32, device=device)
    if vae.latent_channels != dit.config.in_channels:
        raise BadInput(
            f"--init-from {root}: the VAE makes {vae.latent_channels} latent channels, the STDiT3 takes "
            f"{dit.config.in_channels}"
        )
    stats = load_action_stats(root / STATS_FILE) if (root / STATS_FILE).is_file() else None
    reward = root / REWARD_FILE if (root / REWARD_FILE).is_file() else None
    return Networks(dit, vae, size, chunk, root, stats, reward, record)


def fresh_networks(cfg: WorldModelConfig, action_dim: int, device: torch.device) -> Networks:
    """A new STDiT3 of the configured size (torch's default initialization, drawn from the global RNG
    the run seeded) and the configured frozen VAE. The text path the action fork never uses is kept
    at a token size (it is in the checkpoint layout only)."""
    config = STDiT3Config(
        hidden_size=cfg.hidden_size,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        action_dim=action_dim,
        pad_action_num=cfg.condition_frames,
        caption_channels=16,
        model_max_length=4,
    )
    dit = STDiT3(config).to(device)
    if cfg.vae == "tiny":
        from diffusers import AutoencoderKL

        from nets.opensora_tiny import tiny_vae_config

        vae = SDXLVAE(AutoencoderKL(**tiny_vae_config()).to(device).eval().requires_grad_(False))
    else:
        if not (Path(cfg.vae) / "config.json").is_file():
            raise BadInput(
                f"--vae {cfg.vae}: expected 'tiny' or a diffusers AutoencoderKL folder (config.json)"
            )
        vae = SDXLVAE.from_pretrained(cfg.vae, dtype=torch.float32, device=device)
    if vae.latent_channels != config.in_channels:
        raise BadInput(f"--vae {cfg.vae}: makes {vae.latent_channels} latent channels, STDiT3 takes 4")
    return Networks(dit, vae, cfg.image_size, cfg.chunk)


def calibrate_latent_scale(
    vae: SDXLVAE, frames: np.ndarray, max_frames: int = 256, posterior_std: float | None = 0.01
) -> float:
    """Make a VAE's latents look like the real SDXL VAE's to the flow model: scaled latents of unit
    standard deviation on ``frames`` (uint8 ``[N, H, W, 3]``), as SDXL's fixed 0.13025 gives the real
    VAE. The encoder's posterior mean is multiplied by ``k`` (``quant_conv``) and the decoder's input
    divided by it (``post_quant_conv``), so decoding the mean gives the same frames. The posterior
    spread: ``posterior_std`` after scaling, a constant (for a random VAE, whose log-variance is about 0,
    a spread larger than the signal; without it a random VAE's latents are a few percent of the unit
    noise the flow starts from, buried in their own posterior noise, and the model learns little), or
    None: a trained VAE's learned spread, scaled by ``k`` with its mean. Returns ``k``."""
    module = vae.module
    picks = np.linspace(0, len(frames) - 1, min(len(frames), max_frames)).round().astype(np.int64)
    x = torch.from_numpy(frames[picks]).permute(0, 3, 1, 2).float() / 127.5 - 1
    mean, _ = vae.posterior(x)
    k = 1.0 / max(float((mean * vae.scaling_factor).std()), 1e-6)
    channels = vae.latent_channels
    with torch.no_grad():
        module.quant_conv.weight[:channels] *= k
        module.quant_conv.bias[:channels] *= k
        if posterior_std is None:  # log-variance + 2 log k: the same spread relative to the mean
            module.quant_conv.bias[channels:] += 2 * math.log(k)
        else:
            module.quant_conv.weight[channels:] = 0.0  # a constant log-variance
            module.quant_conv.bias[channels:] = 2 * math.log(posterior_std / vae.scaling_factor)
        module.post_quant_conv.weight /= k
    return k
