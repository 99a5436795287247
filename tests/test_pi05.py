"""pi0.5 on a tiny random checkpoint written in openpi's real layout: loading, the KV-cached
prefix against openpi's joint (uncached) attention, prompt and normalization conventions, the RL
samplers' act/evaluate agreement, and GRPO / PPO steps on the real LIBERO simulator."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import requires_libero
from gymnasium import spaces

from policies.flow import flow_mean_std, sde_sigma_ratios
from policies.pi05 import Pi05Policy
from policies.pi05.modeling import EXPERT_LM_HEAD, _rotate_half
from policies.pi05.tiny import TINY_STATS, write_tiny_pi05
from policies.pretrained import read_state_dict, save_state_dict

OBS_SPACE = spaces.Dict(
    {
        "image": spaces.Box(0, 255, (64, 64, 3), np.uint8),
        "wrist_image": spaces.Box(0, 255, (64, 64, 3), np.uint8),
        "proprio": spaces.Box(-10, 10, (8,), np.float32),
        "instruction": spaces.Text(200),
    }
)
ACT_SPACE = spaces.Box(-1, 1, (5, 7), np.float32)
KW = {"num_steps": 4, "max_token_len": 96}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_pi05(tmp_path_factory.mktemp("pi05") / "ckpt")


def _obs(b: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    texts = ["pick up the black bowl", "open_the drawer\n", "put the bowl on the stove", "x"]
    return {
        "image": rng.integers(0, 255, (b, 64, 64, 3), dtype=np.uint8),
        "wrist_image": rng.integers(0, 255, (b, 64, 64, 3), dtype=np.uint8),
        "proprio": rng.normal(size=(b, 8)).astype(np.float32) * 0.1,
        "instruction": texts[:b],
    }


def test_tiny_checkpoint_is_in_openpi_layout_and_loads_strictly(ckpt):
    names = set(read_state_dict(ckpt))
    assert "paligemma_with_expert.paligemma.lm_head.weight" in names  # tied embedding stored as lm_head
    assert not any("embed_tokens" in n for n in names) and EXPERT_LM_HEAD in names
    assert any(".vision_tower.vision_model.encoder.layers.0." in n for n in names)
    assert (ckpt / "assets/physical-intelligence/libero/norm_stats.json").is_file()
    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW)
    embed = policy.model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight
    torch.testing.assert_close(embed, read_state_dict(ckpt)["paligemma_with_expert.paligemma.lm_head.weight"])


def test_lerobot_layout_loads_the_same_model_and_statistics(ckpt, tmp_path):
    """lerobot's PI05Policy files: ``model.``-prefixed weights, quantiles in normalizer safetensors."""
    from safetensors.torch import save_file

    folder = tmp_path / "lerobot"
    shutil.copytree(ckpt, folder)
    state = read_state_dict(ckpt)
    (folder / "model.safetensors").unlink()
    save_state_dict({f"model.{k}": v for k, v in state.items()}, folder)
    shutil.rmtree(folder / "assets")
    q = {k: {s: torch.tensor(v[s]) for s in ("q01", "q99")} for k, v in TINY_STATS.items()}
    save_file({f"observation.state.{s}": q["state"][s] for s in ("q01", "q99")},
              str(folder / "policy_preprocessor_step_2_normalizer_processor.safetensors"))  # fmt: skip
    save_file({f"action.{s}": q["actions"][s] for s in ("q01", "q99")},
              str(folder / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))  # fmt: skip
    a = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW)
    b = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=folder, **KW)
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    a.seed(0), b.seed(0)
    assert torch.equal(a.act(_obs(), deterministic=True).actions, b.act(_obs(), deterministic=True).actions)


