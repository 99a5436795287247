"""trainers/env_contract.py: what the trainers read from an env, on CartPole (none of the optional
parts) and on a chunked env with start frames (all of them)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from counting_env import CountingVectorEnv
from gymnasium.vector import VectorWrapper

from envs.adapters.text import TextObservations
from trainers.env_contract import (
    chunk_detail,
    chunk_size,
    episode_stats,
    episode_success,
    frame_tasks,
    initial_frames,
    start_options,
)


class _Metadata(VectorWrapper):
    """The wrapped env with other metadata."""

    def __init__(self, env, **metadata):
        super().__init__(env)
        self.metadata = {**env.metadata, **metadata}


def test_cartpole_gets_the_defaults():
    env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    env = gym.wrappers.vector.RecordEpisodeStatistics(env)
    assert chunk_size(env) is None and initial_frames(env) is None and frame_tasks(env) is None
    env.reset(seed=0)
    rewards, valid = None, None
    for _ in range(200):
        _, reward, term, trunc, info = env.step(np.ones(3, np.int64))
        rewards, valid = chunk_detail(info, reward, 3, 4)  # K = 4 policy over a plain env
        assert valid[:, 0].all() and not valid[:, 1:].any()
        np.testing.assert_array_equal(rewards[:, 0], reward)
        stats = episode_stats(info)
        if stats:
            i = next(iter(stats))
            assert stats[i]["length"] > 0 and stats[i]["return"] == stats[i]["length"]
            assert episode_success(stats[i], term[i]) == bool(term[i])  # no "success": terminated
            break
    else:
        pytest.fail("no CartPole episode ended in 200 steps of pushing right")
    env.close()


def test_chunked_env_with_frames():
    env = CountingVectorEnv(num_envs=2, chunk_size=4, autoreset_mode="Disabled")
    assert env.metadata["chunk_size"] == 4 and chunk_size(env) == 4
    assert len(initial_frames(env)) == 5 and frame_tasks(env)[0] == "walk/3"
    wrapped = TextObservations(env)  # vector wrappers hide attributes: frames are found below them
    assert initial_frames(wrapped) is env.initial_frames and chunk_size(wrapped) == 4
    obs, _ = env.reset(seed=0, options=start_options([0, 4]))
    assert obs["proprio"][:, 1].tolist() == [3, 20]  # goals of frames 0 and 4
    _, reward, term, _, info = env.step(np.ones((2, 4, 2), np.float32))  # frame 0's goal: 3 cells
    rewards, valid = chunk_detail(info, reward, 2, 4)
    assert valid.tolist() == [[True, True, True, False], [True] * 4]
    assert rewards.tolist() == [[0, 0, 1, 0], [0] * 4]
    stats = episode_stats(info)
    assert term.tolist() == [True, False] and list(stats) == [0] and episode_success(stats[0], term[0])
    # a masked reset starts only the masked env, at the given frame
    obs, _ = env.reset(options=start_options([1], reset_mask=np.array([True, False])))
    assert obs["proprio"][0].tolist() == [0, 4]
    with pytest.raises(ValueError, match="expected \\(2, 3\\)"):
        chunk_detail(info, reward, 2, 3)
    env.close()


def test_explicit_metadata_wins_over_the_action_shape():
    env = CountingVectorEnv(num_envs=1, chunk_size=4)
    assert chunk_size(_Metadata(env, chunk_size=None)) is None  # a (4, 2) action that is not a chunk
    with pytest.raises(ValueError, match="chunk_size 3"):
        chunk_size(_Metadata(env, chunk_size=3))
    plain = _Metadata(env)
    del plain.metadata["chunk_size"]
    assert chunk_size(plain) == 4  # no key: a 2-d Box is read as a chunk
    env.close()
