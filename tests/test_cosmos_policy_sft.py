"""Cosmos Policy's supervised fine-tuning loss (``imitation_loss``) on a tiny random checkpoint in the real
layout: the recipe's noise distributions and policy / world-model / value split from many draws, which
latent frames are charged, agreement with the sampler's parametrisation, bad input, and a tiny model
overfitting a handful of demonstrated chunks; ``trainers.bc``'s statistics from the demos."""

from __future__ import annotations

import json
import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_cosmos_policy import ACT_SPACE, OBS_SPACE, _obs, make

from nets.cosmos_sampler import rf_x0
from policies.cosmos_policy import layout, sft
from policies.cosmos_policy.checkpoint import read_stats, stats_from_data
from policies.cosmos_policy.policy import axis_angle_to_quat_xyzw
from policies.cosmos_policy.tiny import INSTRUCTIONS, TINY_STATS, write_tiny_cosmos_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 200_000  # draws for the distribution statistics
STEPS = 450  # optimizer steps of the overfitting test


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_cosmos_policy(tmp_path_factory.mktemp("cosmos_policy_sft") / "ckpt")


def _actions(b: int, k: int = 8, seed: int = 0) -> torch.Tensor:
    """Chunks inside the tiny statistics' range."""
    low, high = np.array(TINY_STATS["actions_min"]), np.array(TINY_STATS["actions_max"])
    u = np.random.default_rng(seed).uniform(0.1, 0.9, (b, k, 7))
    return torch.tensor(low + u * (high - low), dtype=torch.float32)


def _cached_vae(policy) -> None:
    """Memoise the frozen VAE's encodings (the same images every step; exact, and the tiny VAE is the
    slow part on a CPU)."""
    encode, cache = policy.vae.encode, {}

    def cached(video):
        key = video.cpu().numpy().tobytes()
        if key not in cache:
            cache[key] = encode(video)
        return cache[key]

    policy.vae.encode = cached


# ---------------------------------------------------------------- the recipe's random parts
def test_predict2_hybrid_sigma_distribution():
    g = torch.Generator().manual_seed(0)
    sigma, uniform = sft.sample_sigma_predict2(N, g)
    frac = uniform.double().mean().item()
    assert frac == pytest.approx(0.3, abs=4 * math.sqrt(0.21 / N))  # 30% from the uniform branch
    box = sigma[uniform].double()
    assert box.min() >= 1.0 and box.max() <= 85.0
    assert box.min() < 1.01 and box.max() > 84.99  # it spans [1, 85]
    assert box.mean().item() == pytest.approx(43.0, abs=0.2)
    assert box.var().item() == pytest.approx(84**2 / 12, rel=0.02)  # uniform's variance
    logs = sigma[~uniform].double().log()
    assert logs.mean().item() == pytest.approx(math.log(4), abs=0.01)  # the base model's log-normal
    assert logs.std().item() == pytest.approx(1.2, abs=0.01)
    assert (sigma > 0).all() and torch.isfinite(sigma).all()


def test_predict2p5_logit_normal_times_with_shift_5():
    g = torch.Generator().manual_seed(1)
    sigma = sft.sample_sigma_logit_normal(N, g).double()
    t = sigma / (1 + sigma)  # back to rectified-flow times
    u = t / (5 - 4 * t)  # undo the shift t = 5u / (1 + 4u)
    logit = torch.log(u / (1 - u))
    assert logit.mean().item() == pytest.approx(0.0, abs=0.01)  # logit-normal N(0, 1)
    assert logit.std().item() == pytest.approx(1.0, abs=0.01)
    # the shift puts most samples at high noise: median t = 5 * 0.5 / (1 + 4 * 0.5) = 5/6
    assert t.median().item() == pytest.approx(5 / 6, abs=0.005)
    assert (t > 0.5).double().mean().item() > 0.9