def _joint_velocity(model, prefix, prefix_valid, x_t, t):
    """openpi's uncached forward: prefix and suffix streams through their own layers, attention over
    the concatenated q/k/v with the cumsum ``att_masks`` rule (prefix 0s, suffix [1, 0, ...])."""
    stack_p = model.paligemma_with_expert.paligemma.model.language_model
    stack_e = model.paligemma_with_expert.gemma_expert.model
    cond = model.time_condition(t)
    suffix = model.action_in_proj(x_t)
    b, lp, h = prefix.shape[0], prefix.shape[1], x_t.shape[1]
    pad = torch.cat([prefix_valid, torch.ones(b, h, dtype=torch.bool)], 1)
    att = torch.cat([torch.zeros(b, lp), torch.ones(b, 1), torch.zeros(b, h - 1)], 1).cumsum(1)
    allowed = (att[:, None, :] <= att[:, :, None]) & pad[:, None, :] & pad[:, :, None]
    pos = pad.long().cumsum(1) - 1
    freqs = pos[..., None].float() * model.inv_freq
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    xs = [prefix, suffix]
    hd = model.pali.head_dim
    for lp_, le in zip(stack_p.layers, stack_e.layers):
        hs = [lp_.input_layernorm(xs[0]), le.input_layernorm(xs[1], cond)[0]]
        gate = le.input_layernorm(xs[1], cond)[1]
        qkv = [
            [m(hh).view(b, hh.shape[1], -1, hd).transpose(1, 2) for m in (la.q_proj, la.k_proj, la.v_proj)]
            for la, hh in zip((lp_.self_attn, le.self_attn), hs)
        ]
        q, k, v = (torch.cat([qkv[0][i], qkv[1][i]], 2) for i in range(3))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = (
            k.repeat_interleave(q.shape[1] // k.shape[1], 1),
            v.repeat_interleave(q.shape[1] // v.shape[1], 1),
        )
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~allowed[:, None], -2.3819763e38)
        out = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
        xs = [xs[0] + lp_.self_attn.o_proj(out[:, :lp]), xs[1] + le.self_attn.o_proj(out[:, lp:]) * gate]
        normed, gate2 = le.post_attention_layernorm(xs[1], cond)
        xs = [xs[0] + lp_.mlp(lp_.post_attention_layernorm(xs[0])), xs[1] + le.mlp(normed) * gate2]
    return model.action_out_proj(stack_e.norm(xs[1], cond)[0])


def test_kv_cached_denoising_equals_the_joint_forward(ckpt):
    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW)
    prepared = policy._prepare(_obs())
    pixels = prepared["images"].permute(0, 1, 4, 2, 3).float() / 255 * 2 - 1
    with torch.no_grad():
        embeds, valid = policy.model.embed_prefix(pixels, prepared["tokens"], prepared["token_mask"])
        cache = policy.model.prefix_cache(embeds, valid)
        x_t, t = torch.randn(3, 10, 32), torch.tensor([1.0, 0.6, 0.2])
        cached, _ = policy.model.velocity(cache, x_t, t)
        joint = _joint_velocity(policy.model, embeds, valid, x_t, t)
    torch.testing.assert_close(cached, joint, atol=1e-5, rtol=1e-5)


def test_batch_and_padding_do_not_change_a_sample(ckpt):
    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW)
    longer = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, num_steps=4, max_token_len=150)
    obs = _obs()
    x_t, t = torch.randn(1, 10, 32), torch.tensor([0.7])
    with torch.no_grad():
        alone = policy.model.velocity(
            policy._prefix(policy._prepare({k: v[1:2] for k, v in obs.items()})), x_t, t
        )[0]
        cache = policy._prefix(policy._prepare(obs))
        cache.keys, cache.values = [k[1:2] for k in cache.keys], [v[1:2] for v in cache.values]
        cache.valid = cache.valid[1:2]
        batched = policy.model.velocity(cache, x_t, t)[0]
        padded = longer.model.velocity(
            longer._prefix(longer._prepare({k: v[1:2] for k, v in obs.items()})), x_t, t
        )[0]
    torch.testing.assert_close(alone, batched, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-5)


def test_prompt_formats_and_state_bins(ckpt):
    plain = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW)
    sp = plain.tokenizer.sp
    ids = plain.tokenizer.ids(" open_the drawer\n", None)
    assert ids == [sp.bos_id(), *sp.encode("open the drawer"), *sp.encode("\n")]  # cleaned, not lowercased
    discrete = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, discrete_state_input=True, **KW)
    state = np.array([-1.0, -0.999, 0.0, 0.5, 0.9999, 1.5, -2.0, 0.1])
    ids = discrete.tokenizer.ids("Pick up", state)
    text = (
        "Task: Pick up, State: 0 0 128 192 255 255 -1 140;\nAction: "  # digitize(linspace(-1,1,257)[:-1]) - 1
    )
    assert ids == [sp.bos_id(), *sp.encode(text)]
    tokens, mask = discrete.tokenizer(["Pick up"], state[None])
    assert tokens.shape == (1, 96) and mask.sum() == len(ids) and not tokens[0, len(ids) :].any()


