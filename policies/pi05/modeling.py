"""pi0.5: PaliGemma (SigLIP + Gemma 2B) reads the images and the prompt; a Gemma 300M action expert
turns noisy actions into a velocity, attending to the PaliGemma keys and values of every layer.

Module names are openpi's PyTorch checkpoint names (``paligemma_with_expert.paligemma.model.*``,
``paligemma_with_expert.gemma_expert.model.*``, ``action_in_proj``, ``action_out_proj``,
``time_mlp_in``, ``time_mlp_out``). SigLIP is ``transformers.SiglipVisionModel`` (its keys lack the
checkpoint's ``vision_model.`` level; ``checkpoint_keys`` maps them), Gemma's MLP and RMSNorm are
transformers' modules; the joint attention across the two experts is written here.

* Prefix: per camera 256 SigLIP tokens -> ``multi_modal_projector``; prompt embeddings times
  ``sqrt(width)``; bidirectional attention over the real prefix tokens; computed once per call and
  kept as per-layer keys/values (the KV cache).
* Suffix: ``action_in_proj(x_t)``; time enters through adaRMSNorm: ``cond = silu(time_mlp_out(silu(
  time_mlp_in(sincos(t)))))``, each expert norm gives ``n (1 + scale) + shift`` and a ``gate`` on its
  residual branch. Action tokens attend to the real prefix tokens and to each other.
* Position ids count real tokens only (``cumsum(valid) - 1``), so padding changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..flow import time_embedding
from .config import GemmaSpec, Pi05Config

ROPE_THETA = 10_000.0


class Attention(nn.Module):
    """Gemma's projections (no biases); the attention itself is computed jointly in ``Pi05Model``."""

    def __init__(self, spec: GemmaSpec):
        super().__init__()
        inner = spec.num_heads * spec.head_dim
        self.q_proj = nn.Linear(spec.width, inner, bias=False)
        self.k_proj = nn.Linear(spec.width, spec.num_kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.width, spec.num_kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(inner, spec.width, bias=False)


class AdaRMSNorm(nn.Module):
    """RMSNorm whose scale, shift and residual gate come from a condition: ``dense(cond)`` splits
    into ``(scale, shift, gate)``; output ``n * (1 + scale) + shift`` (no learned weight)."""

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond)[:, None].float().chunk(3, dim=-1)
        return (normed * (1 + scale) + shift).to(x.dtype), gate.to(x.dtype)


def _gemma_config(spec: GemmaSpec):
    from transformers import GemmaConfig

    return GemmaConfig(
        hidden_size=spec.width,
        intermediate_size=spec.mlp_dim,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        hidden_activation="gelu_pytorch_tanh",
        hidden_act="gelu_pytorch_tanh",
    )


class Layer(nn.Module):
    def __init__(self, spec: GemmaSpec, cond_dim: int | None):
        super().__init__()
        from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm

        self.self_attn = Attention(spec)
        self.mlp = GemmaMLP(_gemma_config(spec))
        if cond_dim is None:
            self.input_layernorm = GemmaRMSNorm(spec.width, eps=1e-6)
            self.post_attention_layernorm = GemmaRMSNorm(spec.width, eps=1e-6)
        else:
            self.input_layernorm = AdaRMSNorm(spec.width, cond_dim)
            self.post_attention_layernorm = AdaRMSNorm(spec.width, cond_dim)


class GemmaStack(nn.Module):
    """Gemma layers and final norm (plus the token embedding for PaliGemma; the expert has none)."""

    def __init__(self, spec: GemmaSpec, vocab_size: int | None, cond_dim: int | None):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, spec.width) if vocab_size else None
        self.layers = nn.ModuleList(Layer(spec, cond_dim) for _ in range(spec.depth))
        if cond_dim is None:
            from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

            self.norm = GemmaRMSNorm(spec.width, eps=1e-6)
        else:
            self.norm = AdaRMSNorm(spec.width, cond_dim)


