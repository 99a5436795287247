"""Trainer math (GAE, clipped losses, GRPO advantages, dynamic sampling) and the rollout collector.

GAE is checked against Stable-Baselines3's ``RolloutBuffer`` on the same data; the collector on
gymnasium's CartPole in NEXT_STEP, SAME_STEP and DISABLED autoreset and on a chunked env of ours.
"""

from __future__ import annotations

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from policies.base import ActionChunk, ActionChunkPolicy, PolicyEval
from policies.categorical import CategoricalPolicy
from policies.gaussian import GaussianPolicy
from tests.counting_env import CountingVectorEnv
from trainers.config import parse_cli
from trainers.grpo import (
    GRPOConfig,
    episode_scores,
    first_episode_truncated,
    group_advantages,
    group_seeds,
    groups_to_resample,
    grpo_update,
    imitation_weights,
    keep_groups,
    overlong_penalty,
    shuffle_scores,
)
from trainers.grpo import make_optimizer as grpo_optimizer
from trainers.losses import chunk_kl, clipped_surrogate, policy_loss_weights, to_level
from trainers.optim import BadUpdateGuard
from trainers.ppo import (
    PPOConfig,
    compute_advantages,
    gae,
    make_optimizer,
    policy_loss,
    ppo_update,
    value_loss,
)
from trainers.rollout import Collector, Rollout, episode_summary

GAMMA, LAM = 0.99, 0.95


def make_rollout(rewards, valid=None, values=None, terminated=None, truncated=None, boot=None, last=None):
    """A Rollout from hand-made tensors ``[T, N, K]`` (other fields: zeros / empty)."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    T, N, K = rewards.shape
    valid = torch.ones(T, N, K, dtype=torch.bool) if valid is None else torch.as_tensor(valid)
    zeros_tn = torch.zeros(T, N, dtype=torch.bool)
    terminated = zeros_tn if terminated is None else torch.as_tensor(terminated)
    truncated = zeros_tn if truncated is None else torch.as_tensor(truncated)
    done = (terminated | truncated).long()
    return Rollout(
        replay={},
        actions=torch.zeros(T, N, K, 1),
        log_probs=torch.zeros(T, N, K, 1),
        values=None if values is None else torch.as_tensor(values, dtype=torch.float32),
        rewards=rewards,
        valid=valid,
        terminated=terminated,
        truncated=truncated,
        first_episode=valid & ((done.cumsum(0) - done) == 0)[..., None],
        bootstrap_values=torch.zeros(T, N) if boot is None else torch.as_tensor(boot, dtype=torch.float32),
        last_values=None if last is None else torch.as_tensor(last, dtype=torch.float32),
    )


# ---------------------------------------------------------------------- GAE
def test_gae_reference_vector():
    # worked by hand: the episode ends after step 2; V_5 = 0.6 bootstraps the open end
    r = torch.tensor([0.0, 0, 1, 0, 0])[:, None]
    v = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])[:, None]
    d = torch.tensor([0, 0, 1, 0, 0], dtype=torch.bool)[:, None]
    adv = gae(r, v, d, torch.ones_like(d), torch.tensor([0.6]), GAMMA, LAM)
    expected = torch.tensor([0.808407, 0.75535, 0.7, 0.183407, 0.094])
    torch.testing.assert_close(adv[:, 0], expected, atol=1e-6, rtol=0)


def test_gae_matches_sb3_rollout_buffer():
    from stable_baselines3.common.buffers import RolloutBuffer

    T, N = 32, 4
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    done = rng.random((T, N)) < 0.15
    truncated = done & (rng.random((T, N)) < 0.5)
    terminated = done & ~truncated
    boot = np.where(truncated, rng.normal(size=(T, N)), 0.0).astype(np.float32)  # V(final obs)
    last_values = rng.normal(size=N).astype(np.float32)

    # SB3: the timeout bootstrap is folded into the reward; episode_starts[t] = done[t - 1]
    buf = RolloutBuffer(T, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), "cpu", LAM, GAMMA, N)
    starts = np.vstack([rng.random((1, N)) < 0.5, done[:-1]]).astype(np.float32)
    for t in range(T):
        buf.add(
            np.zeros((N, 1), np.float32),
            np.zeros((N, 1)),
            rewards[t] + GAMMA * boot[t],
            starts[t],
            torch.as_tensor(values[t]),
            torch.zeros(N),
        )
    buf.compute_returns_and_advantage(torch.as_tensor(last_values), done[-1])

    ro = make_rollout(
        rewards[..., None],
        values=values[..., None],
        terminated=terminated,
        truncated=truncated,
        boot=boot,
        last=last_values[:, None],
    )
    adv, ret, mask = compute_advantages(ro, GAMMA, LAM, "step")
    assert mask.all()
    np.testing.assert_allclose(adv[..., 0].numpy(), buf.advantages, atol=1e-5)
    np.testing.assert_allclose(ret[..., 0].numpy(), buf.returns, atol=1e-5)
    adv_c, ret_c, _ = compute_advantages(ro, GAMMA, LAM, "chunk")  # K = 1: the same thing
    torch.testing.assert_close(adv_c, adv)


class SB3Policy(ActionChunkPolicy):
    """An SB3 ``ActorCriticPolicy`` behind our contract (replay = obs and actions), for parity."""

    chunk_size, action_dim, log_prob_dim = 1, 1, 1

    def __init__(self, sb3_policy):
        super().__init__()
        self.p = sb3_policy

    def evaluate(self, replay):
        v, lp, ent = self.p.evaluate_actions(replay["obs"], replay["actions"].long().flatten())
        return PolicyEval(lp[:, None, None], ent[:, None, None], v)


def test_ppo_update_matches_sb3_train():
    """Same weights, same rollout: SB3's ``PPO.train`` and ``ppo_update`` give the same weights."""
    import copy

    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    T, N = 16, 4
    env = make_vec_env("CartPole-v1", n_envs=N, seed=0)
    model = PPO("MlpPolicy", env, n_steps=T, batch_size=T * N, n_epochs=3, seed=0, device="cpu")
    _, callback = model._setup_learn(T * N, None)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=T)
    ours = SB3Policy(copy.deepcopy(model.policy))
    buf = model.rollout_buffer
    with torch.no_grad():
        last = ours.p.predict_values(torch.as_tensor(model._last_obs))
    starts = torch.as_tensor(buf.episode_starts).bool()
    ro = make_rollout(
        buf.rewards[..., None],  # SB3 already added gamma * V(terminal obs) on timeouts
        values=buf.values[..., None],
        terminated=torch.cat([starts[1:], torch.as_tensor(model._last_episode_starts).bool()[None]]),
        last=last,
    )
    ro.replay = {"obs": torch.as_tensor(buf.observations), "actions": torch.as_tensor(buf.actions)}
    ro.log_probs = torch.as_tensor(buf.log_probs)[..., None, None]
    adv, _, _ = compute_advantages(ro, GAMMA, LAM)
    np.testing.assert_allclose(adv[..., 0].numpy(), buf.advantages, atol=1e-6)

    model.train()  # one minibatch per epoch: the shuffling order does not matter
    config = PPOConfig(n_steps=T, batch_size=T * N, n_epochs=3)
    metrics = ppo_update(ours, make_optimizer(ours, config), ro, config)
    for name, param in model.policy.named_parameters():
        torch.testing.assert_close(ours.p.get_parameter(name), param, atol=1e-6, rtol=1e-5)
    logged = model.logger.name_to_value
    assert metrics["value_loss"] == pytest.approx(logged["train/value_loss"], rel=1e-5)
    assert metrics["entropy"] == pytest.approx(-logged["train/entropy_loss"], rel=1e-5)
    assert metrics["updates"] == logged["train/n_updates"] == 3


