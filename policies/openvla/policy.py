"""The original OpenVLA (Kim et al., 2024) as an ``ActionChunkPolicy``: one action per env step, its
D action tokens decoded one by one by the causal Llama (transformers' standard forward)::

    [BOS] [image patches] [PAD ..] "In: What action should the robot take to {instruction}?\\nOut:" '▁'
    token_d ~ softmax(top_k(logits_d[bins] / T)),  logits_d = LM(prefix, token_1 .. token_{d-1})

Decoding is restricted to the 256 action-bin ids (the top 256 of the base vocabulary, below the
padding), as RL fine-tuning of OpenVLA does; greedy acting is the argmax over those bins. (The Hugging
Face ``predict_action`` takes the argmax over the whole vocabulary and clips a non-action id to the
nearest bin; for a trained model the argmax is an action bin and the two agree.) The tokens map to
actions with OpenVLA-OFT's bins and the ``unnorm_key`` statistics (``OpenVLABase``,
``policies.binned``): ``a = unnormalize(bin_center(token), q01, q99, mask)``, the LIBERO gripper
``-sign(2 g - 1)``.

Acting decodes step by step, with a KV cache (``use_cache``) or re-running the whole sequence;
``evaluate`` rescores the stored tokens in one teacher-forced causal pass, which computes the same
logits, so a sample's log-probs from ``act`` and ``evaluate`` agree up to float rounding (the tests
check 1e-5 in float32). Padding sits between BOS and the prompt (``PromptLayout``): pads are masked
out as keys and position ids count real tokens, so a padded sample computes what it would alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from gymnasium import spaces

from nets.errors import BadInput

from ..base import ActionChunk, PolicyEval, masked_chunk_mean
from ..binned import tempered_log_softmax
from ..openvla_oft.common import OpenVLABase
from ..options import build_options
from ..torso_policy import box_chunk_shape
from .options import OPENVLA_RECIPE, OpenVLAOptions


class OpenVLAPolicy(OpenVLABase):
    """OpenVLA (autoregressive action tokens), loaded from a checkpoint folder or hub id; K = 1, E = D.

    Args:
        observation_space: a Dict with ``instruction`` and the uint8 ``[H, W, 3]`` images in ``image_keys``.
        action_space: Box ``(D,)`` or ``(1, D)``: OpenVLA predicts one action per step (chunks: the
            ``openvla_oft`` policy).
        options, **kwargs: ``OpenVLAOptions`` (``policies/openvla/options.py``), as an instance, a dict
            or keywords: ``model_path`` (OpenVLA's Hugging Face layout, statistics in ``config.json``'s
            ``norm_stats`` and/or ``dataset_statistics.json``), ``unnorm_key`` (e.g. ``bridge_orig``),
            sampling ``temperature`` and ``top_k``, ``use_cache``, LoRA...

    Replay: ``input_ids``, ``attention_mask`` ``[B, 1 + max_prompt_tokens]``, ``images`` uint8
    ``[B, n, S, S, 3]``, ``tokens`` int64 ``[B, 1, D]`` (0..255; id = vocab - 256 + token),
    ``temperature`` ``[B]``, ``top_k`` ``[B]``.
    """

    checkpoint_name, model_name = "OpenVLA checkpoint", "OpenVLA"
    options_type = OpenVLAOptions
    fine_tune_recipe = OPENVLA_RECIPE  # trainers.bc's defaults (the options module cites the source)

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        options: OpenVLAOptions | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        o = build_options(OpenVLAOptions, options, kwargs, type(self).__name__)  # checked first
        k, _ = box_chunk_shape(action_space)
        if k != 1:
            raise BadInput(
                f"OpenVLA predicts one action per step: expected an action space of shape (D,) or (1, D), "
                f"got {action_space.shape} (for chunks of actions use the openvla_oft policy)"
            )
        super().__init__(
            observation_space, action_space, model_path=o.model_path, unnorm_key=o.unnorm_key,
            norm_stats=o.norm_stats, temperature=1.0 if o.temperature is None else o.temperature,
            top_k=o.top_k, image_keys=o.image_keys, center_crop=o.center_crop, gripper=o.gripper,
            max_prompt_tokens=o.max_prompt_tokens, dtype=o.dtype, download=o.download,
        )  # fmt: skip
        self.options = o
        self.use_cache = bool(o.use_cache)
        self._add_value_head_and_lora(o.use_critic, 1, o.lora_rank, o.lora_targets, o.freeze_vision)

    # ------------------------------------------------------------------ the causal language model
    def _prefix(self, prepared: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings ``[B, L, hidden]`` of ``[BOS, patches, PAD.., prompt..]``, validity ``[B, L]``."""
        pixels = self.model.vision_backbone.pixel_values(prepared["images"])
        return self.model.embed_prefix(prepared["input_ids"], prepared["attention_mask"], pixels)

    def _run(self, embeds: torch.Tensor, valid: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """Last hidden states of ``embeds``, the newest ``embeds.shape[1]`` positions of the sequence
        whose validity is ``valid`` ``[B, T]`` (the earlier ones are in ``cache``, or there are none).
        Causal attention from the 2D padding mask; position ids count real tokens."""
        lm = self.model.language_model.model
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)[:, -embeds.shape[1] :]
        extra = {} if cache is None else {_cache_argument(lm): cache}
        out = lm(
            inputs_embeds=embeds,
            attention_mask=valid.long(),
            position_ids=positions,
            use_cache=cache is not None,
            **extra,
        )
        return out.last_hidden_state

    def _bin_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of the action-bin ids ``[..., n_bins]`` from hidden states ``[..., hidden]``."""
        logits = self.model.language_model.lm_head(hidden).float()
        return logits[..., self.bins_start : self.bins_start + self.n_bins]

    def _embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.language_model.model.embed_tokens(tokens + self.bins_start)

    def _decode(
        self, prepared: dict[str, torch.Tensor], pick: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode D tokens one by one, ``pick`` choosing each from its bin logits ``[B, n_bins]``.
        Returns the tokens ``[B, D]``, their logits ``[B, D, n_bins]`` and the value feature
        ``[B, hidden]``."""
        embeds, valid = self._prefix(prepared)
        cache = None
        if self.use_cache:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.model.language_model.config)
        hidden = self._run(embeds, valid, cache)[:, -1]
        feature, tokens, logits = hidden, [], []
        for d in range(self.action_dim):
            logits.append(self._bin_logits(hidden))
            tokens.append(pick(logits[-1]))
            if d == self.action_dim - 1:
                break
            new = self._embed_tokens(tokens[-1])[:, None]
            valid = torch.cat([valid, valid.new_ones(valid.shape[0], 1)], 1)
            if cache is None:  # re-run everything
                embeds = torch.cat([embeds, new], 1)
                hidden = self._run(embeds, valid)[:, -1]
            else:
                hidden = self._run(new, valid, cache)[:, -1]
        return torch.stack(tokens, 1), torch.stack(logits, 1), feature

    def _teacher_forced(
        self, prepared: dict[str, torch.Tensor], tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal pass over the prefix and ``tokens`` ``[B, D]``: the bin logits that predicted each
        token ``[B, D, n_bins]`` (what ``_decode`` computes step by step) and the value feature."""
        embeds, valid = self._prefix(prepared)
        n = tokens.shape[1]
        embeds = torch.cat([embeds, self._embed_tokens(tokens[:, :-1])], 1)
        valid = torch.cat([valid, valid.new_ones(valid.shape[0], n - 1)], 1)
        hidden = self._run(embeds, valid)[:, -n:]  # from the last prompt token on
        return self._bin_logits(hidden), hidden[:, 0]

    # ------------------------------------------------------------------ the policy contract
    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        b, device = prepared["input_ids"].shape[0], prepared["input_ids"].device
        temperature = torch.full((b,), self.temperature, device=device)
        top_k = torch.full((b,), self.top_k, dtype=torch.long, device=device)
        generator = self._rng(device)

        def pick(logits: torch.Tensor) -> torch.Tensor:
            if deterministic:
                return logits.argmax(-1)
            probs = tempered_log_softmax(logits, temperature, top_k).exp()
            return torch.multinomial(probs, 1, generator=generator)[:, 0]

        tokens, logits, feature = self._decode(prepared, pick)
        log_probs = None
        if not deterministic:
            logp = tempered_log_softmax(logits, temperature, top_k)
            log_probs = logp.gather(-1, tokens[..., None])[:, None, :, 0]  # [B, 1, D]
        tokens = tokens[:, None]  # K = 1
        replay = {**prepared, "tokens": tokens, "temperature": temperature, "top_k": top_k}
        return ActionChunk(self.tokens_to_actions(tokens).float(), log_probs, self._value(feature), replay)

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        """Log-probs and entropies of the stored tokens under the current weights (teacher-forced)."""
        prepared = {k: replay[k] for k in ("input_ids", "attention_mask", "images")}
        tokens = replay["tokens"].to(prepared["input_ids"].device).long()[:, 0]
        logits, feature = self._teacher_forced(prepared, tokens)
        logp = tempered_log_softmax(logits, replay["temperature"], replay["top_k"].to(logits.device))
        log_probs = logp.gather(-1, tokens[..., None])[..., 0]
        entropy = -(logp.exp() * logp).sum(-1)
        return PolicyEval(log_probs[:, None], entropy[:, None], self._value(feature))

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """OpenVLA's SFT loss over the action tokens: the cross-entropy (temperature 1, over the 256
        bins) of the demonstrated actions' bin tokens ``actions`` ``[B, 1, D]``, teacher-forced,
        summed over D and averaged over the samples (``mask`` ``[B, 1]``)."""
        prepared = self._prepare(obs)
        tokens = self.actions_to_tokens(actions.to(self.q01.device))[:, 0]
        logits, _ = self._teacher_forced(prepared, tokens)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None])[..., 0]
        return masked_chunk_mean(-logp.sum(-1, keepdim=True), mask)

    def value(self, obs: Any) -> torch.Tensor:
        if self.value_head is None:
            raise RuntimeError("OpenVLAPolicy was built with use_critic=False")
        embeds, valid = self._prefix(self._prepare(obs))
        return self._value(self._run(embeds, valid)[:, -1])


def _cache_argument(lm: torch.nn.Module) -> str:
    """The name transformers' ``LlamaModel.forward`` takes the KV cache by (``cache`` since it was
    renamed from ``past_key_values``)."""
    return "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"
