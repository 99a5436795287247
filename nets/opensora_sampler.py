"""OpenSora's RFLOW sampler: rectified-flow Euler steps with a per-frame condition mask, no guidance.

Timesteps run from ``num_timesteps`` (pure noise) down in equal steps; the model predicts the velocity
``x0 - noise``, so ``z += v * dt`` moves toward the data. Frames whose mask is 0 are clean condition
frames: the model sees them with ``x_mask`` False and they are restored after every step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nets.errors import BadInput

NUM_TIMESTEPS = 1000
# The fork hard-codes num_frames=4 in the transform, which makes it the identity at 256x256.
TRANSFORM_NUM_FRAMES = 4

Velocity = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def timestep_transform(
    t: torch.Tensor,
    *,
    height: int,
    width: int,
    num_frames: int = TRANSFORM_NUM_FRAMES,
    num_timesteps: int = NUM_TIMESTEPS,
    base_resolution: int = 512 * 512,
    base_num_frames: int = 1,
    scale: float = 1.0,
) -> torch.Tensor:
    """Resolution/length shift of timesteps in [0, num_timesteps]: ``t' = r t / (1 + (r - 1) t)`` on t/1000.

    ``r = sqrt(height * width / base_resolution) * sqrt(num_frames / base_num_frames) * scale``.
    """
    ratio_space = (height * width / base_resolution) ** 0.5
    ratio_time = (num_frames / base_num_frames) ** 0.5
    ratio = ratio_space * ratio_time * scale
    t = t / num_timesteps
    return ratio * t / (1 + (ratio - 1) * t) * num_timesteps


def sampling_timesteps(
    num_steps: int,
    *,
    height: int,
    width: int,
    num_frames: int = TRANSFORM_NUM_FRAMES,
    num_timesteps: int = NUM_TIMESTEPS,
    transform: bool = True,
) -> torch.Tensor:
    """The ``num_steps`` timesteps ``(1 - i/num_steps) * num_timesteps`` (fp32), optionally transformed.

    10 steps at 256x256 give 1000, 900, ..., 100.
    """
    if num_steps < 1:
        raise BadInput(f"sampling_timesteps: expected num_steps >= 1, got {num_steps}")
    ts = torch.tensor([(1.0 - i / num_steps) * num_timesteps for i in range(num_steps)], dtype=torch.float32)
    if transform:
        ts = timestep_transform(
            ts, height=height, width=width, num_frames=num_frames, num_timesteps=num_timesteps
        )
    return ts


def step_sizes(timesteps: torch.Tensor, num_timesteps: int = NUM_TIMESTEPS) -> torch.Tensor:
    """Euler step sizes ``(t_i - t_{i+1}) / num_timesteps``; the last one is ``t_last / num_timesteps``."""
    nxt = torch.cat([timesteps[1:], timesteps.new_zeros(1)])
    return (timesteps - nxt) / num_timesteps


def rflow_sample(
    velocity: Velocity,
    z: torch.Tensor,
    frame_mask: torch.Tensor,
    timesteps: torch.Tensor,
    *,
    num_timesteps: int = NUM_TIMESTEPS,
) -> torch.Tensor:
    """Integrate latents ``z [B, C, T, H, W]`` from noise to data.

    Args:
        velocity: ``velocity(z, t [B], x_mask [B, T] bool) -> v [B, >=C, T, H, W]``; channels beyond C
            (the learned-sigma half) are ignored.
        z: condition latents in the frames where ``frame_mask`` is 0, noise elsewhere.
        frame_mask: ``[T]`` or ``[B, T]``, 1 (or True) for frames to generate, 0 for condition frames.
        timesteps: decreasing ``[num_steps]`` from ``sampling_timesteps``.

    Returns:
        The sampled latents, promoted to at least float32 (condition frames are exactly the inputs).
    """
    if z.ndim != 5:
        raise BadInput(f"rflow_sample: expected z [B, C, T, H, W], got {list(z.shape)}")
    batch, channels, frames = z.shape[:3]
    if frame_mask.shape not in ((frames,), (batch, frames)):
        raise BadInput(
            f"rflow_sample: expected frame_mask [{frames}] or [{batch}, {frames}], "
            f"got {list(frame_mask.shape)}"
        )
    mask = frame_mask.to(device=z.device, dtype=torch.float32).expand(batch, frames)
    timesteps = timesteps.to(device=z.device, dtype=torch.float32)
    dts = step_sizes(timesteps, num_timesteps)
    for t, dt in zip(timesteps, dts):
        x_mask = mask * num_timesteps >= t  # False for condition frames at every t in (0, 1000]
        x0 = z
        v = velocity(z, t.expand(batch), x_mask)[:, :channels]
        z = z + v * dt
        z = torch.where(x_mask[:, None, :, None, None], z, x0)
    return z
