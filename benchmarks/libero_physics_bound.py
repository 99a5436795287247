"""LIBERO's env step against the MuJoCo physics it is made of.

The bound is the time of the ``mj_step`` calls inside LIBERO's own env (``ControlEnv``, its
``sim.step`` wrapped in a timer) for the same task, init state and actions. Side by side, in one run,
with each suite's task reset the same way (scene seed 0, init state, 10 no-op settle steps):

* LIBERO's own ``env.step``;
* ours in the process (``LiberoSim.run_chunk``, chunks of K) and through our vector env (the
  simulator in a worker process: what a user's ``env.step`` costs, IPC included);
* two action sequences: contact-light (fixed random actions) and contact-heavy (the scripted
  expert's episode on that task: approach, grasp, lift, place);
* 1 env, and N envs stepping at once (one process each; N = the core count fills the cores);
* our vector env with two 128 px cameras (one render per chunk): the render cost per chunk apart;
* our reset (the fast path: same scene, new init state) per env.

Every configuration runs ``--rounds`` times, interleaved; the table keeps each one's best round.

    python -m benchmarks.libero_physics_bound [--suites spatial object goal 10 90] [--envs 1 2]
        [--steps 160] [--rounds 2] [--json runs/benchmarks/libero_physics_bound.json]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks.report import table, write_json
from nets.errors import program_name, run_cli

K = 8  # actions per chunk for our env
SETTLE = 10  # no-op steps after the init state, as LiberoSim does by default
# per suite: a task whose goal is one On / In predicate (the scripted expert's kind), init state 3
TASKS = {"spatial": 0, "object": 0, "goal": 2, "10": 5, "90": 9}
INIT_STATE = 3


def _task(suite: str, index: int) -> Any:
    from envs.libero.suites import suite_tasks

    return suite_tasks(suite)[index]


def _liberos_own(task: Any, actions: np.ndarray) -> dict[str, float]:
    """LIBERO's ControlEnv: seconds of mj_step (the bound) and of env.step over ``actions``."""
    from envs.libero.sim import NOOP_ACTION, _import_libero
    from envs.libero.suites import load_init_states

    env = _import_libero().ControlEnv(
        bddl_file_name=task.bddl_file, use_camera_obs=False, has_renderer=False,
        has_offscreen_renderer=False, ignore_done=True,
    )  # fmt: skip
    try:
        np.random.seed(0)
        env.reset()
        env.set_init_state(load_init_states(task)[INIT_STATE])
        for _ in range(SETTLE):
            env.step(NOOP_ACTION.copy())
        sim, physics = env.env.sim, [0.0]
        mj_step = sim.step

        def timed_step() -> None:
            t = time.perf_counter()
            mj_step()
            physics[0] += time.perf_counter() - t

        sim.step = timed_step
        t0 = time.perf_counter()
        for action in actions:
            env.step(action.copy())
        total = time.perf_counter() - t0
    finally:
        env.close()
    return {"bound_s": physics[0], "libero_s": total}


def _ours_in_process(task: Any, actions: np.ndarray) -> dict[str, float]:
    """Our ``LiberoSim`` (state only) over the same actions, in chunks of K."""
    from envs.libero.sim import LiberoSim
    from envs.libero.suites import load_init_states

    sim = LiberoSim(cameras=())  # the vector env's default settings, state only
    try:
        sim.reset(task, load_init_states(task)[INIT_STATE], scene_seed=0)
        t0 = time.perf_counter()
        for start in range(0, len(actions), K):
            sim.run_chunk(actions[start : start + K], 10**6)
        return {"ours_s": time.perf_counter() - t0}
    finally:
        sim.close()


