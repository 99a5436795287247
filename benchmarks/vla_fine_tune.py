"""The VLAs' fine-tuning recipes on the tiny CPU path: each tiny checkpoint (``policies/*/tiny.py``, the
real on-disk layouts) fine-tuned by ``python -m trainers.bc`` with its defaults (the published recipe,
with the settings the tiny folder carries in ``fine_tune_recipe.json``) on the same demos; the loss
of the first and of the last epoch, their ratio and the wall time, then ``benchmarks.evaluate
--checkpoint`` on a few episodes of each result.

    python -m trainers.demos --env envs:Libero-Spatial-v0 --policy libero_expert --episodes 4 \\
        --num-envs 2 --out demos4.h5 --env-kwargs '{"chunk_size": null, "task_state": true, \\
        "image_size": 64, "cameras": ["agentview", "wrist"], "task_ids": [0]}'
    python -m benchmarks.vla_fine_tune --demos demos4.h5 --out runs/vla_fine_tune [--epochs 30] \\
        [--policies openvla_oft pi05 cosmos_policy] [--eval-episodes 2]

The env is LIBERO-Spatial at the demos' image size with both cameras and chunks of 8 (each policy reads
the cameras it uses). ``--torch-threads`` (default 1) is the trainer's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.report import table, write_json
from nets.errors import BadInput, program_name, run_cli

POLICIES = ("openvla_oft", "pi05", "cosmos_policy")


def write_tiny(policy: str, folder: Path) -> Path:
    """The tiny checkpoint of ``policy`` in ``folder``."""
    if policy in ("openvla_oft", "openvla"):
        from policies.openvla_oft.tiny import write_tiny_openvla

        return write_tiny_openvla(folder)
    if policy == "pi05":
        from policies.pi05.tiny import write_tiny_pi05

        return write_tiny_pi05(folder)
    if policy == "cosmos_policy":
        from policies.cosmos_policy.tiny import write_tiny_cosmos_policy

        return write_tiny_cosmos_policy(folder)
    raise BadInput(f"no tiny checkpoint for policy {policy!r}; expected one of {POLICIES}")


def epoch_losses(run_dir: Path) -> list[float]:
    """``train/bc_loss`` of each epoch of a ``trainers.bc`` run (``metrics.jsonl``)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["train/bc_loss"] for r in rows if "train/bc_loss" in r]


def fine_tune(
    policy: str,
    demos: Path,
    out: Path,
    env_kwargs: dict[str, Any],
    epochs: int,
    threads: int,
    extra: list[str],
) -> dict[str, Any]:
    """``trainers.bc`` with its defaults for ``policy``'s tiny checkpoint; its losses and wall time."""
    from trainers import bc

    model = write_tiny(policy, out / "models" / policy)
    run_dir = out / "bc" / policy
    argv = ["--demos", str(demos), "--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps(env_kwargs)]
    argv += ["--policy", policy, "--policy-kwargs", json.dumps({"model_path": str(model)})]
    argv += [
        "--epochs",
        str(epochs),
        "--eval-every",
        "-1",
        "--no-video",
        "--no-tensorboard",
        "--num-envs",
        "1",
    ]
    argv += ["--torch-threads", str(threads), "--run-dir", str(run_dir), *extra]
    start = time.perf_counter()
    bc.main(argv)
    seconds = time.perf_counter() - start
    losses = epoch_losses(run_dir)
    return {
        "policy": policy,
        "run_dir": str(run_dir),
        "epochs": len(losses),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "ratio": losses[0] / losses[-1],
        "seconds": seconds,
        "losses": losses,
    }


def evaluate_run(run_dir: str, env_kwargs: dict[str, Any], episodes: int, out: Path) -> dict[str, Any]:
    """``benchmarks.evaluate --checkpoint`` on ``episodes`` starts of task 0."""
    from benchmarks import evaluate

    start = time.perf_counter()
    summary = evaluate.main(
        ["--checkpoint", run_dir, "--suite", "spatial", "--init-states", str(episodes), "--tasks", "0"]
        + ["--num-envs", "1", "--env-kwargs", json.dumps(env_kwargs), "--out", str(out)]
    )
    return {
        "trials": summary["trials"],
        "success": summary.get("success_rate"),
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog=program_name(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--demos", type=Path, required=True, help="demos with agentview and wrist images")
    parser.add_argument(
        "--out", type=Path, required=True, help="a new folder for the models, runs and results"
    )
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=[*POLICIES, "openvla"])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--eval-episodes", type=int, default=2, help="0: no evaluation")
    parser.add_argument("--max-episode-steps", type=int, default=64, help="of the evaluation episodes")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--bc-args", default="", help="more trainers.bc flags, one string (e.g. '--seed 1')")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        raise BadInput(f"{args.out} is not empty: give a new folder")
    from trainers.datasets import load_demos

    meta = load_demos(args.demos).meta
    size = int(meta.get("env_kwargs", {}).get("image_size", 64))
    env_kwargs = {"image_size": size, "cameras": ["agentview", "wrist"], "chunk_size": 8, "task_ids": [0]}
    rows, results = [], []
    for policy in args.policies:
        env = {**env_kwargs, "chunk_size": None} if policy == "openvla" else env_kwargs
        result = fine_tune(
            policy, args.demos, args.out, env, args.epochs, args.torch_threads, args.bc_args.split()
        )
        if args.eval_episodes > 0:
            rl = {**env, "max_episode_steps": args.max_episode_steps}
            result["eval"] = evaluate_run(
                result["run_dir"], rl, args.eval_episodes, args.out / f"eval_{policy}.json"
            )
        results.append(result)
        evaluated = result.get("eval", {})
        rows.append(
            [policy, result["epochs"], result["loss_first"], result["loss_last"], result["ratio"],
             result["seconds"], evaluated.get("trials", "-"), evaluated.get("seconds", "-")]
        )  # fmt: skip
    print(
        table(
            ["policy", "epochs", "loss epoch 1", "loss last", "ratio", "bc s", "eval trials", "eval s"],
            rows,
            title=f"trainers.bc defaults on the tiny checkpoints ({args.demos})",
        )
    )
    write_json(args.out / "vla_fine_tune.json", results)
    return {"results": results}


if __name__ == "__main__":
    run_cli(main)
