"""Deprecated: ``envs.distributed.ray_gym`` is now ``envs.ray.ray_gym`` (issue 34; the old path goes
next release)."""

from nets.deprecation import moved_module

moved_module(__name__, "envs.ray.ray_gym")
