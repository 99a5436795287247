"""Cosmos-Predict2/2.5 action-conditioned world model (RLinf's Cosmos backend).

A 2B video DiT in the original checkpoint layout (``dit``), the Wan 2.1 VAE hosted by diffusers
(``vae``), the rectified-flow "2AB" sampler (``sampler``) and the ``WorldModel`` that ties them
together (``model``). ``tiny`` builds small random checkpoints in the real on-disk formats for tests.
Import the submodules directly; this package file stays cheap (no torch import).
"""
