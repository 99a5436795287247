"""Success of the scripted LIBERO expert over every (task, init state) pair of a suite.

    python -m benchmarks.libero_expert --suite spatial object [--init-states 50] [--num-envs 2]

The expert reads simulator state (``task_state``), so the envs run with rendering off
(``cameras=()``), one action per step, and LIBERO's own success check and step limits. Prints one
table per suite (per task: successes / trials, rate, 95% Wilson interval) and writes
``runs/benchmarks/libero_expert.json``.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.evaluate import format_summary, frame_ids, run_frames, summarize
from benchmarks.report import write_json
from nets.errors import program_name, run_cli


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
        policy = LiberoExpert(env.single_observation_space, env.single_action_space)
        t0 = time.perf_counter()
        episodes = run_frames(
            env, policy, frame_ids(env.unwrapped.initial_frames, init_states, None), seed=seed
        )
        wall = time.perf_counter() - t0
    finally:
        env.close()
    return {
        **summarize(episodes),
        "suite": suite,
        "wall_s": wall,
        "unsupported_steps": policy.unsupported_steps,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--suite", nargs="+", default=["spatial", "object"])
    parser.add_argument("--init-states", type=int, default=50, help="first N init states of each task")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/libero_expert.json")
    args = parser.parse_args(argv)
    results = {}
    for suite in args.suite:
        results[suite] = res = evaluate_suite(suite, args.init_states, args.num_envs, args.seed)
        print(format_summary(res, f"scripted expert, LIBERO-{suite.capitalize()} ({res['wall_s']:.0f} s)"))
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    run_cli(main)
