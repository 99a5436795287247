"""LIBERO suite metadata: task lists, instructions, BDDL files, init states and step caps.

No simulator is built here. ``libero.libero.benchmark`` (and torch, for the init-state files) is
imported lazily, after :func:`envs.libero.install.ensure_config` has written LIBERO's config.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import numpy as np

from nets.errors import BadInput

# Our suite names -> hf-libero benchmark names. "130" is all five suites, in this order.
_BASE_SUITES: dict[str, str] = {
    "spatial": "libero_spatial",
    "object": "libero_object",
    "goal": "libero_goal",
    "10": "libero_10",
    "90": "libero_90",
}
SUITES: dict[str, tuple[str, ...]] = {k: (v,) for k, v in _BASE_SUITES.items()}
SUITES["130"] = tuple(_BASE_SUITES.values())

# Episode caps (policy steps, not counting the settle steps) used by the common LIBERO evaluation,
# OpenVLA's experiments/robot/libero/run_libero_eval.py (each is ~1.1x the longest training demo).
MAX_EPISODE_STEPS: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}


@dataclass(frozen=True)
class LiberoTask:
    suite: str  # hf-libero benchmark name, e.g. "libero_spatial"
    index: int  # task index within that benchmark (task order 0, as in all common evaluations)
    name: str
    instruction: str
    bddl_file: str  # absolute path
    max_episode_steps: int
    num_init_states: int
    init_file: str = ""  # a perturbation category's own init states (envs/libero/pro.py); "": LIBERO's
    problem: str = ""  # why the task cannot be built ("" when it can)
    # what the simulator changes beyond the BDDL (LIBERO-Plus, envs/libero/plus.py): sorted (key, value)
    # pairs of "camera" (H, V, S, R, E), "robot" (pose 1-500), "noise" (level 1-50)
    perturbation: tuple[tuple[str, object], ...] = ()


def _benchmark_names(suite: str) -> tuple[str, ...]:
    if suite not in SUITES:
        raise BadInput(f"unknown LIBERO suite {suite!r}; valid suites: {', '.join(SUITES)}")
    return SUITES[suite]


def _init_states_path(suite: str, name: str) -> str:
    from envs.libero.install import ensure_config

    ensure_config()  # also here: frames unpickled in a fresh process (a Ray driver) come this way first
    from libero.libero import get_libero_path

    return os.path.join(get_libero_path("init_states"), suite, f"{name}.pruned_init")


@cache
def _load_init_states_file(path: str) -> np.ndarray:
    from nets.safe_load import torch_load

    # LIBERO's .pruned_init files are pickled numpy arrays: unpickle those and nothing else
    states = np.array(torch_load(path, numpy=True, opt_in=None), dtype=np.float64)
    if states.ndim == 1:  # one state stored flat (LIBERO-Plus's layouts), read as LIBERO reads it
        states = states.reshape(1, -1)
    if states.ndim != 2:
        raise BadInput(f"unexpected init-state array of shape {states.shape} in {path}")
    states.setflags(write=False)
    return states


@cache
def _benchmark_tasks(benchmark_name: str) -> tuple[LiberoTask, ...]:
    from envs.libero.install import ensure_config

    ensure_config()
    from libero.libero import benchmark, get_libero_path

    # The task list LIBERO's Benchmark class builds (task order 0), read from the tables it reads:
    # instantiating the class prints "[info] using task orders ...", and silencing that would
    # swap sys.stdout for the whole process (and for other threads).
    tasks_in_file_order = list(benchmark.task_maps[benchmark_name].values())
    order = range(len(tasks_in_file_order)) if benchmark_name == "libero_90" else benchmark.task_orders[0]
    bddl_dir = get_libero_path("bddl_files")
    tasks = []
    for i, t in enumerate(tasks_in_file_order[k] for k in order):
        states = _load_init_states_file(_init_states_path(t.problem_folder, t.name))
        tasks.append(
            LiberoTask(
                suite=benchmark_name,
                index=i,
                name=t.name,
                instruction=t.language,
                bddl_file=os.path.abspath(os.path.join(bddl_dir, t.problem_folder, t.bddl_file)),
                max_episode_steps=MAX_EPISODE_STEPS[benchmark_name],
                num_init_states=int(states.shape[0]),
            )
        )
    return tuple(tasks)


def suite_tasks(suite: str) -> list[LiberoTask]:
    """All tasks of one of our suites ("spatial", "object", "goal", "10", "90", "130"), in order."""
    return [task for name in _benchmark_names(suite) for task in _benchmark_tasks(name)]


def load_init_states(task: LiberoTask) -> np.ndarray:
    """The task's fixed initial states, float64 [num_init_states, state_dim] (read-only, cached)."""
    return _load_init_states_file(task.init_file or _init_states_path(task.suite, task.name))
