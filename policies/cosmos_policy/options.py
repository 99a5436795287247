"""``CosmosPolicyOptions``: the options of ``CosmosPolicy`` (``--policy cosmos_policy``), one
documented field per keyword of its constructor (see ``policies/options.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nets.errors import BadInput

from ..options import FineTuneRecipe
from . import sft


@dataclass(frozen=True)
class CosmosPolicyOptions:
    """What ``CosmosPolicy`` is built with besides its spaces."""

    model_path: str | Path
    """Checkpoint folder or hub id (``checkpoint.py`` lists the files)."""
    vae_path: str | Path | None = None
    """The Wan 2.1 ``tokenizer.pth`` when it is not in the folder."""
    image_size: int = 224
    """The model's input size (224 for the released checkpoints)."""
    num_steps: int = 5
    """Denoising steps (network calls) of the action pass (LIBERO evaluation: 5)."""
    noise_level: float = 0.5
    """RL exploration, the std of the stochastic step in units of the next sigma."""
    num_proposals: int = 1
    """Proposals N per deterministic call; > 1: best-of-N planning, N proposals from different noise
    scored as ``planning`` says, the highest value wins (deterministic calls only)."""
    planning: str = "parallel"
    """How planning scores a proposal: the value of its own pass (``"parallel"``) or, with
    ``"autoregressive"``, a world-model pass (``num_future_samples`` futures) and a value pass per
    future (``num_value_samples`` values), averaged."""
    num_future_samples: int = 3
    """Autoregressive planning: futures per proposal."""
    num_value_samples: int = 5
    """Autoregressive planning: values per future."""
    future_state_steps: int = 1
    """Autoregressive planning: denoising steps of the world-model pass."""
    value_steps: int = 1
    """Autoregressive planning: denoising steps of the value pass."""
    image_keys: Sequence[str] = ("wrist_image", "image")
    """(wrist, primary) observation keys."""
    proprio_key: str = "proprio"
    """The proprio observation key."""
    proprio_format: str = "libero_axis_angle"
    """``"libero_axis_angle"`` converts the proprio fields ``eef_pos`` (3), ``eef_axis_angle`` (3)
    and ``gripper_qpos`` (2), read by name from the proprio space's ``fields`` (LIBERO's env
    publishes them), to the model's 9-D (gripper 2, eef pos 3, quaternion 4); ``"raw"`` passes a 9-D
    proprio through."""
    flip_lr: bool = True
    """Mirror the images left-right (our LIBERO images are rotated 180 degrees; Cosmos Policy's are
    flipped vertically only)."""
    center_crop: float | None = 0.9
    """Area fraction kept before resizing (its evaluation: 0.9); None off."""
    use_critic: bool = True
    """The model's value frame as the critic (see the policy module's docstring); GRPO builds it off."""
    sft_noise: str = "auto"
    """Noise levels of the SFT loss (``sft.py``): ``"predict2"`` (the recipe's hybrid log-normal /
    uniform sigmas), ``"predict2.5"`` (a shifted logit-normal time) or ``"auto"``, the checkpoint's
    backbone's (Predict2.5 when the DiT has the Reason1 text projection)."""
    sft_split: Sequence[float] = sft.SPLIT
    """The SFT batch's (policy, world_model, value) fractions (the recipe's 50/25/25), normalized to
    sum 1."""
    sft_loss_weighting: str = "rf"
    """The SFT loss weight per noise level (``sft.py``): ``"rf"``, the rectified-flow weight
    ``(1 + sigma)^2 / sigma^2``, or ``"edm"``, ``(sigma^2 + 1) / sigma^2``."""
    norm_stats: dict[str, Any] | None = None
    """Dataset statistics (``actions_min/max``, ``proprio_min/max``, the model's 9-D proprio) used
    instead of the folder's file; ``trainers.bc`` computes them from the demos
    (``norm_stats_from_demos``) and the run's checkpoints carry them."""
    dtype: str = "auto"
    """``"auto"`` (bfloat16 with CUDA), ``"float32"`` or ``"bfloat16"``."""
    download: bool = False
    """Let a hub id ``owner/name@revision`` download (pinned) into the Hugging Face cache."""
    trust_pickle: bool = False
    """Unpickle the T5 ``.pkl``, the DiT ``.pt`` and ``tokenizer.pth`` fully (default: plain data
    only; anything else is refused with ``UnsafeFileError``)."""

    def __post_init__(self) -> None:
        if self.planning not in ("parallel", "autoregressive"):
            raise BadInput(f"planning must be 'parallel' or 'autoregressive', got {self.planning!r}")
        if self.proprio_format not in ("libero_axis_angle", "raw"):
            raise BadInput(
                f"proprio_format must be 'libero_axis_angle' or 'raw', got {self.proprio_format!r}"
            )
        if self.sft_noise not in ("auto", *sft.NOISE_KINDS):
            raise BadInput(f"sft_noise must be 'auto' or one of {sft.NOISE_KINDS}, got {self.sft_noise!r}")
        if self.sft_loss_weighting not in sft.WEIGHTINGS:
            raise BadInput(
                f"sft_loss_weighting must be one of {sft.WEIGHTINGS}, got {self.sft_loss_weighting!r}"
            )
        sft.check_split(self.sft_split)


# Cosmos Policy's LIBERO fine-tuning recipe: NVlabs/cosmos-policy ``cosmos_policy/config/experiment/
# cosmos_policy_experiment_configs.py`` (``cosmos_predict2_2b_480p_libero``), the optimizer defaults
# of its Predict2 base experiment (``_src/predict2/configs/common/defaults/optimizer.py``, weight decay
# 0.1 in the base run) and ``LIBERO.md``; Kim, Gu et al., "Cosmos Policy: Fine-Tuning Video Models for
# Visuomotor Control and Planning" (its table: LIBERO batch 1920, 40k steps, lr 1e-4, decay at 30k).
# AdamW (betas 0.9 / 0.99, eps 1e-8, weight decay 0.1) at 1e-4, the gradient norm clipped at 1.0 (the
# ``GradClip`` callback), ``LambdaLinearScheduler`` with ``warm_up_steps [1000, 0]``, ``f_start [1e-6,
# 0.06]``, ``f_max [1, 0.06]``, ``f_min [0.3, 0.06]``, ``cycle_lengths [30000, inf]``: linear warmup
# over 1000 steps, linear down to 0.3x at 30k, then 0.06x for ever; batch 30 per GPU x 8 GPUs x 8
# accumulation = 1920; no EMA; full fine-tuning with the denoising loss (``sft.py``). Its dataset
# augments the images (crops, rotations, colour jitter); trainers.bc's random shift is not that, and
# with it the frozen VAE would re-encode every frame of every sample at every step, so the recipe here
# trains without it on latents encoded once (``--image-shift 4`` turns the shift on).
COSMOS_RECIPE = FineTuneRecipe(
    source="Cosmos Policy cosmos_policy_experiment_configs.py cosmos_predict2_2b_480p_libero + LIBERO.md",
    learning_rate=1e-4,
    batch_size=1920,
    lr_schedule="linear",
    lr_warmup_steps=1000,
    lr_warmup_start=1e-6,
    lr_decay_steps=30_000,
    lr_decay_to=0.3,
    lr_after_decay=0.06,
    weight_decay=0.1,
    adam_betas=(0.9, 0.99),
    max_grad_norm=1.0,
    image_shift=0,
)
