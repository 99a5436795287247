"""``python -m benchmarks.wm_pixels`` (issue 49): the changing-pixel mask, every row of the table and the
JSON, the held-out split of the bundle, fixed noise, and every bad input refused with what was expected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_world_model_train import SIZE, moving_square, synthetic_demos

from benchmarks import wm_pixels
from benchmarks.wm_pixels import ErrorSums, changing_mask, main
from nets.errors import BadInput
from trainers.datasets.demos import Episode, write_demos
from trainers.world_model.__main__ import main as train

assert Path(wm_pixels.__file__).resolve().parents[1] == Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = ["--num-steps", "2", "--batch-size", "4", "--no-progress"]


def train_tiny(tmp: Path, demos: Path, out: str, *extra: str) -> Path:
    """A tiny bundle in a few seconds: 2 optimizer steps of a 1-block STDiT3 (hidden 32)."""
    train(["--demos", str(demos), "--out", str(tmp / out), "--steps", "2", "--hidden-size", "32", "--depth",
           "1", "--num-heads", "2", "--batch-size", "4", "--eval-clips", "4", "--torch-threads", "1",
           "--no-progress", "--no-tensorboard", "--seed", "0", *extra])  # fmt: skip
    return tmp / out


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """Demos of 4 episodes (one held out), a bundle trained from scratch on them, and one fine-tuned from
    it (so every row has a model)."""
    tmp = tmp_path_factory.mktemp("wm_pixels")
    demos = synthetic_demos(tmp / "demos.h5", episodes=4, steps=16)
    scratch = train_tiny(tmp, demos, "scratch")
    tuned = train_tiny(tmp, demos, "tuned", "--init-from", str(scratch))
    return {"tmp": tmp, "demos": demos, "scratch": scratch, "tuned": tuned}


def demos_file(path: Path, frames: list[np.ndarray], actions: list[np.ndarray]) -> Path:
    eps = [
        Episode(obs={"image": f}, actions=a[:, None], valid=np.ones((len(f), 1), bool),
                rewards=np.zeros((len(f), 1), np.float32), instruction="x", task="x")
        for f, a in zip(frames, actions)
    ]  # fmt: skip
    return write_demos(path, eps, {"env": "envs:Libero-Spatial-v0", "chunk_size": 1, "action_dim": 7})


# ---- the mask and the sums ---------------------------------------------------------------------------------


def test_mask_takes_pixels_that_move_more_than_the_threshold_on_any_channel():
    last = np.full((1, 2, 3, 3), 100, np.uint8)
    targets = np.repeat(last[:, None], 2, axis=1).copy()  # [1, 2, 2, 3, 3]
    targets[0, 0, 0, 0, 2] = 108  # exactly the threshold: not changing
    targets[0, 0, 1, 1, 0] = 109  # above it on one channel: changing
    targets[0, 1, 1, 2, 1] = 91  # below, by more than the threshold
    mask = changing_mask(last, targets, threshold=8)
    assert mask.shape == (1, 2, 2, 3)
    assert np.argwhere(mask).tolist() == [[0, 0, 1, 1], [0, 1, 1, 2]]

    sums = ErrorSums(2)
    predicted = np.repeat(last[:, None], 2, axis=1)  # copy the last context frame
    sums.add(predicted, targets, mask)
    out = sums.summary()
    assert out["mae_changing"] == [9 / 3, 9 / 3]  # one changing pixel per h, 9 off on one of 3 channels
    assert out["mae_all"][0] == pytest.approx((8 + 9) / (3 * 6)) and out["mae_all_pooled"] == pytest.approx(
        (8 + 9 + 9) / (3 * 12)
    )


def test_static_truth_has_no_changing_pixel_and_copy_has_no_error(bundles, tmp_path):
    rng = np.random.default_rng(0)
    frames, actions = moving_square(rng, 14)
    static = demos_file(tmp_path / "static.h5", [np.repeat(frames[:1], 14, axis=0)], [actions])
    out = main(["--bundle", str(bundles["scratch"]), "--demos", str(static), "--episodes", "all", *FAST])
    assert out["changing_pixels"] == [0] * 8 and out["split"] == "--episodes all"
    copy = out["methods"]["copy"]
    assert copy["mae_all"] == [0.0] * 8 and copy["psnr_all"] == [None] * 8  # identical frames: infinite PSNR
    assert copy["mae_changing"] == [None] * 8  # nothing changes: no error to average
    assert out["methods"]["trained"]["mae_all"][0] > 0
    assert "inf" in out["table"]


# ---- the table and the JSON ------------------------------------------------------------------------------


def test_every_row_on_the_held_out_episode_with_fixed_noise(bundles, tmp_path, capsys):
    tuned = bundles["tuned"]
    argv = ["--bundle", str(tuned), "--demos", str(bundles["demos"]), "--max-clips", "3", "--json",
            str(tmp_path / "r.json"), *FAST]  # fmt: skip
    out = main(argv)
    printed = capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(out))
    held = json.loads((tuned / "training.json").read_text())["episodes"]["held_out"]
    assert out["split"] == "training.json" and out["episodes"] == held
    assert len(out["clips"]) == 3 and {c["episode"] for c in out["clips"]} == set(held)
    assert [c["step"] for c in out["clips"]] == [0, 4, 7]  # 8 clips of a 16-step episode, evenly spaced
    assert out["horizons"] == list(range(1, 9)) and len(out["changing_pixels"]) == 8
    assert out["pixels_per_frame"] == SIZE * SIZE and out["reference"] == "truth"
    keys = [
        "trained",
        "copy",
        "untrained",
        "init_from",
        "trained_other_actions",
        "copy_through_vae",
        "vae_roundtrip",
    ]
    assert list(out["methods"]) == keys
    for key in keys:
        r = out["methods"][key]
        assert r["note"] is None, (key, r["note"])
        for metric in ("mae_changing", "mae_all", "psnr_all"):
            assert len(r[metric]) == 8 and isinstance(r[f"{metric}_pooled"], float), (key, metric)
    assert out["methods"]["init_from"]["label"] == f"init-from {bundles['scratch']}"
    # the table: printed once, a header of horizons, three rows per method and the changing-pixel counts
    assert printed.strip() == out["table"]
    lines = out["table"].splitlines()
    assert lines[2].split()[-9:] == [f"h={h}" for h in range(1, 9)] + ["pooled"]
    assert sum("MAE changing" in line for line in lines) == 7 and "changing px" in lines[4]
    assert f"{sum(out['changing_pixels'])}" in lines[4]
    # every method sees the same noise: a second run gives the same numbers; the copy is not sampled
    again = main(argv[: -len(FAST)] + FAST)
    assert again["methods"] == out["methods"]
    m = out["methods"]
    assert m["copy"]["mae_all"][0] < m["vae_roundtrip"]["mae_all"][0]  # a random tiny VAE loses a lot


def test_init_from_row_says_why_there_is_none(bundles, capsys):
    base = ["--bundle", str(bundles["scratch"]), "--demos", str(bundles["demos"]), "--max-clips", "1", *FAST]
    out = main(base)
    row = out["methods"]["init_from"]
    assert row["note"] == "none: trained from scratch" and "mae_all" not in row
    assert "none: trained from scratch" in out["table"]
    out = main([*base, "--init-from", str(bundles["tmp"] / "gone")])
    assert out["methods"]["init_from"]["note"] == "absent: no such folder here"
    assert f"init-from {bundles['tmp'] / 'gone'}" in out["table"]
    train_eps = json.loads((bundles["scratch"] / "training.json").read_text())["episodes"]["train"]
    mixed = main([*base, "--episodes", "all"])  # the run's own demos: its training episodes are named
    assert mixed["split"] == f"--episodes all; NOT HELD OUT: the run trained on episodes {train_eps}"
    assert "NOT HELD OUT" in mixed["table"].splitlines()[0]
    decoded = main([*base, "--reference", "decoded"])
    assert decoded["methods"]["vae_roundtrip"]["mae_all_pooled"] == 0.0  # the reference itself


# ---- bad input ---------------------------------------------------------------------------------------------


def refused(argv: list[str], match: str) -> None:
    with pytest.raises(BadInput, match=match):
        main([*argv, *FAST])


def test_bad_bundle_demos_and_flags(bundles, tmp_path):
    scratch, demos = str(bundles["scratch"]), str(bundles["demos"])
    refused(
        ["--bundle", str(tmp_path / "none"), "--demos", demos],
        "no such folder .*expected a world-model bundle",
    )
    (tmp_path / "empty").mkdir()
    refused(
        ["--bundle", str(tmp_path / "empty"), "--demos", demos],
        "not a world-model bundle .*config.json.*tokenizer.pth",
    )
    refused(["--bundle", scratch, "--demos", str(tmp_path / "no.h5")], "no.h5: no such file")
    refused(["--bundle", scratch, "--demos", demos, "--max-clips", "0"], "--max-clips: expected >= 1")
    refused(["--bundle", scratch, "--demos", demos, "--episodes", "9"], r"indices in 0\.\.3")

    big = synthetic_demos(tmp_path / "big.h5", episodes=4, size=64)
    refused(["--bundle", scratch, "--demos", str(big)], "64x64 frames, the model takes 32x32")
    eight = synthetic_demos(tmp_path / "eight.h5", episodes=4)
    with h5py.File(eight, "a") as f:  # 8-D actions
        for g in f["episodes"].values():
            actions = g["actions"][()]
            del g["actions"]
            g["actions"] = np.concatenate([actions, actions[..., :1]], axis=-1)
    refused(["--bundle", scratch, "--demos", str(eight)], "8-D actions, the model takes 7-D")
    short = synthetic_demos(tmp_path / "short.h5", episodes=2, steps=11)
    refused(["--bundle", scratch, "--demos", str(short), "--episodes", "all"],
            r"fewer frames than context \+ one chunk \(4 \+ 8 = 12\)")  # fmt: skip
    other = synthetic_demos(tmp_path / "other.h5", episodes=3)
    refused(["--bundle", scratch, "--demos", str(other)], "3 episodes.*the bundle trained on 4 episodes")


def test_command_line_reports_bad_input_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.wm_pixels", "--bundle", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert (
        out.stderr.startswith("python -m benchmarks.wm_pixels: error: --bundle")
        and "Traceback" not in out.stderr
    )


# ---- Cosmos bundles ----------------------------------------------------------------------------------------


def test_cosmos_bundle_every_row_with_its_12_action_chunk(tmp_path):
    """A tiny Cosmos bundle and one fine-tuned from it: every row has numbers over the 12 frames its DiT
    predicts from the frame before them; the VAE rows go through the causal video VAE."""
    from test_world_model_cosmos_train import args as cosmos_args
    from test_world_model_cosmos_train import synthetic_demos as cosmos_demos

    demos = cosmos_demos(tmp_path / "demos.h5", episodes=4, steps=16)
    small = ["--hidden-size", "32", "--num-heads", "1", "--depth", "1", "--eval-clips", "2", "--steps", "2"]
    train(cosmos_args(tmp_path, demos, *small, out="first"))
    train(cosmos_args(tmp_path, demos, *small[-4:], "--init-from", str(tmp_path / "first"), out="second"))
    out = main(["--bundle", str(tmp_path / "second"), "--max-clips", "3", *FAST])
    held = json.loads((tmp_path / "second" / "training.json").read_text())["episodes"]["held_out"]
    assert out["episodes"] == held and out["horizons"] == list(range(1, 13))
    assert [c["step"] for c in out["clips"]] == [0, 2, 3]  # 4 clips of a 16-step episode, evenly spaced
    for key, r in out["methods"].items():
        assert r["note"] is None, (key, r["note"])
        assert len(r["mae_all"]) == 12 and isinstance(r["mae_all_pooled"], float), key
    assert out["methods"]["init_from"]["label"] == f"init-from {tmp_path / 'first'}"
    assert "1 context frames + chunk 12" in out["table"].splitlines()[0]
    decoded = main(
        ["--bundle", str(tmp_path / "second"), "--max-clips", "1", "--reference", "decoded", *FAST]
    )
    assert decoded["methods"]["vae_roundtrip"]["mae_all_pooled"] == 0.0
    # an OpenSora bundle is not a start for a Cosmos one
    opensora = train_tiny(tmp_path, synthetic_demos(tmp_path / "os.h5", episodes=4, steps=16), "opensora")
    other = main(
        ["--bundle", str(tmp_path / "second"), "--max-clips", "1", "--init-from", str(opensora), *FAST]
    )
    assert other["methods"]["init_from"]["note"] == "unusable: another world model, frame size or chunk"
