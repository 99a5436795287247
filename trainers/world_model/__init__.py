"""Train a world model of the OpenSora backend (RLinf's action-conditioned STDiT3 with a frozen SDXL-style
VAE) on demonstrations, and write a bundle the world-model env loads (issue 49).

    python -m trainers.demos --env envs:Libero-Spatial-v0 --policy libero_expert --episodes 6 \\
        --env-kwargs '{"image_size": 64, "cameras": ["agentview"], "task_state": true,
                       "proprio": false, "chunk_size": null}' --out demos/spatial64.h5
    python -m trainers.world_model --config configs/world_model_opensora_tiny.json \\
        --demos demos/spatial64.h5 --out runs/wm-tiny/bundle
    python -c "import envs, gymnasium as gym; env = gym.make_vec('OpenSoraWM-LiberoSpatial-v0',
        num_envs=2, model_dir='runs/wm-tiny/bundle', image_size=(64, 64)); env.reset(seed=0)"

The parts: ``vae`` (``vae_steps`` > 0: a first stage that trains a fresh tiny VAE on the training episodes'
frames, then freezes it), ``data`` (clips of context frames, the action chunk and the target frames,
VAE-encoded once), ``objective`` (RLinf/opensora's rectified-flow loss and noise levels), ``model`` (the
networks: an ``--init-from`` bundle or a fresh STDiT3 of any size), ``train`` (the loop: progress,
TensorBoard, checkpoints, exact ``--resume``), ``bundle`` (the output folder). The networks are ``nets``' own
(``nets.opensora_*``): ``trainers`` never imports ``envs``. ``--resume RUN`` continues a run (its
``config.json`` is the base; ``--steps`` may extend it). Bad input (frame size, action dimension or chunk
that do not fit the model or the ``--init-from`` bundle, episodes shorter than context + one chunk, NaN
actions, an existing ``--out``) is refused before anything is trained.

A reward model for the bundle: ``python -m trainers.reward_model --frame-size '[64, 64]' --out RM ...``
trains one from simulator rollouts of the same env, then ``--reward-model RM/resnet_rm.pth``.
"""

from trainers.world_model.config import WorldModelConfig
from trainers.world_model.train import run

__all__ = ["WorldModelConfig", "run"]
