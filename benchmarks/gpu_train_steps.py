"""Real-size VLA act and update steps on one GPU, against the memory and time plan (``real_size_plan``).

    python -m benchmarks.gpu_train_steps [--models openvla_oft pi05] [--timeout-s 420]   # CUDA GPU
    python -m benchmarks.gpu_train_steps --size tiny --device cpu                        # same code, tiny

Each model is written at its public size with random bf16 weights into a temporary folder in the real
layout (``benchmarks.vla_latency``), loaded by the policy's own loader with its one-GPU training
options (OpenVLA-OFT: LoRA rank 32 on the default targets; pi0.5: the action expert alone), and then:

* ``act``: one chunk for ``--envs`` LIBERO-shaped observations (random pixels), sampled as in RL; the
  median of ``--repeats`` after a warm-up;
* ``update``: ``--steps`` optimizer steps, each on ``--micro`` of those rows: the policy's own
  ``evaluate`` (the log-probs GRPO/PPO differentiate), the loss ``-mean(log_probs)`` (the clipped
  surrogate adds element-wise work only), backward, gradient clipping and fused AdamW over the
  trainable parameters; the median step, and the peak GPU memory of the whole update.

The plan's rows (``OFT GRPO LoRA r32``, ``pi0.5 GRPO/PPO expert only``) are printed beside them:
its memory without activation checkpointing (the policies do not checkpoint) and its seconds at 40%
MFU, scaled from its update batch to ``--micro``. The table is written to ``--table`` after every
row, so a run stopped by ``--timeout-s`` (exit status 124) keeps what it finished. With a CUDA
``--device`` and no GPU it prints why it skipped and exits 0. The plan's memory is for its micro
batch of 8; its activations are scaled to ``--micro``.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import vla_latency
from benchmarks.report import table, write_json
from nets.errors import BadInput, program_name, run_cli

MODELS = ("openvla_oft", "pi05")
PLAN_ROWS = {"openvla_oft": "OFT GRPO LoRA r32", "pi05": "pi0.5 GRPO/PPO expert only"}
TRAIN_KWARGS: dict[str, dict[str, Any]] = {  # the plan's one-GPU GRPO configurations (no value head)
    "openvla_oft": {"lora_rank": 32, "unnorm_key": "libero_spatial", "use_critic": False},
    "pi05": {"train_expert_only": True, "num_steps": 10, "use_critic": False},
}
TIMED_OUT = 124


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn: Any, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def load_policy(model: str, size: str, folder: Path, device: str) -> tuple[torch.nn.Module, float]:
    """The policy with its training options from a fresh checkpoint in ``folder``; and the load seconds."""
    from policies.registry import make_policy

    vla_latency.write_checkpoint(model, size, folder, device)
    obs_space, act_space = vla_latency._spaces(model)
    kwargs = {"model_path": str(folder), "dtype": "bfloat16" if device.startswith("cuda") else "float32"}
    kwargs.update(TRAIN_KWARGS[model])
    if model == "pi05":
        kwargs["max_token_len"] = 200 if size == "real" else 96
    start = time.perf_counter()
    policy = make_policy(model, obs_space, act_space, **kwargs).to(device)
    _sync(device)
    return policy, time.perf_counter() - start


def measure(model: str, args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        policy, load_s = load_policy(model, args.size, Path(tmp) / model, device)
    params = sum(p.numel() for p in policy.parameters())
    trainable = [p for p in policy.parameters() if p.requires_grad]
    if not trainable:
        raise BadInput(f"{model}: no trainable parameters with {TRAIN_KWARGS[model]}")
    obs = vla_latency.observations(args.envs)
    chunk = None

    def act() -> None:
        nonlocal chunk
        with torch.no_grad():
            chunk = policy.act(obs)

    act_times = [_timed(act, device) for _ in range(args.repeats + 1)][1:]  # the first warms up
    assert chunk is not None
    rows = {k: v[: args.micro].to(device) for k, v in chunk.replay.items()}
    fused = device.startswith("cuda")
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.01, fused=fused, foreach=not fused)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)

    def step() -> None:
        loss = -policy.evaluate(rows).log_probs.float().mean()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{model}: non-finite loss {loss.item()} on random weights")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    update_times = [_timed(step, device) for _ in range(args.steps + 1)][1:]
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.startswith("cuda") else float("nan")
    row = {
        "model": model, "size": args.size, "device": device, "options": TRAIN_KWARGS[model],
        "params_b": params / 1e9, "trainable_m": sum(p.numel() for p in trainable) / 1e6, "load_s": load_s,
        "envs": args.envs, "act_s": statistics.median(act_times), "micro": args.micro,
        "update_s": statistics.median(update_times), "peak_gib": peak,
    }  # fmt: skip
    return row


def with_plan(row: dict[str, Any], mfu: float) -> dict[str, Any]:
    """The plan's row for this model beside the measured one (the plan models the real size only)."""
    from benchmarks import real_size_plan

    plan = {r.name: r for r in real_size_plan.build_plan(gpus=1)}[PLAN_ROWS[row["model"]]]
    batch, micro = plan.extra["update_batch"], plan.extra["micro"]
    activations = plan.act_off * row["micro"] / micro
    return {
        **row,
        "plan_trainable_m": plan.trainable / 1e6,
        "plan_gib": (plan.weights + plan.grads + plan.optimizer + activations) / 2**30,
        "plan_act_s": real_size_plan.seconds(plan.act_tflop * row["envs"], mfu),
        "plan_update_s": real_size_plan.seconds(plan.update_tflop * row["micro"] / batch, mfu),
    }


