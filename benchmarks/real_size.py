"""Real size on paper: every model we wrap, built at its published size on the meta device (no memory,
no weights), its parameters counted by component and compared with the reference's count.

    python -m benchmarks.real_size                        # all models, one table each
    python -m benchmarks.real_size --models pi05 --json runs/benchmarks/real_size.json
    python -m benchmarks.real_size --plan                 # also the memory and time plan (real_size_plan)

A reference count comes from the reference's own code built the same way on meta where it is installed
(transformers: Llama-2-7B, SigLIP, DINOv2 with registers, PaliGemma, Gemma; diffusers: the Cosmos DiT,
the Wan and SDXL VAEs), else from the checkpoint's key layout written from the reference modeling code
(``benchmarks/reference_layouts.py``), else from a published figure (an index's ``total_size``, a file
size). Each row is ``OK`` (equal), ``DIFF`` (a difference we expect, of exactly the size its named cause
gives) or ``FAIL`` (any other difference, with the cause as far as it is known). Key rows compare the
names and shapes our loaders expect with the reference's. Takes about 10-30 s on a CPU; exits 1 when a
row fails.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from benchmarks import reference_layouts as ref
from benchmarks.report import table, write_json
from nets.errors import BadInput, program_name, run_cli

MODELS = ("openvla-7b", "openvla-oft", "pi05", "cosmos-policy", "cosmos-wm", "opensora-wm")


@dataclass
class Row:
    """One line of a model's table: our count against a reference's."""

    component: str
    ours: int
    reference: int
    source: str
    status: str = ""
    cause: str = ""


def compare(
    component: str,
    ours: int,
    reference: int,
    source: str,
    expected: tuple[int, str] | None = None,
    tolerance: int = 0,
) -> Row:
    """``expected`` = (ours - reference, its cause) for a difference we know of; ``tolerance`` for a
    reference that is a rounded published figure."""
    diff = ours - reference
    if abs(diff) <= tolerance:
        return Row(
            component, ours, reference, source, "OK", "" if not diff else f"within rounding ({diff:+,})"
        )
    if expected is not None and diff == expected[0]:
        return Row(component, ours, reference, source, "DIFF", expected[1])
    why = f"ours - reference = {diff:+,}"
    if expected is not None:
        why += f"; expected {expected[0]:+,} ({expected[1]})"
    return Row(component, ours, reference, source, "FAIL", why)


def compare_keys(
    component: str,
    ours: dict[str, tuple[int, ...]],
    reference: dict[str, tuple[int, ...]],
    source: str,
    missing_ok: dict[str, str] | None = None,
    renamed: str = "",
) -> Row:
    """Names and shapes: ``missing_ok`` maps reference names we do not build to the reason;
    ``renamed`` names a renaming already applied to the reference's names (the row is then a DIFF)."""
    missing_ok = missing_ok or {}
    missing = sorted(set(reference) - set(ours))
    extra = sorted(set(ours) - set(reference))
    shapes = sorted(k for k in set(ours) & set(reference) if tuple(ours[k]) != tuple(reference[k]))
    unexpected = [k for k in missing if k not in missing_ok]
    if not (unexpected or extra or shapes):
        notes = [renamed] if renamed else []
        notes += [f"{k} not built: {missing_ok[k]}" for k in missing]
        if notes:
            return Row(component, len(ours), len(reference), source, "DIFF", "; ".join(notes))
        return Row(component, len(ours), len(reference), source, "OK", "names and shapes equal")
    parts = []
    for label, keys in (("missing", unexpected), ("extra", extra)):
        if keys:
            parts.append(f"{len(keys)} {label} (e.g. {keys[0]})")
    if shapes:
        k = shapes[0]
        parts.append(f"{len(shapes)} shapes differ (e.g. {k}: ours {ours[k]}, reference {reference[k]})")
    return Row(component, len(ours), len(reference), source, "FAIL", "; ".join(parts))


def params(module: nn.Module, prefix: str = "") -> int:
    """Number of parameter values under ``prefix`` (a tied tensor counted once)."""
    return sum(p.numel() for k, p in module.named_parameters() if k.startswith(prefix))


def shapes(module: nn.Module | dict[str, torch.Tensor], prefix: str = "") -> dict[str, tuple[int, ...]]:
    state = module.state_dict() if isinstance(module, nn.Module) else module
    return {k[len(prefix) :]: tuple(v.shape) for k, v in state.items() if k.startswith(prefix)}


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build()


# ---- the models ------------------------------------------------------------------------------------

