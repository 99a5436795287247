"""The training loop's env steps/s against the env's own rate, side by side in one run.

    python -m benchmarks.training_throughput                    # the main job's recipe, ~10 minutes
    python -m benchmarks.training_throughput --iterations 3 --bare-seconds 60

Three rows, same env (the recipe's: state-only LIBERO-Spatial, its env count and kwargs), one
after the other in this process:

* ``env, random actions``: what ``benchmarks.env_throughput --cameras 0`` measures (uniform actions
  scaled by 0.3, an env reset when its episode ends). The arm barely touches anything, so the
  physics is cheaper than under a real policy.
* ``env, policy actions``: the env alone driven by the recipe's starting policy (its sampled
  chunks, the noise settings of the recipe), each env reset to a random training frame as soon as
  its episode ends. This is the rate the trainer could reach: the same contacts, no learning.
* ``training loop``: the recipe's trainer (GRPO or PPO) for ``--iterations`` iterations; its rate
  is taken from its own metrics over iterations 2 to N (start-up excluded): group resets, waiting
  for a group's last episode, the policy updates included.

Writes ``training_throughput.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import table, write_json
from nets.errors import program_name, run_cli


def bare_rate(
    env_id: str, env_kwargs: dict, num_envs: int, run: dict, seconds: float, seed: int, policy: bool
) -> float:
    """Env steps/s of the env alone, with the recipe's starting policy (``policy``) or random actions."""
    import gymnasium as gym
    import torch

    from trainers.checkpoint import build_policy

    env = gym.make_vec(env_id, num_envs=num_envs, autoreset_mode="Disabled", **env_kwargs)
    try:
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(seed=seed)
        actor = None
        if policy:
            actor, _ = build_policy(
                run.get("policy", "auto"),
                {"use_critic": False, **run.get("policy_kwargs", {})},
                env.single_observation_space,
                env.single_action_space,
                init_policy=run.get("init_policy"),
            )
            actor.seed(seed)
        low, high = env.single_action_space.low, env.single_action_space.high
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if actor is not None:
                with torch.no_grad():
                    actions = actor.act(obs).actions.numpy()
            else:
                actions = (rng.uniform(-1, 1, env.action_space.shape) * 0.3).astype(np.float32)
            obs, _, terminated, truncated, info = env.step(np.clip(actions, low, high))
            steps += int(np.asarray(info["chunk_valid"]).sum())
            done = np.logical_or(terminated, truncated)
            if done.any():
                obs, _ = env.reset(options={"reset_mask": done})
        return steps / (time.perf_counter() - t0)
    finally:
        env.close()


def loop_rate(recipe: dict[str, Any], iterations: int, out: Path, seed: int) -> tuple[float, str]:
    """Env steps/s of the recipe's trainer over iterations 2..N, and the algorithm's name."""
    import dataclasses

    from trainers.config import build
    from trainers.grpo.algorithm import GRPOConfig
    from trainers.grpo.train import train as train_grpo
    from trainers.ppo.algorithm import PPOConfig
    from trainers.ppo.train import train as train_ppo
    from trainers.run import RunConfig

    algo = "ppo" if "ppo" in recipe and "grpo" not in recipe else "grpo"
    run = dataclasses.replace(
        build(RunConfig, recipe["run"]),
        total_steps=10**9,
        max_iterations=iterations,
        seed=seed,
        run_dir=str(out / "run"),
        eval_every=-1,
        eval_at_start=False,
        video=False,
        checkpoint_every=0,
        progress=True,
        tensorboard=False,
        overwrite=True,  # each measurement starts a fresh run in the same folder
    )
    if algo == "grpo":
        train_grpo(run, GRPOConfig(**recipe["grpo"]))
    else:
        train_ppo(run, PPOConfig(**recipe["ppo"]))
    metrics = (out / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in metrics if "time/elapsed" in line]
    first, last = rows[0], rows[-1]
    return (last["step"] - first["step"]) / (last["time/elapsed"] - first["time/elapsed"]), algo


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="configs/libero_spatial_grpo.json")
    parser.add_argument(
        "--iterations", type=int, default=4, help="training iterations (the first is start-up)"
    )
    parser.add_argument("--bare-seconds", type=float, default=120.0, help="seconds of each env-alone row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/training_throughput")
    args = parser.parse_args(argv)
    import envs  # noqa: F401  (registers the ids)

    recipe = json.loads(Path(args.recipe).read_text())
    run = recipe["run"]
    env_id, kwargs, n = run["env"].split(":")[-1], run["env_kwargs"], run["num_envs"]
    out = Path(args.out)
    rows = []
    for name, policy in (("env, random actions", False), ("env, policy actions", True)):
        rate = bare_rate(env_id, kwargs, n, run, args.bare_seconds, args.seed, policy)
        rows.append({"what": name, "steps_per_s": rate})
        print(f"{name}: {rate:.1f} env steps/s", flush=True)
    rate, algo = loop_rate(recipe, args.iterations, out, args.seed)
    rows.append({"what": f"training loop ({algo})", "steps_per_s": rate})
    bare = rows[1]["steps_per_s"]
    body = [[r["what"], r["steps_per_s"], r["steps_per_s"] / bare] for r in rows]
    print(table(["", "env steps/s", "x env with policy actions"], body, f"{env_id}, {n} envs, {kwargs}"))
    write_json(out / "training_throughput.json", {"rows": rows, "args": vars(args), "env_kwargs": kwargs})
    return rows


if __name__ == "__main__":
    run_cli(main)
