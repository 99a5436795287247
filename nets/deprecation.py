"""Old import paths kept for one release after a rename (issue 34: ``envs.distributed`` ->
``envs.ray``, ``trainers.distributed`` -> ``trainers.parallel``)."""

from __future__ import annotations

import importlib
import sys
import warnings


def moved_module(old: str, new: str) -> None:
    """Make module ``old`` the module ``new`` itself (every name, private ones too: patching one
    patches the other) and warn the code that imports ``old``. Call it from ``old``'s body."""
    warnings.warn(
        f"{old} is deprecated, import {new} instead (the old path goes in the next release)",
        DeprecationWarning,
        stacklevel=3,  # past this function and the old module's body: the importing line
    )
    sys.modules[old] = importlib.import_module(new)