INDEX_OPENVLA_7B = 15_082_474_368  # openvla/openvla-7b model.safetensors.index.json total_size (bf16 bytes)


def _openvla_backbone_rows() -> tuple[list[Row], nn.Module]:
    from transformers import (
        Dinov2WithRegistersConfig,
        Dinov2WithRegistersModel,
        LlamaConfig,
        LlamaForCausalLM,
        SiglipVisionConfig,
        SiglipVisionModel,
    )

    from policies.openvla_oft.config import OpenVLAConfig
    from policies.openvla_oft.modeling import OpenVLAModel

    model = on_meta(lambda: OpenVLAModel(OpenVLAConfig.openvla_7b()))
    layout = ref.expand(ref.OPENVLA_7B)
    dino, siglip = "vision_backbone.featurizer.", "vision_backbone.fused_featurizer."
    # transformers' references at the towers' published sizes (timm ids in OpenVLA's config.json)
    hf_dino = on_meta(lambda: Dinov2WithRegistersModel(Dinov2WithRegistersConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, mlp_ratio=4, image_size=224,
        patch_size=14, num_register_tokens=4)))  # fmt: skip
    hf_siglip = on_meta(lambda: SiglipVisionModel(SiglipVisionConfig(
        hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
        image_size=224, patch_size=14)))  # fmt: skip
    # transformers' LlamaConfig defaults are Llama-2-7B's; OpenVLA pads the vocabulary to 32064
    hf_llama = on_meta(lambda: LlamaForCausalLM(LlamaConfig(vocab_size=32064, pad_token_id=32000)))
    rows = [
        compare("DINOv2 ViT-L/14 reg4 (224 px)", params(model, dino), ref.count(layout, dino),
                "checkpoint layout (timm)"),
        compare("DINOv2 ViT-L/14 reg4 (224 px)", params(model, dino), params(hf_dino),
                "transformers Dinov2WithRegistersModel",
                expected=(-2 * 1024, "transformers adds a mask_token and a class-token position "
                          "embedding (1024 each) that timm's reg4 model, the checkpoint's, lacks")),
        compare("SigLIP so400m/14 + MAP head", params(model, siglip), params(hf_siglip),
                "transformers SiglipVisionModel"),
        compare("projector (fused GELU MLP)", params(model, "projector."), ref.count(layout, "projector."),
                "checkpoint layout"),
        compare("LLM Llama-2-7B (vocab 32064)", params(model, "language_model."), params(hf_llama),
                "transformers LlamaForCausalLM"),
        compare("total", params(model), INDEX_OPENVLA_7B // 2, "openvla-7b index total_size / 2 B"),
        compare_keys("keys: all", shapes(model), layout, "checkpoint layout (982)"),
        compare_keys("keys: LLM", shapes(model, "language_model."), shapes(hf_llama), "transformers Llama"),
    ]  # fmt: skip
    return rows, model


def openvla_7b() -> list[Row]:
    return _openvla_backbone_rows()[0]


def openvla_oft() -> list[Row]:
    from policies.openvla_oft.action_heads import L1RegressionActionHead
    from policies.openvla_oft.config import OFT_LIBERO
    from policies.openvla_oft.proprio import ProprioProjector

    backbone_rows, backbone = _openvla_backbone_rows()
    oft = OFT_LIBERO
    head = on_meta(lambda: L1RegressionActionHead(oft.hidden_size, oft.action_dim))
    proprio = on_meta(lambda: ProprioProjector(oft.hidden_size, oft.proprio_dim))
    head_ref = ref.expand(ref.oft_l1_head(oft.hidden_size, oft.action_dim))
    proprio_ref = ref.expand(ref.oft_proprio_projector(oft.hidden_size, oft.proprio_dim))
    total_ref = INDEX_OPENVLA_7B // 2 + ref.count(head_ref) + ref.count(proprio_ref)
    src = "openvla-oft action_heads.py / projectors.py"
    return [
        Row("OpenVLA-7B backbone", params(backbone), INDEX_OPENVLA_7B // 2, "openvla-7b index / 2 B",
            "OK" if all(r.status != "FAIL" for r in backbone_rows) else "FAIL",
            "rows of openvla-7b"),
        compare("L1 action head (MLPResNet 28672->4096->7)", params(head), ref.count(head_ref), src),
        compare("proprio projector (8->4096->4096)", params(proprio), ref.count(proprio_ref), src),
        compare("total", params(backbone) + params(head) + params(proprio), total_ref, "sum of the above"),
        compare_keys("keys: action head", shapes(head), head_ref, "openvla-oft action_heads.py"),
        compare_keys("keys: proprio projector", shapes(proprio), proprio_ref, "openvla-oft projectors.py"),
    ]  # fmt: skip


def pi05() -> list[Row]:
    from transformers import (
        GemmaConfig,
        GemmaModel,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        SiglipVisionConfig,
    )

    from policies.pi05.config import PALIGEMMA_VOCAB, Pi05Config
    from policies.pi05.modeling import EXPERT_LM_HEAD, Pi05Model, to_checkpoint_keys

    config = Pi05Config.pi05_libero()
    model = on_meta(lambda: Pi05Model(config))
    pali, exp = config.paligemma(), config.expert()

    def gemma(spec: Any, vocab: int) -> GemmaConfig:  # openpi gemma.py get_config sizes
        return GemmaConfig(vocab_size=vocab, hidden_size=spec.width, intermediate_size=spec.mlp_dim,
                           num_hidden_layers=spec.depth, num_attention_heads=spec.num_heads,
                           num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim)  # fmt: skip

    vision = SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                                num_attention_heads=16, image_size=224, patch_size=14,
                                vision_use_head=False)  # fmt: skip
    hf_pali = on_meta(lambda: PaliGemmaForConditionalGeneration(PaliGemmaConfig(
        vision_config=vision.to_dict(), text_config=gemma(pali, PALIGEMMA_VOCAB).to_dict(),
        projection_dim=pali.width, vocab_size=PALIGEMMA_VOCAB)))  # fmt: skip
    hf_expert = on_meta(lambda: GemmaModel(gemma(exp, PALIGEMMA_VOCAB)))
    ours_pali = "paligemma_with_expert.paligemma.model."
    layout = ref.expand(ref.PI05)
    norms = 2 * exp.depth + 1
    adarms = norms * (exp.width * 3 * exp.width + 3 * exp.width - exp.width)
    heads = ("action_in_proj.", "action_out_proj.", "time_mlp_in.", "time_mlp_out.")
    ckpt = {k: tuple(v.shape) for k, v in to_checkpoint_keys(model.state_dict()).items()}
    # transformers 5 keeps the SigLIP tower without its ``vision_model.`` level; openpi's files (saved
    # with transformers 4.53) have it: put it back before comparing
    hf_pali_keys = {
        "paligemma_with_expert.paligemma."
        + k.replace("model.vision_tower.", "model.vision_tower.vision_model."): s
        for k, s in shapes(hf_pali).items()
    }
    vision_names = sum(k.startswith("model.vision_tower.") for k in shapes(hf_pali))
    tied = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    return [
        compare("SigLIP so400m/14 (no head)", params(model, ours_pali + "vision_tower."),
                params(hf_pali, "model.vision_tower."), "transformers PaliGemma vision tower"),
        compare("projector (1152->2048)", params(model, ours_pali + "multi_modal_projector."),
                params(hf_pali, "model.multi_modal_projector."), "transformers PaliGemma"),
        compare("LLM Gemma 2B (tied embedding)", params(model, ours_pali + "language_model."),
                params(hf_pali, "model.language_model."), "transformers PaliGemma"),
        compare("PaliGemma 3B (all of the above)", params(model, ours_pali), params(hf_pali),
                "transformers PaliGemmaForConditionalGeneration"),
        compare("action expert Gemma 300M (adaRMS)", params(model, "paligemma_with_expert.gemma_expert."),
                params(hf_expert) - params(hf_expert, "embed_tokens."),
                "transformers GemmaModel, no embedding",
                expected=(adarms, f"openpi's adaRMS: each of the {norms} norms is a Linear "
                          f"{exp.width}->{3 * exp.width} (with bias) instead of a {exp.width}-d weight")),
        compare("action / time projections", sum(params(model, h) for h in heads),
                sum(ref.count(layout, h) for h in heads), "openpi checkpoint layout"),
        compare("total", params(model), ref.count(layout), "openpi checkpoint layout (812 tensors)",
                expected=(-PALIGEMMA_VOCAB * exp.width, "the file's expert lm_head (GemmaForCausalLM "
                          "leftover, never called) is not built")),
        compare_keys("keys: all", ckpt, layout, "openpi checkpoint layout",
                     missing_ok={EXPERT_LM_HEAD: "never called"}),
        compare_keys("keys: PaliGemma", {k: s for k, s in ckpt.items() if k.startswith(
            "paligemma_with_expert.paligemma.")}, hf_pali_keys, "transformers PaliGemma",
            missing_ok={tied: "tied to lm_head, stored once"},
            renamed=f"{vision_names} transformers-5 vision names given openpi's vision_model. level"),
    ]  # fmt: skip


