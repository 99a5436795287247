"""OpenSora backend: RLinf's action-conditioned STDiT3-XL/2 video DiT with the SDXL image VAE.

The networks, the sampler, the checkpoint loader and the tiny random checkpoints live in ``nets``
(``nets.opensora_stdit3``, ``opensora_vae``, ``opensora_sampler``, ``opensora_checkpoint``,
``opensora_tiny``), shared with ``trainers.world_model``, which trains them. Here: the ``WorldModel`` that
ties them together (``model``) and the env (``env``). The submodules import torch and diffusers, so import
them explicitly; this package itself stays cheap.
"""
