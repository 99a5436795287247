"""Reference key layouts of the public checkpoints we load: names and shapes, written from the
reference modeling code (not from ours), shared by ``tests/`` and ``benchmarks/real_size.py``.

OpenVLA-7B: OpenVLA's
``modeling_prismatic.py`` (openvla/openvla, moojink/openvla-oft) composing timm's
``vit_large_patch14_reg4_dinov2.lvd142m`` and ``vit_so400m_patch14_siglip_224`` towers (built with timm
0.9.10 and 1.0.31: same keys) and transformers' Llama-2 with ``vocab_size`` 32064; LayerScale ``gamma``
is stored as ``scale_factor``. 982 tensors, 7,541,237,184 parameters (the openvla-7b index's
``total_size`` of 15,082,474,368 bytes in bfloat16).

pi0.5: the ``model.safetensors`` of openpi's PyTorch conversion (``PI0Pytorch(pi05=True)`` built with
openpi's patched transformers 4.53.2, ``rlinf-transformer-openpi``, saved by
``safetensors.torch.save_model``), the layout of ``sunshk/pi05_libero_pytorch`` and
``fwd4xl/pi05-b1k-pt12-cs32-v1``: 812 tensors. The tied PaliGemma embedding is stored once, as
``paligemma.lm_head.weight``; the expert's ``lm_head`` is a leftover of ``GemmaForCausalLM`` that the
model never calls (and conversions never fill); the expert's adaRMS norms have only ``dense``.

Cosmos Policy (``nvidia/Cosmos-Policy-LIBERO-Predict2-2B``): the unmodified Cosmos-Predict2-2B
Video2World DiT (``MinimalV1LVGDiT``: 2048 channels, 28 blocks, 16 heads, 1x2x2 patches of 16 + 2
mask channels, AdaLN-LoRA 256, T5 1024-d cross-attention), its ``net.*`` keys as listed for that
checkpoint family (the same names as the Cosmos-Predict2 world model's DiT, without the action MLPs).

STDiT3 (OpenSora, RLinf's LIBERO checkpoints): hpcaitech/Open-Sora v1.2 ``opensora/models/stdit/stdit3.py``
``STDiT3_XL_2`` (hidden 1152, 28 spatial + 28 temporal blocks, 16 heads, MLP 4x, patch 1x2x2 over 4 SDXL
latent channels, ``pred_sigma`` doubling the output, T5 caption path 4096 x 300 kept though unused) with
the WMPO fork's action embedder (``Mlp(7 -> 4608 -> 1152)`` and a learned ``none_action``); 978 entries,
``y_embedder.y_embedding`` a buffer, ``rope.freqs`` a (frozen) parameter.

OpenVLA-OFT's extra modules: openvla-oft ``prismatic/models/action_heads.py`` (``L1RegressionActionHead``:
``MLPResNet(num_blocks=2, input_dim=4096 * 7, hidden_dim=4096, output_dim=7)``) and
``prismatic/models/projectors.py`` (``ProprioProjector(llm_dim=4096, proprio_dim=8)``).

Repeated blocks are written once with ``{i}``; ``expand`` writes them out.
"""

from __future__ import annotations

import torch

