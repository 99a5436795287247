"""Train a world model on demonstrations and write a bundle the world-model env loads (issue 49):
``--backend opensora`` (RLinf's action-conditioned STDiT3 with a frozen SDXL-style VAE) or
``--backend cosmos`` (action-conditioned post-training of the Cosmos Predict 2.5 DiT over its frozen
Wan 2.1 VAE).

    python -m trainers.demos --env envs:Libero-Spatial-v0 --policy libero_expert --episodes 6 \\
        --env-kwargs '{"image_size": 64, "cameras": ["agentview"], "task_state": true,
                       "proprio": false, "chunk_size": null}' --out demos/spatial64.h5
    python -m trainers.world_model --config configs/world_model_opensora_tiny.json \\
        --demos demos/spatial64.h5 --out runs/wm-tiny/bundle
    python -c "import envs, gymnasium as gym; env = gym.make_vec('OpenSoraWM-LiberoSpatial-v0',
        num_envs=2, model_dir='runs/wm-tiny/bundle', image_size=(64, 64)); env.reset(seed=0)"
    python -m trainers.world_model --config configs/world_model_cosmos_tiny.json \\
        --demos demos/spatial64.h5 --out runs/wm-cosmos/bundle    # then CosmosWM-LiberoSpatial-v0

The parts: ``train`` (the loop: progress, TensorBoard, checkpoints, exact ``--resume``), ``data_parallel``
(``torchrun``: each rank an equal share of every batch, DDP or FSDP2 with ``--data-parallel fsdp``; rank 0
writes; checkpoints in the one-process layout, so a run resumes on any number of ranks) and ``backends``
(the seam: each backend's networks, clips, objective and bundle). OpenSora: ``vae`` (``vae_steps`` > 0: a
first stage that trains a fresh tiny VAE on the training episodes' frames, then freezes it), ``data``
(clips of context frames, the action chunk and the target frames, VAE-encoded once), ``objective``
(RLinf/opensora's rectified-flow loss and noise levels), ``model`` (an ``--init-from`` bundle or a fresh
STDiT3 of any size), ``bundle``. Cosmos: ``cosmos_data`` (clips of 13 frames and the 12 actions between
them, each encoded once into 4 latents), ``cosmos_objective`` (rectified flow in EDM sigmas through the
sampler's own denoiser, 1 clean condition latent, sigma = 5 exp(N(0, 1)), actions times 20, zero text),
``cosmos_model`` (an ``--init-from`` Cosmos bundle or a fresh CosmosDiT of any size over a tiny random
Wan VAE), ``cosmos_bundle`` (the public bundle's layout). The networks are ``nets``' own: ``trainers``
never imports ``envs``. ``--resume RUN`` continues a run (its ``config.json`` is the base; ``--steps`` may
extend it). Bad input (frame size, action dimension or chunk that do not fit the model or the
``--init-from`` bundle, episodes shorter than context + one chunk, NaN actions, an existing ``--out``) is
refused before anything is trained.

A reward model for the bundle: ``python -m trainers.reward_model --frame-size '[64, 64]' --out RM ...``
trains one from simulator rollouts of the same env, then ``--reward-model RM/resnet_rm.pth``.
"""

from trainers.world_model.config import WorldModelConfig
from trainers.world_model.train import run

__all__ = ["WorldModelConfig", "run"]
