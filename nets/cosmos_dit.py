"""The Cosmos-Predict2 video DiT, in the original checkpoint key layout.

``action_dim=None`` is the plain Video2World ``MinimalV1LVGDiT`` (what the Cosmos Policy fine-tunes:
its actions live in latent frames); 84 or 28 is the action-conditioned
``ActionConditionedMinimalV1LVGDiT`` of the world models (two action MLPs; 28 is Predict2.5's
per-latent-chunk variant). Parameter names match the ``net.`` entries of a training checkpoint
exactly, so a state dict loads with ``strict=True`` after dropping buffers.

One forward pass (B samples, latent ``x [B, C, T, H, W]``):

1. concatenate a condition-mask channel (1 on conditioned latent frames) and a zero padding-mask
   channel, cut into 1x2x2 patches and project (``x_embedder``);
2. embed the per-latent-frame timestep ``t [B, T]`` as a sinusoid; an MLP of it gives the AdaLN-LoRA
   term; the action MLPs (if any) add to both; RMSNorm of the sinusoid is the AdaLN input;
3. ``num_blocks`` blocks of self-attention (3-D RoPE), cross-attention (text context) and an MLP,
   each AdaLN-modulated per latent frame (broadcast over its H*W tokens);
4. a modulated final layer and un-patchify to ``[B, out_channels, T, H, W]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nets.errors import BadInput

TEXT_TOKENS = 512  # length of the T5 context RLinf feeds (all zeros)


@dataclass
class CosmosDiTConfig:
    """Shape parameters. Defaults: the 2B v2 action DiT RLinf runs (§3.4.1)."""

    model_channels: int = 2048
    num_blocks: int = 28
    num_heads: int = 16
    mlp_ratio: float = 4.0
    in_channels: int = 16  # latent channels; the model adds the condition and padding masks
    out_channels: int = 16
    patch_spatial: int = 2
    patch_temporal: int = 1
    adaln_lora_dim: int = 256
    crossattn_emb_channels: int = 1024
    action_dim: int | None = 84  # 84 = 12x7 global embedding; 28 = 4x7 per latent (Predict2.5); None: none
    crossattn_proj_in_channels: int | None = None  # 100352 for Predict2.5 (Reason1 embeddings)
    rope_scale: tuple[float, float, float] = (1.0, 3.0, 3.0)  # NTK extrapolation ratios (t, h, w)
    max_size: tuple[int, int, int] = (128, 240, 240)  # latent (frames, height, width) the RoPE covers
    timestep_scale: float = 1.0
    eps: float = 1e-6

    # Published 2B configurations. Source: nvidia-cosmos/cosmos-predict2
    # ``cosmos_predict2/configs/base/config_video2world.py`` (``PREDICT2_VIDEO2WORLD_NET_2B``) and
    # ``configs/action_conditioned/...`` (``_PREDICT2_ACTION_CONDITIONED_NET_2B``: action_dim 7 x 12);
    # model cards nvidia/Cosmos-Predict2-2B-Video2World, nvidia/Cosmos-Policy-LIBERO-Predict2-2B,
    # nvidia/Cosmos-Predict2.5-2B. diffusers' ``CosmosTransformer3DModel`` at the same sizes is the
    # reference count (``benchmarks/real_size.py``).

    @classmethod
    def predict2_2b_video2world(cls) -> CosmosDiTConfig:
        """Cosmos-Predict2-2B Video2World (``MinimalV1LVGDiT``, T5 context, no action input): the DiT
        Cosmos Policy fine-tunes. 1,956,413,440 parameters."""
        return cls(action_dim=None)

    @classmethod
    def predict2_action_2b(cls) -> CosmosDiTConfig:
        """The v2 action-conditioned 2B DiT RLinf runs (the defaults): Video2World plus two action MLPs
        of the 12 x 7 chunk. 2,024,923,136 parameters."""
        return cls()

    @classmethod
    def predict2_5_action_2b(cls) -> CosmosDiTConfig:
        """The Cosmos Predict 2.5 LIBERO world model's DiT (``tayalmanan/cosmos-robotics``
        ``libero-spatial-2b-19k.pt``): the action DiT plus Predict2.5's Reason1 text projection
        (``crossattn_proj``, Linear 100352 -> 1024). 2,127,684,608 parameters; the 11.89 GiB file is
        6 bytes per parameter (fp32 weights and bf16 EMA)."""
        return cls(crossattn_proj_in_channels=100_352)

    @property
    def head_dim(self) -> int:
        return self.model_channels // self.num_heads

    @property
    def action_per_latent(self) -> bool:
        """True for the Predict2.5 chunk variant (one 4-action embedding per latent frame)."""
        return self.action_dim == 28

    def validate(self) -> None:
        """Raise ``ValueError`` for shapes the module cannot build."""
        if self.model_channels % self.num_heads:
            raise BadInput(
                f"model_channels ({self.model_channels}) must be a multiple of num_heads ({self.num_heads})"
            )
        if self.head_dim // 6 * 2 < 4:
            raise BadInput(f"head dim {self.head_dim} too small for 3-D RoPE (need at least 12)")
        if self.patch_temporal != 1:
            raise BadInput(f"expected patch_temporal 1 (per-frame timesteps), got {self.patch_temporal}")
        if self.action_dim not in (84, 28, None):
            raise BadInput(
                f"expected action_dim 84 (12 x 7 actions, global), 28 (4 x 7 per latent) or None "
                f"(no action input), got {self.action_dim}"
            )


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a learnable weight, computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return y.to(x.dtype)


class Patchify(nn.Module):
    """``[B, C, T, H, W] -> [B, T, H/p, W/p, C*p*p]`` (channel-major inside a patch)."""

    def __init__(self, patch: int) -> None:
        super().__init__()
        self.patch = patch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        p = self.patch
        x = x.reshape(b, c, t, h // p, p, w // p, p)
        return x.permute(0, 2, 3, 5, 1, 4, 6).flatten(4)


class PatchEmbed(nn.Module):
    """Keys ``x_embedder.proj.1.weight``: index 0 is the (parameter-free) rearrange."""

    def __init__(self, in_channels: int, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(Patchify(patch), nn.Linear(in_channels * patch * patch, dim, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Timesteps(nn.Module):
    """``cat[cos(t f), sin(t f)]`` with ``f_i = 10000^(-i/half)``, in fp32."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        exponents = torch.arange(half, device=t.device, dtype=torch.float32) / half
        freqs = torch.exp(-math.log(10000.0) * exponents)
        angles = t.float()[..., None] * freqs
        return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class TimestepEmbedding(nn.Module):
    """Sinusoid -> (sinusoid, AdaLN-LoRA ``linear_2(silu(linear_1(sinusoid)))`` of size 3*D)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim, bias=False)
        self.linear_2 = nn.Linear(dim, 3 * dim, bias=False)

    def forward(self, sinusoid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sinusoid = sinusoid.to(self.linear_1.weight.dtype)
        return sinusoid, self.linear_2(F.silu(self.linear_1(sinusoid)))


class Mlp(nn.Module):
    """``fc2(gelu_tanh(fc1(x)))`` with biases: the action embedders."""

    def __init__(self, in_features: int, hidden: int, out_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class FeedForward(nn.Module):
    """``layer2(gelu(layer1(x)))``, no biases."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(dim, hidden, bias=False)
        self.layer2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(F.gelu(self.layer1(x)))


