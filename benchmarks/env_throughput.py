"""Throughput of every registered env that can run here: steps/s, chunk-steps/s, reset time and
memory, per env count.

    python -m benchmarks.env_throughput                           # all of them, 1 and 4 envs
    python -m benchmarks.env_throughput --ids Libero-Spatial-v0 --num-envs 1 2 4 8 --cameras 0

LIBERO ids run the real simulator (two 128x128 cameras rendered once per chunk unless
``--cameras 0``). World-model ids run with the weights of ``--model-dir`` when given, else with a
tiny random bundle in the real file formats (``envs.world_models.tiny``) at a small frame size:
those rows measure our loop, not the real networks (``benchmarks.gpu_step_times`` does that on a
GPU). Ids that cannot be built here (a missing optional dependency, B1K without Isaac Sim) are
listed with the reason. Random actions (uniform, scaled by 0.3), ``--chunks`` timed chunk steps
after one warm-up; "reset" is a reset of every env to new initial frames after the first one
(scenes built); memory is the resident set of this process plus the env's worker processes.
Writes ``env_throughput.json`` and ``env_throughput.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import plot_lines, table, write_json
from nets.errors import program_name, run_cli

TINY_SIZES = {"cosmos": (32, 48), "opensora": (32, 32)}


def rss_gb(pids: list[int]) -> float:
    """Resident memory of the given processes, in GiB."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 2**20


def child_pids() -> list[int]:
    """This process and all its descendants (the env's worker processes)."""
    pids, frontier = [os.getpid()], [os.getpid()]
    while frontier:
        pid = frontier.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            kids = []
        pids += kids
        frontier += kids
    return pids


def our_env_ids() -> list[str]:
    import gymnasium as gym

    ours = [
        env_id
        for env_id, spec in gym.registry.items()
        if str(spec.kwargs.get("vector_class", "")).startswith("envs.")
    ]
    # the 50 B1K task ids share one code path: measure one of them
    return sorted(i for i in ours if not i.startswith("B1K-") or i == "B1K-TurningOnRadio-v0")


def env_kwargs(env_id: str, args: argparse.Namespace, bundles: dict[str, Path]) -> tuple[dict[str, Any], str]:
    """Keyword arguments for ``gym.make_vec`` and a note on what the row measures."""
    import gymnasium as gym

    entry = str(gym.spec(env_id).kwargs["vector_class"])
    if "world_models" in entry:
        backend = "cosmos" if "cosmos" in entry else "opensora"
        if args.model_dir:
            return {"model_dir": args.model_dir}, "real weights"
        if backend not in bundles:
            bundles[backend] = write_tiny_bundle(backend)
        size = TINY_SIZES[backend]
        return {
            "model_dir": str(bundles[backend]),
            "image_size": size,
            "model_options": {"num_steps": 2},
        }, f"tiny random, {size[0]}x{size[1]}"
    if "libero" in entry:
        if args.cameras:
            return {"image_size": 128}, "2 cameras 128px"
        return {"cameras": ()}, "no rendering"
    return {}, ""


def write_tiny_bundle(backend: str) -> Path:
    from envs.world_models.tiny import write_tiny_bundle as write

    return write(backend, tempfile.mkdtemp(prefix=f"vla_gym_{backend}_"))


def measure(env_id: str, num_envs: int, kwargs: dict[str, Any], chunks: int, seed: int) -> dict[str, float]:
    import gymnasium as gym

    before = rss_gb([os.getpid()])
    t0 = time.perf_counter()
    env = gym.make_vec(env_id, num_envs=num_envs, autoreset_mode="Disabled", **kwargs)
    try:
        build_s = time.perf_counter() - t0
        rng = np.random.default_rng(seed)
        n_frames = len(env.initial_frames)
        env.reset(seed=seed, options={"initial_frames": rng.integers(n_frames, size=num_envs).tolist()})
        t0 = time.perf_counter()
        env.reset(seed=seed + 1, options={"initial_frames": rng.integers(n_frames, size=num_envs).tolist()})
        reset_s = time.perf_counter() - t0

        def act() -> np.ndarray:
            return (rng.uniform(-1, 1, env.action_space.shape) * 0.3).astype(np.float32)

        env.step(act())  # warm-up
        steps, t0 = 0, time.perf_counter()
        for _ in range(chunks):
            _, _, terminated, truncated, info = env.step(act())
            steps += int(np.asarray(info["chunk_valid"]).sum())
            done = np.logical_or(terminated, truncated)
            if done.any():  # keep every env running
                env.reset(options={"reset_mask": done})
        wall = time.perf_counter() - t0
        memory = rss_gb(child_pids())
    finally:
        env.close()
    return {
        "build_s": build_s,
        "reset_s": reset_s,
        "chunk_steps_per_s": num_envs * chunks / wall,
        "steps_per_s": steps / wall,
        "memory_gb": memory,
        "memory_per_env_gb": (memory - before) / num_envs,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--ids", nargs="*", default=None, help="default: every id `import envs` registers")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument(
        "--cameras", type=int, choices=[0, 1], default=1, help="LIBERO: render (1) or not (0)"
    )
    parser.add_argument("--model-dir", default=None, help="world-model weights (default: tiny random ones)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/env_throughput")
    args = parser.parse_args(argv)
    import envs  # noqa: F401  (registers the ids)

    ids = args.ids or our_env_ids()
    bundles: dict[str, Path] = {}
    rows: list[dict[str, Any]] = []
    for env_id in ids:
        for n in args.num_envs:
            try:
                kwargs, note = env_kwargs(env_id, args, bundles)
                result = measure(env_id, n, kwargs, args.chunks, args.seed)
            except Exception as e:  # noqa: BLE001  (report what cannot run here and go on)
                reason = f"{type(e).__name__}: {e}"[:200]
                rows.append({"env": env_id, "num_envs": n, "note": "skipped", "skipped": reason})
                print(f"{env_id} x{n}: skipped: {reason}")
                break
            rows.append({"env": env_id, "num_envs": n, "note": note, **result})
            print(f"{env_id} x{n}: {result['steps_per_s']:.1f} steps/s", flush=True)
    header = ["env", "envs", "what", "steps/s", "chunks/s", "reset s", "build s", "GiB", "GiB/env"]
    keys = ["steps_per_s", "chunk_steps_per_s", "reset_s", "build_s", "memory_gb", "memory_per_env_gb"]
    body = [
        [r["env"], r["num_envs"], r["note"], *(float(r[k]) if k in r else "-" for k in keys)] for r in rows
    ]
    print(table(header, body, f"env throughput ({args.chunks} chunk steps of random actions per row)"))
    for r in rows:
        if "skipped" in r:
            print(f"skipped {r['env']}: {r['skipped']}")
    out = Path(args.out)
    write_json(out / "env_throughput.json", {"rows": rows, "args": vars(args)})
    series = {}
    for env_id in dict.fromkeys(r["env"] for r in rows if "steps_per_s" in r):
        mine = [r for r in rows if r["env"] == env_id and "steps_per_s" in r]
        series[env_id] = ([r["num_envs"] for r in mine], [r["steps_per_s"] for r in mine])
    if series:
        plot_lines(
            out / "env_throughput.png", series, xlabel="envs", ylabel="env steps / s", title="throughput"
        )
    return rows


if __name__ == "__main__":
    run_cli(main)