def _cosmos_dit_rows(config: Any, label: str) -> tuple[list[Row], nn.Module]:
    from diffusers import CosmosTransformer3DModel

    from nets.cosmos_dit import CosmosDiT

    dit = on_meta(lambda: CosmosDiT(config))
    proj = config.crossattn_proj_in_channels
    hf = on_meta(lambda: CosmosTransformer3DModel(
        in_channels=config.in_channels + 1, out_channels=config.out_channels,  # + the condition mask
        num_attention_heads=config.num_heads, attention_head_dim=config.head_dim,
        num_layers=config.num_blocks, mlp_ratio=config.mlp_ratio,
        text_embed_dim=config.crossattn_emb_channels, adaln_lora_dim=config.adaln_lora_dim,
        max_size=config.max_size, patch_size=(1, 2, 2), rope_scale=config.rope_scale,
        concat_padding_mask=True, extra_pos_embed_type=None, use_crossattn_projection=proj is not None,
        crossattn_proj_in_channels=proj or 1024))  # fmt: skip
    ours_body = {k: s for k, s in shapes(dit).items() if not k.startswith("action_embedder")}
    hf_named = {ref.cosmos_name_from_diffusers(k): s for k, s in shapes(hf).items()}
    body = sum(p.numel() for k, p in dit.named_parameters() if not k.startswith("action_embedder"))
    rows = [
        compare(label, body, params(hf), "diffusers CosmosTransformer3DModel"),
        compare_keys("keys: DiT", ours_body, hf_named, "diffusers, names mapped to the checkpoint's"),
    ]
    if config.action_dim is not None:  # cosmos-predict2 ActionConditionedMinimalV1LVGDiT: two Mlp
        d, hidden = config.model_channels, 4 * config.model_channels
        mlps = sum(config.action_dim * hidden + hidden + hidden * out + out for out in (d, 3 * d))
        label = f"action MLPs ({config.action_dim}->{hidden}->D, 3D)"
        rows.insert(1, compare(label, params(dit, "action_embedder"), mlps, "cosmos-predict2 action DiT"))
    return rows, dit


