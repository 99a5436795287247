"""LIBERO throughput, reset time and memory: our chunked env against a per-step baseline.

Everything is measured side by side in one run (the machine is shared and noisy):

* ours: ``Libero-Spatial-v0``, 2 envs in 2 worker processes, chunks of K=8, two cameras rendered
  once per chunk;
* baseline: gymnasium's ``AsyncVectorEnv`` over a plain one-step LIBERO env that renders both
  cameras after every step (what LeRobot's ``LiberoEnv`` does), 2 envs;
* ours without rendering plus one render per chunk (the render cost measured as K=1 with cameras
  minus K=1 without): what the cameras should add. This is not the physics: how our state-only step
  compares with the MuJoCo physics it is made of is ``benchmarks/libero_physics_bound.py``.

    python -m benchmarks.libero_vs_per_step [--chunks 10] [--sizes 128 256] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import numpy as np

from benchmarks.env_throughput import rss_gb
from benchmarks.report import write_json
from nets.errors import program_name, run_cli

K = 8
NUM_ENVS = 2


def _ours(size: int, chunk_size: int, cameras: tuple[str, ...], chunks: int) -> dict:
    from envs.libero.env import LiberoVectorEnv

    env = LiberoVectorEnv(
        "spatial",
        NUM_ENVS,
        chunk_size=chunk_size,
        image_size=size,
        cameras=cameras,
        max_episode_steps=10**6,
        autoreset_mode="Disabled",
    )
    rng = np.random.default_rng(0)
    try:
        env.reset(options={"initial_frames": [0, 50]})  # tasks 0 and 1, built and reset once
        t0 = time.perf_counter()
        env.reset(options={"initial_frames": [1, 51]})  # same scenes: the fast reset path
        reset_s = time.perf_counter() - t0
        act = lambda: (rng.uniform(-1, 1, env.action_space.shape) * 0.3).astype(np.float32)  # noqa: E731
        env.step(act())  # warm-up
        t0 = time.perf_counter()
        for _ in range(chunks):
            env.step(act())
        wall = time.perf_counter() - t0
        rss = max(rss_gb([p]) for p in env.pool.pids())
    finally:
        env.close()
    return {
        "steps_per_s": NUM_ENVS * chunk_size * chunks / wall,
        "chunk_s": wall / chunks,
        "reset_s": reset_s,
        "worker_rss_gb": rss,
    }


def _full_reset_time(size: int) -> float:
    from envs.libero.env import LiberoVectorEnv

    env = LiberoVectorEnv("spatial", NUM_ENVS, image_size=size, fast_reset=False, autoreset_mode="Disabled")
    try:
        env.reset(options={"initial_frames": [0, 50]})
        t0 = time.perf_counter()
        env.reset(options={"initial_frames": [1, 51]})
        return time.perf_counter() - t0
    finally:
        env.close()


def _baseline(size: int, steps: int) -> dict:
    import gymnasium as gym

    from benchmarks.plain_libero import PlainLiberoEnv

    env = gym.vector.AsyncVectorEnv(
        [partial(PlainLiberoEnv, task_index=i, image_size=size) for i in range(NUM_ENVS)],
        context="forkserver",
    )
    rng = np.random.default_rng(0)
    try:
        env.reset()
        env.step((rng.uniform(-1, 1, env.action_space.shape) * 0.3).astype(np.float32))
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step((rng.uniform(-1, 1, env.action_space.shape) * 0.3).astype(np.float32))
        wall = time.perf_counter() - t0
    finally:
        env.close()
    return {"steps_per_s": NUM_ENVS * steps / wall}


def main() -> None:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=10, help="timed chunks per configuration")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--json", default="runs/benchmarks/libero_vs_per_step.json", help="results as JSON")
    args = parser.parse_args()
    # Same rendering and thread settings for ours and the baseline.
    os.environ.update(MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl", OMP_NUM_THREADS="1")
    os.environ.setdefault("LP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // NUM_ENVS)))

    rows, results = [], {}
    state_only = _ours(128, K, (), args.chunks)
    t_state = state_only["chunk_s"] / K  # per sub-step, envs in parallel
    for size in args.sizes:
        ours = _ours(size, K, ("agentview", "wrist"), args.chunks)
        base = _baseline(size, K * args.chunks)
        one_cam = _ours(size, 1, ("agentview", "wrist"), args.chunks * 2)
        one_nocam = _ours(size, 1, (), args.chunks * 2)
        t_render = max(one_cam["chunk_s"] - one_nocam["chunk_s"], 0.0)
        state_render_s = K * t_state + t_render
        full_reset = _full_reset_time(size)
        results[size] = dict(
            ours=ours,
            baseline=base,
            state_only=state_only,
            state_render_chunk_s=state_render_s,
            full_reset_s=full_reset,
        )
        rows.append(
            (
                f"{size}x{size}",
                f"{ours['steps_per_s']:.1f}",
                f"{base['steps_per_s']:.1f}",
                f"{ours['steps_per_s'] / base['steps_per_s']:.2f}x",
                f"{ours['chunk_s'] / state_render_s:.2f}x",
                f"{ours['reset_s'] / NUM_ENVS:.2f}",
                f"{full_reset / NUM_ENVS:.2f}",
                f"{ours['worker_rss_gb']:.2f}",
            )
        )
    header = (
        "size",
        "ours steps/s",
        "baseline steps/s",
        "speed-up",
        "vs state+render",
        "reset s/env",
        "full s/env",
        "worker GB",
    )
    print(
        f"\nLIBERO-Spatial, {NUM_ENVS} envs, K={K}, 2 cameras; state only: "
        f"{state_only['steps_per_s']:.1f} steps/s (targets: speed-up >= 3.5x, vs state-only + one render "
        "per chunk <= 1.5x, reset < 0.5 s/env, worker < 2.5 GB)"
    )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    write_json(args.json, results)


if __name__ == "__main__":
    run_cli(main)
