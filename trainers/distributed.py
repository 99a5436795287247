"""Deprecated: ``trainers.distributed`` is now ``trainers.parallel`` (issue 34). Importing it warns
and hands back ``trainers.parallel`` itself; it goes in the next release."""

import sys
import warnings

from trainers import parallel as _new

warnings.warn(
    "trainers.distributed is deprecated, import trainers.parallel instead "
    "(the old path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _new  # the very module: all its names, private ones too; patching it patches it
