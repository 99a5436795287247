"""Real-size world-model step times on a GPU: Cosmos Predict 2.5 (2B DiT, Wan 2.1 VAE, 256x320)
and OpenSora (STDiT3, SDXL VAE, 256x256) with random weights in bf16, 16 envs per chunk step.

    python -m benchmarks.gpu_step_times [--envs 16 64] [--steps 3]

``benchmarks.world_model_step --real-size`` on CUDA (the table, the FLOPs and the JSON are its own);
without a GPU it prints why it skipped and exits cleanly, so a CPU machine can run every script.
Targets on one H100/H200: Cosmos <= 2.5 s, OpenSora <= 3.5 s per 16-env chunk step.
"""

from __future__ import annotations

import sys

import torch

from benchmarks import world_model_step
from nets.errors import run_cli


def main(argv: list[str] | None = None) -> bool:
    """Runs the benchmark and returns True, or returns False when there is no GPU."""
    if not torch.cuda.is_available():
        print("gpu_step_times: skipped, no CUDA GPU here (torch.cuda.is_available() is False)")
        return False
    args = list(sys.argv[1:] if argv is None else argv)
    world_model_step.main(
        ["--real-size", "--device", "cuda", "--json", "runs/benchmarks/gpu_step_times.json", *args]
    )
    return True


if __name__ == "__main__":
    run_cli(main)
