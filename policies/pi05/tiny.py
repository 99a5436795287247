"""A tiny pi0.5 checkpoint in openpi's PyTorch layout, for tests and CPU benchmarks.

The same files as a converted openpi checkpoint (``config.json``, ``model.safetensors`` with the
tied embedding stored as ``paligemma.lm_head`` and the expert's unused ``lm_head``,
``assets/physical-intelligence/libero/norm_stats.json``) plus PaliGemma-style sentencepiece
``tokenizer.model`` (pad 0, eos 1, bos 2, unk 3) trained on a few LIBERO-like sentences. Sizes are
small, weights random; the code paths are the real ones.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from ..options import TINY_ABOUT, write_recipe_file
from ..pretrained import save_state_dict
from .config import Pi05Config
from .modeling import EXPERT_LM_HEAD, Pi05Model, to_checkpoint_keys

CORPUS = [
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the cookie box and place it on the plate",
    "open the top drawer of the cabinet and put the bowl inside",
    "put the bowl on the stove",
    "turn on the stove",
    "Task: open the drawer, State: 12 128 255 0 3 44 7 9;\nAction: ",
]
LIBERO_ASSET = "physical-intelligence/libero"
# Made-up LIBERO-like quantiles (state: eef xyz, axis-angle, gripper qpos x2; actions: 7-D).
TINY_STATS = {
    "state": {
        "q01": [-0.3, -0.3, 0.9, 2.5, -1.0, -0.5, 0.0, -0.04],
        "q99": [0.2, 0.3, 1.3, 3.3, 1.0, 0.5, 0.04, 0.0],
    },
    "actions": {
        "q01": [-0.8, -0.9, -0.9, -0.1, -0.15, -0.2, -1.0],
        "q99": [0.9, 0.9, 0.95, 0.12, 0.16, 0.25, 1.0],
    },
}


# trainers.bc's settings for this tiny model (written to its folder's fine_tune_recipe.json; see
# trainers.bc.policy_recipe): the published recipe's schedule shape, scaled to a few demos on a CPU.
TINY_RECIPE = {"learning_rate": 3e-3, "batch_size": 32, "lr_warmup_steps": 10, "lr_decay_steps": 0}
TINY_POLICY_KWARGS: dict = {}


def tiny_sentencepiece(vocab_size: int = 400) -> bytes:
    """A small PaliGemma-style sentencepiece model (byte fallback, so every string encodes)."""
    import sentencepiece

    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 10), model_writer=buf, vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, byte_fallback=True, character_coverage=1.0, num_threads=1,
        remove_extra_whitespaces=False, normalization_rule_name="identity", hard_vocab_limit=False,
        minloglevel=2,
    )  # fmt: skip
    return buf.getvalue()


def tiny_config(
    vocab_size: int, *, action_horizon: int = 10, discrete_state_input: bool | None = None
) -> Pi05Config:
    sizes = {
        "vision": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
        },  # fmt: skip
        "paligemma": {
            "width": 32,
            "depth": 2,
            "mlp_dim": 64,
            "num_heads": 2,
            "num_kv_heads": 1,
            "head_dim": 16,
        },
        "expert": {"width": 24, "depth": 2, "mlp_dim": 48, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16},
        "vocab_size": vocab_size,
    }
    return Pi05Config(action_horizon=action_horizon, discrete_state_input=discrete_state_input, sizes=sizes)


def write_tiny_pi05(folder: str | Path, *, seed: int = 0, **config_kwargs) -> Path:
    """Write a random tiny pi0.5 checkpoint to ``folder`` and return it."""
    import sentencepiece

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    proto = tiny_sentencepiece()
    (folder / "tokenizer.model").write_bytes(proto)
    vocab = sentencepiece.SentencePieceProcessor(model_proto=proto).vocab_size()
    config = tiny_config(vocab, **config_kwargs)
    torch.manual_seed(seed)
    model = Pi05Model(config)
    for module in model.modules():  # adaRMS dense layers start at 0; give them values to test
        if isinstance(module, torch.nn.Linear) and not module.weight.abs().sum():
            torch.nn.init.normal_(module.weight, std=0.02)
    state = to_checkpoint_keys(model.state_dict())
    state[EXPERT_LM_HEAD] = torch.randn(vocab, config.expert().width) * 0.02  # as in converted files
    save_state_dict(state, folder)
    (folder / "config.json").write_text(json.dumps(config.to_json_dict(), indent=2))
    stats_dir = folder / "assets" / LIBERO_ASSET
    stats_dir.mkdir(parents=True, exist_ok=True)
    stats = {
        k: {**v, "mean": [0.0] * len(v["q01"]), "std": [1.0] * len(v["q01"])} for k, v in TINY_STATS.items()
    }
    (stats_dir / "norm_stats.json").write_text(json.dumps({"norm_stats": stats}, indent=2))
    write_recipe_file(folder, TINY_ABOUT, TINY_RECIPE, TINY_POLICY_KWARGS)
    return folder
