"""Settings of ``python -m trainers.world_model`` (flags, a ``--config`` JSON file, or a resumed run's
``config.json``; see ``trainers.config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nets.errors import BadInput

BACKENDS = ("opensora", "cosmos")
# the clip each backend trains on: (condition frames, chunk); Cosmos: 1 clean frame + 12 actions -> 13 frames,
# 4 latents of the causal Wan VAE (what the DiT's action embedding takes)
CLIP_DEFAULTS = {"opensora": (4, 8), "cosmos": (1, 12)}


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
    backend: Literal["opensora", "cosmos"] = "opensora"
    """the world model to train: OpenSora (STDiT3 + SDXL VAE) or Cosmos Predict 2.5 (action DiT + frozen
    Wan 2.1 VAE, action-conditioned post-training)"""
    init_from: str | None = None
    """start from this bundle (RLinf's or one this command wrote, of --backend's kind): its DiT, VAE,
    action statistics and reward model"""
    trust_pickle: bool = False
    """read an --init-from Cosmos bundle's .pt and tokenizer.pth with a full unpickler (files you trust
    that are not plain data)"""
    image_size: tuple[int, int] | None = None
    """frame (height, width), multiples of 16: the demos' size unless given (an --init-from bundle fixes
    it: its training.json, or 256x256 for RLinf's)"""
    chunk: int | None = None
    """frames (and actions) per clip after the context (None: the backend's; OpenSora: the env's step,
    RLinf 8; Cosmos: 12, fixed by the DiT's action input)"""
    condition_frames: int | None = None
    """context frames before the chunk (None: the backend's; OpenSora: latents, RLinf 4, an --init-from
    model fixes it; Cosmos: 1 clean frame, fixed)"""
    hidden_size: int = 64
    """a fresh DiT's width (OpenSora XL/2: 1152; Cosmos 2B: 2048)"""
    depth: int = 2
    """a fresh DiT's blocks (OpenSora: spatial + temporal pairs, XL/2 28; Cosmos 2B: 28)"""
    num_heads: int = 2
    """a fresh DiT's attention heads (XL/2: 16; Cosmos 2B: 16)"""
    vae: str = "tiny"
    """a fresh model's frozen VAE: "tiny" (random, its latent scale calibrated on the demos; its decoded
    frames mean little unless vae_steps trains it), or OpenSora: a diffusers AutoencoderKL folder (e.g.
    the SDXL VAE), Cosmos: a Wan 2.1 tokenizer.pth"""
    vae_steps: int = 0
    """optimizer steps that train the "tiny" VAE on the training episodes' frames before the world model
    (reconstruction + vae_kl_weight * KL; OpenSora's image VAE on single frames, Cosmos's video VAE on
    5-frame clips), which then trains over it frozen; 0: keep it random, calibrated in scale only. Only a
    fresh "tiny" VAE trains: a pretrained --vae and an --init-from bundle's stay frozen"""
    vae_learning_rate: float = 1e-3
    """AdamW step size of the VAE stage"""
    vae_batch_size: int = 16
    """frames (OpenSora) or 5-frame clips (Cosmos) per VAE optimizer step"""
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
    # -- objective and optimization (RLinf/opensora's and Cosmos' published settings, see configs/)
    timestep_sampling: Literal["uniform", "logit-normal"] = "logit-normal"
    """OpenSora: how the noise level of each clip is drawn"""
    timestep_transform: bool = True
    """OpenSora: shift the drawn levels by the frame size (the identity at 256x256)"""
    sigma_shift: float = 5.0
    """Cosmos: training noise levels sigma = sigma_shift * exp(N(0, 1)) (a shifted logit-normal time;
    Predict2.5: 5, Predict2: 2)"""
    action_scaler: float = 20.0
    """Cosmos: the actions enter the DiT multiplied by this (the env's action_scaler, RLinf: 20)"""
    clip_stride: int = 1
    """Cosmos: train on the clips starting at every clip_stride-th frame of an episode (1: all; each clip
    is encoded and cached once, 16 x 4 x H/8 x W/8 floats: about 330 kB at 256x320)"""
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
    # -- several ranks (torchrun)
    data_parallel: Literal["ddp", "fsdp"] = "ddp"
    """under torchrun, each rank takes an equal share of every batch: "ddp" keeps the whole model on every
    rank, "fsdp" shards parameters, gradients, optimizer state and EMA (FSDP2, the DiT's blocks as units)
    for real sizes; one process: ignored"""
    activation_checkpointing: bool = False
    """recompute each DiT block's activations in backward (less memory, about a third more compute)"""
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
        condition, chunk = CLIP_DEFAULTS[self.backend]
        self.condition_frames = condition if self.condition_frames is None else self.condition_frames
        self.chunk = chunk if self.chunk is None else self.chunk
        if self.backend == "cosmos":
            self._check_cosmos(condition, chunk)
        positive = {"chunk": self.chunk, "condition_frames": self.condition_frames, "steps": self.steps,
                    "batch_size": self.batch_size, "hidden_size": self.hidden_size, "depth": self.depth,
                    "num_heads": self.num_heads, "eval_clips": self.eval_clips,
                    "log_every": self.log_every, "checkpoint_every": self.checkpoint_every,
                    "clip_stride": self.clip_stride}  # fmt: skip
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
        if self.data_parallel not in ("ddp", "fsdp"):
            raise BadInput(f"data_parallel: expected 'ddp' or 'fsdp', got {self.data_parallel!r}")
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

    def _check_cosmos(self, condition: int, chunk: int) -> None:
        if (self.condition_frames, self.chunk) != (condition, chunk):
            raise BadInput(
                f"--backend cosmos: the DiT takes {condition} condition frame and {chunk} actions per clip "
                f"(13 frames, 4 latents of the Wan VAE), got condition_frames {self.condition_frames}, "
                f"chunk {self.chunk} (leave them unset)"
            )
        if not (self.sigma_shift > 0 and self.action_scaler > 0):
            raise BadInput(
                f"sigma_shift and action_scaler must be > 0, got {self.sigma_shift}, {self.action_scaler}"
            )

    def lr_at(self, step: int) -> float:
        """The step size of optimizer step ``step`` (from 0): ``(step + 1) / (warmup_steps + 1)`` of
        learning_rate during the warm-up, then constant (the fork's ``LinearWarmupLR``)."""
        if step < self.warmup_steps:
            return self.learning_rate * (step + 1) / (self.warmup_steps + 1)
        return self.learning_rate
