"""OpenVLA-OFT (token actions, parallel decoding) on a tiny random checkpoint written in the real
on-disk layout: strict loading, act -> evaluate consistency, batch independence (padding and
position ids), the prompt layout, bidirectional attention with a STOP token, the bin /
un-normalization math, LoRA, bfloat16, clear errors for bad checkpoints and spaces, and GRPO / PPO
on the real LIBERO simulator."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import requires_libero
from gymnasium import spaces
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from policies.openvla_oft import OpenVLAOFTPolicy
from policies.openvla_oft.policy import PromptLayout
from policies.openvla_oft.tiny import TINY_STATS, write_tiny_openvla
from policies.pretrained import load_tokenizer
from trainers import checkpoint as ckpt
from trainers.grpo import train as grpo_train
from trainers.ppo import train as ppo_train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """One tiny checkpoint for the module (its statistics key is ``libero_spatial_no_noops``)."""
    return write_tiny_openvla(tmp_path_factory.mktemp("openvla") / "tiny")


K, D, S = 4, 7, 32
OBS_SPACE = spaces.Dict(
    {
        "image": spaces.Box(0, 255, (S, S, 3), np.uint8),
        "proprio": spaces.Box(-10, 10, (8,), np.float32),
        "instruction": spaces.Text(256),
    }
)
ACT_SPACE = spaces.Box(-1.0, 1.0, (K, D), np.float32)
INSTRUCTIONS = (
    "Pick up the black bowl between the plate and the ramekin",
    "open the top drawer of the wooden cabinet and put the black bowl on it",
    "Xyz!",
)


def _policy(folder, obs_space=OBS_SPACE, act_space=ACT_SPACE, **kwargs) -> OpenVLAOFTPolicy:
    kwargs.setdefault("unnorm_key", "libero_spatial")
    return OpenVLAOFTPolicy(obs_space, act_space, model_path=folder, **kwargs)


def _obs(instructions=INSTRUCTIONS, size: int = S, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = len(instructions)
    return {
        "image": rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
        "proprio": rng.standard_normal((n, 8)).astype(np.float32),
        "instruction": tuple(instructions),
    }


def _take(obs: dict, idx) -> dict:
    return {k: (tuple(v[i] for i in idx) if k == "instruction" else v[idx]) for k, v in obs.items()}


@torch.no_grad()
def _logits(policy: OpenVLAOFTPolicy, obs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Action-bin logits ``[B, K, D, 256]`` and the value feature ``[B, hidden]``."""
    return policy._forward(policy._prepare(obs))


def _copy(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "copy")


