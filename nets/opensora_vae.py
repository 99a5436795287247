"""The SDXL image VAE (diffusers ``AutoencoderKL``) applied frame by frame, as RLinf's OpenSora env does.

Encoding samples the posterior (it does not take the mean) and scales by 0.13025; decoding divides by
it. There is no temporal compression: one latent ``[4, H/8, W/8]`` per frame.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

from nets.errors import BadInput

SCALING_FACTOR = 0.13025  # hard-coded in OpenSora's SDXL wrapper
DOWNSAMPLE = 8
# The published SDXL VAE's diffusers ``AutoencoderKL`` config (stabilityai/sdxl-vae ``config.json``, the
# ``vae/`` folder of RLinf's OpenSora bundles): 83,653,863 parameters.
SDXL_VAE_CONFIG = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "latent_channels": 4,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": SCALING_FACTOR,
}


def build_sdxl_vae() -> nn.Module:
    """A diffusers ``AutoencoderKL`` at the SDXL VAE's published size (random weights; build it under
    ``torch.device("meta")`` for shapes only)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(**SDXL_VAE_CONFIG)


class SDXLVAE(nn.Module):
    """Frame-wise encode/decode in micro-batches of ``micro_batch`` frames."""

    def __init__(
        self, autoencoder: nn.Module, *, micro_batch: int = 64, scaling_factor: float = SCALING_FACTOR
    ):
        super().__init__()
        if micro_batch < 1:
            raise BadInput(f"SDXLVAE: expected micro_batch >= 1, got {micro_batch}")
        self.module = autoencoder
        self.micro_batch = micro_batch
        self.scaling_factor = scaling_factor

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        micro_batch: int = 64,
    ) -> SDXLVAE:
        """Load a diffusers ``AutoencoderKL`` folder (``config.json`` + weights) offline, frozen."""
        from diffusers import AutoencoderKL

        directory = Path(directory)
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"SDXL VAE folder not found or has no config.json: {directory}")
        low_mem = importlib.util.find_spec("accelerate") is not None  # diffusers warns without accelerate
        autoencoder = AutoencoderKL.from_pretrained(
            directory, local_files_only=True, torch_dtype=dtype, low_cpu_mem_usage=low_mem
        )
        autoencoder = autoencoder.to(device).eval().requires_grad_(False)
        return cls(autoencoder, micro_batch=micro_batch)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def latent_channels(self) -> int:
        return self.module.config.latent_channels

    def encode(self, frames: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Frames ``[N, 3, H, W]`` in [-1, 1] -> sampled, scaled latents ``[N, 4, H/8, W/8]`` (VAE dtype).

        The posterior noise comes from ``generator`` (a CPU generator works on any device).
        """
        if frames.ndim != 4 or frames.shape[1] != 3:
            raise BadInput(f"SDXLVAE.encode: expected frames [N, 3, H, W], got {list(frames.shape)}")
        out = []
        with torch.no_grad():
            for chunk in frames.split(self.micro_batch):
                posterior = self.module.encode(chunk.to(self.device, self.dtype)).latent_dist
                out.append(posterior.sample(generator=generator) * self.scaling_factor)
        return torch.cat(out)

    def posterior(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames ``[N, 3, H, W]`` in [-1, 1] -> the posterior's ``(mean, std)``, each ``[N, 4, H/8, W/8]``
        float32 and unscaled: ``(mean + std * noise) * scaling_factor`` is one ``encode`` sample. A
        trainer caches these once and draws a fresh sample per use, as encoding every step would."""
        if frames.ndim != 4 or frames.shape[1] != 3:
            raise BadInput(f"SDXLVAE.posterior: expected frames [N, 3, H, W], got {list(frames.shape)}")
        means, stds = [], []
        with torch.no_grad():
            for chunk in frames.split(self.micro_batch):
                posterior = self.module.encode(chunk.to(self.device, self.dtype)).latent_dist
                means.append(posterior.mean.float())
                stds.append(posterior.std.float())
        return torch.cat(means), torch.cat(stds)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``[N, 4, h, w]`` -> frames ``[N, 3, 8h, 8w]`` float32 (about [-1, 1], not clamped)."""
        if latents.ndim != 4 or latents.shape[1] != self.latent_channels:
            raise BadInput(
                f"SDXLVAE.decode: expected latents [N, {self.latent_channels}, h, w], "
                f"got {list(latents.shape)}"
            )
        out = []
        with torch.no_grad():
            for chunk in latents.split(self.micro_batch):
                z = (chunk.to(self.device) / self.scaling_factor).to(self.dtype)
                out.append(self.module.decode(z).sample.float())
        return torch.cat(out)