def _wan_vae_rows() -> tuple[list[Row], nn.Module]:
    from diffusers import AutoencoderKLWan

    from nets.wan_vae import build_wan_vae

    vae = on_meta(build_wan_vae)
    hf = on_meta(AutoencoderKLWan)  # diffusers' defaults are Wan 2.1's VAE
    return [
        compare("Wan 2.1 VAE", params(vae), params(hf), "diffusers AutoencoderKLWan() defaults"),
        compare_keys("keys: Wan VAE", shapes(vae), shapes(hf), "diffusers AutoencoderKLWan()"),
    ], vae


def cosmos_policy() -> list[Row]:
    from nets.cosmos_dit import CosmosDiTConfig

    dit_rows, dit = _cosmos_dit_rows(CosmosDiTConfig.predict2_2b_video2world(), "DiT Predict2-2B Video2World")
    layout = ref.expand(ref.COSMOS_PREDICT2_2B)
    vae_rows, vae = _wan_vae_rows()
    return [
        *dit_rows,
        compare_keys("keys: DiT", shapes(dit), layout, "Cosmos Policy checkpoint layout (567)"),
        *vae_rows,
        compare("total (DiT + VAE; T5 embeddings precomputed)", params(dit) + params(vae),
                ref.count(layout) + params(on_meta(__import__("diffusers").AutoencoderKLWan)),
                "checkpoint layout + diffusers Wan VAE"),
    ]  # fmt: skip


COSMOS_WM_FILE_GIB = 11.89  # libero-spatial-2b-19k.pt as documented: fp32 weights + bf16 EMA, 6 B each


def cosmos_wm() -> list[Row]:
    from nets.cosmos_dit import CosmosDiTConfig

    dit_rows, dit = _cosmos_dit_rows(CosmosDiTConfig.predict2_5_action_2b(), "DiT body + Reason1 proj")
    vae_rows, vae = _wan_vae_rows()
    from_file = round(COSMOS_WM_FILE_GIB * 2**30 / 6)
    return [
        *dit_rows,
        compare("DiT total", params(dit), from_file, "11.89 GiB file / 6 B per param",
                tolerance=round(0.005 * 2**30 / 6)),
        *vae_rows,
        compare("total (DiT + VAE)", params(dit) + params(vae), from_file + params(vae),
                "file size + diffusers Wan VAE", tolerance=round(0.005 * 2**30 / 6)),
    ]  # fmt: skip


