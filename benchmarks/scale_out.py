"""Scaling out on this machine: envs on Ray actors against the local worker pool, side by side.

    python -m benchmarks.scale_out                        # 4 state-only LIBERO envs, ~3 minutes
    python -m benchmarks.scale_out --num-envs 8 --rounds 6 --cameras agentview

Rows (same env id, env count, kwargs and random actions; built once, then stepped in interleaved
rounds so that drift in the machine's speed hits every row alike):

* ``local workers``: ``gym.make_vec(id, num_envs)``, the simulators in this process's worker pool;
* ``ray, M actors``: ``gym.make_vec(id, num_envs, ray_actors=M)`` on a local Ray cluster.

Also the round trip of an empty actor call (the fixed cost Ray adds to every step, per actor) and
the overhead per step it amounts to (ray step time minus local step time).

Then the trainer side: one PPO update (``--update-epochs`` epochs, one minibatch each) of the same
CartPole rollout (``--update-envs`` x ``--update-steps`` steps, an MLP policy with
``--update-hidden`` units) in 1 process, and data parallel over 2 processes (gloo, one torch
thread each, each with half the envs): seconds per update and the speed-up. Writes ``scale_out.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.report import table, write_json
from nets.errors import program_name, run_cli


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


def _update_rank(rank: int, world: int, store: str, args: dict[str, Any], out: str) -> None:
    """One process of the update timing: its share of the rollout, ``repeats`` timed updates."""
    import datetime

    import gymnasium as gym
    import torch
    import torch.distributed as dist

    from policies.registry import make_policy
    from trainers import parallel
    from trainers.grpo import select_envs
    from trainers.ppo import PPOConfig, make_optimizer, ppo_update
    from trainers.rollout import Collector

    torch.set_num_threads(1)
    if world > 1:
        timeout = datetime.timedelta(seconds=120)
        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timeout
        )
    try:
        torch.manual_seed(0)
        space = gym.make("CartPole-v1")
        hidden = {"hidden_sizes": [args["hidden"]] * 2}
        policy = make_policy("categorical", space.observation_space, space.action_space, **hidden)
        env = gym.make_vec("CartPole-v1", args["envs"], vectorization_mode="sync")
        collector = Collector(env, policy)
        collector.reset(seed=0)
        rollout = collector.collect(args["steps"])
        rollout = select_envs([(rollout, parallel.shard(args["envs"], rank, world))])
        config = PPOConfig(n_steps=args["steps"], batch_size=10**9, n_epochs=args["epochs"])
        optimizer = make_optimizer(policy, config)
        evaluator = parallel.data_parallel(policy)
        times = []
        for _ in range(args["repeats"] + 1):  # the first is warm-up
            parallel.barrier()
            t0 = time.perf_counter()
            ppo_update(policy, optimizer, rollout, config, evaluator=evaluator)
            times.append(time.perf_counter() - t0)
        if rank == 0:
            Path(out).write_text(str(float(np.median(times[1:]))))
    finally:
        if world > 1:
            parallel.shutdown()  # a barrier first: see its docstring


def update_seconds(world: int, args: dict[str, Any], tmp: Path) -> float:
    """Median seconds of one PPO update over ``world`` processes."""
    import torch.multiprocessing as mp

    out, store = tmp / f"update_{world}.txt", (tmp / f"store_{world}").resolve()  # file:// needs it absolute
    store.unlink(missing_ok=True)
    mp.spawn(_update_rank, args=(world, str(store), args, str(out)), nprocs=world)
    return float(out.read_text())


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
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
    parser.add_argument("--update-envs", type=int, default=32)
    parser.add_argument("--update-steps", type=int, default=256)
    parser.add_argument("--update-hidden", type=int, default=256)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--update-repeats", type=int, default=3)
    parser.add_argument("--skip-envs", action="store_true", help="only the trainer-update rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/scale_out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [] if args.skip_envs else env_rows(args)
    update = {
        "envs": args.update_envs,
        "steps": args.update_steps,
        "hidden": args.update_hidden,
        "epochs": args.update_epochs,
        "repeats": args.update_repeats,
    }
    seconds = {w: update_seconds(w, update, out) for w in tqdm((1, 2), desc="update timings", unit="world")}
    print(
        table(
            ["", "s per update", "x 1 process"],
            [[f"{w} process{'es' * (w > 1)}", t, seconds[1] / t] for w, t in seconds.items()],
            f"PPO update, CartPole {args.update_envs} envs x {args.update_steps} steps, "
            f"MLP {args.update_hidden}x2, {args.update_epochs} epochs (data parallel: DDP over gloo)",
        )
    )
    write_json(out / "scale_out.json", {"env_rows": rows, "update_seconds": seconds, "args": vars(args)})
    return rows


def env_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The env rows: local workers and Ray actors, interleaved rounds; prints their table."""
    import gymnasium as gym
    import ray

    import envs  # noqa: F401  (registers the ids)

    # every actor asks for 1 logical CPU; all rows are built at once, so the cluster must hold all
    # actors. Logical CPUs only schedule: the simulators are worker processes outside Ray's count.
    cpus = args.cpus or sum(args.actors)
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
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
    for row in rows.values():
        row["round_trip_ms"] = rtt
    return list(rows.values())


if __name__ == "__main__":
    run_cli(main)
