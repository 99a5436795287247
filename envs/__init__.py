"""vla-gym environments. Importing this package registers every env id with gymnasium.

import gymnasium as gym
import envs

vec = gym.make_vec("Libero-Spatial-v0", num_envs=4)   # native chunked vector env
env = gym.make("Libero-Spatial-v0")                    # one-env view (a gymnasium.Env)
wm = gym.make_vec("CosmosWM-LiberoSpatial-v0", num_envs=16, model_dir="/data/cosmos")  # world model
b1k = gym.make_vec("B1K-TurningOnRadio-v0", num_envs=2)  # needs OmniGibson + an RTX GPU
ray = gym.make_vec("Libero-Spatial-v0", num_envs=64, ray_actors=8)  # envs on Ray actors (extra "ray")
cart = gym.make_vec("Ray-v0", num_envs=64, env="CartPole-v1", ray_actors=4)  # any id on Ray actors
"""

from envs.b1k import register as _register_b1k
from envs.core import (
    ChunkedVectorEnv,
    ChunkResult,
    ClosedEnvError,
    InitialFrame,
    load_initial_frames,
    save_initial_frames,
)
from envs.libero import register as _register_libero
from envs.ray.ray_gym import register as _register_ray
from envs.world_models import register as _register_world_models

_register_libero()
_register_world_models()
_register_b1k()
_register_ray()  # "Ray-v0": any gymnasium id's envs on Ray actors

__all__ = [
    "ChunkResult",
    "ChunkedVectorEnv",
    "ClosedEnvError",
    "InitialFrame",
    "load_initial_frames",
    "save_initial_frames",
]
