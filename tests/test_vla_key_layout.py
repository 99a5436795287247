"""Key layouts of the public VLA checkpoints: our modules' state-dict names and shapes, built at real
size on the meta device (no memory), must equal the checkpoints' exactly. The reference lists, and where
each fact comes from, are in ``benchmarks/reference_layouts.py`` (shared with ``benchmarks.real_size``)."""

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
