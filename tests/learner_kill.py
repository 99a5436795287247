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
from trainers.actors.link import STOP

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


def flood_loop(spec, env, lagged, counters, send) -> None:
    """An actor loop that sends 64 KiB messages until told to stop: with a learner that reads none,
    its queue fills and the actor waits in ``send``."""
    while not counters[STOP]:
        send(b"x" * 65536)


FLOODED = """
import sys, time
from counting_env import ConstantPolicy
from learner_kill import flood_loop
from trainers.actors import EnvActor
from trainers.actors.process import ActorSpec
from trainers.run import RunConfig

actor = EnvActor(RunConfig(env="counting_env:SacCounting-v0", num_envs=1), flood_loop, "flood", queue_size=4)
policy = ConstantPolicy(actor.single_observation_space, actor.single_action_space)
actor.start(ActorSpec(policy=policy, seed=0, max_policy_lag=0), 0)
time.sleep(3)  # the queue (4 messages) and its pipe fill up; nothing reads them
print(actor.process.pid, flush=True)
time.sleep(600)
"""


def kill_flooded_learner() -> int:
    """Start a learner whose actor waits on a full queue, SIGKILL the learner, and return the actor's pid
    once it is gone (assert it goes within 30 s)."""
    learner = subprocess.Popen(
        [sys.executable, "-c", FLOODED], env=subprocess_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        actor = int(learner.stdout.readline())
        assert alive(actor), "the actor is not running"
        learner.send_signal(signal.SIGKILL)
        learner.wait(timeout=30)
    finally:
        learner.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and alive(actor):
        time.sleep(0.2)
    gone = not alive(actor)
    if not gone:
        os.kill(actor, signal.SIGKILL)  # leave no orphan behind a failed test
    assert gone, "the actor outlived its learner"
    return actor
