"""The CPU recipe for a world-model reward model, end to end on LIBERO-Spatial, in one table.

    python -m benchmarks.reward_model                     # collect (~15 min) then train (~13 min)
    python -m benchmarks.reward_model --collect-only      # the two halves as separate runs,
    python -m benchmarks.reward_model --frames runs/benchmarks/reward_model/frames.h5   # reusing the frames

Collection: the scripted expert (``--expert-episodes``) and the expert with Gaussian action noise
(``--noisy-episodes`` at std ``--noise``: about 60% of those fail, near misses included) over random
(task, init state) pairs, the agent-view camera at the world model's 256x256, a frame every 2
sub-steps, 40 sub-steps past each success (``trainers.reward_model.train.LIBERO_ENV_KWARGS``).
Training: the ResNet-18 layout at width ``--width`` (16: 0.7 M parameters; the real network is 64),
balanced batches, augmentation, ``--steps`` steps. Measured on held-out episodes (a fifth, grouped
by start frame) against LIBERO's own success check. Prints the table and writes ``reward_model.json``
plus the run (model, report, TensorBoard logs) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.report import table, write_json


def recipe(args: argparse.Namespace) -> Any:
    from trainers.reward_model.train import RewardModelConfig

    return RewardModelConfig(
        env=args.env,
        env_kwargs=args.env_kwargs,
        policy=[
            f"libero_expert,episodes={args.expert_episodes}",
            f"libero_expert,noise={args.noise},episodes={args.noisy_episodes}",
        ],  # fmt: skip
        num_envs=args.num_envs,
        frames=args.frames,
        collect_only=args.collect_only,
        frame_size=tuple(args.frame_size),
        width=args.width,
        steps=args.steps,
        batch_size=args.batch_size,
        eval_every=args.eval_every,
        seed=args.seed,
        torch_threads=args.torch_threads,
        out=args.out,
        progress=not args.no_progress,
    )


def results_table(report: dict[str, Any]) -> str:
    d, t = report["data"], report["training"]
    f, e, blur = report["held_out_frames"], report["held_out_episodes"], report["held_out_frames_blurred"]
    rows = [
        ("frames (train / held-out)", f"{d['train']['frames']} / {d['held_out']['frames']}"),
        ("positive frames (train / held-out)", f"{d['train']['positives']} / {d['held_out']['positives']}"),
        ("episodes (train / held-out)", f"{d['train']['episodes']} / {d['held_out']['episodes']}"),
        (
            "successful episodes (train / held-out)",
            f"{d['train']['successful']} / {d['held_out']['successful']}",
        ),
        ("frame size", "x".join(str(s) for s in d["frame_size"])),
        ("collection time (s)", d["collect_s"]),
        ("width (parameters)", f"{t['width']} ({t['parameters']:,})"),
        ("training steps x batch", f"{t['steps']} x {t['batch_size']}"),
        ("training time (s)", t["train_s"]),
        ("held-out precision", f["precision"]),
        ("held-out recall", f["recall"]),
        ("held-out F1", f["f1"]),
        ("held-out F1, frames blurred (sigma 1.5)", blur["f1"]),
        ("confusion: sim yes -> model yes / no", f"{f['tp']} / {f['fn']}"),
        ("confusion: sim no -> model yes / no", f"{f['fp']} / {f['tn']}"),
        ("episodes: 'any frame a success' agrees", e["any_agreement"]),
        ("episodes: final frame agrees", e["final_agreement"]),
        ("episodes: first success frame, mean |offset|", e["onset_mean_abs_frames"]),
    ]
    return table(["", "value"], rows, title=f"Reward model from {report['env']} rollouts")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from trainers.reward_model.train import LIBERO_ENV_KWARGS, run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="envs:Libero-Spatial-v0")
    parser.add_argument("--env-kwargs", type=json.loads, default=dict(LIBERO_ENV_KWARGS))
    parser.add_argument("--expert-episodes", type=int, default=36)
    parser.add_argument("--noisy-episodes", type=int, default=24)
    parser.add_argument("--noise", type=float, default=0.3, help="action noise std of the noisy expert")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument(
        "--frames", help="train from these frames (written by an earlier run) instead of collecting"
    )
    parser.add_argument("--collect-only", action="store_true")
    parser.add_argument("--frame-size", type=int, nargs=2, default=[256, 256])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--eval-every", type=int, default=0, help="held-out curves in TensorBoard (costs time)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--out", default="runs/benchmarks/reward_model")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    report = run(recipe(args))
    if args.collect_only:
        print(f"frames written to {report['frames']} ({report['collect_s']:.0f} s); train with --frames")
        return report
    print(results_table(report))
    write_json(Path(args.out) / "reward_model.json", report)
    return report


if __name__ == "__main__":
    main()
