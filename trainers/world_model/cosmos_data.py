"""Cosmos training clips: 13 frames and the 12 actions between them, each clip encoded once.

A clip is the frame before the chunk and the next 12 frames (``data.clip_indices`` with 1 context frame
and a chunk of 12: for every step ``s`` with 12 more frames in the episode, frames ``s .. s + 12`` and
actions ``s .. s + 11``; action ``s`` leads from frame ``s`` to frame ``s + 1``), what the DiT's action
embedding takes (12 x 7) and the causal Wan VAE turns into 4 latents. The VAE is a video VAE, so each
clip's 13 frames are encoded together, once: the deterministic posterior mean, normalized as
``WanVAE.encode`` does (``ClipLatents``, saved in the run folder keyed by a digest of the frames, the
VAE's weights and the clip layout, so a resume does not encode again).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nets.wan_vae import WanVAE
from trainers.world_model.config import WorldModelConfig
from trainers.world_model.cosmos_model import CosmosNetworks, calibrate_wan_latents
from trainers.world_model.data import EpisodeFrames, clip_indices, frames_digest, load_cache, save_cache

CACHE_FORMAT = "vla-gym-world-model-cosmos-latents"
ENCODE_BATCH = 4  # clips per VAE call
CALIBRATION_CLIPS = 32  # clips a fresh tiny VAE's latent scale is measured on
VAE_CLIP_FRAMES = 5  # a VAE stage's clips: the first-frame latent and one 4-frame temporal latent


def episode_clips(
    episodes: list[EpisodeFrames], chunk: int, stride: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(frame_index [M, chunk + 1], action_index [M, chunk], episode [M])``: every ``stride``-th clip
    of every episode, as indices into the episodes' frames and actions laid end to end."""
    frames, actions = clip_indices([len(ep.frames) for ep in episodes], 1, chunk)
    owner = np.repeat(np.arange(len(episodes)), [len(ep.frames) - chunk for ep in episodes])
    start = np.concatenate([np.arange(len(ep.frames) - chunk) for ep in episodes])
    keep = start % stride == 0
    return frames[keep], actions[keep], owner[keep]


