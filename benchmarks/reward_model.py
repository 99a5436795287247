"""The CPU recipe for a world-model reward model, end to end on LIBERO-Spatial, in one table.

    python -m benchmarks.reward_model                     # collect (~15 min) then train (~13 min)
    python -m benchmarks.reward_model --collect-only      # the two halves as separate runs,
    python -m benchmarks.reward_model --frames runs/benchmarks/reward_model/frames.h5   # reusing the frames
    python -m benchmarks.reward_model --collect-only --seed 1 --out runs/benchmarks/reward_model_seed1
    python -m benchmarks.reward_model --frames runs/benchmarks/reward_model/frames.h5 \
        --extra-frames runs/benchmarks/reward_model_seed1/frames.h5    # also an independent collection

Collection: the scripted expert (``--expert-episodes``) and the expert with Gaussian action noise
(``--noisy-episodes`` at std ``--noise``: about half of those fail, near misses included) over random
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
from nets.errors import program_name, run_cli


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


def independent_set(report: dict[str, Any], path: str, out: str) -> dict[str, Any]:
    """The trained model on another collection's episodes, leaving out those that start where a
    training episode started."""
    import numpy as np
    import torch

    from nets.resnet_rm import ResnetRewardModel
    from trainers.reward_model.augment import resize_frames
    from trainers.reward_model.collect import read_frames
    from trainers.reward_model.train import measure

    fs = read_frames(path)
    seen = np.isin(fs.episodes["initial_frame"], report["data"]["train_initial_frames"])
    keep = np.isin(fs.episode, np.flatnonzero(~seen))
    frames = torch.from_numpy(resize_frames(fs.frames[keep], tuple(report["data"]["frame_size"])))
    model = ResnetRewardModel.from_checkpoint(Path(out) / "resnet_rm.pth")
    result = measure(model, frames, fs.labels[keep], fs.episode[keep], fs)
    eps = np.flatnonzero(~seen)
    result["data"] = {"frames_file": path, "episodes": len(eps), "left_out_episodes": int(seen.sum()),
                      "successful": int(fs.episodes["success_once"][eps].sum()), "frames": int(keep.sum()),
                      "positives": int(fs.labels[keep].sum()), "seed": fs.meta.get("seed")}  # fmt: skip
    return result


def results_table(report: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
    """The recipe's numbers: the run's held-out split, and (``extra``) an independent collection."""
    d, t = report["data"], report["training"]
    held = (
        d["held_out"],
        report["held_out_frames"],
        report["held_out_frames_blurred"],
        report["held_out_episodes"],
    )
    sets = [held] + (
        []
        if extra is None
        else [(extra["data"], extra["frames"], extra["frames_blurred"], extra["episodes"])]
    )
    blank = [""] * (len(sets) - 1)

    def row(name: str, value: Any) -> tuple[Any, ...]:
        return (name, *[value(*s) for s in sets])

    rows = [
        ("frames (train)", d["train"]["frames"], *blank),
        ("episodes (train; successful)", f"{d['train']['episodes']}; {d['train']['successful']}", *blank),
        ("frame size", "x".join(str(s) for s in d["frame_size"]), *blank),
        ("collection time (s)", d["collect_s"], *blank),
        ("width (parameters)", f"{t['width']} ({t['parameters']:,})", *blank),
        ("training steps x batch", f"{t['steps']} x {t['batch_size']}", *blank),
        ("training time (s)", t["train_s"], *blank),
        row("evaluated episodes (successful)", lambda n, f, b, e: f"{n['episodes']} ({n['successful']})"),
        row("evaluated frames (positive)", lambda n, f, b, e: f"{n['frames']} ({n['positives']})"),
        row("precision", lambda n, f, b, e: f["precision"]),
        row("recall", lambda n, f, b, e: f["recall"]),
        row("F1", lambda n, f, b, e: f["f1"]),
        row("F1, frames blurred (sigma 1.5)", lambda n, f, b, e: b["f1"]),
        row("confusion: sim yes -> model yes / no", lambda n, f, b, e: f"{f['tp']} / {f['fn']}"),
        row("confusion: sim no -> model yes / no", lambda n, f, b, e: f"{f['fp']} / {f['tn']}"),
        row("episodes: 'any frame a success' agrees", lambda n, f, b, e: e["any_agreement"]),
        row("  model yes, sim no / model no, sim yes", lambda n, f, b, e: f"{e['any_fp']} / {e['any_fn']}"),
        row("episodes: final frame agrees", lambda n, f, b, e: e["final_agreement"]),
        row("first success frame, mean |offset| (frames)", lambda n, f, b, e: e["onset_mean_abs_frames"]),
    ]
    header = ["", "held-out episodes"] + (["independent collection"] if extra is not None else [])
    return table(header, rows, title=f"Reward model from {report['env']} rollouts")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from trainers.reward_model.train import LIBERO_ENV_KWARGS, run

    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="envs:Libero-Spatial-v0")
    parser.add_argument("--env-kwargs", type=json.loads, default=dict(LIBERO_ENV_KWARGS))
    parser.add_argument("--expert-episodes", type=int, default=36)
    parser.add_argument("--noisy-episodes", type=int, default=24)
    parser.add_argument("--noise", type=float, default=0.3, help="action noise std of the noisy expert")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument(
        "--frames", help="train from these frames (written by an earlier run) instead of collecting"
    )
    parser.add_argument(
        "--extra-frames",
        help="also measure on this independent collection (e.g. from --collect-only --seed 1), without "
        "its episodes that start where a training episode started",
    )
    parser.add_argument("--collect-only", action="store_true")
    parser.add_argument("--frame-size", type=int, nargs=2, default=[256, 256])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1500)
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
    if args.extra_frames:
        report["independent_collection"] = independent_set(report, args.extra_frames, args.out)
    print(results_table(report, report.get("independent_collection")))
    write_json(Path(args.out) / "reward_model.json", report)
    return report


if __name__ == "__main__":
    run_cli(main)