def test_split_frequencies_and_renormalisation():
    g = torch.Generator().manual_seed(2)
    modes = sft.sample_modes(N, sft.SPLIT, generator=g)
    freq = torch.bincount(modes, minlength=3).double() / N
    for got, want in zip(freq.tolist(), (0.5, 0.25, 0.25)):
        assert got == pytest.approx(want, abs=4 * math.sqrt(want * (1 - want) / N))
    no_value = (
        torch.bincount(sft.sample_modes(N, sft.SPLIT, (True, True, False), g), minlength=3).double() / N
    )
    assert no_value[2] == 0 and no_value[0].item() == pytest.approx(2 / 3, abs=0.005)
    only_policy = sft.sample_modes(1000, sft.SPLIT, (True, False, False), g)
    assert (only_policy == 0).all()
    assert sft.check_split((2, 1, 1)) == (0.5, 0.25, 0.25)
    with pytest.raises(ValueError, match="policy, world_model, value"):
        sft.check_split((0.5, 0.5))


def test_loss_weight_is_the_rectified_flow_velocity_error():
    sigma = torch.tensor([0.1, 1.0, 4.0, 80.0])
    t = sigma / (1 + sigma)
    torch.testing.assert_close(sft.loss_weight(sigma, "rf"), 1 / t**2)  # 1 / c_out^2
    torch.testing.assert_close(sft.loss_weight(sigma, "edm"), (sigma**2 + 1) / sigma**2)


# ---------------------------------------------------------------- the loss
def test_loss_uses_the_samplers_parametrisation_and_charges_only_denoised_frames(folder):
    policy = make(folder)
    obs, nxt = _obs(6), _obs(6, seed=1)
    actions, returns = _actions(6), torch.linspace(0.1, 0.9, 6)
    seen = {}

    def record(module, args, out):
        seen["t"] = args[1].detach().clone()
        seen["cond_mask"] = args[4].detach().clone()

    hook = policy.dit.register_forward_hook(record)
    g = torch.Generator().manual_seed(3)
    loss = policy.imitation_loss(obs, actions, next_obs=nxt, returns=returns, generator=g)
    hook.remove()
    assert torch.isfinite(loss) and loss.ndim == 0
    loss.backward()
    grads = [p.grad for p in policy.dit.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(gr).all() for gr in grads) and any(gr.abs().sum() > 0 for gr in grads)

    batch = policy.last_sft_batch
    num_cond = torch.tensor([4, 5, 8])[batch["mode"]]
    frames = torch.arange(9)
    assert torch.equal(seen["cond_mask"], (frames[None] < num_cond[:, None]).float())
    t = batch["sigma"] / (1 + batch["sigma"])
    expected_t = torch.where(frames[None] < num_cond[:, None], torch.zeros(()), t[:, None])
    torch.testing.assert_close(seen["t"], expected_t)  # clean frames at timestep 0, the rest t = s / (1 + s)
    assert torch.equal(batch["charged"], frames[None] >= num_cond[:, None])  # every target is known here

    # the same draws by hand with the sampler's denoiser: w (D - x0)^2 over the denoised frames
    g = torch.Generator().manual_seed(3)
    again = policy.imitation_loss(obs, actions, next_obs=nxt, returns=returns, generator=g)
    torch.testing.assert_close(again, loss)
    g = torch.Generator().manual_seed(3)
    modes = sft.sample_modes(6, policy.sft_split, generator=g)
    sigma = sft.sample_sigma("predict2", 6, g, "cpu")
    x0 = policy._encode(obs, nxt)
    x0 = layout.write_vector(
        x0, 4, layout.minmax_normalize(_pad16(actions), policy.actions_low, policy.actions_high).flatten(1)
    )
    x0 = layout.write_vector(x0, 8, 2 * returns[:, None] - 1)
    eps = torch.randn(x0.shape, generator=g)
    cond = (frames[None] < torch.tensor([4, 5, 8])[modes][:, None]).float()
    context = policy.text_table[policy._text_ids_of(obs)]
    x_sigma = x0 + sigma[:, None, None, None, None] * eps
    with torch.no_grad():
        d = rf_x0(policy.dit, x_sigma, sigma, x0, cond, None, context, 0.0)
    w = ((1 + sigma) ** 2 / sigma**2)[:, None, None, None, None] * (1 - cond)[:, None, :, None, None]
    w = w.expand_as(x0).clone()
    given = (torch.arange(16 * 4 * 4) % 112) // 7 < 8  # action values of the 8 given steps (of 16)
    w[:, :, 4] *= given.reshape(16, 4, 4)
    by_hand = (w * (d - x0) ** 2).sum() / x0.numel()
    torch.testing.assert_close(loss.detach(), by_hand, rtol=1e-5, atol=1e-7)
    # per-sample sigma tensors give exactly the scalar-sigma sampler call
    with torch.no_grad():
        one = rf_x0(policy.dit, x_sigma[:1], float(sigma[0]), x0[:1], cond[:1], None, context[:1], 0.0)
    torch.testing.assert_close(d[:1], one, rtol=1e-5, atol=1e-6)


