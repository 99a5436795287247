"""Every reader fuzzed (hypothesis): malformed inputs made from valid ones (truncated, bytes changed,
datasets and attributes given other dtypes, shapes, strings, links and sizes, JSON values replaced)
get a ``BadInput`` (``nets.errors``, a ``ValueError``) that names what was wrong; no other exception
escapes, no example takes more than its deadline, and the whole test stays within a memory budget.

The fast set runs a few examples per reader; ``-m slow`` runs the ``FUZZ_SLOW`` profile (more).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_datasets import _demos, _libero_demo, write_libero_file

from envs.core.frames import load_initial_frames
from envs.world_models.tiny import write_dataset
from nets.errors import BadInput
from trainers import checkpoint as ckpt
from trainers.config import parse
from trainers.datasets import load_demos
from trainers.datasets.demos import write_demos
from trainers.ppo import PPOConfig
from trainers.run import RunConfig
from trainers.sac import SACConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
FAST = settings(
    max_examples=EXAMPLES,
    deadline=5000,
    derandomize=True,  # the same examples on every run: CI is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SLOW = settings(FAST, max_examples=20 * EXAMPLES)
MEMORY_BUDGET = 1 << 30  # bytes of peak memory a whole test may add


def only_bad_input(read: Callable[[], object]) -> None:
    """Run ``read``: it returns or raises a ``BadInput`` (a bad file named); anything else fails, a
    plain ``ValueError`` too."""
    try:
        read()
    except BadInput as e:
        assert str(e), "a BadInput without a message"


@pytest.fixture
def memory_budget():
    """The peak memory (max RSS) the test adds stays under ``MEMORY_BUDGET``."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    yield
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert after - before < MEMORY_BUDGET, f"peak memory grew by {(after - before) / 2**20:.0f} MiB"


# ---------------------------------------------------------------------------------- mutations
@st.composite
def byte_edits(draw, size: int) -> list[tuple[str, int, bytes]]:
    """A few edits of a file of ``size`` bytes: truncate, overwrite, insert."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "overwrite", "insert"]))
        at = draw(st.integers(0, max(size - 1, 0)))
        edits.append((kind, at, draw(st.binary(min_size=1, max_size=16))))
    return edits


def edit_bytes(data: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    for kind, at, chunk in edits:
        at = min(at, len(data))
        if kind == "truncate":
            data = data[:at]
        elif kind == "overwrite":
            data = data[:at] + chunk + data[at + len(chunk) :]
        else:
            data = data[:at] + chunk + data[at:]
    return data


ODD_ARRAYS = st.sampled_from(
    [
        np.zeros((0,), np.float32),
        np.zeros((), np.float64),
        np.full((3, 2), np.nan, np.float32),
        np.ones((2, 3), np.complex64),
        np.array([b"text", b"\xff\xfe"]),
        np.array(["a", "b"], dtype=object),
        np.zeros((2, 1, 1, 1, 1), np.uint16),
        np.arange(6, dtype=np.int8).reshape(3, 2),
        np.zeros((1, 4, 4, 3), np.float32),
        np.array([1e300], np.float64),
    ]
)
ODD_ATTRS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=20).map(np.bytes_),
    st.just(np.zeros(3)),
    st.just("{not json"),
    st.just(json.dumps({"a": [1, 2]})),
)


@st.composite
def hdf5_edits(draw, names: list[str], attrs: list[tuple[str, str]]):
    """Structured edits of an HDF5 file: a dataset replaced (other dtype or shape), removed, or made a
    link (to itself, to a missing path, to another file); an attribute replaced or removed."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["dataset", "remove", "soft", "external", "attr", "drop-attr"]))
        if kind in ("attr", "drop-attr") and attrs:
            edits.append((kind, draw(st.sampled_from(attrs)), draw(ODD_ATTRS)))
        else:
            edits.append((kind, draw(st.sampled_from(names)), draw(ODD_ARRAYS)))
    return edits


