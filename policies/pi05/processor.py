"""pi0.5's processor, apart from the network: observations -> model inputs (images resized with
padding, the prompt tokenized, the state quantile-normalized into it) and the model's normalized
actions -> env actions (un-normalized with the action quantiles, then sliced to the env's chunk).

``Pi05Policy`` (``policy.py``) owns one ``Pi05Processor``; the statistics come from the checkpoint
folder (``find_norm_stats``) or from the caller (``norm_stats``, e.g. computed from demonstrations).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput

from ..images import resize_with_pad
from ..pretrained import read_json
from .config import QuantileStats, find_norm_stats, load_norm_stats, parse_norm_stats

TOKENIZER_FILES = ("tokenizer.model", "paligemma_tokenizer.model")


class PromptTokenizer:
    """openpi's PaliGemma prompt (sentencepiece), right-padded with 0 to ``max_len``."""

    def __init__(self, model_file: Path, max_len: int, discrete_state: bool):
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.max_len, self.discrete_state = max_len, discrete_state

    def ids(self, instruction: str, state: np.ndarray | None) -> list[int]:
        clean = str(instruction).strip().replace("_", " ").replace("\n", " ")
        if self.discrete_state:
            bins = np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1
            text = f"Task: {clean}, State: {' '.join(map(str, bins.tolist()))};\nAction: "
            ids = [self.sp.bos_id(), *self.sp.encode(text)]
        else:
            ids = [self.sp.bos_id(), *self.sp.encode(clean), *self.sp.encode("\n")]
        if len(ids) > self.max_len:
            raise BadInput(f"prompt for {clean!r} has {len(ids)} tokens > max_token_len={self.max_len}")
        return ids

    def __call__(
        self, instructions: Sequence[str], states: np.ndarray | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.zeros(len(instructions), self.max_len, dtype=torch.long)
        mask = torch.zeros_like(tokens, dtype=torch.bool)
        for i, text in enumerate(instructions):
            ids = self.ids(text, None if states is None else states[i])
            tokens[i, : len(ids)], mask[i, : len(ids)] = torch.tensor(ids), True
        return tokens, mask


def tokenizer_file(folder: Path, tokenizer_path: str | Path | None) -> Path:
    """``tokenizer_path``, or PaliGemma's sentencepiece model in the checkpoint folder."""
    if tokenizer_path is not None:
        path = Path(tokenizer_path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer_path {path} does not exist")
        return path
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"no PaliGemma tokenizer in {folder} (looked for {', '.join(TOKENIZER_FILES)}): pass tokenizer_path= "
        "(openpi downloads it from gs://big_vision/paligemma_tokenizer.model)"
    )


class Pi05Processor:
    """Tokenize and normalize on the way in, un-normalize on the way out (no weights).

    Args:
        tokenizer: the prompt tokenizer (``PromptTokenizer``); with ``discrete_state`` it reads the state.
        state_stats: the state's quantiles (None when the prompt has no state); ``action_stats``: the
            actions' quantiles.
        cameras: observation keys of the images, in the model's order; ``state_key``: the state's key.
        image_size: the square size images are resized to (with padding).
    """

    def __init__(
        self,
        tokenizer: PromptTokenizer,
        state_stats: QuantileStats | None,
        action_stats: QuantileStats,
        cameras: Sequence[str],
        state_key: str,
        image_size: int,
    ):
        self.tokenizer, self.state_stats, self.action_stats = tokenizer, state_stats, action_stats
        self.cameras, self.state_key, self.image_size = tuple(cameras), state_key, image_size

    def __call__(self, obs: Any, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """The model inputs of a batch of observations on ``device``: ``images`` uint8
        ``[B, n, S, S, 3]``, ``tokens`` int64 and ``token_mask`` bool ``[B, max_token_len]``."""
        images = torch.stack([torch.as_tensor(np.asarray(obs[k])) for k in self.cameras], dim=1)
        states = None
        if self.tokenizer.discrete_state:
            raw = torch.as_tensor(np.asarray(obs[self.state_key]), dtype=torch.float32)
            states = self.state_stats.normalize(raw).numpy()
        tokens, token_mask = self.tokenizer(list(obs["instruction"]), states)
        images = resize_with_pad(images, self.image_size).to(device)
        return {"images": images, "tokens": tokens.to(device), "token_mask": token_mask.to(device)}

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions ``[..., D]`` -> the model's normalized units (the first D dims' quantiles)."""
        return self.action_stats.normalize(actions)

    def to_env(self, x: torch.Tensor, chunk_size: int, action_dim: int) -> torch.Tensor:
        """Normalized model actions ``[B, H, A]`` -> env actions ``[B, K, D]``."""
        return self.action_stats.unnormalize(x)[:, :chunk_size, :action_dim]


def resolve_norm_stats(
    folder: Path, asset_id: str | None, norm_stats: dict[str, Any] | str | Path | None, need_state: bool
) -> dict[str, QuantileStats]:
    """The statistics a policy uses: ``norm_stats`` (``norm_stats.json``'s content or its path) when
    given, else the folder's (``asset_id`` picks among several); the state's only if ``need_state``."""
    if norm_stats is None:
        return load_norm_stats(find_norm_stats(folder, asset_id))
    source = "norm_stats"
    if not isinstance(norm_stats, dict):
        source = Path(norm_stats)
        norm_stats = read_json(source, "pi0.5 normalization statistics")
    try:
        return parse_norm_stats(norm_stats, source, need_state=need_state)
    except ValueError as e:
        reads = "the state and the actions" if need_state else "the actions"
        raise BadInput(f"{e}; this policy normalizes {reads}") from None
