"""Loading a Cosmos DiT from a training checkpoint (``libero-spatial-2b-19k.pt``, Cosmos Policy's ``.pt``).

The file holds ``net.*`` (and usually ``net_ema.*``) weights next to RoPE buffers, TransformerEngine
``_extra_state`` and ``accum_*`` counters. One prefix is kept, the buffers and counters are dropped,
the architecture (channels, blocks, heads, action variant or none, ``crossattn_proj``) is read from the
tensor shapes, and the weights load with ``strict=True``. The file is memory-mapped, so a 12 GB
checkpoint is never read whole.
"""

from __future__ import annotations

import io
from dataclasses import fields
from pathlib import Path

import torch

from nets.cosmos_dit import CosmosDiT, CosmosDiTConfig
from nets.errors import BadInput
from nets.safe_load import torch_load

_DROPPED = ("pos_embedder.", "_extra_state", "accum_")  # buffers and counters, not weights


def _select_prefix(raw: dict, prefix: str, path: Path) -> dict[str, torch.Tensor]:
    """Entries under ``prefix`` (prefix stripped), minus RoPE buffers, TE extra state and counters."""
    state = {k[len(prefix) :]: v for k, v in raw.items() if isinstance(k, str) and k.startswith(prefix)}
    if not state:
        found = sorted({k.split(".", 1)[0] + "." for k in raw if isinstance(k, str) and "." in k})
        raise BadInput(f"{path}: no keys with prefix {prefix!r}; prefixes found: {found or 'none'}")
    return {k: v for k, v in state.items() if not any(d in k for d in _DROPPED)}


def infer_config(state: dict[str, torch.Tensor], where: str = "state dict") -> CosmosDiTConfig:
    """Read the shape parameters off a (prefix-stripped) state dict. Assumes 1x2x2 patches."""

    def shape(key: str) -> tuple[int, ...]:
        if key not in state:
            raise BadInput(f"{where}: missing {key!r} (expected a Cosmos DiT checkpoint)")
        return tuple(state[key].shape)

    d, patch_in = shape("x_embedder.proj.1.weight")
    head_dim = shape("blocks.0.self_attn.q_norm.weight")[0]
    blocks = {int(k.split(".")[1]) for k in state if k.startswith("blocks.")}
    patch = 2
    config = CosmosDiTConfig(
        model_channels=d,
        num_blocks=max(blocks) + 1,
        num_heads=d // head_dim,
        mlp_ratio=shape("blocks.0.mlp.layer1.weight")[0] / d,
        in_channels=patch_in // patch**2 - 2,
        out_channels=shape("final_layer.linear.weight")[0] // patch**2,
        patch_spatial=patch,
        adaln_lora_dim=shape("blocks.0.adaln_modulation_self_attn.1.weight")[0],
        crossattn_emb_channels=shape("blocks.0.cross_attn.k_proj.weight")[1],
        action_dim=shape("action_embedder_B_D.fc1.weight")[1]
        if "action_embedder_B_D.fc1.weight" in state
        else None,
        crossattn_proj_in_channels=(
            shape("crossattn_proj.0.weight")[1] if "crossattn_proj.0.weight" in state else None
        ),
    )
    try:
        config.validate()
    except ValueError as e:
        raise BadInput(f"{where}: {e}") from None
    return config


def load_cosmos_dit(
    path: str | Path,
    *,
    prefix: str = "net.",
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    trust_pickle: bool = False,
    **config_overrides,
) -> CosmosDiT:
    """Load a Cosmos action DiT from a training checkpoint ``.pt``.

    The file is memory-mapped; the entries under ``prefix`` (``"net."``: regular weights, what RLinf
    loads; ``"net_ema."``: the EMA copy) are selected, RoPE buffers / ``_extra_state`` / ``accum_*``
    are dropped, the config is inferred from tensor shapes (``config_overrides`` sets the values that
    are not in the file: ``rope_scale``, ``max_size``, ``timestep_scale``) and the weights are loaded
    with ``strict=True``. The file is read as plain data (tensors, containers, numpy arrays and the
    ``io.BytesIO`` that Transformer Engine's extra state is saved as); ``trust_pickle=True`` reads it
    with a full unpickler, for files you trust that need more.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Cosmos DiT checkpoint not found: {path}")
    raw = torch_load(path, numpy=True, allow=[io.BytesIO, bytes], mmap=True, trust_pickle=trust_pickle)
    for nest in ("model", "state_dict"):
        if isinstance(raw, dict) and isinstance(raw.get(nest), dict):
            raw = raw[nest]
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: expected a state dict, got {type(raw).__name__}")
    state = _select_prefix(raw, prefix, path)
    config = infer_config(state, str(path))
    for key, value in config_overrides.items():
        if key not in {f.name for f in fields(CosmosDiTConfig)}:
            raise BadInput(f"unknown CosmosDiTConfig field {key!r}")
        setattr(config, key, value)
    with torch.device("meta"):
        model = CosmosDiT(config)
    state = {k: v.to(device=device, dtype=dtype) if torch.is_tensor(v) else v for k, v in state.items()}
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        summary = (
            f"{config.model_channels} channels, {config.num_blocks} blocks, {config.num_heads} heads, "
            f"action_dim {config.action_dim}"
        )
        detail = " ".join(str(e).split())  # one line
        raise BadInput(f"{path} (prefix {prefix!r}, inferred {summary}): {detail}") from None
    return model.eval().requires_grad_(False)
