"""Demonstration datasets: LIBERO's HDF5 files, LeRobot v3.0 folders and world-model dataset/ exports,
each written here in its real layout (no hub access), read back, and trained on by behaviour cloning."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest
from conftest import requires_libero

import envs  # noqa: F401  (registers the env ids)
from benchmarks.robustness import (
    demos_file_with,
    frame_set_declaring,
    lerobot_declaring,
    lerobot_reaching_out,
    libero_file,
    truncated,
)
from envs.core import ChunkedVectorEnv, ChunkResult, InitialFrame
from envs.core.frames import load_initial_frames
from envs.core.spaces import observation_space
from trainers import bc
from trainers.datasets import (
    detect_format,
    load_demos,
    read_lerobot,
    read_libero_hdf5,
    write_lerobot,
    write_world_model_dataset,
)
from trainers.datasets.__main__ import cli as datasets_command
from trainers.datasets.__main__ import main as datasets_cli
from trainers.datasets.demos import Demos, Episode, read_demos, write_demos
from trainers.safe_hdf5 import UnsafeHDF5Error

try:  # the "datasets" extra (scripts/setup.sh installs it)
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:
    pa = pq = None
requires_pyarrow = pytest.mark.skipif(
    pa is None, reason='LeRobot datasets need pip install "vla-gym[datasets]"'
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "data"
SIZE = 16  # image side of the synthetic data
INSTRUCTIONS = ("put the bowl on the plate", "open the top drawer")


def _images(rng, t: int, size: int = SIZE) -> np.ndarray:
    """Frames that differ from one another and are not symmetric (orientation and order show)."""
    yy, xx = np.mgrid[0:size, 0:size]
    base = np.stack([yy * (200 // size), xx * (200 // size), np.full_like(yy, 60)], -1)
    frames = np.repeat(base[None], t, 0).astype(np.int64)
    for i in range(t):
        frames[i, ..., 2] = 20 + 29 * (i % 8)  # each frame of an episode has its own shade of blue
        frames[i, 2 : 2 + size // 4, i % (size - 4) : i % (size - 4) + 4] = rng.integers(0, 256, 3)
    return frames.astype(np.uint8)


def _episode(rng, t: int, text: str, k: int = 1, sim: bool = False) -> Episode:
    chunks = t if k == 1 else -(-t // k)
    valid = np.ones((chunks, k), bool)
    if k > 1:
        valid[-1, t - (chunks - 1) * k :] = False
    return Episode(
        obs={
            "image": _images(rng, chunks),
            "wrist_image": _images(rng, chunks)[:, ::-1].copy(),
            "proprio": rng.normal(size=(chunks, 8)).astype(np.float32),
            "task_state": rng.normal(size=(chunks, 5)).astype(np.float32),
        },
        actions=rng.uniform(-1, 1, (chunks, k, 7)).astype(np.float32),
        valid=valid,
        rewards=np.where(np.arange(chunks * k).reshape(chunks, k) == t - 1, 1.0, 0.0).astype(np.float32),
        instruction=text,
        task=f"libero_spatial/{text.replace(' ', '_')}",
        initial_frame=int(rng.integers(0, 50)),
        success=True,
        sim_states=rng.normal(size=(chunks, 9)) if sim else None,
    )


def _demos(seed: int = 0, k: int = 1, sim: bool = False) -> Demos:
    rng = np.random.default_rng(seed)
    episodes = [_episode(rng, t, INSTRUCTIONS[i % 2], k, sim) for i, t in enumerate((5, 8, 6))]
    return Demos({"env": "envs:Libero-Spatial-v0", "env_kwargs": {"image_size": SIZE}}, episodes)


# ------------------------------------------------------------------------------ LIBERO's HDF5 files
def write_libero_file(path: Path, demos: list[dict], convention: str = "opengl", **attrs) -> Path:
    """A file in the layout of LIBERO's scripts/create_dataset.py: per demo the raw (robosuite)
    images, proprio pieces, actions, states, rewards and dones; the task in the data attributes."""
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        info = {"problem_name": "libero_tabletop_manipulation", "domain_name": "libero"}
        info["language_instruction"] = attrs.pop("instruction", INSTRUCTIONS[0])
        data.attrs["problem_info"] = json.dumps(info)
        data.attrs["env_name"] = "Libero_Tabletop_Manipulation"
        data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation"})
        data.attrs["bddl_file_name"] = attrs.pop(
            "bddl", "libero/libero/bddl_files/libero_spatial/put_the_bowl_on_the_plate.bddl"
        )
        data.attrs["macros_image_convention"] = convention
        for i, demo in enumerate(demos):
            g = data.create_group(f"demo_{i}")
            g.attrs["num_samples"] = len(demo["actions"])
            g.attrs["init_state"] = demo["states"][0]
            obs = g.create_group("obs")
            obs["agentview_rgb"] = demo["agentview"]
            obs["eye_in_hand_rgb"] = demo["wrist"]
            obs["ee_pos"], obs["ee_ori"] = demo["proprio"][:, :3], demo["proprio"][:, 3:6]
            obs["ee_states"] = demo["proprio"][:, :6]
            obs["gripper_states"] = demo["proprio"][:, 6:]
            obs["joint_states"] = np.zeros((len(demo["actions"]), 7))
            for key in ("actions", "states", "rewards", "dones"):
                g[key] = demo[key]
        data.attrs["num_demos"] = len(demos)
        data.attrs["total"] = sum(len(d["actions"]) for d in demos)
    return path


def _libero_demo(rng, t: int) -> dict:
    raw = _images(rng, t)
    done = np.zeros(t, np.uint8)
    done[-1] = 1
    return {
        "agentview": raw,
        "wrist": _images(rng, t)[:, :, ::-1].copy(),
        "proprio": rng.normal(size=(t, 8)),
        "actions": rng.uniform(-1, 1, (t, 7)),
        "states": rng.normal(size=(t, 12)),
        "rewards": done.copy(),
        "dones": done,
    }


def test_libero_files_with_nan_or_mixed_size_actions_are_refused(tmp_path):
    """A NaN action, or 7-D and 8-D actions in one file: a ValueError naming the episode, never
    data handed to BC or RL."""
    rng = np.random.default_rng(0)
    nan = _libero_demo(rng, 5)
    nan["actions"][3, 2] = np.nan
    path = write_libero_file(tmp_path / "nan_demo.hdf5", [_libero_demo(rng, 4), nan])
    with pytest.raises(ValueError, match=r"nan_demo.hdf5: data/demo_1: actions hold NaN .* \(step 3\)"):
        load_demos(path, progress=False)
    wide = _libero_demo(rng, 5)
    wide["actions"] = rng.uniform(-1, 1, (5, 8))
    path = write_libero_file(tmp_path / "mixed_demo.hdf5", [_libero_demo(rng, 4), wide])
    with pytest.raises(ValueError, match=r"demo episode 1: actions must be \[steps, 1, 7\] as before, got"):
        load_demos(path, progress=False)
    ep = Episode(obs={}, actions=np.zeros((2, 1, 3)), valid=np.ones((2, 1), bool), rewards=np.zeros((2, 1)))
    with pytest.raises(ValueError, match="demo episode 0: actions must be"):
        Demos({}, [dataclasses.replace(ep, actions=np.zeros((2, 3)))])


def test_libero_files_are_read_upright_aligned_and_mapped_to_our_keys(tmp_path):
    rng = np.random.default_rng(0)
    demos = [_libero_demo(rng, 6), _libero_demo(rng, 4)]
    path = write_libero_file(tmp_path / "put_the_bowl_on_the_plate_demo.hdf5", demos)
    assert detect_format(path) == "libero-hdf5"
    got = load_demos(path, progress=False)
    assert got.meta["format"] == "libero-hdf5" and got.meta["image_convention"] == ["opengl"]
    assert len(got.episodes) == 2
    for ep, demo in zip(got.episodes, demos):
        t = len(demo["actions"])
        # aligned: the observation after action t goes with action t+1 and the state it shows
        assert ep.actions.shape == (t - 1, 1, 7) and ep.valid.all()
        np.testing.assert_array_equal(ep.actions[:, 0], demo["actions"][1:].astype(np.float32))
        np.testing.assert_array_equal(ep.sim_states, demo["states"][1:])
        np.testing.assert_array_equal(ep.obs["image"], demo["agentview"][:-1, ::-1, ::-1])  # 180 degrees
        np.testing.assert_array_equal(ep.obs["wrist_image"], demo["wrist"][:-1, ::-1, ::-1])
        np.testing.assert_array_equal(ep.obs["proprio"], demo["proprio"][:-1].astype(np.float32))
        assert ep.rewards[-1, 0] == 1 and ep.rewards.sum() == 1 and ep.success
        assert ep.instruction == INSTRUCTIONS[0] and ep.task == "libero_spatial/put_the_bowl_on_the_plate"

    raw = read_libero_hdf5(path, align=False, progress=False).episodes[0]  # the file's own pairing
    np.testing.assert_array_equal(raw.actions[:, 0], demos[0]["actions"].astype(np.float32))
    np.testing.assert_array_equal(raw.obs["image"], demos[0]["agentview"][:, ::-1, ::-1])

    # robosuite's "opencv" convention stores rows already flipped: mirrored to the same upright image
    flipped = dict(demos[0], agentview=demos[0]["agentview"][:, ::-1].copy())
    cv = write_libero_file(tmp_path / "cv.hdf5", [flipped], convention="opencv")
    np.testing.assert_array_equal(
        read_libero_hdf5(cv, progress=False).episodes[0].obs["image"], got.episodes[0].obs["image"]
    )

    # a folder of files (a suite, as LIBERO's download gives it): every file, sorted
    folder = tmp_path / "suite"
    folder.mkdir()
    write_libero_file(folder / "a_demo.hdf5", demos[:1])
    write_libero_file(folder / "b_demo.hdf5", demos, instruction=["open ", "the top drawer"])
    both = load_demos(folder, progress=False)
    assert detect_format(folder) == "libero-hdf5" and len(both.episodes) == 3
    assert [ep.instruction for ep in both.episodes] == [INSTRUCTIONS[0], *[INSTRUCTIONS[1]] * 2]


def test_robomimic_names_give_the_same_observations(tmp_path):
    """robomimic's robosuite keys: images by their camera names, the pose as position + xyzw quaternion."""
    from envs.libero.sim import quat_xyzw_to_axis_angle  # what our env's proprio uses

    rng = np.random.default_rng(3)
    demo = _libero_demo(rng, 5)
    quat = rng.normal(size=(5, 4))
    quat /= np.linalg.norm(quat, axis=1, keepdims=True)
    quat[0] = [0, 0, np.sin(0.25), np.cos(0.25)]  # 0.5 rad about z
    with h5py.File(tmp_path / "robomimic.hdf5", "w") as f:
        g = f.create_group("data/demo_0")
        g["actions"], g["states"] = demo["actions"], demo["states"]
        g["obs/agentview_image"], g["obs/robot0_eye_in_hand_image"] = demo["agentview"], demo["wrist"]
        g["obs/robot0_eef_pos"], g["obs/robot0_eef_quat"] = demo["proprio"][:, :3], quat
        g["obs/robot0_gripper_qpos"] = demo["proprio"][:, 6:]
    ep = read_libero_hdf5(tmp_path / "robomimic.hdf5", align=False, progress=False).episodes[0]
    np.testing.assert_array_equal(ep.obs["image"], demo["agentview"][:, ::-1, ::-1])  # opengl by default
    np.testing.assert_array_equal(ep.obs["wrist_image"], demo["wrist"][:, ::-1, ::-1])
    np.testing.assert_allclose(ep.obs["proprio"][0, 3:6], [0, 0, 0.5], atol=1e-6)
    want = np.stack([quat_xyzw_to_axis_angle(q) for q in quat])
    np.testing.assert_allclose(ep.obs["proprio"][:, 3:6], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ep.obs["proprio"][:, 6:], demo["proprio"][:, 6:], rtol=1e-6)
    assert ep.instruction == "robomimic" and ep.task == "robomimic"  # no attributes: the file name


