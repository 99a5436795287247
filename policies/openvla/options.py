"""``OpenVLAOptions``: the options of ``OpenVLAPolicy`` (``--policy openvla``): OpenVLA-OFT's common
ones (``OpenVLACommonOptions``) and the decoding's KV cache (see ``policies/options.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..openvla_oft.options import OpenVLACommonOptions
from ..options import FineTuneRecipe


@dataclass(frozen=True)
class OpenVLAOptions(OpenVLACommonOptions):
    """What ``OpenVLAPolicy`` is built with besides its spaces."""

    use_cache: bool = True
    """Decode the action tokens with a KV cache (False: re-run the whole sequence for each token; the
    same tokens and log-probs, slower)."""


# The original OpenVLA's fine-tuning recipe: openvla/openvla ``vla-scripts/finetune.py`` (Kim et al.,
# "OpenVLA: An Open-Source Vision-Language-Action Model", arXiv:2406.09246): ``AdamW(lr=5e-4)`` with
# torch's defaults (weight decay 0.01), a constant step size, no gradient clipping, batch 16, LoRA rank
# 32 (dropout 0), the next-token cross-entropy over the action tokens.
OPENVLA_RECIPE = FineTuneRecipe(
    source="OpenVLA vla-scripts/finetune.py (arXiv:2406.09246)",
    learning_rate=5e-4,
    batch_size=16,
    weight_decay=0.01,
    max_grad_norm=0.0,
    policy_kwargs={"lora_rank": 32},
)
