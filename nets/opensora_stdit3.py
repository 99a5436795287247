"""STDiT3 with per-frame action conditioning (the WMPO fork in ``RLinf/opensora``), in its checkpoint layout.

A video DiT over SDXL latents ``[B, 4, T, H, W]``: patch 1x2x2 tokens, then ``depth`` pairs of a spatial
block (attention over the tokens of one frame) and a temporal block (causal attention over the frames at
one spatial location, with interleaved-pair RoPE). Every block is AdaLN-modulated: spatial blocks by the
timestep plus the frame's action embedding, temporal blocks by the timestep alone; clean condition frames
(``x_mask`` False) use the embedding of timestep 15 instead. The text path (``y_embedder``, the blocks'
``cross_attn``) and ``fps_embedder`` are in the checkpoint but unused, as in the fork.

Module names follow the HF ``save_pretrained`` checkpoint exactly, so it loads with ``strict=True``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from nets.errors import BadInput

VAE_DOWNSAMPLE = 8  # latent -> pixel factor, for the default height/width of the position embedding
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"


@dataclass
class STDiT3Config:
    """Shape parameters. The defaults are the real STDiT3-XL/2 of RLinf's OpenSora LIBERO checkpoints."""

    hidden_size: int = 1152
    depth: int = 28
    num_heads: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    in_channels: int = 4
    pred_sigma: bool = True  # doubles the output channels; the sampler uses the first half
    mlp_ratio: float = 4.0
    qk_norm: bool = True
    input_sq_size: int = 512  # reference resolution of the position-embedding scale
    caption_channels: int = 4096  # unused text path, kept for the checkpoint
    model_max_length: int = 300
    action_dim: int = 7
    pad_action_num: int = 4  # condition frames, which get the learned ``none_action``
    condition_timestep: float = 15.0  # timestep embedded for clean condition frames

    @classmethod
    def xl2_libero(cls) -> STDiT3Config:
        """The published size (the defaults): STDiT3-XL/2 (hpcaitech/Open-Sora v1.2
        ``opensora/models/stdit/stdit3.py`` ``STDiT3_XL_2``: hidden 1152, depth 28, 16 heads, patch 1x2x2,
        T5 4096 x 300 caption path) with the WMPO fork's per-frame action embedder, as in RLinf's OpenSora
        LIBERO checkpoints (``RLinf/RLinf-OpenSora-LIBERO-Spatial`` ``config.json``). 1,212,991,556
        parameters."""
        return cls()

    def __post_init__(self) -> None:
        self.patch_size = tuple(int(p) for p in self.patch_size)
        if len(self.patch_size) != 3 or self.patch_size[0] != 1:
            raise BadInput(f"STDiT3Config: expected patch_size (1, ph, pw), got {self.patch_size}")
        if self.hidden_size % 4 or self.hidden_size % self.num_heads or self.head_dim % 2:
            raise BadInput(
                f"STDiT3Config: expected hidden_size divisible by 4 and by num_heads with an even head size, "
                f"got hidden_size={self.hidden_size}, num_heads={self.num_heads}"
            )

    @property
    def out_channels(self) -> int:
        return self.in_channels * 2 if self.pred_sigma else self.in_channels

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_dict(cls, data: dict) -> STDiT3Config:
        """Config from a ``config.json`` dict; keys this model does not use (HF bookkeeping) are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict:
        data = asdict(self)
        data["patch_size"] = list(self.patch_size)
        return data


# ---- fixed embeddings ----------------------------------------------------------------------------------


def timestep_embedding(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """``cat[cos, sin]`` sinusoid ``[B, dim]`` (fp32) of raw timesteps ``t`` ``[B]`` (0..1000, not 0..1)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def sincos_2d(
    dim: int, h: int, w: int, *, scale: float = 1.0, base_size: int | None = None, device=None
) -> torch.Tensor:
    """2-D sincos position embedding ``[h*w, dim]`` (fp32) for tokens in row-major (row, col) order.

    Each axis gets ``dim/2`` channels ``cat[sin, cos]``. As in OpenSora (its meshgrid takes w first and
    transposes), the FIRST half encodes the column coordinate and the second half the row. Coordinates
    are ``index / scale * base_size / size`` of their own axis.
    """
    rows = torch.arange(h, device=device) / scale
    cols = torch.arange(w, device=device) / scale
    if base_size is not None:
        rows = rows * (base_size / h)
        cols = cols * (base_size / w)
    half = dim // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(0, half, 2, device=device).float() / half))

    def axis(pos: torch.Tensor) -> torch.Tensor:
        angles = pos[:, None] * inv_freq[None]
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)

    return torch.cat([axis(cols.repeat(h)), axis(rows.repeat_interleave(w))], dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of the last dim by 90 degrees: ``(x0, x1) -> (-x1, x0)``."""
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((-x1, x0), dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [..., L, D]`` with per-position ``cos``/``sin`` ``[L, D]`` (pair-repeated angles)."""
    return (x * cos + rotate_pairs(x) * sin).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """``rotary_embedding_torch`` convention: ``freqs`` is a parameter, angles are interleaved pairs."""

    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.freqs = nn.Parameter(1.0 / theta ** (torch.arange(0, dim, 2).float() / dim))

    def cos_sin(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[n, dim]`` of ``position * freqs`` for positions 0..n-1, in the parameter dtype."""
        pos = torch.arange(n, device=self.freqs.device, dtype=self.freqs.dtype)
        angles = (pos[:, None] * self.freqs[None]).repeat_interleave(2, dim=-1)
        return angles.cos(), angles.sin()


# ---- layers --------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """LLaMA RMSNorm: normalize in fp32, cast back, then scale."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Mlp(nn.Module):
    """fc1 -> GELU(tanh) -> fc2 (timm's ``Mlp`` layout)."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features or in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Attention(nn.Module):
    """Multi-head self-attention with per-head RMSNorm on q and k, optional RoPE and causal mask."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = RMSNorm(dim // num_heads) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(dim // num_heads) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, *, causal: bool = False, rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        n, length, dim = x.shape
        q, k, v = self.qkv(x).view(n, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # scale head_dim ** -0.5
        return self.proj(out.transpose(1, 2).reshape(n, length, dim))


class CrossAttention(nn.Module):
    """Text cross-attention weights: in the checkpoint, never called by the action fork."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q_linear = nn.Linear(dim, dim)
        self.kv_linear = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)


def _modulation(
    table: torch.Tensor, t_mod: torch.Tensor, x_mask: torch.Tensor | None, t0_mod: torch.Tensor | None
) -> torch.Tensor:
    """AdaLN parameters ``[B, T|1, n, 1, C]`` = ``table [n, C]`` + ``t_mod [B, T|1, n|1, C]``.

    Frames where ``x_mask`` ``[B, T]`` is False take ``t0_mod`` ``[B, 1, n|1, C]`` instead. Selecting the
    parameters per frame gives the same numbers as the fork, which selects the modulated activations.
    """
    mod = table + t_mod
    if x_mask is not None:
        mod = torch.where(x_mask[:, :, None, None], mod, table + t0_mod)
    return mod.unsqueeze(-2)


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)  # non-affine, as in the checkpoint


class STDiT3Block(nn.Module):
    """One spatial or temporal block on ``x [B, T, S, C]``."""

    def __init__(self, config: STDiT3Config, temporal: bool) -> None:
        super().__init__()
        dim = config.hidden_size
        self.temporal = temporal
        self.attn = Attention(dim, config.num_heads, config.qk_norm)
        self.cross_attn = CrossAttention(dim)
        self.mlp = Mlp(dim, int(dim * config.mlp_ratio))
        self.scale_shift_table = nn.Parameter(torch.randn(6, dim) / dim**0.5)

    def forward(
        self,
        x: torch.Tensor,
        t_mod: torch.Tensor,
        x_mask: torch.Tensor | None = None,
        t0_mod: torch.Tensor | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        batch, frames, tokens, _ = x.shape
        t_mod = t_mod.unflatten(-1, (6, -1))
        t0_mod = None if t0_mod is None else t0_mod.unflatten(-1, (6, -1))
        mod = _modulation(self.scale_shift_table, t_mod, x_mask, t0_mod)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.unbind(2)

        h = _layer_norm(x) * (1 + scale_msa) + shift_msa
        if self.temporal:  # over the frames at each spatial location, causal
            h = rearrange(h, "B T S C -> (B S) T C")
            h = self.attn(h, causal=True, rope=rope)
            h = rearrange(h, "(B S) T C -> B T S C", B=batch)
        else:  # over the tokens of each frame
            h = self.attn(rearrange(h, "B T S C -> (B T) S C"))
            h = rearrange(h, "(B T) S C -> B T S C", B=batch)
        x = x + gate_msa * h

        h = _layer_norm(x) * (1 + scale_mlp) + shift_mlp
        return x + gate_mlp * self.mlp(h)


class FinalLayer(nn.Module):
    """LayerNorm, modulation by the raw timestep embedding, linear to patch pixels."""

    def __init__(self, dim: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, out_features)
        self.scale_shift_table = nn.Parameter(torch.randn(2, dim) / dim**0.5)

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, x_mask: torch.Tensor | None, t0: torch.Tensor | None
    ) -> torch.Tensor:
        t0 = None if t0 is None else t0[:, None, None]
        shift, scale = _modulation(self.scale_shift_table, t[:, None, None], x_mask, t0).unbind(2)
        return self.linear(_layer_norm(x) * (1 + scale) + shift)


# ---- embedders -----------------------------------------------------------------------------------------


class PatchEmbed3D(nn.Module):
    """Conv3d patchify: ``[B, c, T, H, W] -> [B, T, S, C]``."""

    def __init__(self, patch_size: tuple[int, int, int], in_channels: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv3d(in_channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rearrange(self.proj(x), "B C T H W -> B T (H W) C")


class TimestepEmbedder(nn.Module):
    """Sinusoid (256) -> Linear -> SiLU -> Linear."""

    def __init__(self, dim: int, frequency_dim: int = 256) -> None:
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_embedding(t, self.frequency_dim).to(self.mlp[0].weight.dtype))


class ActionEmbedder(nn.Module):
    """One embedding per frame: ``none_action`` for the condition frames, then an MLP of each action."""

    def __init__(self, dim: int, action_dim: int, pad_action_num: int) -> None:
        super().__init__()
        self.pad_action_num = pad_action_num
        self.fc = nn.Sequential(nn.Linear(action_dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))
        self.none_action = nn.Embedding(1, dim)

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        """``[B, n, action_dim] -> [B, pad_action_num + n, C]``."""
        emb = self.fc(actions)
        pad = self.none_action.weight.expand(actions.shape[0], self.pad_action_num, -1)
        return torch.cat([pad, emb], dim=1)


class CaptionEmbedder(nn.Module):
    """Text projection and null-caption buffer: checkpoint entries only, unused by the action fork."""

    def __init__(self, in_channels: int, dim: int, token_num: int) -> None:
        super().__init__()
        self.y_proj = Mlp(in_channels, dim, dim)
        self.register_buffer("y_embedding", torch.randn(token_num, in_channels) / in_channels**0.5)


# ---- model ---------------------------------------------------------------------------------------------


class STDiT3(nn.Module):
    """Action-conditioned STDiT3: velocity prediction ``[B, out_channels, T, H, W]`` (fp32)."""

    def __init__(self, config: STDiT3Config | None = None) -> None:
        super().__init__()
        self.config = cfg = config or STDiT3Config()
        dim = cfg.hidden_size
        self.x_embedder = PatchEmbed3D(cfg.patch_size, cfg.in_channels, dim)
        self.t_embedder = TimestepEmbedder(dim)
        self.action_embedder = ActionEmbedder(dim, cfg.action_dim, cfg.pad_action_num)
        self.fps_embedder = TimestepEmbedder(dim)  # unused, as in the fork
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.y_embedder = CaptionEmbedder(cfg.caption_channels, dim, cfg.model_max_length)
        self.rope = RotaryEmbedding(cfg.head_dim)
        self.spatial_blocks = nn.ModuleList(STDiT3Block(cfg, temporal=False) for _ in range(cfg.depth))
        self.temporal_blocks = nn.ModuleList(STDiT3Block(cfg, temporal=True) for _ in range(cfg.depth))
        self.final_layer = FinalLayer(dim, math.prod(cfg.patch_size) * cfg.out_channels)

    def _check_inputs(
        self, x: torch.Tensor, timestep, actions: torch.Tensor, x_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Shape checks; returns ``timestep`` as ``[B]`` and ``x_mask`` as bool."""
        cfg = self.config
        if x.ndim != 5 or x.shape[1] != cfg.in_channels:
            raise BadInput(f"STDiT3: expected latents [B, {cfg.in_channels}, T, H, W], got {list(x.shape)}")
        batch, _, frames, height, width = x.shape
        if height % cfg.patch_size[1] or width % cfg.patch_size[2]:
            raise BadInput(
                f"STDiT3: expected latent H, W multiples of {cfg.patch_size[1:]}, got {height, width}"
            )
        expected = (batch, frames - cfg.pad_action_num, cfg.action_dim)
        if tuple(actions.shape) != expected:
            raise BadInput(
                f"STDiT3: expected actions {list(expected)} ({frames} latent frames, the first "
                f"{cfg.pad_action_num} without an action), got {list(actions.shape)}"
            )
        if x_mask is not None and tuple(x_mask.shape) != (batch, frames):
            raise BadInput(f"STDiT3: expected x_mask [{batch}, {frames}], got {list(x_mask.shape)}")
        timestep = torch.as_tensor(timestep, device=x.device)
        if timestep.ndim == 0:
            timestep = timestep.expand(batch)
        if tuple(timestep.shape) != (batch,):
            raise BadInput(f"STDiT3: expected timestep [{batch}] or a scalar, got {list(timestep.shape)}")
        return timestep, None if x_mask is None else x_mask.to(device=x.device, dtype=torch.bool)

    def fsdp_units(self) -> list[nn.Module]:
        """The blocks, each run through its own ``forward``: what FSDP shards one by one."""
        return [*self.spatial_blocks, *self.temporal_blocks]

    def compile_blocks(self) -> None:
        """``torch.compile`` each spatial and temporal block in place (regional compilation: one graph
        per kind, compiled on the first call; weights and state-dict keys are unchanged)."""
        for block in (*self.spatial_blocks, *self.temporal_blocks):
            block.compile()

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor | float,
        actions: torch.Tensor,
        x_mask: torch.Tensor | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
    ) -> torch.Tensor:
        """Velocity for latents ``x [B, in_channels, T, H, W]``.

        Args:
            timestep: ``[B]`` (or a scalar) noise level in [0, 1000].
            actions: ``[B, T - pad_action_num, action_dim]`` normalized actions, one per generated frame.
            x_mask: ``[B, T]`` bool, False for clean condition frames (modulated by timestep 15).
            height, width: pixel size of the video (default 8x the latent size); sets the scale of the
                position embedding, ``sqrt(height * width) / input_sq_size``.

        Returns:
            ``[B, out_channels, T, H, W]`` float32.
        """
        cfg = self.config
        timestep, x_mask = self._check_inputs(x, timestep, actions, x_mask)
        dtype = self.x_embedder.proj.weight.dtype
        x, timestep = x.to(dtype), timestep.to(dtype)
        frames, lat_h, lat_w = x.shape[2:]
        h, w = lat_h // cfg.patch_size[1], lat_w // cfg.patch_size[2]
        height = lat_h * VAE_DOWNSAMPLE if height is None else height
        width = lat_w * VAE_DOWNSAMPLE if width is None else width
        scale = math.sqrt(height * width) / cfg.input_sq_size
        pos = sincos_2d(
            cfg.hidden_size, h, w, scale=scale, base_size=round(math.sqrt(h * w)), device=x.device
        )

        t = self.t_embedder(timestep)  # [B, C], also the final layer's modulation
        t_spatial = self.t_block(t[:, None] + self.action_embedder(actions.to(dtype)))  # [B, T, 6C]
        t_temporal = self.t_block(t)[:, None]  # [B, 1, 6C], no action
        t0 = t0_mod = None
        if x_mask is not None:
            t0 = self.t_embedder(torch.full_like(timestep, cfg.condition_timestep))
            t0_mod = self.t_block(t0)[:, None]
        rope = self.rope.cos_sin(frames)

        x = self.x_embedder(x) + pos.to(dtype)  # [B, T, S, C]
        for spatial, temporal in zip(self.spatial_blocks, self.temporal_blocks):
            x = spatial(x, t_spatial, x_mask, t0_mod)
            x = temporal(x, t_temporal, x_mask, t0_mod, rope=rope)
        x = self.final_layer(x, t, x_mask, t0)
        _, ph, pw = cfg.patch_size
        x = rearrange(x, "B T (h w) (p q c) -> B c T (h p) (w q)", h=h, p=ph, q=pw)
        return x.float()
