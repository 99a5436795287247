"""Shared fixtures. LIBERO tests need the `libero` extra (scripts/setup.sh installs it)."""

from __future__ import annotations

import importlib.util

import pytest

HAS_LIBERO = (
    importlib.util.find_spec("libero") is not None and importlib.util.find_spec("robosuite") is not None
)
requires_libero = pytest.mark.skipif(not HAS_LIBERO, reason="LIBERO is not installed (bash scripts/setup.sh)")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: one intra-op thread avoids OpenMP spin-waits when the 2 cores are shared.
    Use per module: ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