def _breakdown(task: Any, actions: np.ndarray) -> dict[str, float]:
    """Where our step's time goes, inside the loop: each part's seconds over ``actions``
    (timers around the calls add ~0.2 us each, counted in ``other``)."""
    import mujoco

    from envs.libero import fast_step
    from envs.libero.sim import LiberoSim
    from envs.libero.suites import load_init_states

    spent: dict[str, float] = {}

    def timed(part: str, fn: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[part] = spent.get(part, 0.0) + time.perf_counter() - t

        return call

    parts = {
        "physics (mj_step1 + mj_step2)": ("mj_step1", "mj_step2"),
        "Jacobian, mass matrix (MuJoCo)": ("mj_jacSite", "mj_fullM"),
    }

    def module_proxy(module: Any, **replaced: Any) -> Any:  # the module's names, some of them timed
        names = {}
        for name in dir(module):
            try:
                names[name] = getattr(module, name)
            except AttributeError:  # numpy's removed aliases
                continue
        return SimpleNamespace(**{**names, **replaced})

    timed_mj = {name: timed(part, getattr(mujoco, name)) for part, names in parts.items() for name in names}
    kernels = ("_state_and_osc", "_osc_terms", "_arm_torques")
    saved = {name: getattr(fast_step, name) for name in ("mujoco", "np", *kernels)}
    sim = LiberoSim(cameras=())
    try:
        # the reset's settle steps compile the kernels (their globals are read then): time only after
        sim.reset(task, load_init_states(task)[INIT_STATE], scene_seed=0)
        fast_step.mujoco = module_proxy(mujoco, **timed_mj)
        fast_step.np = module_proxy(np, dot=timed("numpy BLAS dots", np.dot))
        for name in kernels:
            setattr(fast_step, name, timed("OSC kernels (numba: LAPACK pinv/inv, copies)", saved[name]))
        inner, ctl = sim._scene.inner, sim._scene.stepper.controller
        part = "LIBERO/robosuite per step (set_goal, reward, success, post-process)"
        inner._post_action = timed(part, inner._post_action)
        inner._check_success = timed(part, inner._check_success)
        ctl.set_goal = timed(part, ctl.set_goal)
        spent.clear()
        t0 = time.perf_counter()
        for start in range(0, len(actions), K):
            sim.run_chunk(actions[start : start + K], 10**6)
        spent["total"] = time.perf_counter() - t0
    finally:
        for name, value in saved.items():
            setattr(fast_step, name, value)
        sim.close()
    spent["other (Python loop, gripper, clock, observables, timers)"] = spent["total"] - sum(
        v for k, v in spent.items() if k != "total"
    )
    return spent


def _expert_actions(task: Any, max_steps: int) -> np.ndarray:
    """The scripted expert's actions on the task, until its success or ``max_steps``."""
    import gymnasium as gym

    from envs.core.spaces import FieldBox
    from envs.libero.sim import LiberoSim
    from envs.libero.suites import load_init_states
    from envs.libero.task_state import TASK_STATE_FIELDS
    from policies.libero_expert import LiberoExpert

    space = gym.spaces.Dict(task_state=FieldBox(-np.inf, np.inf, TASK_STATE_FIELDS))
    expert = LiberoExpert(space, gym.spaces.Box(-1, 1, (7,), np.float32))
    sim = LiberoSim(cameras=(), task_state=True)
    actions = []
    try:
        obs = sim.reset(task, load_init_states(task)[INIT_STATE], scene_seed=0)
        for _ in range(max_steps):
            action = expert.act({"task_state": obs["task_state"][None]}).actions.numpy()[0, 0]
            actions.append(action.astype(np.float64))
            out = sim.run_chunk(actions[-1][None], 1)
            obs = out.obs
            if out.ended:
                break
    finally:
        sim.close()
    return np.array(actions)


def _worker(conn: Any) -> None:
    """One measuring process: runs the requests it receives, one at a time."""
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # as our env's workers do
    jobs = {"liberos_own": _liberos_own, "ours": _ours_in_process, "expert": _expert_actions}
    jobs["breakdown"] = _breakdown
    while (msg := conn.recv()) is not None:
        name, args = msg
        conn.send(jobs[name](*args))


class _Measurers:
    """N processes that run the same request at the same time (N envs filling the cores)."""

    def __init__(self, n: int) -> None:
        ctx = mp.get_context("forkserver")
        self.conns, self.procs = [], []
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child,), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self, name: str, *args: Any) -> list[Any]:
        for conn in self.conns:
            conn.send((name, args))
        return [conn.recv() for conn in self.conns]

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=30)


