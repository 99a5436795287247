"""Shared fixtures. LIBERO tests need the `libero` extra (scripts/setup.sh installs it)."""

from __future__ import annotations

import importlib.util
import os

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
# ``pytest -n 2`` (addopts in pyproject.toml); every other file stays whole in one worker, so its
# module-scoped envs and recordings are built once.
_RAY_FILES = {"test_ray_env.py", "test_benchmarks.py"}


def pytest_configure(config):
    """With several test processes (``-n``), each runs its numerical libraries on one thread (set
    before any test module imports torch or numpy; the processes they start inherit it): on 2 cores,
    two processes of two threads each spend much of their time in OpenMP's spin-waits."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(name, "1")


@pytest.hookimpl(optionalhook=True)  # absent when xdist is off (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduler with one work unit per test file, and one for all the Ray files (see
    ``_RAY_FILES``). Done here because ``--dist loadgroup`` reads its groups from test ids that
    pytest 9 no longer lets a plugin rename: with it, the tests of one file were spread over the
    workers, each building the file's module fixtures again (and Ray files overlapped)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if os.path.basename(path) in _RAY_FILES else path

    return FileScheduling(config, log)
