"""LIBERO through our vector env: the real simulator, software-rendered on the CPU."""

from __future__ import annotations

import os
import signal
import warnings

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

import envs
from envs.core import InitialFrame

pytestmark = requires_libero

SIZE = 64
K = 4


def make(**kwargs):
    kw = dict(num_envs=2, chunk_size=K, image_size=SIZE, autoreset_mode="Disabled")
    kw.update(kwargs)
    return gym.make_vec("Libero-Spatial-v0", **kw)


@pytest.fixture(scope="module")
def vec():
    env = make(object_state_in_info=True)
    yield env
    env.close()


def zeros(env):
    return np.zeros(env.action_space.shape, np.float32)


def wiggle(env, seed=0):
    return (np.random.default_rng(seed).uniform(-1, 1, env.action_space.shape) * 0.5).astype(np.float32)


def test_spaces_and_observations(vec):
    obs, info = vec.reset(seed=0, options={"initial_frames": [0, 60]})
    assert vec.single_action_space.shape == (K, 7)
    assert obs["image"].shape == (2, SIZE, SIZE, 3) and obs["image"].dtype == np.uint8
    assert obs["wrist_image"].shape == (2, SIZE, SIZE, 3)
    assert obs["proprio"].shape == (2, 8) and obs["proprio"].dtype == np.float32
    assert obs["instruction"][0].startswith("pick up the black bowl")
    assert obs["instruction"][1] == vec.initial_frames[60].instruction
    assert info["initial_frame_id"].tolist() == [0, 60]
    assert obs in vec.observation_space
    assert len(vec.initial_frames) == 500 and vec.initial_frames[60].meta == {
        "suite": "libero_spatial",
        "task_index": 1,
        "init_state_index": 10,
    }


def test_same_frame_gives_identical_images_and_different_frames_differ(vec):
    obs, _ = vec.reset(options={"initial_frames": [3, 3]})
    assert np.array_equal(obs["image"][0], obs["image"][1])
    assert np.array_equal(obs["proprio"][0], obs["proprio"][1])
    again, _ = vec.reset(options={"initial_frames": [5, 3]})  # env 1 reset twice to the same frame
    assert np.array_equal(again["image"][1], obs["image"][1])
    assert not np.array_equal(again["image"][0], obs["image"][0])  # another init state, another scene
    obs, _, _, _, _ = vec.step(wiggle(vec))
    obs2, _ = vec.reset(options={"initial_frames": [5, 3]})
    obs2, _, _, _, _ = vec.step(wiggle(vec))
    assert np.array_equal(obs["image"], obs2["image"]) and np.array_equal(obs["proprio"], obs2["proprio"])


@pytest.mark.slow
def test_fast_reset_matches_a_full_rebuild_pixel_for_pixel(vec):
    full = make(fast_reset=False)
    try:
        frames = [7, 120]
        for _ in range(2):  # the first reset after construction and a later one
            a, _ = vec.reset(options={"initial_frames": frames})
            b, _ = full.reset(options={"initial_frames": frames})
            for key in ("image", "wrist_image", "proprio"):
                assert np.array_equal(a[key], b[key]), key
            a, *_ = vec.step(wiggle(vec, 1))
            b, *_ = full.step(wiggle(full, 1))
            for key in ("image", "wrist_image", "proprio"):
                assert np.array_equal(a[key], b[key]), key
            frames = [8, 7]
    finally:
        full.close()


