"""Observation and action spaces shared by every backend."""

from __future__ import annotations

import string

import numpy as np
from gymnasium import spaces

from nets.errors import BadInput

# Printable ASCII: what LIBERO and BEHAVIOR instructions use, and what Text spaces can sample.
INSTRUCTION_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "
MAX_INSTRUCTION_LENGTH = 512


class FieldBox(spaces.Box):
    """A 1-d ``Box`` whose entries are named fields ``((name, size), ...)``, in order.

    The layout travels with the space: a policy built from the observation space reads
    ``space.fields`` (e.g. the scripted expert unpacking ``task_state``) without importing the env.
    """

    def __init__(self, low: float, high: float, fields: tuple[tuple[str, int], ...], dtype=np.float32):
        self.fields = tuple((str(name), int(size)) for name, size in fields)
        if not self.fields or any(size < 1 for _, size in self.fields):
            raise BadInput(f"FieldBox: fields must be (name, size >= 1) pairs, got {fields!r}")
        super().__init__(low, high, (sum(size for _, size in self.fields),), dtype)

    def __repr__(self) -> str:
        return f"FieldBox({self.shape}, {self.dtype}, fields={[name for name, _ in self.fields]})"


def image_space(height: int, width: int) -> spaces.Box:
    """uint8 (H, W, 3) image."""
    return spaces.Box(0, 255, (height, width, 3), np.uint8)


def instruction_space() -> spaces.Text:
    return spaces.Text(max_length=MAX_INSTRUCTION_LENGTH, min_length=1, charset=INSTRUCTION_CHARSET)


def observation_space(
    *,
    image_size: tuple[int, int] | None,
    wrist: bool,
    proprio_dim: int,
    instruction: bool,
    proprio_bound: float = np.inf,
    proprio_fields: tuple[tuple[str, int], ...] | None = None,
) -> spaces.Dict:
    """The Dict observation space: ``image``, ``wrist_image``, ``proprio``, ``instruction``.

    ``proprio_bound`` is a loose symmetric bound on proprio values (a backend that knows its ranges
    gives one, so checkers need not warn about infinite bounds). ``proprio_fields`` names the
    proprio entries (a ``FieldBox``), so policies read them by name rather than by position.
    """
    parts: dict[str, spaces.Space] = {}
    if image_size is not None:
        parts["image"] = image_space(*image_size)
        if wrist:
            parts["wrist_image"] = image_space(*image_size)
    if proprio_dim and proprio_fields:
        parts["proprio"] = FieldBox(-proprio_bound, proprio_bound, proprio_fields)
        if parts["proprio"].shape != (proprio_dim,):
            raise BadInput(f"proprio_fields {proprio_fields} do not add up to proprio_dim {proprio_dim}")
    elif proprio_dim:
        parts["proprio"] = spaces.Box(-proprio_bound, proprio_bound, (proprio_dim,), np.float32)
    if instruction:
        parts["instruction"] = instruction_space()
    return spaces.Dict(parts)


def chunk_action_space(low: np.ndarray, high: np.ndarray, chunk_size: int | None) -> spaces.Box:
    """``(K, D)`` float32 Box for a chunk of K actions, or ``(D,)`` when ``chunk_size`` is None."""
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    if chunk_size is None:
        return spaces.Box(low, high, low.shape, np.float32)
    if chunk_size < 1:
        raise BadInput(f"chunk_size must be a positive int or None, got {chunk_size}")
    return spaces.Box(
        np.broadcast_to(low, (chunk_size, *low.shape)).copy(),
        np.broadcast_to(high, (chunk_size, *high.shape)).copy(),
        (chunk_size, *low.shape),
        np.float32,
    )
