"""The seam between the training run (``train``: checks, run folder, loop, checkpoints, resume) and each
world model's own parts: how its networks are built, how its clips are made and cached, its objective
and its bundle. ``BACKENDS[cfg.backend]`` is the only place the run looks at the backend.

* ``opensora``: RLinf's STDiT3 + SDXL-style VAE (``model``, ``data``, ``objective``, ``bundle``).
* ``cosmos``: the Cosmos Predict 2.5 action DiT + frozen Wan 2.1 VAE (``cosmos_model``, ``cosmos_data``,
  ``cosmos_objective``, ``cosmos_bundle``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from trainers.datasets.demos import Demos
from trainers.world_model.bundle import write_bundle
from trainers.world_model.config import WorldModelConfig
from trainers.world_model.cosmos_bundle import write_cosmos_bundle
from trainers.world_model.cosmos_data import (
    VAE_CLIP_FRAMES,
    calibrate_fresh_vae,
    calibrate_trained_vae,
    cosmos_clip_sets,
    vae_clips,
)
from trainers.world_model.cosmos_model import fresh_cosmos_networks, load_cosmos_bundle
from trainers.world_model.cosmos_objective import CosmosObjective
from trainers.world_model.data import EpisodeFrames, opensora_clip_sets
from trainers.world_model.model import calibrate_latent_scale, fresh_networks, load_init_bundle
from trainers.world_model.objective import OpenSoraObjective
from trainers.world_model.vae import posterior_spread


class Objective(Protocol):
    """What the trainer needs of an objective (``objective.OpenSoraObjective``,
    ``cosmos_objective.CosmosObjective``)."""

    def prepare(self, dit: torch.nn.Module) -> None: ...  # freeze what never trains
    def levels(self, batch: int, generator: torch.Generator) -> torch.Tensor: ...  # training noise levels
    def eval_levels(self, batch: int) -> torch.Tensor: ...  # fixed levels of the held-out measurement
    def loss(self, dit: torch.nn.Module, latents: torch.Tensor, actions: torch.Tensor, levels: torch.Tensor,
             noise: torch.Tensor) -> torch.Tensor: ...  # fmt: skip
    def record(self) -> dict[str, Any]: ...  # what training.json says of it


@dataclass(frozen=True)
class Backend:
    """One world model's parts (module docstring); ``nets`` is its networks object (``model.Networks``,
    ``cosmos_model.CosmosNetworks``: ``dit``, ``vae``, ``image_size``, ``chunk``, ``condition_frames``,
    ``action_dim``, ``init_from``, ``init_stats``, ``init_reward``)."""

    networks: Callable[[WorldModelConfig, int, torch.device], Any]  # (cfg, demos' action dim, device)
    calibrate: Callable[[WorldModelConfig, Any, list[EpisodeFrames]], None]  # a fresh random VAE's scale
    clip_sets: Callable[..., list[Any]]  # (cfg, nets, episodes, splits, cache path, q01, q99)
    objective: Callable[[WorldModelConfig, Any], Objective]
    write_bundle: Callable[..., Path]  # (out, cfg, nets, trainer, stats, reward, demos, record)
    describe: Callable[[WorldModelConfig, Any], dict[str, Any]]  # training.json's model/vae entries
    vae_samples: Callable[[list[EpisodeFrames]], np.ndarray]  # a VAE stage's samples: frames or clips
    calibrate_trained: Callable[[Any, list[EpisodeFrames]], dict[str, Any]]  # the scale after a VAE stage


# ---- OpenSora -----------------------------------------------------------------------------------------


def _opensora_networks(cfg: WorldModelConfig, action_dim: int, device: torch.device) -> Any:
    return load_init_bundle(cfg, device) if cfg.init_from else fresh_networks(cfg, action_dim, device)


def _opensora_calibrate(cfg: WorldModelConfig, nets: Any, episodes: list[EpisodeFrames]) -> None:
    if not cfg.init_from and cfg.vae == "tiny" and not cfg.vae_steps:  # a random VAE: unit-variance latents
        calibrate_latent_scale(nets.vae, np.concatenate([ep.frames for ep in episodes]))


def _opensora_vae_samples(episodes: list[EpisodeFrames]) -> np.ndarray:
    return np.concatenate([ep.frames for ep in episodes])  # an image VAE: single frames


def _opensora_calibrate_trained(nets: Any, episodes: list[EpisodeFrames]) -> dict[str, Any]:
    frames = _opensora_vae_samples(episodes)  # the learned posterior spread kept, scaled with the mean
    scale = calibrate_latent_scale(nets.vae, frames, posterior_std=None)
    return {"latent_scale_k": scale, **posterior_spread(nets.vae, frames)}


def _opensora_objective(cfg: WorldModelConfig, nets: Any) -> Objective:
    return OpenSoraObjective(condition_frames=nets.condition_frames, method=cfg.timestep_sampling,
                             transform=cfg.timestep_transform, image_size=nets.image_size)  # fmt: skip


def _opensora_bundle(out: Path, cfg: WorldModelConfig, nets: Any, trainer: Any, stats: dict[str, Any],
                     reward: Path | None, demos: Demos, record: dict[str, Any]) -> Path:  # fmt: skip
    weights = trainer.ema_model() if cfg.bundle_weights == "ema" else trainer.trained_model()
    return write_bundle(out, dit=weights.eval(), vae=nets.vae, stats=stats, reward=reward, demos=demos,
                        record=record, seed=cfg.seed, progress=cfg.progress)  # fmt: skip


def _opensora_describe(cfg: WorldModelConfig, nets: Any) -> dict[str, Any]:
    if nets.init_from:
        vae = str(nets.init_from / "vae")
    elif cfg.vae_steps:
        vae = f"tiny, trained {cfg.vae_steps} steps on the training episodes' frames"
    else:
        vae = cfg.vae
    return {"model": nets.dit.config.to_dict(), "vae": vae}


# ---- Cosmos -------------------------------------------------------------------------------------------


def _cosmos_networks(cfg: WorldModelConfig, action_dim: int, device: torch.device) -> Any:
    return (
        load_cosmos_bundle(cfg, device) if cfg.init_from else fresh_cosmos_networks(cfg, action_dim, device)
    )


def _cosmos_objective(cfg: WorldModelConfig, nets: Any) -> Objective:
    return CosmosObjective(sigma_shift=cfg.sigma_shift, action_scaler=cfg.action_scaler)


def _cosmos_bundle(out: Path, cfg: WorldModelConfig, nets: Any, trainer: Any, stats: dict[str, Any],
                   reward: Path | None, demos: Demos, record: dict[str, Any]) -> Path:  # fmt: skip
    ema = trainer.ema_model() if cfg.ema_decay > 0 else None
    weights = ema if cfg.bundle_weights == "ema" and ema is not None else trainer.trained_model()
    return write_cosmos_bundle(out, weights=weights.eval(), ema=ema, nets=nets, stats=stats, reward=reward,
                               demos=demos, record=record, seed=cfg.seed, progress=cfg.progress)  # fmt: skip


def _cosmos_describe(cfg: WorldModelConfig, nets: Any) -> dict[str, Any]:
    if nets.tokenizer is not None:
        vae = f"{nets.tokenizer} (frozen)"
    elif cfg.vae_steps:
        vae = (f"tiny Wan 2.1 VAE (base_dim 8), trained {cfg.vae_steps} steps on the training episodes' "
               f"{VAE_CLIP_FRAMES}-frame clips, latents calibrated, frozen")  # fmt: skip
    else:
        vae = "tiny random Wan 2.1 VAE (base_dim 8), latents calibrated on the demos, frozen"
    return {"model": dataclasses.asdict(nets.dit.config), "vae": vae,
            "dit_file": {"net.": "ema" if cfg.bundle_weights == "ema" and cfg.ema_decay > 0 else "model",
                         "net_ema.": "ema" if cfg.ema_decay > 0 else None}}  # fmt: skip


BACKENDS: dict[str, Backend] = {
    "opensora": Backend(_opensora_networks, _opensora_calibrate, opensora_clip_sets, _opensora_objective,
                        _opensora_bundle, _opensora_describe, _opensora_vae_samples,
                        _opensora_calibrate_trained),
    "cosmos": Backend(_cosmos_networks, calibrate_fresh_vae, cosmos_clip_sets, _cosmos_objective,
                      _cosmos_bundle, _cosmos_describe, vae_clips, calibrate_trained_vae),
}  # fmt: skip