@pytest.mark.slow
def test_success_mid_chunk_terminates_and_skips_the_rest_of_the_chunk(vec):
    vec.reset(options={"initial_frames": [0, 0]})
    _, _, _, _, info = vec.step(zeros(vec))
    objects = info["object_state"][0]
    start = vec.initial_frames[0]
    # Put the black bowl of task 0 ("... place it on the plate") just above the plate.
    state = start.sim_state.copy()
    bowl_xy, plate_xy = objects["akita_black_bowl_1_pos"][:2], objects["plate_1_pos"][:2]
    at = 1 + int(np.argmin([np.linalg.norm(state[i : i + 2] - bowl_xy) for i in range(1, 40)]))
    assert np.linalg.norm(state[at : at + 2] - bowl_xy) < 1e-2  # the bowl's free joint: x, y, z, quat
    state[at : at + 3] = [*plate_xy, state[at + 2] + 0.03]
    done_frame = InitialFrame(start.instruction, task=start.task, sim_state=state)
    vec.reset(options={"initial_frames": [done_frame, 0]})
    _, reward, term, trunc, info = vec.step(zeros(vec))
    assert term.tolist() == [True, False] and not trunc.any() and reward.tolist() == [1.0, 0.0]
    assert info["chunk_valid"].tolist() == [[True, False, False, False], [True] * K]
    assert info["chunk_rewards"][0].tolist() == [1.0, 0, 0, 0]
    assert info["_episode"].tolist() == [True, False]
    assert info["episode"]["success"][0] and info["episode"]["length"][0] == 1
    _, reward, term, trunc, info = vec.step(zeros(vec))  # Disabled: env 0 is frozen now
    assert not info["chunk_valid"][0].any() and reward[0] == 0 and info["chunk_valid"][1].all()


@pytest.mark.slow
def test_chunk_step_reports_sub_steps_and_time_limit():
    env = make(max_episode_steps=6)
    try:
        env.reset(options={"initial_frames": [0, 1]})
        _, reward, term, trunc, info = env.step(zeros(env))
        assert info["chunk_valid"].all() and not (term | trunc).any() and (reward == 0).all()
        _, _, term, trunc, info = env.step(zeros(env))
        assert info["chunk_valid"].tolist() == [[True, True, False, False]] * 2  # 4 + 2 = limit of 6
        assert trunc.all() and not term.any()
        assert info["episode"]["length"].tolist() == [6, 6]
    finally:
        env.close()


@pytest.mark.slow
def test_autoreset_modes():
    for mode in ("NextStep", "SameStep"):
        env = make(num_envs=1, max_episode_steps=K, autoreset_mode=mode)
        try:
            first, _ = env.reset(seed=0)
            _, _, _, trunc, info = env.step(zeros(env))
            assert trunc[0]
            if mode == "SameStep":
                assert info["_final_obs"][0] and info["final_info"]["episode"]["length"][0] == K
                assert info["_initial_frame_id"][0]
            else:
                obs, reward, term, trunc, info = env.step(zeros(env))
                assert info["_initial_frame_id"][0] and reward[0] == 0 and not (term[0] or trunc[0])
                assert not info["chunk_valid"].any()
        finally:
            env.close()


def test_partial_reset_with_mask(vec):
    obs, _ = vec.reset(options={"initial_frames": [0, 50]})
    moved, *_ = vec.step(wiggle(vec, 2))
    obs2, info = vec.reset(options={"reset_mask": np.array([True, False]), "initial_frames": [0]})
    assert np.array_equal(obs2["image"][0], obs["image"][0])  # env 0 back at its start
    assert np.array_equal(obs2["image"][1], moved["image"][1])  # env 1 untouched
    assert info["_initial_frame_id"].tolist() == [True, False]


@pytest.mark.slow
def test_reset_from_saved_and_reloaded_frames(vec, tmp_path):
    obs, _ = vec.reset(options={"initial_frames": [11, 222]})
    envs.save_initial_frames(vec.current_frames(), tmp_path)
    loaded = envs.load_initial_frames(tmp_path)
    assert [f.task for f in loaded] == [vec.initial_frames[i].task for i in (11, 222)]
    vec.reset(options={"initial_frames": [0, 0]})
    again, info = vec.reset(options={"initial_frames": loaded})
    assert info["initial_frame_id"].tolist() == [-1, -1]
    for key in ("image", "wrist_image", "proprio"):
        assert np.array_equal(again[key], obs[key])
    assert np.array_equal(loaded[0].image, obs["image"][0])


