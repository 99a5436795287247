"""OpenSora world model (RLinf's ``opensora_wm`` env): STDiT3 + SDXL VAE + RFLOW, autoregressive in latents.

``start`` encodes each first frame ``condition_frames`` times (four different posterior samples). Each
``generate`` appends ``frames_per_step`` noise latents to the condition latents, samples them with one
action per new frame, decodes the new latents frame-wise and keeps the last ``condition_frames`` latents
as the next condition (generated frames are never re-encoded).
"""

from __future__ import annotations

from pathlib import Path

import torch

from nets.errors import BadInput
from nets.opensora_checkpoint import load_action_stats, load_stdit3
from nets.opensora_sampler import rflow_sample, sampling_timesteps
from nets.opensora_stdit3 import STDiT3
from nets.opensora_vae import DOWNSAMPLE, SDXLVAE


class OpenSoraWorldModel:
    """Implements ``envs.world_models.model.WorldModel`` with RLinf's OpenSora LIBERO checkpoints.

    Args:
        dit, vae: the networks (their dtype is the compute dtype unless ``dtype`` is given).
        q01, q99: per-dimension action quantiles; actions become ``2 (a - q01) / (q99 - q01) - 1``
            (not clipped).
        image_size: (H, W) of the frames, multiples of 16 (RLinf: 256x256).
        frames_per_step: frames (and actions) per ``generate`` (RLinf: 8).
        condition_frames: latent condition frames kept between steps; must equal the DiT's
            ``pad_action_num`` (4).
        num_steps: RFLOW Euler steps (10).
        batch_size: envs per DiT micro-batch (16).
        dtype: cast both networks to this dtype (bf16 on GPU, as RLinf; fp32 for exactness).
        compile_blocks: ``torch.compile`` the DiT's blocks (the first ``generate`` compiles; about
            the same numbers, faster on a GPU; see ``benchmarks/README.md``).
    """

    def __init__(
        self,
        dit: STDiT3,
        vae: SDXLVAE,
        *,
        q01: torch.Tensor,
        q99: torch.Tensor,
        image_size: tuple[int, int] = (256, 256),
        frames_per_step: int = 8,
        condition_frames: int = 4,
        num_steps: int = 10,
        batch_size: int = 16,
        dtype: torch.dtype | None = None,
        compile_blocks: bool = False,
    ) -> None:
        cfg = dit.config
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.frames_per_step = frames_per_step
        self.condition_frames = condition_frames
        self.num_steps = num_steps
        self.batch_size = batch_size
        self.action_dim = cfg.action_dim
        self.action_low, self.action_high = -1.0, 1.0  # trained on LIBERO's delta pose and gripper
        multiple = DOWNSAMPLE * cfg.patch_size[1]
        if self.image_size[0] % multiple or self.image_size[1] % multiple:
            raise BadInput(
                f"OpenSoraWorldModel: expected image_size multiples of {multiple}, got {image_size}"
            )
        if condition_frames != cfg.pad_action_num:
            raise BadInput(
                f"OpenSoraWorldModel: expected condition_frames == the DiT's pad_action_num "
                f"({cfg.pad_action_num}), got {condition_frames}"
            )
        if min(frames_per_step, num_steps, batch_size) < 1:
            raise BadInput(
                f"OpenSoraWorldModel: expected frames_per_step, num_steps, batch_size >= 1, "
                f"got {frames_per_step}, {num_steps}, {batch_size}"
            )
        if vae.latent_channels != cfg.in_channels:
            raise BadInput(
                f"OpenSoraWorldModel: expected VAE latent channels == DiT in_channels ({cfg.in_channels}), "
                f"got {vae.latent_channels}"
            )
        q01, q99 = torch.as_tensor(q01, dtype=torch.float32), torch.as_tensor(q99, dtype=torch.float32)
        if q01.shape != (self.action_dim,) or q99.shape != (self.action_dim,):
            raise BadInput(
                f"OpenSoraWorldModel: expected q01, q99 of shape [{self.action_dim}], "
                f"got {list(q01.shape)}, {list(q99.shape)}"
            )
        self.dit, self.vae = dit.eval().requires_grad_(False), vae.eval().requires_grad_(False)
        if dtype is not None:
            self.dit.to(dtype)
            self.vae.to(dtype)
        self.q01, self.q99 = q01.to(self.device), q99.to(self.device)
        if compile_blocks:
            self.dit.compile_blocks()

    @classmethod
    def from_files(
        cls,
        model_path: str | Path,
        vae_dir: str | Path,
        stats_path: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        vae_micro_batch: int = 64,
        **options,
    ) -> OpenSoraWorldModel:
        """Load the STDiT3 checkpoint, the ``vae/`` folder and ``dataset_statistics.json``.

        ``dtype`` defaults to bf16 on CUDA and fp32 elsewhere; ``options`` go to the constructor.
        """
        device = torch.device(device)
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        dit = load_stdit3(model_path, dtype=dtype, device=device)
        vae = SDXLVAE.from_pretrained(vae_dir, dtype=dtype, device=device, micro_batch=vae_micro_batch)
        q01, q99 = load_action_stats(stats_path)
        return cls(dit, vae, q01=q01, q99=q99, **options)

    # ---- WorldModel protocol ---------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.dit.x_embedder.proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.dit.x_embedder.proj.weight.dtype

    def to(self, device: torch.device | str) -> OpenSoraWorldModel:
        """Move both networks and the action statistics to ``device``."""
        self.dit.to(device)
        self.vae.to(device)
        self.q01, self.q99 = self.q01.to(device), self.q99.to(device)
        return self

    def start(self, images: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """State ``{"latents": [n, 4, condition_frames, H/8, W/8]}`` (fp32) for first frames ``[n, 3, H, W]``.

        Every frame is encoded ``condition_frames`` times, each a different posterior sample (as RLinf).
        """
        expected = (3, *self.image_size)
        if images.ndim != 4 or tuple(images.shape[1:]) != expected:
            raise BadInput(
                f"OpenSoraWorldModel.start: expected images [n, 3, {self.image_size[0]}, "
                f"{self.image_size[1]}], got {list(images.shape)}"
            )
        n, cond = images.shape[0], self.condition_frames
        frames = images.to(self.device).repeat_interleave(cond, dim=0)  # each first frame, cond times
        latents = self.vae.encode(frames, generator)  # independent posterior samples
        return {"latents": latents.float().unflatten(0, (n, cond)).transpose(1, 2).contiguous()}

    def generate(
        self, state: dict[str, torch.Tensor], actions: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Frames ``[n, frames_per_step, 3, H, W]`` float32 and the next state (see the module doc)."""
        cond_latents = self._check_state(state)
        n, channels, _, h, w = cond_latents.shape
        steps = self.frames_per_step
        if tuple(actions.shape) != (n, steps, self.action_dim):
            raise BadInput(
                f"OpenSoraWorldModel.generate: expected actions [{n}, {steps}, {self.action_dim}], "
                f"got {list(actions.shape)}"
            )
        with torch.no_grad():
            actions = self.normalize_actions(actions)
            noise = torch.randn((n, channels, steps, h, w), generator=generator, dtype=torch.float32)
            noise = noise.to(self.device, self.dtype).float()  # noise at the compute precision, as RLinf
            z = torch.cat([cond_latents.to(self.device, torch.float32), noise], dim=2)
            batches = range(0, n, self.batch_size)
            new = torch.cat(
                [self._sample(z[i : i + self.batch_size], actions[i : i + self.batch_size]) for i in batches]
            )
            new = new[:, :, -steps:]
            frames = self.vae.decode(new.transpose(1, 2).flatten(0, 1)).unflatten(0, (n, steps))
            window = torch.cat([z[:, :, : self.condition_frames], new], dim=2)[:, :, -self.condition_frames :]
        return frames, {"latents": window.contiguous()}

    # ---- helpers ---------------------------------------------------------------------------------------

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """LIBERO actions -> ``2 (a - q01) / (q99 - q01) - 1`` (fp32, on the model device, unclipped)."""
        actions = actions.to(self.device, torch.float32)
        return 2 * (actions - self.q01) / (self.q99 - self.q01) - 1

    def _check_state(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        latents = state.get("latents") if isinstance(state, dict) else None
        h, w = (s // DOWNSAMPLE for s in self.image_size)
        expected = (self.dit.config.in_channels, self.condition_frames, h, w)
        ok = isinstance(latents, torch.Tensor) and latents.ndim == 5 and tuple(latents.shape[1:]) == expected
        if not ok:
            got = list(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
            shape = ", ".join(map(str, expected))
            raise BadInput(f"OpenSoraWorldModel: expected state['latents'] [n, {shape}], got {got}")
        return latents

    def _sample(self, z: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """RFLOW over one micro-batch: condition frames are the first ``condition_frames`` of ``z``."""
        height, width = self.image_size
        mask = torch.tensor([0] * self.condition_frames + [1] * self.frames_per_step)
        timesteps = sampling_timesteps(self.num_steps, height=height, width=width)

        def velocity(x: torch.Tensor, t: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
            return self.dit(x, t, actions, x_mask, height=height, width=width)

        return rflow_sample(velocity, z, mask, timesteps)