def test_bad_libero_files_are_refused_clearly(tmp_path):
    rng = np.random.default_rng(1)
    demo = _libero_demo(rng, 5)
    path = write_libero_file(tmp_path / "x.hdf5", [demo])
    with h5py.File(path, "a") as f:
        del f["data/demo_0/actions"]
    with pytest.raises(ValueError, match=r"data/demo_0: missing dataset 'actions'"):
        read_libero_hdf5(path, progress=False)
    write_libero_file(path, [dict(demo, states=demo["states"][:3])])
    with pytest.raises(ValueError, match=r"one entry per step, got lengths .*'sim_states': 3"):
        read_libero_hdf5(path, progress=False)
    write_libero_file(path, [dict(demo, agentview=demo["agentview"].astype(np.float32))])
    with pytest.raises(ValueError, match=r"obs/agentview_rgb must be uint8 \[T, H, W, 3\]"):
        read_libero_hdf5(path, progress=False)
    write_libero_file(path, [demo], convention="directx")
    with pytest.raises(ValueError, match="macros_image_convention must be 'opengl' or 'opencv'"):
        read_libero_hdf5(path, progress=False)
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["stuff"] = np.zeros(3)
    with pytest.raises(ValueError, match="is not a LIBERO/robomimic demonstration file"):
        read_libero_hdf5(tmp_path / "other.h5", progress=False)
    with pytest.raises(FileNotFoundError, match="no LIBERO demonstration file or folder"):
        read_libero_hdf5(tmp_path / "missing.hdf5")