OPENVLA_7B = [  # (name, shape, number of blocks; 0 = not repeated)
    ("vision_backbone.featurizer.cls_token", (1, 1, 1024), 0),
    ("vision_backbone.featurizer.reg_token", (1, 4, 1024), 0),
    ("vision_backbone.featurizer.pos_embed", (1, 256, 1024), 0),
    ("vision_backbone.featurizer.patch_embed.proj.weight", (1024, 3, 14, 14), 0),
    ("vision_backbone.featurizer.patch_embed.proj.bias", (1024,), 0),
    ("vision_backbone.featurizer.blocks.{i}.norm1.weight", (1024,), 24),
    ("vision_backbone.featurizer.blocks.{i}.norm1.bias", (1024,), 24),
    ("vision_backbone.featurizer.blocks.{i}.attn.qkv.weight", (3072, 1024), 24),
    ("vision_backbone.featurizer.blocks.{i}.attn.qkv.bias", (3072,), 24),
    ("vision_backbone.featurizer.blocks.{i}.attn.proj.weight", (1024, 1024), 24),
    ("vision_backbone.featurizer.blocks.{i}.attn.proj.bias", (1024,), 24),
    ("vision_backbone.featurizer.blocks.{i}.ls1.scale_factor", (1024,), 24),
    ("vision_backbone.featurizer.blocks.{i}.norm2.weight", (1024,), 24),
    ("vision_backbone.featurizer.blocks.{i}.norm2.bias", (1024,), 24),
    ("vision_backbone.featurizer.blocks.{i}.mlp.fc1.weight", (4096, 1024), 24),
    ("vision_backbone.featurizer.blocks.{i}.mlp.fc1.bias", (4096,), 24),
    ("vision_backbone.featurizer.blocks.{i}.mlp.fc2.weight", (1024, 4096), 24),
    ("vision_backbone.featurizer.blocks.{i}.mlp.fc2.bias", (1024,), 24),
    ("vision_backbone.featurizer.blocks.{i}.ls2.scale_factor", (1024,), 24),
    ("vision_backbone.featurizer.norm.weight", (1024,), 0),
    ("vision_backbone.featurizer.norm.bias", (1024,), 0),
    ("vision_backbone.fused_featurizer.pos_embed", (1, 256, 1152), 0),
    ("vision_backbone.fused_featurizer.patch_embed.proj.weight", (1152, 3, 14, 14), 0),
    ("vision_backbone.fused_featurizer.patch_embed.proj.bias", (1152,), 0),
    ("vision_backbone.fused_featurizer.blocks.{i}.norm1.weight", (1152,), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.norm1.bias", (1152,), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.attn.qkv.weight", (3456, 1152), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.attn.qkv.bias", (3456,), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.attn.proj.weight", (1152, 1152), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.attn.proj.bias", (1152,), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.norm2.weight", (1152,), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.norm2.bias", (1152,), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.mlp.fc1.weight", (4304, 1152), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.mlp.fc1.bias", (4304,), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.mlp.fc2.weight", (1152, 4304), 27),
    ("vision_backbone.fused_featurizer.blocks.{i}.mlp.fc2.bias", (1152,), 27),
    ("vision_backbone.fused_featurizer.norm.weight", (1152,), 0),
    ("vision_backbone.fused_featurizer.norm.bias", (1152,), 0),
    ("vision_backbone.fused_featurizer.attn_pool.latent", (1, 1, 1152), 0),
    ("vision_backbone.fused_featurizer.attn_pool.q.weight", (1152, 1152), 0),
    ("vision_backbone.fused_featurizer.attn_pool.q.bias", (1152,), 0),
    ("vision_backbone.fused_featurizer.attn_pool.kv.weight", (2304, 1152), 0),
    ("vision_backbone.fused_featurizer.attn_pool.kv.bias", (2304,), 0),
    ("vision_backbone.fused_featurizer.attn_pool.proj.weight", (1152, 1152), 0),
    ("vision_backbone.fused_featurizer.attn_pool.proj.bias", (1152,), 0),
    ("vision_backbone.fused_featurizer.attn_pool.norm.weight", (1152,), 0),
    ("vision_backbone.fused_featurizer.attn_pool.norm.bias", (1152,), 0),
    ("vision_backbone.fused_featurizer.attn_pool.mlp.fc1.weight", (4304, 1152), 0),
    ("vision_backbone.fused_featurizer.attn_pool.mlp.fc1.bias", (4304,), 0),
    ("vision_backbone.fused_featurizer.attn_pool.mlp.fc2.weight", (1152, 4304), 0),
    ("vision_backbone.fused_featurizer.attn_pool.mlp.fc2.bias", (1152,), 0),
    ("projector.fc1.weight", (8704, 2176), 0),
    ("projector.fc1.bias", (8704,), 0),
    ("projector.fc2.weight", (4096, 8704), 0),
    ("projector.fc2.bias", (4096,), 0),
    ("projector.fc3.weight", (4096, 4096), 0),
    ("projector.fc3.bias", (4096,), 0),
    ("language_model.model.embed_tokens.weight", (32064, 4096), 0),
    ("language_model.model.layers.{i}.self_attn.q_proj.weight", (4096, 4096), 32),
    ("language_model.model.layers.{i}.self_attn.k_proj.weight", (4096, 4096), 32),
    ("language_model.model.layers.{i}.self_attn.v_proj.weight", (4096, 4096), 32),
    ("language_model.model.layers.{i}.self_attn.o_proj.weight", (4096, 4096), 32),
    ("language_model.model.layers.{i}.mlp.gate_proj.weight", (11008, 4096), 32),
    ("language_model.model.layers.{i}.mlp.up_proj.weight", (11008, 4096), 32),
    ("language_model.model.layers.{i}.mlp.down_proj.weight", (4096, 11008), 32),
    ("language_model.model.layers.{i}.input_layernorm.weight", (4096,), 32),
    ("language_model.model.layers.{i}.post_attention_layernorm.weight", (4096,), 32),
    ("language_model.model.norm.weight", (4096,), 0),
    ("language_model.lm_head.weight", (32064, 4096), 0),
]

