"""Cosmos-Predict2/2.5 action-conditioned world model (RLinf's Cosmos backend).

The networks and the sampler live in ``nets`` (shared with the Cosmos Policy): the 2B video DiT in
the original checkpoint layout (``nets.cosmos_dit``, loaded by ``nets.cosmos_checkpoint``), the Wan
2.1 VAE (``nets.wan_vae``), the rectified-flow "2AB" sampler (``nets.cosmos_sampler``) and tiny
random checkpoints (``nets.cosmos_tiny``). Here: the ``WorldModel`` that ties them together
(``model``) and the env (``env``). Import the submodules directly; this file stays cheap.
"""
