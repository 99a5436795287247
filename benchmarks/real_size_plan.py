"""A memory and time plan, on paper, for each training configuration the README names: per GPU, the
bytes of weights, gradients, optimizer state and activations, and the FLOPs (and seconds) of acting
and of one update, from the real-size models built on the meta device.

    python -m benchmarks.real_size_plan [--mfu 0.4] [--gpus 8] [--json runs/benchmarks/real_size_plan.json]
    python -m benchmarks.real_size --plan      # the same table after the parameter counts

Assumptions (all printed with the table):

* bf16 compute. LoRA: the frozen base in bf16 (2 B/param), adapters (rank 32, alpha 32, on the
  policy's default targets) and value head trainable in fp32: 4 B weights + 4 B gradients + 8 B AdamW
  moments each; the fp32 adapters are their own master weights. Full fine-tuning: FSDP2 over N GPUs
  with fp32 sharded parameters (the master copy) and bf16 compute (``--fsdp-param-dtype bfloat16``):
  16 B/param / N (weights 4, gradients 4, AdamW 8), plus two all-gathered bf16 units (the one
  computing and the one prefetched).
* Activations, an analytic per-layer estimate (not measured): the bf16 tensors a pre-norm transformer
  layer keeps for backward, per token: attention ``4h + 2h_kv`` (norm output, q, k, v, attention
  output; flash attention keeps no s x s scores), gated MLP ``h + 4f`` (norm output, gate, up, act,
  product) or GELU MLP ``h + 2f``; a DiT block adds cross-attention (norm output, q, output: ``3h``).
  With activation checkpointing a layer keeps only its input (``h``) and one layer's full set is live.
* FLOPs: ``2 x params x tokens`` for every linear layer, plus ``4 x s_q x s_k x d_attn`` per attention
  layer (scores and weighted sum). An update is ~3x its forward (backward: gradients of activations and
  of weights); with the base frozen (LoRA, expert-only) ~2x. Seconds at ``--mfu`` of the dense bf16
  peak of an H100 SXM / H200 (989 TFLOP/s; the same compute, H200 has more memory).
* Sequence lengths and batches: per row, in the table's notes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from benchmarks.report import table, write_json
from nets.errors import BadInput, program_name, run_cli

PEAK_TFLOPS = 989.0  # H100 SXM / H200 dense bf16
GIB = 2**30
LORA_RANK = 32
ENVS = 16  # envs per vector step (the README's GRPO command, the world models' 16-env step)


@dataclass(frozen=True)
class Stack:
    """A stack of transformer layers seen by the estimate: ``tokens`` per sample through ``layers``."""

    layers: int
    hidden: int
    ffn: int
    kv: int  # width of k (and of v)
    tokens: int
    gated: bool = True  # SwiGLU / GeGLU MLP (3 matrices) or GELU MLP (2)
    cross: bool = False  # DiT block with cross-attention

    def act_bytes_per_token_layer(self) -> int:
        h, f = self.hidden, self.ffn
        attn = 4 * h + 2 * self.kv
        mlp = h + (4 * f if self.gated else 2 * f)
        return 2 * (attn + mlp + (3 * h if self.cross else 0))

    def activation_bytes(self, batch: int, checkpointing: bool) -> int:
        per_layer = batch * self.tokens * self.act_bytes_per_token_layer()
        if not checkpointing:
            return self.layers * per_layer
        return self.layers * batch * self.tokens * 2 * self.hidden + per_layer


@dataclass
class PlanRow:
    name: str
    gpus: int
    params: int
    trainable: int
    weights: float  # bytes per GPU
    grads: float
    optimizer: float
    act_off: float  # activations, checkpointing off
    act_on: float  # and on
    act_tflop: float  # forward FLOPs of one env's act call (one chunk step)
    update_tflop: float  # FLOPs of one optimizer step (all GPUs together)
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def total(self, checkpointing: bool) -> float:
        return self.weights + self.grads + self.optimizer + (self.act_on if checkpointing else self.act_off)


def _meta(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build()


def _n(module: nn.Module, prefix: str = "", skip: tuple[str, ...] = ()) -> int:
    return sum(
        p.numel()
        for k, p in module.named_parameters()
        if k.startswith(prefix) and not any(s in k for s in skip)
    )


def lora_params(model: nn.Module, targets: tuple[str, ...], rank: int = LORA_RANK) -> int:
    """Parameters LoRA adds: ``rank x (in + out)`` per ``nn.Linear`` whose name is or ends with a target
    (``policies.pretrained.add_lora``'s matching rule)."""
    total = 0
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            total += rank * (m.in_features + m.out_features)
    return total


def attention_flops(layers: int, s_q: int, s_k: int, d_attn: int) -> float:
    return 4.0 * layers * s_q * s_k * d_attn


def memory_terms(
    params: int, trainable: int, gpus: int, full: bool, unit: int, frozen: int = 0
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU. Full: ``params`` all trained, sharded over ``gpus``,
    ``unit`` the largest FSDP unit's parameters. Else ``frozen`` bf16 parameters and ``trainable`` fp32
    ones (LoRA adapters and heads beside the base, or the trained part of ``params``)."""
    if full:  # FSDP2: fp32 sharded master params, fp32 sharded grads, AdamW m + v; bf16 gathered units
        return 4 * params / gpus + 2 * 2 * unit, 4 * params / gpus, 8 * params / gpus
    return 2 * frozen + 4 * trainable, 4 * trainable, 8 * trainable


# ---- OpenVLA-OFT -----------------------------------------------------------------------------------

OFT_PROMPT = 40  # "In: What action should the robot take to <instruction>?\nOut:" in Llama tokens


def oft_rows(gpus: int) -> list[PlanRow]:
    from policies.heads import ValueHead
    from policies.openvla_oft.common import LORA_LANGUAGE, LORA_VISION
    from policies.openvla_oft.config import OFT_LIBERO, OpenVLAConfig
    from policies.openvla_oft.modeling import OpenVLAModel

    model = _meta(lambda: OpenVLAModel(OpenVLAConfig.openvla_7b()))
    params = _n(model)
    oft = OFT_LIBERO
    actions = oft.chunk * oft.action_dim  # 56 action positions, one bidirectional pass
    s = 1 + 256 + OFT_PROMPT + actions + 1  # BOS, patches (one camera), prompt, actions, STOP
    llm = model.language_model
    vocab, h = llm.config.vocab_size, llm.config.hidden_size
    llm_body = _n(llm) - 2 * vocab * h  # without the embedding and lm_head
    dino = Stack(24, 1024, 4096, 1024, 261, gated=False)  # 256 patches + CLS + 4 registers
    siglip = Stack(27, 1152, 4304, 1152, 256, gated=False)
    llama = Stack(32, h, llm.config.intermediate_size, h, s)
    towers = _n(model, "vision_backbone.") + _n(model, "projector.")
    fwd = (
        2 * _n(model, "vision_backbone.featurizer.") * dino.tokens
        + 2 * (_n(model, "vision_backbone.fused_featurizer.") + _n(model, "projector.")) * 256
        + 2 * llm_body * s
        + 2 * vocab * h * actions  # logits at the action positions only
        + attention_flops(24, 261, 261, 1024)
        + attention_flops(27, 256, 256, 1152)
        + attention_flops(32, s, s, h)
    )
    value = _n(_meta(lambda: ValueHead(h, (512, 128), 1, "gelu")))
    lora = lora_params(model, LORA_LANGUAGE + LORA_VISION)
    biggest_unit = _n(llm, "model.layers.0.")  # FSDP units: one decoder layer (the towers: smaller)
    micro, minibatch = 8, 64
    rows = []
    for algo, batch, extra_fwd in (
        ("GRPO", minibatch, 0),
        ("PPO", minibatch, 0),
        ("SAC", 32, 1),  # + a no-grad forward for the next chunk's target
    ):
        for full in (False, True):
            head = value if algo == "PPO" else 0
            trainable = (params if full else lora) + head
            n_gpu = gpus if full else 1
            w, g, o = memory_terms(params + head, trainable, n_gpu, full, biggest_unit, frozen=params)
            stacks = (dino, siglip, llama)
            act = [sum(st.activation_bytes(micro, ck) for st in stacks) for ck in (False, True)]
            per_sample = (3 if full else 2) + extra_fwd
            rows.append(PlanRow(
                f"OFT {algo} {'full FSDP' if full else 'LoRA r32'}", n_gpu, params, trainable, w, g, o,
                act[0], act[1], fwd / 1e12, per_sample * fwd * batch / 1e12,
                notes=f"s={s} (1 cam, {actions} action tokens), micro {micro}/GPU, update batch {batch}"
                + (", +1 no-grad fwd (target); critic MLP ignored" if extra_fwd else "")
                + ("" if full else f", LoRA on LLM+projector+towers ({lora / 1e6:.1f} M)"),
                extra={"towers_params": towers, "update_batch": batch, "micro": micro},
            ))  # fmt: skip
    return rows


# ---- pi0.5 -------------------------------------------------------------------------------------------

PI05_PROMPT = 200  # max_token_len: prompt + discretized state (openpi pi05_libero)
PI05_STEPS = 10  # denoising steps per chunk


def pi05_rows(gpus: int) -> list[PlanRow]:
    from policies.pi05.config import Pi05Config
    from policies.pi05.modeling import Pi05Model

    config = Pi05Config.pi05_libero()
    model = _meta(lambda: Pi05Model(config))
    params = _n(model)
    pali, exp, vis = config.paligemma(), config.expert(), config.vision()
    images = 2  # agent view + wrist (pi05_libero: two cameras, the third padded out)
    prefix = images * vis.num_patches + PI05_PROMPT
    suffix = config.action_horizon
    d_attn = pali.num_heads * pali.head_dim
    kv = pali.num_kv_heads * pali.head_dim
    base = "paligemma_with_expert.paligemma.model."
    siglip_p = _n(model, base + "vision_tower.") + _n(model, base + "multi_modal_projector.")
    gemma_body = _n(model, base + "language_model.", skip=("embed_tokens",))
    expert_p = _n(model, "paligemma_with_expert.gemma_expert.")
    prefix_fwd = (
        2 * siglip_p * vis.num_patches * images
        + attention_flops(vis.num_hidden_layers, vis.num_patches, vis.num_patches, vis.hidden_size) * images
        + 2 * gemma_body * prefix
        + attention_flops(pali.depth, prefix, prefix, d_attn)
    )
    step_fwd = 2 * expert_p * suffix + attention_flops(exp.depth, suffix, prefix + suffix, d_attn)
    fwd = prefix_fwd + PI05_STEPS * step_fwd
    siglip = Stack(vis.num_hidden_layers, vis.hidden_size, vis.intermediate_size, vis.hidden_size,
                   vis.num_patches * images, gated=False)  # fmt: skip
    gemma = Stack(pali.depth, pali.width, pali.mlp_dim, kv, prefix)
    expert = Stack(exp.depth, exp.width, exp.mlp_dim, kv, suffix * PI05_STEPS)
    biggest_unit = _n(model, base + "language_model.layers.0.")
    micro, batch = 8, 64
    rows = []
    for label, full, trainable, stacks in (
        ("full FSDP", True, params, (siglip, gemma, expert)),
        ("expert only", False, expert_p + _n(model, "action_") + _n(model, "time_mlp"), (expert,)),
    ):
        n_gpu = gpus if full else 1
        w, g, o = memory_terms(params, trainable, n_gpu, full, biggest_unit, frozen=params - trainable)
        act = [sum(st.activation_bytes(micro, ck) for st in stacks) for ck in (False, True)]
        # the update replays the denoising chain (flow_sde log-probs): prefix once + 10 expert steps
        update = (3 * fwd if full else prefix_fwd + 3 * PI05_STEPS * step_fwd) * batch
        rows.append(PlanRow(
            f"pi0.5 GRPO/PPO {label}", n_gpu, params, trainable, w, g, o, act[0], act[1], fwd / 1e12,
            update / 1e12,
            notes=f"prefix {prefix} tok (2 x 256 patches + {PI05_PROMPT}), {PI05_STEPS} steps x {suffix} "
            f"action tok, micro {micro}/GPU, update batch {batch}" + ("" if full else "; prefix frozen"),
            extra={"update_batch": batch, "micro": micro},
        ))  # fmt: skip
    return rows


# ---- Cosmos Policy -------------------------------------------------------------------------------------

COSMOS_POLICY_STEPS = 5  # denoising steps per chunk (its LIBERO evaluation)


def cosmos_dit_fwd(dit: nn.Module, tokens: int, context: int) -> float:
    """One DiT forward per sample: token-wise linears over ``tokens``, cross-attention k/v over the
    ``context`` tokens, self- and cross-attention scores (AdaLN and embedders are per frame: ignored)."""
    cfg = dit.config
    d = cfg.model_channels
    blocks = _n(dit, "blocks.", skip=("adaln", "cross_attn.k_proj", "cross_attn.v_proj", "norm"))
    kv = _n(dit, "blocks.", skip=("self_attn", "q_proj", "output_proj", "mlp", "adaln", "norm"))
    return (
        2 * blocks * tokens
        + 2 * kv * context
        + attention_flops(cfg.num_blocks, tokens, tokens, d)
        + attention_flops(cfg.num_blocks, tokens, context, d)
    )


def cosmos_policy_rows(gpus: int) -> list[PlanRow]:
    from nets.cosmos_dit import CosmosDiT, CosmosDiTConfig
    from nets.wan_vae import build_wan_vae
    from policies.cosmos_policy.layout import NUM_LATENT_FRAMES

    config = CosmosDiTConfig.predict2_2b_video2world()
    dit = _meta(lambda: CosmosDiT(config))
    vae = _n(_meta(build_wan_vae))
    params = _n(dit)
    tokens = NUM_LATENT_FRAMES * (224 // 8 // 2) ** 2  # 9 latent frames of 14 x 14 patches (224 px)
    fwd = cosmos_dit_fwd(dit, tokens, 512)
    d = config.model_channels
    stack = Stack(config.num_blocks, d, int(d * config.mlp_ratio), d, tokens, gated=False, cross=True)
    micro, batch = 4, 64
    w, g, o = memory_terms(params, params, gpus, True, _n(dit, "blocks.0."))
    w += 2 * vae  # the frozen VAE, bf16, on every GPU
    return [PlanRow(
        "Cosmos Policy PPO full FSDP", gpus, params + vae, params, w, g, o,
        stack.activation_bytes(micro, False), stack.activation_bytes(micro, True),
        COSMOS_POLICY_STEPS * fwd / 1e12, 3 * fwd * batch / 1e12,
        notes=f"{tokens} tok (9 latents x 14 x 14), T5 context 512, {COSMOS_POLICY_STEPS} DiT passes per act "
        f"(+ VAE encode of 33 frames, not counted), micro {micro}/GPU, update batch {batch} (1 pass each)",
    )]  # fmt: skip


# ---- World-model envs (inference) -----------------------------------------------------------------

# VAE and reward-model FLOPs per env step: torch.utils.flop_counter on meta tensors (research
# worldmodels.md section 7.1): Cosmos encode 1 frame 0.55 + decode 3 latents 6.42 + RM 0.05 (optimized
# mode); OpenSora decode of 8 frames 4.98 + RM 0.04.
WM_OTHER_TFLOP = {"cosmos": 0.55 + 6.42 + 0.05, "opensora": 4.98 + 0.04}
WM_PASSES = {"cosmos": 11, "opensora": 10}  # DiT passes per chunk step (2AB, exact shortcuts; RF Euler)
WM_FRAMES = {"cosmos": (256, 320), "opensora": (256, 256)}
RM_PARAMS = 11_180_033  # RLinf's ResNet-18 reward model, fp32


def world_model_rows() -> list[PlanRow]:
    from nets.cosmos_dit import CosmosDiT, CosmosDiTConfig
    from nets.opensora_stdit3 import STDiT3, STDiT3Config
    from nets.opensora_vae import build_sdxl_vae
    from nets.wan_vae import build_wan_vae

    rows = []
    cosmos = _meta(lambda: CosmosDiT(CosmosDiTConfig.predict2_5_action_2b()))
    h, w = WM_FRAMES["cosmos"]
    tokens = 4 * (h // 16) * (w // 16)  # 4 latent frames (13 pixel frames), 2x2 patches of 8x latents
    fwd = cosmos_dit_fwd(cosmos, tokens, 512)
    params, vae = _n(cosmos), _n(_meta(build_wan_vae))
    # inference: weights bf16 + a few live [B, tokens, 4h] tensors; the VAE decode at 16 envs dominates:
    # ~4 live full-resolution 96-channel feature maps of 4 frames, bf16 (research 7.2: "several GB")
    dit_act = ENVS * tokens * 2 * (4 * cosmos.config.model_channels) * 3
    vae_act = 4 * ENVS * 96 * 4 * h * w * 2
    rows.append(PlanRow(
        "Cosmos WM env, 16 envs (inference)", 1, params + vae + RM_PARAMS, 0,
        2 * (params + vae) + 4 * RM_PARAMS, 0, 0, dit_act + vae_act, dit_act + vae_act,
        (WM_PASSES["cosmos"] * fwd) / 1e12 + WM_OTHER_TFLOP["cosmos"], 0,
        notes=f"{h}x{w}, {tokens} tok (4 latents), {WM_PASSES['cosmos']} DiT passes + VAE + RM per chunk "
        f"step; act = one env's chunk step; DiT fwd {fwd / 1e12:.2f} TFLOP",
        extra={"backend": "cosmos", "envs": ENVS, "size": f"{h}x{w}", "dit_fwd_tflop": fwd / 1e12},
    ))  # fmt: skip
    stdit = _meta(lambda: STDiT3(STDiT3Config.xl2_libero()))
    h, w = WM_FRAMES["opensora"]
    frames, per_frame = 4 + 8, (h // 16) * (w // 16)  # 4 condition + 8 new latent frames, 2x2 patches
    tokens = frames * per_frame
    cfg = stdit.config
    blocks = _n(stdit, "spatial_blocks.", skip=("cross_attn", "scale_shift", "norm")) + _n(
        stdit, "temporal_blocks.", skip=("cross_attn", "scale_shift", "norm")
    )
    fwd = (
        2 * blocks * tokens
        + attention_flops(cfg.depth, per_frame, per_frame, cfg.hidden_size) * frames
        + attention_flops(cfg.depth, frames, frames, cfg.hidden_size) * per_frame
    )
    params, vae = _n(stdit), _n(_meta(build_sdxl_vae))
    dit_act = ENVS * tokens * 2 * (4 * cfg.hidden_size) * 3
    vae_act = 4 * 64 * 128 * h * w * 2  # decode micro-batch of 64 frames, 128-ch full-res maps
    rows.append(PlanRow(
        "OpenSora WM env, 16 envs (inference)", 1, params + vae + RM_PARAMS, 0,
        2 * (params + vae) + 4 * RM_PARAMS, 0, 0, dit_act + vae_act, dit_act + vae_act,
        (WM_PASSES["opensora"] * fwd) / 1e12 + WM_OTHER_TFLOP["opensora"], 0,
        notes=f"{h}x{w}, {tokens} tok ({frames} latents), {WM_PASSES['opensora']} DiT passes + VAE + RM; "
        f"text cross-attention unused; DiT fwd {fwd / 1e12:.2f} TFLOP",
        extra={"backend": "opensora", "envs": ENVS, "size": f"{h}x{w}", "dit_fwd_tflop": fwd / 1e12},
    ))  # fmt: skip
    return rows


def build_plan(gpus: int = 8) -> list[PlanRow]:
    if gpus < 1:
        raise BadInput(f"--gpus must be >= 1, got {gpus}")
    return [*oft_rows(gpus), *pi05_rows(gpus), *cosmos_policy_rows(gpus), *world_model_rows()]


def seconds(tflop: float, mfu: float, gpus: int = 1) -> float:
    return tflop / (PEAK_TFLOPS * mfu * gpus)


def render(rows: list[PlanRow], mfu: float = 0.4) -> str:
    if not 0 < mfu <= 1:
        raise BadInput(f"mfu must be in (0, 1], got {mfu}")
    header = ["config", "GPUs", "params B", "train M", "weights", "grads", "optim", "act off", "act on",
              "total ckpt", "act TFLOP", f"act s x{ENVS}", "update TFLOP", "update s"]  # fmt: skip
    body = [[
        r.name, r.gpus, f"{r.params / 1e9:.3f}", f"{r.trainable / 1e6:,.1f}",
        *(f"{x / GIB:.1f}" for x in (r.weights, r.grads, r.optimizer, r.act_off, r.act_on, r.total(True))),
        f"{r.act_tflop:.2f}", f"{seconds(r.act_tflop * ENVS, mfu, r.gpus):.2f}",
        f"{r.update_tflop:,.0f}", f"{seconds(r.update_tflop, mfu, r.gpus):.1f}",
    ] for r in rows]  # fmt: skip
    title = (
        f"Memory (GiB per GPU) and time per configuration, on paper: {PEAK_TFLOPS:.0f} TFLOP/s bf16 peak "
        f"(H100/H200) at {mfu:.0%} MFU; 'act s' = one {ENVS}-env chunk step, 'update s' = one optimizer step"
    )
    notes = "\n".join(f"  {r.name}: {r.notes}" for r in rows)
    return f"{table(header, body, title=title)}\nnotes:\n{notes}"


def to_json(rows: list[PlanRow]) -> list[dict[str, Any]]:
    return [{**asdict(r), "total_ckpt_on": r.total(True), "total_ckpt_off": r.total(False)} for r in rows]


def main(argv: list[str] | None = None) -> list[PlanRow]:
    parser = argparse.ArgumentParser(
        prog=program_name(),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--gpus", type=int, default=8, help="N for the FSDP rows")
    parser.add_argument("--mfu", type=float, default=0.4, help="fraction of the bf16 peak achieved")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = build_plan(args.gpus)
    print(render(rows, args.mfu))
    if args.json:
        print(f"wrote {write_json(args.json, {'mfu': args.mfu, 'rows': to_json(rows)})}")
    return rows


def planned_world_model_rows() -> set[tuple[str, int, str]]:
    """(backend, envs, frame size) of the plan's world-model rows, what ``gpu_step_times`` measures."""
    return {(b, ENVS, f"{h}x{w}") for b, (h, w) in WM_FRAMES.items()}


if __name__ == "__main__":
    run_cli(main)
