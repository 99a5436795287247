"""One error type for bad input (issue 47, class 6): ``nets.errors.BadInput``, a ``ValueError`` that
names the flag or file and the entry, raised before anything is written; a command line reports it
as one line and exit status 2. Tiny PPO runs on CartPole (about a second each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nets.errors import BadInput, naming, reading
from nets.files import read_json, write_atomic
from nets.safe_load import UnsafeFileError
from policies.options import OptionsError
from trainers import checkpoint as ckpt
from trainers.__main__ import main
from trainers.safe_hdf5 import UnsafeHDF5Error

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]


def _args(run_dir: Path, *extra: str, algo: str = "ppo", env: str = "CartPole-v1") -> list[str]:
    return [
        "--algo", algo, "--env", env, "--num-envs", "2", "--total-steps", "128", "--eval-every", "-1",
        "--checkpoint-every", "1", "--run-dir", str(run_dir), *FAST, *extra,
    ]  # fmt: skip


def test_every_refusal_type_is_one_bad_input():
    for kind in (UnsafeFileError, OptionsError, UnsafeHDF5Error):
        assert issubclass(kind, BadInput) and issubclass(kind, ValueError)
    assert issubclass(OptionsError, TypeError)  # still Python's error for a wrong keyword


def test_naming_and_reading_convert_parser_errors():
    assert str(naming("f.json", KeyError("version"))) == "f.json: missing entry 'version' (KeyError)"
    assert str(naming("f.json", ValueError("f.json: bad"))) == "f.json: bad"  # named once
    with pytest.raises(BadInput, match=r"^x.h5: no \(TypeError\)$"), reading("x.h5", TypeError):
        raise TypeError("no")
    with pytest.raises(RuntimeError), reading("x.h5", TypeError):  # not a parser error: unchanged
        raise RuntimeError("a bug")


@pytest.mark.parametrize(
    "extra, algo, env, message",
    [
        (["--seed", str(2**64)], "ppo", "CartPole-v1", r"seed must be in \[0, 2\*\*32 - 1\]"),
        (["--max-grad-norm", "nan"], "ppo", "CartPole-v1", r"max_grad_norm.*nan.*--max-grad-norm"),
        (
            ["--init-alpha", "inf"],
            "sac",
            "Pendulum-v1",
            r"init_alpha: expected a finite number.*--init-alpha",
        ),
        (["--batch-size", "0"], "ppo", "CartPole-v1", r"batch_size must be >= 1"),
        (["--env-kwargs", '{"num_envs": 3}'], "ppo", "CartPole-v1", r"\['num_envs'\].*--num-envs"),
        (["--env-kwargs", '{"autoreset_mode": "x"}'], "ppo", "CartPole-v1", r"--autoreset-mode"),
        (["--eval-env-kwargs", '{"wrappers": []}'], "ppo", "CartPole-v1", r"eval_env_kwargs.*wrappers"),
        (["--env-kwargs", '{"colour": 3}'], "ppo", "CartPole-v1", r"env_kwargs \{'colour': 3\}.*colour"),
        (["--device", "meta"], "ppo", "CartPole-v1", r"device 'meta'"),
    ],
)
def test_bad_flags_are_refused_before_anything_is_written(tmp_path, extra, algo, env, message):
    run_dir = tmp_path / "run"
    with pytest.raises(BadInput, match=message):
        main(_args(run_dir, *extra, algo=algo, env=env))
    assert not run_dir.exists() or not any(p.name == "checkpoints" for p in run_dir.iterdir())
    if "colour" not in message:  # an env that rejects a keyword is known only once it is built
        assert not run_dir.exists()


@pytest.mark.parametrize("at_start", [True, False])
def test_an_eval_env_of_other_spaces_is_refused_before_training(tmp_path, at_start):
    run_dir = tmp_path / "run"
    flags = ["--eval-env", "Acrobot-v1", "--eval-every", "0", "--eval-episodes", "2"]
    flags.append("--eval-at-start" if at_start else "--no-eval-at-start")
    with pytest.raises(BadInput, match=r"eval env Acrobot-v1 .*observation space .*\(6,\).*\(4,\)"):
        main([*_args(run_dir), *flags])
    assert not (run_dir / "checkpoints").exists()  # no iteration ran


def test_the_command_line_reports_bad_input_in_one_line_with_status_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "trainers", *_args(tmp_path / "run", "--seed", "-1")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("python -m trainers: error: seed must be"), (
        done.stderr
    )


@pytest.fixture
def ppo_run(tmp_path: Path) -> Path:
    main(_args(tmp_path / "run"))
    return tmp_path / "run"


def _rewrite_newest(run_dir: Path, change) -> Path:
    """Load the newest checkpoint, ``change`` its payload and save it back, signed as a real one."""
    path, data = ckpt.latest_checkpoint(run_dir)
    change(data)
    ckpt.save_checkpoint(path, data)
    return path


@pytest.mark.parametrize(
    "entry, change",
    [
        ("counters\\['iteration'\\]", lambda d: d["counters"].update(iteration="2")),
        ("counters\\['elapsed'\\]", lambda d: d["counters"].update(elapsed=float("nan"))),
        ("'counters'", lambda d: d.update(counters=[1, 2])),
        ("'rng'", lambda d: d["rng"].update(torch=torch.zeros(3, dtype=torch.uint8))),
        ("'rng'", lambda d: d["rng"].update(numpy=("MT19937", np.zeros(3)))),
        (
            "'optimizer'",
            lambda d: d["optimizer"]["param_groups"].append(dict(d["optimizer"]["param_groups"][0])),
        ),
    ],
)
def test_a_resumed_checkpoint_whose_entries_do_not_fit_is_named(ppo_run, entry, change):
    path = _rewrite_newest(ppo_run, change)
    before = {p: p.read_bytes() for p in ppo_run.rglob("*") if p.is_file() and p.name != ".lock"}
    rng = torch.get_rng_state(), np.random.get_state()[1].copy()
    with pytest.raises(BadInput, match=f"{path}: entry {entry}"):
        main(["--resume", str(ppo_run), "--total-steps", "256", *FAST])
    after = {p: p.read_bytes() for p in ppo_run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before  # nothing written
    if entry == "'rng'":  # no generator half-restored
        assert torch.equal(torch.get_rng_state(), rng[0]) and np.array_equal(np.random.get_state()[1], rng[1])


def test_a_checkpoint_pruned_between_listing_and_reading_is_read_again(ppo_run, monkeypatch):
    real = ckpt.checkpoint_paths
    calls = []

    def listing(source):
        calls.append(1)
        paths = real(source)
        return [*paths, paths[-1].with_name("iter_999999.pt")] if len(calls) == 1 else paths

    monkeypatch.setattr(ckpt, "checkpoint_paths", listing)
    path, _ = ckpt.latest_checkpoint(ppo_run)
    assert len(calls) == 2 and path == real(ppo_run)[-1]


def test_json_nested_too_deep_or_not_utf8_is_bad_input(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BadInput, match="deep.json: expected JSON.*nested too deep"):
        read_json(deep)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(BadInput, match="latin.json.*UnicodeDecodeError"):
        read_json(latin)
    with pytest.raises(BadInput, match="config .*deep.json"):
        main(["--config", str(deep)])


def test_a_failed_write_says_so_and_leaves_the_file(tmp_path):
    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"old")

    def torch_on_a_full_disk(f):
        f.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 1024 vs 960")

    with pytest.raises(OSError, match=r"writing .*ckpt.pt failed .*unexpected pos.*as it was"):
        write_atomic(target, torch_on_a_full_disk)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    with pytest.raises(RuntimeError, match="a bug"):  # not a write failure: unchanged
        write_atomic(target, lambda f: (_ for _ in ()).throw(RuntimeError("a bug")))


def test_frame_sets_of_mixed_sizes_or_undecodable_text_are_refused(tmp_path):
    from envs.core.frames import InitialFrame, load_initial_frames, save_initial_frames

    def frame(size: int, text: str = "pick") -> InitialFrame:
        return InitialFrame(instruction=text, image=np.zeros((size, size, 3), np.uint8))

    save_initial_frames([frame(8), frame(8), frame(16)], tmp_path / "mixed")
    with pytest.raises(BadInput, match=r"frame_00002.npy: image of shape \(16, 16, 3\).*\(8, 8, 3\)"):
        load_initial_frames(tmp_path / "mixed")
    record = np.empty(1, dtype=object)
    record[0] = {"instruction": b"\xff\xfe", "image": np.zeros((8, 8, 3), np.uint8)}
    (tmp_path / "latin").mkdir()
    np.save(tmp_path / "latin" / "frame_00000.npy", record, allow_pickle=True)
    with pytest.raises(BadInput, match="frame_00000.npy: instruction: bytes that are not UTF-8"):
        load_initial_frames(tmp_path / "latin")
    record[0] = {"instruction": "pick", "image": np.zeros((8, 8), np.uint8)}
    np.save(tmp_path / "latin" / "frame_00000.npy", record, allow_pickle=True)
    with pytest.raises(BadInput, match=r"expected an H x W x 3 image, got shape \(8, 8\)"):
        load_initial_frames(tmp_path / "latin")


def test_demos_with_undecodable_text_are_refused(tmp_path):
    import h5py

    from trainers.datasets import load_demos

    path = tmp_path / "demos.h5"
    with h5py.File(ROOT / "data" / "libero_spatial_expert_train.h5") as src, h5py.File(path, "w") as dst:
        dst.attrs.update(src.attrs)
        src.copy(src["episodes/000000"], dst.create_group("episodes"), name="000000")
        dst["episodes/000000"].attrs["instruction"] = b"\xff\xfe pick"
    with pytest.raises(BadInput, match="episode 000000 instruction: bytes that are not UTF-8"):
        load_demos(path)


@pytest.mark.parametrize(
    "entry, value, message",
    [
        (
            "num_hidden_layers",
            10**6,
            r"text_config.num_hidden_layers must be an int in \[1, 512\], got 1000000",
        ),
        ("hidden_size", -4, r"text_config.hidden_size must be an int"),
        ("vocab_size", "32064", r"text_config.vocab_size must be an int"),
    ],
)
def test_a_vla_config_sizes_nothing_past_its_limits(tmp_path, entry, value, message):
    from policies.openvla_oft.config import OpenVLAConfig
    from policies.openvla_oft.tiny import write_tiny_openvla

    folder = write_tiny_openvla(tmp_path / "tiny")
    config = json.loads((folder / "config.json").read_text())
    config["text_config"][entry] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadInput, match=f"config.json: {message}"):
        OpenVLAConfig.from_folder(folder)


def test_buffers_a_config_sizes_past_the_memory_are_refused_before_allocation(monkeypatch):
    import nets.budget
    from policies.pretrained import empty_model

    class Huge(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.zeros(10**12))  # 4 TB: only ever made on the meta device here

    monkeypatch.setattr(nets.budget, "available_memory", lambda: 1 << 30)
    with pytest.raises(BadInput, match=r"Huge's buffers needs about .* of memory"):
        empty_model(Huge, "Huge")