def test_gae_chunk_time_unit_by_hand():
    # K = 2, one env: chunk rewards 1, 1, 1 (the last chunk ends after its first sub-step)
    rewards = [[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 5.0]]]  # the 5.0 was never executed
    valid = torch.tensor([[[True, True]], [[True, True]], [[True, False]]])
    v = [0.5, 0.2, 0.1]
    ro = make_rollout(
        rewards,
        valid=valid,
        values=[[[v[0]]], [[v[1]]], [[v[2]]]],
        terminated=torch.tensor([[False], [False], [True]]),
        last=[[9.0]],  # ignored: the episode terminated
    )
    adv, ret, mask = compute_advantages(ro, GAMMA, LAM, "chunk")
    a2 = 1.0 - v[2]
    a1 = 1.0 + GAMMA * v[2] - v[1] + GAMMA * LAM * a2
    a0 = 1.0 + GAMMA * v[1] - v[0] + GAMMA * LAM * a1
    torch.testing.assert_close(adv[:, 0, 0], torch.tensor([a0, a1, a2]))
    torch.testing.assert_close(ret[:, 0, 0], torch.tensor([a0 + v[0], a1 + v[1], a2 + v[2]]))
    assert mask.shape == (3, 1, 1) and mask.all()


def test_gae_step_time_unit_with_mid_chunk_truncation():
    # K = 2, Kv = 2: the episode is truncated after sub-step 0 of chunk 1; V(final obs) = b
    r, v, b = [0.3, -0.2, 0.7], [[0.1, 0.2], [0.4, 0.8]], 2.0
    ro = make_rollout(
        [[[r[0], r[1]]], [[r[2], 0.0]]],
        valid=torch.tensor([[[True, True]], [[True, False]]]),
        values=[[v[0]], [v[1]]],
        truncated=torch.tensor([[False], [True]]),
        boot=[[0.0], [b]],
        last=[[5.0, 5.0]],
    )
    adv, ret, mask = compute_advantages(ro, GAMMA, LAM, "step")
    a2 = r[2] + GAMMA * b - v[1][0]
    a1 = r[1] + GAMMA * v[1][0] - v[0][1] + GAMMA * LAM * a2
    a0 = r[0] + GAMMA * v[0][1] - v[0][0] + GAMMA * LAM * a1
    torch.testing.assert_close(adv[:, 0], torch.tensor([[a0, a1], [a2, 0.0]]))
    assert mask[:, 0].tolist() == [[True, True], [True, False]]
    assert ret[1, 0, 1] == 0.0
    with pytest.raises(ValueError, match="Kv=K"):  # one value per chunk cannot do sub-step time
        compute_advantages(make_rollout(ro.rewards, values=torch.zeros(2, 1, 1), last=[[0.0]]), GAMMA, LAM)


def test_gae_skips_invalid_reset_steps():
    # NEXT_STEP: step 1 is the reset transition of an episode that terminated at step 0
    ro = make_rollout(
        [[[1.0]], [[0.0]], [[1.0]]],
        valid=torch.tensor([[[True]], [[False]], [[True]]]),
        values=[[[0.5]], [[7.0]], [[0.25]]],
        terminated=torch.tensor([[True], [False], [False]]),
        last=[[1.0]],
    )
    adv, _, mask = compute_advantages(ro, GAMMA, LAM)
    torch.testing.assert_close(adv[:, 0, 0], torch.tensor([0.5, 0.0, 1.0 + GAMMA * 1.0 - 0.25]))
    assert mask[:, 0, 0].tolist() == [True, False, True]


