"""The Cosmos world model's training objective: action-conditioned post-training of the DiT, written out in
one place (after the public cosmos-predict2 / cosmos-predict2.5 action-conditioned post-training).

* A clip is 4 latents of 13 frames (the causal Wan VAE: frame 0 alone, then groups of 4); latent 0 is
  the clean condition, the other 3 are denoised (``condition_mask``).
* A noise level per clip: an EDM sigma ``shift * exp(N(0, 1))`` (a logit-normal rectified-flow time
  shifted by ``shift``; Predict2.5: 5, Predict2: 2; ``nets.cosmos_noise``), and
  ``x_sigma = x0 + sigma * eps``.
* The denoiser is the sampler's own (``nets.cosmos_sampler.rf_x0``), so training and sampling agree: at
  ``t = sigma / (1 + sigma)`` the DiT sees ``(1 - t) x_sigma`` with the condition latent replaced by
  its clean value and labelled ``sigma_conditional = 1e-4``; ``x0_hat = (1 - t) x_sigma - t F``.
* The loss of a clip: the mean over channels, height, width and the denoised latents of
  ``w(sigma) (x0_hat - x0)^2``, ``w = (1 + sigma)^2 / sigma^2``, which is the velocity error
  ``(F - (eps - x0))^2``. The condition latent is replaced, so its error is exactly zero; the originals
  keep it in the mean's denominator (a constant factor 3/4 here), we leave it out.
* Actions enter through the DiT's action embedding multiplied by ``action_scaler`` (the env's, 20 for
  all 7 dimensions as RLinf), with the zero text context (RLinf's env default ``"zeros"``).
"""

from __future__ import annotations

import torch

from nets.cosmos_noise import logit_normal_quantiles, loss_weight, sample_sigma_logit_normal
from nets.cosmos_sampler import SIGMA_CONDITIONAL, rf_x0
from nets.errors import BadInput

CONDITION_LATENTS = 1  # latent 0 = pixel frame 0


def condition_mask(batch: int, latents: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[batch, latents]`` float: 1 on the condition latent(s), 0 on the denoised ones."""
    mask = torch.zeros(batch, latents, device=device)
    mask[:, :CONDITION_LATENTS] = 1.0
    return mask


def denoising_loss(
    dit: torch.nn.Module,
    x0: torch.Tensor,
    noise: torch.Tensor,
    sigma: torch.Tensor,
    action: torch.Tensor | None,
    cond_mask: torch.Tensor,
    context: torch.Tensor | None = None,
) -> torch.Tensor:
    """The loss of each clip ``[B]`` (module docstring). ``x0``, ``noise`` ``[B, C, T, H, W]``, ``sigma``
    ``[B]``, ``cond_mask`` ``[B, T]`` (1: a clean condition latent, not charged)."""
    if x0.shape != noise.shape or x0.ndim != 5 or sigma.shape != (x0.shape[0],):
        raise BadInput(
            f"denoising_loss: expected x0 and noise [B, C, T, H, W] of one shape and sigma [B], got "
            f"{list(x0.shape)}, {list(noise.shape)}, {list(sigma.shape)}"
        )
    s = sigma.to(x0.device, torch.float32).reshape(-1, 1, 1, 1, 1)
    x_sigma = x0 + s * noise
    x0_hat = rf_x0(dit, x_sigma, sigma, x0, cond_mask, action, context, SIGMA_CONDITIONAL)
    error = loss_weight(s) * (x0_hat - x0.float()) ** 2  # [B, C, T, H, W]
    per_latent = error.mean(dim=(1, 3, 4))  # [B, T]
    denoised = (1 - cond_mask).to(per_latent.dtype)
    return (per_latent * denoised).sum(1) / denoised.sum(1)


class CosmosObjective:
    """The objective as the trainer uses it (``trainers.world_model.backends``): noise levels for training
    and for the fixed held-out measurement, and the mean loss of a batch."""

    def __init__(self, *, sigma_shift: float, action_scaler: float) -> None:
        self.sigma_shift, self.action_scaler = sigma_shift, action_scaler

    def prepare(self, dit: torch.nn.Module) -> None:
        """Nothing is fixed in the Cosmos DiT (its RoPE is computed, not stored)."""

    def levels(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        return sample_sigma_logit_normal(batch, generator, shift=self.sigma_shift)

    def eval_levels(self, batch: int) -> torch.Tensor:
        """Evenly spaced quantiles of the training distribution."""
        return logit_normal_quantiles(batch, self.sigma_shift)

    def loss(self, dit: torch.nn.Module, latents: torch.Tensor, actions: torch.Tensor, sigma: torch.Tensor,
             noise: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The mean ``denoising_loss`` of a batch; ``actions`` in env units (scaled here, as the env does)."""
        mask = condition_mask(len(latents), latents.shape[2], latents.device)
        return denoising_loss(dit, latents, noise, sigma, actions * self.action_scaler, mask).mean()

    def record(self) -> dict[str, object]:
        """What ``training.json`` says of the objective."""
        return {"parametrization": "rectified flow, EDM sigmas (nets.cosmos_sampler.rf_x0)",
                "sigma": f"{self.sigma_shift} * exp(N(0, 1))", "sigma_shift": self.sigma_shift,
                "loss_weight": "(1 + sigma)^2 / sigma^2", "condition_latents": CONDITION_LATENTS,
                "sigma_conditional": SIGMA_CONDITIONAL, "action_scaler": self.action_scaler,
                "text_context": "zeros"}  # fmt: skip