def _with_state(vec, index, value):
    """Frame 1 with one entry of its sim_state set to ``value``."""
    frame = vec.initial_frames[1]
    state = frame.sim_state.copy()
    state[index] = value
    return InitialFrame(frame.instruction, task=frame.task, sim_state=state)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda v: v.step(np.zeros((2, K + 1, 7), np.float32)), r"bad actions: expected shape \(2, 4, 7\)"),
        (lambda v: v.step(np.full((2, K, 7), np.inf, np.float32)), "bad actions: expected finite values"),
        (lambda v: v.reset(options={"initial_frames": [0, 500]}), r"expected an int in \[0, 500\)"),
        (lambda v: v.reset(options={"ids": [0, 1]}), "bad reset option"),
        (
            lambda v: v.reset(options={"initial_frames": [0, _with_state(v, 5, np.nan)]}),
            r"finite .* \(got nan\)",
        ),
        (
            lambda v: v.reset(options={"initial_frames": [0, _with_state(v, 5, 1e308)]}),
            r"within \+-1000 \(got 1e\+308\)",
        ),
        (
            lambda v: v.reset(options={"initial_frames": [InitialFrame("x", task="libero_spatial/nope"), 0]}),
            "LIBERO task key",
        ),
        (
            lambda v: v.reset(
                options={
                    "initial_frames": [
                        0,
                        InitialFrame("x", task=v.initial_frames[0].task, sim_state=np.zeros(5)),
                    ]
                }
            ),
            r"sim_state of shape \(\d+,\)",
        ),
    ],
)
def test_bad_input_raises_and_leaves_the_env_unchanged(vec, call, match):
    obs, _ = vec.reset(options={"initial_frames": [2, 52]})
    with pytest.raises(ValueError, match=f"Libero-Spatial-v0: .*{match}"):
        call(vec)
    after = vec.unwrapped._observations() if hasattr(vec, "unwrapped") else vec._observations()
    assert all(np.array_equal(after[k], obs[k]) for k in ("image", "proprio"))
    moved, *_ = vec.step(wiggle(vec, 3))  # still steps from where it was
    vec.reset(options={"initial_frames": [2, 52]})
    ref, *_ = vec.step(wiggle(vec, 3))
    assert np.array_equal(moved["image"], ref["image"])


@pytest.mark.slow
def test_crashed_worker_is_restarted_and_its_env_reset():
    env = make()
    try:
        first, _ = env.reset(options={"initial_frames": [0, 50]})
        os.kill(env.pool.pids()[1], signal.SIGKILL)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, _, term, trunc, info = env.step(zeros(env))
        assert any("died" in str(w.message) for w in caught)
        assert trunc.tolist() == [False, True] and info["worker_restarted"][1]
        obs, _ = env.reset(options={"reset_mask": np.array([False, True]), "initial_frames": [50]})
        _, _, _, trunc, info = env.step(zeros(env))
        assert not trunc.any() and info["chunk_valid"].all()
        os.kill(env.pool.pids()[0], signal.SIGKILL)  # a death found during reset: retried there
        with pytest.warns(RuntimeWarning, match="died"):
            obs, _ = env.reset(options={"initial_frames": [0, 50]})
        assert np.array_equal(obs["image"][0], first["image"][0])
    finally:
        env.close()


def test_state_only_env_never_renders():
    env = make(cameras=(), num_envs=1)
    try:
        obs, _ = env.reset(seed=0)
        assert set(obs) == {"proprio", "instruction"}
        obs, *_ = env.step(zeros(env))
        assert obs["proprio"].shape == (1, 8)
    finally:
        env.close()


def test_one_env_view_resets_from_a_frame_id():
    # gymnasium's and SB3's env checkers on every LIBERO id: tests/test_env_checkers.py
    env = gym.make("Libero-Spatial-v0", image_size=SIZE, chunk_size=K)
    try:
        obs, info = env.reset(options={"initial_frame": 0})
        assert obs["image"].shape == (SIZE, SIZE, 3) and info["initial_frame_id"] == 0
    finally:
        env.close()