def adaln_modulation(dim: int, lora_dim: int, chunks: int) -> nn.Sequential:
    """``SiLU -> Linear(D, lora) -> Linear(lora, chunks*D)`` (keys ``.1`` and ``.2``)."""
    return nn.Sequential(
        nn.SiLU(), nn.Linear(dim, lora_dim, bias=False), nn.Linear(lora_dim, chunks * dim, bias=False)
    )


def rope_frequencies(config: CosmosDiTConfig, t: int, h: int, w: int, device: torch.device) -> torch.Tensor:
    """3-D RoPE angles ``[t*h*w, head_dim]``: ``cat([t, h, w] * 2)`` over integer token positions."""
    dim_h = config.head_dim // 6 * 2
    dim_t = config.head_dim - 2 * dim_h
    scale_t, scale_h, scale_w = config.rope_scale

    def axis(n: int, dim: int, scale: float) -> torch.Tensor:
        theta = 10000.0 * scale ** (dim / (dim - 2))  # NTK-aware extrapolation
        exponents = torch.arange(0, dim, 2, device=device, dtype=torch.float32)[: dim // 2] / dim
        return torch.outer(torch.arange(n, device=device, dtype=torch.float32), 1.0 / theta**exponents)

    ft = axis(t, dim_t, scale_t)[:, None, None, :].expand(t, h, w, -1)
    fh = axis(h, dim_h, scale_h)[None, :, None, :].expand(t, h, w, -1)
    fw = axis(w, dim_h, scale_w)[None, None, :, :].expand(t, h, w, -1)
    return torch.cat([ft, fh, fw] * 2, dim=-1).flatten(0, 2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on ``x [B, N, heads, d]`` with ``cos/sin [N, 1, d]``, in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Multi-head attention with per-head RMSNorm on q and k (no biases); SDPA."""

    def __init__(self, dim: int, context_dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(context_dim, dim, bias=False)
        self.v_proj = nn.Linear(context_dim, dim, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.output_proj = nn.Linear(dim, dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        rope: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        context = x if context is None else context
        q = self.q_norm(self.q_proj(x).unflatten(-1, (self.num_heads, -1)))
        k = self.k_norm(self.k_proj(context).unflatten(-1, (self.num_heads, -1)))
        v = self.v_proj(context).unflatten(-1, (self.num_heads, -1))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.output_proj(out.transpose(1, 2).flatten(2))

    def constant_output(self, token: torch.Tensor) -> torch.Tensor:
        """The output for any query when every context token equals ``token [C]``: softmax is then
        uniform over identical values, so attention returns ``output_proj(v_proj(token))``."""
        return self.output_proj(self.v_proj(token))


class Block(nn.Module):
    """Self-attention, cross-attention and MLP, each ``x += gate * f(LN(x) * (1 + scale) + shift)``."""

    def __init__(self, config: CosmosDiTConfig) -> None:
        super().__init__()
        d, lora = config.model_channels, config.adaln_lora_dim
        self.eps = config.eps
        self.self_attn = Attention(d, d, config.num_heads, config.eps)
        self.cross_attn = Attention(d, config.crossattn_emb_channels, config.num_heads, config.eps)
        self.mlp = FeedForward(d, int(d * config.mlp_ratio))
        self.adaln_modulation_self_attn = adaln_modulation(d, lora, 3)
        self.adaln_modulation_cross_attn = adaln_modulation(d, lora, 3)
        self.adaln_modulation_mlp = adaln_modulation(d, lora, 3)
        # cross-attention output for a constant context (CosmosDiT.cache_cross_attention)
        self.register_buffer("cross_attn_const", None, persistent=False)

    def _modulated(self, x: torch.Tensor, mod: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[B, T, S, D]``, mod ``[B, T, 3D]`` -> (normalized, modulated x; gate ``[B, T, 1, D]``)."""
        shift, scale, gate = (m.unsqueeze(2) for m in mod.chunk(3, dim=-1))
        return F.layer_norm(x, x.shape[-1:], eps=self.eps) * (1 + scale) + shift, gate

    def forward(
        self,
        x: torch.Tensor,
        emb: torch.Tensor,
        lora: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context: torch.Tensor | None,
    ) -> torch.Tensor:
        b, t, s, d = x.shape
        h, gate = self._modulated(x, self.adaln_modulation_self_attn(emb) + lora)
        x = x + gate * self.self_attn(h.reshape(b, t * s, d), rope=rope).view(b, t, s, d)

        h, gate = self._modulated(x, self.adaln_modulation_cross_attn(emb) + lora)
        if context is None:  # cached constant (does not depend on the query)
            x = x + gate * self.cross_attn_const
        else:
            x = x + gate * self.cross_attn(h.reshape(b, t * s, d), context).view(b, t, s, d)

        h, gate = self._modulated(x, self.adaln_modulation_mlp(emb) + lora)
        return x + gate * self.mlp(h)


class FinalLayer(nn.Module):
    """AdaLN (shift, scale; LoRA term's first 2D entries) then ``Linear(D, p*p*C)``."""

    def __init__(self, config: CosmosDiTConfig) -> None:
        super().__init__()
        d = config.model_channels
        self.eps = config.eps
        self.adaln_modulation = adaln_modulation(d, config.adaln_lora_dim, 2)
        out = config.patch_spatial**2 * config.patch_temporal * config.out_channels
        self.linear = nn.Linear(d, out, bias=False)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, lora: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        mod = self.adaln_modulation(emb) + lora[..., : 2 * d]
        shift, scale = (m.unsqueeze(2) for m in mod.chunk(2, dim=-1))
        return self.linear(F.layer_norm(x, (d,), eps=self.eps) * (1 + scale) + shift)


class CosmosDiT(nn.Module):
    """The Cosmos video DiT, with or without action input (original key layout; see the module docstring)."""

    def __init__(self, config: CosmosDiTConfig | None = None) -> None:
        super().__init__()
        config = config or CosmosDiTConfig()
        config.validate()
        self.config = config
        d = config.model_channels
        self.x_embedder = PatchEmbed(config.in_channels + 2, d, config.patch_spatial)
        self.t_embedder = nn.Sequential(Timesteps(d), TimestepEmbedding(d))
        self.t_embedding_norm = RMSNorm(d, config.eps)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_blocks))
        self.final_layer = FinalLayer(config)
        if config.action_dim is not None:
            self.action_embedder_B_D = Mlp(config.action_dim, 4 * d, d)
            self.action_embedder_B_3D = Mlp(config.action_dim, 4 * d, 3 * d)
        self.crossattn_proj = None
        if config.crossattn_proj_in_channels is not None:
            self.crossattn_proj = nn.Sequential(
                nn.Linear(config.crossattn_proj_in_channels, config.crossattn_emb_channels), nn.GELU()
            )
        self.use_cross_attention_cache = False

    @property
    def dtype(self) -> torch.dtype:
        return self.x_embedder.proj[1].weight.dtype

    @property
    def device(self) -> torch.device:
        return self.x_embedder.proj[1].weight.device

    # ---- text context / cross-attention ----

    def project_context(self, text_embeddings: torch.Tensor) -> torch.Tensor:
        """Raw Predict2.5 text embeddings ``[B, L, 100352]`` -> context ``GELU(crossattn_proj(.))``."""
        if self.crossattn_proj is None:
            raise BadInput("this checkpoint has no crossattn_proj (expected a Predict2.5 checkpoint)")
        return self.crossattn_proj(text_embeddings.to(self.device, self.dtype))

    def text_context(self, kind: str, batch: int = 1, tokens: int = TEXT_TOKENS) -> torch.Tensor:
        """A constant context ``[batch, tokens, crossattn_emb_channels]``.

        ``"zeros"``: RLinf's zero T5 context (cross-attention then outputs exactly 0).
        ``"proj_of_zero"``: ``crossattn_proj`` applied to zero text embeddings, i.e. ``GELU(bias)``.
        """
        if kind == "zeros":
            token = torch.zeros(self.config.crossattn_emb_channels, device=self.device, dtype=self.dtype)
        elif kind == "proj_of_zero":
            in_channels = self.config.crossattn_proj_in_channels or 0
            token = self.project_context(torch.zeros(in_channels, device=self.device))
        else:
            raise BadInput(f"expected text context 'zeros' or 'proj_of_zero', got {kind!r}")
        return token.expand(batch, tokens, -1)

    @torch.no_grad()
    def cache_cross_attention(self, context: torch.Tensor) -> None:
        """Precompute every block's cross-attention output for a context whose tokens are all equal
        (exact: see ``Attention.constant_output``) and use it from now on instead of attention."""
        token = context.reshape(-1, context.shape[-1])
        if not torch.equal(token, token[:1].expand_as(token)):
            raise BadInput("cross-attention can only be cached for a context whose tokens are all equal")
        token = token[0].to(self.device, self.dtype)
        for block in self.blocks:
            block.cross_attn_const = block.cross_attn.constant_output(token)
        self.use_cross_attention_cache = True

    def fsdp_units(self) -> list[nn.Module]:
        """The blocks, each run through its own ``forward``: what FSDP shards one by one."""
        return list(self.blocks)

    def compile_blocks(self) -> None:
        """``torch.compile`` each block in place (regional compilation: the blocks share one graph,
        compiled on the first call; weights and state-dict keys are unchanged). The DiT's matrix
        products leave a GPU mostly idle next to its elementwise work, which compilation fuses."""
        for block in self.blocks:
            block.compile()

    def clear_cross_attention_cache(self) -> None:
        """Go back to computing cross-attention from the context passed to ``forward``."""
        for block in self.blocks:
            block.cross_attn_const = None
        self.use_cross_attention_cache = False

    # ---- forward ----

    def embed_action(self, action: torch.Tensor, cond_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Action ``[B, K, A]`` -> terms for the sinusoid ``[B, T|1, D]`` and the LoRA ``[B, T|1, 3D]``."""
        b, k, a = action.shape
        action = action.to(self.dtype)
        if not self.config.action_per_latent:  # one embedding of all actions, broadcast over T
            if k * a != self.config.action_dim:
                raise BadInput(f"expected {self.config.action_dim} action values per sample, got [{k}, {a}]")
            flat = action.reshape(b, 1, k * a)
            return self.action_embedder_B_D(flat), self.action_embedder_B_3D(flat)
        t = cond_mask.shape[1]
        per_latent = self.config.action_dim // a if self.config.action_dim % a == 0 else 0
        if per_latent == 0 or k != per_latent * (t - 1):
            raise BadInput(
                f"expected {(t - 1)} latent chunks of {self.config.action_dim} action values "
                f"([B, {(t - 1) * max(per_latent, 1)}, {a}]), got [{b}, {k}, {a}]"
            )
        chunks = action.reshape(b, t - 1, per_latent * a)
        keep = (1 - cond_mask).to(self.dtype)[..., None]  # no action embedding on condition frames
        out = []
        for mlp in (self.action_embedder_B_D, self.action_embedder_B_3D):
            emb = mlp(chunks)
            emb = torch.cat([torch.zeros_like(emb[:, :1]), emb], dim=1)  # latent 0 has no action
            out.append(emb * keep)
        return out[0], out[1]

    def forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        action: torch.Tensor | None,
        context: torch.Tensor | None = None,
        cond_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predict the velocity-like output ``[B, out_channels, T, H, W]`` (model dtype).

        Args:
            x: latents ``[B, in_channels, T, H, W]`` (H, W multiples of the patch size).
            timesteps: per-latent-frame RF time ``[B, T]`` in [0, 1] (or ``[B]`` for all frames).
            action: ``[B, K, 7]`` (already scaled), K*7 = action_dim or per-latent chunks; None
                without action input (``action_dim=None``).
            context: ``[B, L, crossattn_emb_channels]``; ``None`` means the zero context, or the
                cached constant when ``cache_cross_attention`` was called.
            cond_mask: ``[B, T]`` 1 on conditioned latent frames; default: latent 0 only.
        """
        cfg = self.config
        if x.ndim != 5 or x.shape[1] != cfg.in_channels:
            raise BadInput(f"expected latents [B, {cfg.in_channels}, T, H, W], got {list(x.shape)}")
        b, _, t, h, w = x.shape
        p = cfg.patch_spatial
        if h % p or w % p:
            raise BadInput(f"latent height/width must be multiples of {p}, got {h}x{w}")
        if t > cfg.max_size[0] or h > cfg.max_size[1] or w > cfg.max_size[2]:
            raise BadInput(f"latent size {t}x{h}x{w} exceeds max_size {cfg.max_size}")
        if timesteps.ndim == 1:
            timesteps = timesteps[:, None].expand(b, t)
        if timesteps.shape != (b, t):
            raise BadInput(f"expected timesteps [{b}, {t}] or [{b}], got {list(timesteps.shape)}")
        if (action is None) != (cfg.action_dim is None):
            raise BadInput(
                f"action_dim is {cfg.action_dim}: pass {'no' if cfg.action_dim is None else 'an'} action"
            )
        if action is not None and (action.ndim != 3 or action.shape[0] != b):
            raise BadInput(f"expected action [{b}, K, A], got {list(action.shape)}")
        if cond_mask is None:
            cond_mask = torch.zeros(b, t, device=x.device)
            cond_mask[:, 0] = 1.0
        if cond_mask.shape != (b, t):
            raise BadInput(f"expected cond_mask [{b}, {t}], got {list(cond_mask.shape)}")

        dtype = self.dtype
        mask = cond_mask.to(x.device, dtype)[:, None, :, None, None].expand(b, 1, t, h, w)
        x = torch.cat([x.to(dtype), mask, torch.zeros_like(mask)], dim=1)
        x = self.x_embedder(x).flatten(2, 3)  # [B, T, S, D]

        emb, lora = self.t_embedder(timesteps * cfg.timestep_scale)  # [B, T, D], [B, T, 3D]
        if action is not None:
            action_d, action_3d = self.embed_action(action, cond_mask.to(x.device))
            emb, lora = emb + action_d, lora + action_3d
        emb = self.t_embedding_norm(emb)

        angles = rope_frequencies(cfg, t, h // p, w // p, x.device)[:, None, :]
        rope = (torch.cos(angles), torch.sin(angles))

        if self.use_cross_attention_cache:
            if context is not None:
                raise BadInput("cross-attention is cached: pass context=None (or clear the cache)")
        elif context is None:
            context = self.text_context("zeros", b, 1)  # one zero token: the output is exactly 0
        else:
            context = context.to(x.device, dtype)

        for block in self.blocks:
            x = block(x, emb, lora, rope, context)
        x = self.final_layer(x, emb, lora)  # [B, T, S, p*p*C]

        x = x.view(b, t, h // p, w // p, p, p, cfg.out_channels)  # (p1 p2 C) inside a patch
        return x.permute(0, 6, 1, 2, 4, 3, 5).reshape(b, cfg.out_channels, t, h, w)
