"""Do the trainers learn, and how fast? PPO, GRPO and SAC learning figures, with Stable-Baselines3
2.9's PPO and SAC trained side by side in the same process on the same task, budget and hardware.

* PPO, CartPole-v1, 100k env steps, 8 envs, the rl-zoo3 hyperparameters (target: mean return >= 475)
* PPO, InvertedPendulum-v5, 200k env steps, 1 env, SB3's default hyperparameters (target: >= 900)
* GRPO, CartPole-v1, 150k env steps, 4 groups of 8 (target: >= 300, from ~22 for a random policy)
* SAC, Pendulum-v1, 20k env steps, 1 env, rl-zoo3's learning rate 1e-3, SB3's other defaults
  (target: >= -200; random actions score about -1200)
* SAC, InvertedPendulum-v5, 20k env steps, 1 env, SB3's default hyperparameters (target: >= 900)

Every trained policy is scored by the same evaluator: 10 deterministic episodes on a fresh env,
reset seeds 10000..10009. Time is the wall-clock of building and training (no evaluation, no
TensorBoard, one checkpoint at the end for ours), and the process's CPU time over the same span:
both libraries run with one torch thread, so CPU time is the cost without the wait for other
processes on a shared machine (the ratio to trust there).

    python -m benchmarks.trainer_vs_sb3 [--tasks cartpole pendulum grpo sac sac-mujoco] [--seeds 0 1 2]
    python -m benchmarks.trainer_vs_sb3 --tasks sac --seeds 0 --no-sb3   # ours alone
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from benchmarks.report import write_json
from nets.errors import program_name, run_cli
from trainers.checkpoint import load_policy
from trainers.grpo import GRPOConfig
from trainers.grpo import train as grpo_train
from trainers.metrics import read_metrics
from trainers.ppo import PPOConfig
from trainers.ppo import train as ppo_train
from trainers.run import RunConfig
from trainers.sac import SACConfig
from trainers.sac import train as sac_train

TRAINERS = {"ppo": (PPOConfig, ppo_train), "grpo": (GRPOConfig, grpo_train), "sac": (SACConfig, sac_train)}

EVAL_EPISODES, EVAL_SEED = 10, 10_000


@dataclass
class Task:
    algo: str
    env: str
    steps: int
    target: float
    num_envs: int
    hparams: dict[str, Any] = field(default_factory=dict)  # ours; SB3 gets the same where it applies


TASKS = {
    "cartpole": Task("ppo", "CartPole-v1", 100_000, 475.0, 8, {
        "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0,
        "learning_rate": 1e-3, "lr_schedule": "linear", "clip_schedule": "linear",
    }),
    "pendulum": Task("ppo", "InvertedPendulum-v5", 200_000, 900.0, 1),
    "grpo": Task("grpo", "CartPole-v1", 150_000, 300.0, 32, {
        "group_size": 8, "learning_rate": 3e-3, "weight_decay": 0.0, "log_prob_level": "chunk",
    }),
    "sac": Task("sac", "Pendulum-v1", 20_000, -200.0, 1, {"learning_rate": 1e-3}),
    "sac-mujoco": Task("sac", "InvertedPendulum-v5", 20_000, 900.0, 1),
}  # fmt: skip


def mean_return(act: Any, env_id: str) -> float:
    """Mean return of ``act(obs [1, ...]) -> action [1, ...]`` over the evaluation episodes."""
    env = gym.make(env_id)
    returns = []
    for i in range(EVAL_EPISODES):
        obs, _ = env.reset(seed=EVAL_SEED + i)
        total, done = 0.0, False
        while not done:
            obs, reward, term, trunc, _ = env.step(act(obs[None])[0])
            total += float(reward)
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def run_ours(task: Task, seed: int, out: Path) -> dict[str, Any]:
    run = RunConfig(env=task.env, num_envs=task.num_envs, total_steps=task.steps, seed=seed,
                    run_dir=str(out), eval_every=-1, checkpoint_every=0, keep_checkpoints=1,
                    tensorboard=False, video=False, progress=False)  # fmt: skip
    start, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):  # the run's own summary table
        config_cls, trainer = TRAINERS[task.algo]
        trainer.train(run, config_cls(**task.hparams))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    env = gym.make(task.env)
    policy = load_policy(out, env.observation_space, env.action_space)
    space = env.action_space

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            a = policy.act(torch.as_tensor(obs, dtype=torch.float32), deterministic=True).actions[:, 0]
        a = a.numpy()
        return (
            a[:, 0].astype(np.int64)
            if isinstance(space, gym.spaces.Discrete)
            else np.clip(a, space.low, space.high)
        )

    rows = read_metrics(out)
    steps = int(rows[-1]["step"])
    curve = [(r["step"], r["env/return"]) for r in rows if "env/return" in r]
    return {"seconds": seconds, "cpu_seconds": cpu, "return": mean_return(act, task.env), "steps": steps,
            "curve": curve}  # fmt: skip


def run_sb3(task: Task, seed: int) -> dict[str, Any]:
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env

    hp = {k: v for k, v in task.hparams.items() if not k.endswith("_schedule")}
    if task.hparams.get("lr_schedule") == "linear":
        hp["learning_rate"] = lambda progress, lr=hp["learning_rate"]: progress * lr
    if task.hparams.get("clip_schedule") == "linear":
        hp["clip_range"] = lambda progress: progress * 0.2
    start, cpu = time.perf_counter(), time.process_time()
    env = make_vec_env(task.env, n_envs=task.num_envs, seed=seed)
    model = (SAC if task.algo == "sac" else PPO)("MlpPolicy", env, seed=seed, device="cpu", **hp)
    model.learn(task.steps)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    ret = mean_return(lambda obs: model.predict(obs, deterministic=True)[0], task.env)
    return {"seconds": seconds, "cpu_seconds": cpu, "return": ret, "steps": int(model.num_timesteps)}


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'task':<10} {'trainer':<8} {'seed':>4} {'env steps':>10} {'time (s)':>9} {'CPU (s)':>8} "
        f"{'eval return':>12} {'target':>7}  ok"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = "yes" if r["return"] >= r["target"] else "NO"
        lines.append(f"{r['task']:<10} {r['trainer']:<8} {r['seed']:>4} {r['steps']:>10} "
                     f"{r['seconds']:>9.1f} {r.get('cpu_seconds', math.nan):>8.1f} {r['return']:>12.1f} "
                     f"{r['target']:>7.0f}  {ok}")  # fmt: skip
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "",
        f"{'task':<10} {'trainer':<8} {'mean return':>12} {'min':>7} {'mean time (s)':>14} "
        f"{'time / SB3':>11} {'CPU / SB3':>10}",
    ]
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        sb3 = [r for r in mine if r["trainer"] == "sb3"]
        for trainer in dict.fromkeys(r["trainer"] for r in mine):
            sel = [r for r in mine if r["trainer"] == trainer]
            t = float(np.mean([r["seconds"] for r in sel]))
            ratio = t / float(np.mean([r["seconds"] for r in sb3])) if sb3 else float("nan")
            cpu = [r.get("cpu_seconds", math.nan) for r in sel]
            cpu_ratio = (
                float(np.mean(cpu)) / float(np.mean([r.get("cpu_seconds", math.nan) for r in sb3]))
                if sb3
                else math.nan
            )
            lines.append(f"{task:<10} {trainer:<8} {np.mean([r['return'] for r in sel]):>12.1f} "
                         f"{min(r['return'] for r in sel):>7.1f} {t:>14.1f} {ratio:>11.2f} "
                         f"{cpu_ratio:>10.2f}")  # fmt: skip
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    tasks = list(dict.fromkeys(r["task"] for r in rows if "curve" in r))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for r in rows:
            if r["task"] == task and "curve" in r and r["curve"]:
                steps, returns = zip(*r["curve"])
                ax.plot(steps, returns, label=f"seed {r['seed']}")
        ax.axhline(TASKS[task].target, color="k", lw=0.8, ls="--")
        ax.set(
            title=f"{TASKS[task].algo} {TASKS[task].env}",
            xlabel="env steps",
            ylabel="training episode return",
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=program_name(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--no-sb3", action="store_true", help="skip the Stable-Baselines3 runs")
    parser.add_argument("--out", type=Path, default=Path("runs/benchmarks"))
    parser.add_argument("--json", type=Path, default=None, help="default: OUT/trainer_vs_sb3.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # pay torch's one-off optimizer imports up front
    rows = []
    for name in args.tasks:
        task = TASKS[name]
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as tmp:
                r = run_ours(task, seed, Path(tmp) / "run")
            rows.append({"task": name, "trainer": "ours", "seed": seed, "target": task.target, **r})
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            if task.algo != "grpo" and not args.no_sb3:
                rows.append({"task": name, "trainer": "sb3", "seed": seed, "target": task.target,
                             **run_sb3(task, seed)})  # fmt: skip
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    print(summary(rows))
    plot(rows, args.out / "trainer_vs_sb3.png")
    write_json(args.json or args.out / "trainer_vs_sb3.json", rows)


if __name__ == "__main__":
    run_cli(main)