def _many(b: int, seed: int = 0) -> dict:
    """Observations like ``_obs`` for any batch size (the tiny checkpoint knows 10 instructions)."""
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 255, (b, 32, 32, 3), dtype=np.uint8),
        "wrist_image": rng.integers(0, 255, (b, 32, 32, 3), dtype=np.uint8),
        "proprio": (rng.normal(size=(b, 8)) * 0.2).astype(np.float32),
        "instruction": [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(b)],
    }


def _pad16(actions: torch.Tensor) -> torch.Tensor:
    return torch.cat([actions, actions[:, -1:].expand(-1, 16 - actions.shape[1], -1)], dim=1)


def test_network_output_on_conditioning_frames_is_not_charged(folder):
    policy = make(folder)
    obs, nxt, actions, returns = _obs(4), _obs(4, seed=1), _actions(4), torch.full((4,), 0.5)

    def loss_with(frames: slice | None) -> float:
        def perturb(module, args, out):
            if frames is None:
                return out
            out = out.clone()
            out[:, :, frames] += 100.0
            return out

        hook = policy.dit.register_forward_hook(perturb)
        g = torch.Generator().manual_seed(4)
        with torch.no_grad():
            value = policy.imitation_loss(obs, actions, next_obs=nxt, returns=returns, generator=g).item()
        hook.remove()
        return value

    base = loss_with(None)
    assert loss_with(slice(0, 4)) == pytest.approx(base, rel=1e-6)  # conditioning in every mode
    assert loss_with(slice(8, 9)) > 10 * base  # the value frame is denoised in every mode


