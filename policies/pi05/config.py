"""pi0.5 checkpoint configuration and normalization statistics.

``config.json`` is what openpi's PyTorch conversion writes (``action_dim``, ``action_horizon``,
``paligemma_variant``, ``action_expert_variant``, ``precision``; cosmos-rl's copies add
``model_type: pi05`` and ``discrete_state_input``). ``sizes`` is this project's addition for small
test models; real checkpoints name their variants only.

Statistics are openpi's ``norm_stats.json`` (``{"norm_stats": {"state": {...}, "actions": {...}}}``
with ``mean, std, q01, q99``), found under ``assets/<asset_id>/`` (openpi, cosmos-rl) or
``<asset_id>/`` (RLinf) inside the checkpoint folder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput

from ..pretrained import check_sizes, read_json

CONFIG_FILE = "config.json"
STATS_FILE = "norm_stats.json"
LEROBOT_STATS = "policy_*processor*.safetensors"  # lerobot: keys like "observation.state.q01", "action.q99"


@dataclass(frozen=True)
class GemmaSpec:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class SiglipSpec:
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    image_size: int = 224
    patch_size: int = 14

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


VARIANTS = {
    "gemma_2b": GemmaSpec(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaSpec(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
}
PALIGEMMA_VOCAB = 257_152


@dataclass
class Pi05Config:
    """Sizes of the model and what the prompt carries."""

    action_dim: int = 32
    action_horizon: int = 10
    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    discrete_state_input: bool | None = None  # None: not stated by the checkpoint
    sizes: dict[str, Any] | None = None  # {"paligemma", "expert": GemmaSpec dicts, "vision", "vocab_size"}
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def pi05_libero(cls) -> Pi05Config:
        """pi0.5 at its published size: the defaults, openpi's ``pi05_libero`` training config
        (openpi ``src/openpi/training/config.py``: ``Pi0Config(pi05=True, action_horizon=10)``, PaliGemma
        ``gemma_2b`` + SigLIP so400m/14 at 224 px, action expert ``gemma_300m``; sizes from
        ``src/openpi/models/gemma.py`` ``get_config``), as converted to PyTorch by openpi
        (``PI0Pytorch``; checkpoints ``sunshk/pi05_libero_pytorch``, model card ``lerobot/pi05_libero``)."""
        return cls()

    def paligemma(self) -> GemmaSpec:
        return self._gemma("paligemma", self.paligemma_variant)

    def expert(self) -> GemmaSpec:
        return self._gemma("expert", self.action_expert_variant)

    def _gemma(self, part: str, variant: str) -> GemmaSpec:
        if self.sizes is not None:
            return GemmaSpec(**self.sizes[part])
        if variant not in VARIANTS:
            raise BadInput(f"unsupported {part} variant {variant!r}; supported: {sorted(VARIANTS)}")
        return VARIANTS[variant]

    def vision(self) -> SiglipSpec:
        return SiglipSpec(**self.sizes["vision"]) if self.sizes is not None else SiglipSpec()

    def vocab_size(self) -> int:
        return int(self.sizes["vocab_size"]) if self.sizes is not None else PALIGEMMA_VOCAB

    @classmethod
    def from_folder(cls, folder: Path) -> Pi05Config:
        data = read_json(folder / CONFIG_FILE, "pi0.5 config")
        check_sizes(data, str(folder / CONFIG_FILE))
        if data.get("model_type", "pi05") not in ("pi05", "pi0"):
            raise BadInput(f"{folder / CONFIG_FILE}: model_type {data['model_type']!r}, expected 'pi05'")
        if data.get("pi05") is False or data.get("model_type") == "pi0":
            raise BadInput(f"{folder}: a pi0 checkpoint; this implementation is pi0.5 (adaRMS time input)")
        if "action_horizon" not in data:  # the weights do not depend on it, so it cannot be inferred
            raise BadInput(
                f"{folder / CONFIG_FILE} lacks action_horizon (openpi pi05_libero: 10, pi05_behavior: 32)"
            )
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "extra"}
        config = cls(**known, extra={k: v for k, v in data.items() if k not in cls.__dataclass_fields__})
        pali, expert = config.paligemma(), config.expert()
        if (pali.depth, pali.num_heads, pali.num_kv_heads, pali.head_dim) != (
            expert.depth,
            expert.num_heads,
            expert.num_kv_heads,
            expert.head_dim,
        ):
            raise BadInput(
                f"{folder}: the two experts must share depth and attention heads: {pali}, {expert}"
            )
        return config

    def to_json_dict(self) -> dict[str, Any]:
        data = {
            "model_type": "pi05",
            "pi05": True,
            "action_dim": self.action_dim,
            "action_horizon": self.action_horizon,
            "paligemma_variant": self.paligemma_variant,
            "action_expert_variant": self.action_expert_variant,
            "precision": "float32",
            **self.extra,
        }
        if self.discrete_state_input is not None:
            data["discrete_state_input"] = self.discrete_state_input
        if self.sizes is not None:
            data["sizes"] = {
                k: asdict(v) if not isinstance(v, int | dict) else v for k, v in self.sizes.items()
            }
        return data


@dataclass(frozen=True)
class QuantileStats:
    """openpi quantile statistics (pi0.5 normalizes state and actions with q01/q99)."""

    q01: torch.Tensor
    q99: torch.Tensor

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1`` on the first ``len(q01)`` dims of ``x``."""
        q01, q99 = self.q01.to(x), self.q99.to(x)
        d = min(x.shape[-1], len(q01))
        out = (x[..., :d] - q01[:d]) / (q99[:d] - q01[:d] + 1e-6) * 2 - 1
        return torch.cat([out, x[..., d:]], dim=-1)

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of ``normalize`` on the first ``len(q01)`` dims; the rest pass through."""
        q01, q99 = self.q01.to(x), self.q99.to(x)
        d = min(x.shape[-1], len(q01))
        out = (x[..., :d] + 1) / 2 * (q99[:d] - q01[:d] + 1e-6) + q01[:d]
        return torch.cat([out, x[..., d:]], dim=-1)


def find_norm_stats(folder: Path, asset_id: str | None) -> Path:
    """The ``norm_stats.json`` of a checkpoint folder: ``assets/<asset_id>/`` or ``<asset_id>/``;
    with ``asset_id`` None, the only one there is (``<asset_id>`` is ``org/name``), else the folder
    itself when it holds lerobot's ``policy_*processor*.safetensors`` normalizer files."""
    if asset_id is None and not _found(folder) and list(folder.glob(LEROBOT_STATS)):
        return folder
    if asset_id is not None:
        for path in (folder / "assets" / asset_id / STATS_FILE, folder / asset_id / STATS_FILE):
            if path.is_file():
                return path
        raise FileNotFoundError(
            f"no {STATS_FILE} for asset_id {asset_id!r} in {folder}/assets/{asset_id}/ or "
            f"{folder}/{asset_id}/; found: {_found(folder) or 'none'}"
        )
    found = _found(folder)
    if len(found) != 1:
        where = f"found {found}: pass asset_id= one of them" if found else "found none"
        raise FileNotFoundError(f"{folder}: expected one {STATS_FILE} under assets/<org>/<name>/ ({where})")
    prefix = folder / "assets" if (folder / "assets" / found[0] / STATS_FILE).is_file() else folder
    return prefix / found[0] / STATS_FILE