# ---------------------------------------------------------------------- losses
def test_clipped_surrogate_hits_low_and_high_clip():
    ratios = torch.tensor([1.5, 0.5, 0.5, 1.1, 5.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    loss, active = clipped_surrogate(ratios.log(), adv, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([-1.28, -0.5, 0.8, 1.1, 5.0]))
    assert active.tolist() == [True, False, True, False, False]
    loss, active = clipped_surrogate(ratios.log(), adv, 0.2, 0.28, dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor([-1.28, -0.5, 0.8, 1.1, 3.0]))  # capped at c|A|
    assert active.tolist() == [True, False, True, False, True]


def test_policy_loss_levels_and_masks():
    # one sample, K = 2 sub-steps (the second not executed), E = 2 elements
    old = torch.zeros(1, 2, 2)
    new = torch.tensor([[[math.log(1.5), 0.0], [math.log(4.0), math.log(4.0)]]])
    valid = torch.tensor([[True, False]])
    adv = torch.ones(1, 1)
    loss, stats = policy_loss(new, old, adv, valid, "element", 0.2, 0.2)
    assert loss.item() == pytest.approx(-(1.2 + 1.0) / 2)  # invalid sub-step ignored
    assert stats["clip_fraction"] == pytest.approx(0.5)
    loss, _ = policy_loss(new, old, adv, valid, "step", 0.2, 0.2)
    assert loss.item() == pytest.approx(-1.2)
    loss, stats = policy_loss(new, old, adv, valid, "chunk", 0.2, 0.5)
    assert loss.item() == pytest.approx(-1.5)  # chunk ratio = 1.5 * 1 (invalid sub-step left out)
    assert stats["ratio"] == pytest.approx(1.5)
    assert stats["approx_kl"] == pytest.approx(0.5 - math.log(1.5))
    # chunk ratio against per-sub-step advantages: one loss per executed sub-step
    loss, _ = policy_loss(new, old, torch.tensor([[2.0, -9.0]]), valid, "chunk", 0.2, 0.2)
    assert loss.item() == pytest.approx(-2.0 * 1.2)
    e, m = to_level(torch.ones(3, 2, 4), torch.tensor([[True, True], [True, False], [False, False]]), "chunk")
    assert e.flatten().tolist() == [8.0, 4.0, 0.0] and m.flatten().tolist() == [True, True, False]


def test_target_kl_is_compared_per_chunk_step_at_every_level():
    """``approx_kl_chunk`` (what the early stop reads) is k3 of each chunk's joint log-ratio over its
    executed sub-steps, averaged over chunk-steps, whatever level the loss works at."""
    old = torch.zeros(2, 2, 2)
    new = torch.tensor([[[0.1, 0.2], [0.3, 9.0]], [[-0.1, 0.0], [0.0, 0.0]]])
    valid = torch.tensor([[True, False], [True, True]])
    k3 = [math.exp(x) - 1 - x for x in (0.3, -0.1)]  # chunk 0: 0.1 + 0.2 (sub-step 1 not run)
    for level in ("element", "step", "chunk"):
        _, stats = policy_loss(new, old, torch.ones(2, 1), valid, level, 0.2, 0.2)
        assert stats["approx_kl_chunk"].item() == pytest.approx(sum(k3) / 2, rel=1e-5)
    assert chunk_kl(new, old, valid, torch.tensor(4.0)).item() == pytest.approx(sum(k3) / 4, rel=1e-5)
    weights = policy_loss_weights(old, valid, "element", 1)
    assert weights["chunk"].item() == 2.0 and weights["level"].item() == 6.0
    # K = 1: SB3's approx_kl over the sum of the action dimensions' log-ratios
    lr = torch.tensor([[[0.2, -0.05]]])
    _, stats = policy_loss(
        lr, torch.zeros(1, 1, 2), torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), "chunk", 0.2, 0.2
    )
    assert stats["approx_kl_chunk"].item() == pytest.approx(stats["approx_kl"].item())


def test_value_loss_mse_huber_and_clip():
    new, old, ret = torch.tensor([[2.0], [0.0]]), torch.tensor([[0.0], [0.0]]), torch.tensor([[3.0], [1.0]])
    mask = torch.tensor([[True], [False]])
    assert value_loss(new, old, ret, mask).item() == pytest.approx(1.0)
    assert value_loss(new, old, ret, mask, clip=0.5).item() == pytest.approx(2.5**2)  # max(1, 6.25)
    assert value_loss(new, old, ret, mask, "huber", huber_delta=0.5).item() == pytest.approx(0.5 * (1 - 0.25))


# ---------------------------------------------------------------------- GRPO
def test_group_advantages_reference_vectors():
    scores = torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 0])
    a = group_advantages(scores, 8, "unbiased")
    torch.testing.assert_close(a[[0, 1]], torch.tensor([1.207612, -0.724567]), atol=1e-5, rtol=0)
    a = group_advantages(scores, 8, "population")
    torch.testing.assert_close(a[[0, 1]], torch.tensor([1.290992, -0.774595]), atol=1e-5, rtol=0)
    a = group_advantages(torch.tensor([1.0, 3.0, 2.0, 2.0]), 2, "none")
    assert a.tolist() == [-1.0, 1.0, 0.0, 0.0]
    assert group_advantages(torch.tensor([0.5, 2.0]), 1).tolist() == [0.5, 2.0]
    with pytest.raises(ValueError, match="multiple"):
        group_advantages(torch.zeros(6), 4)


