"""OpenVLA-OFT (parallel decoding) as an ``ActionChunkPolicy``, with token actions or the L1 head.

One forward pass scores all K*D action elements of a chunk over the 256 action-bin tokens (the
top 256 ids of the text vocabulary). Sampling, log-probs, top-k and the bin/un-normalization math are
``policies.binned``'s (OpenVLA's), shared with the small ``BinnedPolicy``:

    p = softmax(top_k(logits[bins] / T));   token ~ p;   log-prob = log p[token]   (E = D per step)
    action = unnormalize(bin_center(token), q01, q99, mask);   LIBERO gripper: -sign(2 g - 1)

The replay keeps the tokenized prompt, the resized uint8 images and the sampled tokens, so
``evaluate`` rescores exactly what ``act`` sampled (at each sample's temperature and top-k).

``action_head="l1"`` is continuous OpenVLA-OFT instead (``action_heads.py``): the same pass, but the
hidden states at the K*D action positions go through the L1-regression MLP head, which predicts
the normalised chunk; ``imitation_loss`` is the L1 loss and deterministic acting un-normalizes the
head's output. The OFT recipe's head is deterministic and has no log-probs; for RL this policy
samples, when asked to (``act(deterministic=False)``), from a Laplace distribution centred on the
head's output with scale ``l1_scale x temperature`` in the normalised space (the distribution whose
negative log-likelihood is the L1 loss, up to its scale), and its log-probs are that density's:
a real stochastic policy, but this project's addition, not the recipe's. GRPO as SimpleVLA-RL and
RLinf run it uses the token mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from nets.errors import BadInput

from ..base import ActionChunk, PolicyEval, masked_chunk_mean
from ..binned import normalize, tempered_log_softmax
from ..options import build_options
from ..pretrained import load_strict
from .action_heads import HEAD_FILE_PATTERN, L1RegressionActionHead, find_head_file, read_head_state
from .common import OpenVLABase, PromptLayout, load_model
from .options import OFT_RECIPE, OpenVLAOFTOptions
from .proprio import load_proprio_projector, proprio_stats

# PromptLayout and load_model moved to common.py (shared with policies/openvla); still importable here
__all__ = ["OpenVLAOFTPolicy", "PromptLayout", "laplace_log_prob", "load_action_head", "load_model"]


class OpenVLAOFTPolicy(OpenVLABase):
    """OpenVLA-OFT with token actions or the L1 action head, loaded from a checkpoint folder or hub
    id; E = D.

    Args:
        observation_space: a Dict with ``instruction`` and the uint8 ``[H, W, 3]`` images in ``image_keys``.
        action_space: Box ``(K, D)`` (or ``(D,)``, K = 1); K * D placeholders are decoded per call.
        options: ``OpenVLAOFTOptions`` (``options.py``: ``model_path``, ``action_head``, ``temperature``,
            ``lora_rank``, ... each with its default and meaning), as keywords or as ``options=``, an
            instance or a dict of some of them; an unknown keyword is an ``OptionsError`` naming the
            accepted ones.

    Replay: ``input_ids``, ``attention_mask`` ``[B, 1 + max_prompt_tokens]``, ``images`` uint8
    ``[B, n, S, S, 3]``, ``tokens`` int64 ``[B, K, D]`` (0..255; id = vocab - 256 + token),
    ``temperature`` ``[B]``, ``top_k`` ``[B]``; with the L1 head ``normalized`` float32 ``[B, K, D]``
    (the sampled normalised actions) and ``scale`` ``[B]`` instead of ``tokens``, ``temperature``, ``top_k``.
    """

    checkpoint_name, model_name = "OpenVLA-OFT checkpoint", "OpenVLA-OFT"
    options_type = OpenVLAOFTOptions
    fine_tune_recipe = OFT_RECIPE  # trainers.bc's defaults (the options module cites the source)

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        options: OpenVLAOFTOptions | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        o = build_options(OpenVLAOFTOptions, options, kwargs, type(self).__name__)  # checked first
        temperature = o.temperature
        if temperature is None:
            temperature = 1.0 if o.action_head == "l1" else 1.6
        super().__init__(
            observation_space, action_space, model_path=o.model_path, unnorm_key=o.unnorm_key,
            norm_stats=o.norm_stats, temperature=temperature, top_k=o.top_k, image_keys=o.image_keys,
            center_crop=o.center_crop, gripper=o.gripper, max_prompt_tokens=o.max_prompt_tokens,
            dtype=o.dtype, download=o.download,
        )  # fmt: skip
        self.options = o
        action_head = o.action_head
        self.action_head_type, self.l1_scale = action_head, float(o.l1_scale)
        self.stop_id = self.layout.tokenizer.eos_token_id if o.append_stop else None

        hidden = self.model.language_model.config.hidden_size
        self.action_head = None
        bounds = [torch.as_tensor(np.asarray(b, np.float32)).reshape(self.chunk_size, self.action_dim)
                  for b in (action_space.low, action_space.high)]  # fmt: skip
        self.register_buffer("low", bounds[0], persistent=False)  # L1 actions are clipped to the space
        self.register_buffer("high", bounds[1], persistent=False)
        if action_head == "l1":
            folder = self.checkpoint_folder
            self.action_head = load_action_head(folder, hidden, self.action_dim, o.new_action_head)
            self.action_head.to(next(self.model.parameters()).dtype)
        self.proprio_projector = None
        if o.use_proprio:
            space = getattr(observation_space, "spaces", {}).get("proprio")
            if not (isinstance(space, spaces.Box) and len(space.shape) == 1):
                raise BadInput(
                    "use_proprio reads a 1-D Box observation 'proprio'; the env's observations are "
                    f"{observation_space}"
                )
            q01, q99 = proprio_stats(self.norm_stats, self.unnorm_key, space.shape[0])
            self.register_buffer("proprio_q01", q01)
            self.register_buffer("proprio_q99", q99)
            self.proprio_projector = load_proprio_projector(
                self.checkpoint_folder, hidden, space.shape[0], o.new_proprio_projector
            ).to(next(self.model.parameters()).dtype)
        kv = 1 if o.value_type == "chunk" else self.chunk_size
        self._add_value_head_and_lora(o.use_critic, kv, o.lora_rank, o.lora_targets, o.freeze_vision)

    def _prepare(self, obs: Any) -> dict[str, torch.Tensor]:
        prepared = super()._prepare(obs)
        if self.proprio_projector is not None:  # the state, normalised as OFT deploys it
            state = torch.as_tensor(np.asarray(obs["proprio"]), device=self.q01.device)
            prepared["proprio"] = normalize(state.float(), self.proprio_q01, self.proprio_q99)
        return prepared

    def required_observation_keys(self) -> tuple[str, ...]:
        state = ("proprio",) if self.proprio_projector is not None else ()
        return (*super().required_observation_keys(), *state)

    # ------------------------------------------------------------------ one parallel-decoding pass
    def _forward(self, prepared: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Action-bin logits ``[B, K, D, n_bins]`` (float32) and the value feature ``[B, hidden]``;
        with the L1 head, its normalised actions ``[B, K, D]`` (float32) instead of the logits."""
        pixels = self.model.vision_backbone.pixel_values(prepared["images"])
        n = self.chunk_size * self.action_dim
        output = "hidden" if self.action_head is not None else "logits"
        projector = self.proprio_projector
        extra = None if projector is None else projector(prepared["proprio"].to(projector.fc1.weight.dtype))
        logits, feature = self.model(
            prepared["input_ids"], prepared["attention_mask"], pixels, n, self.stop_id, output, extra
        )
        if self.action_head is not None:
            return self.action_head(logits).float(), feature
        bins = logits[..., self.bins_start : self.bins_start + self.n_bins]
        return bins.reshape(-1, self.chunk_size, self.action_dim, self.n_bins), feature

    # ------------------------------------------------------------------ the policy contract
    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        if self.action_head is not None:
            return self._act_l1(prepared, deterministic)
        logits, feature = self._forward(prepared)
        b, device = logits.shape[0], logits.device
        temperature = torch.full((b,), self.temperature, device=device)
        top_k = torch.full((b,), self.top_k, dtype=torch.long, device=device)
        if deterministic:
            tokens, log_probs = logits.argmax(-1), None
        else:
            logp = tempered_log_softmax(logits, temperature, top_k)
            probs = logp.exp().reshape(-1, self.n_bins)
            tokens = torch.multinomial(probs, 1, generator=self._rng(device)).reshape(logp.shape[:-1])
            log_probs = logp.gather(-1, tokens[..., None])[..., 0]
        replay = {**prepared, "tokens": tokens, "temperature": temperature, "top_k": top_k}
        return ActionChunk(self.tokens_to_actions(tokens).float(), log_probs, self._value(feature), replay)

    def _act_l1(self, prepared: dict[str, torch.Tensor], deterministic: bool) -> ActionChunk:
        mean, feature = self._forward(prepared)
        b, device = mean.shape[0], mean.device
        scale = torch.full((b,), self.l1_scale * self.temperature, device=device)
        if deterministic:
            sample, log_probs = mean, None
        else:  # Laplace(mean, scale) by its inverse CDF
            u = torch.rand(mean.shape, generator=self._rng(device), device=device) - 0.5
            u = u.clamp(-0.5 + 1e-7, 0.5 - 1e-7)
            sample = mean - scale[:, None, None] * torch.sign(u) * torch.log1p(-2 * u.abs())
            log_probs = laplace_log_prob(sample, mean, scale)
        replay = {**prepared, "normalized": sample, "scale": scale}
        actions = self.normalized_to_actions(sample)
        actions = torch.minimum(torch.maximum(actions, self.low.to(device)), self.high.to(device))
        return ActionChunk(actions.float(), log_probs, self._value(feature), replay)

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        """Log-probs and entropies of the stored tokens (or L1 head samples) under the current weights."""
        prepared = {k: replay[k] for k in ("input_ids", "attention_mask", "images", "proprio") if k in replay}
        if self.action_head is not None:
            mean, feature = self._forward(prepared)
            scale = replay["scale"].to(mean.device, torch.float32)
            log_probs = laplace_log_prob(replay["normalized"].to(mean.device), mean, scale)
            entropy = (1 + torch.log(2 * scale))[:, None, None].expand_as(mean)
            return PolicyEval(log_probs, entropy, self._value(feature))
        logits, feature = self._forward(prepared)
        logp = tempered_log_softmax(logits, replay["temperature"], replay["top_k"].to(logits.device))
        log_probs = logp.gather(-1, replay["tokens"].long()[..., None])[..., 0]
        entropy = -(logp.exp() * logp).sum(-1)
        return PolicyEval(log_probs, entropy, self._value(feature))

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The SFT loss of the action head. Tokens: the discrete-token loss (OpenVLA's, and what
        GRPO samples from), cross-entropy of the demonstrated actions' bin tokens at temperature 1.
        L1 head: OpenVLA-OFT's L1 regression, ``|head - normalize(actions)|`` in the normalised
        space (the LIBERO gripper as 0 / 1). Either is summed over D and averaged over the executed
        sub-steps (``mask``); OFT's own L1 loss is the mean over D as well, 1/D of this one."""
        if self.action_head is not None:
            mean, _ = self._forward(self._prepare(obs))
            target = self.actions_to_normalized(actions.to(mean.device))
            return masked_chunk_mean((mean - target).abs().sum(-1), mask)
        logits, _ = self._forward(self._prepare(obs))
        tokens = self.actions_to_tokens(actions.to(logits.device))
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None])[..., 0]
        return masked_chunk_mean(-logp.sum(-1), mask)

    def value(self, obs: Any) -> torch.Tensor:
        if self.value_head is None:
            raise RuntimeError("OpenVLAOFTPolicy was built with use_critic=False")
        return self._value(self._forward(self._prepare(obs))[1])


def laplace_log_prob(x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Element log-density of ``Laplace(mean, scale)`` at ``x`` ``[B, K, D]`` (``scale`` ``[B]``)."""
    b = scale[:, None, None]
    return -(x - mean).abs() / b - torch.log(2 * b)


def load_action_head(folder: Path, hidden: int, action_dim: int, new: bool) -> L1RegressionActionHead:
    """The folder's L1 action head (``action_head--<step>_checkpoint.pt``, loaded strictly), or a
    freshly initialised one when there is none and ``new``."""
    head = L1RegressionActionHead(hidden, action_dim)
    path = find_head_file(folder)
    if path is None:
        if not new:
            raise FileNotFoundError(
                f"action_head='l1': {folder} has no {HEAD_FILE_PATTERN} (OpenVLA-OFT's L1-regression head); "
                "pass new_action_head=True to start a fresh head (to fine-tune one), or use "
                "action_head='tokens'"
            )
        return head
    try:
        load_strict(head, read_head_state(path), f"action head {path}")
    except ValueError as e:
        raise BadInput(
            f"{e} (the policy's head reads {action_dim}-D actions from {hidden}-wide hidden states)"
        ) from None
    return head