def _found(folder: Path) -> list[str]:
    paths = list(folder.glob(f"assets/*/*/{STATS_FILE}")) + list(folder.glob(f"*/*/{STATS_FILE}"))
    return sorted(
        {
            "/".join(p.parts[-3:-1])
            for p in paths
            if p.parts[-4] != "assets" or p.parent.parent.parent == folder / "assets"
        }
    )


def load_norm_stats(path: Path) -> dict[str, QuantileStats]:
    """``{"state": ..., "actions": ...}`` quantile statistics from an openpi ``norm_stats.json`` (or
    from lerobot's normalizer files when ``path`` is their folder)."""
    if path.is_dir():
        return _lerobot_stats(path)
    return parse_norm_stats(read_json(path, "pi0.5 normalization statistics"), path)


def parse_norm_stats(data: dict[str, Any], path: Any, need_state: bool = True) -> dict[str, QuantileStats]:
    """Quantile statistics from ``norm_stats.json``'s content (``{"norm_stats": {"state", "actions"}}``
    or the inner dict); ``need_state`` False lets the state's be absent (a policy that never reads it)."""
    stats = data.get("norm_stats", data)
    out = {}
    for key in ("state", "actions"):
        entry = stats.get(key)
        if entry is None and key == "state" and not need_state:
            continue
        if not isinstance(entry, dict) or "q01" not in entry or "q99" not in entry:
            raise BadInput(
                f"{path}: expected norm_stats.{key} with q01 and q99 (pi0.5 uses quantile normalization)"
            )
        q01 = torch.tensor(entry["q01"], dtype=torch.float32)
        q99 = torch.tensor(entry["q99"], dtype=torch.float32)
        if q01.shape != q99.shape or q01.ndim != 1:
            raise BadInput(
                f"{path}: norm_stats.{key} q01 {tuple(q01.shape)} and q99 {tuple(q99.shape)} differ"
            )
        out[key] = QuantileStats(q01, q99)
    return out


def _lerobot_stats(folder: Path) -> dict[str, QuantileStats]:
    """State and action quantiles from lerobot's pre/post-processor normalizer safetensors (used
    with openpi's formula; lerobot's own omits the 1e-6 in the denominator)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob(LEROBOT_STATS)):
        tensors.update(load_file(str(file)))
    out = {}
    for key, prefix in (("state", "observation.state"), ("actions", "action")):
        if f"{prefix}.q01" not in tensors or f"{prefix}.q99" not in tensors:
            raise BadInput(f"{folder}: lerobot normalizer files lack {prefix}.q01 / {prefix}.q99")
        out[key] = QuantileStats(tensors[f"{prefix}.q01"].float(), tensors[f"{prefix}.q99"].float())
    return out


def norm_stats_from_data(actions: np.ndarray, state: np.ndarray | None) -> dict[str, Any]:
    """``norm_stats.json`` content computed from data: ``actions`` ``[N, D]`` and ``state`` ``[N, P]``
    (None: no state entry), each with openpi's ``mean``, ``std``, ``q01``, ``q99`` per dim (exact
    quantiles; openpi estimates them with histograms)."""
    out = {"actions": _moments(actions)}
    if state is not None:
        out["state"] = _moments(state)
    return {"norm_stats": out}


def _moments(x: np.ndarray) -> dict[str, list[float]]:
    x = np.asarray(x, np.float64)
    return {
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "q01": np.quantile(x, 0.01, axis=0).tolist(),
        "q99": np.quantile(x, 0.99, axis=0).tolist(),
    }