def test_scores_until_first_done_and_dynamic_sampling():
    # 4 envs, 2 groups of 2; env 0 succeeds twice but only its first episode counts
    rewards = torch.tensor([[1.0, 0, 0, 1], [1, 0, 0, 1], [0, 1, 0, 1]])[..., None]
    terminated = torch.tensor(
        [[True, False, False, False], [False, False, False, False], [False, True, False, False]]
    )
    ro = make_rollout(rewards, terminated=terminated)
    scores = episode_scores(ro.rewards, ro.first_episode)
    assert scores.tolist() == [1.0, 1.0, 0.0, 3.0]
    # the placebo: the same scores, permuted among the envs, on each env's first-episode sub-steps
    placebo = shuffle_scores(ro, torch.Generator().manual_seed(3))
    shuffled = episode_scores(placebo.rewards, placebo.first_episode)
    assert sorted(shuffled.tolist()) == sorted(scores.tolist()) and shuffled.tolist() != scores.tolist()
    assert not (placebo.rewards * ~placebo.first_episode).any() and placebo.valid is ro.valid
    assert keep_groups(scores, 2).tolist() == [False, True]  # group 0: all equal -> no signal
    assert groups_to_resample(scores, 2) == [0]
    assert keep_groups(scores, 2, low=0.0, high=1.0).tolist() == [False, False]  # mean 1.5 > 1
    assert torch.equal(group_advantages(scores, 2)[:2], torch.zeros(2))
    assert group_seeds(10, 6, 3) == [10, 10, 10, 11, 11, 11]


class TableBandit(ActionChunkPolicy):
    """Logits per env id (the obs): a tiny categorical policy for update tests; K = 1, E = 1."""

    chunk_size, action_dim, log_prob_dim = 1, 1, 1

    def __init__(self, num_envs: int, fail: bool = False):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(num_envs, 2))
        self.fail = fail

    def _dist(self, ids):
        logits = self.logits[ids] * (math.nan if self.fail else 1.0)
        return torch.distributions.Categorical(logits=logits, validate_args=False)

    def act(self, obs, deterministic=False):
        ids = torch.as_tensor(obs).long()
        a = self._dist(ids).sample()
        return ActionChunk(
            a.float()[:, None, None], self._dist(ids).log_prob(a)[:, None, None], None, {"id": ids, "a": a}
        )

    def evaluate(self, replay):
        d = self._dist(replay["id"])
        return PolicyEval(d.log_prob(replay["a"])[:, None, None], d.entropy()[:, None, None], None)


def _bandit_rollout(policy: TableBandit, n: int, seed: int) -> Rollout:
    torch.manual_seed(seed)
    with torch.no_grad():
        out = policy.act(torch.arange(n))
    ro = make_rollout(out.actions[None, :, :, 0], terminated=torch.ones(1, n, dtype=torch.bool))
    ro.replay = {k: v[None] for k, v in out.replay.items()}
    ro.log_probs = out.log_probs[None]
    return ro


