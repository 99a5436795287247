"""The Wan 2.1 VAE Cosmos-Predict2 uses as its tokenizer, hosted by diffusers' ``AutoencoderKLWan``.

A causal 3-D conv VAE: 16 latent channels, 8x spatial and 4x temporal compression (frame 0 alone,
then groups of 4: ``T`` frames -> ``1 + (T - 1) // 4`` latents). Latents are normalized per channel,
``(mu - mean) / std``, with the Wan constants (``AutoencoderKLWan`` config ``latents_mean/std``);
encoding is deterministic (the posterior mean).

Because the VAE is causal, encoding frame 0 alone gives exactly latent 0 of a longer clip, and
decoding latents ``0..k`` gives exactly the first ``1 + 4k`` frames of the full decode.

Checkpoints are the original ``tokenizer.pth`` (a flat state dict of Wan keys), converted with
diffusers' ``convert_wan_vae_to_diffusers`` and loaded strictly; nothing is fetched from the hub.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLWan
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
from torch import nn

from nets.errors import BadInput
from nets.safe_load import torch_load

LATENT_CHANNELS = 16
SPATIAL_FACTOR = 8
TEMPORAL_FACTOR = 4
# The published Wan 2.1 VAE (Wan-AI/Wan2.1-T2V-1.3B ``Wan2.1_VAE.pth``, the ``tokenizer.pth`` of
# Cosmos-Predict2 / Cosmos Policy; reference code Wan-Video/Wan2.1 ``wan/modules/vae.py``
# ``_video_vae(dim=96, z_dim=16)``, diffusers ``AutoencoderKLWan()`` defaults): 126,892,531 parameters.
WAN21_BASE_DIM = 96


def build_wan_vae(base_dim: int = WAN21_BASE_DIM, z_dim: int = LATENT_CHANNELS) -> AutoencoderKLWan:
    """``AutoencoderKLWan`` with the Wan 2.1 layout (``base_dim=WAN21_BASE_DIM`` is the real model).

    ``num_res_blocks`` stays 2: diffusers' key converter hard-codes that decoder grouping.
    """
    return AutoencoderKLWan(
        base_dim=base_dim,
        z_dim=z_dim,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[False, True, True],
    )


class WanVAE(nn.Module):
    """Pixels ``[B, 3, T, H, W]`` in [-1, 1] <-> normalized latents ``[B, 16, 1 + (T-1)//4, H/8, W/8]``."""

    def __init__(self, vae: AutoencoderKLWan) -> None:
        super().__init__()
        if vae.config.z_dim != LATENT_CHANNELS:
            raise BadInput(f"expected a Wan VAE with z_dim {LATENT_CHANNELS}, got {vae.config.z_dim}")
        self.vae = vae.eval().requires_grad_(False)
        # fp32 normalization constants, kept out of .to(dtype) (moved to the data's device on use)
        shape = (1, LATENT_CHANNELS, 1, 1, 1)
        self.mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(shape)
        self.std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(shape)

    @property
    def module(self) -> AutoencoderKLWan:
        """The diffusers autoencoder (the name ``SDXLVAE`` gives its own): what a VAE stage trains."""
        return self.vae

    @property
    def dtype(self) -> torch.dtype:
        return self.vae.quant_conv.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.vae.quant_conv.weight.device

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalized latents (fp32) of ``pixels [B, 3, T, H, W]`` in [-1, 1]; T = 1 + 4k."""
        if pixels.ndim != 5 or pixels.shape[1] != 3 or (pixels.shape[2] - 1) % TEMPORAL_FACTOR:
            raise BadInput(f"expected pixels [B, 3, 1 + 4k, H, W], got {list(pixels.shape)}")
        h, w = pixels.shape[-2:]
        if h % SPATIAL_FACTOR or w % SPATIAL_FACTOR:
            raise BadInput(f"expected height/width multiples of {SPATIAL_FACTOR}, got {h}x{w}")
        mu = self.vae.encode(pixels.to(self.device, self.dtype)).latent_dist.mode().float()
        return (mu - self.mean.to(mu.device)) / self.std.to(mu.device)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Pixels (fp32) ``[B, 3, 1 + 4(T-1), 8h, 8w]`` of normalized latents ``[B, 16, T, h, w]``.

        diffusers clamps the output to [-1, 1] (the original Wan decode does not); every consumer
        here (uint8 observations, the reward model) clamps to that range anyway.
        """
        if latents.ndim != 5 or latents.shape[1] != LATENT_CHANNELS:
            raise BadInput(f"expected latents [B, {LATENT_CHANNELS}, T, h, w], got {list(latents.shape)}")
        z = latents.float().to(self.device) * self.std.to(self.device) + self.mean.to(self.device)
        return self.vae.decode(z.to(self.dtype)).sample.float()

    @classmethod
    def from_tokenizer(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        trust_pickle: bool = False,
    ) -> WanVAE:
        """Load an original-key Wan 2.1 ``tokenizer.pth`` strictly (``base_dim`` read from shapes), as
        plain data (``trust_pickle=True``: a full unpickle, for files you trust)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"Wan VAE tokenizer not found: {path} (expected tokenizer.pth)")
        raw = torch_load(path, numpy=True, trust_pickle=trust_pickle)
        for nest in ("model", "state_dict"):
            if isinstance(raw, dict) and isinstance(raw.get(nest), dict):
                raw = raw[nest]
        if not isinstance(raw, dict) or "encoder.conv1.weight" not in raw:
            raise BadInput(
                f"{path}: expected a Wan VAE state dict with 'encoder.conv1.weight' (original keys)"
            )
        base_dim = raw["encoder.conv1.weight"].shape[0]
        vae = build_wan_vae(base_dim=base_dim)
        try:
            vae.load_state_dict(convert_wan_vae_to_diffusers(raw), strict=True)
        except RuntimeError as e:
            detail = " ".join(str(e).split())
            raise BadInput(
                f"{path} does not match a Wan 2.1 VAE with base_dim {base_dim}: {detail}"
            ) from None
        return cls(vae).to(device=device, dtype=dtype)
