"""The bundle a run writes: RLinf's OpenSora layout, which the world-model env loads unchanged
(``gym.make_vec("OpenSoraWM-LiberoSpatial-v0", model_dir=OUT, image_size=...)``), plus
``training.json``, what it was trained on.

    config.json, model-00001-of-00001.safetensors, model.safetensors.index.json   the STDiT3
    vae/                      the frozen VAE (diffusers AutoencoderKL folder)
    dataset_statistics.json   the action normalization the model was trained with (q01/q99, ...)
    resnet_rm.pth             the reward model (given, the --init-from bundle's, or a placeholder)
    dataset/episode_*.npy     initial frames: the demos' episodes (trainers.datasets.world_model)
    training.json             suite, tasks, episodes, steps, sizes, losses, wall time

The folder appears complete or not at all (``nets.files.atomic_folder``). An existing ``--out`` is
replaced only with ``--overwrite`` and only if it is a bundle this command wrote (its ``training.json``
and nothing but bundle entries, of either backend: ``cosmos_bundle`` writes the Cosmos one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.files import atomic_folder, check_output, only_entries, write_atomic
from nets.opensora_checkpoint import save_stdit3
from nets.opensora_stdit3 import STDiT3
from nets.opensora_vae import SDXLVAE
from nets.resnet_rm import ResnetRewardModel
from trainers.datasets.demos import Demos
from trainers.datasets.world_model import write_world_model_dataset
from trainers.world_model.cosmos_model import DIT_FILE, TOKENIZER_FILE
from trainers.world_model.model import BUNDLE_FORMAT, REWARD_FILE, STATS_FILE, TRAINING_FILE

ENTRIES = {
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "vae",
    "dataset",
    STATS_FILE,
    REWARD_FILE,
    TRAINING_FILE,
    DIT_FILE,
    TOKENIZER_FILE.split("/")[0],
}  # fmt: skip (either backend's)
PLACEHOLDER_WIDTH = 8  # a small reward network that answers "no success" for every frame


def is_our_bundle(folder: Path) -> bool:
    """Whether ``folder`` is a bundle this command wrote (what ``--overwrite`` may replace)."""
    record = folder / TRAINING_FILE
    if not record.is_file() or record.is_symlink():
        return False
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    names = ENTRIES | {p.name for p in folder.glob("model-*-of-*.safetensors")}
    return isinstance(data, dict) and data.get("format") == BUNDLE_FORMAT and only_entries(folder, names)


def check_bundle_output(out: str | Path, overwrite: bool, sources: list[str]) -> Path:
    """``--out`` checked before training (``nets.files.check_output``)."""
    return check_output(
        out, overwrite=overwrite, ours=is_our_bundle, what="a world-model bundle", sources=sources
    )


def action_statistics(actions: np.ndarray, episodes: int) -> dict[str, Any]:
    """RLinf's ``dataset_statistics.json`` from the executed actions ``[N, D]``: mean, std, max, min,
    q01, q99, mask. A dimension whose q01 and q99 coincide (a constant action) gets q01 - 1 and q99 + 1,
    so that the normalization ``2 (a - q01) / (q99 - q01) - 1`` maps the constant to 0 instead of
    dividing by zero."""
    q01, q99 = np.quantile(actions, 0.01, axis=0), np.quantile(actions, 0.99, axis=0)
    flat = q99 - q01 < 1e-6
    q01, q99 = np.where(flat, q01 - 1, q01), np.where(flat, q99 + 1, q99)
    d = actions.shape[1]
    action = {"mean": actions.mean(0), "std": actions.std(0), "max": actions.max(0), "min": actions.min(0),
              "q01": q01, "q99": q99, "mask": [True] * (d - 1) + [False]}  # fmt: skip
    action = {k: np.asarray(v).tolist() for k, v in action.items()}
    return {"action": action, "num_transitions": int(len(actions)), "num_trajectories": int(episodes)}


def placeholder_reward_model(path: Path, seed: int) -> None:
    """A reward model that never reports success (its head's bias is -10): the env then runs episodes to
    their step limit. ``training.json`` says so; train a real one with ``python -m trainers.reward_model``."""
    generator = torch.Generator().manual_seed(seed)
    model = ResnetRewardModel(width=PLACEHOLDER_WIDTH, frozen=False)
    with torch.no_grad():
        for p in model.parameters():  # small weights drawn from the run's own generator
            p.copy_(torch.randn(p.shape, generator=generator) * 0.01)
        model.net[-1].bias.fill_(-10.0)
    torch.save({"model_state_dict": model.state_dict()}, path)


def write_bundle(
    out: Path,
    *,
    dit: STDiT3,
    vae: SDXLVAE,
    stats: dict[str, Any],
    reward: Path | None,
    demos: Demos,
    record: dict[str, Any],
    seed: int,
    progress: bool = True,
) -> Path:
    """Write the bundle (module docstring) into ``out`` atomically; returns it."""
    with atomic_folder(out) as staging:  # an old bundle (checked before training) goes once this is complete
        save_stdit3(dit, staging, indexed=True)  # RLinf's bundles name the index (the env looks for it)
        vae.module.save_pretrained(staging / "vae")
        write_shared_parts(staging, stats=stats, reward=reward, demos=demos, record=record, seed=seed,
                           progress=progress)  # fmt: skip
    return out


def write_shared_parts(
    staging: Path,
    *,
    stats: dict[str, Any],
    reward: Path | None,
    demos: Demos,
    record: dict[str, Any],
    seed: int,
    progress: bool = True,
) -> None:
    """What every backend's bundle holds beside its networks: ``dataset_statistics.json``, the reward
    model (given, or a placeholder), the initial-frame ``dataset/`` and ``training.json``."""
    (staging / STATS_FILE).write_text(json.dumps(stats, indent=2))
    if reward is not None:
        ResnetRewardModel.from_checkpoint(reward)  # refused here if it is no reward model
        shutil.copyfile(reward, staging / REWARD_FILE)
    else:
        placeholder_reward_model(staging / REWARD_FILE, seed)
    write_world_model_dataset(demos, staging, progress=progress)
    write_atomic(staging / TRAINING_FILE, json.dumps(record, indent=2) + "\n")
