"""The Cosmos Policy LIBERO checkpoint folder (``nvidia/Cosmos-Policy-LIBERO-Predict2-2B``):

* the DiT: one ``*.pt`` training checkpoint (``net.*`` keys of Cosmos-Predict2-2B Video2World),
  loaded strictly by ``nets.cosmos_checkpoint.load_cosmos_dit``;
* ``*dataset_statistics.json``: ``actions_min/max`` and ``proprio_min/max`` lists (min/max scaling);
* ``*t5_embeddings.pkl``: a pickled ``{instruction: tensor [1, L, 1024]}`` of T5-11B embeddings, so no
  T5 model is needed (read with an unpickler that builds tensors, arrays and containers only); a
  Predict2.5 checkpoint (``nvidia/Cosmos-Predict2.5-2B/robot/policy/libero``) comes with
  ``*reason1_embeddings.pkl`` instead, the same layout with Cosmos-Reason1's embeddings, which its
  DiT's ``crossattn_proj`` maps to the context;
* the Wan 2.1 VAE: ``tokenizer.pth`` from Cosmos-Predict2-2B-Video2World, at ``tokenizer/tokenizer.pth``
  in the folder or given as ``vae_path``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput
from nets.safe_load import restricted_unpickle

from ..pretrained import read_json

VAE_FILES = ("tokenizer/tokenizer.pth", "tokenizer.pth")


@dataclass
class PolicyFiles:
    dit: Path
    stats: Path
    text: Path  # T5 (Predict2) or Reason1 (Predict2.5) embeddings
    vae: Path


def locate(folder: Path, vae_path: str | Path | None = None) -> PolicyFiles:
    """The four files of a checkpoint folder; a clear error naming what is missing."""

    def one(pattern: str, what: str) -> Path:
        found = sorted(folder.glob(pattern))
        if len(found) != 1:
            state = f"found {[f.name for f in found]}" if found else "found none"
            raise FileNotFoundError(
                f"Cosmos Policy folder {folder}: expected one {what} ({pattern}), {state}"
            )
        return found[0]

    dit = one("*.pt", "DiT checkpoint")
    stats = one("*dataset_statistics.json", "dataset statistics file")
    found = sorted(folder.glob("*t5_embeddings.pkl")) + sorted(folder.glob("*reason1_embeddings.pkl"))
    if len(found) != 1:
        names = [f.name for f in found] or "none"
        raise FileNotFoundError(
            f"Cosmos Policy folder {folder}: expected one text embeddings file (*t5_embeddings.pkl for "
            f"a Predict2 DiT, *reason1_embeddings.pkl for Predict2.5), found {names}"
        )
    text = found[0]
    if vae_path is not None:
        vae = Path(vae_path)
        if not vae.is_file():
            raise FileNotFoundError(f"vae_path {vae} does not exist (the Wan 2.1 tokenizer.pth)")
    else:
        candidates = [folder / name for name in VAE_FILES if (folder / name).is_file()]
        if not candidates:
            raise FileNotFoundError(
                f"no Wan 2.1 VAE in {folder} (looked for {', '.join(VAE_FILES)}): pass vae_path= the "
                "tokenizer.pth of nvidia/Cosmos-Predict2-2B-Video2World"
            )
        vae = candidates[0]
    return PolicyFiles(dit, stats, text, vae)


@dataclass(frozen=True)
class MinMax:
    low: torch.Tensor
    high: torch.Tensor


def load_stats(path: Path) -> dict[str, MinMax]:
    """``{"actions": MinMax, "proprio": MinMax}`` from the dataset statistics json."""
    return read_stats(read_json(path, "Cosmos Policy dataset statistics"), str(path))


def read_stats(data: Mapping[str, Any], source: str) -> dict[str, MinMax]:
    """``{"actions": MinMax, "proprio": MinMax}`` from the statistics' ``actions_min/max`` and
    ``proprio_min/max`` lists (``source`` names where they came from in errors); every max must be
    above its min (min/max scaling divides by the range)."""
    out = {}
    for key in ("actions", "proprio"):
        missing = [f"{key}_{s}" for s in ("min", "max") if f"{key}_{s}" not in data]
        if missing:
            raise BadInput(f"{source}: missing {missing} (expected actions_min/max and proprio_min/max)")
        low = torch.tensor(data[f"{key}_min"], dtype=torch.float32)
        high = torch.tensor(data[f"{key}_max"], dtype=torch.float32)
        if low.shape != high.shape or low.ndim != 1:
            shapes = f"{key}_min {tuple(low.shape)} and {key}_max {tuple(high.shape)}"
            raise BadInput(f"{source}: {shapes} differ (expected two lists of one length)")
        flat = (high <= low).nonzero()[:, 0].tolist()
        if flat:
            raise BadInput(f"{source}: {key}_max is not above {key}_min in dims {flat}")
        out[key] = MinMax(low, high)
    return out


def stats_from_data(actions: np.ndarray, proprio: np.ndarray, min_range: float = 1e-3) -> dict[str, list]:
    """Cosmos Policy's dataset statistics (``actions_min/max``, ``proprio_min/max``) of demonstrated
    ``actions`` ``[N, 7]`` and the model's 9-D ``proprio`` ``[M, 9]``; a dimension whose range is below
    ``min_range`` (constant in the demos) is widened to it around its value, so scaling stays finite."""
    out: dict[str, list] = {}
    for key, x in (("actions", actions), ("proprio", proprio)):
        low, high = np.min(x, axis=0).astype(np.float64), np.max(x, axis=0).astype(np.float64)
        pad = np.maximum(min_range - (high - low), 0.0) / 2
        out[f"{key}_min"], out[f"{key}_max"] = (low - pad).tolist(), (high + pad).tolist()
    return out


def load_text_embeddings(path: Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """``{instruction: [L, D] float32}`` from the pickled T5 or Reason1 embeddings (``[1, L, D]`` per
    entry).

    Only tensors, numpy arrays, strings and containers are unpickled (``UnsafeFileError``
    otherwise); ``trust_pickle=True`` unpickles anything, for files you trust."""
    data = restricted_unpickle(path, trust_pickle=trust_pickle)
    if not isinstance(data, dict) or not data:
        raise BadInput(f"{path}: expected a non-empty dict of instruction -> embedding tensor")
    out = {}
    for text, emb in data.items():
        emb = torch.as_tensor(emb).float()
        if emb.ndim == 3 and emb.shape[0] == 1:
            emb = emb[0]
        if emb.ndim != 2:
            raise BadInput(f"{path}: embedding of {text!r} has shape {tuple(emb.shape)}, expected [1, L, D]")
        out[str(text)] = emb
    return out
