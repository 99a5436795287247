"""SFT then RL on LIBERO, in miniature: the scripted expert, the behaviour-cloned policy kept in
the repository, and that policy after a fixed GRPO budget, in one table.

    python -m benchmarks.sft_then_rl                 # about 30 minutes on 2 CPU cores
    python -m benchmarks.sft_then_rl --rl-steps 4000 --expert-init-states 2 --eval-init-states 40 41

GRPO runs the main job's recipe (``configs/libero_spatial_grpo.json``: its env, training init
states, starting checkpoint, policy and GRPO settings) for ``--rl-steps`` env steps. The BC policy
before and after is evaluated with deterministic actions on every held-out init state of the recipe's
eval env (40-49 of each task: 100 episodes); the expert runs on the first ``--expert-init-states``
init states of every task (rendering off, one action per step). Success: LIBERO's own check.
Intervals: 95% Wilson; the before/after change is tested with an exact McNemar test on the (task,
init state) pairs whose outcome changed. Writes the table, ``sft_then_rl.json`` and
``training_success.png`` (sampled success per GRPO iteration) under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from benchmarks.evaluate import frame_ids, rate_cell, run_frames, summarize
from benchmarks.libero_expert import evaluate_suite
from benchmarks.report import plot_lines, table, write_json
from benchmarks.rl_recipe_study import sampled_success
from nets.errors import program_name, run_cli
from trainers.metrics import mcnemar_p


def suite_env(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> Any:
    """The whole suite (every init state), so that frame ids address any (task, init state)."""
    import gymnasium as gym

    kwargs = {k: v for k, v in env_kwargs.items() if k != "init_states"}
    return gym.make_vec(env_id, num_envs=num_envs, autoreset_mode="Disabled", **kwargs)


def evaluate_checkpoint(
    checkpoint: str, env_id: str, env_kwargs: dict, states: list[int], args
) -> list[dict]:
    """One deterministic episode per (task, state)."""
    from trainers.checkpoint import load_policy

    env = suite_env(env_id, env_kwargs, args.num_envs)
    try:
        policy = load_policy(checkpoint, env.single_observation_space, env.single_action_space).eval()
        return run_frames(env, policy, frame_ids(env.unwrapped.initial_frames, states), seed=args.seed)
    finally:
        env.close()


def run_grpo(recipe: dict[str, Any], run_dir: Path, args) -> Path:
    """GRPO from the BC checkpoint with the main job's recipe (its env, init states, policy and
    GRPO settings), for ``--rl-steps``, without its evaluations; returns the run directory."""
    from trainers.grpo.algorithm import GRPOConfig
    from trainers.grpo.train import train
    from trainers.run import RunConfig

    run = dataclasses.replace(
        RunConfig(**recipe["run"]),
        total_steps=args.rl_steps,
        seed=args.seed,
        run_dir=str(run_dir),
        eval_every=-1,  # evaluated by this script, on all held-out states
        eval_at_start=False,
        video=False,
        checkpoint_every=0,
        overwrite=True,  # a rerun trains again from scratch
    )
    train(run, GRPOConfig(**recipe["grpo"]))
    return run_dir


def compare(expert: dict, before: dict, after: dict, pairs: dict[str, int]) -> tuple[list[str], list[list]]:
    by_task = [{r["task"]: r for r in s["tasks"]} for s in (expert, before, after)]
    header = ["task", "expert", "BC (held out)", "BC + GRPO (held out)"]
    rows = [[task[:48], *(rate_cell(t.get(task)) for t in by_task)] for task in by_task[0]]
    rows.append(["all tasks", rate_cell(expert), rate_cell(before), rate_cell(after)])
    rows.append(
        [
            "change after GRPO",
            "",
            "",
            f"{after['rate'] - before['rate']:+.1%} (+{pairs['gained']} -{pairs['lost']} pairs, "
            f"McNemar p={pairs['p']:.3f})",
        ]
    )
    return header, rows


def main(argv: list[str] | None = None) -> dict:
    from trainers.config import load_config
    from trainers.grpo.algorithm import GRPOConfig
    from trainers.run import RunConfig

    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="configs/libero_spatial_grpo.json")
    parser.add_argument("--rl-steps", type=int, default=None, help="GRPO env steps (default: the recipe's)")
    parser.add_argument("--expert-init-states", type=int, default=50, help="first N init states of each task")
    parser.add_argument("--eval-init-states", type=int, nargs="+", default=None, help="default: the recipe's")
    parser.add_argument("--num-envs", type=int, default=8, help="envs of the evaluations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/sft_then_rl")
    args = parser.parse_args(argv)
    recipe = load_config(args.recipe, {"run": RunConfig, "grpo": GRPOConfig})
    run = recipe["run"]
    args.rl_steps = args.rl_steps or run["total_steps"]
    train_states = run["env_kwargs"]["init_states"]
    held_out = args.eval_init_states or run["eval_env_kwargs"]["init_states"]
    if set(held_out) & set(train_states):
        parser.error(f"evaluation init states {held_out} overlap the training ones")
    import envs  # noqa: F401  (registers the ids)

    env_id, out = run["env"].split(":")[-1], Path(args.out)
    times = {}
    t0 = time.perf_counter()
    suite = env_id.split("-")[1].lower()  # Libero-Spatial-v0 -> spatial
    expert = evaluate_suite(suite, args.expert_init_states, args.num_envs, args.seed)
    times["expert"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    before_eps = evaluate_checkpoint(run["init_policy"], env_id, run["env_kwargs"], held_out, args)
    times["bc_eval"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_dir = run_grpo(recipe, out / "grpo", args)
    times["grpo"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    after_eps = evaluate_checkpoint(str(run_dir), env_id, run["env_kwargs"], held_out, args)
    times["grpo_eval"] = time.perf_counter() - t0

    outcome = {ep["frame"]: ep["success"] for ep in before_eps}
    gained = sum(ep["success"] and not outcome[ep["frame"]] for ep in after_eps)
    lost = sum(outcome[ep["frame"]] and not ep["success"] for ep in after_eps)
    pairs = {"gained": gained, "lost": lost, "p": mcnemar_p(gained, lost)}
    before, after = summarize(before_eps), summarize(after_eps)
    header, rows = compare(expert, before, after, pairs)
    title = (
        f"{env_id}: expert on init states 0-{args.expert_init_states - 1}; BC and BC + GRPO "
        f"({args.rl_steps} env steps on init states {train_states[0]}-{train_states[-1]}) "
        f"on init states {held_out[0]}-{held_out[-1]}"
    )
    text = table(header, rows, title)
    print(text)
    print("wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    steps, success = sampled_success(run_dir)
    plot_lines(
        out / "training_success.png",
        {"sampled success per iteration": (steps, success)},
        xlabel="env steps",
        ylabel="success",
        title=f"GRPO from BC on {env_id} (training init states)",
    )
    result = {
        "expert": expert,
        "bc": before,
        "bc_grpo": after,
        "pairs": pairs,
        "training_curve": {"env_steps": steps, "success": success},
        "wall_s": times,
        "args": vars(args),
        "table": text,
    }
    write_json(out / "sft_then_rl.json", result)
    return result


if __name__ == "__main__":
    run_cli(main)
