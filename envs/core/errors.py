"""The one error format for bad input: which env, what was expected, what came; and the checks of
constructor arguments that use it, so a bad value is refused where it is given, not at a later reset
or inside a worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nets.errors import BadInput


def bad_input(env_id: str, what: str, expected: Any, received: Any) -> BadInput:
    """A ``ValueError`` that names the env id, the expected value and the received one."""
    return BadInput(f"{env_id}: bad {what}: expected {expected}, received {received}")


class ClosedEnvError(RuntimeError):
    """Any use of an env after ``close()``."""


def closed_env(env_id: str, call: str) -> ClosedEnvError:
    return ClosedEnvError(f"{env_id}: {call}() on a closed env (close() was called): make a new env")


def describe(x: Any) -> str:
    """Short description of a value for error messages (shape and dtype for arrays)."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return f"array of shape {tuple(shape)} and dtype {dtype}"
    text = repr(x)
    return text if len(text) < 80 else text[:77] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_int(
    env_id: str,
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    none_ok: bool = False,
) -> int | None:
    """``value`` as an int (in [``low``, ``high``]; None passes when ``none_ok``), else a named BadInput."""
    if value is None and none_ok:
        return None
    if not _is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        expected = (
            "an int" + (f" >= {low}" if low is not None else "") + (f" <= {high}" if high is not None else "")
        )
        expected += " or None" if none_ok else ""
        raise bad_input(env_id, name, expected, describe(value))
    return int(value)


def check_float(
    env_id: str, name: str, value: Any, *, low: float | None = None, high: float | None = None
) -> float:
    """``value`` as a finite float within [low, high], else a named ValueError."""
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    ok = ok and bool(np.isfinite(value))
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    if not ok:
        bounds = f" in [{low}, {high}]" if low is not None and high is not None else ""
        raise bad_input(env_id, name, f"a finite number{bounds}", describe(value))
    return float(value)


def check_image_size(env_id: str, value: Any) -> tuple[int, int]:
    """An int (square) or (height, width) of positive ints, as (height, width)."""
    hw = (value, value) if _is_int(value) else value
    if not isinstance(hw, Sequence | np.ndarray) or len(hw) != 2 or not all(_is_int(v) and v > 0 for v in hw):
        raise bad_input(
            env_id, "image_size", "a positive int or (height, width) of positive ints", describe(value)
        )
    return int(hw[0]), int(hw[1])
