"""The OpenSora world model's training objective: rectified flow on latent clips with clean context.

What RLinf's OpenSora fork (``RLinf/opensora``, ``opensora/schedulers/rf/rectified_flow.py``
``RFlowScheduler.training_losses`` and ``add_noise``, driven by ``scripts/train_web.py``) computes,
written out in one place:

* A clip is ``condition_frames`` context latents followed by ``chunk`` target latents; its frame
  mask is False for the context and True for the targets (the fork's ``video_obs_4_frame`` mask).
* A noise level ``t`` in [0, 1000) per clip: uniform, or ``sigmoid(N(0, 1)) * 1000`` ("logit-normal",
  the setting of the published model's config), then optionally the resolution shift
  ``timestep_transform`` (the same formula the sampler uses; the identity at 256x256).
* ``x_t = (1 - t/1000) x0 + (t/1000) noise`` for the targets; the context frames are noised with the
  same noise to the fixed level ``t0 = 15`` (clean but not quite: what the model sees for the
  condition frames, whose modulation also uses ``t0``).
* The model predicts a velocity (the first half of its output channels when it predicts sigma too);
  the target is ``x0 - noise``; the loss is its squared error averaged over the target frames only
  (channels, height, width and target frames), then over the clips.

The sampler (``nets.opensora_sampler.rflow_sample``) integrates exactly this velocity from t = 1000
down to 0 with the context frames held fixed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from nets.errors import BadInput
from nets.opensora_sampler import NUM_TIMESTEPS, timestep_transform

CONDITION_TIMESTEP = 15.0  # the noise level of the context frames during training (and their embedding)
TimestepSampling = Literal["uniform", "logit-normal"]

# model(x_t, t [B], x_mask [B, T]) -> [B, >=C, T, H, W]: the velocity in the first C channels
Velocity = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sample_timesteps(
    batch: int,
    generator: torch.Generator,
    *,
    method: TimestepSampling = "logit-normal",
    transform: bool = True,
    height: int,
    width: int,
) -> torch.Tensor:
    """``[batch]`` noise levels in [0, 1000) (float32, CPU), drawn from ``generator``.

    ``uniform``: ``U[0, 1) * 1000``; ``logit-normal``: ``sigmoid(N(0, 1)) * 1000`` (the first component
    of torch's ``LogisticNormal(0, 1)``, as the fork draws it). ``transform`` shifts them by the frame
    size as ``timestep_transform`` does (the fork's ``use_timestep_transform``).
    """
    if method == "uniform":
        t = torch.rand(batch, generator=generator) * NUM_TIMESTEPS
    elif method == "logit-normal":
        t = torch.sigmoid(torch.randn(batch, generator=generator)) * NUM_TIMESTEPS
    else:
        raise BadInput(f"timestep sampling: expected 'uniform' or 'logit-normal', got {method!r}")
    if transform:
        t = timestep_transform(t, height=height, width=width)
    return t


def add_noise(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``(1 - t/1000) x0 + (t/1000) noise`` for ``x0 [B, C, T, H, W]`` and ``t [B]`` (or a scalar)."""
    level = (torch.as_tensor(t, dtype=torch.float32, device=x0.device) / NUM_TIMESTEPS).reshape(
        -1, 1, 1, 1, 1
    )
    return (1 - level) * x0 + level * noise


def frame_mask(
    batch: int, condition_frames: int, chunk: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``[batch, condition_frames + chunk]`` bool: False for the context frames, True for the targets."""
    mask = torch.ones(batch, condition_frames + chunk, dtype=torch.bool, device=device)
    mask[:, :condition_frames] = False
    return mask


def noised_input(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The model's input: targets (mask True) at level ``t``, context frames at ``CONDITION_TIMESTEP``."""
    x_t = add_noise(x0, noise, t)
    x_t0 = add_noise(x0, noise, torch.full_like(t, CONDITION_TIMESTEP))
    return torch.where(mask[:, None, :, None, None], x_t, x_t0)


def masked_mean(error: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per clip: the mean of ``error [B, C, T, H, W]`` over the frames where ``mask [B, T]`` is True."""
    per_frame = error.mean(dim=(1, 3, 4))  # [B, T]: the mean over channels, height and width
    weights = mask.to(per_frame.dtype)
    return (per_frame * weights).sum(1) / weights.sum(1)


def flow_loss(
    velocity: Velocity, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The rectified-flow loss of each clip ``[B]``: the squared error of the predicted velocity against
    ``x0 - noise`` on the target frames (module docstring). ``x0``, ``noise`` ``[B, C, T, H, W]``."""
    if x0.shape != noise.shape or x0.ndim != 5:
        raise BadInput(
            f"flow_loss: expected x0 and noise of one shape [B, C, T, H, W], got {list(x0.shape)}, "
            f"{list(noise.shape)}"
        )
    prediction = velocity(noised_input(x0, noise, t, mask), t, mask)[:, : x0.shape[1]]
    return masked_mean((prediction.float() - (x0 - noise)) ** 2, mask)


class OpenSoraObjective:
    """The objective as the trainer uses it (``trainers.world_model.backends``): noise levels for training
    and for the fixed held-out measurement, and the mean loss of a batch."""

    def __init__(self, *, condition_frames: int, method: TimestepSampling, transform: bool,
                 image_size: tuple[int, int]) -> None:  # fmt: skip
        self.condition_frames, self.method, self.transform = condition_frames, method, transform
        self.height, self.width = image_size

    def prepare(self, dit: torch.nn.Module) -> None:
        """Freeze what never trains: the fixed RoPE frequencies (learned_freq=False in the fork)."""
        dit.rope.freqs.requires_grad_(False)

    def levels(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        return sample_timesteps(batch, generator, method=self.method, transform=self.transform,
                                height=self.height, width=self.width)  # fmt: skip

    def eval_levels(self, batch: int) -> torch.Tensor:
        """Levels spread evenly over (0, 1000), then shifted as in training."""
        levels = (torch.arange(batch, dtype=torch.float32) + 0.5) / batch * NUM_TIMESTEPS
        if self.transform:
            levels = timestep_transform(levels, height=self.height, width=self.width)
        return levels

    def loss(self, dit: torch.nn.Module, latents: torch.Tensor, actions: torch.Tensor, t: torch.Tensor,
             noise: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The mean ``flow_loss`` of a batch (all tensors on the model's device)."""
        chunk = latents.shape[2] - self.condition_frames
        mask = frame_mask(len(latents), self.condition_frames, chunk, latents.device)

        def velocity(x: torch.Tensor, level: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
            return dit(x, level, actions, x_mask, height=self.height, width=self.width)

        return flow_loss(velocity, latents, noise, t, mask).mean()

    def record(self) -> dict[str, object]:
        """What ``training.json`` says of the objective."""
        return {"timestep_sampling": self.method, "timestep_transform": self.transform,
                "condition_timestep": CONDITION_TIMESTEP}  # fmt: skip
