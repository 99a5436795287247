"""OpenSora backend: RLinf's action-conditioned STDiT3-XL/2 video DiT with the SDXL image VAE.

The submodules import torch and diffusers, so import them explicitly (``opensora.model``,
``opensora.stdit3``, ...); this package itself stays cheap.
"""
