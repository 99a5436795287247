"""The Cosmos networks a run trains: the action DiT (trainable) and its frozen Wan 2.1 VAE, from an
``--init-from`` Cosmos bundle or fresh, with what the bundle fixes (frame size).

The networks are ``nets``' (``nets.cosmos_dit``, ``nets.wan_vae``, loaded by ``load_cosmos_dit`` and
``WanVAE.from_tokenizer`` as plain data unless ``--trust-pickle``): the code the env runs, so a bundle
written from them loads there. A fresh model is a CosmosDiT of the configured size (action input 12 x 7,
the v2 action DiT's global embedding) over a tiny random Wan VAE whose latents are calibrated on the demos
(``calibrate_wan_latents``, on clips ``cosmos_data.calibrate_fresh_vae`` picks), or a given ``tokenizer.pth``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nets.cosmos_checkpoint import load_cosmos_dit
from nets.cosmos_dit import CosmosDiT
from nets.cosmos_tiny import build_tiny_vae, tiny_dit_config
from nets.errors import BadInput
from nets.opensora_checkpoint import load_action_stats
from nets.wan_vae import LATENT_CHANNELS, WanVAE
from trainers.world_model.config import WorldModelConfig
from trainers.world_model.model import REWARD_FILE, STATS_FILE, bundle_record

DIT_FILE = "libero-spatial-2b-19k.pt"  # the names the env looks for (envs.world_models.bundles)
TOKENIZER_FILE = "tokenizer/tokenizer.pth"
ACTION_DIM, MODEL_ACTIONS = 7, 12  # 12 x 7 action values per clip (13 frames, 4 latents)
RLINF_IMAGE_SIZE = (256, 320)  # the public bundle's frames (no training.json)


@dataclass
class CosmosNetworks:
    """What a Cosmos run starts from (the fields ``train`` reads, as ``model.Networks``)."""

    dit: CosmosDiT
    vae: WanVAE
    image_size: tuple[int, int] | None
    tokenizer: Path | None = None  # the --init-from / --vae tokenizer.pth, copied into the bundle as is
    init_from: Path | None = None
    init_stats: tuple[torch.Tensor, torch.Tensor] | None = None
    init_reward: Path | None = None
    init_record: dict[str, Any] = field(default_factory=dict)
    chunk: int = MODEL_ACTIONS
    condition_frames: int = 1
    action_dim: int = ACTION_DIM


def load_cosmos_bundle(cfg: WorldModelConfig, device: torch.device) -> CosmosNetworks:
    """The DiT (``net.`` weights), VAE, action statistics and reward model of a Cosmos ``--init-from``
    bundle (the public one, or one this command wrote), checked against the settings."""
    root = Path(cfg.init_from or "")
    if not root.is_dir():
        raise BadInput(f"--init-from {root}: no such bundle folder")
    for rel in (DIT_FILE, TOKENIZER_FILE):
        if not (root / rel).is_file():
            raise BadInput(f"--init-from {root}: not a Cosmos bundle (no {rel})")
    record = bundle_record(root)
    size = tuple(record["image_size"]) if record else RLINF_IMAGE_SIZE
    if cfg.image_size is not None and tuple(cfg.image_size) != size:
        origin = root / "training.json" if record else "the public Cosmos bundle"
        raise BadInput(
            f"--image-size {list(cfg.image_size)} does not fit --init-from {root}, trained on "
            f"{size[0]}x{size[1]} frames ({origin})"
        )
    dit = load_cosmos_dit(root / DIT_FILE, dtype=torch.float32, device=device, trust_pickle=cfg.trust_pickle)
    if dit.config.action_dim is None:
        raise BadInput(
            f"--init-from {root}: its DiT has no action input (a Video2World DiT, not a world model)"
        )
    vae = WanVAE.from_tokenizer(
        root / TOKENIZER_FILE, dtype=torch.float32, device=device, trust_pickle=cfg.trust_pickle
    )
    if dit.config.in_channels != LATENT_CHANNELS:
        raise BadInput(f"--init-from {root}: its DiT takes {dit.config.in_channels} latent channels, not 16")
    stats = load_action_stats(root / STATS_FILE) if (root / STATS_FILE).is_file() else None
    reward = root / REWARD_FILE if (root / REWARD_FILE).is_file() else None
    return CosmosNetworks(dit, vae, size, root / TOKENIZER_FILE, root, stats, reward, record)


def fresh_cosmos_networks(cfg: WorldModelConfig, action_dim: int, device: torch.device) -> CosmosNetworks:
    """A new CosmosDiT of the configured size (torch's default initialization, drawn from the global RNG
    the run seeded; the tiny model's AdaLN-LoRA and context widths) and the frozen VAE: a tiny random Wan
    VAE (seeded by ``cfg.seed``; ``calibrate_wan_latents`` scales it on the demos) or a ``tokenizer.pth``."""
    config = tiny_dit_config(model_channels=cfg.hidden_size, num_blocks=cfg.depth, num_heads=cfg.num_heads,
                             action_dim=MODEL_ACTIONS * ACTION_DIM)  # fmt: skip
    dit = CosmosDiT(config).to(device)  # validate() refuses sizes it cannot build
    tokenizer = None
    if cfg.vae == "tiny":
        vae = WanVAE(build_tiny_vae(seed=cfg.seed)).to(device)
    else:
        tokenizer = Path(cfg.vae)
        if not tokenizer.is_file():
            raise BadInput(f"--vae {cfg.vae}: expected 'tiny' or a Wan 2.1 tokenizer.pth file")
        vae = WanVAE.from_tokenizer(
            tokenizer, dtype=torch.float32, device=device, trust_pickle=cfg.trust_pickle
        )
    return CosmosNetworks(dit, vae, cfg.image_size, tokenizer)


@torch.no_grad()
def calibrate_wan_latents(vae: WanVAE, clips: torch.Tensor) -> dict[str, float]:
    """Make a random Wan VAE's normalized latents about N(0, 1) per channel on ``clips`` (pixels
    ``[B, 3, 13, H, W]`` in [-1, 1]), as the real VAE's are: the encoder's mean ``mu`` becomes
    ``a mu + b`` per channel (``quant_conv``) and the decoder's input is mapped back (``post_quant_conv``),
    so decoding gives the same frames. In the weights, not the normalization constants: a
    ``tokenizer.pth`` keeps only weights and the env normalizes with Wan's constants. (A random VAE's
    latents are a few hundredths of the unit noise otherwise, and the DiT learns little.)"""
    z = vae.encode(clips)  # [B, 16, T, h, w], normalized with Wan's constants
    center = z.mean(dim=(0, 2, 3, 4))
    spread = z.std(dim=(0, 2, 3, 4)).clamp_min(1e-6)
    std, mean = vae.std.flatten().to(z.device), vae.mean.flatten().to(z.device)
    a = 1 / spread  # normalized' = (normalized - center) / spread  <=>  mu' = a mu + b
    b = mean * (1 - a) - std * center * a
    module, c = vae.vae, LATENT_CHANNELS
    q, p = module.quant_conv, module.post_quant_conv
    q.weight[:c] *= a.view(-1, 1, 1, 1, 1).to(q.weight.dtype)
    q.bias[:c] = q.bias[:c] * a.to(q.bias.dtype) + b.to(q.bias.dtype)
    w = p.weight[:, :, 0, 0, 0]  # [out, in]: post(mu) = W mu + c = W / a (mu' - b) + c
    p.bias -= (w * (b / a)[None]).sum(1).to(p.bias.dtype)
    p.weight /= a.view(1, -1, 1, 1, 1).to(p.weight.dtype)
    return {"latent_std_before": float(spread.mean()), "latent_std": float(vae.encode(clips).std())}
