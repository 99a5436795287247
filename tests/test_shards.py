"""Sharded safetensors checkpoints (``model.safetensors.index.json`` + ``model-0000k-of-0000n``), the
layout of the public OpenVLA(-OFT) and OpenSora checkpoints, written at the real key names and tiny
shapes: they load through both loaders, and an index that names a missing shard, a file outside its
folder or a link leading out of it is refused before any shard is opened."""

from __future__ import annotations

import json
import os

import pytest
import torch

from nets.errors import BadInput
from nets.opensora_checkpoint import load_stdit3
from nets.opensora_tiny import write_tiny_stdit3
from nets.shards import INDEX_FILE, read_shard_index
from policies.openvla_oft.tiny import write_tiny_openvla
from policies.pretrained import read_state_dict


@pytest.fixture(scope="module")
def openvla(tmp_path_factory):
    return write_tiny_openvla(tmp_path_factory.mktemp("openvla") / "tiny")


@pytest.fixture(scope="module")
def stdit3(tmp_path_factory):
    return write_tiny_stdit3(tmp_path_factory.mktemp("stdit3") / "tiny", shards=3)


def _copy(folder, target):
    target.mkdir()
    for entry in folder.iterdir():
        if entry.is_file():
            (target / entry.name).write_bytes(entry.read_bytes())
    return target


def _rewrite_index(folder, change) -> None:
    index = json.loads((folder / INDEX_FILE).read_text())
    change(index["weight_map"])
    (folder / INDEX_FILE).write_text(json.dumps(index))


def test_sharded_checkpoints_load_with_the_public_layout(openvla, stdit3):
    files, weight_map = read_shard_index(openvla / INDEX_FILE)
    assert len(files) >= 3 and [f.name for f in files][0] == f"model-00001-of-{len(files):05d}.safetensors"
    state = read_state_dict(openvla)
    assert set(state) == set(weight_map)
    assert any(k.startswith("vision_backbone.featurizer.blocks.0.") for k in state)
    assert any(k.startswith("language_model.model.layers.0.self_attn.") for k in state)
    model = load_stdit3(stdit3)
    assert len(read_shard_index(stdit3 / INDEX_FILE)[0]) == 3
    assert isinstance(model, torch.nn.Module)


@pytest.mark.parametrize(
    "name",
    ["../outside.safetensors", "/etc/passwd", "sub/model.safetensors", "..", "", 7, None],
)
def test_an_index_naming_a_file_outside_its_folder_is_refused(openvla, stdit3, tmp_path, name):
    for i, (source, load) in enumerate(((openvla, read_state_dict), (stdit3, load_stdit3))):
        copy = _copy(source, tmp_path / f"copy{i}")
        (tmp_path / "outside.safetensors").write_bytes((source / sorted(os.listdir(source))[-1]).read_bytes())

        def point_one_key(weight_map):
            weight_map[next(iter(weight_map))] = name

        _rewrite_index(copy, point_one_key)
        with pytest.raises(BadInput, match="shard") as error:
            load(copy)
        assert INDEX_FILE in str(error.value)


def test_a_shard_linked_outside_the_folder_is_refused(openvla, stdit3, tmp_path):
    for i, (source, load) in enumerate(((openvla, read_state_dict), (stdit3, load_stdit3))):
        copy = _copy(source, tmp_path / f"copy{i}")
        shard = read_shard_index(copy / INDEX_FILE)[0][0]
        elsewhere = tmp_path / f"elsewhere{i}.safetensors"
        shard.rename(elsewhere)
        shard.symlink_to(elsewhere)
        with pytest.raises(BadInput, match=r"is a link to .*outside the index's folder"):
            load(copy)
        # a link that stays inside the folder is an ordinary layout (some caches use one)
        inside = copy / "renamed.safetensors"
        elsewhere.rename(inside)
        shard.unlink()
        shard.symlink_to(inside.name)
        assert load(copy) is not None


def test_a_missing_shard_or_key_is_named(openvla, stdit3, tmp_path):
    copy = _copy(openvla, tmp_path / "missing_shard")
    second = read_shard_index(copy / INDEX_FILE)[0][1]
    second.unlink()
    with pytest.raises(FileNotFoundError, match=rf"lists shards that are missing: {second.name}"):
        read_state_dict(copy)
    stdit3_copy = _copy(stdit3, tmp_path / "stdit3_missing")
    stdit3_shard = read_shard_index(stdit3_copy / INDEX_FILE)[0][1]
    stdit3_shard.unlink()
    with pytest.raises(FileNotFoundError, match=rf"lists shards that are missing: {stdit3_shard.name}"):
        load_stdit3(stdit3_copy)

    copy = _copy(openvla, tmp_path / "missing_key")
    _rewrite_index(copy, lambda weight_map: weight_map.update({"projector.extra.weight": second.name}))
    with pytest.raises(BadInput, match=r"lists keys no shard has: projector\.extra\.weight"):
        read_state_dict(copy)


@pytest.mark.parametrize("content", ['{"weight_map": {}}', '{"weight_map": []}', "[1]", '{"metadata": {}}'])
def test_a_malformed_index_is_named(openvla, tmp_path, content):
    copy = _copy(openvla, tmp_path / "malformed")
    (copy / INDEX_FILE).write_text(content)
    with pytest.raises(BadInput, match=rf"{INDEX_FILE}: expected a safetensors index"):
        read_state_dict(copy)