SDXL_VAE_PARAMS = 83_653_863  # stabilityai/sdxl-vae (the SD VAE architecture): AutoencoderKL, 4 latent ch


def opensora_wm() -> list[Row]:
    from nets.opensora_stdit3 import STDiT3, STDiT3Config
    from nets.opensora_vae import build_sdxl_vae

    dit = on_meta(lambda: STDiT3(STDiT3Config.xl2_libero()))
    vae = on_meta(build_sdxl_vae)
    layout = ref.expand(ref.STDIT3_XL2)
    dit_ref = ref.count(layout, skip=ref.STDIT3_BUFFERS)
    return [
        compare("STDiT3-XL/2 + action embedder", params(dit), dit_ref, "Open-Sora stdit3.py layout + WMPO"),
        compare_keys("keys: STDiT3", shapes(dit), layout, "RLinf OpenSora checkpoint layout (978)"),
        compare("SDXL VAE", params(vae), SDXL_VAE_PARAMS, "stabilityai/sdxl-vae published count"),
        compare(
            "total (DiT + VAE)", params(dit) + params(vae), dit_ref + SDXL_VAE_PARAMS, "sum of the above"
        ),
    ]


BUILDERS: dict[str, Callable[[], list[Row]]] = {
    "openvla-7b": openvla_7b,
    "openvla-oft": openvla_oft,
    "pi05": pi05,
    "cosmos-policy": cosmos_policy,
    "cosmos-wm": cosmos_wm,
    "opensora-wm": opensora_wm,
}
TITLES = {
    "openvla-7b": "OpenVLA-7B (openvla/openvla-7b)",
    "openvla-oft": "OpenVLA-OFT (moojink/openvla-7b-oft-finetuned-libero-spatial: L1 head, proprio)",
    "pi05": "pi0.5 (openpi PI0Pytorch pi05=True, pi05_libero)",
    "cosmos-policy": "Cosmos Policy (nvidia/Cosmos-Policy-LIBERO-Predict2-2B: DiT + Wan 2.1 VAE)",
    "cosmos-wm": "Cosmos Predict 2.5 world model (RLinf libero-spatial-2b-19k.pt: action DiT + Wan 2.1 VAE)",
    "opensora-wm": "OpenSora world model (RLinf OpenSora LIBERO: STDiT3-XL/2 + SDXL VAE)",
}


def check_models(names: Iterable[str]) -> list[str]:
    """The names, each one of ``MODELS`` (else a ``BadInput`` naming the choices)."""
    names = list(names)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise BadInput(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    return names


def count_model(name: str) -> list[Row]:
    """The table rows of one model (built on meta)."""
    return BUILDERS[check_models([name])[0]]()


def render(name: str, rows: list[Row]) -> str:
    header = ["component", "ours", "reference", "source", "status", "cause / note"]
    body = [[r.component, f"{r.ours:,}", f"{r.reference:,}", r.source, r.status, r.cause] for r in rows]
    return table(header, body, title=TITLES[name])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog=program_name(),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"any of {', '.join(MODELS)}")
    parser.add_argument("--json", default=None, help="also write the tables (and the plan) as JSON here")
    parser.add_argument("--plan", action="store_true", help="also print the memory and time plan")
    args = parser.parse_args(argv)
    names = check_models(args.models)
    torch.set_num_threads(1)
    from tqdm import tqdm

    result: dict[str, Any] = {"models": {}}
    tables = []
    for name in (bar := tqdm(names, desc="real size on meta", unit="model", file=sys.stderr)):
        bar.set_postfix_str(name)
        rows = count_model(name)
        result["models"][name] = [asdict(r) for r in rows]
        tables.append(render(name, rows))
    print("\n\n".join(tables))
    failed = [
        (n, r["component"]) for n, rows in result["models"].items() for r in rows if r["status"] == "FAIL"
    ]
    print(f"\n{sum(len(r) for r in result['models'].values())} rows, {len(failed)} FAIL")
    if args.plan:
        from benchmarks import real_size_plan

        plan = real_size_plan.build_plan()
        print("\n" + real_size_plan.render(plan))
        result["plan"] = real_size_plan.to_json(plan)
    if args.json:
        print(f"wrote {write_json(args.json, result)}")
    if failed:
        raise SystemExit(f"FAIL rows: {failed}")
    return result


if __name__ == "__main__":
    run_cli(main)