# ---------------------------------------------------------------------------------------------- loading
def test_tiny_checkpoint_has_the_real_layout_and_loads_strictly(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "openvla" and config["use_fused_vision_backbone"] is True
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and all((folder / s).is_file() for s in shards)
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    stats = json.loads((folder / "dataset_statistics.json").read_text())
    assert list(stats) == ["libero_spatial_no_noops"]
    assert stats["libero_spatial_no_noops"]["action"]["q01"] == TINY_STATS["q01"]

    files = {}
    for shard in shards:
        with safe_open(str(folder / shard), framework="pt") as f:
            files.update({key: f.get_tensor(key) for key in f.keys()})
    assert set(files) == set(index["weight_map"])

    policy = _policy(folder)  # "libero_spatial" falls back to "libero_spatial_no_noops"
    assert policy.unnorm_key == "libero_spatial_no_noops"
    assert _policy(folder, unnorm_key=None).unnorm_key == "libero_spatial_no_noops"  # the only key
    assert torch.equal(policy.q01, torch.tensor(TINY_STATS["q01"]))
    assert torch.equal(policy.q99, torch.tensor(TINY_STATS["q99"]))
    assert policy.mask.tolist() == TINY_STATS["mask"]
    state = policy.model.state_dict()
    assert set(state) == set(files)
    assert all(torch.equal(state[k], files[k]) for k in files)  # the file's weights, not random ones
    tensors = [*policy.parameters(), *policy.buffers()]
    assert not any(t.is_meta for t in tensors)
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # "auto" on CPU
    assert policy.model.vision_backbone.fused_featurizer is not None
    assert policy.chunk_size == K and policy.action_dim == D and policy.log_prob_dim == D
    assert policy.bins_start == 512 - 256  # the top 256 ids of the base vocabulary


def test_single_tower_single_file_checkpoint_with_two_images(tmp_path):
    folder = write_tiny_openvla(tmp_path / "unfused", fused=False, max_shard_bytes=None)
    assert (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").exists()
    camera = spaces.Box(0, 255, (S, S, 3), np.uint8)
    space = spaces.Dict({"image": camera, "wrist_image": camera, "instruction": spaces.Text(256)})
    policy = _policy(folder, obs_space=space, image_keys=("image", "wrist_image"))
    assert policy.model.vision_backbone.fused_featurizer is None
    assert set(policy.model.state_dict()) == set(load_file(str(folder / "model.safetensors")))
    obs = {k: v for k, v in _obs().items() if k != "proprio"}
    obs["wrist_image"] = obs["image"][::-1].copy()
    out = policy.act(obs)
    assert out.replay["images"].shape == (3, 2, S, S, 3)
    assert torch.allclose(policy.evaluate(out.replay).log_probs, out.log_probs, atol=1e-6)
    swapped = _logits(policy, {**obs, "wrist_image": obs["image"]})[0]
    assert not torch.allclose(swapped, _logits(policy, obs)[0], atol=1e-4)  # the wrist view is seen


# ------------------------------------------------------------------------------------ act / evaluate
@pytest.mark.parametrize("top_k", [0, 5])
def test_act_then_evaluate_give_the_same_log_probs(folder, top_k):
    policy = _policy(folder, temperature=1.6, top_k=top_k)
    obs = _obs()
    b = len(INSTRUCTIONS)
    out = policy.act(obs)
    assert out.actions.shape == (b, K, D) and out.actions.dtype == torch.float32
    assert out.log_probs.shape == (b, K, D) and out.log_probs.dtype == torch.float32
    assert out.value.shape == (b, 1)
    tokens = out.replay["tokens"]
    assert tokens.shape == (b, K, D) and tokens.dtype == torch.int64
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 256
    assert torch.equal(out.actions, policy.tokens_to_actions(tokens))

    # the reference formula: log_softmax(top_k(logits / T))[token]
    logits, _ = _logits(policy, obs)
    scaled = logits / 1.6
    if top_k:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        assert (scaled.gather(-1, tokens[..., None]) >= kth).all()  # sampled within the top k
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    expected = torch.log_softmax(scaled, -1).gather(-1, tokens[..., None])[..., 0]
    assert torch.allclose(out.log_probs, expected, atol=1e-5)

    ev = policy.evaluate(out.replay)
    assert torch.allclose(ev.log_probs, out.log_probs, atol=1e-6)
    assert ev.entropy.shape == (b, K, D)
    assert (ev.entropy > 0).all()
    assert (ev.entropy <= math.log(top_k or 256) + 1e-4).all()
    assert torch.allclose(ev.value, out.value, atol=1e-6)

    # evaluate is differentiable
    (ev.log_probs.sum() + ev.value.sum()).backward()
    assert policy.model.language_model.lm_head.weight.grad is not None
    assert policy.value_head.mlp[0].weight.grad is not None


def test_replays_of_different_calls_and_sampling_settings_stack(folder):
    policy = _policy(folder, top_k=0)
    first = policy.act(_take(_obs(), [0, 1]))
    policy.top_k, policy.temperature = 3, 0.7
    second = policy.act(_obs(INSTRUCTIONS[2:], seed=1))
    replay = {k: torch.cat([first.replay[k], second.replay[k]]) for k in first.replay}
    assert replay["top_k"].tolist() == [0, 0, 3] and replay["temperature"][-1] == pytest.approx(0.7)
    ev = policy.evaluate(replay)  # each sample is scored at its own temperature and top-k
    assert torch.allclose(ev.log_probs, torch.cat([first.log_probs, second.log_probs]), atol=1e-6)
    assert (ev.entropy[2] <= math.log(3) + 1e-4).all()


def test_value_types_deterministic_and_seeded_sampling(folder):
    obs = _obs()
    step = _policy(folder, value_type="step")
    assert step.act(obs).value.shape == (3, K)
    assert step.value(obs).shape == (3, K)
    no_critic = _policy(folder, use_critic=False)
    assert no_critic.value_head is None and no_critic.act(obs).value is None
    with pytest.raises(RuntimeError, match="use_critic=False"):
        no_critic.value(obs)

    policy = _policy(folder)
    greedy = policy.act(obs, deterministic=True)
    assert greedy.log_probs is None
    logits, _ = _logits(policy, obs)
    assert torch.equal(greedy.replay["tokens"], logits.argmax(-1))
    assert torch.equal(greedy.actions, policy.tokens_to_actions(logits.argmax(-1)))
    assert torch.allclose(greedy.value, policy.value(obs), atol=1e-6)

    policy.seed(0)
    a = policy.act(obs)
    policy.seed(0)
    b = policy.act(obs)
    policy.seed(1)
    c = policy.act(obs)
    assert torch.equal(a.replay["tokens"], b.replay["tokens"]) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.replay["tokens"], c.replay["tokens"])
    assert not torch.equal(a.replay["tokens"], greedy.replay["tokens"])  # T = 1.6 samples, not argmax


def test_images_are_resized_and_center_cropped_to_the_towers_size(folder):
    space = spaces.Dict({"image": spaces.Box(0, 255, (48, 40, 3), np.uint8), "instruction": spaces.Text(256)})
    obs = {k: v for k, v in _obs(size=48).items() if k != "proprio"}
    obs["image"] = obs["image"][:, :, :40]
    for crop in (None, 0.9):
        out = _policy(folder, obs_space=space, center_crop=crop).act(obs)
        assert out.replay["images"].shape == (3, 1, S, S, 3) and out.replay["images"].dtype == torch.uint8
        assert torch.isfinite(out.log_probs).all()


# -------------------------------------------------------------------------------- batch independence
def test_a_sample_computes_the_same_alone_in_a_batch_and_with_more_padding(folder):
    policy = _policy(folder)
    obs = _obs()
    lengths = [int(m.sum()) for m in policy.layout(INSTRUCTIONS)[1]]
    assert len(set(lengths)) == 3  # three prompt lengths: three amounts of padding
    logits, feature = _logits(policy, obs)
    assert not torch.allclose(logits[0], logits[1], atol=1e-3)  # the samples do differ
    for i in range(3):
        alone, alone_feature = _logits(policy, _take(obs, [i]))
        assert torch.allclose(alone[0], logits[i], atol=1e-5), i
        assert torch.allclose(alone_feature[0], feature[i], atol=1e-5), i

    wide = _policy(folder, max_prompt_tokens=96)
    assert wide.layout(INSTRUCTIONS)[0].shape == (3, 97)
    wide_logits, wide_feature = _logits(wide, obs)
    assert torch.allclose(wide_logits, logits, atol=1e-5)
    assert torch.allclose(wide_feature, feature, atol=1e-5)
    tokens = policy.act(obs, deterministic=True).replay["tokens"]
    assert torch.equal(wide.act(obs, deterministic=True).replay["tokens"], tokens)

    # both the image and the instruction matter
    other_image = _logits(policy, {**obs, "image": obs["image"][::-1].copy()})[0]
    assert not torch.allclose(other_image[0], logits[0], atol=1e-3)
    swapped = _logits(policy, {**obs, "instruction": INSTRUCTIONS[::-1]})[0]
    assert not torch.allclose(swapped[0], logits[0], atol=1e-3)


def test_attention_is_bidirectional_over_real_tokens_with_a_stop_token(folder):
    """Through transformers' Llama: every real token sees every other one (the OpenVLA-OFT fork's
    attention), so even the first element, read at the last prompt token, and the value feature
    depend on the placeholders and on the STOP token; padding keys are never seen."""
    policy = _policy(folder)
    tokenizer = policy.layout.tokenizer
    assert policy.stop_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("</s>")
    assert _policy(folder, append_stop=False).stop_id is None
    prepared = policy._prepare(_obs())
    pixels = policy.model.vision_backbone.pixel_values(prepared["images"])
    ids, mask = prepared["input_ids"], prepared["attention_mask"]
    with torch.no_grad():
        logits, feature = policy.model(ids, mask, pixels, 8, policy.stop_id)
        more, more_feature = policy.model(ids, mask, pixels, 12, policy.stop_id)
        no_stop, no_stop_feature = policy.model(ids, mask, pixels, 8, None)
        noisy_pads = torch.where(mask.bool(), ids, torch.randint_like(ids, 3, 500))
        noisy, noisy_feature = policy.model(noisy_pads, mask, pixels, 8, policy.stop_id)
    assert logits.shape == (3, 8, 576) and more.shape == (3, 12, 576) and feature.shape == (3, 32)
    assert not torch.allclose(more[:, 0], logits[:, 0], atol=1e-4)  # the prompt sees the placeholders
    assert not torch.allclose(more_feature, feature, atol=1e-4)
    assert not torch.allclose(no_stop[:, 0], logits[:, 0], atol=1e-4)  # ... and the STOP token
    assert not torch.allclose(no_stop_feature, feature, atol=1e-4)
    assert torch.allclose(noisy, logits, atol=1e-6) and torch.allclose(noisy_feature, feature, atol=1e-6)

    # the policy's logits are the model's over the action-bin ids (the top 256 of the base vocabulary)
    for stop in (policy.stop_id, None):
        with torch.no_grad():
            full = policy.model(ids, mask, pixels, K * D, stop)[0][..., 256:512]
        bins = _logits(_policy(folder, append_stop=stop is not None), _obs())[0]
        assert torch.allclose(bins.flatten(1, 2), full, atol=1e-5)


# -------------------------------------------------------------------------------------- prompt layout
def test_prompt_layout(folder):
    tokenizer = load_tokenizer(folder)
    layout = PromptLayout(tokenizer, 40)
    space = tokenizer.convert_tokens_to_ids("▁")
    ids, mask = layout(["Pick Up the BLACK bowl", "open the drawer"])
    assert ids.shape == mask.shape == (2, 41) and ids.dtype == mask.dtype == torch.int64

    expected_text = "In: What action should the robot take to pick up the black bowl?\nOut:"
    prompt = tokenizer(expected_text, add_special_tokens=False)["input_ids"] + [space]
    n = len(prompt)
    assert ids[0, 0] == tokenizer.bos_token_id and mask[0, 0] == 1
    assert (ids[0, 1 : 41 - n] == tokenizer.pad_token_id).all() and (mask[0, 1 : 41 - n] == 0).all()
    assert ids[0, 41 - n :].tolist() == prompt and (mask[0, 41 - n :] == 1).all()
    assert tokenizer.convert_ids_to_tokens(int(ids[0, -1])) == "▁"
    assert tokenizer.decode(ids[0, 41 - n : -1]) == expected_text
    assert tokenizer.decode(ids[1][mask[1].bool()][1:-1]) == (
        "In: What action should the robot take to open the drawer?\nOut:"
    )
    assert int(mask[0].sum()) == 1 + n and int(mask[1].sum()) < int(mask[0].sum())

    assert PromptLayout(tokenizer, n)(["pick up the black bowl"])[1].all()  # fits exactly: no padding
    with pytest.raises(ValueError, match=f"max_prompt_tokens={n - 1}"):
        PromptLayout(tokenizer, n - 1)(["pick up the black bowl"])
    policy = _policy(folder, max_prompt_tokens=8)
    with pytest.raises(ValueError, match="max_prompt_tokens=8"):
        policy.act(_obs())


# -------------------------------------------------------------------------------------- action math
def test_tokens_to_actions_against_hand_computed_values(folder):
    edges = torch.linspace(-1, 1, 256)
    centers = (edges[:-1] + edges[1:]) / 2
    q01, q99 = torch.tensor(TINY_STATS["q01"]), torch.tensor(TINY_STATS["q99"])
    tokens = torch.tensor(
        [
            [0, 1, 2, 127, 128, 254, 255],
            [255, 254, 128, 127, 2, 1, 0],
            [100, 30, 200, 7, 250, 64, 130],
        ]
    )
    norm = centers[(255 - tokens).clamp(max=254)]
    expected = 0.5 * (norm + 1) * (q99 - q01 + 1e-8) + q01

    libero = _policy(folder)
    raw = _policy(folder, gripper=None)
    for actions in (libero.tokens_to_actions(tokens), raw.tokens_to_actions(tokens)):
        assert torch.allclose(actions[:, :6], expected[:, :6], atol=1e-6)
    assert torch.allclose(raw.tokens_to_actions(tokens)[:, 6], norm[:, 6], atol=1e-7)  # mask False: as is
    assert libero.tokens_to_actions(tokens)[:, 6].tolist() == (-torch.sign(2 * norm[:, 6] - 1)).tolist()
    assert libero.tokens_to_actions(tokens)[:, 6].tolist() == [1.0, -1.0, 1.0]

    # a few values by hand: token 0 and 1 share the top center; 255 is the bottom one
    assert norm[0, 0] == norm[0, 1] == pytest.approx(1 - 1 / 255, abs=1e-6)
    assert norm[0, 6] == pytest.approx(-1 + 1 / 255, abs=1e-6)
    assert norm[0, 3] == pytest.approx(2 / 255, abs=1e-6) and norm[0, 4] == pytest.approx(0.0, abs=1e-6)
    mid = libero.tokens_to_actions(torch.full((7,), 128))  # the center bin -> the middle of [q01, q99]
    assert torch.allclose(mid[:6], (q01[:6] + q99[:6]) / 2, atol=1e-6)
    x = libero.tokens_to_actions(torch.tensor([[0, 0, 0, 0, 0, 0, 0]]))[0]
    assert x[0] == pytest.approx(0.5 * (2 - 1 / 255) * 1.65 - 0.75, abs=1e-6)
    assert x[6] == -1.0  # gripper near +1 (close in the normalized data) -> LIBERO's -1
    # every sampled action lies within the statistics' range
    out = libero.act(_obs())
    assert (out.actions[..., :6] >= q01[:6]).all() and (out.actions[..., :6] <= q99[:6]).all()
    assert set(out.actions[..., 6].unique().tolist()) <= {-1.0, 1.0}


# --------------------------------------------------------------------------------------------- LoRA
def test_imitation_loss_is_the_token_cross_entropy_and_fine_tunes_to_the_demos(folder):
    """SFT of the discrete-token variant: the loss is the cross-entropy of the demonstrated
    actions' bin tokens; a few hundred steps on three demo frames bring it down 10x and the
    deterministic action reproduces the demos (within a bin; the gripper exactly)."""
    torch.manual_seed(0)
    policy = _policy(folder)
    q01, q99 = torch.tensor(TINY_STATS["q01"]), torch.tensor(TINY_STATS["q99"])
    arm = q01[:6] + (q99[:6] - q01[:6]) * torch.rand(3, K, 6)
    gripper = torch.tensor([1.0, -1.0])[torch.randint(0, 2, (3, K, 1))]
    demo = torch.cat([arm, gripper], dim=-1)
    tokens = policy.actions_to_tokens(demo)
    assert torch.allclose(policy.tokens_to_actions(tokens)[..., 6], demo[..., 6])  # the gripper round trip
    bin_width = (q99[:6] - q01[:6]) / 255 * 1.01
    assert ((policy.tokens_to_actions(tokens)[..., :6] - demo[..., :6]).abs() <= bin_width).all()
    obs = _obs()
    logits, _ = _logits(policy, obs)
    by_hand = -torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0].sum(-1).mean()
    first = policy.imitation_loss(obs, demo)
    assert first.item() == pytest.approx(by_hand.item(), rel=1e-5)
    mask = torch.ones(3, K, dtype=torch.bool)
    mask[:, -1] = False  # sub-steps after an episode's end do not count
    assert policy.imitation_loss(obs, demo, mask).item() != pytest.approx(first.item())
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(300):
        loss = policy.imitation_loss(obs, demo)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (
            loss.item() < first.item() / 10
            and (policy.act(obs, deterministic=True).actions[..., 6] == demo[..., 6]).all()
        ):
            break
    assert loss.item() < first.item() / 10, (first.item(), loss.item())
    acted = policy.act(obs, deterministic=True).actions
    assert ((acted[..., :6] - demo[..., :6]).abs() <= bin_width).float().mean() > 0.95
    assert torch.equal(acted[..., 6], demo[..., 6])