_V = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
_L = "paligemma_with_expert.paligemma.model.language_model."
_E = "paligemma_with_expert.gemma_expert."
PI05 = [
    (_V + "embeddings.patch_embedding.weight", (1152, 3, 14, 14), 0),
    (_V + "embeddings.patch_embedding.bias", (1152,), 0),
    (_V + "embeddings.position_embedding.weight", (256, 1152), 0),
    *[
        (_V + f"encoder.layers.{{i}}.{n}.{p}", (1152,), 27)
        for n in ("layer_norm1", "layer_norm2")
        for p in ("weight", "bias")
    ],
    *[
        (_V + f"encoder.layers.{{i}}.self_attn.{n}_proj.weight", (1152, 1152), 27)
        for n in "q k v out".split()
    ],
    *[(_V + f"encoder.layers.{{i}}.self_attn.{n}_proj.bias", (1152,), 27) for n in "q k v out".split()],
    (_V + "encoder.layers.{i}.mlp.fc1.weight", (4304, 1152), 27),
    (_V + "encoder.layers.{i}.mlp.fc1.bias", (4304,), 27),
    (_V + "encoder.layers.{i}.mlp.fc2.weight", (1152, 4304), 27),
    (_V + "encoder.layers.{i}.mlp.fc2.bias", (1152,), 27),
    (_V + "post_layernorm.weight", (1152,), 0),
    (_V + "post_layernorm.bias", (1152,), 0),
    ("paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight", (2048, 1152), 0),
    ("paligemma_with_expert.paligemma.model.multi_modal_projector.linear.bias", (2048,), 0),
    (_L + "layers.{i}.self_attn.q_proj.weight", (2048, 2048), 18),
    (_L + "layers.{i}.self_attn.k_proj.weight", (256, 2048), 18),
    (_L + "layers.{i}.self_attn.v_proj.weight", (256, 2048), 18),
    (_L + "layers.{i}.self_attn.o_proj.weight", (2048, 2048), 18),
    (_L + "layers.{i}.mlp.gate_proj.weight", (16384, 2048), 18),
    (_L + "layers.{i}.mlp.up_proj.weight", (16384, 2048), 18),
    (_L + "layers.{i}.mlp.down_proj.weight", (2048, 16384), 18),
    (_L + "layers.{i}.input_layernorm.weight", (2048,), 18),
    (_L + "layers.{i}.post_attention_layernorm.weight", (2048,), 18),
    (_L + "norm.weight", (2048,), 0),
    ("paligemma_with_expert.paligemma.lm_head.weight", (257152, 2048), 0),
    (_E + "model.layers.{i}.self_attn.q_proj.weight", (2048, 1024), 18),
    (_E + "model.layers.{i}.self_attn.k_proj.weight", (256, 1024), 18),
    (_E + "model.layers.{i}.self_attn.v_proj.weight", (256, 1024), 18),
    (_E + "model.layers.{i}.self_attn.o_proj.weight", (1024, 2048), 18),
    (_E + "model.layers.{i}.mlp.gate_proj.weight", (4096, 1024), 18),
    (_E + "model.layers.{i}.mlp.up_proj.weight", (4096, 1024), 18),
    (_E + "model.layers.{i}.mlp.down_proj.weight", (1024, 4096), 18),
    (_E + "model.layers.{i}.input_layernorm.dense.weight", (3072, 1024), 18),
    (_E + "model.layers.{i}.input_layernorm.dense.bias", (3072,), 18),
    (_E + "model.layers.{i}.post_attention_layernorm.dense.weight", (3072, 1024), 18),
    (_E + "model.layers.{i}.post_attention_layernorm.dense.bias", (3072,), 18),
    (_E + "model.norm.dense.weight", (3072, 1024), 0),
    (_E + "model.norm.dense.bias", (3072,), 0),
    (_E + "lm_head.weight", (257152, 1024), 0),
    ("action_in_proj.weight", (1024, 32), 0),
    ("action_in_proj.bias", (1024,), 0),
    ("action_out_proj.weight", (32, 1024), 0),
    ("action_out_proj.bias", (32,), 0),
    ("time_mlp_in.weight", (1024, 1024), 0),
    ("time_mlp_in.bias", (1024,), 0),
    ("time_mlp_out.weight", (1024, 1024), 0),
    ("time_mlp_out.bias", (1024,), 0),
]

