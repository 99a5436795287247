"""The one error format for bad input: which env, what was expected, what came."""

from __future__ import annotations

from typing import Any


def bad_input(env_id: str, what: str, expected: Any, received: Any) -> ValueError:
    """A ``ValueError`` that names the env id, the expected value and the received one."""
    return ValueError(f"{env_id}: bad {what}: expected {expected}, received {received}")


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
