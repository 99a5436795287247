"""Command line of ``trainers.datasets``: inspect a demonstration dataset, export it.

    python -m trainers.datasets info demos/spatial.h5
    python -m trainers.datasets export-lerobot --demos demos/spatial.h5 --out datasets/spatial_lerobot
    python -m trainers.datasets export-wm --demos demos/spatial.h5 --out bundles/my_bundle
    python -m trainers.datasets subset --demos demos/spatial.h5 --per-task 2 --out demos/spatial_20.h5

``--demos`` takes any format ``load_demos`` reads (our HDF5, LIBERO's HDF5 files, LeRobot v3).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from nets.errors import BadInput, run_cli
from nets.files import check_output
from trainers.datasets import detect_format, load_demos, write_lerobot, write_world_model_dataset
from trainers.datasets.demos import Demos, is_demos_file, write_demos
from trainers.datasets.video import CODEC_OPTIONS, DEFAULT_CODEC


def describe(demos: Demos, kind: str) -> str:
    eps = demos.episodes
    steps = sum(ep.length for ep in eps)
    lines = [f"format: {kind}", f"episodes: {len(eps)} ({sum(ep.success for ep in eps)} successful)"]
    if eps:
        first = eps[0]
        lines.append(f"executed steps: {steps}; actions per chunk x dim: {first.actions.shape[1:]}")
        for key, value in first.obs.items():
            lines.append(f"  obs {key}: {value.dtype} {value.shape[1:]}")
        if first.sim_states is not None:
            lines.append(f"  sim_states: {first.sim_states.shape[1:]}")
        texts = sorted({ep.instruction for ep in eps})
        lines.append(
            f"instructions ({len(texts)}): " + "; ".join(texts[:5]) + (" ..." if len(texts) > 5 else "")
        )
        acts = np.concatenate([ep.actions[ep.valid] for ep in eps])
        lines.append(
            f"action range: min {np.round(acts.min(0), 3).tolist()} max {np.round(acts.max(0), 3).tolist()}"
        )
    return "\n".join(lines)


def per_task(demos: Demos, n: int) -> list:
    """The first ``n`` episodes of each task, in the order of their initial frames (a few-demo set:
    e.g. 2 per task, the demonstration budget of SERL-style RL from demos)."""
    kept: dict[str, list] = {}
    for ep in sorted(demos.episodes, key=lambda e: (e.task, e.initial_frame)):
        if len(kept.setdefault(ep.task, [])) < n:
            kept[ep.task].append(ep)
    return [ep for eps in kept.values() for ep in eps]


def main(argv: list[str] | None = None) -> Path | None:
    parser = argparse.ArgumentParser(prog="python -m trainers.datasets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print what a dataset holds")
    info.add_argument("path", type=Path)
    lr = sub.add_parser("export-lerobot", help="write a LeRobotDataset v3.0 folder")
    wm = sub.add_parser("export-wm", help="write a world-model bundle's dataset/ folder (RLinf layout)")
    for p in (lr, wm):
        p.add_argument("--demos", type=Path, required=True, help="input: any format load_demos reads")
        p.add_argument("--out", type=Path, required=True, help="output folder")
        p.add_argument("--overwrite", action="store_true", help="replace an existing output")
        p.add_argument("--no-progress", action="store_true")
    lr.add_argument("--fps", type=float, default=20, help="frames per second (LIBERO's control rate: 20)")
    lr.add_argument("--no-video", action="store_true", help="images as lossless PNGs in the parquet files")
    lr.add_argument("--codec", default=DEFAULT_CODEC, choices=sorted(CODEC_OPTIONS), help="video codec")
    lr.add_argument(
        "--obs-keys",
        default=None,
        help="comma-separated observation keys (default: image, wrist_image, proprio)",
    )
    lr.add_argument("--robot-type", default=None, help="info.json robot_type, e.g. panda")
    sb = sub.add_parser("subset", help="write the first N episodes of each task as our demos file")
    sb.add_argument("--demos", type=Path, required=True, help="input: any format load_demos reads")
    sb.add_argument("--out", type=Path, required=True, help="output: our HDF5 demos file")
    sb.add_argument(
        "--per-task", type=int, required=True, help="episodes kept per task (first initial frames)"
    )
    sb.add_argument("--overwrite", action="store_true", help="replace an existing demos file")
    args = parser.parse_args(argv)

    if args.command == "info":
        kind = detect_format(args.path)
        print(describe(load_demos(args.path), kind))
        return None
    if args.command == "subset":
        if args.per_task < 1:
            raise BadInput(f"--per-task must be >= 1, got {args.per_task}")
        check_output(args.out, overwrite=args.overwrite, ours=is_demos_file, what="a demos file")
        demos = load_demos(args.demos)
        kept = per_task(demos, args.per_task)
        about = f"the first {args.per_task} episodes per task of {args.demos.name}"
        meta = {
            **demos.meta,
            "about": about,
            "episodes_run": len(kept),
            "episodes_successful": sum(e.success for e in kept),
        }
        path = write_demos(args.out, kept, meta)
        print(f"wrote {path}: {len(kept)} episodes of {len({e.task for e in kept})} tasks")
        return path
    demos = load_demos(args.demos)
    progress = not args.no_progress
    if args.command == "export-lerobot":
        keys = [k.strip() for k in args.obs_keys.split(",") if k.strip()] if args.obs_keys else None
        path = write_lerobot(
            demos, args.out, fps=args.fps, video=not args.no_video, codec=args.codec, obs_keys=keys,
            robot_type=args.robot_type, overwrite=args.overwrite, progress=progress,
        )  # fmt: skip
    else:
        path = write_world_model_dataset(demos, args.out, overwrite=args.overwrite, progress=progress)
    print(f"wrote {path}")
    return path


def cli(argv: list[str] | None = None) -> Path | None:
    """``main`` as a command: a dataset that is refused (or missing) ends it with its message on
    stderr and exit status 1, not a traceback."""
    try:
        return main(argv)
    except (ValueError, KeyError, OSError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise SystemExit(f"python -m trainers.datasets: error: {message}") from None


if __name__ == "__main__":
    run_cli(cli)