def render(rows: list[dict[str, Any]], note: str = "") -> str:
    header = ["model", "size", "params B", "trainable M (plan)", "load s", "envs", "act s (plan)",
              "micro", "update s (plan)", "peak GiB (plan)"]  # fmt: skip

    def pair(r: dict, key: str, plan: str, fmt: str) -> str:
        return f"{r[key]:{fmt}}" + (f" ({r[plan]:{fmt}})" if plan in r else "")

    body = [
        [r["model"], r["size"], f"{r['params_b']:.3f}", pair(r, "trainable_m", "plan_trainable_m", ".1f"),
         f"{r['load_s']:.1f}", r["envs"], pair(r, "act_s", "plan_act_s", ".3f"), r["micro"],
         pair(r, "update_s", "plan_update_s", ".3f"), pair(r, "peak_gib", "plan_gib", ".1f")]
        for r in rows
    ]  # fmt: skip
    title = "VLA act and update steps against the plan"
    return table(header, body, title=title) + (f"\n{note}" if note else "")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        prog=program_name(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--size", choices=("tiny", "real"), default="real")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--envs", type=int, default=16, help="observations per act (one vector step)")
    parser.add_argument("--micro", type=int, default=8, help="rows per update step (the plan's micro batch)")
    parser.add_argument("--repeats", type=int, default=3, help="timed act calls after one warm-up")
    parser.add_argument("--steps", type=int, default=3, help="timed update steps after one warm-up")
    parser.add_argument("--mfu", type=float, default=0.4, help="the plan's MFU for its seconds")
    parser.add_argument("--timeout-s", type=float, default=420.0, help="stop the whole run after this long")
    parser.add_argument("--tmp", default=None, help="temporary checkpoints' folder")
    parser.add_argument("--table", default="runs/benchmarks/gpu_train_steps.txt")
    parser.add_argument("--json", default="runs/benchmarks/gpu_train_steps.json")
    args = parser.parse_args(argv)
    for name in ("envs", "micro", "repeats", "steps"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.micro > args.envs:
        raise BadInput(f"--micro {args.micro} must be <= --envs {args.envs} (the rows of one act)")
    if args.timeout_s <= 0:
        raise BadInput(f"--timeout-s must be > 0, got {args.timeout_s}")
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("gpu_train_steps: skipped, no CUDA GPU here (torch.cuda.is_available() is False)")
        return []
    if args.size == "real" and not cuda:
        raise BadInput("--size real needs --device cuda (7.5 B parameters in bf16)")
    rows: list[dict[str, Any]] = []

    def write(note: str = "") -> None:
        text = render(rows, note)
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        name = torch.cuda.get_device_name(args.device) if cuda else "cpu"
        Path(args.table).write_text(f"{name}\n{text}\n")
        write_json(args.json, rows)

    def alarm(*_: Any) -> None:
        raise TimeoutError

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, args.timeout_s)
    try:
        for model in args.models:
            row = measure(model, args)
            if cuda:  # the model, its optimizer and activations went with measure's frame
                torch.cuda.empty_cache()
            rows.append(with_plan(row, args.mfu) if args.size == "real" else row)
            write()
            print(render(rows[-1:]), flush=True)
    except TimeoutError:
        write(f"stopped by --timeout-s {args.timeout_s:g} after {len(rows)} rows")
        print(f"gpu_train_steps: timed out after {args.timeout_s:g} s; {len(rows)} rows in {args.table}")
        raise SystemExit(TIMED_OUT) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print(render(rows))
    print(f"wrote {args.table}")
    return rows


if __name__ == "__main__":
    run_cli(main)