def test_masked_steps_and_missing_targets_are_not_charged(folder):
    policy = make(folder)
    obs, actions = _obs(4), _actions(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = torch.Generator().manual_seed(5)
        full = policy.imitation_loss(obs, actions, generator=g)
        policy.imitation_loss(obs, actions)
    assert len([w for w in caught if "next_obs" in str(w.message)]) == 1  # one warning per policy
    batch = policy.last_sft_batch
    assert (batch["mode"] == 0).all()  # policy-only target
    assert batch["charged"].sum(1).tolist() == [1] * 4 and batch["charged"][:, 4].all()  # the action frame
    # a masked sub-step's demonstrated action does not change the loss; an unmasked one does
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[:, 5:] = False
    changed = actions.clone()
    changed[:, 6] += 0.5

    def loss(a, m):
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            return policy.imitation_loss(obs, a, m, generator=g).item()

    assert loss(changed, mask) == pytest.approx(loss(actions, mask), rel=1e-6)
    assert loss(changed, None) != pytest.approx(loss(actions, None), rel=1e-3)
    assert loss(actions, mask) < full
    # with next_obs but no returns: world-model samples appear, value samples and the value frame do not
    g = torch.Generator().manual_seed(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        policy.imitation_loss(_many(64), _actions(64), next_obs=_many(64, seed=1), generator=g)
    batch = policy.last_sft_batch
    assert set(batch["mode"].tolist()) == {0, 1} and not batch["charged"][:, 8].any()


def test_auto_noise_follows_the_backbone_and_bad_options(folder):
    policy = make(folder)
    assert policy.sft_noise == "predict2" and policy.dit.config.crossattn_proj_in_channels is None
    assert make(folder, sft_noise="predict2.5").sft_noise == "predict2.5"
    with pytest.raises(ValueError, match="sft_noise"):
        make(folder, sft_noise="predict3")
    with pytest.raises(ValueError, match="sft_loss_weighting"):
        make(folder, sft_loss_weighting="sid")


def test_bad_input_names_both_sides(folder):
    policy = make(folder)
    obs = _obs(2)
    with pytest.raises(ValueError, match=r"\(2, 8, 6\).*\[B, 8, 7\]"):
        policy.imitation_loss(obs, torch.zeros(2, 8, 6))  # wrong action dimension
    with pytest.raises(ValueError, match=r"\(2, 5, 7\).*\[B, 8, 7\].*\[B, 16, 7\]"):
        policy.imitation_loss(obs, torch.zeros(2, 5, 7))  # wrong chunk length
    small = dict(obs, image=obs["image"][:, :24, :24])
    with pytest.raises(ValueError, match=r"obs\['image'\].*\(2, 24, 24, 3\).*\(32, 32, 3\)"):
        policy.imitation_loss(small, torch.zeros(2, 8, 7))
    nxt = dict(_obs(2, seed=1), wrist_image=np.zeros((2, 64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match=r"next_obs\['wrist_image'\].*\(2, 64, 64, 3\).*\(32, 32, 3\)"):
        policy.imitation_loss(obs, torch.zeros(2, 8, 7), next_obs=nxt, returns=torch.ones(2))
    with pytest.raises(ValueError, match=r"returns.*\[0, 1\]"):
        policy.imitation_loss(
            obs, torch.zeros(2, 8, 7), next_obs=_obs(2, seed=1), returns=torch.tensor([0.5, 2])
        )
    with pytest.raises(ValueError, match="3 instructions for 2"):
        policy.imitation_loss(_obs(3) | {k: v[:2] for k, v in _obs(3).items() if k != "instruction"},
                              torch.zeros(2, 8, 7))  # fmt: skip
    with pytest.raises(ValueError, match="mask"):
        policy.imitation_loss(obs, torch.zeros(2, 8, 7), torch.ones(2, 7, dtype=torch.bool))
    # the model's whole 16-step chunk is accepted as well
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.isfinite(policy.imitation_loss(obs, torch.zeros(2, 16, 7)))


def rows_of(obs: dict, idx) -> dict:
    """The rows ``idx`` of a batched observation (the instruction is a list)."""
    return {k: [v[i] for i in idx] if k == "instruction" else v[idx] for k, v in obs.items()}


def overfit(policy, obs: dict, actions: torch.Tensor) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    """Cosmos Policy's overfitting proof on four (obs, chunk) samples (the policy-only target): Adam
    5e-3, then 5e-4 for the last third, ``STEPS`` steps of 16 rows (each sample 4 times, 16 noise
    draws). Returns the loss before and after (the same fixed draws: the samples 8 times x 16 draws),
    the deterministic chunks' absolute error ``[4, K, 7]`` in the model's normalized [-1, 1] units, and
    the index of the target nearest to each sampled chunk. The frozen VAE's encodings are cached."""
    _cached_vae(policy)
    rows, wide = np.tile(np.arange(4), 4), np.tile(np.arange(4), 8)

    batch, held = (rows_of(obs, rows), actions[rows]), (rows_of(obs, wide), actions[wide])
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=5e-3)

    def eval_loss() -> float:
        g = torch.Generator().manual_seed(123)
        with torch.no_grad():
            return float(np.mean([policy.imitation_loss(*held, generator=g).item() for _ in range(16)]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # policy-only target: no next_obs / returns
        before = eval_loss()
        for step in range(STEPS):
            if step == STEPS * 2 // 3:  # a tenth of the step size at the end: less jitter from the noise
                optimizer.param_groups[0]["lr"] = 5e-4
            loss = policy.imitation_loss(*batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        after = eval_loss()

    def normed(a):
        return layout.minmax_normalize(a, policy.actions_low, policy.actions_high)

    sampled = normed(policy.act(obs, deterministic=True).actions)
    err = (sampled - normed(actions)).abs()
    nearest = (sampled[:, None] - normed(actions)[None]).abs().mean((2, 3)).argmin(1)  # [sampled]
    factor = before / after
    print(f"loss {before:.4g} -> {after:.4g} ({factor:.0f}x); error {err.mean():.3f} / {err.max():.3f}")
    return before, after, err, nearest


@pytest.mark.slow
def test_tiny_model_overfits_demonstrated_chunks(folder):
    """Four fixed (obs, chunk) samples, ``overfit``: the loss falls by >= 10x (measured: 336x) and the
    deterministic sampled chunk (5 steps, sigma 80 -> 4) matches each sample's own target within 0.1
    mean / 0.4 max absolute error in the model's normalized [-1, 1] units (measured: 0.031 / 0.200),
    and is closest to its own target of the four. About 100 s on a shared CPU. The same proof on
    LIBERO expert frames: ``test_vla_sft_libero.py``."""
    torch.manual_seed(0)
    policy = make(folder, num_steps=5)
    policy.seed(0)
    before, after, err, nearest = overfit(policy, _obs(4), _actions(4))
    assert before / after >= 10, (before, after)
    assert err.mean() < 0.1 and err.max() < 0.4, (err.mean().item(), err.max().item())
    assert torch.equal(nearest, torch.arange(4))


# ---------------------------------------------------------------- trainers.bc: statistics from the demos
class StandInEnv(gym.Env):
    """Cosmos Policy's observations (two cameras, LIBERO's proprio fields, an instruction), chunks of
    8 x 7; nothing else."""

    def __init__(self):
        self.observation_space, self.action_space = OBS_SPACE, ACT_SPACE

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


ENV_ID = "CosmosPolicyStandIn-v0"
if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=StandInEnv)


def test_trainers_bc_computes_its_dataset_statistics_from_the_demos(folder, tmp_path):
    from trainers import bc
    from trainers.checkpoint import load_policy
    from trainers.datasets.demos import Episode, write_demos

    steps, episodes = 3, []
    for seed in range(2):
        obs = _obs(steps, seed)
        actions = _actions(steps, seed=seed).numpy() * 2  # outside the folder's statistics
        episodes.append(
            Episode(
                obs={k: v for k, v in obs.items() if k != "instruction"},
                actions=actions,
                valid=np.ones((steps, 8), bool),
                rewards=np.zeros((steps, 8), np.float32),
                instruction=INSTRUCTIONS[0],
                success=True,
            )
        )
    demos = write_demos(tmp_path / "demos.h5", episodes, {"env": ENV_ID})
    kwargs = {"model_path": str(folder), "image_size": 32, "num_steps": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no next_obs in one-step episodes' last samples: fewer targets
        result = bc.main([
            "--demos", str(demos), "--env", f"test_cosmos_policy_sft:{ENV_ID}", "--policy", "cosmos_policy",
            "--policy-kwargs", json.dumps(kwargs), "--epochs", "1", "--batch-size", "6",
            "--val-fraction", "0", "--eval-every", "-1", "--no-progress", "--no-tensorboard", "--no-video",
            "--num-envs", "1", "--run-dir", str(tmp_path / "bc"),
        ])  # fmt: skip
    assert math.isfinite(result["train/bc_loss"])
    stats = json.loads((tmp_path / "bc" / "checkpoints" / "dataset_statistics.json").read_text())
    actions = np.concatenate([ep.actions for ep in episodes]).reshape(-1, 7)
    np.testing.assert_allclose(stats["actions_min"], actions.min(0), rtol=1e-6)
    np.testing.assert_allclose(stats["actions_max"], actions.max(0), rtol=1e-6)
    proprio = np.concatenate([ep.obs["proprio"] for ep in episodes])
    quat = axis_angle_to_quat_xyzw(torch.as_tensor(proprio[:, 3:6])).numpy()
    model_proprio = np.concatenate([proprio[:, 6:8], proprio[:, :3], quat], 1)  # gripper, eef pos, quat
    np.testing.assert_allclose(stats["proprio_min"], model_proprio.min(0), rtol=1e-5, atol=1e-6)
    policy = load_policy(tmp_path / "bc", OBS_SPACE, ACT_SPACE)  # the checkpoint carries them
    np.testing.assert_allclose(policy.actions_low.numpy(), np.float32(stats["actions_min"]))
    np.testing.assert_allclose(policy.proprio_high.numpy(), np.float32(stats["proprio_max"]))


def test_statistics_with_a_constant_or_inverted_range():
    stats = stats_from_data(np.array([[0.5] * 7, [0.5] * 6 + [1.0]]), np.zeros((3, 9)))
    assert stats["actions_min"][0] == pytest.approx(0.5 - 5e-4) and stats["actions_max"][0] == pytest.approx(
        0.5005
    )
    assert stats["actions_min"][6] == 0.5 and stats["proprio_max"] == pytest.approx([5e-4] * 9)
    bad = {**stats, "proprio_max": [-1.0] + stats["proprio_max"][1:]}
    with pytest.raises(ValueError, match=r"given: proprio_max is not above proprio_min in dims \[0\]"):
        read_stats(bad, "given")