def test_quantile_normalization_and_action_slicing(ckpt):
    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW)
    q01, q99 = torch.tensor(TINY_STATS["actions"]["q01"]), torch.tensor(TINY_STATS["actions"]["q99"])
    x = torch.rand(2, 10, 32) * 2 - 1
    env = policy._to_env(x)
    assert env.shape == (2, 5, 7)
    torch.testing.assert_close(env, ((x[:, :5, :7] + 1) / 2 * (q99 - q01 + 1e-6) + q01))
    s = policy.state_stats
    raw = torch.tensor(TINY_STATS["state"]["q99"])
    torch.testing.assert_close(s.normalize(raw), torch.ones(8), atol=1e-4, rtol=0)
    torch.testing.assert_close(s.unnormalize(s.normalize(raw)), raw)
    out = policy.act(_obs(), deterministic=True)
    torch.testing.assert_close(out.actions, policy._to_env(out.replay["chains"][:, -1]))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"noise_method": "flow_sde"},
        {"noise_method": "flow_cps", "ignore_last": True},
        {"noise_method": "flow_noise", "joint_logprob": True},
        {"noise_method": "flow_sde", "discrete_state_input": True, "noise_level": 0.7},
    ],
)
def test_act_and_evaluate_agree_on_log_probs(ckpt, kwargs):
    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW, **kwargs)
    policy.seed(0)
    out = policy.act(_obs())
    assert out.log_probs.shape == (3, 5, 7) and out.actions.shape == (3, 5, 7) and out.value.shape == (3, 1)
    assert out.replay["chains"].shape == (3, 5, 10, 32)
    ev = policy.evaluate(out.replay)
    torch.testing.assert_close(ev.log_probs, out.log_probs, atol=1e-5, rtol=0)
    assert (ev.entropy is not None) == (kwargs["noise_method"] == "flow_noise")
    policy.seed(0)
    assert torch.equal(policy.act(_obs()).actions, out.actions)  # seeded sampling reproduces


def test_sde_step_matches_the_flow_grpo_formula(ckpt):
    """The stored chain's stochastic step is N(x - Delta [v + s^2/(2t) (x + (1-t) v)], Delta s^2)."""
    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW)
    policy.seed(3)
    out = policy.act(_obs())
    k = int(out.replay["denoise_inds"][0, 0])
    cache = policy._prefix({n: out.replay[n] for n in ("images", "tokens", "token_mask")})
    x = out.replay["chains"][:, k]
    t, delta = 1 - k / 4, 1 / 4
    with torch.no_grad():
        v, _ = policy.model.velocity(cache, x, torch.full((3,), t))
    s = 0.5 * float(sde_sigma_ratios(4)[k])
    mean, std = flow_mean_std(x, v, torch.tensor(t), torch.tensor(delta), "flow_sde", 0.5, s)
    torch.testing.assert_close(
        mean, x - delta * (v + s**2 / (2 * t) * (x + (1 - t) * v)), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(std, torch.full_like(x, math.sqrt(delta) * s))


def test_imitation_loss_is_openpis_flow_matching_and_fine_tunes_the_expert(ckpt):
    """The SFT loss by hand (normalised chunk zero-padded to the model's horizon and dims, Beta(1.5, 1)
    times, velocity regressed on noise - a over the K x D data entries); with train_expert_only only
    the expert moves, and training on two demo frames lowers the loss and the actions' error."""
    torch.manual_seed(0)
    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, train_expert_only=True, **KW)
    q01 = torch.tensor(TINY_STATS["actions"]["q01"])[:7]
    q99 = torch.tensor(TINY_STATS["actions"]["q99"])[:7]
    obs, demo = _obs(2), q01 + (q99 - q01) * torch.rand(2, 5, 7)
    policy.seed(7)
    loss = policy.imitation_loss(obs, demo)
    policy.seed(7)
    rng = policy._rng(torch.device("cpu"))
    with torch.no_grad():
        cache = policy._prefix(policy._prepare(obs))
        a = torch.zeros(2, policy.horizon, policy.model_action_dim)
        a[:, :5, :7] = (demo - q01) / (q99 - q01 + 1e-6) * 2 - 1
        noise = torch.randn(a.shape, generator=rng)
        t = 0.001 + 0.999 * torch.rand(2, generator=rng) ** (1 / 1.5)
        v, _ = policy.model.velocity(cache, t[:, None, None] * noise + (1 - t[:, None, None]) * a, t)
        by_hand = ((v - (noise - a))[:, :5, :7] ** 2).sum(-1).mean()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-4)
    loss.backward()
    paligemma = policy.model.paligemma_with_expert.paligemma
    assert all(p.grad is None for p in paligemma.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())

    def mean_loss() -> float:  # the same 8 draws of (noise, t) each time
        policy.seed(123)
        with torch.no_grad():
            return float(np.mean([policy.imitation_loss(obs, demo).item() for _ in range(8)]))

    def action_error() -> float:
        return (policy.act(obs, deterministic=True).actions - demo).abs().mean().item()

    first, first_error = mean_loss(), action_error()
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(250):
        step_loss = policy.imitation_loss(obs, demo)
        optimizer.zero_grad()
        step_loss.backward()
        optimizer.step()
    assert mean_loss() < first / 4 and action_error() < first_error / 2, (first, mean_loss(), action_error())


