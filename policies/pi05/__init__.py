"""pi0.5 (PaliGemma + Gemma action expert with adaRMS time input), built on transformers modules,
loading openpi / lerobot PyTorch checkpoints, as a flow-matching ``ActionChunkPolicy`` with RL samplers."""

from .config import Pi05Config
from .modeling import Pi05Model
from .policy import Pi05Policy
from .processor import Pi05Processor

__all__ = ["Pi05Config", "Pi05Model", "Pi05Policy", "Pi05Processor"]