def to_clip_pixels(frames: np.ndarray) -> torch.Tensor:
    """uint8 ``[B, T, H, W, 3]`` -> float ``[B, 3, T, H, W]`` in [-1, 1] (the env's scaling)."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 4, 1, 2, 3).float() / 127.5 - 1


@dataclass
class ClipLatents:
    """The normalized latents of every clip, ``[M, 16, 4, h, w]`` (float32, CPU)."""

    latents: torch.Tensor
    digest: str

    @classmethod
    def encode(cls, frames: np.ndarray, frame_index: np.ndarray, vae: WanVAE, digest: str, *,
               progress: bool = True) -> ClipLatents:  # fmt: skip
        """Encode clips ``frames[frame_index]`` (``frames``: every frame, uint8 ``[N, H, W, 3]``)."""
        from tqdm.auto import tqdm

        out = []
        for start in tqdm(range(0, len(frame_index), ENCODE_BATCH), desc="VAE encode", unit="batch",
                          disable=not progress, leave=False):  # fmt: skip
            pixels = to_clip_pixels(frames[frame_index[start : start + ENCODE_BATCH]])
            out.append(vae.encode(pixels.to(vae.device)).cpu())
        return cls(torch.cat(out), digest)

    def save(self, path: Path) -> None:
        save_cache(path, CACHE_FORMAT, self.digest, {"latents": self.latents})

    @classmethod
    def load(cls, path: Path, digest: str) -> ClipLatents | None:
        """The cache at ``path`` if it was computed from these clips and this VAE, else None."""
        data = load_cache(path, CACHE_FORMAT, digest, ("latents",))
        return None if data is None else cls(data["latents"], digest)


class CosmosClipSet:
    """Clips for the trainer: ``batch(rows, generator)`` gives ``(latents [B, 16, 4, h, w], actions
    [B, 12, 7])``, the actions in env units (the objective scales them). The latents are the encoder's
    deterministic mean, so ``generator`` draws nothing (the OpenSora clip set's signature)."""

    def __init__(self, latents: torch.Tensor, actions: np.ndarray) -> None:
        self.latents, self.actions = latents, torch.from_numpy(actions).float()

    def __len__(self) -> int:
        return len(self.latents)

    def batch(self, rows: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return self.latents[rows], self.actions[rows]


def cosmos_clip_sets(
    cfg: WorldModelConfig, nets: CosmosNetworks, episodes: list[EpisodeFrames], splits: list[list[int]],
    cache_path: Path, q01: torch.Tensor, q99: torch.Tensor,
) -> list[CosmosClipSet]:  # fmt: skip
    """One ``CosmosClipSet`` per list of episode indices in ``splits``; every clip encoded once
    (``cache_path``: loaded when it was computed from these clips and this VAE, else encoded and saved).
    ``q01``/``q99`` are not used: the Cosmos env feeds the DiT raw actions times ``action_scaler``."""
    frame_index, action_index, owner = episode_clips(episodes, nets.chunk, cfg.clip_stride)
    layout = f"cosmos clips of {nets.chunk + 1} frames, stride {cfg.clip_stride}"
    digest = frames_digest(episodes, nets.vae, layout)
    cache = ClipLatents.load(cache_path, digest)
    if cache is None:
        frames = np.concatenate([ep.frames for ep in episodes])
        cache = ClipLatents.encode(frames, frame_index, nets.vae, digest, progress=cfg.progress)
        cache.save(cache_path)
    actions = np.concatenate([ep.actions for ep in episodes])[action_index]  # [M, chunk, 7]
    sets = []
    for indices in splits:
        rows = np.flatnonzero(np.isin(owner, indices))
        sets.append(CosmosClipSet(cache.latents[rows], actions[rows]))
    return sets


def calibration_pixels(episodes: list[EpisodeFrames], chunk: int) -> torch.Tensor:
    """Up to ``CALIBRATION_CLIPS`` clips of ``chunk + 1`` frames spread evenly over ``episodes`` (pixels
    ``[B, 3, chunk + 1, H, W]``): what a VAE's latent scale is measured on (deterministic)."""
    frame_index, _, _ = episode_clips(episodes, chunk)
    picks = np.unique(np.linspace(0, len(frame_index) - 1, CALIBRATION_CLIPS).round().astype(np.int64))
    frames = np.concatenate([ep.frames for ep in episodes])
    return to_clip_pixels(frames[frame_index[picks]])


def calibrate_fresh_vae(cfg: WorldModelConfig, nets: CosmosNetworks, episodes: list[EpisodeFrames]) -> None:
    """Calibrate a fresh random tiny VAE (nothing else; a VAE stage's VAE is calibrated after it,
    ``calibrate_trained_vae``) on clips spread over the episodes (deterministic, so a resumed run rebuilds
    the same VAE and finds its latent cache)."""
    if cfg.init_from or cfg.vae != "tiny" or cfg.vae_steps:
        return
    calibrate_wan_latents(nets.vae, calibration_pixels(episodes, nets.chunk).to(nets.vae.device))


def vae_clips(episodes: list[EpisodeFrames]) -> np.ndarray:
    """The VAE stage's samples: every clip of ``VAE_CLIP_FRAMES`` consecutive frames of ``episodes``, uint8
    ``[M, VAE_CLIP_FRAMES, H, W, 3]``."""
    frame_index, _, _ = episode_clips(episodes, VAE_CLIP_FRAMES - 1)
    return np.concatenate([ep.frames for ep in episodes])[frame_index]


def calibrate_trained_vae(nets: CosmosNetworks, episodes: list[EpisodeFrames]) -> dict[str, float]:
    """After a VAE stage: normalized latents of unit standard deviation per channel on the training
    episodes' clips (``calibrate_wan_latents``); returns the spread before and after."""
    return calibrate_wan_latents(nets.vae, calibration_pixels(episodes, nets.chunk).to(nets.vae.device))
