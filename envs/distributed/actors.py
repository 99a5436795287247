"""Deprecated: ``envs.distributed.actors`` is now ``envs.ray.actors`` (issue 34; the old path goes
next release)."""

from nets.deprecation import moved_module

moved_module(__name__, "envs.ray.actors")
