"""How each world-model bundle imagines a chunk from true frames, for ``benchmarks.wm_pixels``: the model
as its env loads it, a fresh model of the same size, and what its VAE alone can show. One class per
backend, with the same methods; every result is uint8 ``[N, K, H, W, 3]``, rounded as the envs round
their observations.

* ``OpenSoraImagination``: RLinf's STDiT3 + SDXL-style image VAE (``OpenSoraWorldModel``); the context is
  ``condition_frames`` frames encoded one by one (posterior samples), the chunk sampled with RFLOW.
* ``CosmosImagination``: the Cosmos action DiT + causal Wan 2.1 video VAE (``CosmosWorldModel``); the
  context is the frame before the chunk (latent 0, the encoder's deterministic mean), the chunk sampled
  with the 2AB solver. Its VAE is a video VAE, so the round trip of the truth encodes the frame before
  the chunk and the chunk together, as the trainer encodes its clips.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput

OPENSORA_FILES = ("config.json", "vae/config.json", "dataset_statistics.json")
COSMOS_FILES = ("libero-spatial-2b-19k.pt", "tokenizer/tokenizer.pth")  # the env's names (envs.world_models)


def backend_of(root: Path) -> str | None:
    """``"opensora"`` or ``"cosmos"`` by the files the bundle holds (``training.json`` first), else None."""
    record = root / "training.json"
    if record.is_file():
        try:
            backend = json.loads(record.read_text()).get("backend")
        except (ValueError, OSError, AttributeError):
            backend = None
        if backend in ("opensora", "cosmos"):
            return backend
    for name, files in (("opensora", OPENSORA_FILES), ("cosmos", COSMOS_FILES)):
        if all((root / rel).is_file() for rel in files):
            return name
    return None


def missing_files(root: Path, backend: str | None) -> list[str]:
    """What a bundle of ``backend`` (both when unknown) lacks for this benchmark."""
    wanted = {"opensora": OPENSORA_FILES, "cosmos": COSMOS_FILES}.get(backend or "", OPENSORA_FILES)
    return [rel for rel in wanted if not (root / rel).is_file()]


def to_model(frames: np.ndarray) -> torch.Tensor:
    """uint8 ``[..., H, W, 3]`` -> float ``[prod(...), 3, H, W]`` in [-1, 1] (the env's reset scaling)."""
    x = torch.from_numpy(np.ascontiguousarray(frames.reshape(-1, *frames.shape[-3:])))
    return x.permute(0, 3, 1, 2).float() / 127.5 - 1.0


def to_pixels(frames: torch.Tensor) -> np.ndarray:
    """``[N, K, 3, H, W]`` in [-1, 1] -> uint8 ``[N, K, H, W, 3]``, rounded as the envs round observations."""
    from envs.world_models.env import _to_uint8  # the env's own conversion

    n, k = frames.shape[:2]
    return _to_uint8(frames.flatten(0, 1)).reshape(n, k, *frames.shape[3:], 3)


@dataclass
class Imagination:
    """A world model as the env loads it (``model``), seen by the benchmark."""

    model: Any

    @property
    def action_dim(self) -> int:
        return self.model.action_dim


@dataclass
class OpenSoraImagination(Imagination):
    """An ``OpenSoraWorldModel`` (``envs.world_models.opensora.model``)."""

    @property
    def condition_frames(self) -> int:
        return self.model.condition_frames

    def fresh(self, seed: int) -> OpenSoraImagination:
        """The same STDiT3 configuration freshly initialized (torch's defaults, as the trainer draws a new
        model, from ``seed``), sharing this model's VAE and action statistics."""
        from envs.world_models.opensora.model import OpenSoraWorldModel
        from nets.opensora_stdit3 import STDiT3

        m = self.model
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            dit = STDiT3(m.dit.config)
        return OpenSoraImagination(
            OpenSoraWorldModel(
                dit.to(m.device),
                m.vae,
                q01=m.q01.cpu(),
                q99=m.q99.cpu(),
                image_size=m.image_size,
                frames_per_step=m.frames_per_step,
                condition_frames=m.condition_frames,
                num_steps=m.num_steps,
                batch_size=m.batch_size,
            )
        )

    def imagine(
        self, context: np.ndarray, actions: np.ndarray, seed_encode: int, seed_noise: int
    ) -> np.ndarray:
        """The chunk from true ``context`` frames: encoded (posterior samples from ``seed_encode``), then
        ``generate`` (noise from ``seed_noise``)."""
        n, cond = context.shape[:2]
        latents = self.model.vae.encode(to_model(context), torch.Generator().manual_seed(seed_encode)).float()
        state = {"latents": latents.unflatten(0, (n, cond)).transpose(1, 2).contiguous()}
        generator = torch.Generator().manual_seed(seed_noise)
        frames, _ = self.model.generate(state, torch.from_numpy(actions), generator)
        return to_pixels(frames)

    def _round_trip(self, frames: np.ndarray, seed: int) -> np.ndarray:
        vae = self.model.vae
        with torch.no_grad():
            decoded = vae.decode(vae.encode(to_model(frames), torch.Generator().manual_seed(seed)).float())
        return to_pixels(decoded.unflatten(0, frames.shape[:2]))

    def copy_through_vae(self, last: np.ndarray, chunk: int, seed: int) -> np.ndarray:
        """The last context frame (uint8 ``[N, H, W, 3]``) encoded and decoded, repeated ``chunk`` times."""
        return np.repeat(self._round_trip(last[:, None], seed), chunk, axis=1)

    def round_trip(self, last: np.ndarray, targets: np.ndarray, seed: int) -> np.ndarray:
        """The true target frames encoded and decoded, each on its own (an image VAE)."""
        return self._round_trip(targets, seed)


@dataclass
class CosmosImagination(Imagination):
    """A ``CosmosWorldModel`` (``envs.world_models.cosmos.model``); its ``frames_per_step`` is the chunk."""

    condition_frames: int = 1

    def fresh(self, seed: int) -> CosmosImagination:
        """The same CosmosDiT configuration freshly initialized from ``seed``, sharing this model's VAE."""
        from envs.world_models.cosmos.model import CosmosWorldModel
        from nets.cosmos_dit import CosmosDiT

        m = self.model
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            dit = CosmosDiT(m.dit.config)
        return CosmosImagination(
            CosmosWorldModel(
                dit.to(m.device),
                m.vae,
                image_size=m.image_size,
                frames_per_step=m.frames_per_step,
                model_actions=m.model_actions,
                action_scaler=m.action_scaler.tolist(),
                num_steps=m.num_steps,
                guidance=m.guidance,
                batch_size=m.batch_size,
                text_context=m.text_context,
                dtype=torch.float32,
            )
        )

    def imagine(
        self, context: np.ndarray, actions: np.ndarray, seed_encode: int, seed_noise: int
    ) -> np.ndarray:
        """The chunk from the true frame before it (encoded deterministically: ``seed_encode`` unused),
        sampled with noise from ``seed_noise``."""
        frame = torch.from_numpy(np.ascontiguousarray(context[:, -1])).permute(
            0, 3, 1, 2
        )  # uint8 [N, 3, H, W]
        generator = torch.Generator().manual_seed(seed_noise)
        frames, _ = self.model.generate({"frame": frame}, torch.from_numpy(actions).float(), generator)
        return to_pixels(frames)

    def _video_round_trip(self, clip: np.ndarray) -> np.ndarray:
        """uint8 ``[N, T, H, W, 3]`` (T = 1 + 4k) encoded and decoded as one video each."""
        vae = self.model.vae
        pixels = torch.from_numpy(np.ascontiguousarray(clip)).permute(0, 4, 1, 2, 3).float() / 127.5 - 1
        decoded = vae.decode(vae.encode(pixels))  # [N, 3, T, H, W]
        return to_pixels(decoded.transpose(1, 2))

    def copy_through_vae(self, last: np.ndarray, chunk: int, seed: int) -> np.ndarray:
        """The last context frame encoded alone (latent 0, what the model starts from) and decoded."""
        return np.repeat(self._video_round_trip(last[:, None]), chunk, axis=1)

    def round_trip(self, last: np.ndarray, targets: np.ndarray, seed: int) -> np.ndarray:
        """The frame before the chunk and the chunk encoded together, as the trainer encodes a clip (the
        last target repeated up to 1 + 4k frames when the chunk is not a multiple of 4), decoded."""
        k = targets.shape[1]
        pad = -k % 4
        clip = np.concatenate([last[:, None], targets, *[targets[:, -1:]] * pad], axis=1)
        return self._video_round_trip(clip)[:, 1 : 1 + k]


def load_imagination(
    root: Path,
    backend: str,
    *,
    image_size: tuple[int, int],
    chunk: int,
    num_steps: int,
    batch_size: int,
    device: str,
) -> OpenSoraImagination | CosmosImagination:
    """The bundle's model as its env loads it (fp32; ``chunk`` frames per ``generate``)."""
    options = {"device": device, "dtype": torch.float32, "image_size": image_size, "frames_per_step": chunk,
               "num_steps": num_steps, "batch_size": batch_size}  # fmt: skip
    if backend == "opensora":
        from envs.world_models.opensora.model import OpenSoraWorldModel

        files = (root, root / "vae", root / "dataset_statistics.json")
        return OpenSoraImagination(OpenSoraWorldModel.from_files(*files, **options))
    if backend == "cosmos":
        from envs.world_models.cosmos.model import CosmosWorldModel

        return CosmosImagination(CosmosWorldModel.from_files(*(root / f for f in COSMOS_FILES), **options))
    raise BadInput(f"{root}: unknown world-model backend {backend!r} (expected 'opensora' or 'cosmos')")