COSMOS_PREDICT2_2B = [
    ("x_embedder.proj.1.weight", (2048, 72), 0),
    ("t_embedder.1.linear_1.weight", (2048, 2048), 0),
    ("t_embedder.1.linear_2.weight", (6144, 2048), 0),
    ("t_embedding_norm.weight", (2048,), 0),
    *[
        (f"blocks.{{i}}.self_attn.{n}.weight", (2048, 2048), 28)
        for n in ("q_proj", "k_proj", "v_proj", "output_proj")
    ],
    *[(f"blocks.{{i}}.cross_attn.{n}.weight", (2048, 2048), 28) for n in ("q_proj", "output_proj")],
    *[(f"blocks.{{i}}.cross_attn.{n}.weight", (2048, 1024), 28) for n in ("k_proj", "v_proj")],
    *[
        (f"blocks.{{i}}.{a}.{n}.weight", (128,), 28)
        for a in ("self_attn", "cross_attn")
        for n in ("q_norm", "k_norm")
    ],
    ("blocks.{i}.mlp.layer1.weight", (8192, 2048), 28),
    ("blocks.{i}.mlp.layer2.weight", (2048, 8192), 28),
    *[
        (f"blocks.{{i}}.adaln_modulation_{m}.1.weight", (256, 2048), 28)
        for m in ("self_attn", "cross_attn", "mlp")
    ],
    *[
        (f"blocks.{{i}}.adaln_modulation_{m}.2.weight", (6144, 256), 28)
        for m in ("self_attn", "cross_attn", "mlp")
    ],
    ("final_layer.adaln_modulation.1.weight", (256, 2048), 0),
    ("final_layer.adaln_modulation.2.weight", (4096, 256), 0),
    ("final_layer.linear.weight", (64, 2048), 0),
]

STDIT3_XL2 = [  # hidden 1152 (H), T5 4096 (C) x 300 tokens, MLP 4608 (4H), 6H AdaLN table rows
    ("x_embedder.proj.weight", (1152, 4, 1, 2, 2), 0),
    ("x_embedder.proj.bias", (1152,), 0),
    *[(f"{e}.mlp.0.weight", (1152, 256), 0) for e in ("t_embedder", "fps_embedder")],
    *[(f"{e}.mlp.0.bias", (1152,), 0) for e in ("t_embedder", "fps_embedder")],
    *[(f"{e}.mlp.2.weight", (1152, 1152), 0) for e in ("t_embedder", "fps_embedder")],
    *[(f"{e}.mlp.2.bias", (1152,), 0) for e in ("t_embedder", "fps_embedder")],
    ("action_embedder.fc.0.weight", (4608, 7), 0),
    ("action_embedder.fc.0.bias", (4608,), 0),
    ("action_embedder.fc.2.weight", (1152, 4608), 0),
    ("action_embedder.fc.2.bias", (1152,), 0),
    ("action_embedder.none_action.weight", (1, 1152), 0),
    ("t_block.1.weight", (6912, 1152), 0),
    ("t_block.1.bias", (6912,), 0),
    ("y_embedder.y_embedding", (300, 4096), 0),  # a buffer
    ("y_embedder.y_proj.fc1.weight", (1152, 4096), 0),
    ("y_embedder.y_proj.fc1.bias", (1152,), 0),
    ("y_embedder.y_proj.fc2.weight", (1152, 1152), 0),
    ("y_embedder.y_proj.fc2.bias", (1152,), 0),
    ("rope.freqs", (36,), 0),  # head 72 / 2 interleaved pairs
    *[
        (f"{kind}_blocks.{{i}}.{name}", shape, 28)
        for kind in ("spatial", "temporal")
        for name, shape in (
            ("scale_shift_table", (6, 1152)),
            ("attn.qkv.weight", (3456, 1152)),
            ("attn.qkv.bias", (3456,)),
            ("attn.q_norm.weight", (72,)),
            ("attn.k_norm.weight", (72,)),
            ("attn.proj.weight", (1152, 1152)),
            ("attn.proj.bias", (1152,)),
            ("cross_attn.q_linear.weight", (1152, 1152)),
            ("cross_attn.q_linear.bias", (1152,)),
            ("cross_attn.kv_linear.weight", (2304, 1152)),
            ("cross_attn.kv_linear.bias", (2304,)),
            ("cross_attn.proj.weight", (1152, 1152)),
            ("cross_attn.proj.bias", (1152,)),
            ("mlp.fc1.weight", (4608, 1152)),
            ("mlp.fc1.bias", (4608,)),
            ("mlp.fc2.weight", (1152, 4608)),
            ("mlp.fc2.bias", (1152,)),
        )
    ],
    ("final_layer.scale_shift_table", (2, 1152), 0),
    ("final_layer.linear.weight", (32, 1152), 0),  # 1 x 2 x 2 patch x 8 channels (pred_sigma)
    ("final_layer.linear.bias", (32,), 0),
]
STDIT3_BUFFERS = ("y_embedder.y_embedding",)


