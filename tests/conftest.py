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
# ``pytest -n 3`` (addopts in pyproject.toml: three processes on 2 cores fill the time the Ray and
# worker-fault tests spend waiting); every other file stays whole in one worker, so its module-scoped
# envs and recordings are built once.
_RAY_FILES = {"test_ray_env.py", "test_scale_out.py"}


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


# The VLA tests' LIBERO recording: task 0 of LIBERO-Spatial, one action per step, both cameras at 64 px.
LIBERO_CAMERA_RECORDING = {"task_state": True, "image_size": 64, "chunk_size": None,
                           "cameras": ["agentview", "wrist"], "task_ids": [0]}  # fmt: skip


@pytest.fixture(scope="session")
def libero_camera_demos(tmp_path_factory):
    """4 scripted-expert episodes recorded with ``LIBERO_CAMERA_RECORDING`` (2 envs, seed 0: episodes
    0-1 are what a 2-episode recording holds), once per test run: the xdist workers share the run's
    folder and take turns through a file lock, so the second reads what the first recorded."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, shared by its workers
    path = root / "libero_camera_demos.h5"
    with FileLock(f"{path}.lock"):
        if not path.is_file():  # trainers.demos writes the file whole or not at all
            import json

            from trainers.demos import main as demos_main

            demos_main(
                ["--env", "envs:Libero-Spatial-v0", "--policy", "libero_expert", "--env-kwargs",
                 json.dumps(LIBERO_CAMERA_RECORDING), "--episodes", "4", "--num-envs", "2",
                 "--out", str(path)]
            )  # fmt: skip
    return path


@pytest.fixture
def no_world_model_training(monkeypatch):
    """``python -m trainers.world_model``: any BadInput must come before the run folder is claimed
    (nothing trained, nothing written)."""
    import trainers.world_model.train as train_module

    def refuse(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr(train_module.run_folder, "claim", refuse)
