"""Success rate of a policy over a LIBERO suite's tasks x init states, the way LIBERO results are
reported: per task and overall, with 95% Wilson intervals.

    python -m benchmarks.evaluate --checkpoint checkpoints/bc_libero_spatial_state.pt --init-states 40:50 \\
        --env-kwargs '{"cameras": ["agentview"], "task_state": true, "chunk_size": 8}' \\
        --failure-videos runs/failures
    python -m benchmarks.evaluate --policy libero_expert --suite object \\
        --env-kwargs '{"chunk_size": null, "cameras": [], "task_state": true}'

Each (task, init state) pair runs one episode (deterministic actions unless ``--sample``); prints
the table and writes JSON (``--out``); ``--failure-videos DIR`` keeps an mp4 of each failed episode
(up to ``--max-videos``; the env must render the agent view: add ``"cameras": ["agentview"]``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import write_json
from trainers.metrics import wilson_interval


def run_frames(
    env: Any,
    policy: Any,
    ids: list[int],
    *,
    seed: int = 0,
    deterministic: bool = True,
    failure_videos: str | Path | None = None,
    max_videos: int = 20,
) -> list[dict]:
    """One episode from each initial frame id of a DISABLED-mode env, ``num_envs`` at a time.

    With ``failure_videos`` (a directory) the first ``max_videos`` failed episodes are written as
    mp4s of the camera image the policy saw before each chunk (the env must render ``image``)."""
    from trainers.demos import collect_episodes
    from trainers.evaluation import write_video

    if failure_videos is not None and "image" not in env.single_observation_space.spaces:
        raise ValueError("failure videos need an env that renders 'image' (cameras=['agentview'])")
    out, videos = [], 0
    for ep in collect_episodes(env, policy, len(ids), seed=seed, deterministic=deterministic, frame_ids=ids):
        out.append({"frame": ep.initial_frame, "task": ep.task, "success": ep.success, "length": ep.length})
        if failure_videos is not None and not ep.success and videos < max_videos:
            name = f"{ep.task.split('/')[-1][:60]}_frame{ep.initial_frame}.mp4"
            write_video(Path(failure_videos) / name, list(ep.obs["image"]), fps=5)
            videos += 1
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


def rate_cell(r: dict | None) -> str:
    """``k/n rate [low, high]`` of a ``summarize`` row (or the whole summary); ``-`` for None."""
    if r is None:
        return "-"
    return f"{r['successes']}/{r['trials']} {r['rate']:.0%} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"


def format_summary(summary: dict, title: str) -> str:
    from trainers.metrics import format_table

    rows = [(r["task"][:64], rate_cell(r)) for r in summary["tasks"]]
    rows.append(("all tasks", rate_cell(summary)))
    return format_table(rows, title=title)


def frame_ids(frames: Any, init_states: int | Sequence[int], tasks: Sequence[int] | None = None) -> list[int]:
    """Ids of the chosen init states (an int N: the first N) of the chosen tasks (default all)."""
    states = set(range(init_states)) if isinstance(init_states, int) else set(init_states)
    ids = []
    for i in range(len(frames)):
        task, state = frames.locate(i)
        if state in states and (tasks is None or task in tasks):
            ids.append(i)
    return ids


def state_range(text: str) -> range:
    """``"5"`` -> ``range(5)``, ``"40:50"`` -> ``range(40, 50)``."""
    first, _, last = text.partition(":")
    return range(int(first), int(last)) if last else range(int(first))


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
    parser.add_argument(
        "--init-states", type=state_range, default=range(50), help="N (the first N) or A:B (A to B-1)"
    )
    parser.add_argument("--tasks", type=int, nargs="*", default=None)
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--sample", action="store_true", help="sample actions instead of the mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--failure-videos", default=None, help="directory for mp4s of failed episodes")
    parser.add_argument("--max-videos", type=int, default=20)
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
            failure_videos=args.failure_videos,
            max_videos=args.max_videos,
        )
        wall = time.perf_counter() - t0
    finally:
        env.close()
    summary = {
        **summarize(episodes),
        "suite": args.suite,
        "wall_s": wall,
        "args": {**vars(args), "init_states": list(args.init_states)},
    }
    print(format_summary(summary, f"{args.checkpoint or args.policy} on LIBERO-{args.suite.capitalize()}"))
    write_json(args.out, summary)
    return summary


if __name__ == "__main__":
    main()
