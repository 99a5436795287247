"""ResidualPolicy: a frozen Gaussian base plus a learned correction that starts at zero."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from policies import GaussianPolicy
from policies.registry import make_policy
from policies.residual import ResidualPolicy

OBS = spaces.Dict({"proprio": spaces.Box(-5, 5, (4,), np.float32), "instruction": spaces.Text(32)})
ACT = spaces.Box(-1.0, 1.0, (3, 2), np.float32)
BASE = {"name": "gaussian", "kwargs": {"squash": True, "hidden_sizes": [16], "use_critic": False}}


def _obs(n: int = 5) -> dict:
    rng = np.random.default_rng(0)
    return {"proprio": rng.standard_normal((n, 4)).astype(np.float32), "instruction": ("pick",) * n}


def _trained_base() -> GaussianPolicy:
    base = GaussianPolicy(OBS, ACT, **BASE["kwargs"])
    with torch.no_grad():
        for p in base.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return base


def test_residual_starts_as_the_base_and_trains_only_the_correction():
    base = _trained_base()
    policy = make_policy("residual", OBS, ACT, base=BASE, log_std_bounds=(-3.0, -1.0))
    assert isinstance(policy, ResidualPolicy)
    policy.base.load_state_dict(base.state_dict())
    obs = _obs()
    torch.testing.assert_close(
        policy.act(obs, deterministic=True).actions, base.act(obs, deterministic=True).actions
    )
    frozen = {n for n, p in policy.named_parameters() if not p.requires_grad}
    assert frozen == {f"base.{n}" for n, _ in base.named_parameters()}
    # the std starts at the base's fitted one, clamped to the bounds
    _, log_std = policy._mean_log_std(policy.torso(policy._prepare(obs)))
    torch.testing.assert_close(log_std[0].flatten(), base.log_std.detach().clamp(-3.0, -1.0))

    policy.seed(0)
    out = policy.act(obs)
    ev = policy.evaluate(out.replay)
    torch.testing.assert_close(ev.log_probs, out.log_probs)
    (-(ev.log_probs * torch.randn_like(ev.log_probs)).mean()).backward()
    assert all(p.grad is None for p in policy.base.parameters())
    assert policy.mean_head.weight.grad.abs().sum() > 0


def test_residual_state_dict_round_trip_and_bad_bases():
    policy = ResidualPolicy(OBS, ACT, base=BASE, log_std_init=-2.0, noise_correlation=0.5)
    with torch.no_grad():
        policy.mean_head.bias.fill_(0.1)
    again = ResidualPolicy(OBS, ACT, base=BASE, log_std_init=-2.0, noise_correlation=0.5)
    again.load_state_dict(policy.state_dict())
    obs = _obs()
    torch.testing.assert_close(again.act(obs, True).actions, policy.act(obs, True).actions)
    assert torch.equal(again.log_std, torch.full((6,), -2.0))
    with pytest.raises(TypeError, match="must be a GaussianPolicy"):
        ResidualPolicy(OBS, spaces.Box(-1, 1, (3, 2), np.float32), base={"name": "binned"})
    with pytest.raises(ValueError, match="policy spec"):
        ResidualPolicy(OBS, ACT, base="gaussian")


def test_trainer_builds_a_residual_over_the_init_policy_and_reloads_it(tmp_path):
    """``--policy residual --init-policy RUN``: the run's policy becomes the frozen base; the
    residual run's checkpoints rebuild the whole thing (base included) for evaluation."""
    import gymnasium as gym

    from trainers.checkpoint import load_policy
    from trainers.grpo import train as grpo_train

    if "TestCounting-v0" not in gym.registry:
        gym.register("TestCounting-v0", vector_entry_point="tests.counting_env:CountingVectorEnv")
    common = ["--env", "TestCounting-v0", "--env-kwargs", '{"chunk_size": 4}', "--num-envs", "4",
              "--group-size", "2", "--total-steps", "40", "--eval-every", "-1", "--no-progress",
              "--no-tensorboard", "--no-video"]  # fmt: skip
    grpo_train.main([*common, "--run-dir", str(tmp_path / "first"), "--policy-kwargs", '{"squash": true}'])
    grpo_train.main(
        [*common, "--run-dir", str(tmp_path / "res"), "--policy", "residual",
         "--init-policy", str(tmp_path / "first"), "--policy-kwargs", '{"log_std_bounds": [-2, -1]}']
    )  # fmt: skip
    env = gym.make_vec("TestCounting-v0", num_envs=2, chunk_size=4)
    first = load_policy(tmp_path / "first", env.single_observation_space, env.single_action_space)
    res = load_policy(tmp_path / "res", env.single_observation_space, env.single_action_space)
    assert isinstance(res, ResidualPolicy) and res.log_std_bounds == (-2.0, -1.0)
    for name, value in first.state_dict().items():
        if not name.startswith(("critic_torso", "value_head")):
            assert torch.equal(res.base.state_dict()[name], value), name


def test_residual_noise_dims_leave_the_other_dimensions_to_the_base():
    policy = ResidualPolicy(OBS, ACT, base=BASE, log_std_init=-1.0, noise_dims=[1])
    with torch.no_grad():
        policy.mean_head.bias.fill_(0.3)  # a correction on every output...
    obs = _obs()
    base_mode = policy.base.act(obs, deterministic=True).actions
    mode = policy.act(obs, deterministic=True).actions
    torch.testing.assert_close(mode[..., 0], base_mode[..., 0])  # ...used only where there is noise
    assert (mode[..., 1] - base_mode[..., 1]).abs().min() > 0
    out = policy.act(obs)
    assert out.log_probs.shape == (5, 3, 1)
    torch.testing.assert_close(out.actions[..., 0], base_mode[..., 0])