def test_format_detection_names_what_it_expects(tmp_path):
    write_demos(tmp_path / "ours.h5", _demos().episodes, {})
    assert detect_format(tmp_path / "ours.h5") == "vla-gym-demos"
    (tmp_path / "notes.txt").write_text("hello")
    expected = "expected a vla-gym demos HDF5 file .* LIBERO/robomimic HDF5 .* LeRobot v3.0 dataset folder"
    with pytest.raises(ValueError, match=expected):
        detect_format(tmp_path / "notes.txt")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = 1
    with pytest.raises(ValueError, match="is not a demonstration dataset this project reads"):
        load_demos(tmp_path / "other.h5")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="a folder with nothing; expected"):
        load_demos(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no demonstration dataset at"):
        load_demos(tmp_path / "nowhere")
    with pytest.raises(TypeError, match="do not apply to a vla-gym demos file"):
        load_demos(tmp_path / "ours.h5", align=False)


def test_our_demos_keep_simulator_states(tmp_path):
    demos = _demos(sim=True)
    back = read_demos(write_demos(tmp_path / "d.h5", demos.episodes, {}))
    for a, b in zip(demos.episodes, back.episodes):
        np.testing.assert_array_equal(a.sim_states, b.sim_states)
    assert read_demos(write_demos(tmp_path / "e.h5", _demos().episodes, {})).episodes[0].sim_states is None


# ------------------------------------------------------------------------------ LeRobot v3.0
def _check_schema(root: Path, video: bool) -> dict:
    """The files and fields of the documented v3.0 layout (what LeRobot 0.4's loader reads)."""
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 20
    for key in ("total_episodes", "total_frames", "total_tasks", "chunks_size", "splits", "features"):
        assert key in info
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 19, 2)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == (
        "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4" if video else None
    )
    feats = info["features"]
    for name in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert feats[name]["shape"] == [1]
    image = feats["observation.images.image"]
    assert image["dtype"] == ("video" if video else "image") and image["shape"] == [SIZE, SIZE, 3]
    assert image["names"] == ["height", "width", "channels"]
    if video:
        assert image["info"]["video.codec"] == "av1" and image["info"]["video.pix_fmt"] == "yuv420p"
    assert feats["observation.state"] == {
        "dtype": "float32",
        "shape": [8],
        "names": feats["observation.state"]["names"],
    }
    assert feats["observation.state"]["names"][0] == "eef_pos_x" and feats["action"]["shape"] == [7]
    assert "observation.task_state" not in feats  # privileged: only when asked for

    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.schema.pandas_metadata["index_columns"] == ["__index_level_0__"]
    assert tasks["__index_level_0__"].to_pylist() == list(INSTRUCTIONS) and tasks[
        "task_index"
    ].to_pylist() == [0, 1]
    eps = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["length"] for e in eps] == [5, 8, 6] and [e["tasks"] for e in eps][1] == [INSTRUCTIONS[1]]
    assert [(e["dataset_from_index"], e["dataset_to_index"]) for e in eps] == [(0, 5), (5, 13), (13, 19)]
    if video:
        key = "videos/observation.images.image"
        assert [(e[f"{key}/from_timestamp"], e[f"{key}/to_timestamp"]) for e in eps] == [
            (0.0, 0.25),
            (0.25, 0.65),
            (0.65, 0.95),
        ]
        assert (root / "videos/observation.images.image2/chunk-000/file-000.mp4").is_file()
    assert np.asarray(eps[0]["stats/observation.images.image/mean"]).shape == (3, 1, 1)
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    state = data.schema.field("observation.state").type  # a fixed-size list, as LeRobot writes it
    assert pa.types.is_fixed_size_list(state) and state.list_size == 8 and state.value_type == pa.float32()
    assert str(data.schema.field("timestamp").type) == "float" and data["index"].to_pylist() == list(
        range(19)
    )
    assert data["frame_index"].to_pylist()[:6] == [0, 1, 2, 3, 4, 0]
    np.testing.assert_allclose(data["timestamp"].to_numpy()[5:8], [0, 0.05, 0.1], atol=1e-7)
    stats = json.loads((root / "meta/stats.json").read_text())
    assert set(stats["action"]) == {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
    assert np.asarray(stats["observation.images.image"]["std"]).shape == (3, 1, 1)
    assert stats["index"]["count"] == [19]
    return info


@requires_pyarrow
@pytest.mark.parametrize("video", [False, True], ids=["png", "video"])
def test_lerobot_round_trip(tmp_path, video):
    demos = _demos(sim=True)
    out = write_lerobot(demos, tmp_path / "ds", video=video, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no staging folder left
    _check_schema(out, video)
    assert detect_format(out) == "lerobot-v3"
    back = load_demos(out, progress=False)
    assert back.meta["env_kwargs"] == {"image_size": SIZE} and back.meta["format"] == "lerobot-v3"
    for a, b in zip(demos.episodes, back.episodes):
        for key in ("proprio",):
            np.testing.assert_array_equal(a.obs[key], b.obs[key])
        for key in ("image", "wrist_image"):
            if not video:  # PNGs are lossless
                np.testing.assert_array_equal(a.obs[key], b.obs[key])
                continue
            err = np.abs(a.obs[key].astype(int) - b.obs[key])
            assert err.mean() < 10, err.mean()  # 4:2:0 chroma on 16 x 16 random blocks
            for t in range(len(a.obs[key])):  # every decoded frame is its own frame, not a neighbour
                dist = [
                    np.abs(a.obs[key][u].astype(int) - b.obs[key][t]).mean() for u in range(len(a.obs[key]))
                ]
                assert int(np.argmin(dist)) == t
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.rewards, b.rewards)
        np.testing.assert_array_equal(a.sim_states, b.sim_states)
        assert (b.instruction, b.task, b.initial_frame, b.success) == (
            a.instruction,
            a.task,
            a.initial_frame,
            True,
        )
        assert set(b.obs) == {"image", "wrist_image", "proprio"}
    assert [e.length for e in read_lerobot(out, episodes=[2, 0], progress=False).episodes] == [6, 5]


def test_merged_episode_statistics_equal_the_whole_datasets():
    """stats.json's image statistics are merged from the episodes' (as LeRobot merges them)."""
    from trainers.datasets import stats as st

    rng = np.random.default_rng(4)
    a, b = _images(rng, 5), (_images(rng, 9) // 3).astype(np.uint8)
    whole, merged = (
        st.image_stats(np.concatenate([a, b])),
        st.aggregate([st.image_stats(a), st.image_stats(b)]),
    )
    for name in ("min", "max", "mean", "std", "count"):
        np.testing.assert_allclose(merged[name], whole[name], rtol=1e-9, atol=1e-12)
    assert merged["mean"].shape == (3, 1, 1) and merged["count"].tolist() == [14]


@requires_pyarrow
def test_lerobot_files_roll_over_at_their_size_targets(tmp_path):
    demos = _demos(sim=True)
    out = write_lerobot(
        demos,
        tmp_path / "ds",
        chunks_size=2,
        data_files_size_in_mb=1e-4,
        video_files_size_in_mb=1e-6,
        progress=False,
    )
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*.parquet") if p.parts[-3] == "data")
    assert names == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
        "data/chunk-001/file-000.parquet",
    ]
    eps = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e["data/chunk_index"], e["data/file_index"]) for e in eps] == [(0, 0), (0, 1), (1, 0)]
    key = "videos/observation.images.image"
    assert [(e[f"{key}/chunk_index"], e[f"{key}/file_index"]) for e in eps] == [(0, 0), (0, 1), (1, 0)]
    assert [e[f"{key}/from_timestamp"] for e in eps] == [0.0, 0.0, 0.0]
    assert len(list((out / key).rglob("*.mp4"))) == 3 and not list(out.rglob(".segments"))
    # a size target no episode reaches: all in one file, back to back
    one = write_lerobot(demos, tmp_path / "one", progress=False)
    eps = pq.read_table(one / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e[f"{key}/from_timestamp"], e[f"{key}/to_timestamp"]) for e in eps] == [
        (0, 0.25),
        (0.25, 0.65),
        (0.65, 0.95),
    ]
    back = read_lerobot(out, progress=False)
    for a, b in zip(demos.episodes, back.episodes):
        np.testing.assert_array_equal(a.actions, b.actions)
        assert np.abs(a.obs["image"].astype(int) - b.obs["image"]).mean() < 10


