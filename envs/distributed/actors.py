"""Deprecated: ``envs.distributed.actors`` is now ``envs.ray.actors`` (issue 34). Importing it warns
and hands back ``envs.ray.actors`` itself; it goes in the next release."""

import sys
import warnings

from envs.ray import actors as _new

warnings.warn(
    "envs.distributed.actors is deprecated, import envs.ray.actors instead "
    "(the old path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _new  # the very module: all its names, private ones too; patching it patches it
