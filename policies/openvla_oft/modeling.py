"""The Prismatic VLA (OpenVLA's architecture): vision backbone -> MLP projector -> Llama-2, with
OpenVLA-OFT's one-pass ("parallel") decoding of a whole action chunk (``forward``). ``embed_prefix``
is the multimodal prefix that pass and the original OpenVLA's causal, token-by-token decoding
(``policies/openvla``) both start from.

Module names are the checkpoints': ``vision_backbone.featurizer`` / ``fused_featurizer``,
``projector.fc1..fc3``, ``language_model`` (``transformers.LlamaForCausalLM``).

Sequence of one forward pass (text ids laid out by ``policy.PromptLayout``)::

    [BOS] [image patches] ([proprio]) [PAD ...] [prompt tokens ... '▁'] [A action placeholders] [STOP]

Patches go right after BOS (OpenVLA-OFT's proprio token, ``proprio.py``, right after them). Padding
sits between the patches and the prompt (RLinf's layout), so every sample's action positions are at
the same offsets from the end; pads are masked out as keys and position ids count real tokens only,
so a padded sample computes exactly what it would alone. Placeholder embeddings are zeroed; the STOP
token (``</s>``) is kept, as OpenVLA-OFT and SimpleVLA-RL train and decode (RLinf drops it:
``stop_id=None``). Attention is fully bidirectional over the real tokens: that is what the
OpenVLA-OFT transformers fork does (its SDPA path drops the causal mask; openvla_facts: bc339d9a
"Full bidirectional attention"). Element j of the chunk is read from the logits one position before
its placeholder; the L1 action head reads the hidden states at those same positions (OpenVLA-OFT's
slice starts at the prompt's last token).
"""

from __future__ import annotations

import torch
from torch import nn

from nets.errors import BadInput

from .config import OpenVLAConfig
from .vision import VisionBackbone


class PrismaticProjector(nn.Module):
    """Vision features -> LLM width: ``fc1 (4x) -> GELU -> fc2 -> GELU -> fc3`` when fused,
    ``fc1 -> GELU -> fc2`` otherwise."""

    def __init__(self, vision_dim: int, llm_dim: int, fused: bool):
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
            self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
            self.fc3 = nn.Linear(llm_dim, llm_dim)
        else:
            self.fc1 = nn.Linear(vision_dim, llm_dim)
            self.fc2 = nn.Linear(llm_dim, llm_dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc2(self.act(self.fc1(x)))
        return self.fc3(self.act(x)) if self.fused else x


class OpenVLAModel(nn.Module):
    """Prismatic vision backbone, projector and Llama language model."""

    def __init__(self, config: OpenVLAConfig):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.config = config
        self.vision_backbone = VisionBackbone(config.towers())
        llama_config = config.llama_config()
        llama_config._attn_implementation = "sdpa"
        self.projector = PrismaticProjector(
            self.vision_backbone.embed_dim, llama_config.hidden_size, config.use_fused_vision_backbone
        )
        self.language_model = LlamaForCausalLM(llama_config)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        num_actions: int,
        stop_id: int | None = None,
        output: str = "logits",
        extra_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One parallel-decoding pass.

        Args:
            input_ids: int64 ``[B, L]``, ``[BOS, PAD.., prompt.., "▁"]`` (placeholders, STOP added here).
            attention_mask: ``[B, L]``, 1 for real tokens, 0 for padding.
            pixel_values: ``[B, n_images, 3 * n_towers, S, S]`` (``VisionBackbone.pixel_values``).
            num_actions: A, the number of action placeholders.
            stop_id: the token appended after the placeholders (None: none).
            output: ``"logits"``, or ``"hidden"`` for the last hidden states at the same positions
                (what OpenVLA-OFT's L1 action head reads; the LM head is then not run).
            extra_tokens: ``[B, n, hidden]`` embeddings placed after the patches (the proprio token).

        Returns:
            logits ``[B, A, vocab]`` (float32) predicting each action element (or, with ``output``
            ``"hidden"``, the hidden states ``[B, A, hidden]``), and the last hidden state
            ``[B, hidden]`` at the last prompt token (the value-head feature).
        """
        if output not in ("logits", "hidden"):
            raise BadInput(f"output must be 'logits' or 'hidden', got {output!r}")
        lm = self.language_model.model
        prefix, valid = self.embed_prefix(input_ids, attention_mask, pixel_values, extra_tokens)
        b, device = prefix.shape[0], prefix.device
        embeds = [prefix, prefix.new_zeros(b, num_actions, prefix.shape[-1])]  # zeroed action embeddings
        if stop_id is not None:
            embeds.append(lm.embed_tokens(input_ids.new_full((b, 1), stop_id)))
        tail = int(stop_id is not None)  # tokens after the placeholders
        embeds = torch.cat(embeds, 1)
        valid = torch.cat([valid, valid.new_ones(b, num_actions + tail)], 1)
        position_ids = (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = torch.zeros(b, 1, valid.shape[1], valid.shape[1], dtype=embeds.dtype, device=device)
        mask = mask.masked_fill(~valid[:, None, None, :], torch.finfo(embeds.dtype).min)  # pad keys only
        # no KV cache: one pass (activation checkpointing would update a cache again in its recompute)
        out = lm(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids, use_cache=False)
        hidden = out.last_hidden_state
        first = hidden.shape[1] - tail - num_actions  # first placeholder
        at_actions = hidden[:, first - 1 : first - 1 + num_actions]
        if output == "hidden":
            return at_actions, hidden[:, first - 1]
        return self.language_model.lm_head(at_actions).float(), hidden[:, first - 1]

    def embed_prefix(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        extra_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The input embeddings ``[B, L + n_patches, hidden]`` of ``[BOS, patches.., text..]`` (the
        projected image patches go right after BOS, then ``extra_tokens`` if given) and their
        validity ``[B, L + n_patches]`` (bool: False at padding)."""
        text = self.language_model.model.embed_tokens(input_ids)
        patches = self.projector(self.vision_backbone(pixel_values)).to(text.dtype)
        if extra_tokens is not None:
            patches = torch.cat([patches, extra_tokens.to(text.dtype)], 1)
        embeds = torch.cat([text[:, :1], patches, text[:, 1:]], 1)
        real = attention_mask.bool()
        ones = real.new_ones(real.shape[0], patches.shape[1])
        return embeds, torch.cat([real[:, :1], ones, real[:, 1:]], 1)
