"""Train a world-model env's reward model (the ResNet-18 success classifier) from simulator rollouts.

The frames are labelled with the simulator's own success signal, so any task a simulator can check
gets a reward model for the world model that imagines it.

    python -m trainers.reward_model --out runs/rm-spatial --width 16 --steps 1500 \\
        --policy libero_expert,episodes=36 --policy libero_expert,noise=0.3,episodes=24

collects labelled frames from ``--env`` (default LIBERO-Spatial, camera at the world model's frame
size) with a mix of policies (``collect``), trains the classifier on whole episodes and measures it
on held-out ones (``train``), and writes ``<out>/resnet_rm.pth`` (the file the world-model envs
load: ``gym.make("CosmosWM-LiberoSpatial-v0", reward_model="<out>/resnet_rm.pth")``),
``report.json`` / ``report.md`` (precision, recall, F1, confusion table, episode agreement), the
frames (``frames.h5``, reusable with ``--frames``) and TensorBoard logs (``tb/``).
"""

from trainers.reward_model.collect import FrameSet, PolicySpec, parse_policy_spec, read_frames
from trainers.reward_model.train import RewardModelConfig, run

__all__ = ["FrameSet", "PolicySpec", "RewardModelConfig", "parse_policy_spec", "read_frames", "run"]
