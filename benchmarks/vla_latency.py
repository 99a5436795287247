"""``act`` latency and memory of the VLA policies (OpenVLA-OFT, pi0.5) per batch of observations.

    python -m benchmarks.vla_latency --size real --device cuda [--batch 16] [--repeats 5]
    python -m benchmarks.vla_latency --size tiny                 # CPU smoke run of the same code

``--size real`` writes each model at its public size with random weights (bfloat16) into a
temporary checkpoint folder in the real layout, loads it through the policy's own loader (the load
time is reported too) and times ``act`` on a LIBERO-shaped batch: one 224 px image for OpenVLA-OFT
(K = 8, 56 action tokens in one pass), agent view + wrist for pi0.5 (prefix cached, N denoising steps,
K = 5 of a 10-step horizon) and the Cosmos Policy (33-frame VAE encode + 5 DiT calls per 16-action
chunk; the issue quotes 0.61 s on an H100, a figure we could not find in its sources). ``--size
tiny`` uses the test checkpoints. Real size needs a CUDA GPU: without one it prints why it skipped.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from benchmarks.report import table, write_json
from envs.core.spaces import FieldBox
from envs.libero.env import PROPRIO_FIELDS
from nets.devices import default_device
from nets.errors import program_name, run_cli

INSTRUCTION = "pick up the black bowl between the plate and the ramekin and place it on the plate"
MODELS = ("openvla_oft", "pi05", "cosmos_policy")


def _spaces(model: str) -> tuple[spaces.Dict, spaces.Box]:
    image = spaces.Box(0, 255, (224, 224, 3), np.uint8)
    obs = spaces.Dict(
        {
            "image": image,
            "wrist_image": image,
            "proprio": FieldBox(-10, 10, PROPRIO_FIELDS),  # LIBERO's named layout
            "instruction": spaces.Text(200),
        }  # fmt: skip
    )
    chunk = {"openvla_oft": 8, "pi05": 5, "cosmos_policy": 16}[model]
    return obs, spaces.Box(-1, 1, (chunk, 7), np.float32)


def _real_checkpoint(model: str, folder: Path, device: str) -> None:
    """A public-size checkpoint with random bfloat16 weights (tokenizer and stats from the tiny one)."""
    from policies.pretrained import save_state_dict

    if model == "cosmos_policy":
        _real_cosmos_policy(folder, device)
        return
    if model == "openvla_oft":
        from policies.openvla_oft.config import OpenVLAConfig
        from policies.openvla_oft.modeling import OpenVLAModel
        from policies.openvla_oft.tiny import write_tiny_openvla

        write_tiny_openvla(folder)
        config = OpenVLAConfig()
        with torch.device(device):
            net = OpenVLAModel(config).to(torch.bfloat16)
        state = net.state_dict()
        data = config.to_json_dict()
    else:
        from policies.pi05.config import Pi05Config
        from policies.pi05.modeling import EXPERT_LM_HEAD, Pi05Model, to_checkpoint_keys
        from policies.pi05.tiny import write_tiny_pi05

        write_tiny_pi05(folder)
        config = Pi05Config()
        with torch.device(device):
            net = Pi05Model(config).to(torch.bfloat16)
        state = to_checkpoint_keys(net.state_dict())
        state[EXPERT_LM_HEAD] = torch.zeros(257_152, 1024, dtype=torch.bfloat16)
        data = config.to_json_dict()
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    save_state_dict(state, folder, max_shard_bytes=5 * 2**30)
    (folder / "config.json").write_text(json.dumps(data))
    del net, state


def _real_cosmos_policy(folder: Path, device: str) -> None:
    """Cosmos-Predict2-2B Video2World DiT and the Wan 2.1 VAE (base 96) with random bf16 weights, in
    the Cosmos Policy folder layout; T5 embeddings [1, 512, 1024] for the benchmark's instruction."""
    import pickle

    from nets.cosmos_dit import CosmosDiT, CosmosDiTConfig
    from nets.cosmos_tiny import wan_vae_to_original
    from nets.wan_vae import build_wan_vae
    from policies.cosmos_policy.tiny import write_tiny_cosmos_policy

    write_tiny_cosmos_policy(folder)
    (folder / "Cosmos-Policy-LIBERO-Tiny.pt").unlink()
    with torch.device(device):
        dit = CosmosDiT(CosmosDiTConfig(action_dim=None)).to(torch.bfloat16)
    torch.save(
        {f"net.{k}": v for k, v in dit.state_dict().items()}, folder / "Cosmos-Policy-LIBERO-Predict2-2B.pt"
    )
    del dit
    torch.save(
        wan_vae_to_original(build_wan_vae(base_dim=96).state_dict()), folder / "tokenizer" / "tokenizer.pth"
    )
    with open(folder / "libero_t5_embeddings.pkl", "wb") as f:
        pickle.dump({INSTRUCTION: torch.randn(1, 512, 1024).to(torch.bfloat16)}, f)


