"""Training clips from demonstrations: context frames, the action chunk, the frames it leads to.

Demos recorded one action per step (``chunk_size`` None or 1: an image before every action) are cut
as RLinf's OpenSora fork cuts its LIBERO videos (``opensora/datasets/simplevla_webdataset.py``,
``_split_to_windows``): for every step ``s`` with ``s + chunk`` frames still in the episode, the clip
is the frames ``s - condition_frames + 1 .. s`` (the context, the episode's first frame repeated where
it starts before the episode, as the env's reset repeats the first frame), then the frames
``s + 1 .. s + chunk`` (the targets), with the actions ``s .. s + chunk - 1`` (action ``s`` leads from
frame ``s`` to frame ``s + 1``).

Every frame is encoded once by the frozen VAE: its posterior mean and standard deviation are kept
(``LatentCache``, saved in the run folder so a resume does not encode again), and each use draws a
fresh posterior sample from them, as the fork's per-step ``vae.encode`` does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput
from nets.files import write_atomic
from nets.opensora_vae import SDXLVAE
from nets.safe_load import torch_load
from trainers.datasets.demos import Demos
from trainers.world_model.config import WorldModelConfig
from trainers.world_model.model import Networks

CACHE_FORMAT = "vla-gym-world-model-latents"


@dataclass
class EpisodeFrames:
    """One demonstrated episode as the world model sees it: ``frames`` uint8 ``[T, H, W, 3]`` (the
    image before each action), ``actions`` float32 ``[T, D]`` (env units), and where it came from."""

    frames: np.ndarray
    actions: np.ndarray
    index: int
    task: str
    instruction: str


def read_episodes(
    demos: Demos,
    *,
    source: str,
    image_key: str,
    image_size: tuple[int, int],
    action_dim: int,
    condition_frames: int,
    chunk: int,
) -> list[EpisodeFrames]:
    """The executed steps of every episode, checked against the model (a ``BadInput`` naming the
    demos, the episode, what the model expects and what came: before anything is trained)."""
    if not demos.episodes:
        raise BadInput(f"{source}: no episodes to train on")
    stored = demos.episodes[0].actions.shape[1]
    if stored != 1:
        raise BadInput(
            f"{source}: the demos hold one image per chunk of {stored} actions; the world model imagines "
            "one frame per action, so it trains on demos recorded one action per step: record them with "
            "chunk_size null (python -m trainers.demos --env-kwargs '{\"chunk_size\": null, ...}')"
        )
    need = condition_frames + chunk
    episodes, short = [], []
    for n, ep in enumerate(demos.episodes):
        if image_key not in ep.obs:
            raise BadInput(
                f"{source}: episode {n} has no {image_key!r} observation (it has {sorted(ep.obs)}): record "
                "the demos with a camera (env_kwargs cameras ['agentview'])"
            )
        valid = np.asarray(ep.valid, bool)[:, 0]
        steps = int(valid.sum())
        frames = np.asarray(ep.obs[image_key])[valid]
        actions = np.asarray(ep.actions, np.float32)[valid, 0]
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
            raise BadInput(
                f"{source}: episode {n}: {image_key!r} must be uint8 images [T, H, W, 3], got "
                f"{frames.dtype} {list(frames.shape)}"
            )
        if actions.shape[1] != action_dim:
            raise BadInput(
                f"{source}: episode {n} has {actions.shape[1]}-D actions, the model takes {action_dim}-D"
            )
        if tuple(frames.shape[1:3]) != tuple(image_size):
            raise BadInput(
                f"{source}: episode {n} has {frames.shape[1]}x{frames.shape[2]} frames, the model takes "
                f"{image_size[0]}x{image_size[1]}: record the demos at that image_size, or train a model "
                "of their size (--image-size, and no --init-from of another size)"
            )
        if not np.isfinite(actions).all():
            step = int(np.argwhere(~np.isfinite(actions))[0][0])
            raise BadInput(f"{source}: episode {n}: the actions hold NaN or infinite values (step {step})")
        if steps < need:
            short.append(f"{n} ({steps})")
        episodes.append(EpisodeFrames(frames, actions, n, ep.task or ep.instruction, ep.instruction))
    if short:
        raise BadInput(
            f"{source}: episodes with fewer frames than context + one chunk ({condition_frames} + {chunk} = "
            f"{need}): {', '.join(short[:8])}{' ...' if len(short) > 8 else ''} (episode (frames)); "
            "drop them or record longer episodes"
        )
    return episodes


def clip_indices(lengths: list[int], condition_frames: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """``(frame_index [M, condition_frames + chunk], action_index [M, chunk])``: every clip of every
    episode (module docstring), as indices into the episodes' frames and actions laid end to end."""
    frame_rows, action_rows = [], []
    offset = 0
    for length in lengths:
        for s in range(length - chunk):
            context = np.maximum(np.arange(s - condition_frames + 1, s + 1), 0)
            frame_rows.append(offset + np.concatenate([context, np.arange(s + 1, s + chunk + 1)]))
            action_rows.append(offset + np.arange(s, s + chunk))
        offset += length
    return np.asarray(frame_rows, np.int64), np.asarray(action_rows, np.int64)


def frames_digest(episodes: list[EpisodeFrames], vae: torch.nn.Module, layout: str = "") -> str:
    """SHA-256 of every frame, of the VAE's weights (``vae``: the VAE module) and of ``layout`` (how the
    frames are cut into what is encoded): what a latent cache was computed from."""
    digest = hashlib.sha256(layout.encode())
    for ep in episodes:
        digest.update(f"{ep.frames.shape}".encode())
        digest.update(np.ascontiguousarray(ep.frames).data)
    for name, value in vae.state_dict().items():
        digest.update(name.encode())
        digest.update(value.detach().cpu().float().contiguous().numpy().data)
    return digest.hexdigest()


