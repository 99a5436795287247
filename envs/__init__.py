"""vla-gym environments. Importing this package registers every env id with gymnasium.

import gymnasium as gym
import envs

vec = gym.make_vec("Libero-Spatial-v0", num_envs=4)   # native chunked vector env
env = gym.make("Libero-Spatial-v0")                    # one-env view (a gymnasium.Env)
"""

from envs.core import ChunkedVectorEnv, ChunkResult, InitialFrame, load_initial_frames, save_initial_frames
from envs.libero import register as _register_libero

_register_libero()

__all__ = ["ChunkResult", "ChunkedVectorEnv", "InitialFrame", "load_initial_frames", "save_initial_frames"]
