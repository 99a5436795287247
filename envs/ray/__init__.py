"""Envs spread over a Ray cluster (optional extra ``ray``; Ray is imported only when one is built).

vec = gym.make_vec("Libero-Spatial-v0", num_envs=64, ray_actors=8, ray_options={"num_cpus": 8})
"""

from envs.ray.ray_env import RayVectorEnv

__all__ = ["RayVectorEnv"]
