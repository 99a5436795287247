"""Deprecated alias of ``envs.ray`` (issue 34: envs on Ray actors live in ``envs/ray/``). Importing it
(or its modules ``actors``, ``ray_env``, ``ray_gym``, each an alias of the module of that name in
``envs.ray``) warns; it goes in the next release."""

import warnings

from envs.ray import RayVectorEnv

warnings.warn(
    "envs.distributed is deprecated, import envs.ray instead (the old path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["RayVectorEnv"]
