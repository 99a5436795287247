"""The ground-floor helpers every package shares (``nets.files``, ``nets.devices``): atomic writes of
files and folders, the dtype parser and the device default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import trainers.files
from nets import files
from nets.devices import DTYPES, default_device, parse_dtype


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------------- write_atomic / atomic_path
def test_write_atomic_replaces_the_whole_file_and_fsyncs_it_and_its_folder(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"an old and longer content")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    assert files.write_atomic(path, b"new") == path
    assert path.read_bytes() == b"new" and _names(tmp_path) == ["f.bin"]
    assert len(synced) == 2  # the file, then its folder
    files.write_atomic(path, "text é")
    assert path.read_text(encoding="utf-8") == "text é"
    files.write_atomic(path, lambda f: f.write(b"by a writer"))
    assert path.read_bytes() == b"by a writer"


def test_write_atomic_leaves_no_temp_file_and_the_old_content_on_error(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")

    def fails(f):
        f.write(b"half")
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError, match="writer died"):
        files.write_atomic(path, fails)
    assert path.read_text() == "old" and _names(tmp_path) == ["f.txt"]
    with pytest.raises(RuntimeError, match="writer died"), files.atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert path.read_text() == "old" and _names(tmp_path) == ["f.txt"]


def test_a_symbolic_link_at_the_target_is_replaced_never_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    for i, write in enumerate((lambda p: files.write_atomic(p, "mine"), lambda p: _write_by_name(p, "mine"))):
        link = tmp_path / f"link{i}"
        link.symlink_to(outside)
        write(link)
        assert not link.is_symlink() and link.read_text() == "mine"
    assert outside.read_text() == "not yours"
    log = tmp_path / "log"  # appending refuses a link instead
    log.symlink_to(outside)
    with pytest.raises(ValueError, match="is a symbolic link"):
        files.open_append(log)


def _write_by_name(path: Path, text: str) -> None:
    with files.atomic_path(path) as tmp:
        assert tmp.parent == path.parent and tmp.name.startswith(f".{path.name}.")
        tmp.write_text(text)


def test_atomic_path_with_a_fixed_temp_name_can_keep_the_partial_file(tmp_path):
    path, temp = tmp_path / "d.h5", tmp_path / "d.h5.tmp"
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    temp.symlink_to(outside)  # a stale link at the temporary name is removed, not written through
    with pytest.raises(KeyboardInterrupt), files.atomic_path(path, temp=temp, keep_on_error=True) as tmp:
        assert not tmp.exists()
        tmp.write_text("episodes so far")
        raise KeyboardInterrupt
    assert temp.read_text() == "episodes so far" and not path.exists() and outside.read_text() == "not yours"
    with files.atomic_path(path, temp=temp, keep_on_error=True) as tmp:
        tmp.write_text("all episodes")
    assert path.read_text() == "all episodes" and not temp.exists()
    with pytest.raises(ValueError, match="must be in"), files.atomic_path(path, temp=tmp_path / "sub" / "x"):
        pass


def test_trainers_files_re_exports_the_ground_floor():
    assert trainers.files.write_atomic is files.write_atomic
    assert trainers.files.open_append is files.open_append


# ---------------------------------------------------------------------- atomic_folder
def test_atomic_folder_swaps_a_whole_folder_in_and_cleans_up(tmp_path):
    target = tmp_path / "dataset"
    with files.atomic_folder(target) as staging:
        (staging / "a.npy").write_text("1")
        (staging / "sub").mkdir()
        (staging / "sub" / "b").write_text("2")
    assert _names(target) == ["a.npy", "sub"] and _names(tmp_path) == ["dataset"]
    with files.atomic_folder(target) as staging:  # replaced whole: no file of the old one stays
        (staging / "c.npy").write_text("3")
    assert _names(target) == ["c.npy"] and _names(tmp_path) == ["dataset"]
    with pytest.raises(RuntimeError), files.atomic_folder(target) as staging:
        (staging / "half.npy").write_text("4")
        raise RuntimeError("interrupted")
    assert _names(target) == ["c.npy"] and _names(tmp_path) == ["dataset"]  # old kept, no staging


def test_atomic_folder_replaces_a_symbolic_link_without_touching_its_target(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not yours")
    target = tmp_path / "dataset"
    target.symlink_to(outside)
    with files.atomic_folder(target) as staging:
        (staging / "new").write_text("mine")
    assert not target.is_symlink() and _names(target) == ["new"]
    assert (outside / "keep").read_text() == "not yours"
    assert _names(tmp_path) == ["dataset", "outside"]


# ---------------------------------------------------------------------- dtypes and devices
OLD_SPELLINGS = {
    # envs/world_models/env.py: torch's floating-point names
    "bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
    # the usual short forms
    "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64,
    "BF16": torch.bfloat16, "torch.bfloat16": torch.bfloat16, str(torch.float16): torch.float16,
}  # fmt: skip


@pytest.mark.parametrize("name", list(OLD_SPELLINGS))
def test_parse_dtype_reads_every_spelling(name):
    assert parse_dtype(name) is OLD_SPELLINGS[name]


def test_parse_dtype_passes_dtypes_and_none_and_refuses_others_naming_the_choices():
    assert set(DTYPES.values()) == {torch.bfloat16, torch.float16, torch.float32, torch.float64}
    assert parse_dtype(torch.bfloat16) is torch.bfloat16 and parse_dtype(None) is None
    for bad in ("float99", "int8", "bool", "", "auto", 16):
        with pytest.raises(ValueError, match=r"dtype must be one of \['bfloat16', .*'double', 'None'\]"):
            parse_dtype(bad)
    with pytest.raises(ValueError, match=r"dtype must be one of \['bfloat16'.*'double'\] .*, got None"):
        parse_dtype(None, optional=False)


def test_the_three_old_parsers_keep_their_spellings_and_their_limits():
    from envs.world_models.env import parse_dtype as env_dtype
    from policies.pretrained import resolve_dtype
    from trainers.parallel import param_dtype

    for name in ("bfloat16", "float32", "float16", "half", "double"):  # envs: any float name
        assert env_dtype(name) is getattr(torch, name)
    with pytest.raises(ValueError, match="torch dtype name"):
        env_dtype("float99")
    # VLAs: auto, float32, bfloat16 (and their short forms); float16 stays refused
    assert resolve_dtype("auto") is (torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    assert resolve_dtype("float32") is resolve_dtype("fp32") is torch.float32
    assert resolve_dtype("bfloat16") is resolve_dtype("bf16") is torch.bfloat16
    for bad in ("float16", None, "float64"):
        with pytest.raises(ValueError, match=r"dtype must be one of \['auto', 'bfloat16', 'bf16', 'float32'"):
            resolve_dtype(bad)
    # --fsdp-param-dtype: None, bfloat16, float16, float32 (and their short forms)
    assert param_dtype(None) is None
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16), ("float32", torch.float32)):
        assert param_dtype(name) is dtype
    assert param_dtype("bf16") is torch.bfloat16 and param_dtype("fp16") is torch.float16
    with pytest.raises(ValueError, match=r"fsdp_param_dtype must be one of \['bfloat16'.*'None'\]"):
        param_dtype("float64")


def test_default_device():
    assert default_device("cpu") == torch.device("cpu")
    assert default_device(torch.device("cpu")) == torch.device("cpu")
    assert default_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