def test_grpo_update_learns_masks_filtered_groups_and_kl():
    torch.manual_seed(0)
    n, policy = 8, TableBandit(8)
    ref = TableBandit(8)
    ref.load_state_dict(policy.state_dict())
    config = GRPOConfig(group_size=4, learning_rate=0.1, weight_decay=0.0, kl_beta=0.01, loss_agg="traj_mean")
    opt = grpo_optimizer(policy, config)
    ro = _bandit_rollout(policy, n, seed=1)
    ro.rewards[0, 4:] = 1.0  # group 1: all succeed -> filtered
    before = policy.logits.detach().clone()
    m = grpo_update(policy, opt, ro, config, ref_policy=ref, generator=torch.Generator().manual_seed(0))
    assert m["groups_kept"] == 0.5 and m["updates"] == 1
    assert m["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # policy == ref before the step
    assert torch.equal(policy.logits[4:], before[4:])  # no gradient reaches filtered groups' envs
    assert not torch.equal(policy.logits[:4], before[:4])
    # rewarded actions become likelier in group 0
    a = ro.replay["a"][0, :4]
    p = torch.softmax(policy.logits[:4], -1)[torch.arange(4), a]
    assert ((p > 0.5) == (ro.rewards[0, :4, 0] > 0)).all() or ro.rewards[0, :4, 0].std() == 0
    with pytest.raises(ValueError, match="reference policy"):
        grpo_update(policy, opt, ro, GRPOConfig(group_size=4, kl_beta=0.1))


def test_grpo_variants_name_their_settings_and_given_values_win():
    dapo, plain = GRPOConfig(), GRPOConfig(variant="grpo")
    assert (dapo.clip_high, dapo.dynamic_sampling, dapo.loss_agg) == (0.28, True, "token_mean")
    assert (plain.clip_high, plain.dynamic_sampling, plain.loss_agg) == (0.2, False, "traj_mean")
    mixed = GRPOConfig(variant="grpo", clip_high=0.3, dynamic_sampling=True)
    assert (mixed.clip_high, mixed.dynamic_sampling, mixed.loss_agg) == (0.3, True, "traj_mean")
    cli = parse_cli({"grpo": GRPOConfig}, ["--variant", "grpo", "--dynamic-sampling"])["grpo"]
    assert (cli.clip_high, cli.dynamic_sampling, cli.loss_agg) == (0.2, True, "traj_mean")
    cli = parse_cli({"grpo": GRPOConfig}, ["--no-dynamic-sampling"])["grpo"]
    assert (cli.clip_high, cli.dynamic_sampling) == (0.28, False)
    with pytest.raises(ValueError, match="variant must be one of"):
        GRPOConfig(variant="ppo")
    with pytest.raises(ValueError, match="overlong must be"):
        GRPOConfig(overlong="cut")


def test_dapo_overlong_filter_and_soft_punishment():
    lengths = torch.tensor([50, 80, 90, 100, 120])
    assert overlong_penalty(lengths, 100, 20).tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    assert overlong_penalty(lengths, 100, 0).tolist() == [0.0, 0.0, 0.0, 0.0, -1.0]
    torch.manual_seed(0)
    policy = TableBandit(8)
    ro = _bandit_rollout(policy, 8, seed=1)
    ro.terminated[0, [1, 5]] = False
    ro.truncated[0, [1, 5]] = True  # cut by the time limit
    ro.rewards[0, :, 0] = torch.tensor([1.0, 0, 0, 0, 0, 0, 1, 0])
    assert first_episode_truncated(ro).tolist() == [False, True, False, False, False, True, False, False]
    config = GRPOConfig(group_size=4, learning_rate=0.1, weight_decay=0.0, overlong="filter")
    before = policy.logits.detach().clone()
    m = grpo_update(policy, grpo_optimizer(policy, config), ro, config)
    assert m["truncated"] == 0.25 and m["samples"] == 6
    assert torch.equal(policy.logits[[1, 5]], before[[1, 5]])  # filtered out of the loss
    assert not torch.equal(policy.logits[0], before[0])
    # punish: every one-step episode is at a limit of 1 with a buffer of 1 -> -1 on every score
    config = GRPOConfig(group_size=4, overlong="punish", overlong_max_steps=1, overlong_buffer=1)
    m = grpo_update(policy, grpo_optimizer(policy, config), ro, config)
    assert m["score_mean"] == pytest.approx(0.25 - 1.0)
    with pytest.raises(ValueError, match="needs overlong_max_steps"):
        free = GRPOConfig(group_size=4, overlong="punish")
        grpo_update(policy, grpo_optimizer(policy, free), ro, free)


def test_grpo_target_kl_stops_the_update_early():
    torch.manual_seed(0)
    policy = TableBandit(8)
    ro = _bandit_rollout(policy, 8, seed=1)
    ro.rewards[0, :, 0] = torch.tensor([1.0, 0, 0, 0, 0, 1, 0, 0])
    config = GRPOConfig(group_size=4, learning_rate=0.5, weight_decay=0.0, n_epochs=20, target_kl=0.01)
    m = grpo_update(policy, grpo_optimizer(policy, config), ro, config)
    assert m["early_stop"] == 1.0 and 1 <= m["updates"] < 20
    free = GRPOConfig(group_size=4, learning_rate=0.5, weight_decay=0.0, n_epochs=20)
    policy = TableBandit(8)
    m = grpo_update(policy, grpo_optimizer(policy, free), ro, free)
    assert m["early_stop"] == 0.0 and m["updates"] == 20
    with pytest.raises(ValueError, match="target_kl must be > 0"):
        GRPOConfig(target_kl=0.0)
    # pg_coef 0 (and no self-imitation): nothing to minimize, the policy does not move
    policy = TableBandit(8)
    before = policy.logits.detach().clone()
    off = GRPOConfig(group_size=4, learning_rate=0.5, weight_decay=0.0, pg_coef=0.0)
    grpo_update(policy, grpo_optimizer(policy, off), ro, off)
    assert torch.equal(policy.logits, before)


def test_bad_updates_are_skipped_then_raise():
    policy = TableBandit(4, fail=True)
    config = PPOConfig(n_epochs=1, batch_size=4, max_bad_updates=3)
    guard = BadUpdateGuard(config.max_bad_updates)
    grpo_cfg = GRPOConfig(group_size=2, dynamic_sampling=False)
    ro = _bandit_rollout(TableBandit(4), 4, seed=0)
    ro.rewards[0] = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = grpo_update(policy, opt, ro, grpo_cfg, guard=guard)
        m = grpo_update(policy, opt, ro, grpo_cfg, guard=guard)
    assert m["skipped_updates"] == 1 and m["updates"] == 0 and guard.in_a_row == 2
    assert any("non-finite" in str(w.message) for w in caught)
    with pytest.raises(RuntimeError, match="3 updates in a row"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grpo_update(policy, opt, ro, grpo_cfg, guard=guard)
    assert config.max_bad_updates == 3


# ---------------------------------------------------------------------- collector
class Spy(gym.vector.VectorWrapper):
    """Records every step's info (to check final_obs bootstrap values)."""

    def __init__(self, env):
        super().__init__(env)
        self.infos = []

    def step(self, actions):
        out = super().step(actions)
        self.infos.append(out[4])
        return out


def _cartpole_policy(env, seed=0):
    torch.manual_seed(seed)
    policy = CategoricalPolicy(env.single_observation_space, env.single_action_space)
    policy.seed(seed)
    return policy


def _check_episodes_match_masks(ro: Rollout):
    """Own statistics: return and length = valid sub-steps between dones (CartPole: reward 1)."""
    for ep in ro.episodes:
        assert ep["return"] == ep["length"]
    assert len(ro.episodes) == int(ro.dones.sum())


def test_collector_next_step_marks_reset_transitions_invalid():
    env = gym.wrappers.vector.RecordEpisodeStatistics(gym.make_vec("CartPole-v1", 4, max_episode_steps=12))
    policy = _cartpole_policy(env)
    col = Collector(env, policy)
    assert col.autoreset_mode == AutoresetMode.NEXT_STEP
    col.reset(seed=0)
    ro = col.collect(40)
    T, N = 40, 4
    assert (
        ro.rewards.shape == (T, N, 1) and ro.log_probs.shape == (T, N, 1, 1) and ro.values.shape == (T, N, 1)
    )
    assert ro.replay["tokens"].shape[:2] == (T, N)
    done = ro.dones
    assert ro.truncated.any() and ro.terminated.any()
    for t in range(T):
        for i in range(N):
            after_done = t > 0 and bool(done[t - 1, i])
            assert bool(ro.valid[t, i, 0]) == (not after_done)
            if after_done:  # the reset transition: no reward, no done
                assert ro.rewards[t, i, 0] == 0 and not done[t, i]
            if ro.truncated[t, i]:  # bootstrap = V(obs after the done), from the next act call
                expected = ro.values[t + 1, i, 0] if t + 1 < T else ro.last_values[i, 0]
                assert ro.bootstrap_values[t, i] == pytest.approx(expected.item())
            else:
                assert ro.bootstrap_values[t, i] == 0
    # first episode: up to and including the first done
    for i in range(N):
        first = int(torch.nonzero(done[:, i])[0])
        assert ro.first_episode[: first + 1, i, 0].all() and not ro.first_episode[first + 1 :, i].any()
    _check_episodes_match_masks(ro)
    assert all(ep["return"] <= 12 for ep in ro.episodes)  # RecordEpisodeStatistics' r/l renamed
    # state carries over: an env that ended at the last step resets on the next call's first step
    ro2 = col.collect(3)
    assert torch.equal(~ro2.valid[0, :, 0], ro.dones[-1])
    assert episode_summary(ro.episodes)["episodes"] == len(ro.episodes)


def test_collector_same_step_bootstraps_from_final_obs():
    env = Spy(
        gym.make_vec(
            "CartPole-v1",
            4,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            max_episode_steps=10,
        )
    )
    policy = _cartpole_policy(env, seed=1)
    col = Collector(env, policy)
    col.reset(seed=1)
    ro = col.collect(30)
    assert ro.valid.all()  # every step is a decision
    assert ro.truncated.any()
    for t, i in torch.nonzero(ro.truncated).tolist():
        final = env.infos[t]["final_obs"][i]
        with torch.no_grad():
            expected = policy.value(final[None]).item()
        assert ro.bootstrap_values[t, i].item() == pytest.approx(expected, abs=1e-6)
    assert (ro.bootstrap_values[~ro.truncated] == 0).all()
    _check_episodes_match_masks(ro)
    assert all(ep["length"] <= 10 for ep in ro.episodes)
    # until_all_done: stop once each env finished an episode
    col.reset(seed=1)
    ro = col.collect(100, until_all_done=True)
    assert ro.dones.any(0).all() and not ro.dones[:-1].any(0).all()


def test_collector_disabled_resets_finished_envs_with_a_mask():
    env = gym.make_vec(
        "CartPole-v1",
        3,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED},
        max_episode_steps=8,
    )
    col = Collector(env, _cartpole_policy(env, seed=2))
    ro = col.collect(20)  # gymnasium's DISABLED asserts if a finished env were stepped
    assert ro.valid.all() and ro.truncated.any()
    assert (ro.bootstrap_values[ro.truncated] != 0).all()
    _check_episodes_match_masks(ro)


def test_collector_on_chunked_env_freezes_finished_envs_for_grpo():
    # CountingVectorEnv: K = 4, success (reward 1, terminated) when the position reaches the goal
    env = CountingVectorEnv(num_envs=4, chunk_size=4, autoreset_mode="Disabled")
    torch.manual_seed(0)
    policy = GaussianPolicy(env.single_observation_space, env.single_action_space, log_std_init=-1.0)
    with torch.no_grad():
        policy.mean_head.bias.fill_(1.0)  # walk forward
    policy.seed(0)
    col = Collector(env, policy, reset_finished=False)
    col.reset(seed=0, options={"initial_frames": [0, 0, 1, 4]})  # goals 3, 3, 4, 20
    ro = col.collect(5, until_all_done=True)
    assert ro.rewards.shape[1:] == (4, 4) and ro.log_probs.shape[2:] == (4, 2)
    assert ro.num_steps == 3  # goal 20 is truncated at the step limit (10 sub-steps)
    # goals 3 and 3: done in chunk 0 after 3 sub-steps; goal 4: done in chunk 0 after 4 sub-steps
    assert ro.valid[0].sum(-1).tolist() == [3, 3, 4, 4]
    assert not ro.valid[1:, :3].any()  # frozen after the done
    assert ro.valid[:, 3].sum().item() == 10 and bool(ro.truncated[2, 3])
    assert episode_scores(ro.rewards, ro.first_episode).tolist() == [1.0, 1.0, 1.0, 0.0]
    successes = {int(ep["env"]): ep["success"] for ep in ro.episodes}
    assert successes == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}
    # PPO on chunks: one value per chunk -> chunk time unit, element-level ratios
    config = PPOConfig(batch_size=4, n_epochs=2, time_unit="chunk", log_prob_level="element")
    shuffle = torch.Generator().manual_seed(0)
    m = ppo_update(policy, make_optimizer(policy, config), ro, config, generator=shuffle)
    assert m["updates"] > 0 and math.isfinite(m["loss"])
    # GRPO on groups of 2
    grpo_cfg = GRPOConfig(group_size=2)
    m = grpo_update(policy, grpo_optimizer(policy, grpo_cfg), ro, grpo_cfg)
    assert m["groups_kept"] == 0.5 and m["updates"] == 1 and math.isfinite(m["loss"])


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_collector_on_chunked_env_autoreset_modes(mode):
    env = CountingVectorEnv(num_envs=3, chunk_size=4, autoreset_mode=mode)
    torch.manual_seed(0)
    policy = GaussianPolicy(env.single_observation_space, env.single_action_space, log_std_init=-2.0)
    with torch.no_grad():
        policy.mean_head.bias.fill_(1.0)  # walk forward: success after `goal` sub-steps
    policy.seed(0)
    col = Collector(env, policy)
    col.reset(seed=0, options={"initial_frames": [1, 4, 0]})  # goals 4, 20 (truncated at 10), 3
    ro = col.collect(6)
    assert ro.valid[0].sum(-1).tolist() == [4, 4, 3]
    assert ro.terminated[0].tolist() == [True, False, True]
    assert ro.valid[:3, 1].sum().item() == 10 and bool(ro.truncated[2, 1])
    assert ro.valid[2, 1].tolist() == [True, True, False, False]
    reset_steps = ~ro.valid.any(-1)
    if mode == "NextStep":  # the chunk after a done only resets the env
        assert reset_steps[1, 0] and reset_steps[1, 2] and reset_steps[3, 1]
        assert ro.bootstrap_values[2, 1] == pytest.approx(ro.values[3, 1, 0].item())
    else:
        assert not reset_steps.any()
    assert ro.bootstrap_values[2, 1] != 0 and (ro.bootstrap_values[~ro.truncated] == 0).all()
    with torch.no_grad():  # V(final obs): position 10 of goal 20
        obs = {
            "image": np.full((1, 2, 2, 3), 10, np.uint8),
            "proprio": np.array([[10.0, 20.0]], np.float32),
            "instruction": ("walk 20 cells",),
        }
        assert ro.bootstrap_values[2, 1].item() == pytest.approx(policy.value(obs).item(), abs=1e-5)
    ended = {(int(ep["env"]), int(ep["step"])): (ep["success"], ep["length"]) for ep in ro.episodes}
    assert ended[0, 0] == (1.0, 4.0) and ended[2, 0] == (1.0, 3.0) and ended[1, 2] == (0.0, 10.0)


