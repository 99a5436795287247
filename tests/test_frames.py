"""Initial-frame sets on disk, in the RLinf world-model bundle layout (dataset/*.npy)."""

from __future__ import annotations

import numpy as np
import pytest

from envs.core import InitialFrame, load_initial_frames, save_initial_frames


def _frame(i: int) -> InitialFrame:
    rng = np.random.default_rng(i)
    return InitialFrame(
        instruction=f"put bowl {i} on the plate",
        task=f"libero_spatial/task_{i}",
        image=rng.integers(0, 256, (16, 16, 3), dtype=np.uint8),
        wrist_image=rng.integers(0, 256, (16, 16, 3), dtype=np.uint8),
        sim_state=rng.normal(size=9),
        meta={"init_state_index": i},
    )


def test_round_trip_keeps_order_and_content(tmp_path):
    frames = [_frame(i) for i in range(12)]  # 12 > 10: lexicographic order must still hold
    folder = save_initial_frames(frames, tmp_path)
    assert folder == tmp_path / "dataset" and len(list(folder.glob("*.npy"))) == 12
    loaded = load_initial_frames(tmp_path)
    for a, b in zip(frames, loaded, strict=True):
        assert (a.instruction, a.task, a.meta) == (b.instruction, b.task, b.meta)
        assert np.array_equal(a.image, b.image) and np.array_equal(a.wrist_image, b.wrist_image)
        assert np.array_equal(a.sim_state, b.sim_state)


def test_files_are_what_rlinf_reads(tmp_path):
    save_initial_frames([_frame(0)], tmp_path)
    record = np.load(next((tmp_path / "dataset").glob("*.npy")), allow_pickle=True)
    item = record[0]
    assert item["image"].dtype == np.uint8 and item["image"].shape == (16, 16, 3)
    assert isinstance(item["instruction"], str) and item["delta_action"].shape == (7,)


def test_loads_rlinf_trajectories_with_task_bytes_and_no_image_key(tmp_path):
    img = np.full((8, 8, 3), 7, np.uint8)
    traj = [
        {"rgb": img, "task": b"open the drawer", "delta_action": np.zeros(7)},
        {"rgb": img * 2, "task": b"x"},
    ]
    np.save(tmp_path / "traj0.npy", np.array(traj, dtype=object), allow_pickle=True)
    (frame,) = load_initial_frames(tmp_path)
    assert frame.instruction == "open the drawer" and np.array_equal(frame.image, img)


def test_saving_again_replaces_the_set_whole(tmp_path):
    save_initial_frames([_frame(i) for i in range(3)], tmp_path)
    save_initial_frames([_frame(9)], tmp_path)
    assert [f.meta["init_state_index"] for f in load_initial_frames(tmp_path)] == [9]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]


def test_bad_frames_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        InitialFrame(instruction="x", image=np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="instruction"):
        InitialFrame(instruction="")
    with pytest.raises(FileNotFoundError, match="no \\*.npy"):
        load_initial_frames(tmp_path)
    with pytest.raises(ValueError, match="no image"):
        save_initial_frames([InitialFrame(instruction="x")], tmp_path)


def test_loaded_images_are_uint8_or_refused_never_wrapped(tmp_path):
    """RLinf-style trajectories with float or out-of-range images: a ValueError naming the file and
    the values (a uint8 cast would wrap 300.7 to 44); integers in [0, 255] are cast."""
    ok = tmp_path / "ok"
    ok.mkdir()
    img = np.full((4, 4, 3), 200, np.int64)
    np.save(ok / "t.npy", np.array([{"image": img, "instruction": "x"}], dtype=object), allow_pickle=True)
    (frame,) = load_initial_frames(ok, trust_pickle=True)
    assert frame.image.dtype == np.uint8 and (frame.image == 200).all()
    for name, bad in (("float", np.full((4, 4, 3), 300.7)), ("range", np.full((4, 4, 3), 256, np.int64))):
        folder = tmp_path / name
        folder.mkdir()
        record = np.array([{"image": bad, "instruction": "x"}], dtype=object)
        np.save(folder / "t.npy", record, allow_pickle=True)
        with pytest.raises(ValueError, match=r"t.npy: image: the image must be uint8 .* values in \["):
            load_initial_frames(folder, trust_pickle=True)


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"instruction": ""}, "instruction must be a non-empty str"),
        ({"task": None}, "task must be a str"),
        ({"image": np.zeros((4, 4), np.uint8)}, "image must be uint8"),
        ({"wrist_image": [[0]]}, "wrist_image must be a uint8 .* numpy array or None, got list"),
        (
            {"sim_state": np.zeros(3, np.float32)},
            "sim_state must be a float64 numpy array or None, got dtype",
        ),
        ({"meta": {1: "a"}}, "meta must be a dict with str keys"),
        ({"extra": 1}, "with the fields"),
    ],
)
def test_frame_problem_checks_an_unpickled_frame_field_by_field(fields, why):
    """Unpickling sets fields without ``__post_init__``: ``frame_problem`` (used by env
    ``load_state``) finds what the constructor would have refused, changing nothing."""
    import re

    from envs.core.frames import frame_problem

    assert frame_problem(_frame(0)) is None and frame_problem(InitialFrame("pick")) is None
    assert frame_problem({"instruction": "pick"}) == "an InitialFrame, got dict"
    frame = _frame(1)
    frame.__dict__.update(fields)
    assert re.search(why, frame_problem(frame))


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.99])
def test_a_truncated_frame_file_is_named_not_a_raw_unpickling_error(tmp_path, keep):
    """Issue 32 item 8: a ``.npy`` cut short (a full disk, an interrupted copy) is a ValueError naming it."""
    folder = save_initial_frames([_frame(0), _frame(1)], tmp_path)
    path = folder / "frame_00001.npy"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match=rf"{path}: (expected a whole pickle of plain data|not a .npy file)"):
        load_initial_frames(tmp_path)


def test_a_truncated_plain_array_is_named(tmp_path):
    from nets.safe_load import load_npy

    path = tmp_path / "states.npy"
    np.save(path, np.zeros((10, 10)))
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(
        ValueError,
        match=r"states.npy: its header declares a \(10, 10\) float64 array \(800 bytes\) but .* 760",
    ):
        load_npy(path)
