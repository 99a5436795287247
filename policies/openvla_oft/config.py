"""OpenVLA / OpenVLA-OFT checkpoint configuration: the fields of the Hugging Face ``config.json``
(``model_type: openvla``) this implementation reads, and the action statistics.

Statistics come from ``config.json``'s ``norm_stats`` updated by the folder's
``dataset_statistics.json`` (as RLinf loads them): ``{unnorm_key: {"action": {"q01", "q99", "mask",
...}, "proprio": {...}}}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput

from ..pretrained import check_sizes, read_json
from .vision import TIMM_VITS, ViTSpec

CONFIG_FILE = "config.json"
STATS_FILE = "dataset_statistics.json"


@dataclass
class OpenVLAConfig:
    """What the model needs from ``config.json``.

    ``vision_specs`` is this project's addition for towers that are not in ``TIMM_VITS`` (the tiny
    test models); real checkpoints name their towers by ``timm_model_ids`` only.
    """

    timm_model_ids: list[str] = field(
        default_factory=lambda: ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]
    )
    use_fused_vision_backbone: bool = True
    image_sizes: list[int] = field(default_factory=lambda: [224, 224])
    text_config: dict[str, Any] = field(default_factory=lambda: {"model_type": "llama", "vocab_size": 32064})
    pad_token_id: int = 32000
    pad_to_multiple_of: int = 64
    n_action_bins: int = 256
    norm_stats: dict[str, Any] = field(default_factory=dict)
    vision_specs: list[dict[str, Any]] | None = None

    @classmethod
    def openvla_7b(cls) -> OpenVLAConfig:
        """OpenVLA-7B at its published size: the defaults, which are ``config.json`` of
        ``openvla/openvla-7b`` (model card: DINOv2 ViT-L/14-reg4 + SigLIP so400m/14 at 224 px, fused;
        Llama-2-7B with the vocabulary padded to 32064; reference code: openvla/openvla
        ``prismatic/extern/hf/configuration_prismatic.py``). 7,541,237,184 parameters (the index's
        ``total_size`` of 15,082,474,368 bytes in bfloat16). The OpenVLA-OFT checkpoints
        (``moojink/openvla-7b-oft-finetuned-libero-*``) share this backbone; their action head and
        proprio projector sizes are ``OFT_LIBERO``."""
        return cls()

    def towers(self) -> list[ViTSpec]:
        """The ViT spec of each tower (one, or two when fused)."""
        n = 2 if self.use_fused_vision_backbone else 1
        if self.vision_specs is not None:
            specs = [ViTSpec.from_dict(s) for s in self.vision_specs]
        else:
            unknown = [m for m in self.timm_model_ids[:n] if m not in TIMM_VITS]
            if unknown:
                raise BadInput(
                    f"unsupported vision tower(s) {unknown}; supported timm_model_ids: {sorted(TIMM_VITS)}"
                )
            specs = [TIMM_VITS[m] for m in self.timm_model_ids[:n]]
        if len(specs) != n:
            raise BadInput(f"use_fused_vision_backbone={self.use_fused_vision_backbone} needs {n} towers")
        for spec, size in zip(specs, self.image_sizes):
            if spec.image_size != size:
                raise BadInput(
                    f"image_sizes {self.image_sizes} disagree with tower input size {spec.image_size}"
                )
        return specs

    def llama_config(self):
        """The backbone's ``transformers.LlamaConfig`` (transformers' defaults are Llama-2-7B's)."""
        from transformers import LlamaConfig

        text = {k: v for k, v in self.text_config.items() if k not in ("model_type", "torch_dtype", "dtype")}
        text.setdefault("pad_token_id", self.pad_token_id)
        return LlamaConfig(**text)

    @classmethod
    def from_folder(cls, folder: Path) -> OpenVLAConfig:
        data = read_json(folder / CONFIG_FILE, "OpenVLA config")
        check_sizes(data, str(folder / CONFIG_FILE))
        if data.get("model_type", "openvla") != "openvla":
            raise BadInput(
                f"{folder / CONFIG_FILE}: model_type {data.get('model_type')!r}, expected 'openvla'"
            )
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        config = cls(**known)
        if (folder / STATS_FILE).is_file():
            config.norm_stats = {**config.norm_stats, **read_json(folder / STATS_FILE, "dataset statistics")}
        return config

    def to_json_dict(self) -> dict[str, Any]:
        """``config.json`` content in the checkpoints' layout."""
        data = {
            "model_type": "openvla",
            "architectures": ["OpenVLAForActionPrediction"],
            "vision_backbone_id": "dinosiglip-vit-so-224px",
            "llm_backbone_id": "llama2-7b-pure",
            "arch_specifier": "no-align+fused-gelu-mlp",
            "image_resize_strategy": "resize-naive",
            "timm_model_ids": self.timm_model_ids,
            "timm_override_act_layers": [None] * len(self.timm_model_ids),
            "use_fused_vision_backbone": self.use_fused_vision_backbone,
            "image_sizes": self.image_sizes,
            "text_config": self.text_config,
            "pad_token_id": self.pad_token_id,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "n_action_bins": self.n_action_bins,
            "norm_stats": self.norm_stats,
        }
        if self.vision_specs is not None:
            data["vision_specs"] = self.vision_specs
        return data


