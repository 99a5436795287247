"""The Stable-Baselines3 VecEnv adapter: episode boundaries, terminal observations, seeding, options,
text handling, and SB3's PPO running through it on a gymnasium task, LIBERO and a world model."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import envs  # noqa: F401

pytest.importorskip("stable_baselines3")
from stable_baselines3 import PPO  # noqa: E402

from envs.adapters.sb3 import SB3VecEnv  # noqa: E402

LIMIT = 15  # a short time limit, so truncations happen


def cartpole(mode: AutoresetMode, n: int = 2) -> SyncVectorEnv:
    return SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=LIMIT)] * n, autoreset_mode=mode)


def hand_rolled(seed: int, actions: np.ndarray) -> list[dict]:
    """The same rollout with plain single envs: reset(seed + i) once, reset() after every end."""
    n = actions.shape[1]
    singles = [gym.make("CartPole-v1", max_episode_steps=LIMIT) for _ in range(n)]
    for i, env in enumerate(singles):
        env.reset(seed=seed + i)
    trace = []
    for a in actions:
        row = {"obs": [], "reward": [], "done": [], "terminal": [], "truncated": []}
        for i, env in enumerate(singles):
            o, r, term, trunc, _ = env.step(int(a[i]))
            terminal = None
            if term or trunc:
                terminal, (o, _) = o, env.reset()
            row["obs"].append(o)
            row["reward"].append(r)
            row["done"].append(term or trunc)
            row["terminal"].append(terminal)
            row["truncated"].append(trunc and not term)
        trace.append(row)
    return trace


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_episode_boundaries_and_terminal_observations_match_a_hand_rolled_loop(mode):
    actions = np.random.default_rng(0).integers(0, 2, (60, 2))
    expected = hand_rolled(7, actions)
    venv = SB3VecEnv(cartpole(mode))
    venv.seed(7)
    venv.reset()
    ends = 0
    for a, want in zip(actions, expected, strict=True):
        obs, reward, done, infos = venv.step(a)
        assert np.allclose(obs, want["obs"]) and np.allclose(reward, want["reward"])
        assert done.tolist() == want["done"]
        for i in range(2):
            if done[i]:
                ends += 1
                assert np.allclose(infos[i]["terminal_observation"], want["terminal"][i])
                assert infos[i]["TimeLimit.truncated"] == want["truncated"][i]
                assert infos[i]["episode"]["l"] >= 1
            else:
                assert "terminal_observation" not in infos[i]
    assert ends >= 4  # both terminations and truncations at LIMIT happened
    venv.close()


def test_next_step_autoreset_and_bad_actions_are_refused_clearly():
    with pytest.raises(ValueError, match="SAME_STEP or DISABLED"):
        SB3VecEnv(cartpole(AutoresetMode.NEXT_STEP))
    venv = SB3VecEnv(cartpole(AutoresetMode.SAME_STEP))
    venv.reset()
    with pytest.raises(ValueError, match=r"expected shape \(2,\)"):
        venv.step(np.zeros((3,), np.int64))
    assert venv.get_attr("spec")[0].id == "CartPole-v1"
    assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [True, True]
    venv.close()


@pytest.mark.slow
def test_ppo_learns_through_the_adapter_on_a_gymnasium_task():
    venv = SB3VecEnv(cartpole(AutoresetMode.SAME_STEP, 4))
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.learn(512)
    assert model.num_timesteps == 512 and len(model.ep_info_buffer) > 0
    venv.close()


@pytest.mark.slow
def test_world_model_env_with_encoded_instructions_and_initial_frame_options(tmp_path):
    from envs.world_models.tiny import write_tiny_bundle

    bundle = write_tiny_bundle("opensora", tmp_path / "opensora")
    vec = gym.make_vec(
        "OpenSoraWM-LiberoSpatial-v0",
        num_envs=2,
        model_dir=bundle,
        image_size=(48, 48),  # SB3's CNN needs at least 36x36
        model_options={"num_steps": 2},
        max_episode_steps=16,
        autoreset_mode="SameStep",
    )
    venv = SB3VecEnv(vec, instruction="encode", instruction_length=16)
    assert venv.observation_space["instruction"].shape == (16,)
    venv.set_options([{"initial_frame": 1}, {"initial_frame": 3}])
    obs = venv.reset()
    assert venv.reset_infos[0]["initial_frame_id"] == 1 and venv.reset_infos[1]["initial_frame_id"] == 3
    text = vec.initial_frames[1].instruction.encode()[:16]
    assert bytes(obs["instruction"][0]) == text.ljust(16, b"\0")
    model = PPO("MultiInputPolicy", venv, n_steps=4, batch_size=8, n_epochs=1, seed=0, device="cpu")
    model.learn(8)  # (8, 7) chunk actions: SB3 samples 56 values and reshapes them
    assert model.num_timesteps == 8
    venv.reset()
    assert not venv.step(np.zeros((2, 8, 7), np.float32))[2].any()
    _, _, done, infos = venv.step(np.zeros((2, 8, 7), np.float32))
    assert done.all() and all(info["TimeLimit.truncated"] for info in infos)  # 16 frames = 2 chunks
    assert infos[0]["terminal_observation"]["image"].shape == (48, 48, 3)
    assert infos[0]["is_success"] is False and infos[0]["episode_stats"]["length"] == 16
    venv.close()


@pytest.mark.slow
@requires_libero
def test_ppo_runs_on_libero_through_the_adapter():
    vec = gym.make_vec(
        "Libero-Spatial-v0",
        num_envs=2,
        chunk_size=None,
        image_size=64,
        cameras=("agentview",),
        max_episode_steps=40,
        autoreset_mode="SameStep",
    )
    venv = SB3VecEnv(vec)  # instruction dropped
    assert set(venv.observation_space.spaces) == {"image", "proprio"}
    model = PPO("MultiInputPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(128)
    assert (
        model.num_timesteps == 128 and len(model.ep_info_buffer) == 2
    )  # 64 steps per env: one 40-step episode each
    venv.close()


@requires_libero
@pytest.mark.parametrize("mode", ["drop", "encode"])
@pytest.mark.slow
def test_one_env_view_passes_sb3s_and_torchrls_checkers(mode):
    """``gym.make`` LIBERO has a Text instruction, which SB3 rejects; ``TextObservation`` fixes it."""
    from stable_baselines3.common.env_checker import check_env

    from envs.adapters.text import TextObservation

    env = gym.make("Libero-Spatial-v0", cameras=(), chunk_size=None, task_state=True)
    with pytest.raises(Exception, match="instruction"):  # SB3 has no Text spaces
        check_env(env, warn=False)
    wrapped = TextObservation(env, mode, length=64)
    check_env(wrapped, warn=False, skip_render_check=True)
    raw, _ = env.reset(seed=0)
    obs, _ = wrapped.reset(seed=0)
    assert ("instruction" in obs) == (mode == "encode")
    np.testing.assert_array_equal(obs["task_state"], raw["task_state"])
    if mode == "encode":
        assert bytes(obs["instruction"]).rstrip(b"\0") == raw["instruction"].encode()[:64]
        pytest.importorskip("torchrl")
        from torchrl.envs import GymWrapper
        from torchrl.envs.utils import check_env_specs

        check_env_specs(GymWrapper(wrapped))
    with pytest.raises(ValueError, match="text mode must be one of"):
        TextObservation(env, "keep")
    wrapped.close()
