"""Success of the scripted LIBERO expert over every (task, init state) pair of a suite.

    python -m benchmarks.libero_expert --suite spatial object [--init-states 50] [--num-envs 2]

The expert reads simulator state (``task_state``), so the envs run with rendering off
(``cameras=()``), one action per step, and LIBERO's own success check and step limits. Prints one
table per suite (per task: successes / trials, rate with a 95% Wilson interval, mean steps of the
successful episodes) and writes ``runs/benchmarks/libero_expert.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (the way LIBERO-style results are reported)."""
    if trials == 0:
        return (float("nan"), float("nan"))
    p = successes / trials
    center = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return (max(0.0, center - half), min(1.0, center + half))


def evaluate_suite(suite: str, init_states: int, num_envs: int, seed: int) -> dict:
    import gymnasium as gym

    import envs  # noqa: F401  (registers the ids)
    from policies.libero_expert import LiberoExpert

    env = gym.make_vec(
        f"Libero-{suite.capitalize()}-v0",
        num_envs=num_envs,
        chunk_size=None,
        cameras=(),
        task_state=True,
        include_instruction=False,
        autoreset_mode="Disabled",
    )
    try:
        frames = env.unwrapped.initial_frames
        wanted = [i for i in range(len(frames)) if frames.locate(i)[1] < init_states]
        policy = LiberoExpert(env.single_observation_space, env.single_action_space)
        per_task: dict[str, list] = {}
        t0 = time.perf_counter()
        episodes = _run_ids(env, policy, wanted, seed)
        for ep in episodes:
            per_task.setdefault(ep["task"], []).append(ep)
        wall = time.perf_counter() - t0
    finally:
        env.close()
    rows = []
    for task, eps in per_task.items():
        ok = [e for e in eps if e["success"]]
        low, high = wilson_interval(len(ok), len(eps))
        rows.append(
            {
                "task": task.split("/", 1)[-1],
                "successes": len(ok),
                "trials": len(eps),
                "rate": len(ok) / len(eps),
                "ci95": [low, high],
                "mean_steps_success": float(np.mean([e["length"] for e in ok])) if ok else float("nan"),
            }
        )
    total = sum(r["successes"] for r in rows), sum(r["trials"] for r in rows)
    return {
        "suite": suite,
        "tasks": rows,
        "successes": total[0],
        "trials": total[1],
        "rate": total[0] / max(total[1], 1),
        "ci95": list(wilson_interval(*total)),
        "wall_s": wall,
        "unsupported_steps": policy.unsupported_steps,
    }


def _run_ids(env, policy, ids: list[int], seed: int) -> list[dict]:
    """One episode from each initial frame id, ``num_envs`` at a time."""
    n, out = env.num_envs, []
    frames = env.unwrapped.initial_frames
    for start in range(0, len(ids), n):
        batch = ids[start : start + n]
        padded = batch + [batch[-1]] * (n - len(batch))
        obs, _ = env.reset(seed=seed + start, options={"initial_frames": padded})
        done = np.zeros(n, bool)
        success, length = np.zeros(n, bool), np.zeros(n, int)
        while not done.all():
            obs, _, term, trunc, info = env.step(policy.act(obs).actions.numpy()[:, 0])
            for i in np.flatnonzero((term | trunc) & ~done):
                success[i], length[i] = info["episode"]["success"][i], info["episode"]["length"][i]
            done |= term | trunc
        out += [
            {"frame": f, "task": frames[f].task, "success": bool(success[i]), "length": int(length[i])}
            for i, f in enumerate(batch)
        ]
        print(f"\r{frames[batch[0]].task.split('/')[0]}: {len(out)}/{len(ids)} episodes", end="", flush=True)
    print()
    return out


def main(argv: list[str] | None = None) -> dict:
    from trainers.metrics import format_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", nargs="+", default=["spatial", "object"])
    parser.add_argument("--init-states", type=int, default=50, help="first N init states of each task")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/libero_expert.json")
    args = parser.parse_args(argv)
    results = {}
    for suite in args.suite:
        res = evaluate_suite(suite, args.init_states, args.num_envs, args.seed)
        results[suite] = res
        rows = [
            (
                r["task"][:60],
                f"{r['successes']}/{r['trials']}  {r['rate']:.0%}  [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]",
            )
            for r in res["tasks"]
        ]
        rows.append(
            (
                "all tasks",
                f"{res['successes']}/{res['trials']}  {res['rate']:.1%}  "
                f"[{res['ci95'][0]:.3f}, {res['ci95'][1]:.3f}]  ({res['wall_s']:.0f} s)",
            )
        )
        print(format_table(rows, title=f"scripted expert, LIBERO-{suite.capitalize()}"))
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
