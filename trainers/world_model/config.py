"""Settings of ``python -m trainers.world_model`` (flags, a ``--config`` JSON file, or a resumed run's
``config.json``; see ``trainers.config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nets.errors import BadInput

BACKENDS = ("opensora",)


@dataclass
class WorldModelConfig:
    """What to train on, the model, the optimization, and where the run and the bundle go."""

    # -- data
    demos: str = "demos/demos.h5"
    """demonstrations recorded one action per step with a camera (any format trainers.datasets reads)"""
    image_key: str = "image"
    """the observation holding the camera frame"""
    val_fraction: float = 0.1
    """held-out episodes for eval/loss (at least one when there are two or more; 0: none)"""
    # -- model
    backend: Literal["opensora"] = "opensora"
    """the world model to train (OpenSora STDiT3 + SDXL VAE; Cosmos is not trainable yet)"""
    init_from: str | None = None
    """start from this bundle (RLinf's OpenSora bundle or one this command wrote): its STDiT3, VAE,
    action statistics and reward model"""
    image_size: tuple[int, int] | None = None
    """frame (height, width), multiples of 16: the demos' size unless given (an --init-from bundle fixes
    it: its training.json, or 256x256 for RLinf's)"""
    chunk: int = 8
    """frames (and actions) per step of the env (RLinf: 8)"""
    condition_frames: int = 4
    """context latents before the chunk (RLinf: 4; an --init-from model fixes it)"""
    hidden_size: int = 64
    """a fresh STDiT3's width (the published XL/2: 1152)"""
    depth: int = 2
    """a fresh STDiT3's spatial + temporal block pairs (XL/2: 28)"""
    num_heads: int = 2
    """a fresh STDiT3's attention heads (XL/2: 16)"""
    vae: str = "tiny"
    """a fresh model's frozen VAE: a diffusers AutoencoderKL folder (e.g. the SDXL VAE), or "tiny" (a
    random 16-channel one, its latent scale calibrated on the demos; its decoded frames mean little
    unless vae_steps trains it)"""
    vae_steps: int = 0
    """optimizer steps that train the "tiny" VAE on the training episodes' frames before the world model
    (reconstruction + vae_kl_weight * KL), which then trains over it frozen; 0: keep it random, calibrated
    in scale only. Only a fresh "tiny" VAE trains: a pretrained --vae and an --init-from bundle's stay
    frozen"""
    vae_learning_rate: float = 1e-3
    """AdamW step size of the VAE stage"""
    vae_batch_size: int = 16
    """frames per VAE optimizer step"""
    vae_kl_weight: float = 1e-6
    """weight of the posterior's KL divergence (summed over the latent, per pixel value) against the
    per-pixel reconstruction error: the LDM autoencoders' 1e-6 on per-image sums"""
    vae_loss: Literal["l1", "mse"] = "l1"
    """the VAE's reconstruction error"""
    action_stats: Literal["auto", "demos", "init"] = "auto"
    """the action normalization (q01/q99): from the demos, or the --init-from bundle's (auto: the
    bundle's when there is one)"""
    reward_model: str | None = None
    """a resnet_rm.pth for the bundle (python -m trainers.reward_model trains one); default: the
    --init-from bundle's, else a placeholder that never reports success"""
    # -- objective and optimization (RLinf/opensora's published settings, see configs/)
    timestep_sampling: Literal["uniform", "logit-normal"] = "logit-normal"
    """how the noise level of each clip is drawn"""
    timestep_transform: bool = True
    """shift the drawn levels by the frame size (the identity at 256x256)"""
    steps: int = 300
    """optimizer steps in all (a resumed run continues to this many)"""
    batch_size: int = 8
    """clips per optimizer step"""
    learning_rate: float = 1e-4
    """AdamW step size after the warm-up"""
    warmup_steps: int = 0
    """steps over which the step size rises linearly to learning_rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    adam_eps: float = 1e-15
    """AdamW epsilon"""
    max_grad_norm: float = 1.0
    """clip the gradient norm per step"""
    ema_decay: float = 0.99
    """decay of the weights' exponential moving average (0: none, the bundle gets the trained weights)"""
    bundle_weights: Literal["ema", "model"] = "ema"
    """which weights the bundle gets"""
    bf16: bool = False
    """bfloat16 autocast for the model's forward (GPUs)"""
    # -- run
    seed: int = 0
    """model init, split, clip order, noise"""
    device: str = "cpu"
    """where the model trains ("cuda" on a GPU)"""
    torch_threads: int = 0
    """torch intra-op threads (0: torch's default)"""
    eval_every: int = 50
    """steps between held-out losses (0: only at the start and the end)"""
    eval_clips: int = 32
    """clips per held-out loss (fixed clips, noise levels and noise)"""
    log_every: int = 10
    """steps between metric rows"""
    checkpoint_every: int = 100
    """steps between checkpoints (and one at the end)"""
    keep_checkpoints: int = 2
    """checkpoints kept (0: all)"""
    run_dir: str | None = None
    """the run folder (config.json, checkpoints/, metrics.jsonl, tb/); default: <out>.run"""
    resume: str | None = None
    """continue the run in this run folder (its settings are the base; --steps may extend it)"""
    out: str = "runs/world_model/bundle"
    """the bundle folder written at the end (the env loads it: model_dir=...)"""
    overwrite: bool = False
    """replace an existing --out (only a bundle this command wrote) and start over in a --run-dir that
    holds a run"""
    tensorboard: bool = True
    """TensorBoard event files in <run-dir>/tb"""
    progress: bool = True
    """progress bars"""
    notes: str = ""
    """free text kept with the run and the bundle (where a config's settings come from, measured times)"""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise BadInput(f"backend: expected one of {BACKENDS}, got {self.backend!r}")
        positive = {"chunk": self.chunk, "condition_frames": self.condition_frames, "steps": self.steps,
                    "batch_size": self.batch_size, "hidden_size": self.hidden_size, "depth": self.depth,
                    "num_heads": self.num_heads, "eval_clips": self.eval_clips,
                    "log_every": self.log_every, "checkpoint_every": self.checkpoint_every}  # fmt: skip
        for name, value in positive.items():
            if value < 1:
                raise BadInput(f"{name}: expected >= 1, got {value}")
        for name in ("warmup_steps", "eval_every", "keep_checkpoints", "torch_threads", "vae_steps"):
            if getattr(self, name) < 0:
                raise BadInput(f"{name}: expected >= 0, got {getattr(self, name)}")
        if not 0 <= self.val_fraction < 1:
            raise BadInput(f"val_fraction: expected a fraction in [0, 1), got {self.val_fraction}")
        if not 0 <= self.ema_decay < 1:
            raise BadInput(f"ema_decay: expected a value in [0, 1), got {self.ema_decay}")
        if self.learning_rate <= 0 or self.adam_eps <= 0 or self.max_grad_norm <= 0:
            raise BadInput(
                f"learning_rate, adam_eps and max_grad_norm must be > 0, got {self.learning_rate}, "
                f"{self.adam_eps}, {self.max_grad_norm}"
            )
        if self.vae_learning_rate <= 0 or self.vae_batch_size < 1 or self.vae_kl_weight < 0:
            raise BadInput(
                f"vae_learning_rate must be > 0, vae_batch_size >= 1 and vae_kl_weight >= 0, got "
                f"{self.vae_learning_rate}, {self.vae_batch_size}, {self.vae_kl_weight}"
            )
        if self.vae_loss not in ("l1", "mse"):
            raise BadInput(f"vae_loss: expected 'l1' or 'mse', got {self.vae_loss!r}")
        if self.vae_steps > 0 and self.init_from:
            raise BadInput(
                f"vae_steps {self.vae_steps}: the --init-from bundle {self.init_from}'s VAE is pretrained "
                "and stays frozen; vae_steps trains only a fresh tiny VAE (use vae_steps 0 with --init-from)"
            )
        if self.vae_steps > 0 and self.vae != "tiny":
            raise BadInput(
                f"vae_steps {self.vae_steps}: --vae {self.vae} is a pretrained VAE and stays frozen; "
                "vae_steps trains only a fresh tiny VAE (--vae tiny)"
            )
        if self.image_size is not None:
            size = tuple(self.image_size)
            if len(size) != 2 or any(s < 16 or s % 16 for s in size):
                raise BadInput(
                    f"image_size: expected [height, width], multiples of 16, got {self.image_size}"
                )
            self.image_size = (int(size[0]), int(size[1]))

    def lr_at(self, step: int) -> float:
        """The step size of optimizer step ``step`` (from 0): ``(step + 1) / (warmup_steps + 1)`` of
        learning_rate during the warm-up, then constant (the fork's ``LinearWarmupLR``)."""
        if step < self.warmup_steps:
            return self.learning_rate * (step + 1) / (self.warmup_steps + 1)
        return self.learning_rate
