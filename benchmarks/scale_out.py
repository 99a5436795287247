"""Scaling out on this machine: envs on Ray actors against the local worker pool, side by side.

    python -m benchmarks.scale_out                        # 4 state-only LIBERO envs, ~3 minutes
    python -m benchmarks.scale_out --num-envs 8 --rounds 6 --cameras agentview

Rows (same env id, env count, kwargs and random actions; built once, then stepped in interleaved
rounds so that drift in the machine's speed hits every row alike):

* ``local workers``: ``gym.make_vec(id, num_envs)``, the simulators in this process's worker pool;
* ``ray, M actors``: ``gym.make_vec(id, num_envs, ray_actors=M)`` on a local Ray cluster.

Also the round trip of an empty actor call (the fixed cost Ray adds to every step, per actor) and
the overhead per step it amounts to (ray step time minus local step time). Writes ``scale_out.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.report import table, write_json


def step_for(env: Any, steps: int, rng: np.random.Generator) -> tuple[int, float]:
    """Env steps executed and seconds taken by ``steps`` chunk steps of random actions (NEXT_STEP)."""
    executed, t0 = 0, time.perf_counter()
    for _ in range(steps):
        actions = (rng.uniform(-1, 1, env.action_space.shape) * 0.3).astype(np.float32)
        *_, info = env.step(actions)
        executed += int(info["chunk_valid"].sum())
    return executed, time.perf_counter() - t0


def round_trip_ms(env: Any, calls: int) -> float:
    """Median milliseconds of an empty call to one actor (submit, run nothing, return)."""
    import ray

    host = env._hosts[0]
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        ray.get(host.pid.remote())
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Libero-Spatial-v0")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actor counts to measure")
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--cameras", nargs="*", default=[], help="LIBERO cameras (default: state only)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (the first is warm-up)")
    parser.add_argument("--steps", type=int, default=15, help="chunk steps per env per round")
    parser.add_argument(
        "--cpus", type=int, default=0, help="logical CPUs of the local Ray cluster (0: one per actor)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/scale_out")
    args = parser.parse_args(argv)
    import gymnasium as gym
    import ray

    import envs  # noqa: F401  (registers the ids)

    # every actor asks for 1 logical CPU; all rows are built at once, so the cluster must hold all
    # actors. Logical CPUs only schedule: the simulators are worker processes outside Ray's count.
    ray.init(num_cpus=args.cpus or sum(args.actors), include_dashboard=False, log_to_driver=False)
    kwargs = {"chunk_size": args.chunk_size, "cameras": tuple(args.cameras), "autoreset_mode": "NextStep"}
    if args.cameras:
        kwargs["image_size"] = 128
    built: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    try:
        for name, extra in [("local workers", {})] + [
            (f"ray, {m} actor{'s' * (m > 1)}", {"ray_actors": m}) for m in args.actors
        ]:
            t0 = time.perf_counter()
            env = gym.make_vec(args.env, num_envs=args.num_envs, **kwargs, **extra)
            env.reset(seed=args.seed)
            built[name] = env
            rows[name] = {"what": name, "build_reset_s": time.perf_counter() - t0, "steps": 0, "seconds": 0.0}
        for r in tqdm(range(args.rounds), desc="rounds", unit="round"):
            for name, env in built.items():
                executed, seconds = step_for(env, args.steps, np.random.default_rng([args.seed, r]))
                if r > 0:  # the first round warms the scenes up
                    rows[name]["steps"] += executed
                    rows[name]["seconds"] += seconds
        ray_env = next(env for name, env in built.items() if name.startswith("ray"))
        rtt = round_trip_ms(ray_env, 200)
    finally:
        for env in built.values():
            env.close()
        ray.shutdown()

    local = rows["local workers"]
    local_rate = local["steps"] / local["seconds"]
    local_step_ms = 1000 * local["seconds"] / ((args.rounds - 1) * args.steps)
    body = []
    for row in rows.values():
        row["steps_per_s"] = row["steps"] / row["seconds"]
        row["step_ms"] = 1000 * row["seconds"] / ((args.rounds - 1) * args.steps)
        row["overhead_ms"] = row["step_ms"] - local_step_ms
        body.append(
            [
                row["what"],
                row["steps_per_s"],
                row["steps_per_s"] / local_rate,
                row["step_ms"],
                row["overhead_ms"],
                row["build_reset_s"],
            ]  # fmt: skip
        )
    title = f"{args.env}, {args.num_envs} envs, K={args.chunk_size}, cameras {tuple(args.cameras) or 'none'}"
    print(table(["", "env steps/s", "x local", "ms/step", "ms over local", "build+reset s"], body, title))
    print(f"empty actor call round trip: {rtt:.2f} ms (median of 200)")
    write_json(
        Path(args.out) / "scale_out.json",
        {"rows": list(rows.values()), "round_trip_ms": rtt, "args": vars(args)},
    )
    return list(rows.values())


if __name__ == "__main__":
    main()
