"""Shared fixtures. LIBERO tests need the `libero` extra (scripts/setup.sh installs it)."""

from __future__ import annotations

import importlib.util

import pytest

HAS_LIBERO = (
    importlib.util.find_spec("libero") is not None and importlib.util.find_spec("robosuite") is not None
)
requires_libero = pytest.mark.skipif(not HAS_LIBERO, reason="LIBERO is not installed (bash scripts/setup.sh)")
