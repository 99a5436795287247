"""Success rate of a policy over a LIBERO suite's tasks x init states, the way LIBERO results are
reported: per task and overall, with 95% Wilson intervals, and the mean and spread over seeds.

    python -m benchmarks.evaluate --checkpoint checkpoints/bc_libero_spatial_state.pt --init-states 40:50 \\
        --env-kwargs '{"cameras": ["agentview"], "task_state": true, "chunk_size": 8}' \\
        --failure-videos runs/failures
    python -m benchmarks.evaluate --policy libero_expert --suite object \\
        --env-kwargs '{"chunk_size": null, "cameras": [], "task_state": true}'
    python -m benchmarks.evaluate --policy openvla_oft --policy-kwargs '{"model_path": "ckpts/oft"}' \\
        --env-kwargs '{"cameras": ["agentview", "wrist"], "chunk_size": 8}' --seeds 0 1 2 --temperature 1.0

The field's protocol is the default: every task x the suite's 50 init states (``--init-states``,
``--tasks`` narrow it), one episode per pair and seed, deterministic actions unless ``--sample``
(or ``--temperature T``, which samples at T where the policy has a temperature). A policy comes
from ``--checkpoint`` (a run or checkpoint; ``--policy-kwargs`` override its saved arguments) or
``--policy NAME --policy-kwargs JSON`` (a ``model_path`` included). Prints the per-task table
pooled over the seeds and each seed's overall rate, and writes JSON (``--out``);
``--failure-videos DIR`` keeps an mp4 of each failed episode (up to ``--max-videos``; the env must
render the agent view: add ``"cameras": ["agentview"]``).

Across LIBERO-Pro's perturbation categories (``envs/libero/pro.py``), one table per category and the
pooled rate, each with its Wilson interval; ``standard`` is the suite itself. Each finished category is
saved at once in ``--out``, and a sweep run again with the same settings skips them (resume);
``--against OTHER.json`` (the same sweep of another policy) adds the paired comparison on the same
(category, task, init state, seed) episodes, exact McNemar per category and pooled:

    python -m benchmarks.evaluate --policy libero_expert --categories standard lan with_milk task \
        --env-kwargs '{"chunk_size": null, "cameras": [], "task_state": true}' --out runs/expert.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import table, write_json
from nets.errors import BadInput, program_name, reading, run_cli
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
    on_episode: Callable[[dict], None] | None = None,
) -> list[dict]:
    """One episode from each initial frame id of a DISABLED-mode env, ``num_envs`` at a time
    (``on_episode`` is called with each as it ends: a sweep saves it).

    With ``failure_videos`` (a directory) the first ``max_videos`` failed episodes are written as
    mp4s of the camera image the policy saw before each chunk (the env must render ``image``)."""
    from trainers.demos import collect_episodes
    from trainers.evaluation import write_video

    if failure_videos is not None and "image" not in env.single_observation_space.spaces:
        raise BadInput("failure videos need an env that renders 'image' (cameras=['agentview'])")
    from tqdm import tqdm

    out, videos = [], 0
    frames = env.unwrapped.initial_frames
    episodes = collect_episodes(env, policy, len(ids), seed=seed, deterministic=deterministic, frame_ids=ids)
    for ep in tqdm(episodes, total=len(ids), desc=f"evaluate (seed {seed})", unit="episode"):
        state = int(frames.locate(ep.initial_frame)[1])  # the task's init state (the env's frame id differs)
        out.append(
            {"frame": ep.initial_frame, "init_state": state, "task": ep.task, "success": ep.success,
             "length": ep.length}
        )  # fmt: skip
        if on_episode is not None:
            on_episode(out[-1])
        if failure_videos is not None and not ep.success and videos < max_videos:
            name = f"{ep.task.split('/')[-1][:60]}_seed{seed}_init{state}.mp4"
            write_video(Path(failure_videos) / name, list(ep.obs["image"]), fps=5)
            videos += 1
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


def seed_spread(episodes: list[dict]) -> dict:
    """Each seed's overall success rate, and their mean and standard deviation (N - 1; 0 for one
    seed): the spread across seeds the field reports beside the pooled rate."""
    seeds = sorted({ep["seed"] for ep in episodes})
    rates = []
    for seed in seeds:
        eps = [ep for ep in episodes if ep["seed"] == seed]
        rates.append({"seed": seed, "successes": sum(ep["success"] for ep in eps), "trials": len(eps)})
        rates[-1]["rate"] = rates[-1]["successes"] / len(eps)
    values = np.array([r["rate"] for r in rates])
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return {"per_seed": rates, "seed_mean": float(values.mean()), "seed_std": std}


def rate_cell(r: dict | None) -> str:
    """``k/n rate [low, high]`` of a ``summarize`` row (or the whole summary); ``-`` for None."""
    if r is None:
        return "-"
    return f"{r['successes']}/{r['trials']} {r['rate']:.0%} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"


def format_summary(summary: dict, title: str) -> str:
    from trainers.metrics import format_table

    rows = [(r["task"][:64], rate_cell(r)) for r in summary["tasks"]]
    rows.append(("all tasks", rate_cell(summary)))
    for r in summary.get("per_seed", []) if len(summary.get("per_seed", [])) > 1 else []:
        rows.append((f"seed {r['seed']}", f"{r['successes']}/{r['trials']} {r['rate']:.0%}"))
    if len(summary.get("per_seed", [])) > 1:
        rows.append(("mean +- std over seeds", f"{summary['seed_mean']:.1%} +- {summary['seed_std']:.1%}"))
    return format_table(rows, title=title)


def frame_ids(frames: Any, init_states: int | Sequence[int], tasks: Sequence[int] | None = None) -> list[int]:
    """Ids of the chosen init states (an int N: the first N) of the chosen tasks (default all)."""
    states = set(range(init_states)) if isinstance(init_states, int) else set(init_states)
    ids = []
    for i in range(len(frames)):
        task, state = frames.locate(i)
        if state in states and (tasks is None or task in tasks):
            ids.append(i)
    if not ids:  # an evaluation over zero trials reports nothing
        known_tasks = sorted({frames.locate(i)[0] for i in range(len(frames))})
        raise BadInput(
            f"--init-states {sorted(states)} and --tasks {tasks} select no (task, init state) pair of "
            f"this suite (tasks {known_tasks[0]}-{known_tasks[-1]}, init states of each task from 0)"
        )
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
    from trainers.env_factory import check_env_kwargs

    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="spatial")
    parser.add_argument("--checkpoint", help="a run directory or checkpoint file")
    parser.add_argument("--policy", help="a registered policy name, instead of a checkpoint")
    parser.add_argument(
        "--policy-kwargs",
        type=json.loads,
        default={},
        help="JSON object: the policy's arguments (with --policy; e.g. a model_path), or overrides of "
        "the checkpoint's saved ones",
    )
    parser.add_argument("--env-kwargs", type=json.loads, default={})
    parser.add_argument(
        "--init-states", type=state_range, default=range(50), help="N (the first N) or A:B (A to B-1)"
    )
    parser.add_argument("--tasks", type=int, nargs="*", default=None)
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--sample", action="store_true", help="sample actions instead of the mode")
    parser.add_argument(
        "--temperature", type=float, default=None, help="sample at this temperature (policies that have one)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one pass over the pairs per seed")
    parser.add_argument("--seed", type=int, default=None, help="one seed (the same as --seeds SEED)")
    parser.add_argument("--failure-videos", default=None, help="directory for mp4s of failed episodes")
    parser.add_argument("--max-videos", type=int, default=20)
    parser.add_argument(
        "--categories",
        nargs="+",
        default=None,
        help="LIBERO-Pro (or, with --benchmark plus, LIBERO-Plus) categories of the suite to sweep "
        "('standard': the suite itself); resumable",
    )
    parser.add_argument(
        "--benchmark",
        choices=("pro", "plus"),
        default="pro",
        help="whose --categories: LIBERO-Pro's (envs/libero/pro.py) or LIBERO-Plus's (envs/libero/plus.py)",
    )
    parser.add_argument("--against", default=None, help="with --categories: another sweep's JSON to compare")
    parser.add_argument("--out", default="runs/benchmarks/evaluate.json")
    args = parser.parse_args(argv)
    if args.categories:
        return sweep_categories(parser, args)
    if (args.checkpoint is None) == (args.policy is None):
        parser.error("give exactly one of --checkpoint and --policy")
    if not isinstance(args.policy_kwargs, dict) or not isinstance(args.env_kwargs, dict):
        parser.error("--policy-kwargs and --env-kwargs take a JSON object")
    if args.temperature is not None and not args.temperature > 0:
        parser.error(f"--temperature must be > 0, got {args.temperature}")
    seeds = [args.seed] if args.seed is not None else list(args.seeds)
    sample = args.sample or args.temperature is not None
    env_id = f"Libero-{args.suite.capitalize()}-v0"
    check_env_kwargs(env_id, args.env_kwargs, "--env-kwargs")
    # the env holds the chosen init states (ids past a task's official ones are fresh states, made on
    # demand), unless --env-kwargs names its own
    env_kwargs = {"init_states": list(args.init_states), **args.env_kwargs}
    with reading(f"--env-kwargs {args.env_kwargs}", TypeError):
        env = gym.make_vec(env_id, num_envs=args.num_envs, autoreset_mode="Disabled", **env_kwargs)
    try:
        obs_space, act_space = env.single_observation_space, env.single_action_space
        if args.checkpoint:
            policy = load_policy(args.checkpoint, obs_space, act_space, policy_kwargs=args.policy_kwargs)
        else:
            policy = make_policy(args.policy, obs_space, act_space, **args.policy_kwargs)
        if args.temperature is not None:
            if not hasattr(policy, "temperature"):
                raise BadInput(f"--temperature: {type(policy).__name__} has no sampling temperature")
            policy.temperature = float(args.temperature)
        policy.eval()
        ids = frame_ids(env.unwrapped.initial_frames, args.init_states, args.tasks)
        t0 = time.perf_counter()
        episodes = []
        for seed in seeds:
            policy.seed(seed)
            videos = args.max_videos - sum(not ep["success"] for ep in episodes)
            for ep in run_frames(
                env,
                policy,
                ids,
                seed=seed,
                deterministic=not sample,
                failure_videos=args.failure_videos,
                max_videos=max(videos, 0),
            ):
                episodes.append({**ep, "seed": seed})
        wall = time.perf_counter() - t0
    finally:
        env.close()
    summary = {
        **summarize(episodes),
        **seed_spread(episodes),
        "suite": args.suite,
        "wall_s": wall,
        "args": {**vars(args), "seeds": seeds, "init_states": list(args.init_states)},
    }
    print(format_summary(summary, f"{args.checkpoint or args.policy} on LIBERO-{args.suite.capitalize()}"))
    write_json(args.out, summary)
    return summary


def _make_policy(args: argparse.Namespace, env: Any) -> Any:
    from policies.registry import make_policy
    from trainers.checkpoint import load_policy

    obs_space, act_space = env.single_observation_space, env.single_action_space
    if args.checkpoint:
        return load_policy(args.checkpoint, obs_space, act_space, policy_kwargs=args.policy_kwargs)
    return make_policy(args.policy, obs_space, act_space, **args.policy_kwargs)


def sweep_categories(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """``--categories``: every category's episodes, a per-category table and the pooled rate, saved
    after each category (a rerun with the same settings resumes); ``--against``: paired comparison."""
    import gymnasium as gym

    from envs.libero import plus, pro
    from trainers.metrics import format_table, mcnemar_p

    if (args.checkpoint is None) == (args.policy is None):
        parser.error("give exactly one of --checkpoint and --policy")
    if args.benchmark == "plus":
        known, category_tasks = (lambda suite: list(plus.CATEGORIES)), plus.plus_tasks
    else:
        known, category_tasks = pro.categories, pro.pro_tasks
    unknown = [c for c in args.categories if c != "standard" and c not in known(args.suite)]
    if unknown:  # before any simulator starts
        parser.error(
            f"unknown categories {unknown} of {args.suite!r}: 'standard' or one of {known(args.suite)}"
        )
    settings = {k: v for k, v in vars(args).items() if k not in ("categories", "against", "out")}
    settings["init_states"] = list(args.init_states)
    out = Path(args.out)
    done = json.loads(out.read_text()) if out.is_file() else {}
    if done.get("settings") != settings:
        done = {"settings": settings, "categories": {}}
    seeds = [args.seed] if args.seed is not None else list(args.seeds)
    for category in args.categories:
        if category in done["categories"]:
            print(f"{category}: done in {out}, kept")
            continue
        kwargs = {} if category == "standard" else {"category": category, "benchmark": args.benchmark}
        skipped = []
        if category != "standard" and args.tasks is None:  # the tasks its data can build
            tasks = category_tasks(args.suite, category)
            skipped = [t.index for t in tasks if t.problem]
            if len(skipped) == len(tasks):
                raise BadInput(f"category {category!r}: none of its tasks can be built ({tasks[0].problem})")
            if skipped:
                kwargs["task_ids"] = [t.index for t in tasks if not t.problem]
                print(f"{category}: tasks {skipped} cannot be built from the installed data; left out")
        env = gym.make_vec(
            f"Libero-{args.suite.capitalize()}-v0",
            num_envs=args.num_envs,
            autoreset_mode="Disabled",
            **kwargs,
            **args.env_kwargs,
        )
        try:
            policy = _make_policy(args, env)
            policy.eval()
            ids = frame_ids(env.unwrapped.initial_frames, args.init_states, None if skipped else args.tasks)
            episodes = done.setdefault("partial", {}).setdefault(category, [])  # saved after each episode
            finished = {(ep["seed"], ep["frame"]) for ep in episodes}
            if finished:
                print(f"{category}: {len(finished)} episodes done in {out}, kept")

            def keep(ep: dict, seed: int, episodes: list = episodes) -> None:
                episodes.append({**ep, "seed": seed})
                write_json(out, done)

            for seed in seeds:
                todo = [i for i in ids if (seed, i) not in finished]
                policy.seed(seed)  # deterministic episodes do not depend on it; sampled ones resume anew
                run_frames(
                    env,
                    policy,
                    todo,
                    seed=seed,
                    deterministic=not args.sample,
                    on_episode=lambda e, s=seed: keep(e, s),
                )
        finally:
            env.close()
        del done["partial"][category]
        if not done["partial"]:
            del done["partial"]
        done["categories"][category] = {
            "episodes": episodes,
            "tasks_left_out": skipped,
            **summarize(episodes),
        }
        write_json(out, done)  # a finished category is never run again
    chosen = {c: done["categories"][c] for c in args.categories}
    pooled = summarize([ep for c in chosen.values() for ep in c["episodes"]])
    rows = [(c, rate_cell(r)) for c, r in chosen.items()] + [("all categories", rate_cell(pooled))]
    whose = "LIBERO-Plus" if args.benchmark == "plus" else "LIBERO-Pro"
    title = f"{args.checkpoint or args.policy} on LIBERO-{args.suite.capitalize()} by {whose} category"
    print(format_table(rows, title=title))
    result = {**done, "pooled": pooled}
    if args.against:
        other = json.loads(Path(args.against).read_text())["categories"]
        comparison, gained_all, lost_all = [], 0, 0
        for c, r in chosen.items():
            if c not in other:
                continue
            theirs = {(e["task"], e["frame"], e["seed"]): e["success"] for e in other[c]["episodes"]}
            pairs = [
                (e["success"], theirs[key])
                for e in r["episodes"]
                if (key := (e["task"], e["frame"], e["seed"])) in theirs
            ]
            gained = sum(a and not b for a, b in pairs)
            lost = sum(b and not a for a, b in pairs)
            gained_all, lost_all = gained_all + gained, lost_all + lost
            comparison.append((c, len(pairs), f"+{gained} -{lost}", f"{mcnemar_p(gained, lost):.3g}"))
        comparison.append(("pooled", sum(n for _, n, _, _ in comparison), f"+{gained_all} -{lost_all}",
                           f"{mcnemar_p(gained_all, lost_all):.3g}"))  # fmt: skip
        header = ["category", "pairs", f"gained -lost vs {args.against}", "McNemar p"]
        print(table(header, [list(row) for row in comparison], "paired: the same (task, init state, seed)"))
        result["against"] = comparison
    write_json(out, result)
    return result


if __name__ == "__main__":
    run_cli(main)
