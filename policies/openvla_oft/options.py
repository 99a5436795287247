"""``OpenVLAOFTOptions``: the options of ``OpenVLAOFTPolicy`` (``--policy openvla_oft``), one
documented field per keyword of its constructor (see ``policies/options.py``), the fields it shares
with the original OpenVLA (``policies/openvla/options.py``) in ``OpenVLACommonOptions``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nets.errors import BadInput

from ..options import FineTuneRecipe


@dataclass(frozen=True)
class OpenVLACommonOptions:
    """What both OpenVLA policies (``OpenVLABase``) are built with besides their spaces."""

    model_path: str | Path
    """Checkpoint folder or hub id (Hugging Face cache) in OpenVLA's layout: ``config.json``,
    safetensors, tokenizer files, optionally ``dataset_statistics.json``."""
    unnorm_key: str | None = None
    """Which dataset's action statistics (e.g. ``libero_spatial_no_noops``); None when the checkpoint
    has one."""
    norm_stats: dict[str, Any] | str | Path | None = None
    """Statistics to add to the checkpoint's (same keys win), in ``dataset_statistics.json``'s layout
    ``{key: {"action": {"q01", "q99", "mask", ...}, ...}}``, or the path of such a file: what
    ``trainers.bc`` computes from demonstrations and saves with its checkpoints."""
    temperature: float | None = None
    """Sampling temperature, kept per sample in the replay; greedy acting ignores it. None: the policy's
    default (OpenVLA-OFT: 1.6 with tokens, as SimpleVLA-RL / RLinf LIBERO GRPO, 1.0 with the L1 head;
    OpenVLA: 1.0)."""
    top_k: int = 0
    """Sampling top-k (SimpleVLA-RL / RLinf LIBERO GRPO: 0, off), kept per sample in the replay."""
    image_keys: Sequence[str] = ("image",)
    """Observation images fed as the model's images, in order (OFT-token LIBERO: the third-person
    view only)."""
    center_crop: float | None = None
    """Crop this fraction of the image area before resizing (RLinf LIBERO: 0.9); None off."""
    gripper: str | None = "libero"
    """``"libero"`` maps the last dim with ``-sign(2 g - 1)`` (-1 open, +1 close); None leaves
    actions as un-normalized."""
    max_prompt_tokens: int = 64
    """Fixed prompt length (padding), so replays from different calls stack."""
    use_critic: bool = True
    """RLinf's value head on the last prompt token's hidden state (OpenVLA-OFT: per ``value_type``;
    OpenVLA: one value per step); GRPO builds the policy without it."""
    lora_rank: int = 0
    """> 0 trains LoRA adapters (peft; alpha = rank, Gaussian init) instead of the weights (the L1
    action head and the value head stay fully trained)."""
    lora_targets: Sequence[str] | None = None
    """Module names (or suffixes) LoRA adapts; None: RLinf's list (``LORA_LANGUAGE``, plus
    ``LORA_VISION`` unless ``freeze_vision``). A name the model lacks is an error."""
    freeze_vision: bool = False
    """Keep the vision towers fixed (and without LoRA)."""
    dtype: str = "auto"
    """Weights' dtype: ``"auto"`` (bfloat16 when CUDA is available, else float32), ``"float32"`` or
    ``"bfloat16"``. Log-probs are always computed in float32."""
    download: bool = False
    """Let a hub id download into the Hugging Face cache (default: cache only)."""

    def __post_init__(self) -> None:
        if self.gripper not in ("libero", None):
            raise BadInput(f"gripper must be 'libero' or None, got {self.gripper!r}")
        if self.temperature is not None and self.temperature <= 0:
            raise BadInput(f"temperature must be > 0, got {self.temperature}")


@dataclass(frozen=True)
class OpenVLAOFTOptions(OpenVLACommonOptions):
    """What ``OpenVLAOFTPolicy`` is built with besides its spaces: the common options and its heads'."""

    action_head: str = "tokens"
    """``"tokens"`` (the LM head's 256 action bins) or ``"l1"`` (OpenVLA-OFT's continuous
    L1-regression head on the action positions' hidden states)."""
    new_action_head: bool = False
    """With ``"l1"``, start a freshly initialised head when the folder has no
    ``action_head--<step>_checkpoint.pt`` (fine-tuning a model that has none); without it a missing
    head file is an error."""
    l1_scale: float = 0.05
    """With ``"l1"``, the Laplace scale of sampled actions in the normalised [-1, 1] space, times
    ``temperature`` (deterministic acting uses the head's output)."""
    use_proprio: bool = False
    """Read ``obs["proprio"]`` as OpenVLA-OFT does: normalised with the statistics' ``proprio``
    q01/q99, projected by the folder's ``proprio_projector--<step>_checkpoint.pt`` to one token after
    the image patches (``proprio.py``)."""
    new_proprio_projector: bool = False
    """With ``use_proprio``, start a freshly initialised projector when the folder has none
    (fine-tuning with the state a model trained without it); without it a missing file is an error."""
    value_type: str = "chunk"
    """The value head's outputs: one value per chunk (``"chunk"``) or per step (``"step"``)."""
    append_stop: bool = True
    """End the sequence with the STOP token ``</s>`` as OpenVLA-OFT and SimpleVLA-RL do (False: as
    RLinf, which drops it; with bidirectional attention the two differ)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.action_head not in ("tokens", "l1"):
            raise BadInput(f"action_head must be 'tokens' or 'l1', got {self.action_head!r}")
        if not self.l1_scale > 0:
            raise BadInput(f"l1_scale must be > 0, got {self.l1_scale}")
        if self.value_type not in ("chunk", "step"):
            raise BadInput(f"value_type must be 'chunk' or 'step', got {self.value_type!r}")


# OpenVLA-OFT's LIBERO fine-tuning recipe: moojink/openvla-oft ``vla-scripts/finetune.py`` (its
# defaults) and ``LIBERO.md`` (the paper's command); Kim, Finn & Liang, "Fine-Tuning Vision-Language-
# Action Models: Optimizing Speed and Success" (arXiv:2502.19645). ``torch.optim.AdamW(lr=5e-4)``, so
# torch's defaults (betas 0.9 / 0.999, eps 1e-8, weight decay 0.01); no gradient clipping; no warmup
# (``lr_warmup_steps`` 0, from 10% when set); ``MultiStepLR`` 10x down after ``num_steps_before_decay``
# 100k (150k steps in all); batch 8 per GPU on 8 GPUs (64); LoRA rank 32 on every linear layer
# (``use_lora``, dropout 0; its alpha is min(rank, 16), ours is the rank: ``lora_rank``); the L1
# regression action head (``use_l1_regression``, a new head on the base model); the LIBERO command's
# ``--use_proprio True`` (a new proprio projector; its ``--num_images_in_input 2``, the wrist camera, is
# ``image_keys``, left to the user since the demos must have it).
OFT_RECIPE = FineTuneRecipe(
    source="OpenVLA-OFT vla-scripts/finetune.py + LIBERO.md (arXiv:2502.19645)",
    learning_rate=5e-4,
    batch_size=64,
    lr_schedule="step",
    lr_warmup_steps=0,
    lr_decay_steps=100_000,
    lr_decay_to=0.1,
    weight_decay=0.01,
    adam_betas=(0.9, 0.999),
    max_grad_norm=0.0,
    policy_kwargs={
        "action_head": "l1",
        "new_action_head": True,
        "lora_rank": 32,
        "use_proprio": True,
        "new_proprio_projector": True,
    },
)