def _norm(
    norm: nn.Module, x: torch.Tensor, cond: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    return norm(x, cond) if isinstance(norm, AdaRMSNorm) else (norm(x), None)


class Projector(nn.Module):
    def __init__(self, vision_dim: int, width: int):
        super().__init__()
        self.linear = nn.Linear(vision_dim, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class PaliGemmaBody(nn.Module):
    def __init__(self, config: Pi05Config):
        super().__init__()
        from transformers import SiglipVisionConfig, SiglipVisionModel

        vision, pali = config.vision(), config.paligemma()
        vision_config = SiglipVisionConfig(
            hidden_size=vision.hidden_size,
            intermediate_size=vision.intermediate_size,
            num_hidden_layers=vision.num_hidden_layers,
            num_attention_heads=vision.num_attention_heads,
            image_size=vision.image_size,
            patch_size=vision.patch_size,
            hidden_act="gelu_pytorch_tanh",
            layer_norm_eps=1e-6,
            vision_use_head=False,
        )
        vision_config._attn_implementation = "sdpa"
        self.vision_tower = SiglipVisionModel(vision_config)
        self.multi_modal_projector = Projector(vision.hidden_size, pali.width)
        self.language_model = GemmaStack(pali, config.vocab_size(), None)


class PaliGemma(nn.Module):
    def __init__(self, config: Pi05Config):
        super().__init__()
        self.model = PaliGemmaBody(config)


class GemmaExpert(nn.Module):
    def __init__(self, config: Pi05Config):
        super().__init__()
        expert = config.expert()
        self.model = GemmaStack(expert, None, expert.width)


class PaliGemmaWithExpert(nn.Module):
    def __init__(self, config: Pi05Config):
        super().__init__()
        self.paligemma = PaliGemma(config)
        self.gemma_expert = GemmaExpert(config)


@dataclass
class PrefixCache:
    """Per-layer RoPE'd keys and values of the prefix, its real-token mask and final hidden states."""

    keys: list[torch.Tensor]  # [B, KV, Lp, hd] each
    values: list[torch.Tensor]
    valid: torch.Tensor  # [B, Lp] bool
    hidden: torch.Tensor  # [B, Lp, width] after the final norm (value-head input)


class Pi05Model(nn.Module):
    """The pi0.5 network (see the module docstring)."""

    def __init__(self, config: Pi05Config):
        super().__init__()
        self.config = config
        self.pali, self.expert_spec = config.paligemma(), config.expert()
        width = self.expert_spec.width
        self.paligemma_with_expert = PaliGemmaWithExpert(config)
        self.action_in_proj = nn.Linear(config.action_dim, width)
        self.action_out_proj = nn.Linear(width, config.action_dim)
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)
        hd = self.pali.head_dim
        inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def _vlm(self) -> PaliGemmaBody:
        return self.paligemma_with_expert.paligemma.model

    @property
    def _expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model

    def embed_prefix(
        self, pixels: torch.Tensor, tokens: torch.Tensor, token_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels ``[B, n, 3, S, S]`` in [-1, 1], prompt ``tokens`` / ``token_mask`` ``[B, L]`` ->
        prefix embeddings ``[B, n * P + L, width]`` and its real-token mask."""
        b, n = pixels.shape[:2]
        vlm = self._vlm
        dtype = vlm.multi_modal_projector.linear.weight.dtype
        features = vlm.vision_tower(pixel_values=pixels.flatten(0, 1).to(dtype)).last_hidden_state
        images = vlm.multi_modal_projector(features).reshape(b, -1, self.pali.width)
        text = vlm.language_model.embed_tokens(tokens) * (self.pali.width**0.5)
        valid = torch.cat(
            [torch.ones(images.shape[:2], dtype=torch.bool, device=tokens.device), token_mask.bool()], 1
        )
        return torch.cat([images, text.to(images.dtype)], dim=1), valid

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]  # [B, 1, L, hd]

    def _qkv(self, attn: Attention, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, n, _ = h.shape
        hd = self.pali.head_dim
        q = attn.q_proj(h).view(b, n, -1, hd).transpose(1, 2)
        k = attn.k_proj(h).view(b, n, -1, hd).transpose(1, 2)
        v = attn.v_proj(h).view(b, n, -1, hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _attend(self, q, k, v, key_valid: torch.Tensor) -> torch.Tensor:
        """Queries ``[B, H, Lq, hd]`` over keys/values ``[B, KV, Lk, hd]`` whose real keys are
        ``key_valid`` ``[B, Lk]``; returns ``[B, Lq, H * hd]``."""
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask = torch.zeros(key_valid.shape, dtype=q.dtype, device=q.device)
        mask = mask.masked_fill(~key_valid, torch.finfo(q.dtype).min)[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).flatten(2)

    def prefix_cache(self, embeds: torch.Tensor, valid: torch.Tensor) -> PrefixCache:
        """Run the PaliGemma layers over the prefix (bidirectional over real tokens)."""
        stack = self._vlm.language_model
        cos, sin = self._rope((valid.long().cumsum(1) - 1).clamp(min=0))
        x, keys, values = embeds, [], []
        for layer in stack.layers:
            h = layer.input_layernorm(x)
            q, k, v = self._qkv(layer.self_attn, h, cos, sin)
            keys.append(k)
            values.append(v)
            x = x + layer.self_attn.o_proj(self._attend(q, k, v, valid))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return PrefixCache(keys, values, valid, stack.norm(x))

    def time_condition(self, t: torch.Tensor) -> torch.Tensor:
        """adaRMS condition ``[B, width]`` of times ``t`` ``[B]``."""
        emb = time_embedding(t, self.expert_spec.width).to(self.time_mlp_in.weight.dtype)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    def velocity(
        self, cache: PrefixCache, x_t: torch.Tensor, t: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Velocity ``[B, H, action_dim]`` (float32) at noisy actions ``x_t`` and times ``t`` ``[B]``,
        and the expert's final hidden states ``[B, H, width]``."""
        stack = self._expert
        dtype = self.action_in_proj.weight.dtype
        cond = self.time_condition(t)
        x = self.action_in_proj(x_t.to(dtype))
        b, horizon = x.shape[:2]
        start = cache.valid.sum(1, keepdim=True)
        cos, sin = self._rope(start + torch.arange(horizon, device=x.device))
        key_valid = torch.cat([cache.valid, torch.ones(b, horizon, dtype=torch.bool, device=x.device)], 1)
        for layer, k_prefix, v_prefix in zip(stack.layers, cache.keys, cache.values):
            h, gate = _norm(layer.input_layernorm, x, cond)
            q, k, v = self._qkv(layer.self_attn, h, cos, sin)
            k, v = torch.cat([k_prefix, k], dim=2), torch.cat([v_prefix, v], dim=2)
            x = x + layer.self_attn.o_proj(self._attend(q, k, v, key_valid)) * gate
            h, gate = _norm(layer.post_attention_layernorm, x, cond)
            x = x + layer.mlp(h) * gate
        hidden, _ = _norm(stack.norm, x, cond)
        return self.action_out_proj(hidden).float(), hidden


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


# ------------------------------------------------------------------------------- checkpoint names
VISION_OURS = ".paligemma.model.vision_tower."
VISION_FILE = ".paligemma.model.vision_tower.vision_model."
EMBED_OURS = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
EMBED_FILE = "paligemma_with_expert.paligemma.lm_head.weight"  # tied; files keep lm_head
EXPERT_LM_HEAD = "paligemma_with_expert.gemma_expert.lm_head.weight"  # in the files, never used


def from_checkpoint_keys(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """openpi / lerobot checkpoint names -> ours. Returns the mapped state and the names read but
    not used (the expert's vestigial ``lm_head``, which pi0.5 never calls)."""
    out, unused = {}, []
    for key, value in state.items():
        if key.startswith("model.paligemma_with_expert.") or key.startswith("model.action_"):
            key = key[len("model.") :]  # lerobot's PI05Policy prefix
        elif key.startswith("model.time_mlp_"):
            key = key[len("model.") :]
        if key == EXPERT_LM_HEAD:
            unused.append(key)
            continue
        if key == EMBED_FILE:
            key = EMBED_OURS
        out[key.replace(VISION_FILE, VISION_OURS)] = value
    return out, unused


def to_checkpoint_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our names -> openpi's ``model.safetensors`` names (the tied embedding stored as ``lm_head``)."""
    return {
        (EMBED_FILE if k == EMBED_OURS else k.replace(VISION_OURS, VISION_FILE)): v for k, v in state.items()
    }
