"""Cosmos Policy on a tiny random checkpoint folder in the real layout: latent injection and
read-out, the sampler's sigmas and clean frames, act/evaluate agreement of the stochastic step,
best-of-N planning, bad input, and a GRPO iteration on the real LIBERO simulator."""

from __future__ import annotations

import json
import math
import pickle
import shutil

import numpy as np
import pytest
import torch
from conftest import requires_libero
from gymnasium import spaces

from envs.core.spaces import FieldBox
from nets.cosmos_dit import CosmosDiT
from policies.cosmos_policy import CosmosPolicy, layout
from policies.cosmos_policy.policy import axis_angle_to_quat_xyzw, policy_sigmas
from policies.cosmos_policy.tiny import INSTRUCTIONS, TINY_STATS, write_tiny_cosmos_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IMG = spaces.Box(0, 255, (32, 32, 3), np.uint8)
OBS_SPACE = spaces.Dict(
    {
        "image": IMG,
        "wrist_image": IMG,
        "proprio": FieldBox(-10, 10, (("eef_pos", 3), ("eef_axis_angle", 3), ("gripper_qpos", 2))),
        "instruction": spaces.Text(200),
    }
)
ACT_SPACE = spaces.Box(-1, 1, (8, 7), np.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_cosmos_policy(tmp_path_factory.mktemp("cosmos_policy") / "ckpt")


def make(folder, **kwargs) -> CosmosPolicy:
    return CosmosPolicy(OBS_SPACE, ACT_SPACE, model_path=folder, image_size=32, **{"num_steps": 3, **kwargs})


def _obs(b: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 255, (b, 32, 32, 3), dtype=np.uint8),
        "wrist_image": rng.integers(0, 255, (b, 32, 32, 3), dtype=np.uint8),
        "proprio": (rng.normal(size=(b, 8)) * 0.2).astype(np.float32),
        "instruction": list(INSTRUCTIONS[:b]),
    }


def test_vectors_round_trip_through_latent_frames():
    latents = torch.randn(2, 16, 9, 28, 28)  # the real LIBERO latent: 12544 values per frame
    actions = torch.rand(2, 16 * 7) * 2 - 1
    written = layout.write_vector(latents, 4, actions)
    flat = written[:, :, 4].flatten(1)
    assert torch.equal(flat[:, :112], actions) and torch.equal(
        flat[:, 112 * 111 :], actions
    )  # 112 whole copies
    assert torch.equal(written[:, :, :4], latents[:, :, :4]) and torch.equal(
        written[:, :, 5:], latents[:, :, 5:]
    )
    assert torch.equal(layout.read_vector(written, 4, 112), actions)  # exact round trip
    proprio = torch.randn(2, 9)  # 12544 = 1393 * 9 + 7: a partial last copy
    assert torch.equal(layout.read_vector(layout.write_vector(latents, 1, proprio), 1, 9), proprio)
    value = layout.write_vector(latents, 8, torch.tensor([[0.3], [-0.5]]))
    assert torch.equal(value[:, :, 8], torch.tensor([0.3, -0.5])[:, None, None, None].expand(2, 16, 28, 28))
    low, high = torch.tensor(TINY_STATS["actions_min"]), torch.tensor(TINY_STATS["actions_max"])
    x = low + (high - low) * torch.rand(5, 7)
    torch.testing.assert_close(layout.minmax_unnormalize(layout.minmax_normalize(x, low, high), low, high), x)


def test_video_layout():
    wrist = torch.full((1, 8, 8, 3), 255, dtype=torch.uint8)
    primary = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    video = layout.build_video(wrist, primary)
    assert video.shape == (1, 3, 33, 8, 8)
    first = video[0, 0, :, 0, 0].tolist()  # per pixel frame: -1 black / zero image, +1 white (wrist)
    assert first[:5] == [-1.0] * 5  # blank + 4 proprio frames
    assert first[5:9] == [1.0] * 4 and first[9:13] == [-1.0] * 4  # wrist x4, primary x4
    assert first[13:21] == [-1.0] * 8  # actions, future proprio
    assert first[21:25] == [1.0] * 4 and first[25:29] == [-1.0] * 4 and first[29:] == [-1.0] * 4


