"""The chunked vector env contract (envs/core), on a tiny numpy backend."""

from __future__ import annotations

import numpy as np
import pytest
from counting_env import LIMIT, CountingVectorEnv, counting_frames
from gymnasium.utils.env_checker import check_env

from envs.core import InitialFrame
from envs.core.single import SingleEnvView


def forward(env, n=None, k=None):
    n = n or env.num_envs
    k = k or env.chunk_size
    return np.ones((n, k, 2), np.float32)


def test_termination_mid_chunk_stops_the_rest():
    env = CountingVectorEnv(num_envs=2, chunk_size=4, autoreset_mode="Disabled")
    env.reset(options={"initial_frames": [0, 4]})  # goals 3 and 20
    obs, reward, term, trunc, info = env.step(forward(env))
    assert term.tolist() == [True, False] and not trunc.any()
    assert info["chunk_valid"].tolist() == [[True, True, True, False], [True] * 4]
    assert env.steps_run.tolist() == [3, 4]  # the 4th sub-step of env 0 never ran
    assert reward.tolist() == [1.0, 0.0]
    assert obs["proprio"][0, 0] == 3 and obs["instruction"] == ("walk 3 cells", "walk 20 cells")
    ep = info["episode"]
    assert info["_episode"].tolist() == [True, False]
    assert ep["success"][0] and ep["success_once"][0] and ep["return"][0] == 1.0 and ep["length"][0] == 3


def test_truncation_at_step_limit_and_frozen_envs_in_disabled_mode():
    env = CountingVectorEnv(num_envs=2, chunk_size=4, autoreset_mode="Disabled")
    env.reset(options={"initial_frames": [4, 0]})
    lengths = []
    for _ in range(3):
        _, _, term, trunc, info = env.step(forward(env))
        lengths.append(info["chunk_valid"].sum(1).tolist())
    assert lengths == [[4, 3], [4, 0], [2, 0]]  # env 0 stops at the limit of 10, env 1 stays frozen
    assert trunc.tolist() == [True, False] and not term.any()
    assert info["episode"]["length"][0] == LIMIT and not info["episode"]["success"][0]
    before = env.steps_run.copy()
    _, reward, term, trunc, info = env.step(forward(env))  # both frozen now
    assert (env.steps_run == before).all() and not reward.any() and not (term | trunc).any()
    # partial reset of env 1 only: env 0 keeps its (ended) state
    obs, info = env.reset(options={"reset_mask": np.array([False, True]), "initial_frames": [1]})
    assert info["_initial_frame_id"].tolist() == [False, True] and info["initial_frame_id"][1] == 1
    assert obs["proprio"][:, 0].tolist() == [10, 0]
    env.step(forward(env))
    assert env.steps_run.tolist() == [before[0], before[1] + 4]


def test_next_step_autoreset():
    env = CountingVectorEnv(num_envs=1, chunk_size=4, autoreset_mode="NextStep")
    env.reset(seed=0, options={"initial_frames": [0]})
    _, _, term, _, info = env.step(forward(env))
    assert term[0] and info["_episode"][0]
    obs, reward, term, trunc, info = env.step(forward(env))  # the reset step: action ignored
    assert reward[0] == 0 and not term[0] and not trunc[0]
    assert info["_initial_frame_id"][0] and not info["chunk_valid"].any()
    assert obs["proprio"][0, 0] == 0 and env.steps_run[0] == 3


def test_same_step_autoreset_final_obs_and_info():
    env = CountingVectorEnv(num_envs=2, chunk_size=4, autoreset_mode="SameStep")
    env.reset(seed=1, options={"initial_frames": [0, 4]})
    obs, reward, term, trunc, info = env.step(forward(env))
    assert term.tolist() == [True, False]
    assert info["_final_obs"].tolist() == [True, False]
    assert info["final_obs"][0]["proprio"][0] == 3 and info["final_obs"][0]["instruction"] == "walk 3 cells"
    assert info["final_info"]["episode"]["success"][0]
    assert info["final_info"]["_episode"].tolist() == [True, False]
    assert obs["proprio"][0, 0] == 0  # already reset to a new frame
    assert info["_initial_frame_id"].tolist() == [True, False]


def test_seeded_resets_draw_the_same_frames():
    env = CountingVectorEnv(num_envs=4)
    a = env.reset(seed=7)[1]["initial_frame_id"]
    env.reset(seed=8)
    b = env.reset(seed=7)[1]["initial_frame_id"]
    assert a.tolist() == b.tolist()


def test_reset_from_initial_frame_objects():
    env = CountingVectorEnv(num_envs=2, autoreset_mode="Disabled")
    frame = InitialFrame(instruction="walk 2 cells", meta={"goal": 2})
    obs, info = env.reset(options={"initial_frames": [frame, 1]})
    assert obs["instruction"] == ("walk 2 cells", "walk 4 cells")
    assert info["initial_frame_id"].tolist() == [-1, 1]
    assert [f.instruction for f in env.current_frames()] == ["walk 2 cells", "walk 4 cells"]