def hdf5_paths(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    names, attrs = [], []
    with h5py.File(path, "r") as f:
        attrs += [("/", a) for a in f.attrs]

        def visit(name: str, obj) -> None:
            names.append(name)
            attrs.extend((name, a) for a in obj.attrs)

        f.visititems(visit)
    return names, attrs


def edit_hdf5(path: Path, edits) -> None:
    with h5py.File(path, "r+") as f:
        for kind, where, value in edits:
            try:
                _edit(f, kind, where, value)
            except (KeyError, RuntimeError, OSError, TypeError, ValueError):
                continue  # an edit h5py cannot make here (e.g. under a removed group): skipped


def _edit(f, kind: str, where, value) -> None:
    if kind in ("attr", "drop-attr"):
        obj_name, attr = where
        obj = f[obj_name]
        if kind == "drop-attr":
            obj.attrs.pop(attr, None)
        else:
            obj.attrs[attr] = value
        return
    del f[where]
    if kind == "dataset":
        f[where] = value
    elif kind == "soft":
        f[where] = h5py.SoftLink("/" + where)  # a link to itself
    elif kind == "external":
        f[where] = h5py.ExternalLink("/etc/hostname", "/x")


# ------------------------------------------------------------------------------------ readers
@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict[str, Path]:
    """One valid input per reader."""
    root = tmp_path_factory.mktemp("valid")
    rng = np.random.default_rng(0)
    run = root / "run"
    from trainers.ppo import train as ppo_train

    ppo_train.main(
        ["--env", "CartPole-v1", "--num-envs", "2", "--n-steps", "16", "--batch-size", "32",
         "--total-steps", "32", "--eval-every", "-1", "--run-dir", str(run), "--no-progress",
         "--no-tensorboard", "--no-video", "--torch-threads", "1"]
    )  # fmt: skip
    return {
        "demos": write_demos(root / "demos.h5", _demos().episodes, {"env": "x"}),
        "libero": write_libero_file(root / "put_demo.hdf5", [_libero_demo(rng, 4), _libero_demo(rng, 3)]),
        "frames": write_dataset(root / "frames", trajectories=2, frames=2, size=(8, 8)),
        "checkpoint": ckpt.latest_checkpoint(run)[0],
        "run": run,
    }


@FAST
@given(data=st.data())
def test_demo_files_mutated_give_value_errors(samples, tmp_path, memory_budget, data):
    for name in ("demos", "libero"):
        names, attrs = hdf5_paths(samples[name])
        path = tmp_path / samples[name].name
        shutil.copyfile(samples[name], path)
        edit_hdf5(path, data.draw(hdf5_edits(names, attrs)))
        options = {"progress": False} if name == "libero" else {}
        only_bad_input(lambda p=path, o=options: load_demos(p, **o))


@FAST
@given(data=st.data())
def test_binary_files_cut_or_changed_give_value_errors(samples, tmp_path, memory_budget, data):
    for name, read in (
        ("demos", lambda p: load_demos(p)),
        ("checkpoint", lambda p: ckpt.load_checkpoint(p)),
        ("frames", lambda p: load_initial_frames(p.parent)),
    ):
        source = samples[name] if name != "frames" else sorted(samples[name].glob("*.npy"))[0]
        raw = source.read_bytes()
        folder = tmp_path / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        path = folder / source.name
        path.write_bytes(edit_bytes(raw, data.draw(byte_edits(len(raw)))))
        only_bad_input(lambda p=path, r=read: r(p))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@FAST
@given(data=st.data())
def test_a_resumed_runs_config_json_mutated_gives_value_errors(samples, tmp_path, memory_budget, data):
    config = json.loads((samples["run"] / "config.json").read_text())
    for _ in range(data.draw(st.integers(1, 3))):
        section = data.draw(st.sampled_from(sorted(config)))
        key = data.draw(st.sampled_from([*sorted(config[section]), "unknown_key"]))
        if data.draw(st.booleans()):
            config[section][key] = data.draw(JSON)
        else:
            config[section].pop(key, None)
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "config.json").write_text(json.dumps(config))
    classes = {"run": RunConfig, "ppo": PPOConfig}
    only_bad_input(lambda: parse(classes, ["--resume", str(run)], run_config=run / "config.json"))


@FAST
@given(data=st.data())
def test_a_lerobot_datasets_info_json_mutated_gives_value_errors(samples, tmp_path, memory_budget, data):
    pytest.importorskip("pyarrow")
    from trainers.datasets.lerobot_write import write_lerobot

    folder = tmp_path / "ds"
    if not folder.exists():
        write_lerobot(_demos(), folder, video=False, progress=False)
    info_file = folder / "meta" / "info.json"
    original = info_file.read_text()
    info = json.loads(original)
    for _ in range(data.draw(st.integers(1, 2))):
        key = data.draw(st.sampled_from(sorted(info)))
        target = info[key] if isinstance(info[key], dict) and data.draw(st.booleans()) else info
        name = data.draw(st.sampled_from(sorted(target))) if target is not info else key
        target[name] = data.draw(JSON)
    info_file.write_text(json.dumps(info))
    try:
        only_bad_input(lambda: load_demos(folder, progress=False))
    finally:
        info_file.write_text(original)


FLAG_VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-1", "0", "1e400", "2**64", "", "[]", "{}", '{"a": 1}', "null", "x:y"]),
    st.text(max_size=10),
    st.integers().map(str),
)


@FAST
@given(data=st.data())
def test_command_line_flags_mutated_give_clear_errors(memory_budget, data):
    """A flag's value from anything: a BadInput, or argparse's usage error (exit status 2)."""
    names = [f.name for f in RunConfig.__dataclass_fields__.values()] + list(SACConfig.__dataclass_fields__)
    name = data.draw(st.sampled_from(sorted(set(names) - {"resume", "run_dir"})))
    argv = [f"--{name.replace('_', '-')}", data.draw(FLAG_VALUES)]
    try:
        parse({"run": RunConfig, "sac": SACConfig}, argv)
    except BadInput as e:
        assert str(e)
    except SystemExit as e:
        assert e.code == 2  # argparse's own "invalid value" or "expected one argument"


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_slow_more_examples_of_every_mutation(samples, tmp_path, memory_budget, data):
    names, attrs = hdf5_paths(samples["demos"])
    path = tmp_path / "d.h5"
    shutil.copyfile(samples["demos"], path)
    edit_hdf5(path, data.draw(hdf5_edits(names, attrs)))
    only_bad_input(lambda: load_demos(path))
    raw = samples["checkpoint"].read_bytes()
    cut = tmp_path / "c.pt"
    cut.write_bytes(edit_bytes(raw, data.draw(byte_edits(len(raw)))))
    only_bad_input(lambda: ckpt.load_checkpoint(cut))
