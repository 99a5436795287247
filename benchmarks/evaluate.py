"""Success rate of a policy over a LIBERO suite's tasks x init states, the way LIBERO results are
reported: per task and overall, with 95% Wilson intervals.

    python -m benchmarks.evaluate --checkpoint checkpoints/bc_libero_spatial/policy.pt \\
        --env-kwargs '{"image_size": 64, "cameras": ["agentview"], "chunk_size": 8}' --init-states 5
    python -m benchmarks.evaluate --policy libero_expert --suite object \\
        --env-kwargs '{"chunk_size": null, "cameras": [], "task_state": true}'

Each (task, init state) pair runs one episode (deterministic actions unless ``--sample``); prints
the table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate."""
    if trials == 0:
        return (float("nan"), float("nan"))
    p = successes / trials
    center = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return (max(0.0, center - half), min(1.0, center + half))


def run_frames(
    env: Any, policy: Any, ids: list[int], *, seed: int = 0, deterministic: bool = True
) -> list[dict]:
    """One episode from each initial frame id of a DISABLED-mode env, ``num_envs`` at a time."""
    from trainers.demos import collect_episodes

    out = []
    for ep in collect_episodes(env, policy, len(ids), seed=seed, deterministic=deterministic, frame_ids=ids):
        out.append({"frame": ep.initial_frame, "task": ep.task, "success": ep.success, "length": ep.length})
        print(f"\revaluate: {len(out)}/{len(ids)} episodes", end="", flush=True)
    print()
    return out


def summarize(episodes: list[dict]) -> dict:
    """Per-task and overall success with Wilson intervals."""
    per_task: dict[str, list[dict]] = {}
    for ep in episodes:
        per_task.setdefault(ep["task"], []).append(ep)
    rows = []
    for task, eps in per_task.items():
        ok = [e for e in eps if e["success"]]
        rows.append(
            {
                "task": task.split("/", 1)[-1],
                "successes": len(ok),
                "trials": len(eps),
                "rate": len(ok) / len(eps),
                "ci95": list(wilson_interval(len(ok), len(eps))),
                "mean_steps_success": float(np.mean([e["length"] for e in ok])) if ok else float("nan"),
            }
        )
    k, n = sum(r["successes"] for r in rows), sum(r["trials"] for r in rows)
    return {
        "tasks": rows,
        "successes": k,
        "trials": n,
        "rate": k / max(n, 1),
        "ci95": list(wilson_interval(k, n)),
    }


def format_summary(summary: dict, title: str) -> str:
    from trainers.metrics import format_table

    def cell(r: dict) -> str:
        return f"{r['successes']}/{r['trials']}  {r['rate']:.0%}  [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"

    rows = [(r["task"][:64], cell(r)) for r in summary["tasks"]]
    rows.append(("all tasks", cell(summary)))
    return format_table(rows, title=title)


def write_json(path: str | Path, data: Any) -> Path:
    """Write a benchmark's results next to its table."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def frame_ids(frames: Any, init_states: int, tasks: list[int] | None) -> list[int]:
    """Ids of the first ``init_states`` init states of the chosen tasks (all tasks by default)."""
    ids = []
    for i in range(len(frames)):
        task, state = frames.locate(i)
        if state < init_states and (tasks is None or task in tasks):
            ids.append(i)
    return ids


def main(argv: list[str] | None = None) -> dict:
    import gymnasium as gym

    import envs  # noqa: F401  (registers the ids)
    from policies.registry import make_policy
    from trainers.checkpoint import load_policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="spatial")
    parser.add_argument("--checkpoint", help="a run directory or checkpoint file")
    parser.add_argument("--policy", help="a policy name (scripted policies), instead of a checkpoint")
    parser.add_argument("--env-kwargs", type=json.loads, default={})
    parser.add_argument("--init-states", type=int, default=50)
    parser.add_argument("--tasks", type=int, nargs="*", default=None)
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--sample", action="store_true", help="sample actions instead of the mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/evaluate.json")
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.policy is None):
        parser.error("give exactly one of --checkpoint and --policy")
    env = gym.make_vec(
        f"Libero-{args.suite.capitalize()}-v0",
        num_envs=args.num_envs,
        autoreset_mode="Disabled",
        **args.env_kwargs,
    )
    try:
        obs_space, act_space = env.single_observation_space, env.single_action_space
        if args.checkpoint:
            policy = load_policy(args.checkpoint, obs_space, act_space)
        else:
            policy = make_policy(args.policy, obs_space, act_space)
        policy.eval()
        policy.seed(args.seed)
        t0 = time.perf_counter()
        episodes = run_frames(
            env,
            policy,
            frame_ids(env.unwrapped.initial_frames, args.init_states, args.tasks),
            seed=args.seed,
            deterministic=not args.sample,
        )
        wall = time.perf_counter() - t0
    finally:
        env.close()
    summary = {**summarize(episodes), "suite": args.suite, "wall_s": wall, "args": vars(args)}
    print(format_summary(summary, f"{args.checkpoint or args.policy} on LIBERO-{args.suite.capitalize()}"))
    write_json(args.out, summary)
    return summary


if __name__ == "__main__":
    main()
