"""What the original OpenVLA (``policies/openvla``) and OpenVLA-OFT (``policy.py``) share: the
checkpoint loading, the prompt, the observation -> model inputs step, the action-bin <-> env-action
mapping with the checkpoint's statistics, the value head, LoRA and the FSDP units.

``OpenVLABase`` holds them; a subclass adds how the action tokens are decoded (``act``,
``evaluate``, ``imitation_loss``, ``value``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from nets.errors import BadInput

from ..binned import normalize, normalized_to_tokens, tokens_to_normalized, unnormalize
from ..heads import ValueHead
from ..images import resize_images
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
from .config import OpenVLAConfig, action_stats, dataset_statistics
from .modeling import OpenVLAModel

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
            raise BadInput(f"the tokenizer needs a BOS token and the {SPACE_TOKEN!r} token (Llama-2 style)")
        self._cache: dict[str, list[int]] = {}

    def prompt_ids(self, instruction: str) -> list[int]:
        ids = self._cache.get(instruction)
        if ids is None:
            ids = self.tokenizer(PROMPT.format(instruction.lower()), add_special_tokens=False)["input_ids"]
            ids = ids if ids and ids[-1] == self.space else [*ids, self.space]
            if len(ids) > self.max_prompt_tokens:
                raise BadInput(
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


class OpenVLABase(PretrainedVLAPolicy):
    """An OpenVLA checkpoint folder loaded as a policy (model, tokenizer, action statistics); E = D.
    The arguments are the subclasses' (``OpenVLAOFTPolicy`` documents them). A subclass validates its
    own options, calls this ``__init__``, builds its own parts and ends with
    ``_add_value_head_and_lora``."""

    checkpoint_name, checkpoint_files = "OpenVLA checkpoint", REQUIRED_FILES
    model_name = "OpenVLA"  # in LoRA errors

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        model_path: str | Path,
        unnorm_key: str | None,
        norm_stats: dict[str, Any] | str | Path | None,
        temperature: float,
        top_k: int,
        image_keys: Sequence[str],
        center_crop: float | None,
        gripper: str | None,
        max_prompt_tokens: int,
        dtype: str,
        download: bool,
    ):
        super().__init__(observation_space, action_space, image_keys)
        if gripper not in ("libero", None):
            raise BadInput(f"gripper must be 'libero' or None, got {gripper!r}")
        if temperature <= 0:
            raise BadInput(f"temperature must be > 0, got {temperature}")
        self.temperature, self.top_k = float(temperature), int(top_k)
        self.image_keys, self.center_crop, self.gripper = tuple(image_keys), center_crop, gripper

        folder = self.checkpoint_folder = self.find_folder(model_path, download)
        config = OpenVLAConfig.from_folder(folder)
        if norm_stats is not None:
            if not isinstance(norm_stats, dict):
                norm_stats = read_json(Path(norm_stats), "OpenVLA dataset statistics")
            config.norm_stats = {**config.norm_stats, **norm_stats}
        self.norm_stats = config.norm_stats  # every dataset's statistics (OFT's proprio reads its own)
        self.unnorm_key, stats = action_stats(config.norm_stats, unnorm_key, self.action_dim)
        self.register_buffer("q01", stats.q01)
        self.register_buffer("q99", stats.q99)
        self.register_buffer("mask", stats.mask)
        self.n_bins = config.n_action_bins
        self.model = load_model(folder, config, resolve_dtype(dtype))
        self.layout = PromptLayout(load_tokenizer(folder), max_prompt_tokens)
        self.bins_start = self.layout.tokenizer.vocab_size - self.n_bins  # first action-bin id
        self.image_size = self.model.vision_backbone.image_size

    def _add_value_head_and_lora(
        self,
        use_critic: bool,
        value_outputs: int,
        lora_rank: int,
        lora_targets: Sequence[str] | None,
        freeze_vision: bool,
    ) -> None:
        """The last step of a subclass's ``__init__``: the value head (``value_outputs`` values), the
        frozen vision towers and the LoRA adapters (on the model only: heads stay fully trained)."""
        hidden = self.model.language_model.config.hidden_size
        self.value_head = ValueHead(hidden, (512, 128), value_outputs, "gelu") if use_critic else None
        if freeze_vision:
            self.model.vision_backbone.requires_grad_(False)
        if lora_rank > 0:
            if lora_targets is None:
                lora_targets = LORA_LANGUAGE + (() if freeze_vision else LORA_VISION)
            add_lora(self.model, lora_rank, tuple(lora_targets), self.model_name)

    @classmethod
    def norm_stats_from_demos(
        cls,
        actions: np.ndarray,
        obs: dict[str, np.ndarray],
        num_episodes: int,
        kwargs: dict[str, Any],
        observation_space: Any = None,
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

    def _value(self, feature: torch.Tensor) -> torch.Tensor | None:
        return None if self.value_head is None else self.value_head(feature)

    # ------------------------------------------------------------------ action bins <-> env actions
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

    def actions_to_tokens(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions ``[..., D]`` -> the bin tokens that decode to them (``tokens_to_actions``'s
        inverse up to the bin width; the LIBERO gripper's +1 / -1 go to 0 / 1 before binning)."""
        return normalized_to_tokens(self.actions_to_normalized(actions), self.n_bins)


def load_model(folder: Path, config: OpenVLAConfig, dtype: torch.dtype) -> OpenVLAModel:
    """Build the model without allocating random weights and load the folder's weights strictly."""
    model = empty_model(lambda: OpenVLAModel(config), f"OpenVLA model of {folder}")
    load_strict(model, read_state_dict(folder, dtype), f"OpenVLA checkpoint {folder}")
    return model.eval()