def test_collector_rejects_mismatched_actions():
    env = gym.make_vec("CartPole-v1", 2)
    policy = GaussianPolicy(env.single_observation_space, gym.spaces.Box(-1, 1, (3, 1)))
    with pytest.raises(ValueError, match=r"\[N, 1, 1\]"):
        Collector(env, policy).collect(1)


# ---------------------------------------------------------------------- PPO smoke run
@pytest.mark.slow
def test_ppo_learns_cartpole():
    env = gym.make_vec("CartPole-v1", 4)
    policy = _cartpole_policy(env, seed=0)
    config = PPOConfig(n_steps=128)
    optimizer = make_optimizer(policy, config)
    col = Collector(env, policy)
    col.reset(seed=0)
    shuffle = torch.Generator().manual_seed(0)
    lengths = []
    for _ in range(8):  # 4096 env steps
        ro = col.collect(config.n_steps)
        metrics = ppo_update(policy, optimizer, ro, config, generator=shuffle)
        assert math.isfinite(metrics["loss"]) and metrics["skipped_updates"] == 0
        assert metrics["updates"] == config.n_epochs * math.ceil(metrics["samples"] / config.batch_size)
        lengths.append(episode_summary(ro.episodes)["length"])
    assert max(lengths[-2:]) > 2 * lengths[0], lengths


