"""The VAE stage of a from-scratch tiny recipe: train the tiny VAE on the training episodes' frames, then
freeze it for the world model (``vae_steps`` > 0; issue 49: "keep the VAE frozen"). OpenSora's image VAE
(``AutoencoderKL``) trains on single frames; Cosmos's causal video VAE (``AutoencoderKLWan``) on clips of
consecutive frames (``cosmos_data.VAE_CLIP_FRAMES``), which train both its first-frame latent and a
temporal one; the backend picks the samples (``backends.Backend.vae_samples``).

The objective is the usual one of latent-diffusion autoencoders without their perceptual and adversarial
terms (no model hub here): the reconstruction error of a posterior sample's decoding (L1 or MSE, the mean
over pixels and channels in [-1, 1]) plus ``kl_weight`` times the KL divergence of the posterior from
N(0, I) summed over the latent and divided by the pixel count, which is the LDM autoencoders' ``nll +
kl_weight * kl`` (both summed per image, kl_weight 1e-6) divided by the pixels per image. Only the
training episodes' frames are seen; the held-out ones are measured (reconstruction error in uint8 units,
0..255, of the posterior mean's decoding), never trained on. The KL is summed over every latent dimension
(diffusers' ``DiagonalGaussianDistribution.kl`` sums only three, which misses one of a video latent's).

Batches are drawn from one generator (frame rows and posterior noise) whose state is checkpointed with
the weights and the optimizer, so a resumed stage takes the same steps as one never stopped. After the
last step the backend calibrates the latent scale as a random tiny VAE's is (``Backend.calibrate_trained``:
OpenSora's scaled latents, Cosmos's normalized ones, of unit standard deviation on the training frames).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput
from nets.opensora_vae import SDXLVAE
from nets.wan_vae import WanVAE
from trainers import checkpoint as ckpt
from trainers.metrics import MetricsLogger
from trainers.optim import BadUpdateGuard, step_optimizer
from trainers.world_model.config import WorldModelConfig

STAGE = "vae"
EVAL_FRAMES = 128  # frames per reconstruction measurement (evenly spaced frames, or clips holding as many)


def to_unit(samples: np.ndarray) -> torch.Tensor:
    """uint8 frames ``[N, H, W, 3]`` -> float ``[N, 3, H, W]``, or clips ``[N, T, H, W, 3]`` -> ``[N, 3, T, H,
    W]``, in [-1, 1] (the env's and the encoder's scaling)."""
    x = torch.from_numpy(np.ascontiguousarray(samples))
    x = x.permute(0, 3, 1, 2) if x.ndim == 4 else x.permute(0, 4, 1, 2, 3)
    return x.float() / 127.5 - 1


def sample_frames(samples: np.ndarray) -> int:
    """Frames per sample: 1 for frames ``[N, H, W, 3]``, T for clips ``[N, T, H, W, 3]``."""
    return 1 if samples.ndim == 4 else int(samples.shape[1])


@torch.no_grad()
def reconstruction_mae(vae: SDXLVAE | WanVAE, samples: np.ndarray, batch: int = 64) -> float:
    """Mean absolute error in uint8 units (0..255) of ``samples`` (uint8 frames or clips, ``to_unit``)
    against the decoding of their posterior mean, rounded to uint8 as the env rounds its observations."""
    module, total = vae.module, 0.0
    batch = max(1, batch // sample_frames(samples))
    was_training = module.training
    module.eval()
    try:
        for start in range(0, len(samples), batch):
            x = to_unit(samples[start : start + batch]).to(vae.device, vae.dtype)
            y = module.decode(module.encode(x).latent_dist.mean).sample.float()
            pixels = ((y.clamp(-1, 1) + 1) * 127.5).round()
            total += float((pixels - (x.float() + 1) * 127.5).abs().sum())
    finally:
        module.train(was_training)
    return total / samples[..., :3].size


def evenly(frames: np.ndarray, count: int) -> np.ndarray:
    """``count`` frames evenly spaced over ``frames`` (all of them when there are fewer)."""
    picks = np.unique(np.linspace(0, len(frames) - 1, min(count, len(frames))).round().astype(np.int64))
    return frames[picks]


class VaeTrainer:
    """The tiny VAE's training: ``step()`` takes one optimizer step on a batch of training samples (frames,
    or clips for a video VAE: ``to_unit``)."""

    def __init__(
        self, cfg: WorldModelConfig, vae: SDXLVAE | WanVAE, train: np.ndarray, held: np.ndarray | None
    ) -> None:
        if len(train) == 0:
            raise BadInput("vae_steps: no training frames to train the VAE on")
        self.cfg, self.vae = cfg, vae
        self.module = vae.module.train().requires_grad_(True)
        self.train_frames, self.held_frames = train, held
        self.optimizer = torch.optim.AdamW(
            self.module.parameters(), lr=cfg.vae_learning_rate, weight_decay=0.0
        )
        self.generator = torch.Generator().manual_seed(cfg.seed + 104729)
        self.guard = BadUpdateGuard()
        self.step_index = 0
        self.pending: list[list[float]] = []  # [loss, reconstruction, kl, grad norm] of steps not logged

    def loss(
        self, x: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, reconstruction, kl)`` of frames ``x`` in [-1, 1] (module docstring)."""
        posterior = self.module.encode(x).latent_dist
        y = self.module.decode(posterior.sample(generator=generator)).sample
        error = (y - x).abs() if self.cfg.vae_loss == "l1" else (y - x) ** 2
        reconstruction = error.mean()
        dims = list(range(1, posterior.mean.ndim))  # KL to N(0, I) summed over the whole latent
        kl = 0.5 * torch.sum(torch.pow(posterior.mean, 2) + posterior.var - 1.0 - posterior.logvar, dim=dims)
        kl = kl.mean() / x[0].numel()  # per pixel value
        return reconstruction + self.cfg.vae_kl_weight * kl, reconstruction, kl

    def step(self) -> list[float]:
        """One optimizer step on ``vae_batch_size`` training samples; returns [loss, rec, kl, grad norm]."""
        g = self.generator
        rows = torch.randint(0, len(self.train_frames), (self.cfg.vae_batch_size,), generator=g)
        x = to_unit(self.train_frames[rows.numpy()]).to(self.vae.device)
        loss, reconstruction, kl = self.loss(x, g)
        _, norm = step_optimizer(loss, self.optimizer, self.cfg.max_grad_norm, self.guard)
        self.step_index += 1
        return [float(loss.detach()), float(reconstruction.detach()), float(kl.detach()), float(norm)]

    def evaluate(self) -> dict[str, float]:
        """Reconstruction MAE (0..255) on fixed training samples and on the held-out episodes'."""
        count = max(1, EVAL_FRAMES // sample_frames(self.train_frames))
        row = {"vae/train_mae": reconstruction_mae(self.vae, evenly(self.train_frames, count))}
        if self.held_frames is not None and len(self.held_frames):
            row["vae/eval_mae"] = reconstruction_mae(self.vae, evenly(self.held_frames, count))
        return row

    def state(self, config: dict[str, Any], algo: str, iteration: int) -> dict[str, Any]:
        return {
            "algo": algo,
            "stage": STAGE,
            "config": config,
            "vae": {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()},
            "vae_optimizer": self.optimizer.state_dict(),
            "rng": ckpt.rng_state({"vae": self.generator}),
            "counters": {
                "iteration": iteration,
                "vae_step": self.step_index,
                "vae_steps": self.cfg.vae_steps,
                **self.guard.counters(),
            },  # fmt: skip
            "pending": self.pending,
        }

    def load(self, data: dict[str, Any], path: Path) -> None:
        try:
            self.module.load_state_dict(data["vae"])
            self.optimizer.load_state_dict(data["vae_optimizer"])
            ckpt.restore_rng_state(data["rng"], {"vae": self.generator})
            counters = data["counters"]
            self.step_index = int(counters["vae_step"])
            self.guard.restore_counters(counters)
            self.pending = [list(map(float, p)) for p in data["pending"]]
        except (KeyError, TypeError, RuntimeError) as e:
            raise BadInput(
                f"{path}: does not fit this run's VAE and settings ({type(e).__name__}: {e})"
            ) from None


def train_vae(
    cfg: WorldModelConfig,
    trainer: VaeTrainer,
    logger: MetricsLogger,
    save: Callable[[int, dict[str, Any]], None],
    config: dict[str, Any],
    algo: str,
) -> dict[str, Any]:
    """The VAE loop from ``trainer.step_index`` to ``cfg.vae_steps``: log, evaluate, checkpoint (not at the
    last step: the world-model stage's first checkpoint follows it). The metrics' ``iteration`` is the VAE
    step. Returns what ``training.json`` records of the stage; the module is left frozen, in eval mode."""
    from tqdm.auto import tqdm

    start = trainer.step_index
    if start == 0:
        logger.log(0, {"iteration": 0, **trainer.evaluate()})
    clock = time.perf_counter()
    bar = tqdm(total=cfg.vae_steps, initial=start, desc="VAE", unit="step", disable=not cfg.progress,
               dynamic_ncols=True, mininterval=1.0)  # fmt: skip
    try:
        while trainer.step_index < cfg.vae_steps:
            trainer.pending.append(trainer.step())
            step = trainer.step_index
            row: dict[str, float] = {}
            if step % cfg.log_every == 0:
                loss, reconstruction, kl, norm = np.array(trainer.pending).mean(0)
                row.update({"vae/loss": loss, "vae/reconstruction": reconstruction, "vae/kl": kl,
                            "vae/grad_norm": norm, "vae/lr": cfg.vae_learning_rate})  # fmt: skip
                trainer.pending = []
            if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.vae_steps:
                row.update(trainer.evaluate())
            if row:
                row.update({"iteration": step, "time/elapsed": time.perf_counter() - clock})
                logger.log(step, row)
                bar.set_postfix(
                    {k.split("/")[-1]: f"{v:.4g}" for k, v in row.items() if "mae" in k}, refresh=False
                )
            if step % cfg.checkpoint_every == 0 and step < cfg.vae_steps:
                save(step, trainer.state(config, algo, step))
            bar.update(1)
    finally:
        bar.close()
    trainer.module.eval().requires_grad_(False)
    end = trainer.evaluate()
    return {
        "steps": cfg.vae_steps,
        "wall_s_this_call": time.perf_counter() - clock,
        "steps_this_call": cfg.vae_steps - start,
        "bad_updates": trainer.guard.total,
        "end": end,
    }


def posterior_spread(vae: SDXLVAE, frames: np.ndarray) -> dict[str, float]:
    """The scaled latents' standard deviation and mean posterior standard deviation on ``frames``: what
    the flow model sees (1 and a small spread after calibration)."""
    mean, std = vae.posterior(to_unit(evenly(frames, 256)).to(vae.device))
    return {"latent_std": float((mean * vae.scaling_factor).std()),
            "posterior_std": float((std * vae.scaling_factor).mean())}  # fmt: skip