def test_lora_trains_only_adapters_and_starts_as_the_base_model(folder):
    obs = _obs()
    torch.manual_seed(0)
    base = _policy(folder)
    torch.manual_seed(0)
    lora = _policy(folder, lora_rank=4)
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert all("lora_" in n or n.startswith("value_head.") for n in trainable)
    assert any(n.startswith("value_head.") for n in trainable)
    assert any("lora_" in n and "vision_backbone" in n for n in trainable)
    assert any("lora_" in n and "language_model" in n for n in trainable)
    assert any("lora_" in n and "projector" in n for n in trainable)
    assert sum(p.numel() for n, p in lora.named_parameters() if n in trainable) < 0.5 * sum(
        p.numel() for p in base.parameters()
    )

    # lora_B starts at zero: the same model
    base_logits, base_feature = _logits(base, obs)
    lora_logits, lora_feature = _logits(lora, obs)
    assert torch.allclose(lora_logits, base_logits, atol=1e-6)
    assert torch.allclose(lora_feature, base_feature, atol=1e-6)
    base_out = base.act(obs)
    ev = lora.evaluate(base_out.replay)
    assert torch.allclose(ev.log_probs, base_out.log_probs, atol=1e-6)

    before = {n: p.detach().clone() for n, p in lora.named_parameters()}
    optimizer = torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.5)
    loss = -ev.log_probs.sum() + ev.value.square().mean()
    loss.backward()
    assert all(p.grad is None for n, p in lora.named_parameters() if n not in trainable)
    optimizer.step()
    changed = {n for n, p in lora.named_parameters() if not torch.equal(p, before[n])}
    assert changed <= trainable
    assert any("lora_B" in n and "language_model" in n for n in changed)
    assert any("lora_B" in n and "vision_backbone" in n for n in changed)
    trained_logits = _logits(lora, obs)[0]
    assert not torch.allclose(trained_logits, base_logits, atol=1e-4)  # the adapters now act

    # what a checkpoint resume does: the same construction, then the state dict (strict)
    fresh = _policy(folder, lora_rank=4)
    assert fresh.load_state_dict(lora.state_dict()) is not None
    assert torch.equal(_logits(fresh, obs)[0], trained_logits)


