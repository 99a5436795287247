"""Does SB3 learn as well through our adapter as on its own vec env? PPO on CartPole-v1, side by side.

Both runs use SB3 2.9 PPO with the rl-zoo3 CartPole hyperparameters, 8 envs, the same budget and
seeds, one torch thread, in one process:

* ``sb3``: SB3's own ``make_vec_env("CartPole-v1", 8)`` (a ``DummyVecEnv`` of single envs);
* ``adapter``: ``envs.adapters.sb3.SB3VecEnv`` over gymnasium's
  ``make_vec("CartPole-v1", 8, vectorization_mode="sync", autoreset_mode=SAME_STEP)``.

Scores: 10 deterministic episodes on a fresh env (seeds 10000..10009) with the trained model.

    python -m benchmarks.sb3_adapter [--steps 100000] [--seeds 0 1 2] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from benchmarks.report import write_json
from nets.errors import program_name, run_cli

HPARAMS = {
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": 1e-3,
}  # fmt: skip  (rl-zoo3; schedules omitted)
NUM_ENVS, EVAL_SEED = 8, 10_000


def make_env(kind: str, seed: int):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecMonitor

    from envs.adapters.sb3 import SB3VecEnv

    if kind == "sb3":
        return make_vec_env("CartPole-v1", n_envs=NUM_ENVS, seed=seed)
    vec = gym.make_vec("CartPole-v1", NUM_ENVS, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})  # fmt: skip
    venv = VecMonitor(SB3VecEnv(vec))
    venv.seed(seed)
    return venv


def evaluate(model) -> float:
    env = gym.make("CartPole-v1")
    returns = []
    for k in range(10):
        obs, _ = env.reset(seed=EVAL_SEED + k)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, term, trunc, _ = env.step(int(action))
            total, done = total + float(reward), term or trunc
        returns.append(total)
    return float(np.mean(returns))


def run(kind: str, seed: int, steps: int) -> dict:
    from stable_baselines3 import PPO

    t0 = time.perf_counter()
    env = make_env(kind, seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", **HPARAMS)
    model.learn(steps)
    wall = time.perf_counter() - t0
    env.close()
    return {"kind": kind, "seed": seed, "return": evaluate(model), "seconds": wall}


def main() -> None:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", type=Path, default=Path("runs/benchmarks/sb3_adapter.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for seed in args.seeds:
        for kind in ("sb3", "adapter"):  # interleaved, so machine noise hits both alike
            rows.append(run(kind, seed, args.steps))
            r = rows[-1]
            print(
                f"{r['kind']:<8} seed {r['seed']}: return {r['return']:.1f} in {r['seconds']:.1f} s",
                flush=True,
            )
    print(f"\nSB3 PPO on CartPole-v1, {args.steps} steps, {NUM_ENVS} envs, seeds {args.seeds}:")
    print(f"{'vec env':<10}{'mean return':>12}{'min':>8}{'mean s':>9}")
    for kind in ("sb3", "adapter"):
        mine = [r for r in rows if r["kind"] == kind]
        ret = [r["return"] for r in mine]
        print(f"{kind:<10}{np.mean(ret):>12.1f}{min(ret):>8.1f}{np.mean([r['seconds'] for r in mine]):>9.1f}")
    write_json(args.json, rows)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    run_cli(main)