def test_sampler_sigmas_calls_and_clean_frames(folder):
    assert policy_sigmas(5) == pytest.approx([80.0, 42.29, 20.97, 9.62, 4.0], abs=5e-3)
    assert policy_sigmas(1) == [80.0]
    policy = make(folder, num_steps=4)
    seen = []
    hook = policy.dit.register_forward_hook(lambda m, args, out: seen.append(args[1].detach().clone()))
    policy.seed(0)
    policy.act(_obs(), deterministic=True)
    hook.remove()
    assert len(seen) == 4  # N steps = N network calls
    assert all(torch.equal(t[:, :4], torch.zeros_like(t[:, :4])) for t in seen)  # clean frames at timestep 0
    first, last = seen[0][0, 4].item(), seen[-1][0, 4].item()
    assert first == pytest.approx(80 / 81, rel=1e-3) and last == pytest.approx(
        4 / 5, rel=1e-3
    )  # t = s / (1 + s)
    # the DiT is the world model's class (shared code), loaded strictly from the .pt
    assert isinstance(policy.dit, CosmosDiT) and policy.dit.config.action_dim is None


def test_proprio_and_images_reach_the_conditioning_frames(folder):
    policy = make(folder)
    obs = _obs(1)
    cond = policy._prepare(obs)["cond"]
    pos, axis_angle, grip = obs["proprio"][0, :3], obs["proprio"][0, 3:6], obs["proprio"][0, 6:]
    quat = axis_angle_to_quat_xyzw(torch.tensor(axis_angle))
    expected = torch.cat([torch.tensor(grip), torch.tensor(pos), quat])
    low, high = torch.tensor(TINY_STATS["proprio_min"]), torch.tensor(TINY_STATS["proprio_max"])
    torch.testing.assert_close(
        layout.read_vector(cond, 1, 9)[0], layout.minmax_normalize(expected, low, high)
    )
    other = dict(obs, image=255 - obs["image"])
    assert not torch.equal(policy._prepare(other)["cond"][:, :, 3], cond[:, :, 3])  # primary image frame
    # the fields are read by name: another order in the space, the same conditioning
    fields = (("gripper_qpos", 2), ("eef_axis_angle", 3), ("extra", 1), ("eef_pos", 3))
    space = spaces.Dict({**OBS_SPACE.spaces, "proprio": FieldBox(-10, 10, fields)})
    reordered = CosmosPolicy(space, ACT_SPACE, model_path=folder, image_size=32, num_steps=3)
    moved = dict(obs, proprio=np.concatenate([grip, axis_angle, [7.0], pos])[None].astype(np.float32))
    torch.testing.assert_close(reordered._prepare(moved)["cond"], cond)
    plain = spaces.Dict({**OBS_SPACE.spaces, "proprio": spaces.Box(-10, 10, (8,), np.float32)})
    with pytest.raises(
        ValueError, match="reads the proprio fields .* by name; the proprio space has fields none"
    ):
        CosmosPolicy(plain, ACT_SPACE, model_path=folder, image_size=32)
    from envs.libero.sim import quat_xyzw_to_axis_angle

    q = torch.nn.functional.normalize(torch.tensor([0.3, -0.2, 0.5, 0.8]), dim=0)
    axis_angle = torch.tensor(quat_xyzw_to_axis_angle(q.numpy()), dtype=torch.float32)
    torch.testing.assert_close(axis_angle_to_quat_xyzw(axis_angle), q)  # the env's conversion, inverted


