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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from ..base import ActionChunk, PolicyEval, masked_chunk_mean
from ..binned import normalize, normalized_to_tokens, tempered_log_softmax, tokens_to_normalized, unnormalize
from ..heads import ValueHead
from ..images import resize_images
from ..options import build_options
from ..pretrained import (
    PretrainedVLAPolicy,
    add_lora,
    empty_model,
    load_strict,
    load_tokenizer,
    read_json,
    read_state_dict,
    resolve_dtype,
)
from .action_heads import HEAD_FILE_PATTERN, L1RegressionActionHead, find_head_file, read_head_state
from .config import OpenVLAConfig, action_stats, dataset_statistics
from .modeling import OpenVLAModel
from .options import OpenVLAOFTOptions

PROMPT = "In: What action should the robot take to {}?\nOut:"
SPACE_TOKEN = "▁"  # sentencepiece's word boundary: id 29871 in Llama-2's vocabulary
REQUIRED_FILES = (
    "config.json",
    "model.safetensors.index.json|model.safetensors",
    "tokenizer.json",
)
# Module-name suffixes LoRA adapts (RLinf's list): the vision towers; the projector and Llama.
LORA_VISION = ("qkv", "proj", "fc1", "fc2")
LORA_LANGUAGE = (
    "projector.fc1", "projector.fc2", "projector.fc3",
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head",
)  # fmt: skip