def test_libero_130_frames_cover_every_suite_without_a_simulator():
    from envs.libero.env import LiberoInitialFrames, task_key
    from envs.libero.suites import suite_tasks

    tasks = suite_tasks("130")
    frames = LiberoInitialFrames(tasks)
    assert len(tasks) == 130 and len(frames) == 6500
    assert len({task_key(t) for t in tasks}) == 130
    assert {t.max_episode_steps for t in tasks} == {220, 280, 300, 520, 400}
    assert frames[6499].meta == {"suite": "libero_90", "task_index": 89, "init_state_index": 49}
    with pytest.raises(ValueError, match="valid suites"):
        suite_tasks("100")


def test_held_out_init_states_without_a_simulator():
    import gymnasium as gym

    from envs.libero.env import LiberoInitialFrames
    from envs.libero.suites import suite_tasks

    tasks = suite_tasks("spatial")
    held_out = LiberoInitialFrames(tasks, range(40, 50))
    assert len(held_out) == 100
    assert held_out.locate(0) == (0, 40) and held_out.locate(99) == (9, 49)
    assert held_out[13].meta == {"suite": "libero_spatial", "task_index": 1, "init_state_index": 43}
    assert np.array_equal(held_out[13].sim_state, LiberoInitialFrames(tasks)[93].sim_state)
    for bad in ([], [-1], [3, 3], [1.5], [True], [2**31]):  # 50 and on: fresh states (test_libero_fresh.py)
        with pytest.raises(ValueError, match="init_states"):
            LiberoInitialFrames(tasks, bad)
    with pytest.raises(ValueError, match="Libero-Spatial-v0: init_states"):  # before any worker starts
        gym.make_vec("Libero-Spatial-v0", num_envs=1, init_states=[-1])


def test_init_state_is_applied_after_the_scene_reset():
    """With no settle steps the simulator holds exactly the init state: nothing ran after it."""
    from envs.libero.sim import LiberoSim
    from envs.libero.suites import load_init_states, suite_tasks

    task = suite_tasks("spatial")[0]
    sim = LiberoSim(cameras=(), settle_steps=0)
    try:
        for index in (0, 1):
            state = load_init_states(task)[index]
            sim.reset(task, state, scene_seed=0)
            assert np.array_equal(sim.sim_state()[1:], state[1:])
    finally:
        sim.close()


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch payload_ran",))


def test_init_state_files_load_arrays_and_never_run_code(tmp_path, monkeypatch):
    import torch

    from envs.libero.suites import _load_init_states_file
    from nets.safe_load import UnsafeFileError

    monkeypatch.chdir(tmp_path)
    good = tmp_path / "good.pruned_init"
    torch.save(np.arange(6.0).reshape(2, 3), good)  # LIBERO's format: a pickled numpy array
    np.testing.assert_array_equal(_load_init_states_file(str(good)), np.arange(6.0).reshape(2, 3))
    bad = tmp_path / "bad.pruned_init"
    torch.save(_Payload(), bad)
    with pytest.raises(UnsafeFileError, match="asks for the global 'posix.system'"):
        _load_init_states_file(str(bad))
    assert not (tmp_path / "payload_ran").exists()


@pytest.mark.slow
def test_a_closed_env_refuses_every_call_with_one_clear_error():
    from envs import ClosedEnvError

    env = make(cameras=[], num_envs=1)
    env.reset(seed=0)
    env.close()
    env.close()  # twice is fine
    calls = {
        "step": lambda: env.step(zeros(env)),
        "reset": lambda: env.reset(seed=0),
        "current_frames": env.current_frames,
        "render": env.render,
    }
    for name, call in calls.items():
        with pytest.raises(ClosedEnvError, match=f"Libero-Spatial-v0: {name}\\(\\) on a closed env"):
            call()
    view = gym.make("Libero-Spatial-v0", cameras=[])
    view.reset(seed=0)
    view.close()
    with pytest.raises(ClosedEnvError, match="on a closed env"):
        view.step(view.action_space.sample())