def test_freeze_vision(folder):
    frozen = _policy(folder, freeze_vision=True)
    vision = dict(frozen.model.vision_backbone.named_parameters())
    assert vision and not any(p.requires_grad for p in vision.values())
    assert all(p.requires_grad for n, p in frozen.named_parameters() if "vision_backbone" not in n)

    lora = _policy(folder, freeze_vision=True, lora_rank=4)
    assert not any("lora_" in n for n, _ in lora.model.vision_backbone.named_parameters())
    assert not any(p.requires_grad for p in lora.model.vision_backbone.parameters())
    assert any(p.requires_grad and "lora_" in n for n, p in lora.model.language_model.named_parameters())
    adapted = {n.split(".lora_")[0] for n, _ in lora.model.projector.named_parameters() if "lora_" in n}
    assert adapted == {"fc1", "fc2", "fc3"}  # the projector keeps its adapters when vision is frozen


# ------------------------------------------------------------------------------------------ bfloat16
def test_bfloat16_runs_on_cpu_with_float32_outputs(folder):
    obs = _obs()
    policy = _policy(folder, dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in policy.model.parameters())
    out = policy.act(obs)
    assert out.actions.dtype == out.log_probs.dtype == out.value.dtype == torch.float32
    assert torch.isfinite(out.log_probs).all() and torch.isfinite(out.value).all()
    ev = policy.evaluate(out.replay)
    assert ev.log_probs.dtype == torch.float32
    assert torch.allclose(ev.log_probs, out.log_probs, atol=1e-6)
    # close to the float32 model (the same weights, rounded)
    logits16, _ = _logits(policy, obs)
    logits32, _ = _logits(_policy(folder, dtype="float32"), obs)
    assert logits16.dtype == torch.float32
    assert (logits16 - logits32).abs().max() < 0.05 * logits32.abs().max() + 1e-3
    with pytest.raises(ValueError, match="dtype must be"):
        _policy(folder, dtype="float16")