def test_sampler_options_as_keywords_or_sampling_build_the_same_sampler(ckpt):
    """pi0.5 takes ``FlowSampling``'s fields as keywords (saved checkpoints' kwargs) or as ``sampling=``;
    a field given neither way keeps pi0.5's default (10 steps)."""
    flat = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, num_steps=3, noise_level=0.3, max_token_len=96)
    nested = Pi05Policy(
        OBS_SPACE, ACT_SPACE, model_path=ckpt, sampling={"num_steps": 3, "noise_level": 0.3}, max_token_len=96
    )
    for policy in (flat, nested):
        assert (policy.num_steps, policy.noise_level, policy.noise_method) == (3, 0.3, "flow_sde")
        torch.testing.assert_close(policy.timesteps, torch.tensor([1.0, 2 / 3, 1 / 3, 0.0]))
    default = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, max_token_len=96)
    assert default.num_steps == 10 and default.rebuilds_frozen_weights


def test_deterministic_act_and_train_expert_only(ckpt):
    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, train_expert_only=True, **KW)
    out = policy.act(_obs(), deterministic=True)
    assert out.log_probs is None and (out.replay["denoise_inds"] == -1).all()
    with pytest.raises(ValueError, match="deterministic"):
        policy.evaluate(out.replay)
    assert not any(p.requires_grad for p in policy.model.paligemma_with_expert.paligemma.parameters())
    sampled = policy.act(_obs())
    loss = -policy.evaluate(sampled.replay).log_probs.mean()
    loss.backward()
    expert = policy.model.paligemma_with_expert.gemma_expert
    assert all(p.grad is not None for p in expert.parameters())
    assert policy.model.action_in_proj.weight.grad is not None


def test_dsrl_steers_pi05_through_its_initial_noise(ckpt):
    from policies.dsrl import NoiseSteeredPolicy

    policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, **KW)
    policy.seed(0)
    out = policy.act(_obs(), deterministic=True)
    torch.testing.assert_close(policy.denoise(_obs(), out.replay["chains"][:, 0]), out.actions)
    dsrl = NoiseSteeredPolicy(
        OBS_SPACE,
        ACT_SPACE,
        base={"name": "pi05", "kwargs": {"model_path": str(ckpt), **KW}},
        hidden_sizes=[16],
    )
    dsrl.seed(1)
    steered = dsrl.act(_obs())
    noise = steered.replay["sac_action"]
    assert noise.shape == (3, *policy.noise_shape) and dsrl.sac_action_space.shape == policy.noise_shape
    assert noise.abs().max() <= 2.0 and steered.actions.shape == (3, 5, 7)
    torch.testing.assert_close(steered.actions, dsrl.base.denoise(_obs(), noise))
    actions, log_probs = dsrl.rsample(_obs())
    assert actions.requires_grad and log_probs.shape == (3, *policy.noise_shape)
    assert not any(p.requires_grad for p in dsrl.base.parameters())


