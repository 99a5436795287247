"""OpenVLA-OFT (token actions, parallel decoding): the Prismatic model built on transformers' Llama,
loading OpenVLA's Hugging Face checkpoint folders, as an ``ActionChunkPolicy``."""

from .config import OpenVLAConfig, action_stats
from .modeling import OpenVLAModel
from .policy import OpenVLAOFTPolicy

__all__ = ["OpenVLAConfig", "OpenVLAModel", "OpenVLAOFTPolicy", "action_stats"]
