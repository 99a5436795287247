"""Small policies: shapes, act -> evaluate consistency, learning signal, and the reference formulas
(OpenVLA bins and un-normalization, flow-matching SDE / CPS transitions, tanh Jacobian)."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from nets.errors import BadInput
from policies import (
    ActionChunk,
    ActionChunkPolicy,
    BinnedPolicy,
    CategoricalPolicy,
    FlowPolicy,
    GaussianPolicy,
    PolicyEval,
    make_torso,
)
from policies.binned import (
    bin_centers,
    normalized_to_tokens,
    tokens_to_normalized,
    unnormalize,
)
from policies.flow import (
    OUTCOMES,
    FlowSampling,
    flow_mean_std,
    flow_timesteps,
    gaussian_log_prob,
    sde_sigma_ratios,
)
from policies.torsos import instruction_tokens, obs_from_replay


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: a single intra-op thread avoids OpenMP spin-waits on busy machines
    (10x slower with 2 threads when the cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


B = 4
VEC_SPACE = spaces.Box(-np.inf, np.inf, (5,), np.float32)
DICT_SPACE = spaces.Dict(
    {
        "image": spaces.Box(0, 255, (32, 32, 3), np.uint8),
        "proprio": spaces.Box(-10, 10, (3,), np.float32),
        "instruction": spaces.Text(64),
    }
)
CHUNK_BOX = spaces.Box(-1.0, 1.0, (3, 2), np.float32)  # K=3, D=2
TORSO = {"image_channels": (8, 8), "image_features": 16}


def _obs(space: spaces.Space, n: int = B, seed: int = 0):
    rng = np.random.default_rng(seed)
    if isinstance(space, spaces.Dict):
        return {
            "image": rng.integers(0, 256, (n, *space["image"].shape), dtype=np.uint8),
            "proprio": rng.standard_normal((n, 3)).astype(np.float32),
            "instruction": tuple(
                ["put the bowl on the plate", "Open the drawer.", "", "pick up the mug"][:n]
            ),
        }
    return rng.standard_normal((n, *space.shape)).astype(np.float32)


# name -> (factory, observation space); each factory builds a fresh policy
POLICIES = {
    "gaussian": (lambda: GaussianPolicy(VEC_SPACE, spaces.Box(-2, 2, (2,), np.float32)), VEC_SPACE),
    "gaussian_squash_chunk_dict": (
        lambda: GaussianPolicy(DICT_SPACE, CHUNK_BOX, squash=True, log_std_init=-0.5, torso_kwargs=TORSO),
        DICT_SPACE,
    ),
    "gaussian_shared": (lambda: GaussianPolicy(VEC_SPACE, CHUNK_BOX, share_torso=True), VEC_SPACE),
    "categorical": (lambda: CategoricalPolicy(VEC_SPACE, spaces.Discrete(3, start=1)), VEC_SPACE),
    "categorical_multi_chunk": (
        lambda: CategoricalPolicy(VEC_SPACE, spaces.MultiDiscrete([[3, 5], [2, 4]])),
        VEC_SPACE,
    ),
    "binned": (
        lambda: BinnedPolicy(DICT_SPACE, CHUNK_BOX, temperature=1.6, top_k=50, torso_kwargs=TORSO),
        DICT_SPACE,
    ),
    "flow_sde": (
        lambda: FlowPolicy(VEC_SPACE, CHUNK_BOX, num_steps=4, velocity_hidden=(32, 32)),
        VEC_SPACE,
    ),
    "flow_cps_ignore_last": (
        lambda: FlowPolicy(
            DICT_SPACE,
            CHUNK_BOX,
            num_steps=3,
            noise_method="flow_cps",
            ignore_last=True,
            velocity_hidden=(32,),
            torso_kwargs=TORSO,
        ),
        DICT_SPACE,
    ),
    "flow_noise_joint": (
        lambda: FlowPolicy(
            VEC_SPACE,
            CHUNK_BOX,
            num_steps=3,
            noise_method="flow_noise",
            joint_logprob=True,
            velocity_hidden=(32,),
        ),
        VEC_SPACE,
    ),
    "flow_sde_joint_no_critic": (
        lambda: FlowPolicy(
            VEC_SPACE, CHUNK_BOX, num_steps=2, joint_logprob=True, velocity_hidden=(32,), use_critic=False
        ),
        VEC_SPACE,
    ),
}


@pytest.fixture(params=sorted(POLICIES))
def case(request):
    factory, space = POLICIES[request.param]
    torch.manual_seed(0)
    policy = factory()
    policy.seed(0)
    return request.param, policy, space


# ---------------------------------------------------------------------------------- every policy
def test_shapes_and_act_evaluate_consistency(case):
    name, policy, space = case
    assert isinstance(policy, ActionChunkPolicy)
    k, d, e = policy.chunk_size, policy.action_dim, policy.log_prob_dim
    out = policy.act(_obs(space))
    assert isinstance(out, ActionChunk)
    assert out.actions.shape == (B, k, d) and out.actions.dtype == torch.float32
    assert out.log_probs.shape == (B, k, e)
    assert torch.isfinite(out.log_probs).all()
    assert all(v.shape[0] == B for v in out.replay.values())
    ev = policy.evaluate(out.replay)
    assert isinstance(ev, PolicyEval)
    torch.testing.assert_close(ev.log_probs, out.log_probs, rtol=0, atol=1e-6)
    if ev.entropy is not None:
        assert ev.entropy.shape == (B, k, e)
    if "no_critic" in name:
        assert out.value is None and ev.value is None
    else:
        assert out.value.shape == (B, 1)
        torch.testing.assert_close(ev.value, out.value)
        torch.testing.assert_close(policy.value(_obs(space)), out.value)


def test_evaluate_on_replays_from_several_calls(case):
    """The trainer concatenates replays of different act() calls (different flow step k)."""
    _, policy, space = case
    outs = [policy.act(_obs(space, seed=s)) for s in range(3)]
    replay = {key: torch.cat([o.replay[key] for o in outs]) for key in outs[0].replay}
    ev = policy.evaluate(replay)
    torch.testing.assert_close(ev.log_probs, torch.cat([o.log_probs for o in outs]), rtol=0, atol=1e-5)


def test_gradient_step_changes_log_probs(case):
    _, policy, space = case
    out = policy.act(_obs(space))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    ev = policy.evaluate(out.replay)
    loss = -ev.log_probs.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    after = policy.evaluate(out.replay).log_probs
    assert (after - out.log_probs).abs().max() > 1e-4
    assert after.sum() > out.log_probs.sum()  # the step made the samples more likely


def test_deterministic_act_and_seeding(case):
    _, policy, space = case
    obs = _obs(space)
    policy.seed(1)
    first = policy.act(obs, deterministic=True)
    policy.seed(1)
    second = policy.act(obs, deterministic=True)
    assert first.log_probs is None
    torch.testing.assert_close(first.actions, second.actions, rtol=0, atol=0)
    policy.seed(2)
    a = policy.act(obs)
    policy.seed(2)
    b = policy.act(obs)
    torch.testing.assert_close(a.actions, b.actions, rtol=0, atol=0)
    torch.testing.assert_close(a.log_probs, b.log_probs, rtol=0, atol=0)


def test_deterministic_is_the_mode_without_seeding():
    torch.manual_seed(0)
    x = _obs(VEC_SPACE)
    for policy in (
        GaussianPolicy(VEC_SPACE, CHUNK_BOX),
        CategoricalPolicy(VEC_SPACE, spaces.Discrete(4)),
        BinnedPolicy(VEC_SPACE, CHUNK_BOX),
        FlowPolicy(VEC_SPACE, CHUNK_BOX, num_steps=2, velocity_hidden=(16,), deterministic_init="zeros"),
    ):
        torch.testing.assert_close(policy.act(x, True).actions, policy.act(x, True).actions, rtol=0, atol=0)
    gaussian = GaussianPolicy(VEC_SPACE, CHUNK_BOX)
    mean = gaussian.mean_head(gaussian.torso(x)).reshape(B, 3, 2)
    torch.testing.assert_close(gaussian.act(x, deterministic=True).actions, mean)


# ---------------------------------------------------------------------------------- torsos
def test_torso_dict_image_proprio_instruction():
    space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (64, 64, 3), np.uint8),
            "wrist_image": spaces.Box(0, 255, (64, 64, 3), np.uint8),
            "proprio": spaces.Box(-1, 1, (8,), np.float32),
            "instruction": spaces.Text(512),
        }
    )
    torso = make_torso(space, hidden_sizes=(32,), instruction_dim=8, num_buckets=4096)
    rng = np.random.default_rng(0)
    obs = {
        "image": rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8),
        "wrist_image": rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8),
        "proprio": rng.standard_normal((2, 8)).astype(np.float32),
        "instruction": ("Pick up the black bowl.", "pick UP the   black, bowl"),
    }
    prepared = torso.prepare(obs)
    assert prepared["image"].dtype == torch.uint8 and prepared["proprio"].dtype == torch.float32
    assert prepared["instruction"].shape == (2, 32) and prepared["instruction"].dtype == torch.long
    # same words after lowercasing and stripping punctuation -> same ids; fixed values prove that the
    # hash is stable across processes (crc32, not Python's salted hash)
    expected = [3334, 2051, 634, 782, 2382]
    assert prepared["instruction"][0, :5].tolist() == expected
    assert prepared["instruction"][1, :5].tolist() == expected
    assert prepared["instruction"][:, 5:].eq(0).all()
    assert expected[0] == 1 + zlib.crc32(b"pick") % 4095
    features = torso(obs)
    assert features.shape == (2, torso.out_dim) == (2, 32)
    torch.testing.assert_close(torso(prepared), features)  # prepare is idempotent
    # the instruction changes the features; an empty one embeds to zeros
    other = dict(obs, instruction=("open the drawer", ""))
    assert not torch.allclose(torso(other), features)
    assert torso.encoders["instruction"](torso.prepare(other)["instruction"])[1].eq(0).all()


def test_torso_vector_and_image_sizes():
    torso = make_torso(spaces.Box(-1, 1, (4,), np.float32))
    assert torso(np.zeros((3, 4))).shape == (3, 64)
    assert torso(torch.zeros(3, 4, dtype=torch.float64)).dtype == torch.float32
    for size in (64, 128):
        image_torso = make_torso(spaces.Box(0, 255, (size, size, 3), np.uint8), hidden_sizes=())
        assert image_torso(np.zeros((2, size, size, 3), np.uint8)).shape == (2, image_torso.out_dim)
    discrete = make_torso(spaces.Discrete(5), hidden_sizes=(8,))
    assert discrete(np.array([0, 4])).shape == (2, 8)
    assert instruction_tokens("a b c d", 16, 2) == instruction_tokens("A b", 16, 32)


def test_instruction_batch_tokenizes_each_row():
    """A batch that repeats instructions (tokenized once each) gives every row its own ids."""
    from policies.torsos import InstructionEmbedding

    bag = InstructionEmbedding(num_buckets=64, max_tokens=4)
    texts = np.array(["put the bowl", "open it", "put the bowl", "", "open it now please, ok"])
    ids = bag.tokenize(texts)
    assert ids.shape == (5, 4) and ids.dtype == torch.long
    for row, text in zip(ids.tolist(), texts):
        expected = instruction_tokens(text, 64, 4)
        assert row == expected + [0] * (4 - len(expected))
    assert bag.tokenize("open it").tolist() == ids[1:2].tolist()


def test_obs_norm_merges_batches_and_standardises_every_torso():
    policy = GaussianPolicy(VEC_SPACE, CHUNK_BOX, torso_kwargs={"obs_norm": "running"})
    assert policy.obs_norm == "running" and policy.obs_stats_count() == 0
    obs = _obs(VEC_SPACE, n=4)
    before = policy.act(obs, deterministic=True).actions  # identity statistics: raw features
    x1, x2 = torch.randn(7, 5) * 3 + 2, torch.randn(11, 5)
    policy.update_obs_stats(x1)
    policy.update_obs_stats(x2.numpy())
    both = torch.cat([x1, x2]).double()
    for torso in (policy.torso, policy.critic_torso):
        encoder = torso.encoders["obs"]
        torch.testing.assert_close(encoder.norm_mean, both.mean(0))
        torch.testing.assert_close(encoder.norm_var, both.var(0, unbiased=False))
        assert int(encoder.norm_count) == 18
        x = torch.randn(3, 5) * 100
        expected = ((x - both.mean(0)) / torch.sqrt(both.var(0, unbiased=False) + 1e-8)).clamp(-10, 10)
        torch.testing.assert_close(encoder(x), expected.float())
    after = policy.act(obs, deterministic=True).actions
    assert not torch.allclose(before, after)
    reloaded = GaussianPolicy(VEC_SPACE, CHUNK_BOX, torso_kwargs={"obs_norm": "fixed"})
    reloaded.load_state_dict(policy.state_dict())  # statistics are saved with the policy
    torch.testing.assert_close(reloaded.act(obs, deterministic=True).actions, after)
    plain = GaussianPolicy(VEC_SPACE, CHUNK_BOX)
    assert plain.obs_norm == "off" and not any("norm_" in k for k in plain.state_dict())
    plain.update_obs_stats(x1)  # a no-op
    assert plain.obs_stats_count() == 0
    with pytest.raises(ValueError, match="obs_norm must be one of"):
        GaussianPolicy(VEC_SPACE, CHUNK_BOX, torso_kwargs={"obs_norm": "yes"})
    with pytest.raises(ValueError, match="NaN or infinite"):
        policy.update_obs_stats(torch.full((2, 5), float("nan")))
    assert int(policy.torso.encoders["obs"].norm_count) == 18  # a refused batch changes nothing


def test_fold_standardisation_keeps_the_function_of_a_raw_policy():
    torch.manual_seed(0)
    policy = GaussianPolicy(DICT_SPACE, CHUNK_BOX, torso_kwargs=TORSO)  # image, proprio, text: offsets
    obs = _obs(DICT_SPACE)
    obs["proprio"] = (np.random.default_rng(1).normal(size=(B, 3)) * [50.0, 0.02, 0.0] + [80, 1, 3]).astype(
        np.float32
    )  # a step counter, a fine position, a constant
    before = policy.act(obs, deterministic=True).actions
    policy.fold_standardisation({"proprio": obs["proprio"]})
    assert policy.obs_norm == "fixed"
    encoder = policy.torso.encoders["proprio"]
    std = torch.sqrt(encoder.norm_var)
    assert std[0] > 10 and 0.01 <= std[1] < 0.03 and std[2] == pytest.approx(0.01)  # floored
    torch.testing.assert_close(policy.act(obs, deterministic=True).actions, before, atol=1e-5, rtol=1e-5)
    reloaded = GaussianPolicy(DICT_SPACE, CHUNK_BOX, torso_kwargs={**TORSO, "obs_norm": "fixed"})
    reloaded.load_state_dict(policy.state_dict())
    torch.testing.assert_close(reloaded.act(obs, deterministic=True).actions, before, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="needs a torso with obs_norm 'off', got 'fixed'"):
        policy.fold_standardisation({"proprio": obs["proprio"]})
    with pytest.raises(ValueError, match="no 'proprio' in the observations"):
        GaussianPolicy(DICT_SPACE, CHUNK_BOX, torso_kwargs=TORSO).fold_standardisation({})
    with pytest.raises(ValueError, match="needs a trunk with hidden layers"):
        GaussianPolicy(VEC_SPACE, CHUNK_BOX, hidden_sizes=()).fold_standardisation(obs["proprio"])


def test_replay_round_trips_the_prepared_observation():
    policy = GaussianPolicy(DICT_SPACE, CHUNK_BOX, torso_kwargs=TORSO)
    out = policy.act(_obs(DICT_SPACE))
    obs = obs_from_replay(out.replay)
    assert set(obs) == {"image", "proprio", "instruction"}
    torch.testing.assert_close(policy.value(obs), out.value)


# ---------------------------------------------------------------------------------- Gaussian
def test_gaussian_sb3_layout():
    policy = GaussianPolicy(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-2, 2, (1,), np.float32))
    assert policy.chunk_size == 1 and policy.action_dim == 1 and policy.log_prob_dim == 1
    assert policy.log_std.shape == (1,) and policy.log_std.eq(0).all()
    assert [m.out_features for m in policy.torso.trunk if isinstance(m, torch.nn.Linear)] == [64, 64]
    assert policy.critic_torso is not None
    assert policy.mean_head.weight.norm().item() == pytest.approx(0.01, rel=1e-4)
    assert policy.value_head.weight.norm().item() == pytest.approx(1.0, rel=1e-4)
    assert policy.mean_head.bias.eq(0).all()
    out = policy.act(np.zeros((1, 3)))
    dist = Normal(policy.mean_head(policy.torso(np.zeros((1, 3)))), 1.0)
    torch.testing.assert_close(out.log_probs[:, 0], dist.log_prob(out.actions[:, 0]))


def test_gaussian_unsquashed_actions_are_not_clipped():
    policy = GaussianPolicy(VEC_SPACE, spaces.Box(-0.01, 0.01, (2,), np.float32), log_std_init=1.0)
    actions = policy.act(_obs(VEC_SPACE, n=64)).actions
    assert actions.abs().max() > 0.01


def test_gaussian_tanh_jacobian_against_transformed_distribution():
    low, high = np.array([-1.0, 0.0], np.float32), np.array([1.0, 4.0], np.float32)
    policy = GaussianPolicy(
        VEC_SPACE,
        spaces.Box(low, high, (2,), np.float32),
        squash=True,
        log_std_init=-0.3,
        saturated_slope=0.0,
    )
    out = policy.act(_obs(VEC_SPACE))
    assert (out.actions >= torch.as_tensor(low)).all() and (out.actions <= torch.as_tensor(high)).all()
    mean = policy.mean_head(policy.torso(_obs(VEC_SPACE))).reshape(B, 1, 2)
    base = Normal(mean, math.exp(-0.3))
    center, scale = torch.tensor([0.0, 2.0]), torch.tensor([1.0, 2.0])
    squashed = TransformedDistribution(base, [TanhTransform(), AffineTransform(center, scale)])
    torch.testing.assert_close(out.log_probs, squashed.log_prob(out.actions), atol=2e-4, rtol=1e-4)
    # exact hand computation from the stored pre-tanh sample
    u = out.replay["raw_action"]
    by_hand = base.log_prob(u) - torch.log(scale * (1 - torch.tanh(u) ** 2))
    torch.testing.assert_close(out.log_probs, by_hand, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.actions, center + scale * torch.tanh(u))


def test_gaussian_squash_needs_finite_bounds():
    with pytest.raises(ValueError):
        GaussianPolicy(VEC_SPACE, spaces.Box(-np.inf, np.inf, (2,), np.float32), squash=True)


def test_gaussian_log_std_bounds_clamp_what_is_used():
    """The stored parameter keeps its value (BC weights load unchanged); the std used is clamped."""
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    policy = GaussianPolicy(VEC_SPACE, box, log_std_bounds=(-3.0, -1.5))
    with torch.no_grad():
        policy.log_std.copy_(torch.tensor([-5.0, -2.0, 0.0]))
    out = policy.act(_obs(VEC_SPACE))
    mean = policy.mean_head(policy.torso(_obs(VEC_SPACE))).reshape(B, 1, 3)
    expected = Normal(mean, torch.tensor([-3.0, -2.0, -1.5]).exp()).log_prob(out.replay["raw_action"])
    torch.testing.assert_close(out.log_probs, expected, atol=1e-5, rtol=1e-5)
    assert policy.log_std.tolist() == [-5.0, -2.0, 0.0]
    with pytest.raises(ValueError, match="low <= high"):
        GaussianPolicy(VEC_SPACE, box, log_std_bounds=(-1.0, -2.0))


def test_gaussian_log_std_bounds_pass_the_gradient_back_inside():
    """A clamped log-std still learns toward its range (a clone's std above the bound can shrink);
    the gradient that would push it further out is blocked, as plain clamp blocks every one."""
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    policy = GaussianPolicy(VEC_SPACE, box, log_std_bounds=(-3.0, -1.5))
    with torch.no_grad():
        policy.log_std.copy_(torch.tensor([-5.0, -2.0, 0.0]))
    features = policy.torso(_obs(VEC_SPACE))
    for sign, passed in ((1.0, [0.0, 1.0, 1.0]), (-1.0, [1.0, 1.0, 0.0])):
        policy.zero_grad()
        (sign * policy._mean_log_std(features)[1][0, 0]).sum().backward()
        assert policy.log_std.grad.tolist() == [sign * p for p in passed]
    # a descent step on the std brings the value above the bound back into the range
    optimizer = torch.optim.SGD([policy.log_std], lr=1.0)
    for _ in range(3):
        optimizer.zero_grad()
        policy._mean_log_std(features)[1].sum().backward()
        optimizer.step()
    assert policy.log_std[2] < -1.5 and policy._mean_log_std(features)[1][0, 0, 2] < -1.5


def test_gaussian_saturated_squashed_elements_are_not_charged():
    """Squashed: a sample whose tanh slope is below ``saturated_slope`` gets log-prob 0 in ``act`` and
    ``evaluate`` (so no policy gradient), the others their full density; ``rsample`` keeps all."""
    box = spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = GaussianPolicy(VEC_SPACE, box, squash=True, log_std_init=-1.0)
    full = GaussianPolicy(VEC_SPACE, box, squash=True, log_std_init=-1.0, saturated_slope=0.0)
    with torch.no_grad():
        policy.mean_head.bias.copy_(torch.tensor([6.0, 0.0]))  # dimension 0 saturated
    full.load_state_dict(policy.state_dict())
    obs = _obs(VEC_SPACE, n=32)
    out = policy.act(obs)
    u = out.replay["raw_action"]
    saturated = (1 - torch.tanh(u) ** 2) < policy.saturated_slope
    assert saturated[..., 0].all() and not saturated[..., 1].any()
    full_log_probs = full.evaluate(out.replay).log_probs
    assert out.log_probs[..., 0].eq(0).all()
    torch.testing.assert_close(out.log_probs[..., 1], full_log_probs[..., 1])
    evaluated = policy.evaluate(out.replay).log_probs
    torch.testing.assert_close(evaluated, out.log_probs)
    evaluated.sum().backward()
    assert policy.mean_head.bias.grad[0] == 0 and policy.mean_head.bias.grad[1] != 0
    assert policy.rsample(obs)[1][..., 0].ne(0).all()
    with pytest.raises(ValueError, match="saturated_slope"):
        GaussianPolicy(VEC_SPACE, box, squash=True, saturated_slope=1.0)


# ---------------------------------------------------------------------------------- categorical
def test_categorical_discrete_and_multidiscrete():
    policy = CategoricalPolicy(VEC_SPACE, spaces.Discrete(3, start=1))
    assert (policy.chunk_size, policy.action_dim, policy.log_prob_dim) == (1, 1, 1)
    out = policy.act(_obs(VEC_SPACE, n=64))
    assert set(out.actions.unique().tolist()) <= {1.0, 2.0, 3.0}
    torch.testing.assert_close(out.actions, out.replay["tokens"].float() + 1)
    ev = policy.evaluate(out.replay)
    torch.testing.assert_close(ev.entropy, torch.full_like(ev.entropy, math.log(3)), atol=1e-3, rtol=0)

    multi = CategoricalPolicy(VEC_SPACE, spaces.MultiDiscrete([[3, 5], [2, 4]]))
    out = multi.act(_obs(VEC_SPACE, n=64))
    assert out.actions.shape == (64, 2, 2)
    assert (out.actions < torch.tensor([[3, 5], [2, 4]])).all()  # masked choices never drawn
    ev = multi.evaluate(out.replay)
    expected = torch.log(torch.tensor([[3.0, 5.0], [2.0, 4.0]])).expand(64, 2, 2)
    torch.testing.assert_close(ev.entropy, expected, atol=1e-3, rtol=0)


# ---------------------------------------------------------------------------------- binned
def test_bins_token_mapping_and_unnormalization_by_hand():
    centers = bin_centers(256).double()
    assert centers.shape == (255,)
    torch.testing.assert_close(centers, -1 + (2 * torch.arange(255).double() + 1) / 255, atol=1e-6, rtol=0)
    tokens = torch.tensor([0, 1, 2, 128, 254, 255])
    # OpenVLA: id = 31744 + j, a_norm = centers[clip(32000 - id - 1, 0, 254)]
    expected = torch.tensor(
        [1 - 1 / 255, 1 - 1 / 255, -1 + 507 / 255, -1 + 255 / 255, -1 + 3 / 255, -1 + 1 / 255]
    )
    torch.testing.assert_close(tokens_to_normalized(tokens).double(), expected.double(), atol=1e-6, rtol=0)
    # inverse (OpenVLA ActionTokenizer): id = 32000 - digitize(clip(a, -1, 1), bins)
    a = torch.tensor([1.0, -1.0, 0.0, 2.0, 0.5])
    edges = np.linspace(-1, 1, 256).astype(np.float32)
    expected_tokens = 256 - np.digitize(np.clip(a.numpy(), -1, 1), edges)
    assert normalized_to_tokens(a).tolist() == expected_tokens.tolist() == [0, 255, 128, 0, 64]
    # round trips: tokens 1..255 exactly; any a lands on the center of its bin
    j = torch.arange(1, 256)
    assert torch.equal(normalized_to_tokens(tokens_to_normalized(j)), j)
    a = torch.rand(1000) * 2 - 1
    assert (tokens_to_normalized(normalized_to_tokens(a)) - a).abs().max() <= 1 / 255 + 1e-6
    # un-normalization with a pass-through gripper dim
    q01, q99 = torch.tensor([-0.5, 0.0, -1.0]), torch.tensor([0.5, 2.0, 1.0])
    mask = torch.tensor([True, True, False])
    x = torch.tensor([[-1.0, 0.5, 0.3]])
    by_hand = torch.tensor([[-0.5, 0.75 * 2.0, 0.3]])
    torch.testing.assert_close(unnormalize(x, q01, q99, mask), by_hand, atol=1e-6, rtol=0)


def test_binned_policy_actions_temperature_and_top_k():
    q01, q99 = [-0.5, 0.0], [0.5, 2.0]
    policy = BinnedPolicy(
        VEC_SPACE, CHUNK_BOX, q01=q01, q99=q99, mask=[True, False], temperature=1.6, top_k=5
    )
    with torch.no_grad():  # sharper logits so that top-k matters
        policy.logits_head.weight.mul_(300)
    obs = _obs(VEC_SPACE)
    out = policy.act(obs)
    tokens = out.replay["tokens"]
    a_norm = -1 + (2 * (255 - tokens).clamp(0, 254).double() + 1) / 255
    expected = torch.stack([0.5 * (a_norm[..., 0] + 1) * 1.0 - 0.5, a_norm[..., 1]], dim=-1)
    torch.testing.assert_close(out.actions.double(), expected, atol=1e-5, rtol=0)
    logits = policy.logits(policy.torso(obs)).detach()
    top5 = logits.topk(5, dim=-1).indices
    assert (top5 == tokens[..., None]).any(-1).all()
    # independent tempered top-k distribution
    tempered = (logits / 1.6).masked_fill(logits < logits.topk(5, dim=-1).values[..., -1:], -math.inf)
    reference = torch.distributions.Categorical(logits=tempered)
    ev = policy.evaluate(out.replay)
    torch.testing.assert_close(ev.log_probs, reference.log_prob(tokens), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ev.entropy, reference.entropy(), atol=1e-5, rtol=1e-5)
    # a later temperature change does not change how stored samples are scored
    policy.temperature = 0.5
    torch.testing.assert_close(policy.evaluate(out.replay).log_probs, out.log_probs)


# ---------------------------------------------------------------------------------- flow
# per step: SDE noise levels, SDE stds and CPS stds, worked by hand from policies/flow.py (a = 0.5)
FLOW_TABLE = {
    5: (
        [1.118, 1.0, 0.6124, 0.4082, 0.25],
        [0.5, 0.4472, 0.2739, 0.1826, 0.1118],
        [0.5657, 0.4243, 0.2828, 0.1414, 0],
    ),
    3: ([0.866, 0.7071, 0.3536], [0.5, 0.4082, 0.2041], [0.4714, 0.2357, 0]),
}


@pytest.mark.parametrize("n", sorted(FLOW_TABLE))
def test_flow_sigma_and_std_reference_table(n):
    sigmas, sde_stds, cps_stds = (torch.tensor(v) for v in FLOW_TABLE[n])
    t = flow_timesteps(n)
    torch.testing.assert_close(t, torch.linspace(1, 0, n + 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(0.5 * sde_sigma_ratios(n), sigmas, atol=1e-3, rtol=0)
    x, v = torch.zeros(n, 1), torch.zeros(n, 1)
    t_i, delta = t[:-1, None], (t[:-1] - t[1:])[:, None]
    _, std = flow_mean_std(x, v, t_i, delta, "flow_sde", 0.5, sigma=0.5 * sde_sigma_ratios(n)[:, None])
    torch.testing.assert_close(std[:, 0], sde_stds, atol=1e-3, rtol=0)
    _, std = flow_mean_std(x, v, t_i, delta, "flow_cps", 0.5)
    torch.testing.assert_close(std[:, 0], cps_stds, atol=1e-3, rtol=0)


def test_flow_zero_noise_level_reduces_to_ode():
    x, v = torch.randn(4, 3, 2), torch.randn(4, 3, 2)
    t, delta = torch.tensor(0.75), torch.tensor(0.25)
    ode_mean, ode_std = flow_mean_std(x, v, t, delta, "flow_ode")
    torch.testing.assert_close(ode_mean, x - delta * v)
    assert ode_std.eq(0).all()
    for method in ("flow_sde", "flow_cps"):
        mean, std = flow_mean_std(x, v, t, delta, method, 0.0, sigma=0.0)
        torch.testing.assert_close(mean, ode_mean)
        assert std.eq(0).all()
    assert gaussian_log_prob(x, x + 1, torch.zeros_like(x)).eq(0).all()


def _context_and_step(policy, replay, k):
    context = policy.torso(obs_from_replay(replay))
    t, t_next = policy.timesteps[k].item(), policy.timesteps[k + 1].item()
    x = replay["chains"][:, k]
    v, _ = policy.velocity(x, torch.full((x.shape[0],), t), context)
    return x, v, t, t - t_next


@pytest.mark.parametrize("method", ["flow_sde", "flow_cps"])
def test_flow_log_probs_match_independent_gaussian_densities(method):
    a, n = 0.7, 4
    policy = FlowPolicy(
        VEC_SPACE, CHUNK_BOX, num_steps=n, noise_method=method, noise_level=a, velocity_hidden=(32,)
    )
    policy.seed(0)
    seen = set()
    with torch.no_grad():
        for call in range(12):
            out = policy.act(_obs(VEC_SPACE, seed=call))
            inds = out.replay["denoise_inds"]
            k = int(inds[0, 0])
            assert inds.eq(k).all()
            seen.add(k)
            x, v, t, delta = _context_and_step(policy, out.replay, k)
            t_next = t - delta
            if method == "flow_sde":  # Flow-GRPO form of the mean, sigma from the formula by hand
                sigma = a * math.sqrt(t / (1 - (t if t < 1 else 1 - 1 / n)))
                mean = x - delta * (v + sigma**2 / (2 * t) * (x + (1 - t) * v))
                std = math.sqrt(delta) * sigma
            else:
                mean = (1 - t_next) * (x - t * v) + t_next * math.cos(math.pi * a / 2) * (x + (1 - t) * v)
                std = t_next * math.sin(math.pi * a / 2)
            chains = out.replay["chains"]
            if std == 0:
                assert out.log_probs.eq(0).all()
            else:
                expected = Normal(mean, std).log_prob(chains[:, k + 1])
                torch.testing.assert_close(out.log_probs, expected, atol=1e-4, rtol=1e-4)
            for i in range(n):  # every other step is a plain Euler (ODE) step
                if i != k:
                    xi, vi, _, di = _context_and_step(policy, out.replay, i)
                    torch.testing.assert_close(chains[:, i + 1], xi - di * vi, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.actions, chains[:, -1])
    assert len(seen) > 1  # k is drawn per call


def test_flow_cps_last_step_has_zero_log_prob():
    policy = FlowPolicy(VEC_SPACE, CHUNK_BOX, num_steps=1, noise_method="flow_cps", velocity_hidden=(16,))
    out = policy.act(_obs(VEC_SPACE))
    assert out.log_probs.eq(0).all() and policy.evaluate(out.replay).log_probs.eq(0).all()
    ignore = FlowPolicy(VEC_SPACE, CHUNK_BOX, num_steps=3, noise_method="flow_cps", ignore_last=True)
    assert all(int(ignore.act(_obs(VEC_SPACE)).replay["denoise_inds"][0, 0]) < 2 for _ in range(10))


def test_flow_noise_joint_log_prob_is_mean_over_chain():
    n = 3
    policy = FlowPolicy(
        VEC_SPACE,
        CHUNK_BOX,
        num_steps=n,
        noise_method="flow_noise",
        joint_logprob=True,
        velocity_hidden=(32,),
    )
    out = policy.act(_obs(VEC_SPACE))
    chains = out.replay["chains"]
    assert out.replay["denoise_inds"][0].tolist() == [0, 1, 2]
    with torch.no_grad():
        terms = [Normal(0.0, 1.0).log_prob(chains[:, 0])]
        for i in range(n):
            x, v, _, delta = _context_and_step(policy, out.replay, i)
            context = policy.torso(obs_from_replay(out.replay))
            _, hidden = policy.velocity(x, torch.full((B,), policy.timesteps[i].item()), context)
            std = policy.learned_std(hidden)
            assert ((std >= 0.08 - 1e-6) & (std <= 0.16 + 1e-6)).all()
            terms.append(Normal(x - delta * v, std).log_prob(chains[:, i + 1]))
    torch.testing.assert_close(out.log_probs, torch.stack(terms).mean(0), atol=1e-4, rtol=1e-4)
    ev = policy.evaluate(out.replay)
    assert ev.entropy is not None and ev.entropy.shape == (B, 3, 2)


def test_flow_deterministic_is_ode_and_not_scoreable():
    policy = FlowPolicy(VEC_SPACE, CHUNK_BOX, num_steps=3, velocity_hidden=(16,), clip_actions=True)
    out = policy.act(_obs(VEC_SPACE), deterministic=True)
    assert out.log_probs is None and out.replay["denoise_inds"].eq(-1).all()
    chains = out.replay["chains"]
    with torch.no_grad():
        for i in range(3):
            x, v, _, delta = _context_and_step(policy, out.replay, i)
            torch.testing.assert_close(chains[:, i + 1], x - delta * v)
    torch.testing.assert_close(out.actions, chains[:, -1].clamp(-1, 1))
    with pytest.raises(ValueError):
        policy.evaluate(out.replay)


def test_flow_sampling_options_as_keywords_dict_or_dataclass_build_the_same_policy():
    """``FlowSampling``'s fields are accepted as keywords (what saved checkpoints hold), as
    ``sampling={...}`` or as a ``FlowSampling``; all three build the same policy."""
    flat = {
        "num_steps": 3,
        "noise_method": "flow_noise",
        "joint_logprob": True,
        "noise_std_range": (0.1, 0.2),
    }
    built = []
    for kwargs in ({**flat}, {"sampling": flat}, {"sampling": FlowSampling(**flat)}):
        torch.manual_seed(0)
        policy = FlowPolicy(VEC_SPACE, CHUNK_BOX, velocity_hidden=(16,), use_critic=False, **kwargs)
        built.append(policy)
    states = [p.state_dict() for p in built]
    assert all(list(s) == list(states[0]) for s in states)
    for state in states[1:]:
        for key, value in state.items():
            torch.testing.assert_close(value, states[0][key])
    for policy in built:
        assert (policy.num_steps, policy.noise_method, policy.joint_logprob) == (3, "flow_noise", True)
        assert policy.ignore_last is False and policy.noise_level == 0.5
    torch.testing.assert_close(built[0].logvar_min, torch.tensor(math.log(0.1**2)))
    default = FlowPolicy(VEC_SPACE, CHUNK_BOX, velocity_hidden=(16,))
    assert (default.num_steps, default.noise_method, default.noise_head) == (5, "flow_sde", None)


def test_flow_sampling_bad_options_are_named():
    with pytest.raises(ValueError, match="noise_method must be one of"):
        FlowPolicy(VEC_SPACE, CHUNK_BOX, noise_method="flow_magic")
    with pytest.raises(ValueError, match="ignore_last needs num_steps >= 2"):
        FlowPolicy(VEC_SPACE, CHUNK_BOX, sampling={"num_steps": 1, "ignore_last": True})
    with pytest.raises(ValueError, match=r"\['num_steps'\] given both"):
        FlowPolicy(VEC_SPACE, CHUNK_BOX, sampling={"num_steps": 2}, num_steps=3)
    with pytest.raises(ValueError, match="beside a FlowSampling"):
        FlowPolicy(VEC_SPACE, CHUNK_BOX, sampling=FlowSampling(), noise_level=0.3)
    with pytest.raises(ValueError, match=r"unknown keys \['steps'\]"):
        FlowPolicy(VEC_SPACE, CHUNK_BOX, sampling={"steps": 2})
    with pytest.raises(TypeError):  # neither a sampler field nor a torso option
        FlowPolicy(VEC_SPACE, CHUNK_BOX, steps=2)
    options = {"num_steps": 4, "activation": "relu"}
    sampling = FlowSampling.from_options({"noise_level": 0.3}, options, num_steps=10)
    assert sampling == FlowSampling(num_steps=4, noise_level=0.3) and options == {"activation": "relu"}
    assert FlowSampling.from_options(None, {}, num_steps=10).num_steps == 10  # the policy's default


def test_flow_noise_level_change_uses_the_stored_level():
    policy = FlowPolicy(VEC_SPACE, CHUNK_BOX, num_steps=3, velocity_hidden=(16,))
    out = policy.act(_obs(VEC_SPACE))
    policy.noise_level = 0.2
    torch.testing.assert_close(policy.evaluate(out.replay).log_probs, out.log_probs)


# ---------------------------------------------------------------------------------- correlated noise
def test_gaussian_correlated_noise_log_probs_are_the_joint_density():
    """AR(1) noise over the chunk: element log-probs are the conditionals, so their sum over the
    chunk is the multivariate normal density with covariance std_j std_k rho^|j-k| per action dim,
    and act and evaluate agree."""
    K, D, rho = 4, 3, 0.8
    policy = GaussianPolicy(VEC_SPACE, spaces.Box(-1, 1, (K, D), np.float32), noise_correlation=rho)
    with torch.no_grad():
        policy.log_std.copy_(torch.linspace(-1.0, 0.5, K * D))
    policy.seed(0)
    obs = _obs(VEC_SPACE)
    out = policy.act(obs)
    torch.testing.assert_close(policy.evaluate(out.replay).log_probs, out.log_probs)
    with torch.no_grad():
        mean, log_std = policy._mean_log_std(policy.torso(policy._prepare(obs)))
    u, joint = out.replay["raw_action"], torch.zeros(B)
    lags = torch.arange(K)
    corr = rho ** (lags[:, None] - lags[None, :]).abs().double()
    for d in range(D):
        std = log_std[0, :, d].double().exp()
        mvn = torch.distributions.MultivariateNormal(
            mean[:, :, d].double(), corr * std[:, None] * std[None, :]
        )
        joint += mvn.log_prob(u[:, :, d].double()).float()
    torch.testing.assert_close(out.log_probs.sum((1, 2)), joint, atol=1e-4, rtol=1e-5)


def test_gaussian_correlated_noise_has_the_stated_correlation_and_marginals():
    policy = GaussianPolicy(VEC_SPACE, spaces.Box(-1, 1, (3, 1), np.float32), noise_correlation=0.9)
    policy.seed(1)
    obs = np.zeros((20000, 5), np.float32)
    u = policy.act(obs).replay["raw_action"][:, :, 0] - policy.act(obs, deterministic=True).actions[:, :, 0]
    c = np.corrcoef(u.T.numpy())
    assert abs(c[0, 1] - 0.9) < 0.01 and abs(c[1, 2] - 0.9) < 0.01 and abs(c[0, 2] - 0.81) < 0.015
    assert np.allclose(u.std(0).numpy(), 1.0, atol=0.02)  # log_std 0: every sub-step is N(mean, 1)
    with pytest.raises(ValueError, match=r"noise_correlation must be in \[0, 1\)"):
        GaussianPolicy(VEC_SPACE, CHUNK_BOX, noise_correlation=1.0)


def test_gaussian_correlated_noise_entropy_of_the_conditionals():
    policy = GaussianPolicy(VEC_SPACE, spaces.Box(-1, 1, (2, 1), np.float32), noise_correlation=0.6)
    ent = policy.evaluate(policy.act(_obs(VEC_SPACE)).replay).entropy
    gaussian = 0.5 * math.log(2 * math.pi * math.e)
    torch.testing.assert_close(ent[0, :, 0], torch.tensor([gaussian, gaussian + 0.5 * math.log(1 - 0.36)]))


def test_gaussian_noise_dims_sample_only_those_dimensions():
    box = spaces.Box(-1.0, 1.0, (3, 4), np.float32)
    policy = GaussianPolicy(VEC_SPACE, box, squash=True, noise_dims=[3, 0], noise_correlation=0.5)
    assert policy.noise_dims == [0, 3] and policy.log_prob_dim == 2
    policy.seed(0)
    obs = _obs(VEC_SPACE)
    out, mode = policy.act(obs), policy.act(obs, deterministic=True).actions
    assert out.log_probs.shape == (B, 3, 2)
    torch.testing.assert_close(out.actions[..., 1:3], mode[..., 1:3])  # no noise there
    assert (out.actions[..., [0, 3]] - mode[..., [0, 3]]).abs().min() > 0
    torch.testing.assert_close(policy.evaluate(out.replay).log_probs, out.log_probs)
    full = GaussianPolicy(VEC_SPACE, box, squash=True, noise_correlation=0.5)
    full.load_state_dict(policy.state_dict())  # same parameters: the mask is not saved
    torch.testing.assert_close(full.evaluate(out.replay).log_probs[..., [0, 3]], out.log_probs)
    with pytest.raises(ValueError, match="noise_dims must be distinct"):
        GaussianPolicy(VEC_SPACE, box, noise_dims=[4])


def test_outcome_conditioned_flow_starts_as_its_plain_weights_and_guidance_steers_to_success():
    """The outcome embedding starts at zero, so a plain flow policy's weights load with it missing and
    act the same. Trained on success chunks at +0.5 and failure chunks at -0.5 (a fifth unlabelled),
    the unconditioned velocity (guidance 0) reaches their mixture, guidance 1 the successes, and
    guidance 2 goes beyond them, away from the mixture."""
    torch.manual_seed(0)
    obs_space, box = spaces.Box(-1, 1, (6,), np.float32), spaces.Box(-1, 1, (4, 2), np.float32)
    plain = FlowPolicy(obs_space, box, hidden_sizes=(32,), velocity_hidden=(32,))
    cond = FlowPolicy(obs_space, box, hidden_sizes=(32,), velocity_hidden=(32,), outcome_conditioned=True,
                      guidance=3.0)  # fmt: skip
    assert cond.load_state_dict(plain.state_dict(), strict=False).missing_keys == ["outcome_embedding.weight"]
    x = torch.randn(5, 6)
    torch.manual_seed(1)
    before = plain.act(x, deterministic=True).actions
    torch.manual_seed(1)
    torch.testing.assert_close(cond.act(x, deterministic=True).actions, before, rtol=0, atol=1e-5)
    opt = torch.optim.Adam(cond.parameters(), 1e-2)
    for _ in range(300):
        outcome = torch.randint(1, 3, (64,))
        chunks = torch.where(outcome[:, None, None] == OUTCOMES["success"], 0.5, -0.5).expand(64, 4, 2)
        outcome[torch.rand(64) < 0.2] = OUTCOMES["none"]
        loss = cond.imitation_loss(torch.randn(64, 6), chunks, outcome=outcome)
        opt.zero_grad()
        loss.backward()
        opt.step()
    means = {}
    for w in (0.0, 1.0, 2.0):
        cond.guidance = w
        means[w] = cond.act(torch.randn(400, 6), deterministic=True).actions.mean().item()
    assert abs(means[0.0]) < 0.15 and abs(means[1.0] - 0.5) < 0.1 and means[2.0] > means[1.0] + 0.03, means


def test_outcome_conditioning_bad_settings_are_named():
    obs_space, box = spaces.Box(-1, 1, (6,), np.float32), spaces.Box(-1, 1, (4, 2), np.float32)
    with pytest.raises(BadInput, match="guidance 2.0 needs outcome_conditioned"):
        FlowPolicy(obs_space, box, guidance=2.0)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(BadInput, match="guidance must be a finite number >= 0"):
            FlowPolicy(obs_space, box, outcome_conditioned=True, guidance=bad)
    plain = FlowPolicy(obs_space, box)
    with pytest.raises(BadInput, match="not outcome_conditioned"):
        plain.imitation_loss(torch.zeros(2, 6), torch.zeros(2, 4, 2), outcome=torch.ones(2, dtype=torch.long))
    cond = FlowPolicy(obs_space, box, outcome_conditioned=True)
    with pytest.raises(BadInput, match="outcome must be 2 labels in 0..2"):
        cond.imitation_loss(torch.zeros(2, 6), torch.zeros(2, 4, 2), outcome=torch.tensor([1, 3]))