def test_success_buffer_keeps_chosen_episodes_first_in_first_out():
    from trainers.self_imitation import SuccessBuffer, imitation_nll

    env = CountingVectorEnv(num_envs=4, chunk_size=4, autoreset_mode="Disabled")
    policy = GaussianPolicy(env.single_observation_space, env.single_action_space, log_std_init=-1.0)
    with torch.no_grad():
        policy.mean_head.bias.fill_(1.0)
    policy.seed(0)
    col = Collector(env, policy, reset_finished=False)
    col.reset(seed=0, options={"initial_frames": [0, 1, 4, 4]})  # goals 3, 4, 20, 20
    ro = col.collect(5, until_all_done=True)
    buf = SuccessBuffer(capacity=5)
    assert buf.add(ro, torch.tensor([True, False, False, False])) == 1  # one chunk-step: 3 sub-steps
    assert buf.valid.tolist() == [[True, True, True, False]]
    assert buf.add(ro, torch.tensor([False, False, True, False])) == 3  # 10 sub-steps = 3 chunks
    assert len(buf) == 4 and buf.valid.sum() == 13
    buf.add(ro, torch.tensor([False, True, False, True]))  # 1 + 3 more: the 3 oldest are dropped
    assert len(buf) == 5 and buf.valid[0].sum() == 2  # the last chunk of env 2 (10 = 4 + 4 + 2)
    replay, valid, weights = buf.sample(7, torch.Generator().manual_seed(0))
    assert valid.shape == (7, 4) and all(v.shape[0] == 7 for v in replay.values())
    assert torch.equal(weights, torch.ones(7))  # added without weights: weight 1
    nll = imitation_nll(policy.evaluate(replay).log_probs, valid)
    assert nll.ndim == 0 and torch.isfinite(nll)
    again = SuccessBuffer(5)
    again.load_state_dict(buf.state_dict())
    assert torch.equal(again.valid, buf.valid) and torch.equal(again.weights, buf.weights)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        SuccessBuffer(0)

    # each row carries its env's weight, and the weights go FIFO with the rows
    buf = SuccessBuffer(capacity=5)
    env_weights = torch.tensor([0.5, 2.0, 0.25, 0.0])
    assert buf.add(ro, torch.tensor([True, False, True, False]), env_weights) == 4  # 1 + 3 chunk-steps
    assert buf.weights.tolist() == [0.5, 0.25, 0.25, 0.25]  # env 0's chunk-step at t = 0 comes first
    buf.add(ro, torch.tensor([False, True, False, False]), env_weights)  # env 1: one chunk-step
    assert buf.weights.tolist() == [0.5, 0.25, 0.25, 0.25, 2.0]
    buf.add(ro, torch.tensor([False, True, False, False]), env_weights)  # again: env 0's row is dropped
    assert buf.weights.tolist() == [0.25, 0.25, 0.25, 2.0, 2.0] and buf.valid[0].sum() == 4
    assert (
        buf.sample(3, torch.Generator().manual_seed(1))[2].tolist()
        == buf.weights[buf.draw(3, torch.Generator().manual_seed(1))].tolist()
    )
    state = buf.state_dict()
    again = SuccessBuffer(5)
    again.load_state_dict(state)
    assert torch.equal(again.weights, buf.weights)
    # a buffer saved before rows had weights loads with weight 1 on every row, and says so
    old = SuccessBuffer(5)
    with pytest.warns(RuntimeWarning, match="without weights"):
        old.load_state_dict({"replay": state["replay"], "valid": state["valid"]})
    assert torch.equal(old.weights, torch.ones(5)) and torch.equal(old.valid, buf.valid)
    with pytest.raises(ValueError, match="3 weights for 5 rows"):
        old.load_state_dict({**state, "weights": torch.ones(3)})


