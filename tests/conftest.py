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


# The files that start Ray clusters (one on a fixed port) run one after the other in one worker of
# ``pytest -n 2 --dist loadgroup`` (README's test command); every other file stays whole in one
# worker, so its module-scoped envs are built once.
_RAY_FILES = {"test_ray_env.py", "test_benchmarks.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("ray" if name in _RAY_FILES else name))