def oft_l1_head(hidden: int = 4096, action_dim: int = 7, blocks: int = 2) -> list:
    """openvla-oft's ``L1RegressionActionHead`` state dict (``model.`` = its ``MLPResNet``)."""
    inp = hidden * action_dim
    out = [
        ("model.layer_norm1.weight", (inp,), 0),
        ("model.layer_norm1.bias", (inp,), 0),
        ("model.fc1.weight", (hidden, inp), 0),
        ("model.fc1.bias", (hidden,), 0),
        ("model.mlp_resnet_blocks.{i}.ffn.0.weight", (hidden,), blocks),  # LayerNorm
        ("model.mlp_resnet_blocks.{i}.ffn.0.bias", (hidden,), blocks),
        ("model.mlp_resnet_blocks.{i}.ffn.1.weight", (hidden, hidden), blocks),  # Linear
        ("model.mlp_resnet_blocks.{i}.ffn.1.bias", (hidden,), blocks),
        ("model.layer_norm2.weight", (hidden,), 0),
        ("model.layer_norm2.bias", (hidden,), 0),
        ("model.fc2.weight", (action_dim, hidden), 0),
        ("model.fc2.bias", (action_dim,), 0),
    ]
    return out


def oft_proprio_projector(hidden: int = 4096, proprio_dim: int = 8) -> list:
    """openvla-oft's ``ProprioProjector`` state dict."""
    return [
        ("fc1.weight", (hidden, proprio_dim), 0),
        ("fc1.bias", (hidden,), 0),
        ("fc2.weight", (hidden, hidden), 0),
        ("fc2.bias", (hidden,), 0),
    ]


# diffusers ``CosmosTransformer3DModel`` name -> the original Cosmos checkpoint's (``net.`` stripped);
# the same correspondence diffusers' ``scripts/convert_cosmos_to_diffusers.py`` applies, read backwards.
COSMOS_DIFFUSERS_NAMES = [
    ("patch_embed.proj.", "x_embedder.proj.1."),
    ("time_embed.t_embedder.", "t_embedder.1."),
    ("time_embed.norm.", "t_embedding_norm."),
    ("transformer_blocks.", "blocks."),
    (".norm1.linear_", ".adaln_modulation_self_attn."),  # Sequential(SiLU, Linear, Linear): 1 and 2
    (".norm2.linear_", ".adaln_modulation_cross_attn."),
    (".norm3.linear_", ".adaln_modulation_mlp."),
    (".attn1.", ".self_attn."),
    (".attn2.", ".cross_attn."),
    (".norm_q.", ".q_norm."),
    (".norm_k.", ".k_norm."),
    (".to_q.", ".q_proj."),
    (".to_k.", ".k_proj."),
    (".to_v.", ".v_proj."),
    (".to_out.0.", ".output_proj."),
    (".ff.net.0.proj.", ".mlp.layer1."),
    (".ff.net.2.", ".mlp.layer2."),
    ("norm_out.linear_", "final_layer.adaln_modulation."),
    ("proj_out.", "final_layer.linear."),
]


def cosmos_name_from_diffusers(name: str) -> str:
    """The original checkpoint name of a diffusers ``CosmosTransformer3DModel`` parameter."""
    for old, new in COSMOS_DIFFUSERS_NAMES:
        name = name.replace(old, new)
    return name


def expand(facts: list[tuple[str, tuple[int, ...], int]]) -> dict[str, tuple[int, ...]]:
    """Name -> shape, with each ``{i}`` entry written out for its ``n`` blocks."""
    out = {}
    for name, shape, n in facts:
        for i in range(max(n, 1)):
            out[name.format(i=i) if n else name] = shape
    return out


def count(layout: dict[str, tuple[int, ...]], prefix: str = "", skip: tuple[str, ...] = ()) -> int:
    """Number of values of the entries under ``prefix`` (all by default), ``skip`` names left out."""
    return sum(torch.Size(s).numel() for k, s in layout.items() if k.startswith(prefix) and k not in skip)
