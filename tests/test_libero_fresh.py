"""Fresh LIBERO init states (envs/libero/fresh.py): ids past a task's official 50, drawn by LIBERO's
own placement sampler with a seed fixed by (suite, task, id), on the real simulator."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

import envs  # noqa: F401  (registers the ids)
from envs.core.frames import load_initial_frames, save_initial_frames
from envs.libero.fresh import fresh_init_states, fresh_seed
from envs.libero.suites import load_init_states, suite_tasks

pytestmark = requires_libero


def test_fresh_states_are_reproducible_and_distinct_from_the_official_ones(tmp_path):
    task = suite_tasks("spatial")[0]
    states = fresh_init_states(task, [50, 51, 52])  # each call runs in a new spawned process
    again = fresh_init_states(task, [52, 50])
    np.testing.assert_array_equal(states[[2, 0]], again)  # the same bits, in any order, any process
    official = load_init_states(task)
    assert states.shape == (3, official.shape[1])
    assert min(np.abs(official - s).max() for s in states) > 1e-3  # none is an official state
    assert np.abs(states[0] - states[1]).max() > 1e-3 and fresh_seed(task, 50) != fresh_seed(task, 51)

    env = gym.make_vec(
        "Libero-Spatial-v0",
        num_envs=2,
        cameras=["agentview"],
        image_size=32,
        task_ids=[0],
        init_states=[0, 50],
        autoreset_mode="Disabled",
    )
    try:
        frames = env.unwrapped.initial_frames
        assert frames[1].meta["fresh"] and "fresh" not in frames[0].meta
        np.testing.assert_array_equal(frames[1].sim_state, states[0])
        env.reset(seed=0, options={"initial_frames": [0, 1]})
        started = env.unwrapped.current_frames()  # exported and imported like official ones
        folder = save_initial_frames(started, tmp_path / "starts")
        back = load_initial_frames(folder)
        np.testing.assert_array_equal(back[1].sim_state, states[0])
        assert back[1].meta["fresh"] and back[1].meta["init_state_index"] == 50
        env.step(np.zeros(env.action_space.shape, np.float32))
    finally:
        env.close()


@pytest.mark.parametrize("ids", [[-1], [50.5], [True], [2**31]])
def test_bad_fresh_ids_are_refused_before_any_simulator(ids):
    with pytest.raises(ValueError, match="init_states must be a non-empty list of ints"):
        gym.make_vec("Libero-Spatial-v0", num_envs=1, cameras=[], init_states=ids)
    with pytest.raises(ValueError, match="fresh init-state ids"):
        fresh_init_states(suite_tasks("spatial")[0], [3] if ids == [True] else ids)