# --------------------------------------------------------------------------------------- bad inputs
def test_missing_files_and_hub_ids_are_named(folder, tmp_path, monkeypatch):
    copy = _copy(folder, tmp_path)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        _policy(copy)
    shutil.copy(folder / "tokenizer.json", copy / "tokenizer.json")
    (copy / "model-00002-of-00005.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00005.safetensors"):
        _policy(copy)
    (copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        _policy(copy)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="hf download nobody/nothing --revision 0123abc"):
        _policy("nobody/nothing@0123abc", download=True)
    with pytest.raises(ValueError, match="download=True needs a pinned revision"):
        _policy("nobody/nothing", download=True)  # never an unpinned download
    with pytest.raises(FileNotFoundError, match="neither a folder nor a hub id"):
        _policy(tmp_path / "absent" / "deeper" / "path")


def test_bad_statistics_and_spaces(folder, tmp_path):
    with pytest.raises(ValueError, match=r"available: \['libero_spatial_no_noops'\]"):
        _policy(folder, unnorm_key="bridge_orig")
    with pytest.raises(ValueError, match="7-D actions, the env's actions are 6-D"):
        _policy(folder, act_space=spaces.Box(-1, 1, (K, 6), np.float32))
    assert _policy(folder, act_space=spaces.Box(-1, 1, (D,), np.float32)).chunk_size == 1

    text = spaces.Text(256)
    no_image = spaces.Dict({"wrist_image": spaces.Box(0, 255, (S, S, 3), np.uint8), "instruction": text})
    with pytest.raises(ValueError, match="image key 'image'.*uint8 \\[H, W, 3\\]"):
        _policy(folder, obs_space=no_image)
    float_image = spaces.Dict({"image": spaces.Box(0, 1, (S, S, 3), np.float32), "instruction": text})
    with pytest.raises(ValueError, match="uint8 \\[H, W, 3\\]"):
        _policy(folder, obs_space=float_image)
    channels_first = spaces.Dict({"image": spaces.Box(0, 255, (3, S, S), np.uint8), "instruction": text})
    with pytest.raises(ValueError, match="uint8 \\[H, W, 3\\]"):
        _policy(folder, obs_space=channels_first)
    no_instruction = spaces.Dict({"image": spaces.Box(0, 255, (S, S, 3), np.uint8)})
    with pytest.raises(ValueError, match="'instruction'"):
        _policy(folder, obs_space=no_instruction)
    assert _policy(folder, obs_space=no_image, image_keys=("wrist_image",)).image_keys == ("wrist_image",)

    copy = _copy(folder, tmp_path)
    stats = json.loads((copy / "dataset_statistics.json").read_text())
    stats["libero_10_no_noops"] = stats["libero_spatial_no_noops"]
    (copy / "dataset_statistics.json").write_text(json.dumps(stats))
    with pytest.raises(ValueError, match=r"pass unnorm_key= one of them"):
        _policy(copy, unnorm_key=None)
    assert _policy(copy, unnorm_key="libero_10").unnorm_key == "libero_10_no_noops"

    with pytest.raises(ValueError, match="gripper"):
        _policy(folder, gripper="bridge")
    with pytest.raises(ValueError, match="value_type"):
        _policy(folder, value_type="token")
    with pytest.raises(ValueError, match="temperature"):
        _policy(folder, temperature=0.0)


