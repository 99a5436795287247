"""Tiny random Cosmos models, written in the real checkpoint formats (for tests and CPU smoke runs).

* DiT: 64 channels, 2 blocks, 2 heads (head 32: RoPE dims t 12, h 10, w 10), AdaLN-LoRA 16,
  context 32, action MLPs for 84 (global) or 28 (per latent) inputs. The ``.pt`` file looks like a
  Cosmos training checkpoint: ``net.*`` fp32, ``net_ema.*`` bf16, RoPE buffers, TE ``_extra_state``
  and ``accum_*`` counters.
* VAE: ``AutoencoderKLWan(base_dim=8, z_dim=16, num_res_blocks=2)`` saved as an original-key Wan
  ``tokenizer.pth`` by inverting the renaming rules of diffusers' ``convert_wan_vae_to_diffusers``.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan

from nets.cosmos_dit import CosmosDiT, CosmosDiTConfig
from nets.errors import BadInput
from nets.wan_vae import build_wan_vae

TINY_VAE_BASE_DIM = 8


def tiny_dit_config(**overrides) -> CosmosDiTConfig:
    """The tiny DiT config; ``overrides`` replace fields (e.g. ``action_dim=28``)."""
    base = dict(model_channels=64, num_blocks=2, num_heads=2, adaln_lora_dim=16, crossattn_emb_channels=32)
    return CosmosDiTConfig(**{**base, **overrides})


def build_tiny_dit(config: CosmosDiTConfig | None = None, *, seed: int = 0) -> CosmosDiT:
    """A random fp32 DiT whose outputs are not degenerate: default Linear init everywhere (non-zero
    action MLPs, gates and final layer) and norm weights around 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CosmosDiT(config or tiny_dit_config())
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):  # q_norm, k_norm, t_embedding_norm
                    p.copy_(1 + 0.2 * torch.randn_like(p))
    return model.eval().requires_grad_(False)


def build_tiny_vae(*, seed: int = 0) -> AutoencoderKLWan:
    """A random fp32 Wan VAE with ``base_dim=8`` (0.92 M parameters), RMS-norm gains around 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = build_wan_vae(base_dim=TINY_VAE_BASE_DIM)
        with torch.no_grad():
            for name, p in vae.named_parameters():
                if name.endswith("gamma"):
                    p.copy_(1 + 0.2 * torch.randn_like(p))
    return vae.eval().requires_grad_(False)


def write_tiny_dit_checkpoint(
    path: str | Path,
    *,
    action_dim: int = 84,
    crossattn_proj_in_channels: int | None = None,
    ema: bool = True,
    seed: int = 0,
) -> CosmosDiT:
    """Save a tiny DiT as a Cosmos training checkpoint and return the fp32 model under ``net.``.

    ``net_ema.`` holds a slightly different copy (weights + 1% noise) in bf16, so tests can tell the
    prefixes apart.
    """
    config = tiny_dit_config(action_dim=action_dim, crossattn_proj_in_channels=crossattn_proj_in_channels)
    model = build_tiny_dit(config, seed=seed)
    weights = model.state_dict()
    gen = torch.Generator().manual_seed(seed + 1)
    ckpt: dict[str, object] = {f"net.{k}": v.clone() for k, v in weights.items()}
    prefixes = ["net."]
    if ema:
        prefixes.append("net_ema.")
        for k, v in weights.items():
            noisy = v + 0.01 * v.abs().mean() * torch.randn(v.shape, generator=gen)
            ckpt[f"net_ema.{k}"] = noisy.to(torch.bfloat16)
    for prefix in prefixes:  # what a real file carries besides the weights
        ckpt[f"{prefix}pos_embedder.seq"] = torch.arange(128, dtype=torch.float32)
        ckpt[f"{prefix}pos_embedder.dim_spatial_range"] = torch.arange(0, 10, 2).float() / 10
        ckpt[f"{prefix}pos_embedder.dim_temporal_range"] = torch.arange(0, 12, 2).float() / 12
        ckpt[f"{prefix}blocks.0.self_attn._extra_state"] = io.BytesIO()  # Transformer Engine state
        ckpt[f"{prefix}blocks.1.mlp._extra_state"] = None
    ckpt["accum_video_sample_counter"] = torch.tensor(0)
    ckpt["accum_iteration"] = torch.tensor(19000)
    torch.save(ckpt, path)
    return model


def _resnet_to_wan(key: str) -> str:
    """Names inside one residual block: diffusers -> Wan (``residual.{0,2,3,6}``, ``shortcut``)."""
    for new, old in (
        ("norm1.", "residual.0."),
        ("conv1.", "residual.2."),
        ("norm2.", "residual.3."),
        ("conv2.", "residual.6."),
        ("conv_shortcut.", "shortcut."),
    ):
        if key.startswith(new):
            return old + key[len(new) :]
    raise BadInput(f"unexpected residual-block key {key!r}")


def wan_vae_to_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of ``convert_wan_vae_to_diffusers`` (Wan 2.1 layout, ``num_res_blocks=2``)."""
    fixed = {
        "quant_conv.": "conv1.",
        "post_quant_conv.": "conv2.",
        "encoder.conv_in.": "encoder.conv1.",
        "decoder.conv_in.": "decoder.conv1.",
        "encoder.norm_out.": "encoder.head.0.",
        "decoder.norm_out.": "decoder.head.0.",
        "encoder.conv_out.": "encoder.head.2.",
        "decoder.conv_out.": "decoder.head.2.",
    }
    out = {}
    for key, value in state.items():
        new = None
        for d, w in fixed.items():
            if key.startswith(d):
                new = w + key[len(d) :]
        if new is None and (
            m := re.match(r"(encoder|decoder)\.mid_block\.(resnets|attentions)\.(\d)\.(.*)", key)
        ):
            side, kind, idx, rest = m.groups()
            if kind == "attentions":  # middle = [resnet, attention, resnet]
                new = f"{side}.middle.1.{rest}"
            else:
                new = f"{side}.middle.{2 * int(idx)}.{_resnet_to_wan(rest)}"
        if new is None and (m := re.match(r"encoder\.down_blocks\.(\d+)\.(.*)", key)):
            idx, rest = m.groups()  # flat list of resnets and resamplers, same indices
            is_resample = rest.startswith(("resample.", "time_conv."))
            new = f"encoder.downsamples.{idx}.{rest if is_resample else _resnet_to_wan(rest)}"
        if new is None and (m := re.match(r"decoder\.up_blocks\.(\d)\.resnets\.(\d)\.(.*)", key)):
            stage, idx, rest = m.groups()  # stage s: resnets 4s..4s+2, upsampler 4s+3
            new = f"decoder.upsamples.{4 * int(stage) + int(idx)}.{_resnet_to_wan(rest)}"
        if new is None and (m := re.match(r"decoder\.up_blocks\.(\d)\.upsamplers\.0\.(.*)", key)):
            stage, rest = m.groups()
            new = f"decoder.upsamples.{4 * int(stage) + 3}.{rest}"
        if new is None:
            raise BadInput(f"no Wan name for diffusers key {key!r}")
        out[new] = value
    return out


def write_tiny_tokenizer(path: str | Path, *, seed: int = 0) -> AutoencoderKLWan:
    """Save a tiny random Wan VAE as an original-key ``tokenizer.pth``; return the diffusers model."""
    vae = build_tiny_vae(seed=seed)
    torch.save(wan_vae_to_original({k: v.clone() for k, v in vae.state_dict().items()}), path)
    return vae