def write_checkpoint(model: str, size: str, folder: Path, device: str) -> None:
    """A checkpoint folder of ``model``: its public size with random weights, or the tiny test one."""
    if size == "real":
        _real_checkpoint(model, folder, device)
    elif model == "openvla_oft":
        from policies.openvla_oft.tiny import write_tiny_openvla

        write_tiny_openvla(folder)
    elif model == "cosmos_policy":
        from policies.cosmos_policy.tiny import write_tiny_cosmos_policy

        write_tiny_cosmos_policy(folder)
    else:
        from policies.pi05.tiny import write_tiny_pi05

        write_tiny_pi05(folder)


def observations(batch: int) -> dict:
    """A LIBERO-shaped observation batch (random pixels and proprio, one instruction), seeded."""
    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 255, (batch, 224, 224, 3), dtype=np.uint8),
        "wrist_image": rng.integers(0, 255, (batch, 224, 224, 3), dtype=np.uint8),
        "proprio": rng.normal(size=(batch, 8)).astype(np.float32),
        "instruction": [INSTRUCTION] * batch,
    }


def measure(model: str, size: str, batch: int, repeats: int, device: str, num_steps: int) -> dict:
    from policies.registry import make_policy

    obs_space, act_space = _spaces(model)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / model
        write_checkpoint(model, size, folder, device)
        kwargs = {"model_path": str(folder), "dtype": "bfloat16" if device == "cuda" else "float32"}
        if model == "pi05":
            kwargs.update(num_steps=num_steps, max_token_len=200 if size == "real" else 96)
        elif model == "cosmos_policy":  # 5 denoising steps as in its LIBERO evaluation
            kwargs.update(num_steps=5, image_size=224 if size == "real" else 32)
        else:
            kwargs.update(unnorm_key="libero_spatial")
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        policy = make_policy(model, obs_space, act_space, **kwargs).to(device)
        load_s = time.perf_counter() - start
    obs = observations(batch)
    times = []
    for i in range(repeats + 1):  # the first call warms up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        policy.act(obs)
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in policy.parameters())
    memory = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return {
        "model": model, "size": size, "device": device, "batch": batch, "params_b": params / 1e9,
        "load_s": load_s, "act_s_median": float(np.median(times)), "act_s_min": float(np.min(times)),
        "peak_gib": memory, "num_steps": {"pi05": num_steps, "cosmos_policy": 5}.get(model, 1),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog=program_name(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--size", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-steps", type=int, default=10, help="pi0.5 denoising steps")
    parser.add_argument("--device", default=str(default_device()))
    parser.add_argument("--json", default="runs/benchmarks/vla_latency.json")
    args = parser.parse_args(argv)
    if args.size == "real" and not (args.device == "cuda" and torch.cuda.is_available()):
        print("vla_latency: skipped --size real, no CUDA GPU here (real-size VLAs need ~16-32 GB in bf16)")
        return []
    rows = [measure(m, args.size, args.batch, args.repeats, args.device, args.num_steps) for m in args.models]
    header = [
        "model",
        "size",
        "device",
        "batch",
        "params (B)",
        "load s",
        "act s (median)",
        "act s (min)",
        "peak GiB",
    ]
    print(
        table(
            header,
            [
                [
                    r["model"],
                    r["size"],
                    r["device"],
                    r["batch"],
                    f"{r['params_b']:.3f}",
                    f"{r['load_s']:.1f}",
                    f"{r['act_s_median']:.3f}",
                    f"{r['act_s_min']:.3f}",
                    f"{r['peak_gib']:.1f}",
                ]
                for r in rows
            ],  # fmt: skip
            title="VLA act latency",
        )
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    run_cli(main)
