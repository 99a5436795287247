"""Cosmos Policy: a Cosmos-Predict2 video DiT that writes proprio, action chunks and values into
latent frames, as an ``ActionChunkPolicy`` (direct policy, best-of-N planning, RL through a
stochastic denoising step). The DiT, VAE and sampler are ``nets``', shared with the Cosmos world model."""

from .policy import CosmosPolicy

__all__ = ["CosmosPolicy"]