def test_act_and_evaluate_agree_on_the_stochastic_step(folder):
    policy = make(folder, num_steps=4)
    replays = []
    for seed in range(4):
        policy.seed(seed)
        out = policy.act(_obs(seed=seed))
        assert (
            out.actions.shape == (3, 8, 7) and out.log_probs.shape == (3, 8, 7) and out.value.shape == (3, 1)
        )
        ev = policy.evaluate(out.replay)
        torch.testing.assert_close(ev.log_probs, out.log_probs, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(ev.value, out.value)  # the critic: the value frame at step k
        replays.append(out.replay)
    steps = {int(r["step"][0]) for r in replays}
    assert len(steps) > 1  # different stochastic steps across calls
    stacked = {k: torch.cat([r[k] for r in replays]) for k in replays[0]}
    assert policy.evaluate(stacked).log_probs.shape == (12, 8, 7)
    loss = -policy.evaluate(replays[0]).log_probs.mean()
    loss.backward()
    assert policy.dit.final_layer.linear.weight.grad is not None
    deterministic = policy.act(_obs(), deterministic=True)
    assert deterministic.log_probs is None and 0 <= float(policy.predicted_value.min()) <= 1
    assert torch.equal(deterministic.value[:, 0], policy.predicted_value)
    assert policy.value(_obs()).shape == (3, 1)
    assert make(folder, use_critic=False).act(_obs()).value is None
    with pytest.raises(ValueError, match="deterministic"):
        policy.evaluate(deterministic.replay)


def test_planning_returns_the_proposal_with_the_highest_value(folder):
    policy = make(folder, num_proposals=4)
    obs = _obs()
    policy.seed(7)
    planned = policy.act(obs, deterministic=True)
    values = policy.proposal_values
    assert values.shape == (3, 4)
    policy.seed(7)  # the same noise again, all proposals read out
    prepared = policy._prepare(obs)
    cond, text = prepared["cond"].repeat_interleave(4, 0), prepared["text"].repeat_interleave(4, 0)
    x0_fn = policy._x0_fn(policy._full_cond(cond), 4, text)
    x0, _ = policy._sample(x0_fn, (12, 16, 9, 4, 4), policy.sigmas)
    actions, all_values = policy._read(x0)
    torch.testing.assert_close(all_values.reshape(3, 4), values)
    best = values.argmax(1)
    torch.testing.assert_close(planned.actions, actions.reshape(3, 4, 8, 7)[torch.arange(3), best])
    auto = make(folder, num_proposals=2, planning="autoregressive", num_future_samples=2, num_value_samples=2)
    out = auto.act(obs, deterministic=True)
    assert out.actions.shape == (3, 8, 7) and auto.proposal_values.shape == (3, 2)


def test_bad_input_is_named(folder, tmp_path):
    with pytest.raises(ValueError, match=r"expected \(K, 7\) with K <= 16"):
        CosmosPolicy(OBS_SPACE, spaces.Box(-1, 1, (17, 7), np.float32), model_path=folder, image_size=32)
    with pytest.raises(KeyError, match="no T5 embedding for instruction 'open the oven'"):
        make(folder).act(dict(_obs(1), instruction=["open the oven"]))
    with pytest.raises(ValueError, match="RL needs num_steps >= 2"):
        make(folder, num_steps=1).act(_obs())
    with pytest.raises(ValueError, match="best-of-N planning is for deterministic"):
        make(folder, num_proposals=2).act(_obs())
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    shutil.rmtree(broken / "tokenizer")
    with pytest.raises(FileNotFoundError, match="pass vae_path="):
        make(broken)
    shutil.copytree(folder / "tokenizer", broken / "tokenizer")
    (broken / "libero_t5_embeddings.pkl").unlink()
    with pytest.raises(FileNotFoundError, match=r"expected one text embeddings file"):
        make(broken)
    with open(broken / "libero_t5_embeddings.pkl", "wb") as f:
        pickle.dump({"x": torch.zeros(1, 4, 32)}, f)
    stats = json.loads((folder / "libero_dataset_statistics.json").read_text())
    (broken / "libero_dataset_statistics.json").write_text(json.dumps({**stats, "proprio_min": [0.0] * 8}))
    with pytest.raises(ValueError, match="proprio_min"):
        make(broken)
    (broken / "libero_dataset_statistics.json").write_text(json.dumps(stats))
    from nets.cosmos_tiny import write_tiny_dit_checkpoint

    (broken / "Cosmos-Policy-LIBERO-Tiny.pt").unlink()
    write_tiny_dit_checkpoint(broken / "world_model.pt", action_dim=84, ema=False)
    with pytest.raises(ValueError, match="action-conditioned world-model DiT"):
        make(broken)


def test_a_predict2p5_folder_reads_reason1_embeddings_through_the_dits_projection(tmp_path):
    """A Predict2.5 Cosmos Policy (DiT with ``crossattn_proj``, ``*reason1_embeddings.pkl``): the
    context is ``GELU(crossattn_proj(embedding))``, the recipe's noise is Predict2.5's, and the
    folders that do not fit are refused naming both sides."""
    folder = write_tiny_cosmos_policy(tmp_path / "p25", reason1_dim=48)
    assert not list(folder.glob("*t5_embeddings.pkl"))
    policy = make(folder)
    assert policy.sft_noise == "predict2.5" and policy.text_table.shape[-1] == 48
    ids = policy._text_ids_of(_obs())
    raw = policy.text_table[ids]
    proj = policy.dit.crossattn_proj[0]
    torch.testing.assert_close(policy.text_context(ids), torch.nn.functional.gelu(proj(raw)))
    assert policy.text_context(ids).shape[-1] == policy.dit.config.crossattn_emb_channels
    out = policy.act(_obs(), deterministic=True)
    assert out.actions.shape == (3, 8, 7) and torch.isfinite(out.actions).all()
    # a Predict2 folder's T5 embeddings beside them: which one is meant is not guessed
    t5 = write_tiny_cosmos_policy(tmp_path / "p2")
    shutil.copy(t5 / "libero_t5_embeddings.pkl", folder)
    with pytest.raises(FileNotFoundError, match="expected one text embeddings file"):
        make(folder)
    # T5 embeddings for a Predict2.5 DiT (and Reason1 ones for Predict2) are refused
    (folder / "libero_reason1_embeddings.pkl").unlink()
    with pytest.raises(ValueError, match="are 32-D, the DiT takes 48-D Reason1 embeddings"):
        make(folder)
    (t5 / "libero_t5_embeddings.pkl").unlink()
    with open(t5 / "libero_reason1_embeddings.pkl", "wb") as f:
        pickle.dump({text: torch.zeros(1, 4, 48) for text in INSTRUCTIONS}, f)
    with pytest.raises(ValueError, match="are 48-D, the DiT takes 32-D T5 embeddings"):
        make(t5)


@pytest.mark.slow
@requires_libero
def test_grpo_and_ppo_iterations_on_libero(folder, tmp_path):
    from trainers.grpo import train as grpo_train
    from trainers.ppo import train as ppo_train

    env = {"chunk_size": 8, "image_size": 32, "max_episode_steps": 16, "task_ids": [0], "envs_per_worker": 2}
    policy = {"model_path": str(folder), "image_size": 32, "num_steps": 2}
    result = grpo_train.main([
        "--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps(env), "--policy", "cosmos_policy",
        "--policy-kwargs", json.dumps(policy), "--num-envs", "2", "--group-size", "2",
        "--no-dynamic-sampling", "--total-steps", "32", "--eval-episodes", "1",
        "--run-dir", str(tmp_path / "run"), "--no-progress", "--torch-threads", "1",
    ])  # fmt: skip
    assert result["iteration"] == 1 and math.isfinite(result["train/loss"])
    assert result["train/approx_kl"] == pytest.approx(0.0, abs=1e-4)  # stored replays rescore exactly
    ppo = ppo_train.main([
        "--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps(env), "--policy", "cosmos_policy",
        "--policy-kwargs", json.dumps(policy), "--num-envs", "2", "--n-steps", "2", "--batch-size", "2",
        "--time-unit", "chunk", "--total-steps", "32", "--eval-episodes", "1",
        "--run-dir", str(tmp_path / "ppo"), "--no-progress", "--torch-threads", "1",
    ])  # fmt: skip
    assert (
        ppo["iteration"] == 1 and math.isfinite(ppo["train/value_loss"]) and math.isfinite(ppo["train/loss"])
    )