def test_suite_tasks_match_liberos_benchmark_and_leave_stdout_alone():
    import sys
    import threading

    from libero.libero import benchmark

    from envs.libero import suites

    stdout = sys.stdout
    suites._benchmark_tasks.cache_clear()
    names = ["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"]
    threads = [threading.Thread(target=suites._benchmark_tasks, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sys.stdout is stdout  # no thread swapped the process's stdout
    for name in names:
        theirs = benchmark.get_benchmark_dict()[name]()  # LIBERO's own API (prints its task order)
        ours = suites._benchmark_tasks(name)
        assert [t.name for t in ours] == theirs.get_task_names()
        assert [t.instruction for t in ours] == [t.language for t in theirs.tasks]


@pytest.mark.parametrize(
    "kwargs, name, expected",
    [
        ({"max_episode_steps": 0}, "max_episode_steps", "an int >= 1 or None"),
        ({"max_episode_steps": -5}, "max_episode_steps", "an int >= 1 or None"),
        ({"settle_steps": -1}, "settle_steps", "an int >= 0"),
        ({"scene_seed": "x"}, "scene_seed", "an int >= 0 or None"),
        ({"max_cached_scenes": 0}, "max_cached_scenes", "an int >= 1"),
        ({"chunk_size": 2.5}, "chunk_size", "an int >= 1 or None"),
        ({"chunk_size": "4"}, "chunk_size", "an int >= 1 or None"),
        ({"image_size": (0, 0)}, "image_size", "a positive int or"),
        ({"image_size": -8}, "image_size", "a positive int or"),
        ({"autoreset_mode": "sometimes"}, "autoreset_mode", "one of"),
        ({"task_ids": [0.5]}, None, r"task_ids must be in \[0, 10\)"),
        ({"task_ids": [True]}, None, r"task_ids must be in \[0, 10\), got \[True\]"),
        ({"num_envs": True}, "num_envs", "an int >= 1, received True"),
    ],
)
def test_bad_constructor_arguments_are_named_before_any_worker_starts(kwargs, name, expected):
    match = f"Libero-Spatial-v0: bad {name}: expected {expected}" if name else expected
    with pytest.raises(ValueError, match=match):
        gym.make_vec("Libero-Spatial-v0", **{"num_envs": 1, "cameras": [], **kwargs})


def test_more_envs_than_memory_holds_are_refused_before_any_worker_starts():
    with pytest.raises(
        ValueError, match=r"Libero-Spatial-v0: num_envs=5000 \(at least 300 MB each\) needs about"
    ):
        gym.make_vec("Libero-Spatial-v0", num_envs=5000, cameras=[])


@pytest.mark.parametrize("make", [gym.make, gym.make_vec])
def test_an_unknown_keyword_is_named_with_the_accepted_ones(make):
    """Not Python's TypeError from inside the constructor: a ValueError naming the keyword, every
    accepted one and the closest, before any worker starts; the same on the Ray path's driver."""
    match = r"Libero-Spatial-v0: bad argument 'camera': expected one of .*, cameras, .*received camera="
    match += r"\[\] \(did you mean 'cameras'\?\)"
    with pytest.raises(ValueError, match=match):
        make("Libero-Spatial-v0", camera=[])
    with pytest.raises(ValueError, match="bad argument 'bogus'"):
        gym.make_vec("Libero-Spatial-v0", num_envs=2, ray_actors=1, cameras=[], bogus=1)


def test_a_frame_of_another_suite_is_refused_and_changes_nothing(vec):
    """A LIBERO-Object frame given to LIBERO-Spatial: a ValueError naming both suites, raised before
    any env is reset (issue 32 item 8); a frame of the env's own suite still starts."""
    from benchmarks.robustness import libero_object_frame

    obs, _ = vec.reset(options={"initial_frames": [2, 52]})
    with pytest.raises(
        ValueError,
        match=r"Libero-Spatial-v0: bad initial frame: expected a frame of a libero_spatial task \(this "
        r"env's suite\), got a libero_object frame, received 'libero_object/",
    ):
        vec.reset(options={"initial_frames": [0, libero_object_frame()]})
    assert np.array_equal(vec.unwrapped._observations()["proprio"], obs["proprio"])
    vec.reset(options={"initial_frames": [0, vec.unwrapped.initial_frames[60]]})


def test_bad_reset_arguments_are_named(vec):
    with pytest.raises(ValueError, match="bad reset options: expected a dict or None, received 'abc'"):
        vec.reset(options="abc")
    with pytest.raises(
        ValueError, match="bad initial_frames: expected an int id, an InitialFrame or a sequence"
    ):
        vec.reset(options={"initial_frames": 3.5})


@pytest.mark.slow
def test_a_failed_batched_reset_leaves_every_env_reported_truthfully(monkeypatch):
    env = make(cameras=[])
    pool = env.pool
    start = pool._start

    def start_and_kill(worker):  # worker 1 dies again as soon as it is restarted
        start(worker)
        if worker == 1:
            pool._procs[worker].kill()
            pool._procs[worker].join()

    try:
        env.reset(options={"initial_frames": [0, 50]})
        os.kill(pool.pids()[1], signal.SIGKILL)
        monkeypatch.setattr(pool, "_start", start_and_kill)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(RuntimeError, match=r"workers of envs \[1\] died twice in reset"):
                env.reset(options={"initial_frames": [1, 51]})  # env 0's simulator did reset
        monkeypatch.undo()
        # neither env is where the bookkeeping says: both episodes end, reported as lost
        _, _, term, trunc, info = env.step(zeros(env))
        assert trunc.tolist() == [True, True] and not term.any() and info["worker_restarted"].all()
        with pytest.warns(RuntimeWarning, match="died"):  # worker 1 is found dead and restarted
            env.reset(options={"initial_frames": [1, 51]})
        _, _, _, trunc, info = env.step(zeros(env))
        assert not trunc.any() and info["chunk_valid"].all()
    finally:
        env.close()


@pytest.mark.slow
def test_a_stopped_worker_is_detected_within_the_step_timeout():
    import time

    env = make(cameras=[], step_timeout_s=3.0)
    try:
        env.reset(options={"initial_frames": [0, 50]})
        os.kill(env.pool.pids()[1], signal.SIGSTOP)  # alive, never answers
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match=r"no answer to run_chunk\(\) in 3 s \(hung or stopped\)"):
            _, _, _, trunc, info = env.step(zeros(env))
        assert time.monotonic() - start < 20
        assert trunc.tolist() == [False, True] and info["worker_restarted"][1]
        env.reset(options={"reset_mask": np.array([False, True]), "initial_frames": [50]})
        _, _, _, trunc, info = env.step(zeros(env))
        assert not trunc.any() and info["chunk_valid"].all()
    finally:
        env.close()


SCRIPT = """import gymnasium as gym
import envs
env = gym.make_vec("Libero-Spatial-v0", num_envs=2, cameras=[])
obs, _ = env.reset(seed=0)
print("proprio", obs["proprio"].shape)
env.close()
"""


@pytest.mark.slow
def test_workers_start_from_stdin_from_c_and_from_a_script_without_a_main_guard(tmp_path):
    """Workers never re-import ``__main__``: ``python -`` (stdin), ``python -c`` (like a notebook,
    whose main module has no file) and a script without ``if __name__ == "__main__":`` all work."""
    import subprocess
    import sys

    (tmp_path / "unguarded.py").write_text(SCRIPT)
    runs = {
        "stdin": ([sys.executable, "-"], SCRIPT),
        "-c": ([sys.executable, "-c", SCRIPT], None),
        "unguarded script": ([sys.executable, "unguarded.py"], None),
    }
    for name, (cmd, stdin) in runs.items():
        done = subprocess.run(cmd, input=stdin, text=True, capture_output=True, timeout=600, cwd=tmp_path)
        assert "proprio (2, 8)" in done.stdout, f"{name}: {done.stderr[-3000:]}"
        assert "died" not in done.stderr, f"{name}: {done.stderr[-3000:]}"