@dataclass
class LatentCache:
    """The VAE posterior of every frame, episodes laid end to end: ``mean``, ``std`` ``[N, C, h, w]``."""

    mean: torch.Tensor
    std: torch.Tensor
    digest: str

    @classmethod
    def encode(
        cls, episodes: list[EpisodeFrames], vae: SDXLVAE, digest: str, *, progress: bool = True
    ) -> LatentCache:
        from tqdm.auto import tqdm

        frames = np.concatenate([ep.frames for ep in episodes])
        means, stds = [], []
        batch = vae.micro_batch
        for start in tqdm(
            range(0, len(frames), batch), desc="VAE encode", unit="batch", disable=not progress, leave=False
        ):
            x = torch.from_numpy(frames[start : start + batch]).permute(0, 3, 1, 2).float() / 127.5 - 1
            mean, std = vae.posterior(x)
            means.append(mean.cpu())
            stds.append(std.cpu())
        return cls(torch.cat(means), torch.cat(stds), digest)

    def save(self, path: Path) -> None:
        save_cache(path, CACHE_FORMAT, self.digest, {"mean": self.mean, "std": self.std})

    @classmethod
    def load(cls, path: Path, digest: str) -> LatentCache | None:
        """The cache at ``path`` if it was computed from these frames and this VAE, else None."""
        data = load_cache(path, CACHE_FORMAT, digest, ("mean", "std"))
        return None if data is None else cls(data["mean"], data["std"], digest)


def save_cache(path: Path, kind: str, digest: str, tensors: dict[str, torch.Tensor]) -> None:
    """Write a latent cache atomically: its ``kind``, the ``digest`` of what it was computed from, tensors."""
    payload = {"format": kind, "digest": digest, **tensors}
    write_atomic(path, lambda f: torch.save(payload, f))


def load_cache(path: Path, kind: str, digest: str, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """The cache at ``path`` (read as plain data) if it is a ``kind`` cache of ``digest`` holding the tensors
    ``keys``; else None (missing, unreadable or stale: the caller encodes again)."""
    if not path.is_file():
        return None
    try:
        data = torch_load(path, opt_in=None)
    except (ValueError, OSError):
        return None
    ok = isinstance(data, dict) and data.get("format") == kind and data.get("digest") == digest
    return data if ok and all(isinstance(data.get(k), torch.Tensor) for k in keys) else None


class ClipSet:
    """Clips over a latent cache: ``batch(rows, generator)`` gives model-ready tensors.

    Args:
        cache: the posterior of every frame.
        actions: every action ``[N, D]`` (aligned with the frames: action i follows frame i).
        frame_index, action_index: from ``clip_indices``.
        q01, q99: the action normalization, ``2 (a - q01) / (q99 - q01) - 1`` (what the env applies).
        scaling_factor: the VAE latent scale (0.13025 for SDXL).
    """

    def __init__(
        self,
        cache: LatentCache,
        actions: np.ndarray,
        frame_index: np.ndarray,
        action_index: np.ndarray,
        q01: torch.Tensor,
        q99: torch.Tensor,
        scaling_factor: float,
    ) -> None:
        self.cache = cache
        normalized = 2 * (torch.from_numpy(actions) - q01) / (q99 - q01) - 1
        self.actions = normalized.float()
        self.frame_index = torch.from_numpy(frame_index)
        self.action_index = torch.from_numpy(action_index)
        self.scaling_factor = scaling_factor

    def __len__(self) -> int:
        return len(self.frame_index)

    def batch(self, rows: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(latents [B, C, T, h, w], actions [B, chunk, D])`` for clip ``rows``; each frame's latent is
        a fresh posterior sample drawn from ``generator``."""
        index = self.frame_index[rows]  # [B, T]
        mean, std = self.cache.mean[index], self.cache.std[index]  # [B, T, C, h, w]
        noise = torch.randn(mean.shape, generator=generator)
        latents = (mean + std * noise) * self.scaling_factor
        return latents.transpose(1, 2).contiguous(), self.actions[self.action_index[rows]]


def episode_rows(episodes: list[EpisodeFrames], indices: list[int]) -> np.ndarray:
    """The rows of episodes ``indices`` in the episodes' frames laid end to end."""
    offsets = np.cumsum([0] + [len(ep.frames) for ep in episodes])
    return np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in indices])


def opensora_clip_sets(
    cfg: WorldModelConfig, nets: Networks, episodes: list[EpisodeFrames], splits: list[list[int]],
    cache_path: Path, q01: torch.Tensor, q99: torch.Tensor,
) -> list[ClipSet]:  # fmt: skip
    """One ``ClipSet`` per list of episode indices in ``splits``, over the posterior of every frame
    (``cache_path``: loaded when it was computed from these frames and this VAE, else encoded and saved)."""
    digest = frames_digest(episodes, nets.vae.module)
    cache = LatentCache.load(cache_path, digest)
    if cache is None:
        cache = LatentCache.encode(episodes, nets.vae, digest, progress=cfg.progress)
        cache.save(cache_path)
    sets = []
    for indices in splits:
        keep = episode_rows(episodes, indices)
        sub = LatentCache(cache.mean[keep], cache.std[keep], digest)
        frame_index, action_index = clip_indices(
            [len(episodes[i].frames) for i in indices], nets.condition_frames, nets.chunk
        )
        actions = np.concatenate([episodes[i].actions for i in indices])
        sets.append(ClipSet(sub, actions, frame_index, action_index, q01, q99, nets.vae.scaling_factor))
    return sets
