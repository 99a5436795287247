"""A tiny OpenVLA / OpenVLA-OFT checkpoint in the real on-disk layout, for tests and CPU benchmarks
(the original OpenVLA and OpenVLA-OFT share the model and the folder layout).

Same files as a public checkpoint folder (``config.json``, sharded safetensors with
``model.safetensors.index.json``, ``tokenizer.json`` + ``tokenizer_config.json``,
``dataset_statistics.json``) and the same code paths; only the sizes are small and the weights
random. The tokenizer is a small sentencepiece-style unigram with Llama-2's conventions (``<s>`` BOS,
``▁`` word boundaries, ``<PAD>`` added after the base vocabulary, whose top 256 ids are the action bins).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

from nets.errors import BadInput

from ..options import TINY_ABOUT, write_recipe_file
from ..pretrained import save_state_dict
from .action_heads import L1RegressionActionHead
from .config import STATS_FILE, OpenVLAConfig
from .modeling import OpenVLAModel
from .proprio import ProprioProjector
from .vision import ViTSpec

# Made-up LIBERO-like statistics (7-D: xyz, rpy, gripper; the gripper is not normalized).
TINY_STATS = {
    "q01": [-0.75, -0.8, -0.9, -0.1, -0.15, -0.2, 0.0],
    "q99": [0.9, 0.85, 0.95, 0.12, 0.16, 0.25, 1.0],
    "mask": [True] * 6 + [False],
}


# Whole-word pieces (the prompt and common LIBERO words); other words fall back to characters.
WORDS = (
    "In What action should the robot take to Out pick up black bowl between plate and ramekin place it on "
    "next cookie box from table center drawer of wooden cabinet stove open close put turn top"
).split()


# trainers.bc's settings for this tiny model (written to its folder's fine_tune_recipe.json; see
# trainers.bc.policy_recipe): the published recipe's schedule shape, scaled to a few demos on a CPU.
# The published recipe's LoRA (rank 32) on the frozen random base, as on the real one: fully fine-tuning
# it at this step size overwrites the action positions' states with the mean chunk in the first epoch.
TINY_RECIPE = {"learning_rate": 3e-3, "batch_size": 16, "lr_warmup_steps": 0, "lr_decay_steps": 0}
TINY_POLICY_KWARGS: dict = {}


def tiny_tokenizer(vocab_size: int = 512):
    """A small Llama-style fast tokenizer (unigram) with ``vocab_size`` base ids plus ``<PAD>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = {"<unk>": 0.0, "<s>": 0.0, "</s>": 0.0, "▁": -5.0}
    for char in string.ascii_letters + string.digits + string.punctuation + "\n":
        pieces.setdefault(char, -10.0)
    for word in WORDS:
        pieces.setdefault("▁" + word.lower(), -1.0)
        pieces.setdefault("▁" + word, -1.0)
    pieces.setdefault("Out", -1.0)  # after the newline: "\nOut:"
    if len(pieces) + 256 > vocab_size:
        raise BadInput(f"vocab_size {vocab_size} leaves no room for 256 action bins after {len(pieces)} ids")
    for i in range(len(pieces), vocab_size):
        pieces[f"<extra_{i}>"] = -100.0
    tok = Tokenizer(models.Unigram(list(pieces.items()), unk_id=0, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.add_special_tokens({"pad_token": "<PAD>"})
    return fast


def tiny_config(
    *,
    fused: bool = True,
    image_size: int = 32,
    hidden_size: int = 32,
    num_layers: int = 2,
    vocab_size: int = 512,
    unnorm_key: str = "libero_spatial_no_noops",
) -> OpenVLAConfig:
    """A small config with the real structure (two fused towers, Llama backbone, padded LM head)."""
    dino = ViTSpec(image_size=image_size, patch_size=8, embed_dim=32, depth=3, num_heads=2, mlp_hidden=64,
                   reg_tokens=4, layer_scale=True)  # fmt: skip
    siglip = ViTSpec(image_size=image_size, patch_size=8, embed_dim=48, depth=3, num_heads=2, mlp_hidden=96,
                     class_token=False, map_head=True, mean=(0.5,) * 3, std=(0.5,) * 3)  # fmt: skip
    towers = [dino, siglip] if fused else [dino]
    padded = -(-(vocab_size + 1) // 64) * 64  # base vocabulary + <PAD>, padded to a multiple of 64
    text_config = {
        "model_type": "llama",
        "vocab_size": padded,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 512,
        "pad_token_id": vocab_size,
        # Llama-2's std 0.02 is a gain of ~1.3 per projection at width 4096 but 0.11 at 32, where it leaves
        # the zeroed action positions near 0 and almost blind to the image and state: 1 / sqrt(width)
        "initializer_range": hidden_size**-0.5,
    }
    return OpenVLAConfig(
        timm_model_ids=["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"][
            : len(towers)
        ],
        use_fused_vision_backbone=fused,
        image_sizes=[image_size] * len(towers),
        text_config=text_config,
        pad_token_id=vocab_size,
        n_action_bins=256,
        norm_stats={},
        vision_specs=[t.to_dict() for t in towers],
    )


def write_tiny_openvla(
    folder: str | Path,
    *,
    seed: int = 0,
    unnorm_key: str = "libero_spatial_no_noops",
    max_shard_bytes: int | None = 200_000,
    action_head: bool = False,
    proprio_dim: int | None = None,
    **config_kwargs,
) -> Path:
    """Write a random tiny OpenVLA-OFT checkpoint to ``folder`` and return it; with ``action_head``
    also a random L1-regression head for 7-D actions, as the OFT fine-tuning script saves it
    (``action_head--0_checkpoint.pt``, names with DDP's ``module.`` prefix); with ``proprio_dim``
    a random proprio projector (``proprio_projector--0_checkpoint.pt``, the same way) and the
    statistics' ``proprio`` entry (q01 -1, q99 1)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(unnorm_key=unnorm_key, **config_kwargs)
    torch.manual_seed(seed)
    model = OpenVLAModel(config)
    save_state_dict(model.state_dict(), folder, max_shard_bytes)
    (folder / "config.json").write_text(json.dumps(config.to_json_dict(), indent=2))
    stats = {"action": {**TINY_STATS, "mean": [0.0] * 7, "std": [1.0] * 7},
             "num_transitions": 1000, "num_trajectories": 10}  # fmt: skip
    if proprio_dim is not None:
        low, high = [-1.0] * proprio_dim, [1.0] * proprio_dim
        stats["proprio"] = {"mean": [0.0] * proprio_dim, "std": high, "min": low, "max": high,
                            "q01": low, "q99": high}  # fmt: skip
    (folder / STATS_FILE).write_text(json.dumps({unnorm_key: stats}, indent=2))
    tiny_tokenizer(config.pad_token_id).save_pretrained(str(folder))
    if action_head:
        head = L1RegressionActionHead(config.text_config["hidden_size"], 7)
        state = {f"module.{k}": v for k, v in head.state_dict().items()}
        torch.save(state, folder / "action_head--0_checkpoint.pt")
    if proprio_dim is not None:
        projector = ProprioProjector(config.text_config["hidden_size"], proprio_dim)
        state = {f"module.{k}": v for k, v in projector.state_dict().items()}
        torch.save(state, folder / "proprio_projector--0_checkpoint.pt")
    write_recipe_file(folder, TINY_ABOUT, TINY_RECIPE, TINY_POLICY_KWARGS)
    return folder