def test_plain_action_space_without_chunks():
    env = CountingVectorEnv(num_envs=2, chunk_size=None)
    assert env.single_action_space.shape == (2,)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.ones((2, 2), np.float32))
    assert info["chunk_valid"].shape == (2, 1)


@pytest.mark.parametrize(
    "actions, match",
    [
        (np.ones((2, 3, 2), np.float32), "expected shape"),
        (np.ones((2, 4, 2), np.int64), "expected a float"),
        (np.full((2, 4, 2), np.nan, np.float32), "expected finite"),
    ],
)
def test_bad_actions_raise_and_change_nothing(actions, match):
    env = CountingVectorEnv(num_envs=2)
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match=f"Counting-v0: bad actions: {match}"):
        env.step(actions)
    assert env.steps_run.sum() == 0
    assert all((v == env._observations()[k]).all() for k, v in obs.items() if k != "instruction")


@pytest.mark.parametrize(
    "options, match",
    [
        ({"init": [0, 0]}, "reset option"),
        ({"initial_frames": [0, 99]}, r"initial frame id: expected an int in \[0, 5\)"),
        ({"initial_frames": [0]}, "2 entries"),
        ({"initial_frames": [0, InitialFrame(instruction="no goal")]}, "meta\\['goal'\\]"),
        ({"reset_mask": np.array([1, 0])}, "reset_mask"),
    ],
)
def test_bad_reset_options_raise_and_change_nothing(options, match):
    env = CountingVectorEnv(num_envs=2, autoreset_mode="Disabled")
    env.reset(options={"initial_frames": [0, 1]})
    env.step(forward(env))
    state = (env.pos.copy(), env.goal.copy(), env._length.copy(), env.np_random.bit_generator.state)
    with pytest.raises(ValueError, match=f"Counting-v0: bad {match}" if "option" in match else match):
        env.reset(seed=3, options=options)
    assert (env.pos == state[0]).all() and (env.goal == state[1]).all() and (env._length == state[2]).all()
    assert env.np_random.bit_generator.state == state[3]


@pytest.mark.parametrize("seed", [2**64, 2**100, -1, True, np.bool_(True), 2.0, [], [3, -1], "7"])
def test_a_seed_no_stream_takes_is_refused_before_any_reseeding(seed):
    """Int seeds are in [0, 2**64 - 1] (a world model's torch.Generator takes no more; refused,
    not reduced); a list is of non-negative ints. The env's RNG is untouched by a refusal."""
    env = CountingVectorEnv(num_envs=2, autoreset_mode="Disabled")
    env.reset(seed=1)
    rng = env.np_random.bit_generator.state
    with pytest.raises(ValueError, match=r"Counting-v0: bad seed: expected an int in \[0, 2\*\*64 - 1\]"):
        env.reset(seed=seed)
    assert env.np_random.bit_generator.state == rng
    a = env.reset(seed=2**64 - 1)[1]["initial_frame_id"]
    assert env.reset(seed=2**64 - 1)[1]["initial_frame_id"].tolist() == a.tolist()
    env.reset(seed=[2**70, 0])  # list entries of any size: reduced by SeedSequence


@pytest.mark.parametrize("num_envs", [True, False, np.bool_(True), 2.0, 0, "2"])
def test_a_number_of_envs_that_is_no_positive_int_is_refused(num_envs):
    with pytest.raises(ValueError, match=r"bad num_envs: expected an int >= 1, received"):
        CountingVectorEnv(num_envs=num_envs)


def test_step_before_reset_is_an_error():
    with pytest.raises(RuntimeError, match="reset"):
        CountingVectorEnv().step(np.zeros((3, 4, 2), np.float32))


def test_one_env_view_passes_gymnasium_check_env():
    env = SingleEnvView(CountingVectorEnv(num_envs=1, autoreset_mode="Disabled", frames=counting_frames()))
    check_env(env, skip_render_check=True)
    obs, info = env.reset(options={"initial_frame": 0})
    assert obs["instruction"] == "walk 3 cells" and info["initial_frame_id"] == 0
    obs, reward, term, trunc, info = env.step(np.ones((4, 2), np.float32))
    assert term and reward == 1.0 and info["episode"]["length"] == 3
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.ones((4, 2), np.float32))
    rng = env.np_random.bit_generator.state
    for seed in (2**100, -1):  # refused before the view's own RNG is reseeded
        with pytest.raises(ValueError, match="Counting-v0: bad seed"):
            env.reset(seed=seed)
    assert env.np_random.bit_generator.state == rng
