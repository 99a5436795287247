"""World-model env chunk-step time: Cosmos and OpenSora, exact shortcuts against RLinf's procedure.

One row per (backend, mode, envs, frame size): the median wall time of ``env.step`` (one chunk of 8
actions for every env: DiT sampling, VAE, reward model, bookkeeping), the model's share of it, the
FLOPs of one step (``torch.utils.flop_counter``, counted on a separate step) and the achieved
TFLOP/s. ``optimized`` is the default env (Cosmos: the four exact shortcuts of research §3.9);
``faithful`` is RLinf's computation (CFG's duplicate branch, 13-frame encode, full decode, full
cross-attention). ``compiled`` (with ``--compile``) is ``optimized`` with the DiT's blocks under
``torch.compile`` (``compile_blocks``); its first step, which compiles, is reported apart. All modes
run side by side in one process.

    python -m benchmarks.world_model_step                   # CPU, tiny random bundles
    python -m benchmarks.world_model_step --real-size       # GPU: real-size random models, bf16, 16 envs

Targets on one H100/H200 (issue 4): Cosmos optimized <= 2.5 s, OpenSora <= 3.5 s per 16-env step.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.report import write_json
from envs.core.frames import InitialFrame
from envs.world_models.env import WorldModelVectorEnv
from envs.world_models.reward import ResnetRewardModel
from envs.world_models.tiny import INSTRUCTIONS, synthetic_image, write_tiny_bundle
from nets.devices import default_device
from nets.errors import BadInput, program_name, run_cli


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def real_size_networks(
    backend: str, dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The real-size DiT and VAE (random weights, frozen) on the current default device; under
    ``torch.device("meta")`` they cost no memory (what ``gpu_step_times --dry-run`` checks)."""
    if backend == "cosmos":
        from nets.cosmos_dit import CosmosDiT, CosmosDiTConfig
        from nets.wan_vae import WanVAE, build_wan_vae

        dit = CosmosDiT(CosmosDiTConfig.predict2_action_2b())
        vae = WanVAE(build_wan_vae())
    else:
        from nets.opensora_stdit3 import STDiT3, STDiT3Config
        from nets.opensora_vae import SDXLVAE, build_sdxl_vae

        dit = STDiT3(STDiT3Config.xl2_libero())
        vae = SDXLVAE(build_sdxl_vae())
    return dit.to(dtype).eval().requires_grad_(False), vae.to(dtype).eval().requires_grad_(False)


def real_size_model(backend: str, device: torch.device, image_size: tuple[int, int], **options: Any):
    """A real-size model with random weights in bf16 (fp32 on CPU): the shapes and cost of the real one."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        dit, vae = real_size_networks(backend, dtype)
    if backend == "cosmos":
        from envs.world_models.cosmos.model import CosmosWorldModel

        return CosmosWorldModel(dit, vae, image_size=image_size, dtype=dtype, **options)
    from envs.world_models.opensora.model import OpenSoraWorldModel

    q01, q99 = -torch.ones(7), torch.ones(7)
    return OpenSoraWorldModel(dit, vae, q01=q01, q99=q99, image_size=image_size, dtype=dtype, **options)


def measure(env: Any, steps: int) -> dict[str, float]:
    """Median step time over ``steps`` chunk steps (after one warm-up), its model part, FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    base = env.unwrapped
    device = base.model.device
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    actions = lambda: rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)  # noqa: E731
    generate = base.model.generate
    model_times: list[float] = []

    def timed_generate(*args: Any) -> Any:
        _sync(device)
        t0 = time.perf_counter()
        out = generate(*args)
        _sync(device)
        model_times.append(time.perf_counter() - t0)
        return out

    base.model.generate = timed_generate
    try:
        _sync(device)
        t0 = time.perf_counter()
        env.step(actions())  # warm-up (kernels, allocator, compilation)
        _sync(device)
        first_s = time.perf_counter() - t0
        set_stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6; compiled rows need it
        eager = set_stance("force_eager") if set_stance else contextlib.nullcontext()
        with eager, FlopCounterMode(display=False) as counter:
            env.step(actions())  # compiled code counted as the eager code it replaces
        flops = counter.get_total_flops()
        times = []
        model_times.clear()
        for _ in range(steps):
            _sync(device)
            t0 = time.perf_counter()
            env.step(actions())
            _sync(device)
            times.append(time.perf_counter() - t0)
    finally:
        del base.model.generate
    step_s = statistics.median(times)
    return {
        "first_step_s": first_s,
        "step_s": step_s,
        "model_s": statistics.median(model_times),
        "tflop_per_step": flops / 1e12,
        "tflops": flops / 1e12 / step_s,
    }


