"""Tiny world-model bundles: the real file layouts and code paths, random weights, CPU-sized.

``write_tiny_bundle("cosmos", dir)`` writes what the public Cosmos bundle holds (DiT ``.pt`` with
``net.``/``net_ema.`` prefixes, original-key Wan ``tokenizer/tokenizer.pth``, ``resnet_rm.pth``,
``dataset/*.npy``, ``dataset_statistics.json``) with tiny random networks; ``"opensora"`` writes the
OpenSora bundle (sharded safetensors + ``config.json``, a diffusers ``vae/`` folder, ...). The envs
load them with the same loaders as the real weights:

    path = write_tiny_bundle("cosmos", "/tmp/tiny-cosmos")
    env = gym.make_vec("CosmosWM-LiberoSpatial-v0", num_envs=2, model_dir=path, image_size=(32, 48))

The images are synthetic (coloured blocks on a table-like background): enough to exercise every
shape, not to look like LIBERO.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from nets.errors import BadInput

INSTRUCTIONS = (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate",
    "pick up the black bowl on the stove and place it on the plate",
    "pick up the black bowl on the wooden cabinet and place it on the plate",
)


def synthetic_image(rng: np.random.Generator, size: tuple[int, int] = (64, 64)) -> np.ndarray:
    """A uint8 (H, W, 3) picture: a vertical gradient and three coloured blocks."""
    h, w = size
    shade = np.linspace(60, 180, h, dtype=np.float32)[:, None, None]
    image = np.broadcast_to(shade * rng.uniform(0.6, 1.0, 3), (h, w, 3)).copy()
    for _ in range(3):
        y, x = rng.integers(0, h - h // 4), rng.integers(0, w - w // 4)
        image[y : y + h // 4, x : x + w // 4] = rng.integers(0, 256, 3)
    return image.astype(np.uint8)


def write_dataset(
    directory: str | os.PathLike, *, trajectories: int = 4, frames: int = 3, size: tuple[int, int] = (64, 64),
    name: str = "traj{k}.npy", seed: int = 0,
) -> Path:  # fmt: skip
    """RLinf's initial-frame dataset: one ``.npy`` object array of per-frame dicts per trajectory."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(trajectories):
        text = INSTRUCTIONS[k % len(INSTRUCTIONS)]
        record = np.empty(frames, dtype=object)
        record[:] = [
            {"image": synthetic_image(rng, size), "instruction": text, "task": text,
             "delta_action": rng.uniform(-1, 1, 7).astype(np.float32)}
            for _ in range(frames)
        ]  # fmt: skip
        np.save(folder / name.format(k=k), record, allow_pickle=True)
    return folder


def write_reward_model(path: str | os.PathLike, *, seed: int = 0, logit_bias: float = -10.0) -> Path:
    """A random ``resnet_rm.pth`` in the ``{"model_state_dict": ...}`` form.

    The head's bias is ``logit_bias`` (default: "no success" on every frame, so episodes run to
    their step limit; a random head would otherwise end them at arbitrary frames).
    """
    import torch

    from envs.world_models.reward import ResnetRewardModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ResnetRewardModel()
    with torch.no_grad():
        model.net[-1].bias.fill_(logit_bias)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model_state_dict": model.state_dict()}, path)
    return path


def write_stats(path: str | os.PathLike, *, dataset: str | None = None) -> Path:
    """Write a plausible LIBERO ``dataset_statistics.json`` (nested under ``dataset`` when given)."""
    action = {
        "mean": [0.05, 0.09, -0.10, 0.0, 0.0, -0.005, -0.05],
        "std": [0.27, 0.35, 0.44, 0.04, 0.06, 0.08, 1.0],
        "max": [0.94, 0.94, 0.94, 0.36, 0.38, 0.38, 1.0],
        "min": [-0.94, -0.94, -0.94, -0.19, -0.32, -0.38, -1.0],
        "q01": [-0.73, -0.70, -0.94, -0.11, -0.16, -0.22, -1.0],
        "q99": [0.86, 0.85, 0.94, 0.16, 0.20, 0.23, 1.0],
        "mask": [True] * 6 + [False],
    }
    proprio = {key: [0.0] * 8 for key in ("mean", "std", "max", "min", "q01", "q99")}
    stats = {"action": action, "proprio": proprio, "num_transitions": 52970, "num_trajectories": 432}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({dataset: stats} if dataset else stats, indent=2))
    return path


def write_tiny_bundle(backend: str, directory: str | os.PathLike, *, seed: int = 0) -> Path:
    """Write a tiny ``"cosmos"`` or ``"opensora"`` bundle into ``directory``; return it."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    if backend == "cosmos":
        from nets.cosmos_tiny import write_tiny_dit_checkpoint, write_tiny_tokenizer

        write_tiny_dit_checkpoint(root / "libero-spatial-2b-19k.pt", seed=seed)
        (root / "tokenizer").mkdir(exist_ok=True)
        write_tiny_tokenizer(root / "tokenizer" / "tokenizer.pth", seed=seed)
        write_dataset(root / "dataset", name="seed_0_traj_{k}.npy", seed=seed)
    elif backend == "opensora":
        from nets.opensora_tiny import write_tiny_stdit3, write_tiny_vae

        write_tiny_stdit3(root, seed=seed)
        write_tiny_vae(root / "vae", seed=seed)
        write_dataset(root / "dataset", name="traj{k}.npy", seed=seed)
    else:
        raise BadInput(f"write_tiny_bundle: backend must be 'cosmos' or 'opensora', got {backend!r}")
    write_reward_model(root / "resnet_rm.pth", seed=seed)
    write_stats(root / "dataset_statistics.json")
    return root