class PromptLayout:
    """Tokenizes instructions into ``[BOS, PAD.., prompt.., '▁']`` of a fixed length
    ``1 + max_prompt_tokens``, padding after BOS (so replays of different batches stack)."""

    def __init__(self, tokenizer: Any, max_prompt_tokens: int):
        self.tokenizer, self.max_prompt_tokens = tokenizer, max_prompt_tokens
        self.bos = tokenizer.bos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.space = tokenizer.convert_tokens_to_ids(SPACE_TOKEN)
        if self.bos is None or self.space is None or self.space == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer needs a BOS token and the {SPACE_TOKEN!r} token (Llama-2 style)")
        self._cache: dict[str, list[int]] = {}

    def prompt_ids(self, instruction: str) -> list[int]:
        ids = self._cache.get(instruction)
        if ids is None:
            ids = self.tokenizer(PROMPT.format(instruction.lower()), add_special_tokens=False)["input_ids"]
            ids = ids if ids and ids[-1] == self.space else [*ids, self.space]
            if len(ids) > self.max_prompt_tokens:
                raise ValueError(
                    f"instruction {instruction!r} needs {len(ids)} prompt tokens; the policy was built with "
                    f"max_prompt_tokens={self.max_prompt_tokens}: raise it"
                )
            self._cache[instruction] = ids
        return ids

    def __call__(self, instructions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` int64 and ``attention_mask`` int64, both ``[B, 1 + max_prompt_tokens]``."""
        n = self.max_prompt_tokens
        ids = torch.full((len(instructions), 1 + n), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        ids[:, 0], mask[:, 0] = self.bos, 1
        for i, text in enumerate(instructions):
            prompt = self.prompt_ids(str(text))
            ids[i, 1 + n - len(prompt) :] = torch.tensor(prompt)
            mask[i, 1 + n - len(prompt) :] = 1
        return ids, mask


class OpenVLAOFTPolicy(PretrainedVLAPolicy):
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

    checkpoint_name, checkpoint_files = "OpenVLA-OFT checkpoint", REQUIRED_FILES
    options_type = OpenVLAOFTOptions

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        options: OpenVLAOFTOptions | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        o = build_options(OpenVLAOFTOptions, options, kwargs, type(self).__name__)
        super().__init__(observation_space, action_space, o.image_keys)
        self.options = o
        action_head = o.action_head
        self.action_head_type, self.l1_scale = action_head, float(o.l1_scale)
        temperature = o.temperature
        if temperature is None:
            temperature = 1.0 if action_head == "l1" else 1.6
        self.temperature, self.top_k = float(temperature), int(o.top_k)
        self.image_keys, self.center_crop = tuple(o.image_keys), o.center_crop
        self.gripper = o.gripper

        folder = self.find_folder(o.model_path, o.download)
        config = OpenVLAConfig.from_folder(folder)
        norm_stats = o.norm_stats
        if norm_stats is not None:
            if not isinstance(norm_stats, dict):
                norm_stats = read_json(Path(norm_stats), "OpenVLA dataset statistics")
            config.norm_stats = {**config.norm_stats, **norm_stats}
        self.unnorm_key, stats = action_stats(config.norm_stats, o.unnorm_key, self.action_dim)
        self.register_buffer("q01", stats.q01)
        self.register_buffer("q99", stats.q99)
        self.register_buffer("mask", stats.mask)
        self.n_bins = config.n_action_bins
        self.model = load_model(folder, config, resolve_dtype(o.dtype))
        self.layout = PromptLayout(load_tokenizer(folder), o.max_prompt_tokens)
        self.stop_id = self.layout.tokenizer.eos_token_id if o.append_stop else None
        self.bins_start = self.layout.tokenizer.vocab_size - self.n_bins  # first action-bin id
        self.image_size = self.model.vision_backbone.image_size

        hidden = self.model.language_model.config.hidden_size
        self.action_head = None
        bounds = [torch.as_tensor(np.asarray(b, np.float32)).reshape(self.chunk_size, self.action_dim)
                  for b in (action_space.low, action_space.high)]  # fmt: skip
        self.register_buffer("low", bounds[0], persistent=False)  # L1 actions are clipped to the space
        self.register_buffer("high", bounds[1], persistent=False)
        if action_head == "l1":
            self.action_head = load_action_head(folder, hidden, self.action_dim, o.new_action_head)
            self.action_head.to(next(self.model.parameters()).dtype)
        kv = 1 if o.value_type == "chunk" else self.chunk_size
        self.value_head = ValueHead(hidden, (512, 128), kv, "gelu") if o.use_critic else None
        if o.freeze_vision:
            self.model.vision_backbone.requires_grad_(False)
        if o.lora_rank > 0:
            lora_targets = o.lora_targets
            if lora_targets is None:
                lora_targets = LORA_LANGUAGE + (() if o.freeze_vision else LORA_VISION)
            add_lora(self.model, o.lora_rank, tuple(lora_targets), "OpenVLA-OFT")

    @classmethod
    def norm_stats_from_demos(
        cls, actions: np.ndarray, obs: dict[str, np.ndarray], num_episodes: int, kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Statistics of demonstrations for fine-tuning (``trainers.bc``): the ``policy_kwargs`` to add
        (``norm_stats`` ``{key: dataset_statistics(...)}`` over the demonstrated ``actions`` ``[N, D]``,
        env units, and ``obs["proprio"]`` when the demos have it; ``unnorm_key`` = ``key``, the given
        ``unnorm_key`` or ``"demos"``) and the files to save beside the checkpoint
        (``{"dataset_statistics.json": {key: ...}}``, OpenVLA's layout). With the LIBERO gripper the
        last dim is stored as 0 / 1 and not normalized (mask False), as OpenVLA's LIBERO statistics."""
        key = kwargs.get("unnorm_key") or "demos"
        a = np.asarray(actions, np.float64)
        libero = kwargs.get("gripper", "libero") == "libero"
        if libero:
            a = np.concatenate([a[:, :-1], (1 - a[:, -1:]) / 2], axis=1)
        mask = [True] * (a.shape[1] - 1) + [not libero]
        entry = dataset_statistics(a, obs.get("proprio"), mask=mask, num_trajectories=num_episodes)
        return {"norm_stats": {key: entry}, "unnorm_key": key}, {"dataset_statistics.json": {key: entry}}

    def required_observation_keys(self) -> tuple[str, ...]:
        """The observation keys this policy reads (demonstrations for it must have them)."""
        return (*self.image_keys, "instruction")

    def fsdp_units(self) -> list[torch.nn.Module]:
        """What FSDP2 shards on its own (``trainers/parallel.py``), each run through its forward:
        the vision towers' blocks (not the last, whose output is never used) and the LLaMA layers."""
        vision = self.model.vision_backbone
        towers = [t for t in (vision.featurizer, vision.fused_featurizer) if t is not None]
        blocks = [block for tower in towers for block in tower.blocks[:-1]]
        return [*blocks, *self.model.language_model.model.layers]

    # ------------------------------------------------------------------ observation -> model inputs
    def _prepare(self, obs: Any) -> dict[str, torch.Tensor]:
        device = self.q01.device
        images = torch.stack([torch.as_tensor(np.asarray(obs[k])) for k in self.image_keys], dim=1)
        images = resize_images(images, self.image_size, self.center_crop).to(device)
        input_ids, attention_mask = self.layout(list(obs["instruction"]))
        return {
            "input_ids": input_ids.to(device),
            "attention_mask": attention_mask.to(device),
            "images": images,
        }

    def _forward(self, prepared: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Action-bin logits ``[B, K, D, n_bins]`` (float32) and the value feature ``[B, hidden]``;
        with the L1 head, its normalised actions ``[B, K, D]`` (float32) instead of the logits."""
        pixels = self.model.vision_backbone.pixel_values(prepared["images"])
        n = self.chunk_size * self.action_dim
        output = "hidden" if self.action_head is not None else "logits"
        logits, feature = self.model(
            prepared["input_ids"], prepared["attention_mask"], pixels, n, self.stop_id, output
        )
        if self.action_head is not None:
            return self.action_head(logits).float(), feature
        bins = logits[..., self.bins_start : self.bins_start + self.n_bins]
        return bins.reshape(-1, self.chunk_size, self.action_dim, self.n_bins), feature

    def _value(self, feature: torch.Tensor) -> torch.Tensor | None:
        return None if self.value_head is None else self.value_head(feature)

    def tokens_to_actions(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens ``[..., D]`` -> env actions: bin centers, un-normalized, gripper mapped."""
        return self.normalized_to_actions(tokens_to_normalized(tokens, self.n_bins))

    def normalized_to_actions(self, normalized: torch.Tensor) -> torch.Tensor:
        """Normalised actions ``[..., D]`` -> env actions: un-normalized with q01/q99 (the masked
        dims pass through), the LIBERO gripper mapped with ``-sign(2 g - 1)``."""
        actions = unnormalize(normalized.float(), self.q01, self.q99, self.mask)
        if self.gripper == "libero":
            actions = torch.cat([actions[..., :-1], -torch.sign(2 * actions[..., -1:] - 1)], dim=-1)
        return actions

    def actions_to_normalized(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions ``[..., D]`` -> the normalised space the model predicts in (clipped to
        [-1, 1]; the LIBERO gripper's +1 / -1 go to 0 / 1, unnormalised)."""
        a = actions.float()
        if self.gripper == "libero":
            a = torch.cat([a[..., :-1], (1 - a[..., -1:]) / 2], dim=-1)
        q01, q99 = (x.to(a.device) for x in (self.q01, self.q99))
        mask = None if self.mask is None else self.mask.to(a.device)
        return normalize(a, q01, q99, mask)

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
        prepared = {k: replay[k] for k in ("input_ids", "attention_mask", "images")}
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

    def actions_to_tokens(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions ``[..., D]`` -> the bin tokens that decode to them (``tokens_to_actions``'s
        inverse up to the bin width; the LIBERO gripper's +1 / -1 go to 0 / 1 before binning)."""
        return normalized_to_tokens(self.actions_to_normalized(actions), self.n_bins)

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
        raise ValueError(
            f"{e} (the policy's head reads {action_dim}-D actions from {hidden}-wide hidden states)"
        ) from None
    return head


def load_model(folder: Path, config: OpenVLAConfig, dtype: torch.dtype) -> OpenVLAModel:
    """Build the model without allocating random weights and load the folder's weights strictly."""
    model = empty_model(lambda: OpenVLAModel(config))
    load_strict(model, read_state_dict(folder, dtype), f"OpenVLA checkpoint {folder}")
    return model.eval()
