"""BEHAVIOR-1K adapter against the FAKE OmniGibson of ``tests/fake_omnigibson.py`` (OmniGibson itself
needs Isaac Sim and an RTX GPU): ids and spaces without OmniGibson, the error without it, the
observation and 23-D action mapping, chunk semantics, instance resets, success and q-score, bad input."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
from fake_omnigibson import FakeOmniGibson

import envs  # noqa: F401  (registers the ids)
from envs.b1k.env import B1KVectorEnv, b1k_observation_space
from envs.b1k.layout import ACTION_HIGH, ACTION_LOW, ACTION_PARTS, flatten_obs, robot_state
from envs.b1k.omnigibson_backend import B1KUnavailableError, check_requirements
from envs.b1k.qscore import q_score
from envs.b1k.tasks import CHALLENGE_TASKS, task_env_id
from envs.core import InitialFrame
from envs.core.spaces import chunk_action_space

TASK = "turning_on_radio"
ID = "B1K-TurningOnRadio-v0"


def make(num_envs: int = 2, **kwargs) -> tuple[B1KVectorEnv, FakeOmniGibson]:
    backend = kwargs.pop("backend", None) or FakeOmniGibson()
    env = gym.make_vec(ID, num_envs=num_envs, backend=backend, image_size=16, chunk_size=4, **kwargs)
    return env, backend


def hold(num_envs: int, k: int = 4, base_x: float = 0.0) -> np.ndarray:
    actions = np.zeros((num_envs, k, 23), np.float32)
    actions[..., 0] = base_x
    return actions


def test_ids_and_spaces_need_no_omnigibson():
    assert "omnigibson" not in sys.modules  # importing envs imported nothing of it
    ids = [i for i in gym.registry if i.startswith("B1K-")]
    assert len(ids) == 51 and "B1K-v0" in ids and len(CHALLENGE_TASKS) == 50
    assert task_env_id("putting_away_Halloween_decorations") == "B1K-PuttingAwayHalloweenDecorations-v0"
    space = b1k_observation_space(224)
    assert set(space) == {"image", "wrist_image", "right_wrist_image", "proprio", "instruction"}
    assert space["image"].shape == (224, 224, 3) and space["proprio"].shape == (23,)
    actions = chunk_action_space(ACTION_LOW, ACTION_HIGH, 10)
    assert actions.shape == (10, 23)
    assert actions.high[0, :3].tolist() == pytest.approx([0.75, 0.75, 1.0])  # base velocity limits
    assert actions.low[0, 14] == -1 and actions.high[0, 22] == 1  # grippers
    env, _ = make()
    assert env.single_observation_space == b1k_observation_space(16)
    assert env.single_action_space == chunk_action_space(ACTION_LOW, ACTION_HIGH, 4)


def test_making_the_env_without_omnigibson_says_what_is_missing():
    problems = check_requirements()
    assert any("omnigibson" in p for p in problems) and any("Isaac Sim" in p for p in problems)
    with pytest.raises(B1KUnavailableError) as error:
        gym.make_vec(ID, num_envs=1)
    message = str(error.value)
    assert isinstance(error.value, ImportError)
    for needed in (
        "omnigibson package is not installed",
        "Isaac Sim",
        "RTX",
        "setup.sh",
        "OMNIGIBSON_DATA_PATH",
    ):
        assert needed in message
    with pytest.raises(ValueError, match="B1K-v0: task must be one of the 50 challenge tasks"):
        gym.make_vec("B1K-v0", num_envs=1, backend=FakeOmniGibson())


def test_q_score_from_predicate_truth_values():
    start = [[False, True, False], [False, False]]
    # grounding 0: 1 of 3 newly true (the one already true earns nothing); grounding 1: 1 of 2
    assert q_score(start, [[True, True, False], [True, False]], success=False) == 0.5
    assert q_score(start, [[True, True, True], [False, False]], success=False) == pytest.approx(2 / 3)
    assert q_score(start, [[False, False, False], [False, False]], success=False) == 0.0
    assert q_score(start, [[False, True, False], [False, False]], success=True) == 1.0
    assert q_score([[], [False]], [[], [True]], success=False) == 1.0
    with pytest.raises(ValueError, match="grounding 1 has 2 initial and 1 final"):
        q_score(start, [[True, True, False], [True]], success=False)
    with pytest.raises(ValueError, match="2 initial groundings but 1 final"):
        q_score(start, [[True, True, False]], success=False)


def test_observations_are_mapped_to_our_keys():
    env, backend = make(instances=[1, 7])
    obs, info = env.reset(options={"initial_frames": [1, 0]})
    assert backend.calls[:3] == [
        ("load", (TASK, 2, 16)),
        ("reset_to_instance", (0, 7)),
        ("reset_to_instance", (1, 1)),
    ]
    assert obs["image"].shape == (2, 16, 16, 3) and obs["image"].dtype == np.uint8  # alpha dropped
    assert obs["image"][:, 0, 0].tolist() == [[70, 0, 0], [10, 0, 0]]  # 10 * instance + step
    assert obs["wrist_image"][0, 0, 0, 1] == 1 and obs["right_wrist_image"][0, 0, 0, 1] == 2
    assert obs["instruction"] == ("turning on radio",) * 2
    assert info["initial_frame_id"].tolist() == [1, 0]
    frames = env.unwrapped.current_frames()
    assert [f.meta["instance_id"] for f in frames] == [7, 1] and frames[0].image[0, 0, 0] == 70


def test_action_layout_reaches_the_robot_and_comes_back_in_the_state():
    env, backend = make(num_envs=1)
    env.reset(seed=0)
    action = np.arange(23, dtype=np.float32) / 100
    action[14], action[22] = 1.0, -1.0  # left gripper open wide, right closed
    obs, *_ = env.step(np.repeat(action[None, None], 4, axis=1))
    steps = [c for c in backend.calls if c[0] == "step"]
    assert len(steps) == 4 and all(np.array_equal(c[1][1][0], action) for c in steps)
    assert [c[1][2] for c in steps] == [False, False, False, True]  # cameras read at the chunk's end only
    expected = np.concatenate(
        [
            action[ACTION_PARTS["base"]],
            action[ACTION_PARTS["torso"]],
            action[ACTION_PARTS["left_arm"]],
            action[ACTION_PARTS["right_arm"]],
            [0.025 * 2],
            [0.0],
        ]  # fmt: skip
    )
    np.testing.assert_allclose(obs["proprio"][0], expected, rtol=1e-6)
    np.testing.assert_allclose(
        robot_state(backend.observe(0)["robot_r1::proprio"].numpy()), expected, rtol=1e-6
    )


def test_success_inside_a_chunk_stops_that_env_and_scores_one():
    env, backend = make()
    env.reset(seed=0)
    actions = hold(2)
    actions[0, 2:, 0] = 0.7  # env 0: every predicate true at sub-step 2 (0-based) -> success
    obs, reward, terminated, truncated, info = env.step(actions)
    assert terminated.tolist() == [True, False] and truncated.tolist() == [False, False]
    assert info["chunk_valid"].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert reward[0] == pytest.approx(0.5)  # all five predicates turned true (0.1 each)
    assert ("observe", (0,)) in backend.calls  # read right when its episode ended
    assert (
        info["episode"]["success"][0]
        and info["episode"]["q_score"][0] == 1.0
        and info["_episode"].tolist() == [True, False]
    )
    assert info["episode"]["length"][0] == 3


def test_same_step_autoreset_reports_the_finished_episode():
    env, backend = make(num_envs=1, autoreset_mode="SameStep", instances=[2])
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(hold(1, base_x=0.7))
    assert terminated[0] and info["final_info"]["episode"]["q_score"][0] == 1.0
    assert info["final_obs"][0]["image"][0, 0, 0] == 21 and obs["image"][0, 0, 0, 0] == 20  # reset again
    assert [c for c in backend.calls if c[0] == "reset_to_instance"] == [("reset_to_instance", (0, 2))] * 2


def test_time_limit_truncates_with_partial_q_score():
    env, _ = make(num_envs=1, max_episode_steps=6, instances=[1])
    env.reset(seed=0)
    actions = hold(1, base_x=0.35)  # p0 (already true at start on instance 1), p1, p3 turn true
    env.step(actions)
    _, _, terminated, truncated, info = env.step(actions)
    assert not terminated[0] and truncated[0]
    assert info["chunk_valid"][0].tolist() == [True, True, False, False] and info["episode"]["length"][0] == 6
    # grounding [p0, p1, p2]: only p1 newly true -> 1/3; grounding [p3, p4]: p3 -> 1/2
    assert info["episode"]["q_score"][0] == 0.5 and not info["episode"]["success"][0]


def test_omnigibson_timeout_truncates():
    env, _ = make(num_envs=1, backend=FakeOmniGibson(timeout=2))
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step(hold(1))
    assert (
        truncated[0] and not terminated[0] and info["chunk_valid"][0].tolist() == [True, True, False, False]
    )


def test_instance_resets_partial_and_from_initial_frames():
    env, backend = make(autoreset_mode="Disabled")
    env.reset(options={"initial_frames": [0, 1]})
    env.step(hold(2))
    backend.calls.clear()
    frame = InitialFrame(instruction="turn on the radio", task=f"b1k/{TASK}", meta={"instance_id": 2})
    obs, info = env.reset(options={"initial_frames": [frame], "reset_mask": np.array([False, True])})
    assert backend.calls == [("reset_to_instance", (1, 2))]
    assert obs["image"][1, 0, 0, 0] == 20 and obs["image"][0, 0, 0, 0] == 4  # env 0 untouched (step 4)
    assert obs["instruction"][1] == "turn on the radio" and info["initial_frame_id"].tolist() == [0, -1]


def test_bad_input_is_named_and_changes_nothing():
    env, backend = make()
    obs, _ = env.reset(options={"initial_frames": [0, 1]})
    calls = len(backend.calls)
    other = InitialFrame(instruction="x", task="b1k/can_meat", meta={"instance_id": 0})
    with pytest.raises(
        ValueError, match=r"B1K-TurningOnRadio-v0: bad initial frame: expected a frame of this env's task"
    ):
        env.reset(options={"initial_frames": [other, 0]})
    missing = InitialFrame(instruction="x", task=f"b1k/{TASK}", meta={"instance_id": 5})
    with pytest.raises(
        ValueError, match=r"instance_id'\] among turning_on_radio's saved instances \(got 5\)"
    ):
        env.reset(options={"initial_frames": [missing, 0]})
    with pytest.raises(ValueError, match=r"bad initial frame id: expected an int in \[0, 4\)"):
        env.reset(options={"initial_frames": [9, 0]})
    with pytest.raises(ValueError, match=r"bad actions: expected shape \(2, 4, 23\)"):
        env.step(np.zeros((2, 4, 7), np.float32))
    nan = hold(2)
    nan[1, 3, 22] = np.nan
    with pytest.raises(ValueError, match="finite values"):
        env.step(nan)
    assert len(backend.calls) == calls  # nothing reached the simulator
    with pytest.raises(ValueError, match="instances must be a non-empty subset"):
        make(instances=[3])
    with pytest.raises(ValueError, match="cameras must start with 'image'"):
        make(cameras=("wrist_image",))


def test_simulator_answers_of_the_wrong_shape_are_reported():
    env, _ = make(backend=FakeOmniGibson(image_size=32))
    with pytest.raises(
        RuntimeError, match=r"zed_link:Camera:0::rgb is \(32, 32, 3\), expected \(16, 16, 3\)"
    ):
        env.reset(seed=0)
    with pytest.raises(ValueError, match="expected R1Pro proprio of size 256"):
        robot_state(np.zeros(23))


def test_flatten_obs_joins_keys_like_the_challenge():
    nested = {"robot_r1": {"robot_r1:zed_link:Camera:0": {"rgb": 1}, "proprio": 2}, "task": {"x": 3}}
    assert flatten_obs(nested) == {
        "robot_r1::robot_r1:zed_link:Camera:0::rgb": 1,
        "robot_r1::proprio": 2,
        "task::x": 3,
    }


def test_single_env_view():
    single = gym.make(ID, backend=FakeOmniGibson(), image_size=16, chunk_size=4)
    obs, _ = single.reset(seed=1)
    assert obs["image"].shape == (16, 16, 3) and obs["proprio"].shape == (23,)
    obs, reward, terminated, truncated, info = single.step(hold(1)[0])
    assert obs["image"][0, 0, 0] % 10 == 4 and reward == 0.0 and not (terminated or truncated)  # 4 steps
    single.close()


def test_smoke_script_runs_on_the_fake_and_skips_without_omnigibson(tmp_path, capsys):
    from benchmarks import b1k_smoke

    assert b1k_smoke.main(["--num-envs", "1", "--out", str(tmp_path)]) is None
    assert "b1k_smoke: skipped, BEHAVIOR-1K cannot run here" in capsys.readouterr().out
    backend = FakeOmniGibson()
    result = b1k_smoke.main(
        ["--num-envs", "2", "--chunks", "2", "--chunk-size", "3", "--out", str(tmp_path)], backend
    )
    assert (tmp_path / "head_0.png").is_file() and (tmp_path / "b1k_smoke.json").is_file()
    assert "B1K smoke: turning_on_radio" in capsys.readouterr().out
    assert len([c for c in backend.calls if c[0] == "step"]) == 6 and backend.calls[-1] == ("close", ())
    start = [0.0] * 21 + [0.025, 0.025]  # the fake's reset pose: joints at 0, grippers half open
    np.testing.assert_allclose(result["last_proprio"], [start, start], atol=1e-6)  # hold kept it
