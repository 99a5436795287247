"""Fresh LIBERO init states: ids beyond a task's official ones, drawn by LIBERO's own placement sampler.

An init-state id ``k >= task.num_init_states`` (50 for LIBERO's suites) is the simulator state right
after LIBERO's scene reset with numpy's RNG seeded by ``fresh_seed(task, k)``, a hash of (suite, task
name, k): the objects placed in their BDDL regions by LIBERO's samplers (retried as LIBERO retries a
failed placement), the robot at its start with robosuite's default joint noise (Gaussian, 0.02 rad per
arm joint: the official states have it, std 0.018-0.024 per joint, while LIBERO's ``ControlEnv``,
which our scenes use, turns it off; robosuite draws the noise either way, so no other draw moves). The
state is taken right after the reset, unsettled, as the official states are (zero velocities, objects
where the samplers put them, up to ~8 cm above their supports); the env then settles it as it
settles an official state. Objects on fixture sites (a bowl on the stove or the cabinet, in its
drawer) need the fixtures at their compiled pose when the reset starts, which the scene's soft reset
restores (``envs/libero/sim.py``).
The same id gives the same bits in any process (the generation runs in a fresh spawned process, so no
state of the caller's reaches it); they export and import as initial-frame folders like the official
ones (``save_initial_frames``). This gives held-out starts from the training distribution without
limit: e.g. ``init_states=range(50, 250)``.
"""

from __future__ import annotations

import hashlib
import multiprocessing
from collections.abc import Sequence

import numpy as np

from envs.libero.suites import LiberoTask
from nets.errors import BadInput
from nets.processes import without_main_module

MAX_FRESH_ID = 2**31 - 1
ARM_INIT_NOISE = 0.02  # rad, std of the start joint angles (robosuite's initialization_noise="default")


def fresh_seed(task: LiberoTask, index: int) -> int:
    """The RNG seed of fresh init state ``index`` of ``task``: fixed by (suite, task name, index)."""
    digest = hashlib.sha256(f"{task.suite}/{task.name}/{int(index)}".encode()).digest()
    return int.from_bytes(digest[:4], "little") % (2**31)


def _generate(task: LiberoTask, indices: tuple[int, ...]) -> np.ndarray:
    """In a spawned process: build the task's scene once and read the state after each seeded reset."""
    from envs.libero.sim import _Scene

    scene = _Scene(task)
    for robot in scene.inner.robots:  # robosuite's "default" noise, as in the official states
        robot.initialization_noise = {"type": "gaussian", "magnitude": ARM_INIT_NOISE}
    try:
        states = []
        for k in indices:
            scene.reset(fresh_seed(task, k), hard=False)  # normalised: as after a rebuild (sim.py)
            states.append(np.asarray(scene.inner.sim.get_state().flatten(), np.float64))
        return np.stack(states)
    finally:
        scene.env.close()


def fresh_init_states(task: LiberoTask, indices: Sequence[int]) -> np.ndarray:
    """Fresh init states ``indices`` of ``task`` (each >= its official count), float64 ``[n, dim]``."""
    bad = [k for k in indices if not isinstance(k, int | np.integer) or isinstance(k, bool) or k < 0]
    if bad:
        raise BadInput(f"fresh init-state ids must be ints >= 0, got {bad}")
    official = [int(k) for k in indices if k < task.num_init_states]
    if official or any(k > MAX_FRESH_ID for k in indices):
        raise BadInput(
            f"fresh init-state ids of {task.name} are in [{task.num_init_states}, {MAX_FRESH_ID}] (below: "
            f"its official ones), got {official or [k for k in indices if k > MAX_FRESH_ID]}"
        )
    with without_main_module():  # the child starts cleanly from python -, -c or a script
        pool = multiprocessing.get_context("spawn").Pool(1)
    with pool:
        states = pool.apply(_generate, (task, tuple(int(k) for k in indices)))
    states.setflags(write=False)
    return states
