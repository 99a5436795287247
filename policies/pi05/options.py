"""``Pi05Options``: the options of ``Pi05Policy`` (``--policy pi05``), one documented field per
keyword of its constructor, ``FlowSampling``'s fields included (see ``policies/options.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nets.errors import BadInput

from ..flow import FlowSampling
from ..options import FineTuneRecipe

# the Gemma layers' projections LoRA adapts
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Pi05Options:
    """What ``Pi05Policy`` is built with besides its spaces. ``FlowSampling``'s fields are keywords
    too (``KEYWORD_GROUPS``), pi0.5's default ``num_steps`` being 10."""

    KEYWORD_GROUPS: ClassVar[dict[str, tuple[type, dict[str, Any]]]] = {
        "sampling": (FlowSampling, {"num_steps": 10})
    }

    model_path: str | Path
    """Checkpoint folder (``config.json``, ``model.safetensors`` or shards, ``norm_stats.json`` under
    ``assets/<asset_id>/``) or hub id (Hugging Face cache)."""
    asset_id: str | None = None
    """Which ``norm_stats.json`` (e.g. ``physical-intelligence/libero``); None: the only one."""
    norm_stats: dict[str, Any] | str | Path | None = None
    """Statistics to use instead of the folder's: ``norm_stats.json``'s content
    (``{"norm_stats": {"actions": {...}, "state": {...}}}``) or its path; what ``trainers.bc``
    computes from demonstrations and saves with its checkpoints. The state's may be absent when the
    policy does not read the state (no ``discrete_state_input``)."""
    tokenizer_path: str | Path | None = None
    """PaliGemma's sentencepiece model; default ``tokenizer.model`` or ``paligemma_tokenizer.model``
    in the checkpoint folder."""
    cameras: Sequence[str] = ("image", "wrist_image")
    """Observation keys of the images, in the model's order (openpi LIBERO: agentview as
    ``base_0_rgb``, wrist as ``left_wrist_0_rgb``; the masked third slot is omitted)."""
    state_key: str = "proprio"
    """Observation key of the robot state (quantile-normalized; used only with
    ``discrete_state_input``)."""
    discrete_state_input: bool | None = None
    """Put the 256-bin state in the prompt. None: the checkpoint's ``config.json`` value, else False
    (openpi's ``pi05_libero``; cosmos-rl runs the LIBERO checkpoint with True: check against
    reference outputs)."""
    max_token_len: int = 200
    """Prompt length (openpi pi0.5: 200)."""
    sampling: FlowSampling | Mapping[str, Any] | None = None
    """The RL sampler, as in ``FlowPolicy``: a ``FlowSampling`` (``num_steps`` N, here default 10 as
    openpi's inference, RLinf RL 3-5; ``noise_method``, ``noise_level``, ``joint_logprob``,
    ``ignore_last``, ``noise_std_range``; RLinf pi0.5: flow_sde, 0.5), a dict of some of its fields,
    or its fields as keywords of the policy."""
    use_critic: bool = True
    """Value head ``ValueHead(width, (1024, 512, 256), 1, relu)`` on the PaliGemma prefix output,
    averaged as ``value_vlm_mode`` says."""
    value_vlm_mode: str = "mean_token"
    """The value head's input: the prefix output averaged over real tokens (``"mean_token"``) or the
    last one (``"last_token"``), RLinf's ``value_after_vlm``."""
    train_expert_only: bool = False
    """Freeze PaliGemma (SigLIP + Gemma 2B); train the action expert and heads."""
    lora_rank: int = 0
    """> 0 trains LoRA adapters (peft; alpha = rank) on the Gemma layers' ``lora_targets`` (of the
    expert only with ``train_expert_only``) instead of their weights; the action / time projections
    and heads stay fully trained."""
    lora_targets: Sequence[str] = LORA_TARGETS
    """The Gemma layers' modules LoRA adapts (see ``lora_rank``). A name the model lacks is an error."""
    dtype: str = "auto"
    """``"auto"`` (bfloat16 with CUDA, else float32), ``"float32"`` or ``"bfloat16"``."""
    download: bool = False
    """Let a hub id download into the Hugging Face cache."""

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, FlowSampling):  # built directly, not by build_options
            group, defaults = self.KEYWORD_GROUPS["sampling"]
            object.__setattr__(self, "sampling", group.from_options(self.sampling, {}, **defaults))
        if self.value_vlm_mode not in ("mean_token", "last_token"):
            raise BadInput(
                f"value_vlm_mode must be 'mean_token' or 'last_token', got {self.value_vlm_mode!r}"
            )


# pi0.5's LIBERO fine-tuning recipe: openpi ``src/openpi/training/config.py``, ``TrainConfig(name=
# "pi05_libero")`` with ``training/optimizer.py``'s defaults (Physical Intelligence, "pi0.5: a
# Vision-Language-Action Model with Open-World Generalization", arXiv:2504.16054): batch 256, AdamW
# (b1 0.9, b2 0.95, eps 1e-8, weight decay 1e-10) after clipping the global gradient norm at 1.0,
# ``CosineDecaySchedule(warmup_steps=10_000, peak_lr=5e-5, decay_steps=1_000_000, decay_lr=5e-5)``
# (so a warmup, then constant), an EMA of the weights with decay 0.999, 30k steps; every weight trained
# (no LoRA, no freeze filter); the flow-matching loss.
PI05_RECIPE = FineTuneRecipe(
    source="openpi src/openpi/training/config.py pi05_libero + training/optimizer.py (arXiv:2504.16054)",
    learning_rate=5e-5,
    batch_size=256,
    lr_schedule="cosine",
    lr_warmup_steps=10_000,
    lr_decay_steps=1_000_000,
    lr_decay_to=1.0,
    weight_decay=1e-10,
    adam_betas=(0.9, 0.95),
    max_grad_norm=1.0,
    ema_decay=0.999,
)