def test_bad_inputs_are_named(ckpt, tmp_path):
    with pytest.raises(ValueError, match="horizon"):
        Pi05Policy(OBS_SPACE, spaces.Box(-1, 1, (11, 7), np.float32), model_path=ckpt, **KW)
    with pytest.raises(ValueError, match="statistics are 7-D"):
        Pi05Policy(OBS_SPACE, spaces.Box(-1, 1, (5, 8), np.float32), model_path=ckpt, **KW)
    no_wrist = spaces.Dict({k: v for k, v in OBS_SPACE.spaces.items() if k != "wrist_image"})
    with pytest.raises(ValueError, match="wrist_image"):
        Pi05Policy(no_wrist, ACT_SPACE, model_path=ckpt, **KW)
    with pytest.raises(FileNotFoundError, match="asset_id 'nope/nope'.*physical-intelligence/libero"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, asset_id="nope/nope", **KW)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['steps'\]"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, steps=2)
    with pytest.raises(ValueError, match="noise_method must be one of"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, sampling={"noise_method": "flow_magic"})
    with pytest.raises(ValueError, match="max_token_len=8"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=ckpt, num_steps=2, max_token_len=8).act(_obs())

    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    (broken / "tokenizer.model").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer_path"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=broken, **KW)
    shutil.copy(ckpt / "tokenizer.model", broken / "tokenizer.model")
    shutil.copytree(broken / "assets/physical-intelligence/libero", broken / "assets/other/robot")
    with pytest.raises(FileNotFoundError, match="pass asset_id"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=broken, **KW)
    shutil.rmtree(broken / "assets/other")
    state = read_state_dict(broken)
    state["action_in_proj.weight"] = torch.zeros(3, 3)
    state["extra.weight"] = torch.zeros(1)
    save_state_dict(state, broken)
    with pytest.raises(ValueError, match=r"unexpected: extra\.weight.*wrong shape: action_in_proj\.weight"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=broken, **KW)
    config = json.loads((ckpt / "config.json").read_text())
    (broken / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "action_horizon"})
    )
    with pytest.raises(ValueError, match="lacks action_horizon"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=broken, **KW)
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "pi0"}))
    with pytest.raises(ValueError, match="pi0 checkpoint"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=broken, **KW)
    with pytest.raises(FileNotFoundError, match="hf download nobody/nothing"):
        Pi05Policy(OBS_SPACE, ACT_SPACE, model_path="nobody/nothing", **KW)


@pytest.mark.slow
@requires_libero
def test_grpo_and_ppo_steps_on_libero(ckpt, tmp_path):
    from trainers import checkpoint as ckpt_io
    from trainers.grpo import train as grpo_train
    from trainers.ppo import train as ppo_train

    env = {"chunk_size": 5, "image_size": 32, "max_episode_steps": 10, "task_ids": [0], "envs_per_worker": 2}
    common = [
        "--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps(env), "--policy", "pi05",
        "--policy-kwargs", json.dumps({"model_path": str(ckpt), "num_steps": 3, "max_token_len": 96}),
        "--num-envs", "2", "--no-progress", "--torch-threads", "1", "--eval-episodes", "1",
    ]  # fmt: skip
    grpo = grpo_train.main([*common, "--group-size", "2", "--no-dynamic-sampling", "--total-steps", "20",
                            "--run-dir", str(tmp_path / "grpo")])  # fmt: skip
    assert grpo["iteration"] == 1 and math.isfinite(grpo["train/loss"])
    ppo = ppo_train.main([*common, "--n-steps", "2", "--total-steps", "20", "--batch-size", "2",
                          "--time-unit", "chunk", "--run-dir", str(tmp_path / "ppo")])  # fmt: skip
    assert ppo["iteration"] == 1 and math.isfinite(ppo["train/value_loss"]) and ppo["train/approx_kl"] > 0
    _, data = ckpt_io.latest_checkpoint(tmp_path / "ppo")
    assert data["policy"]["name"] == "policies.pi05:Pi05Policy"
