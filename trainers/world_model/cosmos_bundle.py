"""The bundle a Cosmos run writes: the public Cosmos bundle's layout, which the env loads unchanged
(``gym.make_vec("CosmosWM-LiberoSpatial-v0", model_dir=OUT, image_size=...)``), plus ``training.json``.

    libero-spatial-2b-19k.pt  the DiT as a Cosmos training checkpoint (what ``load_cosmos_dit`` reads):
                              ``net.*`` the bundle's weights (``bundle_weights``: the EMA or the trained
                              ones, fp32; the env loads ``net.`` by default), ``net_ema.*`` the EMA
                              weights in bf16 (prefix="net_ema." in the env)
    tokenizer/tokenizer.pth   the frozen Wan VAE, original Wan keys (the --init-from / --vae file as is)
    resnet_rm.pth             the reward model (given, the --init-from bundle's, or a placeholder)
    dataset/episode_*.npy     initial frames: the demos' episodes (trainers.datasets.world_model)
    dataset_statistics.json   the training actions' statistics (for reference: the env scales raw actions)
    training.json             suite, tasks, episodes, steps, sizes, losses, wall time

The folder appears complete or not at all (``nets.files.atomic_folder``), as the OpenSora bundle.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from nets.cosmos_dit import CosmosDiT
from nets.cosmos_tiny import wan_vae_to_original
from nets.files import atomic_folder
from trainers.datasets.demos import Demos
from trainers.world_model.bundle import write_shared_parts
from trainers.world_model.cosmos_model import DIT_FILE, TOKENIZER_FILE, CosmosNetworks


def dit_checkpoint(weights: CosmosDiT, ema: CosmosDiT | None) -> dict[str, torch.Tensor]:
    """A Cosmos training checkpoint's weights: ``net.*`` fp32 and, given, ``net_ema.*`` bf16 (as the public
    file: 6 bytes per parameter)."""
    state = {f"net.{k}": v.detach().float().cpu().clone() for k, v in weights.state_dict().items()}
    if ema is not None:
        state.update(
            {f"net_ema.{k}": v.detach().cpu().to(torch.bfloat16) for k, v in ema.state_dict().items()}
        )
    return state


def write_cosmos_bundle(
    out: Path,
    *,
    weights: CosmosDiT,
    ema: CosmosDiT | None,
    nets: CosmosNetworks,
    stats: dict[str, Any],
    reward: Path | None,
    demos: Demos,
    record: dict[str, Any],
    seed: int,
    progress: bool = True,
) -> Path:
    """Write the bundle (module docstring) into ``out`` atomically; returns it."""
    with atomic_folder(out) as staging:  # an old bundle (checked before training) goes once this is complete
        torch.save(dit_checkpoint(weights, ema), staging / DIT_FILE)
        (staging / TOKENIZER_FILE).parent.mkdir()
        if nets.tokenizer is not None:  # frozen: the file it came from, byte for byte
            shutil.copyfile(nets.tokenizer, staging / TOKENIZER_FILE)
        else:
            vae = {k: v.detach().float().cpu().clone() for k, v in nets.vae.vae.state_dict().items()}
            torch.save(wan_vae_to_original(vae), staging / TOKENIZER_FILE)
        write_shared_parts(staging, stats=stats, reward=reward, demos=demos, record=record, seed=seed,
                           progress=progress)  # fmt: skip
    return out
