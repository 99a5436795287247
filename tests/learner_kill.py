"""For the async actor-learner tests: start a training command in a subprocess, SIGKILL its learner
once the run folder holds two checkpoints, and check that its actor processes die with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainers import checkpoint as ckpt

TESTS = Path(__file__).parent


def subprocess_env() -> dict[str, str]:
    """The environment for a subprocess that imports this folder's modules (``sac_envs``)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_learner_midway(argv: list[str], run: Path) -> None:
    """Run ``python -m trainers *argv`` (writing ``run``), SIGKILL it after its second checkpoint,
    assert its child processes (the actor) are gone within 30 s, and free the run's lock."""
    learner = subprocess.Popen([sys.executable, "-m", "trainers", *argv], env=subprocess_env())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(ckpt.checkpoint_paths(run)) < 2:
            assert learner.poll() is None, "the run ended before it was killed"
            time.sleep(0.2)
        actors = children(learner.pid)
        assert actors, "no actor process"
        learner.send_signal(signal.SIGKILL)
        learner.wait(timeout=30)
    finally:
        learner.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(p) for p in actors):
        time.sleep(0.2)
    assert not any(alive(p) for p in actors), "the actor outlived its learner"
    (run / ".lock").unlink(missing_ok=True)  # the killed process could not release it
