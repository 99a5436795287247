"""The original OpenVLA (Kim et al., 2024; causal Llama, the D action tokens decoded one by one, one
action per step) as an ``ActionChunkPolicy``, on the Prismatic model and checkpoint loading of
``policies.openvla_oft``."""

from .policy import OpenVLAPolicy

__all__ = ["OpenVLAPolicy"]