def _vector_env(suite: str, n: int, actions: np.ndarray, cameras: tuple[str, ...]) -> dict[str, float]:
    """Our vector env, n envs at the same (task, init state), the same actions in chunks of K."""
    import gymnasium as gym

    import envs  # noqa: F401  (registers the ids)

    env_id = f"Libero-{suite.capitalize()}-v0"
    env = gym.make_vec(
        env_id, num_envs=n, cameras=cameras, image_size=128, chunk_size=K, autoreset_mode="Disabled",
        max_episode_steps=10**6,
    )  # fmt: skip
    frame = TASKS[suite] * 50 + INIT_STATE
    try:
        env.reset(options={"initial_frames": [frame] * n})  # builds the scenes
        t0 = time.perf_counter()
        env.reset(options={"initial_frames": [frame] * n})  # the fast path: same scene
        reset_s = time.perf_counter() - t0
        chunks = np.repeat(actions.reshape(-1, 1, K, 7), n, 1).astype(np.float32)
        t0 = time.perf_counter()
        for chunk in chunks:
            env.step(chunk)
        return {"vec_s": time.perf_counter() - t0, "reset_s": reset_s}
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.split("\n")[0])
    parser.add_argument("--suites", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--envs", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--steps", type=int, default=160, help="random actions (and the expert's cap)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default="runs/benchmarks/libero_physics_bound.json")
    parser.add_argument(
        "--no-breakdown", dest="breakdown", action="store_false", help="skip where our step's time goes"
    )
    args = parser.parse_args()
    os.environ.update(MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl")

    results: list[dict[str, Any]] = []
    breakdowns: dict[str, dict[str, float]] = {}
    measurers = {n: _Measurers(n) for n in sorted(set(args.envs))}
    try:
        for suite in args.suites:
            task = _task(suite, TASKS[suite])
            sequences = {
                "random": np.random.default_rng(0).uniform(-1, 1, (args.steps, 7)),
                "expert": measurers[min(measurers)].run("expert", task, 300)[0],
            }
            for seq_name, actions in sequences.items():
                actions = actions[: len(actions) - len(actions) % K]  # whole chunks (the expert's: its end)
                for n, measurer in measurers.items():
                    best: dict[str, float] = {}
                    for _ in range(args.rounds):
                        runs = {
                            **_merge(measurer.run("liberos_own", task, actions)),
                            **_merge(measurer.run("ours", task, actions)),
                            **_vector_env(suite, n, actions, ()),
                        }
                        if seq_name == "random":
                            runs["vec_cameras_s"] = _vector_env(suite, n, actions, ("agentview", "wrist"))[
                                "vec_s"
                            ]
                        best = {k: min(v, best.get(k, v)) for k, v in runs.items()}
                    steps = len(actions)
                    row = {"suite": suite, "task": task.index, "actions": seq_name, "envs": n, "steps": steps}
                    row.update({k: v / steps for k, v in best.items() if k != "reset_s"})
                    row["reset_s_per_env"] = best["reset_s"] / n
                    results.append(row)
                    print(_row_text(row), flush=True)
                if seq_name == "random" and args.breakdown:
                    spent = measurers[min(measurers)].run("breakdown", task, actions)[0]
                    breakdowns[suite] = {k: v / len(actions) for k, v in spent.items()}
    finally:
        for measurer in measurers.values():
            measurer.close()
    _print_table(results)
    if breakdowns:
        _print_breakdown(breakdowns, results)
    write_json(args.json, {"results": results, "breakdown_s_per_step": breakdowns})


def _merge(per_process: list[dict[str, float]]) -> dict[str, float]:
    """Per-process times of a concurrent run: the slowest process's (the run's wall time)."""
    return {k: max(p[k] for p in per_process) for k in per_process[0]}


def _row_text(r: dict[str, Any]) -> str:
    ratio = r["ours_s"] / r["bound_s"]
    return f"{r['suite']} {r['actions']} x{r['envs']}: bound {r['bound_s'] * 1e3:.2f} ms, ours {ratio:.2f}x"


def _print_table(results: list[dict[str, Any]]) -> None:
    header = (
        "suite/task", "actions", "envs", "bound ms", "LIBERO ms", "x bound", "ours ms", "x bound",
        "vec env ms", "x bound", "IPC ms", "render ms/chunk", "reset s/env",
    )  # fmt: skip
    rows = []
    for r in results:
        b = r["bound_s"]
        render = (r["vec_cameras_s"] - r["vec_s"]) * K * 1e3 if "vec_cameras_s" in r else None
        rows.append((
            f"{r['suite']}/{r['task']}", r["actions"], r["envs"], b * 1e3, r["libero_s"] * 1e3,
            f"{r['libero_s'] / b:.2f}x", r["ours_s"] * 1e3, f"{r['ours_s'] / b:.2f}x", r["vec_s"] * 1e3,
            f"{r['vec_s'] / b:.2f}x", (r["vec_s"] - r["ours_s"]) * 1e3, render, r["reset_s_per_env"],
        ))  # fmt: skip
    title = (
        f"LIBERO step time per env step (ms), state only, chunks of K={K}; bound = mj_step inside LIBERO's "
        "own env for the same task, init state and actions; best of the rounds (target: ours <= 1.5x)"
    )
    print(table(header, rows, title))


def _print_breakdown(breakdowns: dict[str, dict[str, float]], results: list[dict[str, Any]]) -> None:
    bound = {r["suite"]: r["bound_s"] for r in results if r["actions"] == "random" and r["envs"] == 1}
    parts = [k for k in next(iter(breakdowns.values())) if k != "total"]
    rows = [
        (part, *(f"{b[part] * 1e3:.2f} ({b[part] / bound[s]:.2f}x)" for s, b in breakdowns.items()))
        for part in [*parts, "total"]
    ]
    title = (
        "Where our step's time goes (random actions, 1 env, in the process): ms per env step (x the bound)"
    )
    print()
    print(table(("part", *(f"{s}/{TASKS[s]}" for s in breakdowns)), rows, title))


if __name__ == "__main__":
    run_cli(main)