def run_row(backend: str, mode: str, num_envs: int, size: tuple[int, int], args: argparse.Namespace) -> dict:
    options: dict[str, Any] = {"num_steps": args.num_steps, "batch_size": num_envs}
    # episodes never end (a random reward model may say "success"), so every step runs every env
    endless = {"success_threshold": 2.0, "max_episode_steps": 10**6}
    if backend == "cosmos":
        options["faithful"] = mode == "faithful"
    if mode == "compiled":
        options["compile_blocks"] = True
    if args.real_size:
        device = default_device(args.device)
        model = real_size_model(backend, device, size, **options)
        frames = [
            InitialFrame(text, image=synthetic_image(np.random.default_rng(i), (256, 256)))
            for i, text in enumerate(INSTRUCTIONS)
        ]
        env = WorldModelVectorEnv(
            model, ResnetRewardModel(), frames, env_id=f"{backend}-real-size", num_envs=num_envs, **endless
        )
    else:
        import gymnasium as gym

        import envs  # noqa: F401

        env_id = {"cosmos": "CosmosWM-LiberoSpatial-v0", "opensora": "OpenSoraWM-LiberoSpatial-v0"}[backend]
        env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            model_dir=args.bundles[backend],
            image_size=size,
            model_options=options,
            **endless,
        )
    try:
        result = measure(env, args.steps)
    finally:
        env.close()
    return {"backend": backend, "mode": mode, "envs": num_envs, "size": f"{size[0]}x{size[1]}", **result}


def table(rows: list[dict], unit: str = "T") -> str:
    """``unit``: "T" (TFLOP) for real-size models, "G" (GFLOP) for tiny ones."""
    scale = 1.0 if unit == "T" else 1e3
    head = f"{'backend':<9}{'mode':<11}{'envs':>5}{'frames':>9}{'first s':>9}{'step s':>9}{'model s':>9}"
    head += f"{unit + 'FLOP/step':>12}{unit + 'FLOP/s':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['backend']:<9}{r['mode']:<11}{r['envs']:>5}{r['size']:>9}{r['first_step_s']:>9.2f}"
            f"{r['step_s']:>9.3f}{r['model_s']:>9.3f}"
            f"{r['tflop_per_step'] * scale:>12.2f}{r['tflops'] * scale:>9.2f}"
        )
    return "\n".join(lines)


MODES = ("optimized", "faithful", "compiled")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.split("\n\n")[0])
    parser.add_argument("--real-size", action="store_true", help="real-size random models (GPU)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--envs", type=int, nargs="+", default=None, help="default: 2 16 (tiny), 16 (real)")
    parser.add_argument("--steps", type=int, default=3, help="timed chunk steps per row")
    parser.add_argument("--num-steps", type=int, default=10, help="sampler steps (RLinf: 10)")
    parser.add_argument(
        "--backends", nargs="+", default=["cosmos", "opensora"], choices=["cosmos", "opensora"]
    )
    parser.add_argument("--cosmos-size", type=int, nargs=2, default=None, help="default 64 80 / 256 320")
    parser.add_argument("--opensora-size", type=int, nargs=2, default=None, help="default 64 64 / 256 256")
    parser.add_argument("--compile", action="store_true", help="also the 'compiled' rows (torch.compile)")
    parser.add_argument(
        "--modes", nargs="+", default=None, choices=MODES, help="only these modes (default: all that apply)"
    )
    parser.add_argument("--json", type=Path, default=Path("runs/benchmarks/world_model_step.json"))
    return parser


def planned_rows(args: argparse.Namespace) -> list[tuple[str, str, int, tuple[int, int]]]:
    """(backend, mode, envs, frame size) of every row ``main`` measures, in order."""
    sizes = {
        "cosmos": tuple(args.cosmos_size or ((256, 320) if args.real_size else (64, 80))),
        "opensora": tuple(args.opensora_size or ((256, 256) if args.real_size else (64, 64))),
    }
    env_counts = args.envs or ([16] if args.real_size else [2, 16])
    rows = []
    for backend in args.backends:
        modes = ["optimized", "faithful"] if backend == "cosmos" else ["optimized"]
        modes += ["compiled"] if args.compile else []
        modes = [m for m in modes if args.modes is None or m in args.modes]
        if not modes:
            raise BadInput(f"--modes {args.modes} selects no row of {backend} (compiled needs --compile)")
        rows += [(backend, mode, n, sizes[backend]) for n in env_counts for mode in modes]
    return rows


def main(argv: list[str] | None = None, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Measure every planned row, print the table, write the JSON; ``on_row`` sees each row as it ends."""
    args = build_parser().parse_args(argv)
    unit = "T" if args.real_size else "G"
    torch.set_grad_enabled(False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.real_size:
            args.bundles = {b: write_tiny_bundle(b, Path(tmp) / b) for b in args.backends}
        for backend, mode, n, size in planned_rows(args):
            rows.append(run_row(backend, mode, n, size, args))
            print(table(rows[-1:], unit).splitlines()[-1], flush=True)
            if on_row is not None:
                on_row(rows[-1])
    device = str(default_device(args.device))
    label = (
        torch.cuda.get_device_name()
        if device.startswith("cuda")
        else f"CPU ({torch.get_num_threads()} threads)"
    )
    kind = "real-size random weights" if args.real_size else "tiny random bundles"
    print(f"\nWorld-model chunk step ({kind}, {args.num_steps} sampler steps, {label}):\n{table(rows, unit)}")
    write_json(args.json, {"device": label, "models": kind, "rows": rows})
    print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    run_cli(main)