@requires_pyarrow
def test_lerobot_export_options_and_refusals(tmp_path):
    demos = _demos()
    out = write_lerobot(demos, tmp_path / "ds", video=False, obs_keys=["image", "task_state"], progress=False)
    info = json.loads((out / "meta/info.json").read_text())
    assert set(info["features"]) >= {"observation.images.image", "observation.task_state"}
    back = read_lerobot(out, progress=False)
    assert set(back.episodes[0].obs) == {"image", "task_state"}
    np.testing.assert_array_equal(back.episodes[1].obs["task_state"], demos.episodes[1].obs["task_state"])

    with pytest.raises(ValueError, match="ds already exists: pass --overwrite to replace it"):
        write_lerobot(demos, out, progress=False)
    mine = tmp_path / "mine"  # a folder of the user's: --overwrite never deletes it
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match="mine exists and is not a LeRobot dataset that vla-gym wrote"):
        write_lerobot(demos, mine, overwrite=True, progress=False)
    assert (mine / "thesis.tex").read_text() == "years of work"
    (mine / "thesis.tex").unlink()
    mine.rmdir()
    write_lerobot(_demos(seed=5), out, video=False, overwrite=True, progress=False)  # replaced whole
    np.testing.assert_array_equal(
        read_lerobot(out, progress=False).episodes[0].actions, _demos(seed=5).episodes[0].actions
    )
    with pytest.raises(ValueError, match="one observation per action, these demos have chunks of 4"):
        write_lerobot(_demos(k=4), tmp_path / "chunked", progress=False)
    with pytest.raises(KeyError, match=r"\['depth'\] are not in the demos"):
        write_lerobot(demos, tmp_path / "x", obs_keys=["depth"], progress=False)
    odd = Demos({}, [_episode(np.random.default_rng(0), 3, "go")])
    odd.episodes[0].obs["image"] = np.zeros((3, 15, 15, 3), np.uint8)
    with pytest.raises(ValueError, match="yuv420p videos need an even height and width"):
        write_lerobot(odd, tmp_path / "odd", progress=False)
    # a failure half-way leaves neither the output nor a staging folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


@requires_pyarrow
def test_lerobot_reads_the_key_names_of_the_libero_sets(tmp_path):
    """physical-intelligence/libero names its features image, wrist_image, state, actions."""
    out = write_lerobot(_demos(), tmp_path / "ds", video=False, progress=False)
    rename = {
        "observation.images.image": "image",
        "observation.images.image2": "wrist_image",
        "observation.state": "state",
        "action": "actions",
    }
    info = json.loads((out / "meta/info.json").read_text())
    info["features"] = {rename.get(k, k): v for k, v in info["features"].items()}
    del info["vla_gym"]
    (out / "meta/info.json").write_text(json.dumps(info))
    data_path = out / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data_path)
    pq.write_table(table.rename_columns([rename.get(c, c) for c in table.column_names]), data_path)
    back = read_lerobot(out, progress=False)
    assert set(back.episodes[0].obs) == {"image", "wrist_image", "proprio"}
    np.testing.assert_array_equal(
        back.episodes[2].obs["wrist_image"], _demos().episodes[2].obs["wrist_image"]
    )
    np.testing.assert_array_equal(back.episodes[2].actions, _demos().episodes[2].actions)
    custom = read_lerobot(out, keys={"front": "image"}, progress=False)  # an explicit mapping wins
    assert "front" in custom.episodes[0].obs
    with pytest.raises(KeyError, match=r"features \{'x': 'nope'\} are not in the dataset"):
        read_lerobot(out, keys={"x": "nope"}, progress=False)


@requires_pyarrow
def test_lerobot_reads_a_dataset_written_by_lerobot_itself():
    """``tests/data/lerobot_v30_tiny`` was written by LeRobot 0.4.4's LeRobotDataset.create /
    add_frame / save_episode (see its README): 3 episodes, AV1 videos, fps 10."""
    demos = load_demos(FIXTURES / "lerobot_v30_tiny", progress=False)
    assert [ep.instruction for ep in demos.episodes] == ["put the bowl on the plate", "open the drawer"] + [
        "put the bowl on the plate"
    ]
    assert demos.meta["fps"] == 10 and demos.meta["robot_type"] == "panda"
    for e, ep in enumerate(demos.episodes):
        n = len(ep.actions)
        want = np.zeros((n, 32, 32, 3), np.uint8)  # what the fixture's frames were
        for t in range(n):
            want[t, ..., 0], want[t, ..., 1] = 40 * e, 20 * t
            want[t, 8:16, 2 * t : 2 * t + 8, 2] = 255
        assert np.abs(ep.obs["image"].astype(int) - want).mean() < 4
        assert np.abs(ep.obs["wrist_image"].astype(int) - want[:, ::-1]).mean() < 4
        np.testing.assert_array_equal(ep.obs["proprio"][:, 0], 10 * e + np.arange(n))
        np.testing.assert_allclose(ep.actions[:, 0, 0], e + np.arange(n) / 100, rtol=1e-6)
        assert ep.success and ep.rewards.sum() == 0


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    return Path(shutil.copytree(src, dst))


