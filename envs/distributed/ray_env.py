"""Deprecated: ``envs.distributed.ray_env`` is now ``envs.ray.ray_env`` (issue 34). Importing it warns
and hands back ``envs.ray.ray_env`` itself; it goes in the next release."""

import sys
import warnings

from envs.ray import ray_env as _new

warnings.warn(
    "envs.distributed.ray_env is deprecated, import envs.ray.ray_env instead "
    "(the old path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _new  # the very module: all its names, private ones too; patching it patches it
