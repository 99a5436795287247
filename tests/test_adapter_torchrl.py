"""TorchRL's GymWrapper over our envs (and a gymnasium task) through envs.adapters.torchrl.

Each rollout is checked against what the wrapped env itself returned (a recording wrapper sits
under the adapter): ``("next", obs)`` must be the env's step output (the true last observation when
an episode ends), the next root observation the env's reset output for the finished envs, and
``done``/``terminated``/``truncated`` the env's flags.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import requires_libero
from gymnasium.vector import AutoresetMode, VectorWrapper

pytest.importorskip("torchrl")
from torchrl.envs.utils import check_env_specs  # noqa: E402

from envs.adapters.torchrl import make_torchrl_env  # noqa: E402
from tests.counting_env import CountingVectorEnv  # noqa: E402


class Recorder(VectorWrapper):
    """Keeps a copy of every step output and reset output of the wrapped env."""

    def __init__(self, env: gym.vector.VectorEnv):
        super().__init__(env)
        self.autoreset_mode = AutoresetMode.DISABLED
        self.steps: list[tuple] = []
        self.resets: list[tuple] = []

    def reset(self, *, seed=None, options=None):
        given = copy.deepcopy(options or {})  # gymnasium's SyncVectorEnv pops reset_mask from options
        obs, info = self.env.reset(seed=seed, options=options)
        self.resets.append((copy.deepcopy(obs), given))
        return obs, info

    def step(self, actions):
        out = self.env.step(actions)
        self.steps.append(copy.deepcopy(out[:4]))
        return out


def _rows(value, key=None):
    value = value if key is None else value[key]
    return np.asarray(value)


def check_rollout(td, rec: Recorder, keys: list[str | None]) -> int:
    """Compare a TorchRL rollout (batch [N, T]) with the recorded env outputs; return episodes ended."""
    n, t_len = td.batch_size
    assert len(rec.steps) == t_len
    reset_idx, ended = 0, 0
    for t in range(t_len):
        obs, reward, terminated, truncated = rec.steps[t]
        done = terminated | truncated
        for key in keys:
            name = key or "observation"
            np.testing.assert_array_equal(td["next", name][:, t].numpy(), _rows(obs, key))
        np.testing.assert_allclose(td["next", "reward"][:, t, 0].numpy(), reward, rtol=1e-6)
        np.testing.assert_array_equal(td["next", "terminated"][:, t, 0].numpy(), terminated)
        np.testing.assert_array_equal(td["next", "truncated"][:, t, 0].numpy(), truncated)
        np.testing.assert_array_equal(td["next", "done"][:, t, 0].numpy(), done)
        if t + 1 == t_len:
            break
        if done.any():  # TorchRL resets exactly the finished envs, through our reset_mask
            ended += int(done.sum())
            reset_idx += 1
            reset_obs, options = rec.resets[reset_idx]
            np.testing.assert_array_equal(options["reset_mask"], done)
        for key in keys:
            name = key or "observation"
            expected = td["next", name][:, t].numpy().copy()
            if done.any():
                expected[done] = _rows(reset_obs, key)[done]
            np.testing.assert_array_equal(td[name][:, t + 1].numpy(), expected)
    assert reset_idx == len(rec.resets) - 1
    return ended


def test_counting_env_episode_ends_and_terminal_obs():
    rec = Recorder(CountingVectorEnv(num_envs=3, chunk_size=2, autoreset_mode="Disabled"))
    env = make_torchrl_env(rec)
    check_env_specs(env)
    env.auto_register_info_dict()  # info arrays (chunk_rewards, ...) into the rollout; runs a dummy rollout
    env.set_seed(0)
    rec.steps.clear()
    rec.resets.clear()
    torch.manual_seed(0)
    td = env.rollout(16, break_when_any_done=False)
    assert td.batch_size == (3, 16)
    ended = check_rollout(td, rec, ["image", "proprio"])
    assert ended >= 3  # every env ends by the 10 sub-step limit (5 chunk steps)
    last = td["next", "proprio"]  # [N, T, 2]: position, goal
    term = td["next", "terminated"][..., 0]
    trunc = td["next", "truncated"][..., 0]
    assert term.any() and trunc.any()
    assert torch.equal(last[..., 0][term], last[..., 1][term])  # terminal obs: goal reached
    assert (last[..., 0][trunc] < last[..., 1][trunc]).all()  # truncated: goal not reached
    assert "instruction" not in td.keys()
    assert tuple(td["next", "chunk_rewards"].shape) == (3, 16, 2)


@requires_libero
@pytest.mark.slow
def test_libero_rollout_matches_the_env():
    vec = gym.make_vec(
        "Libero-Spatial-v0",
        num_envs=2,
        chunk_size=None,
        image_size=32,
        autoreset_mode="Disabled",
        max_episode_steps=4,
    )
    rec = Recorder(vec)
    try:
        env = make_torchrl_env(rec)
        rec.resets.clear()
        torch.manual_seed(0)
        td = env.rollout(9, break_when_any_done=False)
        ended = check_rollout(td, rec, ["image", "wrist_image", "proprio"])
        assert ended == 4  # both envs end at steps 4 and 8 (time limit)
        assert td["next", "truncated"][:, 3].all() and not td["next", "terminated"].any()
        # the last observation of an episode is not the next episode's first one
        assert not torch.equal(td["next", "proprio"][:, 3], td["proprio"][:, 4])
    finally:
        vec.close()


def test_gymnasium_task_through_the_adapter():
    vec = gym.make_vec(
        "CartPole-v1",
        num_envs=4,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED},
    )
    rec = Recorder(vec)
    env = make_torchrl_env(rec, categorical_action_encoding=True)
    env.set_seed(0)
    rec.resets.clear()
    td = env.rollout(60, break_when_any_done=False)
    assert check_rollout(td, rec, [None]) >= 4  # random CartPole episodes last ~20 steps
    env.close()


def test_encoded_instruction_is_a_byte_tensor():
    env = make_torchrl_env(CountingVectorEnv(num_envs=2, autoreset_mode="Disabled"), instruction="encode")
    td = env.reset()
    codes = td["instruction"]
    assert codes.dtype == torch.uint8 and tuple(codes.shape) == (2, 128)
    text = bytes(codes[0].numpy()).rstrip(b"\0").decode()
    assert text.startswith("walk ") and text.endswith(" cells")


def test_bad_input_gives_our_errors():
    with pytest.raises(ValueError, match="autoreset_mode DISABLED, got .*SAME_STEP"):
        make_torchrl_env(CountingVectorEnv(autoreset_mode="SameStep"))
    with pytest.raises(ValueError, match="instruction must be one of"):
        make_torchrl_env(CountingVectorEnv(autoreset_mode="Disabled"), instruction="keep")
    env = make_torchrl_env(CountingVectorEnv(num_envs=3, chunk_size=4, autoreset_mode="Disabled"))
    td = env.reset()
    td["action"] = torch.zeros(3, 4, 3)
    with pytest.raises(ValueError, match=r"Counting-v0: bad actions: expected shape \(3, 4, 2\)"):
        env.step(td)
    td["action"] = torch.full((3, 4, 2), float("nan"))
    with pytest.raises(ValueError, match="Counting-v0: bad actions: expected finite values"):
        env.step(td)


class _Steps(gym.Env):
    """obs {"x": [t]}: the episode ends at t = 3."""

    observation_space = gym.spaces.Dict(x=gym.spaces.Box(-10, 10, (1,), np.float32))
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {"x": np.zeros(1, np.float32)}, {}

    def step(self, action):
        self.t += 1
        return {"x": np.full(1, self.t, np.float32)}, 1.0, self.t >= 3, False, {}


def test_why_same_step_is_refused():
    """TorchRL 0.14's own SAME_STEP handling puts the reset obs where the last obs belongs (Dict obs).
    If this starts failing, TorchRL fixed it and make_torchrl_env may accept SAME_STEP."""
    from torchrl.envs import GymWrapper

    last = {}
    for mode in (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED):
        env = GymWrapper(gym.vector.SyncVectorEnv([_Steps, _Steps], autoreset_mode=mode))
        td = env.rollout(3, break_when_any_done=False)
        last[mode] = td["next", "x"][0, 2, 0].item()
    assert last[AutoresetMode.DISABLED] == 3.0
    assert last[AutoresetMode.SAME_STEP] == 0.0
