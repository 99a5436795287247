"""A tiny Cosmos Policy checkpoint folder in the real layout, for tests and CPU runs: the DiT ``.pt``
(``net.*`` keys, no action MLPs), ``libero_dataset_statistics.json``, ``libero_t5_embeddings.pkl``
(random "T5" embeddings of LIBERO-like instructions) and the Wan VAE ``tokenizer/tokenizer.pth``.
The networks are the tiny ones of ``nets.cosmos_tiny``; sizes are small, the code paths real."""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from pathlib import Path

import torch

from nets.cosmos_tiny import write_tiny_dit_checkpoint, write_tiny_tokenizer

from ..options import TINY_ABOUT, write_recipe_file

# Made-up LIBERO-like statistics: actions 7-D, proprio 9-D (gripper qpos 2, eef pos 3, eef quaternion 4).
TINY_STATS = {
    "actions_min": [-0.9, -0.9, -0.9, -0.2, -0.2, -0.3, -1.0],
    "actions_max": [0.9, 0.9, 0.9, 0.2, 0.2, 0.3, 1.0],
    "proprio_min": [0.0, -0.04, -0.3, -0.3, 0.8, -1.0, -1.0, -1.0, -1.0],
    "proprio_max": [0.04, 0.0, 0.3, 0.3, 1.3, 1.0, 1.0, 1.0, 1.0],
}
INSTRUCTIONS = (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate",
    "pick up the black bowl from table center and place it on the plate",
    "pick up the black bowl on the cookie box and place it on the plate",
    "pick up the black bowl in the top drawer of the wooden cabinet and place it on the plate",
    "pick up the black bowl on the ramekin and place it on the plate",
    "pick up the black bowl next to the cookie box and place it on the plate",
    "pick up the black bowl on the stove and place it on the plate",
    "pick up the black bowl next to the plate and place it on the plate",
    "pick up the black bowl on the wooden cabinet and place it on the plate",
)


# trainers.bc's settings for this tiny model (written to its folder's fine_tune_recipe.json; see
# trainers.bc.policy_recipe): the published recipe's schedule shape, scaled to a few demos on a CPU.
TINY_RECIPE = {"learning_rate": 1e-3, "batch_size": 32, "lr_warmup_steps": 10, "lr_decay_steps": 0}
TINY_POLICY_KWARGS = {"image_size": 32}


def write_tiny_cosmos_policy(
    folder: str | Path,
    *,
    seed: int = 0,
    instructions: Sequence[str] = INSTRUCTIONS,
    text_tokens: int = 8,
    reason1_dim: int | None = None,
) -> Path:
    """Write the tiny checkpoint folder and return it. With ``reason1_dim`` it is a Predict2.5 one:
    the DiT has a ``crossattn_proj`` from ``reason1_dim`` and the folder holds
    ``libero_reason1_embeddings.pkl`` (``reason1_dim``-D) instead of T5 embeddings."""
    folder = Path(folder)
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    dit = write_tiny_dit_checkpoint(
        folder / "Cosmos-Policy-LIBERO-Tiny.pt",
        action_dim=None,
        ema=False,
        seed=seed,
        crossattn_proj_in_channels=reason1_dim,
    )
    write_tiny_tokenizer(folder / "tokenizer" / "tokenizer.pth", seed=seed)
    stats = {**TINY_STATS, **{f"{k}_{s}": [0.0] * len(TINY_STATS[f"{k}_min"]) for k in ("actions", "proprio")
                              for s in ("mean", "std", "median")}}  # fmt: skip
    (folder / "libero_dataset_statistics.json").write_text(json.dumps(stats, indent=2))
    gen = torch.Generator().manual_seed(seed)
    dim = reason1_dim or dit.config.crossattn_emb_channels
    embeddings = {
        text: torch.randn(1, text_tokens, dim, generator=gen).to(torch.bfloat16) for text in instructions
    }
    name = "libero_t5_embeddings.pkl" if reason1_dim is None else "libero_reason1_embeddings.pkl"
    with open(folder / name, "wb") as f:
        pickle.dump(embeddings, f)
    write_recipe_file(folder, TINY_ABOUT, TINY_RECIPE, TINY_POLICY_KWARGS)
    return folder
