"""Real-size world-model step times on a GPU: Cosmos Predict 2.5 (2B DiT, Wan 2.1 VAE, 256x320)
and OpenSora (STDiT3, SDXL VAE, 256x256) with random weights in bf16, 16 envs per chunk step.

    python -m benchmarks.gpu_step_times [--envs 16 64] [--steps 3] [--timeout-s 540]
    python -m benchmarks.gpu_step_times --dry-run        # any machine: check the inputs, print the rows

``benchmarks.world_model_step --real-size`` on CUDA (the FLOPs and the JSON are its own); the table is
also written to ``--table`` after every row, so a run stopped by ``--timeout-s`` (exit status 124) keeps
the rows it finished. Without a GPU it prints why it skipped and exits cleanly, so a CPU machine can run
every script. ``--dry-run`` checks, without a GPU and without allocating a model: the arguments, that
every model builds at real size on the meta device, that the output paths are writable, and that the
rows it would measure cover the world-model rows of the plan (``benchmarks.real_size_plan``); it prints
them with the plan's predicted step time and writes that table to ``<table>.dry_run.txt``.
Targets on one H100/H200: Cosmos <= 2.5 s, OpenSora <= 3.5 s per 16-env chunk step.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks import world_model_step
from nets.errors import BadInput, program_name, run_cli

TIMED_OUT = 124  # the exit status of coreutils' timeout


def _writable(path: Path) -> None:
    """Raise ``BadInput`` unless ``path`` can be written (its nearest existing folder is writable and
    it is not something other than a regular file); creates nothing."""
    if path.exists() and not path.is_file():
        raise BadInput(f"output {path} exists and is not a regular file")
    if path.exists() and not os.access(path, os.W_OK):
        raise BadInput(f"output {path} is not writable")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"output {path}: cannot create files under {parent}")


def dry_run(args: argparse.Namespace, wm: argparse.Namespace) -> list[dict[str, Any]]:
    """Check what a real run needs and return the rows it would measure (with the plan's prediction)."""
    from benchmarks import real_size_plan

    for path in (Path(args.table), Path(wm.json)):
        _writable(path)
    rows = world_model_step.planned_rows(wm)
    if wm.steps < 1 or wm.num_steps < 1 or any(n < 1 for _, _, n, _ in rows):
        raise BadInput(
            f"--steps, --num-steps and --envs must be >= 1, got {wm.steps}, {wm.num_steps}, {wm.envs}"
        )
    built = {}
    for backend in wm.backends:  # the benchmark's own networks, at real size, on meta
        with torch.device("meta"):
            dit, vae = world_model_step.real_size_networks(backend)
        built[backend] = sum(p.numel() for p in (*dit.parameters(), *vae.parameters()))
    plan = {r.extra["backend"]: r for r in real_size_plan.world_model_rows()}
    measured = {(b, n, f"{s[0]}x{s[1]}") for b, _, n, s in rows}
    missing = real_size_plan.planned_world_model_rows() - measured
    if missing:
        raise BadInput(f"the run would not measure the plan's world-model rows {sorted(missing)}")
    out = []
    for backend, mode, n, size in rows:
        key = (backend, n, f"{size[0]}x{size[1]}")
        row = {"backend": backend, "mode": mode, "envs": n, "size": key[2], "params": built[backend],
               "in_plan": key in real_size_plan.planned_world_model_rows()}  # fmt: skip
        if row["in_plan"] and mode == "optimized":  # the plan models the optimized (default) env
            row["plan_s"] = real_size_plan.seconds(plan[backend].act_tflop * n, args.mfu)
        out.append(row)
    return out


def dry_run_table(rows: list[dict[str, Any]], mfu: float) -> str:
    head = f"{'backend':<9}{'mode':<11}{'envs':>5}{'frames':>9}{'params':>15}{'in plan':>9}{'plan s':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        plan_s = f"{r['plan_s']:.2f}" if "plan_s" in r else "-"
        lines.append(f"{r['backend']:<9}{r['mode']:<11}{r['envs']:>5}{r['size']:>9}{r['params']:>15,}"
                     f"{'yes' if r['in_plan'] else 'no':>9}{plan_s:>8}")  # fmt: skip
    return "\n".join(lines) + f"\n(plan s: benchmarks.real_size_plan's step time at {mfu:.0%} of 989 TFLOP/s)"


def main(argv: list[str] | None = None) -> bool:
    """Runs the benchmark (or its dry run) and returns True, or returns False when there is no GPU."""
    parser = argparse.ArgumentParser(
        prog=program_name(),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dry-run", action="store_true", help="check inputs and print the rows; no GPU")
    parser.add_argument("--table", default="runs/benchmarks/gpu_step_times.txt", help="the table, as text")
    parser.add_argument("--json", default="runs/benchmarks/gpu_step_times.json")
    parser.add_argument("--timeout-s", type=float, default=540.0, help="stop the whole run after this long")
    parser.add_argument("--mfu", type=float, default=0.4, help="dry run: MFU of the plan's prediction")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    wm_argv = ["--real-size", "--device", "cuda", "--json", args.json, *rest]
    try:
        wm = world_model_step.build_parser().parse_args(wm_argv)
    except SystemExit as e:  # argparse already printed the usage
        raise BadInput(f"gpu_step_times: bad arguments {rest}") from e
    if args.timeout_s <= 0:
        raise BadInput(f"--timeout-s must be > 0, got {args.timeout_s}")
    if args.dry_run:
        torch.set_num_threads(1)
        text = dry_run_table(dry_run(args, wm), args.mfu)
        out = Path(args.table).with_suffix(".dry_run.txt")
        command = "python -m benchmarks.world_model_step " + " ".join(wm_argv)
        print(f"gpu_step_times --dry-run: inputs checked; would measure ({command}):\n{text}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        print(f"wrote {out}")
        return True
    if not torch.cuda.is_available():
        print("gpu_step_times: skipped, no CUDA GPU here (torch.cuda.is_available() is False)")
        return False
    _writable(Path(args.table))
    done: list[dict] = []

    def write_table(row: dict | None = None, note: str = "") -> None:
        if row is not None:
            done.append(row)
        text = world_model_step.table(done) + (f"\n{note}" if note else "")
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(f"{torch.cuda.get_device_name()}\n{text}\n")

    def alarm(*_: Any) -> None:
        raise TimeoutError

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, args.timeout_s)
    try:
        world_model_step.main(wm_argv, on_row=write_table)
    except TimeoutError:
        write_table(note=f"stopped by --timeout-s {args.timeout_s:g} after {len(done)} rows")
        print(f"gpu_step_times: timed out after {args.timeout_s:g} s; {len(done)} rows in {args.table}")
        raise SystemExit(TIMED_OUT) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print(f"wrote {args.table}")
    return True


if __name__ == "__main__":
    run_cli(main)
