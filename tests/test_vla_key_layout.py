"""Key layouts of the public VLA checkpoints: our modules' state-dict names and shapes, built at real
size on the meta device (no memory), must equal the checkpoints' exactly.

The facts below were derived from the reference modeling code, not from ours: OpenVLA's
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

Repeated blocks are written once with ``{i}``.
"""

from __future__ import annotations

import torch

from nets.cosmos_dit import CosmosDiT, CosmosDiTConfig
from policies.openvla_oft.config import OpenVLAConfig
from policies.openvla_oft.modeling import OpenVLAModel
from policies.pi05.config import Pi05Config
from policies.pi05.modeling import EXPERT_LM_HEAD, Pi05Model, from_checkpoint_keys, to_checkpoint_keys
from policies.pretrained import empty_model

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


def expand(facts: list[tuple[str, tuple[int, ...], int]]) -> dict[str, tuple[int, ...]]:
    out = {}
    for name, shape, n in facts:
        for i in range(max(n, 1)):
            out[name.format(i=i) if n else name] = shape
    return out


def shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def test_openvla_7b_key_layout_equals_the_checkpoint():
    expected = expand(OPENVLA_7B)
    assert len(expected) == 982
    assert sum(torch.Size(s).numel() for s in expected.values()) == 7_541_237_184
    with torch.device("meta"):
        model = OpenVLAModel(OpenVLAConfig())  # the defaults are OpenVLA-7B's config.json
    ours = shapes(model)
    assert sorted(set(expected) - set(ours)) == []  # nothing missing
    assert sorted(set(ours) - set(expected)) == []  # nothing extra
    assert {k: v for k, v in ours.items() if v != expected[k]} == {}


def test_pi05_key_layout_equals_the_openpi_checkpoint():
    expected = expand(PI05)
    assert len(expected) == 812
    model = empty_model(lambda: Pi05Model(Pi05Config()))  # the defaults are pi05_libero's
    ours = {k: tuple(v.shape) for k, v in to_checkpoint_keys(model.state_dict()).items()}
    # everything in the file is a weight of ours, except the expert's vestigial lm_head
    assert sorted(set(expected) - set(ours)) == [EXPERT_LM_HEAD]
    assert sorted(set(ours) - set(expected)) == []
    assert {k: v for k, v in ours.items() if v != expected[k]} == {}
    # and reading the file's names maps onto exactly our module names
    fake_file = {k: torch.empty(0) for k in expected}
    mapped, unused = from_checkpoint_keys(fake_file)
    assert unused == [EXPERT_LM_HEAD] and set(mapped) == set(model.state_dict())
    lerobot = {f"model.{k}": v for k, v in fake_file.items()}  # lerobot's PI05Policy prefix
    assert set(from_checkpoint_keys(lerobot)[0]) == set(model.state_dict())


def test_cosmos_policy_dit_key_layout_equals_predict2_2b():
    expected = expand(COSMOS_PREDICT2_2B)
    assert len(expected) == 567
    with torch.device("meta"):
        model = CosmosDiT(CosmosDiTConfig(action_dim=None))  # the world model's DiT class, no action MLPs
    assert shapes(model) == expected
