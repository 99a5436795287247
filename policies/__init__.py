"""Action-chunk policies: the contract (``base``), observation torsos, and the small policies that
share the exact sampling / log-prob math of the VLAs (Gaussian, categorical, OpenVLA-style binned,
pi0-style flow matching). The VLAs themselves live in ``policies.openvla`` (the original OpenVLA:
causal, action tokens decoded one by one), ``policies.openvla_oft``, ``policies.pi05`` and
``policies.cosmos_policy`` (imported on demand: they need transformers, the ``vla`` extra)."""

from .base import ActionChunk, ActionChunkPolicy, PolicyEval
from .binned import BinnedPolicy
from .categorical import CategoricalPolicy
from .flow import FlowPolicy
from .gaussian import GaussianPolicy
from .torso_policy import TorsoPolicy
from .torsos import ImageEncoder, InstructionEmbedding, Torso, make_torso

__all__ = [
    "ActionChunk",
    "ActionChunkPolicy",
    "BinnedPolicy",
    "CategoricalPolicy",
    "FlowPolicy",
    "GaussianPolicy",
    "ImageEncoder",
    "InstructionEmbedding",
    "PolicyEval",
    "Torso",
    "TorsoPolicy",
    "make_torso",
]
