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

The lists themselves live in ``benchmarks/reference_layouts.py`` (shared with ``benchmarks.real_size``).
"""

from __future__ import annotations

import torch

from benchmarks.reference_layouts import COSMOS_PREDICT2_2B, OPENVLA_7B, PI05, expand
from nets.cosmos_dit import CosmosDiT, CosmosDiTConfig
from policies.openvla_oft.config import OpenVLAConfig
from policies.openvla_oft.modeling import OpenVLAModel
from policies.pi05.config import Pi05Config
from policies.pi05.modeling import EXPERT_LM_HEAD, Pi05Model, from_checkpoint_keys, to_checkpoint_keys
from policies.pretrained import empty_model


def shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def test_openvla_7b_key_layout_equals_the_checkpoint():
    expected = expand(OPENVLA_7B)
    assert len(expected) == 982
    assert sum(torch.Size(s).numel() for s in expected.values()) == 7_541_237_184
    with torch.device("meta"):
        model = OpenVLAModel(OpenVLAConfig.openvla_7b())
    ours = shapes(model)
    assert sorted(set(expected) - set(ours)) == []  # nothing missing
    assert sorted(set(ours) - set(expected)) == []  # nothing extra
    assert {k: v for k, v in ours.items() if v != expected[k]} == {}


def test_pi05_key_layout_equals_the_openpi_checkpoint():
    expected = expand(PI05)
    assert len(expected) == 812
    model = empty_model(lambda: Pi05Model(Pi05Config.pi05_libero()))
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
        model = CosmosDiT(CosmosDiTConfig.predict2_2b_video2world())  # no action MLPs
    assert shapes(model) == expected