def _shard_with(folder, key: str) -> str:
    return json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][key]


def test_tampered_weights_are_named(folder, tmp_path):
    copy = _copy(folder, tmp_path)
    key = "projector.fc3.weight"
    shard = copy / _shard_with(folder, key)
    original = load_file(str(shard))
    assert key in original

    tensors = {**original, key: torch.zeros(5, 3)}
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"wrong shape: projector\.fc3\.weight \(checkpoint \(5, 3\)"):
        _policy(copy)

    save_file({**original, "projector.fc4.weight": torch.zeros(2)}, str(shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"projector\.fc4\.weight.*is not listed"):
        _policy(copy)
    index_path = copy / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["projector.fc4.weight"] = shard.name
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"unexpected: projector\.fc4\.weight"):
        _policy(copy)

    del index["weight_map"]["projector.fc4.weight"]
    del index["weight_map"][key]
    index_path.write_text(json.dumps(index))
    save_file({k: v for k, v in original.items() if k != key}, str(shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing: projector\.fc3\.weight"):
        _policy(copy)


def test_inconsistent_config_is_named(folder, tmp_path):
    copy = _copy(folder, tmp_path)
    config_path = copy / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "image_sizes": [224, 224]}))
    with pytest.raises(ValueError, match=r"image_sizes \[224, 224\] disagree with tower input size 32"):
        _policy(copy)
    config_path.write_text(json.dumps({**config, "model_type": "llava"}))
    with pytest.raises(ValueError, match="expected 'openvla'"):
        _policy(copy)
    # without vision_specs the towers are the real 224 px ones of timm_model_ids: far larger weights
    real_towers = {k: v for k, v in config.items() if k != "vision_specs"}
    config_path.write_text(json.dumps({**real_towers, "image_sizes": [224, 224]}))
    with pytest.raises(ValueError, match=r"wrong shape: .*vision_backbone\.f"):
        _policy(copy)
    config_path.write_text(json.dumps({**real_towers, "timm_model_ids": ["vit_base_patch16_clip_224"] * 2}))
    with pytest.raises(ValueError, match="unsupported vision tower.*vit_base_patch16_clip_224"):
        _policy(copy)