def test_imitation_weights_are_clipped_group_advantages():
    # group 0: one success in 4 (mean 0.25, unbiased std 0.5); group 1: all equal; group 2: mean 0.5,
    # unbiased std sqrt(1/6), one episode above it, two at it
    scores = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 0.5, 0.5, 0, 1])
    w = imitation_weights(scores, 4)
    expected = [0.75 / (0.5 + 1e-6), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.5 / (math.sqrt(1 / 6) + 1e-6)]
    assert w.tolist() == pytest.approx(expected, rel=1e-6)
    assert imitation_weights(scores, 4, std="none").tolist() == [0.75, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.5]
    population = imitation_weights(scores, 4, std="population")
    assert population[0].item() == pytest.approx(0.75 / (math.sqrt(0.1875) + 1e-6), rel=1e-6)
    # the old behaviour: weight 1 on every episode above its group's mean
    assert imitation_weights(scores, 4, baseline=False).tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    # a group of one is its own baseline; scores equal up to float noise weigh nothing
    assert imitation_weights(torch.tensor([1.0, 0.0, 3.0]), 1).tolist() == [0, 0, 0]
    assert imitation_weights(torch.full((8,), 0.1), 8).tolist() == [0.0] * 8


def test_imitation_nll_is_the_weighted_sum_over_the_element_count():
    from trainers.self_imitation import imitation_nll

    log_probs = torch.tensor([[[-1.0, -3.0], [-9.0, -9.0]], [[-2.0, -2.0], [-3.0, -1.0]]])  # [B=2, K=2, E=2]
    valid = torch.tensor([[True, False], [True, True]])  # 6 executed elements
    w = torch.tensor([0.5, 2.0])
    # (0.5 * (1 + 3) + 2 * (2 + 2 + 3 + 1)) / 6: divided by the element count, not by the weights
    assert imitation_nll(log_probs, valid, weights=w).item() == pytest.approx(18.0 / 6)
    assert imitation_nll(log_probs, valid, torch.tensor(12.0), w).item() == pytest.approx(18.0 / 12)
    assert imitation_nll(log_probs, valid).item() == pytest.approx(12.0 / 6)  # no weights: the mean
    ones = imitation_nll(log_probs, valid, weights=torch.ones(2))
    assert ones.item() == imitation_nll(log_probs, valid).item()
    # the scale does not depend on the batch size: the same rows twice give the same loss
    twice = imitation_nll(log_probs.repeat(2, 1, 1), valid.repeat(2, 1), weights=w.repeat(2))
    assert twice.item() == pytest.approx(18.0 / 6)
    lp = log_probs.clone().requires_grad_(True)
    imitation_nll(lp, valid, weights=torch.zeros(2)).backward()
    assert imitation_nll(log_probs, valid, weights=torch.zeros(2)).item() == 0.0 and not lp.grad.any()


@pytest.mark.parametrize("baseline", [True, False])
def test_grpo_self_imitation_weighs_by_the_stored_advantage(baseline):
    from trainers.self_imitation import SuccessBuffer

    torch.manual_seed(0)
    policy = TableBandit(8)
    ro = _bandit_rollout(policy, 8, seed=1)
    ro.rewards[0, :, 0] = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])  # group 1: all equal
    scores = episode_scores(ro.rewards, ro.first_episode)
    weights = imitation_weights(scores, 4, baseline=baseline)
    buf = SuccessBuffer(10)
    assert buf.add(ro, weights > 0, weights) == 1  # env 0 only: the all-equal group adds nothing
    stored = 0.75 / (0.5 + 1e-6) if baseline else 1.0
    assert buf.weights.tolist() == pytest.approx([stored])
    config = GRPOConfig(group_size=4, learning_rate=0.1, weight_decay=0.0, pg_coef=0.0, sil_coef=1.0)
    before = policy.logits.detach().clone()
    m = grpo_update(policy, grpo_optimizer(policy, config), ro, config, sil=buf)
    # one minibatch, every drawn row env 0's step, at logits 0: -log p = log 2
    assert m["sil_loss"] == pytest.approx(stored * math.log(2), rel=1e-6)
    assert not torch.equal(policy.logits[0], before[0]) and torch.equal(policy.logits[1:], before[1:])
    # nothing but all-equal groups: nothing stored, nothing imitated
    ro.rewards[0, :, 0] = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0])
    weights = imitation_weights(episode_scores(ro.rewards, ro.first_episode), 4, baseline=baseline)
    assert not weights.any() and SuccessBuffer(10).add(ro, weights > 0, weights) == 0