@requires_pyarrow
def test_bad_lerobot_folders_are_refused_clearly(tmp_path):
    out = write_lerobot(_demos(), tmp_path / "ds", progress=False)
    bad = _copy(out, tmp_path / "v21")
    info = json.loads((bad / "meta/info.json").read_text())
    (bad / "meta/info.json").write_text(json.dumps(dict(info, codebase_version="v2.1")))
    with pytest.raises(
        ValueError, match=r"codebase_version 'v2.1'; this reader reads v3.0 .*convert_dataset_v21_to_v30"
    ):
        load_demos(bad)
    bad = _copy(out, tmp_path / "novideo")
    (bad / "videos/observation.images.image2/chunk-000/file-000.mp4").unlink()
    with pytest.raises(FileNotFoundError, match="video file .*file-000.mp4 is missing"):
        load_demos(bad, progress=False)
    bad = _copy(out, tmp_path / "nodata")
    (bad / "data/chunk-000/file-000.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="data file data/chunk-000/file-000.parquet is missing"):
        load_demos(bad, progress=False)
    bad = _copy(out, tmp_path / "notasks")
    (bad / "meta/tasks.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="meta/tasks.parquet is missing"):
        load_demos(bad, progress=False)
    bad = _copy(out, tmp_path / "lengths")  # the metadata says 9 frames, the data has 8
    path = bad / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    lengths = table["length"].to_pylist()
    lengths[1] = 9
    pq.write_table(table.set_column(table.column_names.index("length"), "length", pa.array(lengths)), path)
    with pytest.raises(
        ValueError, match=r"episode 1 has length 9 in its metadata, its frames \{'observation.state': 8"
    ):
        load_demos(bad, progress=False)
    (bad / "meta/info.json").unlink()
    with pytest.raises(ValueError, match="expected a vla-gym demos HDF5 file"):  # no info.json: not LeRobot
        load_demos(bad)
    with pytest.raises(FileNotFoundError, match="meta/info.json is missing"):
        read_lerobot(bad)


EPISODES_PARQUET = "meta/episodes/chunk-000/file-000.parquet"


def _edit_info(out: Path, change) -> None:
    info = json.loads((out / "meta/info.json").read_text())
    change(info)
    (out / "meta/info.json").write_text(json.dumps(info))


@requires_pyarrow
@pytest.mark.parametrize(
    "case, change, message",
    [
        ("truncated info.json", lambda o: truncated(o / "meta/info.json"),
         r"meta/info.json: expected a JSON object .*got a file that does not parse as JSON .*truncated"),
        ("info.json a list", lambda o: (o / "meta/info.json").write_text("[1, 2]"),
         r"meta/info.json: expected a JSON object, got a JSON list"),
        ("features as a list", lambda o: _edit_info(o, lambda i: i.update(features=list(i["features"]))),
         r"info.json: expected features as a JSON object \{name: \{dtype, shape, ...\}\}, got a JSON list "
         r"\(\['observation.images.image'"),
        ("a feature as a string", lambda o: _edit_info(o, lambda i: i["features"].update(action="float32")),
         r"expected each feature as a JSON object with a dtype, got features\['action'\] = 'float32'"),
        ("fps a string", lambda o: _edit_info(o, lambda i: i.update(fps="x")),
         r"info.json: expected fps as a positive number, got 'x'"),
        ("truncated data parquet", lambda o: truncated(o / "data/chunk-000/file-000.parquet"),
         r"data/chunk-000/file-000.parquet: expected a parquet file \(the dataset's data file\), got one "
         r"pyarrow cannot read \(ArrowInvalid: .*truncated"),
        ("truncated episodes parquet", lambda o: truncated(o / EPISODES_PARQUET, 0.9),
         r"meta/episodes/chunk-000/file-000.parquet: expected a parquet file \(the dataset's episodes"),
        ("truncated tasks parquet", lambda o: truncated(o / "meta/tasks.parquet"),
         r"meta/tasks.parquet: expected a parquet file \(the dataset's task list\)"),
    ],
)  # fmt: skip
def test_truncated_or_malformed_lerobot_files_are_refused_clearly(tmp_path, case, change, message):
    """Issue 32 item 8: each a ValueError naming the file, what was expected and what came (they
    were a raw JSONDecodeError, ArrowInvalid without the file, TypeError or AttributeError)."""
    out = write_lerobot(_demos(), tmp_path / "ds", video=False, progress=False)
    change(out)
    with pytest.raises(ValueError, match=message):
        load_demos(out, progress=False)


VIDEO = "videos/observation.images.image/chunk-000/file-000.mp4"


def _cut_mp4(path: Path, how: str) -> None:
    """Cut a real mp4 (ffmpeg's layout: ftyp, free, mdat, then moov, the frame index) short."""
    data = path.read_bytes()
    moov = data.rfind(b"moov") - 4  # where the moov box starts
    keep = {"half": len(data) // 2, "no moov": moov, "last byte": len(data) - 1}.get(how)
    path.write_bytes(data[:keep] if keep is not None else b"not a video at all, just text\n")


CUT_MP4 = {  # how a video is damaged -> what the error says came
    "half": r"cut short \(\d+ bytes: its 'mdat' box at byte \d+ declares \d+ bytes, \d+ more than",
    "no moov": r"cut short \(\d+ bytes: it has no 'moov' box, the index of its frames",
    "last byte": r"cut short \(\d+ bytes: its 'moov' box at byte \d+ declares \d+ bytes, 1 more than",
    "not an mp4": r"ffmpeg cannot decode \(is it truncated or damaged\?\): \S",
}


@requires_pyarrow
@pytest.mark.parametrize("how", list(CUT_MP4))
def test_a_truncated_video_is_refused_naming_the_file(tmp_path, monkeypatch, how):
    """Issue 32: a LeRobot video cut short was ffmpeg's RuntimeError. Now a ValueError names the
    file, what info.json declares (19 frames of 16x16 in this file) and what came; a file cut short
    is found from its box headers, before ffmpeg is started."""
    import trainers.datasets.video as video

    out = write_lerobot(_demos(), tmp_path / "ds", progress=False)
    _cut_mp4(out / VIDEO, how)
    if how != "not an mp4":  # refused before any decoding
        monkeypatch.setattr(video.subprocess, "Popen", lambda *a, **k: pytest.fail("ffmpeg started"))
    expected = (
        rf"{re.escape(str(out / VIDEO))}: expected a video of 16x16 frames that meta/info.json declares "
        rf"for 'observation.images.image' \(at least 19\), got a file "
    )
    with pytest.raises(ValueError, match=expected + CUT_MP4[how]):
        load_demos(out, progress=False)


def test_a_truncated_world_model_dataset_file_is_named(tmp_path):
    out = write_world_model_dataset(_demos(), tmp_path / "bundle")
    path = sorted(out.glob("*.npy"))[1]
    truncated(path, 0.7)
    with pytest.raises(ValueError, match=rf"{path}: expected a whole pickle of plain data.*truncated"):
        load_initial_frames(out)


def test_a_missing_optional_dependency_names_the_extra(tmp_path):
    """Without pyarrow: the package imports, the other formats work, LeRobot says which extra."""
    write_demos(tmp_path / "d.h5", _demos().episodes, {})
    code = f"""
import sys
sys.modules["pyarrow"] = None  # blocked: importing it raises ImportError
sys.modules["pyarrow.parquet"] = None
from trainers.datasets import load_demos, write_lerobot
demos = load_demos({str(tmp_path / "d.h5")!r})
try:
    write_lerobot(demos, {str(tmp_path / "out")!r}, progress=False)
except ImportError as e:
    print("ERROR:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (
        'ERROR: LeRobot datasets (parquet files) need pyarrow: pip install "vla-gym[datasets]"' in out.stdout
    ), out.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ world-model dataset/
@pytest.mark.parametrize("k", [1, 4])
def test_world_model_dataset_is_what_load_initial_frames_reads(tmp_path, k):
    demos = _demos(k=k, sim=True)
    folder = write_world_model_dataset(demos, tmp_path / "bundle", progress=False)
    assert folder == tmp_path / "bundle" / "dataset"
    assert sorted(p.name for p in (tmp_path / "bundle").iterdir()) == ["dataset"]
    frames = load_initial_frames(tmp_path / "bundle")  # the restricted unpickler: no code runs
    assert len(frames) == 3
    for n, (frame, ep) in enumerate(zip(frames, demos.episodes)):
        np.testing.assert_array_equal(frame.image, ep.obs["image"][0])
        np.testing.assert_array_equal(frame.wrist_image, ep.obs["wrist_image"][0])
        np.testing.assert_array_equal(frame.sim_state, ep.sim_states[0])
        assert (frame.instruction, frame.task) == (ep.instruction, ep.task)
        assert frame.meta == {
            "episode": n,
            "step": 0,
            "initial_frame": ep.initial_frame,
            "success": True,
        }
    from nets.safe_load import load_npy

    whole = load_npy(folder / "episode_000001.npy")  # the whole trajectory, one dict per observation
    assert len(whole) == len(demos.episodes[1].actions)
    last = whole[-1]  # the last observation: the first action of its chunk, the image it was chosen from
    np.testing.assert_array_equal(last["delta_action"], demos.episodes[1].actions[-1, 0])
    np.testing.assert_array_equal(last["image"], demos.episodes[1].obs["image"][-1])
    assert last["delta_action"].dtype == np.float32 and last["image"].dtype == np.uint8
    if k > 1:
        np.testing.assert_array_equal(last["action_valid"], demos.episodes[1].valid[-1])
    assert ("action_chunk" in whole[0]) == (k > 1)
    with pytest.raises(ValueError, match="dataset already exists: pass --overwrite"):
        write_world_model_dataset(demos, tmp_path / "bundle", progress=False)
    bad = _demos(k=k)
    bad.episodes[2].actions = bad.episodes[2].actions[..., :6]
    with pytest.raises(ValueError, match="episode 2: world-model datasets hold 7-D LIBERO actions, got 6-D"):
        write_world_model_dataset(bad, tmp_path / "bundle", overwrite=True, progress=False)
    assert len(load_initial_frames(tmp_path / "bundle")) == 3  # the old set is untouched
    assert sorted(p.name for p in (tmp_path / "bundle").iterdir()) == ["dataset"]


def test_a_world_model_env_starts_from_an_exported_dataset(tmp_path):
    from envs.world_models.tiny import write_tiny_bundle

    bundle = write_tiny_bundle("opensora", tmp_path / "bundle")
    demos = _demos()
    for ep in demos.episodes:  # the tiny OpenSora bundle's frame size
        ep.obs["image"] = np.repeat(np.repeat(ep.obs["image"], 2, 1), 2, 2)
    write_world_model_dataset(demos, bundle, overwrite=True, progress=False)
    env = gym.make_vec(
        "OpenSoraWM-LiberoSpatial-v0",
        num_envs=1,
        model_dir=bundle,
        image_size=(32, 32),
        model_options={"num_steps": 2},
        autoreset_mode="Disabled",
    )
    try:
        assert len(env.unwrapped.initial_frames) == 3
        obs, _ = env.reset(options={"initial_frames": [1]})
        np.testing.assert_array_equal(obs["image"][0], demos.episodes[1].obs["image"][0])
        assert obs["instruction"][0] == INSTRUCTIONS[1]
        env.step(np.zeros(env.action_space.shape, np.float32))
    finally:
        env.close()


# ------------------------------------------------------------------------------ command line
@requires_pyarrow
def test_command_line_info_and_exports(tmp_path, capsys):
    path = write_demos(tmp_path / "d.h5", _demos().episodes, {"env": "envs:Libero-Spatial-v0"})
    datasets_cli(["info", str(path)])
    text = capsys.readouterr().out
    assert (
        "format: vla-gym-demos" in text
        and "episodes: 3 (3 successful)" in text
        and "obs image: uint8 (16, 16, 3)" in text
    )
    out = datasets_cli(
        ["export-lerobot", "--demos", str(path), "--out", str(tmp_path / "lr"), "--no-video", "--no-progress"]
    )
    assert out == tmp_path / "lr" and detect_format(out) == "lerobot-v3"
    wm = datasets_cli(["export-wm", "--demos", str(out), "--out", str(tmp_path / "wm"), "--no-progress"])
    assert len(load_initial_frames(wm)) == 3  # LeRobot -> world-model dataset works too
    datasets_cli(["info", str(out)])
    assert "format: lerobot-v3" in capsys.readouterr().out


# ------------------------------------------------------------------------------ declared sizes and paths
@requires_pyarrow
@pytest.mark.parametrize(
    "size, video", [(8, True), (32, True), (8, False)], ids=["video-smaller", "video-larger", "png"]
)
def test_frames_of_another_size_than_info_json_declares_are_refused(tmp_path, size, video):
    """16 x 16 frames that info.json declares 8 x 8 used to read as four frames each (scrambled), and
    ``info`` said nothing: now the reader and the command refuse them, naming file and sizes."""
    out = lerobot_declaring(tmp_path / "ds", size, video)
    message = (
        rf"file-000\.(mp4: frame 0 of the video|parquet: observation.images.image: image 0) is 16x16 "
        rf"\(height x width.*not the {size}x{size} .*that meta/info.json declares"
    )
    with pytest.raises(ValueError, match=message):
        load_demos(out, progress=False)
    with pytest.raises(SystemExit) as stopped:  # the command: the message and exit status 1
        datasets_command(["info", str(out)])
    assert re.search("python -m trainers.datasets: error: .*" + message, str(stopped.value.code))
    # the declared size true again: the same folder reads
    fixed = lerobot_declaring(tmp_path / "fixed", SIZE, video)
    assert load_demos(fixed, progress=False).episodes[0].obs["image"].shape == (6, SIZE, SIZE, 3)


@requires_pyarrow
@pytest.mark.parametrize(
    "how", ["data_path ../", "video_path absolute", "symlinked data file", "symlinked info.json"]
)
def test_lerobot_files_outside_the_dataset_folder_are_refused(tmp_path, how):
    """Templates of info.json and symlinks may not lead out of the folder (the file there exists)."""
    out = lerobot_reaching_out(tmp_path, how)
    with pytest.raises(ValueError, match=r"resolves to .*outside.*, outside the dataset folder .*dataset"):
        load_demos(out, progress=False)


@requires_pyarrow
def test_lerobot_path_templates_fill_only_their_fields(tmp_path):
    """A field width of 900 MB (``{chunk_index:0900000000d}``) used to be filled in memory."""
    out = lerobot_reaching_out(tmp_path, "data_path 900 MB wide")
    with pytest.raises(
        ValueError, match=r"data_path .* is not a path template .*: \{chunk_index:0900000000d\}"
    ):
        load_demos(out, progress=False)
    info = json.loads((out / "meta/info.json").read_text())
    for template in ("{chunk_index.real}", "{file_index!r}", "{episode_index}"):
        (out / "meta/info.json").write_text(json.dumps(dict(info, data_path=template)))
        with pytest.raises(ValueError, match="is not a path template this reader fills"):
            load_demos(out, progress=False)


@requires_pyarrow
def test_lerobot_folders_reached_through_links_the_user_chose_still_read(tmp_path):
    """The folder itself may be a symlink, and a Hugging Face hub cache snapshot (``hf download``
    without --local-dir) links every file into its repository's blobs folder: both read."""
    import os
    import shutil

    out = write_lerobot(_demos(), tmp_path / "ds", progress=False)
    (tmp_path / "link").symlink_to(out)
    want = [ep.actions for ep in load_demos(out, progress=False).episodes]
    repo = tmp_path / "hub" / "datasets--someone--libero"
    snapshot, blobs = repo / "snapshots" / "0123abcd", repo / "blobs"
    blobs.mkdir(parents=True)
    for n, file in enumerate(sorted(p for p in out.rglob("*") if p.is_file())):
        blob, link = blobs / f"{n:040x}", snapshot / file.relative_to(out)
        shutil.copy(file, blob)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for path in (tmp_path / "link", snapshot):
        got = [ep.actions for ep in load_demos(path, progress=False).episodes]
        assert len(got) == 3 and all(np.array_equal(a, b) for a, b in zip(got, want))
    # the exception is the snapshot's own repository only: a link into another repository's blobs
    other = tmp_path / "hub" / "datasets--else--x" / "blobs"
    other.mkdir(parents=True)
    data = snapshot / "data" / "chunk-000" / "file-000.parquet"
    shutil.copy(data, other / "data")
    data.unlink()
    data.symlink_to(other / "data")
    with pytest.raises(ValueError, match="outside the dataset folder"):
        load_demos(snapshot, progress=False)


def test_libero_folder_files_outside_the_folder_are_refused(tmp_path):
    (tmp_path / "suite").mkdir()
    libero_file(tmp_path / "suite" / "a_demo.hdf5")
    (tmp_path / "suite" / "b_demo.hdf5").symlink_to(libero_file(tmp_path / "b_demo.hdf5"))
    for call in (detect_format, read_libero_hdf5):
        with pytest.raises(ValueError, match=r"file b_demo.hdf5 resolves to .*, outside the dataset folder"):
            call(tmp_path / "suite")
    (tmp_path / "suite" / "b_demo.hdf5").unlink()
    assert len(load_demos(tmp_path / "suite", progress=False).episodes) == 1


@pytest.mark.parametrize(
    "how, message",
    [
        ("external link", r"episodes/000000/actions is an external link to .*d-other.h5:/actions; "
         "links to other files are never followed"),
        ("external storage", r"episodes/000000/actions keeps its data in external files \(.*d-raw.bin\)"),
        ("virtual dataset", r"dataset episodes/000000/actions is a virtual dataset"),
    ],
    ids=["external-link", "external-storage", "virtual"],
)  # fmt: skip
def test_hdf5_data_outside_the_file_is_refused(tmp_path, how, message):
    path = demos_file_with(tmp_path / "d.h5", how)
    for call in (read_demos, load_demos, detect_format):
        with pytest.raises(UnsafeHDF5Error, match=message + ".*refused"):
            call(path)
    libero = libero_file(tmp_path / "task_demo.hdf5")  # LIBERO's reader: the same
    with h5py.File(libero, "a") as f:
        del f["data/demo_0/actions"]
        f["data/demo_0/actions"] = h5py.ExternalLink(str(tmp_path / "d-other.h5"), "/actions")
    with pytest.raises(UnsafeHDF5Error, match="data/demo_0/actions is an external link"):
        read_libero_hdf5(libero, progress=False)


@pytest.mark.parametrize(
    "how, message",
    [
        ("4 GiB compressed", r"dataset episodes/000000/obs/image declares \(4194304, 16, 16, 4\) uint8 "
         r"\(4.0 GiB\); its compressed chunks store \d+ B, which expand to at most 1100 times that \(.*\)"),
        ("800 MB contiguous", r"dataset episodes/000000/sim_states declares \(100000, 1000\) float64 "
         r"\(762.9 MiB\); uncompressed data can hold at most the file's \d+\.\d KiB"),
    ],
    ids=["compressed", "contiguous"],
)  # fmt: skip
def test_hdf5_datasets_declaring_more_than_the_file_holds_are_refused(tmp_path, how, message):
    import tracemalloc

    path = demos_file_with(tmp_path / "d.h5", how)
    assert path.stat().st_size < 200_000
    tracemalloc.start()
    try:
        for call in (read_demos, load_demos):
            with pytest.raises(UnsafeHDF5Error, match=message + r"; refused \(a damaged or crafted file\)"):
                call(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000  # refused before the array was allocated


def test_hdf5_sizes_are_capped_by_what_the_file_holds(tmp_path):
    """The rule of ``trainers.safe_hdf5``: what real files hold passes, more than they can is refused."""
    from trainers.reward_model.collect import read_frames
    from trainers.safe_hdf5 import MAX_EXPANSION, SafeHDF5

    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        zeros = np.zeros((4000, 1000), np.uint8)  # one chunk of 4 MB
        f.create_dataset("zeros", data=zeros, chunks=zeros.shape, compression="gzip", compression_opts=9)
        f["soft"] = h5py.SoftLink("/zeros")  # soft links stay inside the file
        partial = f.create_dataset("partial", (40, 1000), np.uint8, chunks=(10, 1000), maxshape=(None, 1000))
        partial[:10] = 1  # uncompressed chunks: three of four never written
    with pytest.raises(
        UnsafeHDF5Error, match=r"dataset partial declares .*its uncompressed chunks store only"
    ):
        SafeHDF5(path)
    with h5py.File(path, "a") as f:
        f["partial"][10:] = 2
    with SafeHDF5(path) as h:  # all-zero gzip data, the most compressible there is: 1026:1 is read
        stored = h.file["zeros"].id.get_storage_size()
        assert 1000 < 4_000_000 / stored < MAX_EXPANSION
        assert h.read(h.file["zeros"]).shape == (4000, 1000)
        assert h.read(h.file["soft"]).sum() == 0 and h.read(h.file["partial"]).sum() == 10_000 + 2 * 30_000
    # a demo reached through 20 hard links: each read counts, past the file's size it stops
    linked = libero_file(tmp_path / "linked_demo.hdf5", linked=20)
    with pytest.raises(
        UnsafeHDF5Error, match=r"reading /data/demo_\d+/obs/agentview_rgb .*past what the file"
    ):
        read_libero_hdf5(linked, progress=False)
    assert len(read_libero_hdf5(libero_file(tmp_path / "one_demo.hdf5"), progress=False).episodes) == 1
    frames = frame_set_declaring(tmp_path / "frames.h5")  # the reward model's frame sets: the same
    with pytest.raises(UnsafeHDF5Error, match=r"dataset frames declares \(4194304, 32, 32, 1\) uint8"):
        read_frames(frames)


@requires_pyarrow
def test_the_robustness_probe_counts_every_declared_size_case_handled(tmp_path):
    """``python -m benchmarks.robustness --categories "declared sizes"``: the cases above, one table row."""
    from benchmarks.robustness import probe_all

    results = probe_all(["declared sizes"], tmp_path)["declared sizes"]
    assert len(results) == 16 and not any(results.values()), results


@requires_pyarrow
def test_the_robustness_probe_counts_every_malformed_file_case_handled(tmp_path):
    """``python -m benchmarks.robustness --categories "malformed files"`` (issue 32 item 8)."""
    from benchmarks.robustness import probe_all

    results = probe_all(["malformed files"], tmp_path)["malformed files"]
    assert len(results) == 10 and not any(results.values()), results


# ------------------------------------------------------------------------------ behaviour cloning
class DemoShapedEnv(ChunkedVectorEnv):
    """Observations shaped like the test data (image, wrist_image, proprio, instruction), 7-D actions."""

    def __init__(self, num_envs=1, chunk_size=2, image_size=SIZE, autoreset_mode="NextStep"):
        super().__init__(
            env_id="DemoShaped-v0",
            num_envs=num_envs,
            single_observation_space=observation_space(
                image_size=(image_size, image_size), wrist=True, proprio_dim=8, instruction=True
            ),
            action_low=-np.ones(7),
            action_high=np.ones(7),
            chunk_size=chunk_size,
            initial_frames=[InitialFrame(instruction=text) for text in INSTRUCTIONS],
            autoreset_mode=autoreset_mode,
        )
        self.size = image_size

    def _check_frame(self, frame):
        return None

    def _max_episode_steps(self, frame):
        return 6

    def _obs(self, n):
        img = np.zeros((n, self.size, self.size, 3), np.uint8)
        return {"image": img, "wrist_image": img.copy(), "proprio": np.zeros((n, 8), np.float32)}

    def _reset_envs(self, env_ids, frames):
        return self._obs(len(env_ids))

    def _step_envs(self, env_ids, actions, max_steps):
        n, k = actions.shape[:2]
        valid = np.arange(k)[None, :] < np.asarray(max_steps)[:, None]
        zeros = np.zeros((n, k), np.float32)
        return ChunkResult(self._obs(n), zeros, valid, zeros.astype(bool), np.zeros(n, bool), {})


gym.register("DemoShaped-v0", vector_entry_point=f"{__name__}:DemoShapedEnv")


@pytest.mark.parametrize(
    "kind", ["vla-gym-demos", "libero-hdf5", pytest.param("lerobot-v3", marks=requires_pyarrow)]
)
def test_behaviour_cloning_reads_each_format(tmp_path, kind):
    if kind == "vla-gym-demos":
        path = write_demos(tmp_path / "d.h5", _demos().episodes, {})
    elif kind == "libero-hdf5":
        rng = np.random.default_rng(2)
        path = write_libero_file(tmp_path / "task_demo.hdf5", [_libero_demo(rng, 7), _libero_demo(rng, 5)])
    else:
        path = write_lerobot(_demos(), tmp_path / "lr", progress=False)
    assert detect_format(path) == kind
    bc.main(
        [
            "--demos",
            str(path),
            "--env",
            "DemoShaped-v0",
            "--env-kwargs",
            '{"chunk_size": 2}',
            "--policy",
            "gaussian",
        ]
        + [
            "--epochs",
            "3",
            "--batch-size",
            "4",
            "--num-envs",
            "1",
            "--eval-every",
            "-1",
            "--run-dir",
            str(tmp_path / "run"),
        ]
        + ["--no-progress", "--no-tensorboard", "--no-video"]
    )
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/bc_loss"] for r in rows if "train/bc_loss" in r]
    assert len(losses) == 3 and all(np.isfinite(losses))


# ------------------------------------------------------------------------------ orientation in real LIBERO
@pytest.mark.slow
@requires_libero
def test_libero_files_read_upright_like_the_env_renders(tmp_path):
    """Render a demo-like state with the raw (upside-down) robosuite image, store it the way LIBERO's
    create_dataset.py does, read it back: it equals our env's own (upright) observation of that state."""
    size = 48

    def observe(frame, upright):
        env = gym.make_vec(
            "Libero-Spatial-v0", num_envs=1, image_size=size, upright=upright, settle_steps=0,
            autoreset_mode="Disabled", chunk_size=None,
        )  # fmt: skip
        try:
            if frame is None:
                return env.unwrapped.initial_frames[0]
            obs, _ = env.reset(options={"initial_frames": [frame]})
            return {k: np.asarray(v[0]) for k, v in obs.items() if k != "instruction"}
        finally:
            env.close()

    start = observe(None, True)
    state = np.array(start.sim_state)
    state[1:8] += [0.3, -0.2, 0.1, -0.3, 0.2, 0.4, -0.5]  # a demo step: the arm away from its start pose
    frame = InitialFrame(instruction=start.instruction, task=start.task, sim_state=state)
    raw, up = observe(frame, False), observe(frame, True)
    # the scene is not symmetric: a plain vertical flip (or none) would not pass the checks below
    assert not np.array_equal(raw["image"][::-1], up["image"]) and not np.array_equal(
        raw["image"], up["image"]
    )
    demo = {
        "agentview": np.stack([raw["image"]] * 2),
        "wrist": np.stack([raw["wrist_image"]] * 2),
        "proprio": np.stack([raw["proprio"]] * 2).astype(np.float64),
        "actions": np.zeros((2, 7)),
        "states": np.stack([state, state]),
        "rewards": np.array([0, 1], np.uint8),
        "dones": np.array([0, 1], np.uint8),
    }
    bddl = f"libero/libero/bddl_files/{start.task}.bddl"
    path = write_libero_file(tmp_path / "demo.hdf5", [demo], instruction=start.instruction, bddl=bddl)
    ep = read_libero_hdf5(path, progress=False).episodes[0]
    np.testing.assert_array_equal(ep.obs["image"][0], up["image"])
    np.testing.assert_array_equal(ep.obs["wrist_image"][0], up["wrist_image"])
    np.testing.assert_array_equal(ep.obs["proprio"][0], up["proprio"])
    assert ep.task == start.task and ep.instruction == start.instruction


# ------------------------------------------------------------------------------ data semantics
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda ep: {"actions": ep.actions.astype(np.complex64)}, r"episode 1: actions must be real numbers"),
        (lambda ep: {"rewards": np.full_like(ep.rewards, np.nan)}, r"episode 1: rewards hold NaN"),
        (
            lambda ep: {"obs": {**ep.obs, "image": ep.obs["image"].astype(np.uint16) * 300}},
            r"'image' is a uint16",
        ),
        (lambda ep: {"obs": {**ep.obs, "proprio": ep.obs["proprio"] * np.inf}}, r"obs 'proprio' hold NaN"),
        (lambda ep: {"instruction": b"put the bowl"}, r"episode 1: instruction must be a string"),
    ],
    ids=["complex-actions", "nan-rewards", "16-bit-image", "inf-proprio", "bytes-instruction"],
)
def test_demos_hold_real_finite_numbers_8_bit_images_and_text(change, message):
    episodes = _demos().episodes
    episodes[1] = dataclasses.replace(episodes[1], **change(episodes[1]))
    with pytest.raises(ValueError, match=message):
        Demos({}, episodes)


def test_byte_string_attributes_are_decoded_or_refused(tmp_path):
    path = write_demos(tmp_path / "d.h5", _demos().episodes, {})
    with h5py.File(path, "r+") as f:
        f["episodes"][sorted(f["episodes"])[0]].attrs["instruction"] = np.bytes_("put the bowl on the plate")
    assert read_demos(path).episodes[0].instruction == "put the bowl on the plate"  # not "b'put ...'"
    with h5py.File(path, "r+") as f:
        f["episodes"][sorted(f["episodes"])[0]].attrs["instruction"] = np.bytes_(b"\xff\xfe bowl")
    with pytest.raises(ValueError, match=r"d\.h5: episode \w+ instruction: bytes that are not UTF-8"):
        read_demos(path)


@requires_pyarrow
def test_a_16_bit_png_in_a_lerobot_dataset_is_refused_not_wrapped():
    import imageio.v3 as iio

    from trainers.datasets.lerobot_read import _to_numpy

    spec = {"dtype": "image", "shape": [4, 4, 3], "names": ["height", "width", "channel"]}
    deep = iio.imwrite("<bytes>", np.full((4, 4), 300, np.uint16), extension=".png")
    plain = iio.imwrite("<bytes>", np.full((4, 4, 3), 44, np.uint8), extension=".png")
    column = pa.array([{"bytes": plain, "path": None}, {"bytes": deep, "path": None}])
    with pytest.raises(ValueError, match=r"x\.parquet: image 1 is uint16 \(a 16-bit image"):
        _to_numpy(column, spec, "x.parquet")
    assert _to_numpy(column[:1], spec, "x.parquet").tolist() == np.full((1, 4, 4, 3), 44).tolist()


@requires_pyarrow
def test_images_a_lerobot_dataset_declares_are_checked_against_memory_before_decoding(tmp_path):
    out = write_lerobot(_demos(), tmp_path / "ds", video=False, progress=False)
    info = json.loads((out / "meta/info.json").read_text())
    info["features"]["observation.images.image"]["shape"] = [60000, 60000, 3]  # 10.8 GB per frame
    (out / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"ds: 19 frames of 3 episodes with their images needs about .* GiB"):
        read_lerobot(out, progress=False)


def test_the_memory_budget_names_what_asked():
    from nets.budget import available_memory, check_memory

    assert available_memory() is None or available_memory() > 0
    check_memory(1, "one byte")
    with pytest.raises(
        ValueError, match=r"a petabyte needs about 1,048,576.0 GiB of memory; .* is available"
    ):
        check_memory(2**50, "a petabyte")


def test_subset_keeps_the_first_episodes_of_each_task(tmp_path):
    """``python -m trainers.datasets subset --per-task N``: the first N episodes of each task by initial
    frame, as our demos file, with the source's attributes; bad counts and existing outputs refused."""
    eps = [
        Episode(obs={"proprio": np.full((2, 3), frame, np.float32)}, actions=np.zeros((2, 1, 7), np.float32),
                valid=np.ones((2, 1), bool), rewards=np.zeros((2, 1), np.float32), instruction=task,
                task=task, initial_frame=frame, success=True)
        for frame, task in [(5, "b"), (0, "a"), (9, "b"), (1, "a"), (2, "a"), (7, "b")]
    ]  # fmt: skip
    src = write_demos(tmp_path / "all.h5", eps, {"env": "x", "seed": 3})
    out = datasets_cli(["subset", "--demos", str(src), "--per-task", "2", "--out", str(tmp_path / "two.h5")])
    kept = read_demos(out)
    pairs = sorted((e.task, e.initial_frame) for e in kept.episodes)
    assert pairs == [("a", 0), ("a", 1), ("b", 5), ("b", 7)]
    assert kept.meta["seed"] == 3 and kept.meta["episodes_run"] == 4
    assert "first 2 episodes" in kept.meta["about"]
    np.testing.assert_array_equal(kept.episodes[0].obs["proprio"], eps[1].obs["proprio"])
    with pytest.raises(ValueError, match="--per-task must be >= 1"):
        datasets_cli(["subset", "--demos", str(src), "--per-task", "0", "--out", str(tmp_path / "z.h5")])
    with pytest.raises(ValueError, match="exists"):
        datasets_cli(["subset", "--demos", str(src), "--per-task", "1", "--out", str(out)])