@dataclass(frozen=True)
class OFTHeadSizes:
    """The sizes of OpenVLA-OFT's extra modules: the L1-regression action head (a residual MLP from
    ``action_dim`` hidden states of ``hidden_size`` to ``action_dim`` values, width ``hidden_size``)
    and the proprio projector (``proprio_dim`` -> ``hidden_size`` -> ``hidden_size``)."""

    hidden_size: int = 4096
    action_dim: int = 7
    proprio_dim: int = 8
    chunk: int = 8  # actions per chunk (NUM_ACTIONS_CHUNK): 8 x 7 = 56 action positions


# moojink/openvla-7b-oft-finetuned-libero-{spatial,object,goal,10}: openvla-oft's
# prismatic/vla/constants.py LIBERO constants (ACTION_DIM 7, PROPRIO_DIM 8, NUM_ACTIONS_CHUNK 8) and
# prismatic/models/action_heads.py L1RegressionActionHead(input_dim=4096, hidden_dim=4096, action_dim=7),
# prismatic/models/projectors.py ProprioProjector(llm_dim=4096, proprio_dim=8).
OFT_LIBERO = OFTHeadSizes()


@dataclass(frozen=True)
class ActionStats:
    """BOUNDS_Q99 statistics of one dataset's actions ``[D]``."""

    q01: torch.Tensor
    q99: torch.Tensor
    mask: torch.Tensor


def action_stats(
    norm_stats: dict[str, Any], unnorm_key: str | None, action_dim: int
) -> tuple[str, ActionStats]:
    """The ``(key, stats)`` to un-normalize with. ``unnorm_key`` None picks the only key; a key that is
    absent falls back to ``<key>_no_noops`` (RLinf's rule) before failing with the keys there are."""
    keys = sorted(norm_stats)
    if not keys:
        raise BadInput("the checkpoint has no norm_stats (config.json) and no dataset_statistics.json")
    if unnorm_key is None:
        if len(keys) != 1:
            raise BadInput(f"the checkpoint has statistics for {keys}: pass unnorm_key= one of them")
        unnorm_key = keys[0]
    if unnorm_key not in norm_stats and f"{unnorm_key}_no_noops" in norm_stats:
        unnorm_key = f"{unnorm_key}_no_noops"
    if unnorm_key not in norm_stats:
        raise BadInput(f"unnorm_key {unnorm_key!r} not in the checkpoint's statistics; available: {keys}")
    stats = norm_stats[unnorm_key].get("action", {})
    missing = [k for k in ("q01", "q99") if k not in stats]
    if missing:
        raise BadInput(f"statistics {unnorm_key!r}/action lack {missing}")
    q01 = torch.tensor(stats["q01"], dtype=torch.float32)
    q99 = torch.tensor(stats["q99"], dtype=torch.float32)
    mask = torch.tensor(stats.get("mask", [True] * len(q01)), dtype=torch.bool)
    if not len(q01) == len(q99) == len(mask) == action_dim:
        raise BadInput(
            f"statistics {unnorm_key!r} are for {len(q01)}-D actions, the env's actions are {action_dim}-D"
        )
    return unnorm_key, ActionStats(q01, q99, mask)


def dataset_statistics(
    actions: np.ndarray, proprio: np.ndarray | None, *, mask: list[bool], num_trajectories: int
) -> dict[str, Any]:
    """One dataset's entry of ``dataset_statistics.json`` computed from data, in the layout OpenVLA's
    data pipeline writes: ``action`` (and ``proprio``) with ``mean``, ``std``, ``max``, ``min``,
    ``q01``, ``q99`` per dim (``action`` also the ``mask`` of dims to normalize), plus
    ``num_transitions`` and ``num_trajectories``. ``actions`` ``[N, D]`` are in the model's action
    space (the LIBERO gripper as 0 / 1: ``OpenVLAOFTPolicy.actions_to_normalized``'s input side)."""
    out: dict[str, Any] = {"action": {**_moments(actions), "mask": [bool(m) for m in mask]}}
    if proprio is not None:
        out["proprio"] = _moments(proprio)
    out["num_transitions"] = int(len(actions))
    out["num_trajectories"] = int(num_trajectories)
    return out


def _moments(x: np.ndarray) -> dict[str, list[float]]:
    x = np.asarray(x, np.float64)
    return {
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "max": x.max(0).tolist(),
        "min": x.min(0).tolist(),
        "q01": np.quantile(x, 0.01, axis=0).tolist(),
        "q99": np.quantile(x, 0.99, axis=0).tolist(),
    }