# ------------------------------------------------------------------------------------ LIBERO trainers
LIBERO_ENV = {
    "chunk_size": 8,
    "image_size": 32,
    "max_episode_steps": 16,
    "task_ids": [0],
    "envs_per_worker": 2,
}


def _libero_args(folder, run_dir) -> list[str]:
    policy_kwargs = {"model_path": str(folder), "unnorm_key": "libero_spatial"}
    return [
        "--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps(LIBERO_ENV),
        "--policy", "openvla_oft", "--policy-kwargs", json.dumps(policy_kwargs),
        "--num-envs", "2", "--no-progress", "--torch-threads", "1", "--eval-episodes", "1",
        "--run-dir", str(run_dir),
    ]  # fmt: skip


@pytest.mark.slow
@requires_libero
def test_grpo_and_ppo_on_libero_spatial(folder, tmp_path):
    run_dir = tmp_path / "grpo"
    grpo_args = ["--group-size", "2", "--no-dynamic-sampling", "--total-steps", "32"]
    first = grpo_train.main([*_libero_args(folder, run_dir), *grpo_args])
    assert first["iteration"] == 1 and math.isfinite(first["train/loss"])
    assert first["env/episode_len"] == 16.0 and 0.0 <= first["eval/success"] <= 1.0
    # one on-policy update: the trainer's stored replay rescored by evaluate gives the sampled log-probs
    assert first["train/ratio"] == pytest.approx(1.0, abs=1e-5)
    assert first["train/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    _, data = ckpt.latest_checkpoint(run_dir)
    assert data["policy"]["name"] == "policies.openvla_oft:OpenVLAOFTPolicy"
    kwargs = {"model_path": str(folder), "unnorm_key": "libero_spatial", "use_critic": False}
    assert data["policy"]["kwargs"] == kwargs  # GRPO trains no critic
    state = data["policy"]["state_dict"]
    assert "model.projector.fc3.weight" in state and not any(k.startswith("value_head.") for k in state)

    final = grpo_train.main(["--resume", str(run_dir), "--total-steps", "64", "--no-progress"])
    assert final["iteration"] == 2 and math.isfinite(final["train/loss"])
    assert ckpt.latest_checkpoint(run_dir)[1]["counters"]["env_steps"] == 64

    run_dir = tmp_path / "ppo"
    ppo_args = ["--n-steps", "2", "--total-steps", "32", "--batch-size", "2", "--time-unit", "chunk"]
    result = ppo_train.main([*_libero_args(folder, run_dir), *ppo_args])
    assert result["iteration"] == 1 and result["train/updates"] > 0
    assert math.isfinite(result["train/loss"]) and math.isfinite(result["train/value_loss"])
    _, data = ckpt.latest_checkpoint(run_dir)
    assert data["policy"]["name"] == "policies.openvla_oft:OpenVLAOFTPolicy"
    state = data["policy"]["state_dict"]
    assert "value_head.mlp.0.weight" in state
    key = "projector.fc3.weight"
    pretrained = load_file(str(folder / _shard_with(folder, key)))[key]
    assert not torch.equal(state[f"model.{key}"], pretrained)  # PPO fine-tuned the pretrained weights


def test_checkpoints_leave_out_frozen_pretrained_weights(folder, tmp_path):
    from trainers.checkpoint import load_policy_state, policy_state

    lora = _policy(folder, lora_rank=4, freeze_vision=True)
    state, omitted = policy_state(lora)
    assert omitted and all("lora_" not in k and "value_head" not in k for k in omitted)
    assert all("lora_" in k or "value_head" in k for k in state if k in dict(lora.named_parameters()))
    full = sum(v.numel() for v in lora.state_dict().values())
    assert sum(v.numel() for v in state.values()) < 0.5 * full  # the frozen tiny model is most of it
    with torch.no_grad():
        for p in lora.parameters():
            if p.requires_grad:
                p.add_(0.01)  # "training"
    fresh = _policy(folder, lora_rank=4, freeze_vision=True)
    load_policy_state(fresh, {"state_dict": state, "omitted": omitted}, "ckpt")
    obs = _obs()
    torch.testing.assert_close(fresh._forward(fresh._prepare(obs))[0], lora._forward(lora._prepare(obs))[0])
    del state[next(k for k in state if "lora_" in k)]
    with pytest.raises(ValueError, match="missing"):
        load_policy_state(fresh, {"state_dict": state, "omitted": omitted}, "ckpt")
    assert policy_state(_policy(folder))[1] == []  # full fine-tuning keeps everything
