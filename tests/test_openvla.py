"""The original OpenVLA (causal Llama, the action tokens decoded one by one, one action per step) on
a tiny random checkpoint in the real on-disk layout: strict loading, greedy and sampled acting,
act / evaluate log-prob agreement with and without a KV cache, causal attention through the plain
Llama forward, batch independence, the imitation loss and ``trainers.bc``, clear errors for bad
inputs, LoRA, bfloat16, and GRPO on the real LIBERO simulator."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import requires_libero
from gymnasium import spaces
from test_openvla_oft import _obs, _take  # the same 32x32 observations and instructions

from policies.openvla import OpenVLAPolicy
from policies.openvla_oft.tiny import TINY_STATS, write_tiny_openvla
from policies.pretrained import read_state_dict
from policies.registry import make_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D, S = 7, 32
OBS_SPACE = spaces.Dict(
    {
        "image": spaces.Box(0, 255, (S, S, 3), np.uint8),
        "proprio": spaces.Box(-10, 10, (8,), np.float32),
        "instruction": spaces.Text(256),
    }
)
ACT_SPACE = spaces.Box(-1.0, 1.0, (D,), np.float32)
INSTRUCTIONS = (
    "Pick up the black bowl between the plate and the ramekin",
    "open the top drawer of the wooden cabinet and put the black bowl on it",
    "Xyz!",
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """One tiny checkpoint for the module (its statistics key is ``libero_spatial_no_noops``)."""
    return write_tiny_openvla(tmp_path_factory.mktemp("openvla") / "tiny")


def _policy(folder, obs_space=OBS_SPACE, act_space=ACT_SPACE, **kwargs) -> OpenVLAPolicy:
    kwargs.setdefault("unnorm_key", "libero_spatial")
    return OpenVLAPolicy(obs_space, act_space, model_path=folder, **kwargs)


@torch.no_grad()
def _teacher_forced(policy: OpenVLAPolicy, obs: dict, tokens: torch.Tensor) -> torch.Tensor:
    """Bin logits ``[B, D, 256]`` of the causal pass over the prompt and ``tokens`` ``[B, D]``."""
    return policy._teacher_forced(policy._prepare(obs), tokens)[0]


# ---------------------------------------------------------------------------------------------- loading
def test_loads_the_public_layout_strictly_with_the_model_cards_prompt(folder):
    policy = _policy(folder)  # "libero_spatial" falls back to "libero_spatial_no_noops"
    assert policy.unnorm_key == "libero_spatial_no_noops"
    assert torch.equal(policy.q01, torch.tensor(TINY_STATS["q01"]))
    assert torch.equal(policy.q99, torch.tensor(TINY_STATS["q99"]))
    files = read_state_dict(folder)
    state = policy.model.state_dict()
    assert set(state) == set(files) and all(torch.equal(state[k], files[k]) for k in files)
    assert not any(t.is_meta for t in [*policy.parameters(), *policy.buffers()])
    assert (policy.chunk_size, policy.action_dim, policy.log_prob_dim) == (1, D, D)
    assert policy.bins_start == 512 - 256  # the top 256 ids of the base vocabulary
    assert isinstance(make_policy("openvla", OBS_SPACE, ACT_SPACE, model_path=folder), OpenVLAPolicy)
    assert _policy(folder, act_space=spaces.Box(-1, 1, (1, D), np.float32)).chunk_size == 1

    ids, mask = policy._prepare(_obs())["input_ids"], policy._prepare(_obs())["attention_mask"]
    tokenizer = policy.layout.tokenizer
    real = ids[0][mask[0].bool()].tolist()
    assert real[0] == tokenizer.bos_token_id and tokenizer.convert_ids_to_tokens(real[-1]) == "▁"
    assert tokenizer.decode(real[1:-1]) == (
        "In: What action should the robot take to pick up the black bowl between the plate and the "
        "ramekin?\nOut:"
    )


# ------------------------------------------------------------------------------------------- acting
def test_greedy_acting_decodes_the_argmax_bin_token_by_token_through_the_plain_llama_forward(folder):
    policy = _policy(folder)
    obs = _obs()
    out = policy.act(obs, deterministic=True)
    tokens = out.replay["tokens"]
    assert out.log_probs is None and tokens.shape == (3, 1, D) and tokens.dtype == torch.int64
    assert out.actions.shape == (3, 1, D) and out.actions.dtype == torch.float32
    assert torch.equal(out.actions, policy.tokens_to_actions(tokens))
    assert out.value.shape == (3, 1) and torch.allclose(out.value, policy.value(obs), atol=1e-5)
    # each token is the argmax given the ones before it (teacher-forced causal pass)
    logits = _teacher_forced(policy, obs, tokens[:, 0])
    assert torch.equal(logits.argmax(-1), tokens[:, 0])
    assert torch.equal(_policy(folder, use_cache=False).act(obs, deterministic=True).replay["tokens"], tokens)

    # the same logits from LlamaForCausalLM's own forward (2D padding mask: causal masking), full vocabulary
    prepared = policy._prepare(obs)
    pixels = policy.model.vision_backbone.pixel_values(prepared["images"])
    with torch.no_grad():
        embeds, valid = policy.model.embed_prefix(prepared["input_ids"], prepared["attention_mask"], pixels)
        lm = policy.model.language_model
        embeds = torch.cat([embeds, lm.model.embed_tokens(tokens[:, 0, :-1] + 256)], 1)
        valid = torch.cat([valid, valid.new_ones(3, D - 1)], 1)
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        full = lm(inputs_embeds=embeds, attention_mask=valid.long(), position_ids=positions).logits
    assert full.shape[-1] == 576  # 512 + <PAD>, padded to a multiple of 64
    assert torch.allclose(full[:, -D:, 256:512], logits, atol=1e-5)


@pytest.mark.parametrize(("use_cache", "top_k"), [(True, 0), (False, 0), (True, 5)])
def test_act_then_evaluate_give_the_same_log_probs(folder, use_cache, top_k):
    policy = _policy(folder, temperature=1.6, top_k=top_k, use_cache=use_cache)
    obs = _obs()
    policy.seed(0)
    out = policy.act(obs)
    tokens = out.replay["tokens"]
    assert out.log_probs.shape == tokens.shape == (3, 1, D) and out.log_probs.dtype == torch.float32
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 256
    assert torch.equal(out.actions, policy.tokens_to_actions(tokens))

    # the reference formula on the teacher-forced logits: log_softmax(top_k(logits / T))[token]
    scaled = _teacher_forced(policy, obs, tokens[:, 0]) / 1.6
    if top_k:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        assert (scaled.gather(-1, tokens[:, 0, :, None]) >= kth).all()  # sampled within the top k
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    expected = torch.log_softmax(scaled, -1).gather(-1, tokens[:, 0, :, None])[..., 0]
    assert torch.allclose(out.log_probs[:, 0], expected, atol=1e-5)

    ev = policy.evaluate(out.replay)
    assert torch.allclose(ev.log_probs, out.log_probs, atol=1e-5)
    assert ev.entropy.shape == (3, 1, D) and (ev.entropy > 0).all()
    assert (ev.entropy <= math.log(top_k or 256) + 1e-4).all()
    assert torch.allclose(ev.value, out.value, atol=1e-5)
    (ev.log_probs.sum() + ev.value.sum()).backward()  # differentiable
    assert policy.model.language_model.lm_head.weight.grad is not None

    # decoding with or without the KV cache: the same draws, the same log-probs
    other = _policy(folder, temperature=1.6, top_k=top_k, use_cache=not use_cache)
    other.seed(0)
    again = other.act(obs)
    assert torch.equal(again.replay["tokens"], tokens)
    assert torch.allclose(again.log_probs, out.log_probs, atol=1e-5)


def test_seeded_sampling_and_replays_of_different_calls_stack(folder):
    policy = _policy(folder, temperature=1.6)
    obs = _obs()
    policy.seed(0)
    a = policy.act(obs)
    policy.seed(0)
    b = policy.act(obs)
    policy.seed(1)
    c = policy.act(obs)
    assert torch.equal(a.replay["tokens"], b.replay["tokens"]) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.replay["tokens"], c.replay["tokens"])
    greedy = policy.act(obs, deterministic=True)
    assert not torch.equal(a.replay["tokens"], greedy.replay["tokens"])

    policy.temperature, policy.top_k = 0.7, 3
    d = policy.act(_obs(INSTRUCTIONS[:1], seed=1))
    replay = {k: torch.cat([a.replay[k], d.replay[k]]) for k in a.replay}
    assert replay["top_k"].tolist() == [0, 0, 0, 3] and replay["temperature"][-1] == pytest.approx(0.7)
    ev = policy.evaluate(replay)  # each sample scored at its own temperature and top-k
    assert torch.allclose(ev.log_probs, torch.cat([a.log_probs, d.log_probs]), atol=1e-5)
    assert (ev.entropy[3] <= math.log(3) + 1e-4).all()


# -------------------------------------------------------------------------- attention and batching
def test_attention_is_causal_and_each_token_sees_the_ones_before(folder):
    policy = _policy(folder)
    obs = _obs()
    tokens = torch.randint(0, 256, (3, D), generator=torch.Generator().manual_seed(0))
    logits = _teacher_forced(policy, obs, tokens)
    changed = tokens.clone()
    changed[:, 3] = (changed[:, 3] + 100) % 256
    after = _teacher_forced(policy, obs, changed)
    assert torch.equal(after[:, :4], logits[:, :4])  # up to the token that predicts token 3: unchanged
    assert not torch.allclose(after[:, 4:], logits[:, 4:], atol=1e-4)  # later tokens see it
    # the first token's logits are those of the prompt alone (no later position leaks back)
    first = policy.act(obs, deterministic=True).replay["tokens"][:, 0, 0]
    assert torch.equal(logits[:, 0].argmax(-1), first)


def test_a_sample_computes_the_same_alone_in_a_batch_and_with_more_padding(folder):
    policy = _policy(folder)
    obs = _obs()
    lengths = [int(m.sum()) for m in policy.layout(INSTRUCTIONS)[1]]
    assert len(set(lengths)) == 3  # three prompt lengths: three amounts of padding
    tokens = torch.randint(0, 256, (3, D), generator=torch.Generator().manual_seed(1))
    logits = _teacher_forced(policy, obs, tokens)
    assert not torch.allclose(logits[0], logits[1], atol=1e-3)  # the samples do differ
    for i in range(3):
        alone = _teacher_forced(policy, _take(obs, [i]), tokens[i : i + 1])
        assert torch.allclose(alone[0], logits[i], atol=1e-5), i
    wide = _policy(folder, max_prompt_tokens=96)
    assert torch.allclose(_teacher_forced(wide, obs, tokens), logits, atol=1e-5)
    for cache in (True, False):  # decoding of a padded batch, too
        wide.use_cache = cache
        greedy = wide.act(obs, deterministic=True).replay["tokens"]
        assert torch.equal(greedy, policy.act(obs, deterministic=True).replay["tokens"])
    other_image = _teacher_forced(policy, {**obs, "image": obs["image"][::-1].copy()}, tokens)
    assert not torch.allclose(other_image[0], logits[0], atol=1e-3)  # the image is seen


# ---------------------------------------------------------------------------------- imitation
def test_imitation_loss_is_the_token_cross_entropy_and_a_few_steps_reduce_it(folder):
    torch.manual_seed(0)
    policy = _policy(folder)
    q01, q99 = torch.tensor(TINY_STATS["q01"]), torch.tensor(TINY_STATS["q99"])
    arm = q01[:6] + (q99[:6] - q01[:6]) * torch.rand(3, 1, 6)
    demo = torch.cat([arm, torch.tensor([[[1.0]], [[-1.0]], [[1.0]]])], dim=-1)
    tokens = policy.actions_to_tokens(demo)[:, 0]
    obs = _obs()
    logits = _teacher_forced(policy, obs, tokens)
    per_sample = -torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0].sum(-1)
    first = policy.imitation_loss(obs, demo)
    assert first.item() == pytest.approx(per_sample.mean().item(), rel=1e-5)
    mask = torch.tensor([[True], [False], [True]])
    assert policy.imitation_loss(obs, demo, mask).item() == pytest.approx(
        per_sample[[0, 2]].mean().item(), rel=1e-5
    )
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(5):
        loss = policy.imitation_loss(obs, demo)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    final = policy.imitation_loss(obs, demo).item()
    assert all(b < a for a, b in zip(losses, [*losses[1:], final])), (losses, final)  # every step helps
    assert final < 0.95 * first.item(), (first.item(), final)


def test_fine_tuned_on_demo_frames_it_decodes_the_demonstrated_bins(tmp_path):
    """Issue 33's proof at tiny size: Adam on three demo frames brings the token cross-entropy down
    10x (about 140 steps) and greedy token-by-token decoding then gives every demonstrated bin."""
    torch.manual_seed(0)
    policy = _policy(write_tiny_openvla(tmp_path / "tiny"))  # trained: not the module's folder
    q01, q99 = torch.tensor(TINY_STATS["q01"]), torch.tensor(TINY_STATS["q99"])
    arm = q01[:6] + (q99[:6] - q01[:6]) * torch.rand(3, 1, 6)
    demo = torch.cat([arm, torch.tensor([[[1.0]], [[-1.0]], [[1.0]]])], dim=-1)
    obs = _obs()
    first = policy.imitation_loss(obs, demo).item()
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(300):
        loss = policy.imitation_loss(obs, demo)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < first / 10:
            break
    assert loss.item() < first / 10, (first, loss.item())
    acted = policy.act(obs, deterministic=True).actions
    assert torch.equal(policy.actions_to_tokens(acted), policy.actions_to_tokens(demo))
    assert torch.equal(acted[..., 6], demo[..., 6])


class StandInEnv(gym.Env):
    """Camera image, proprio and an instruction; one 7-D action per step; nothing else."""

    def __init__(self):
        self.observation_space = OBS_SPACE
        self.action_space = ACT_SPACE

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


ENV_ID = "OpenVlaStandIn-v0"
if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=StandInEnv)


def test_trainers_bc_fine_tunes_it_with_statistics_from_the_demos(folder, tmp_path):
    from trainers import bc
    from trainers.checkpoint import latest_checkpoint, load_policy
    from trainers.datasets.demos import Episode, write_demos

    rng = np.random.default_rng(0)
    steps = 3
    episodes = [
        Episode(
            obs={
                "image": rng.integers(0, 256, (steps, S, S, 3), dtype=np.uint8),
                "proprio": rng.standard_normal((steps, 8)).astype(np.float32),
            },
            actions=np.concatenate(
                [rng.uniform(-0.8, 0.8, (steps, 1, D - 1)), rng.choice([-1.0, 1.0], (steps, 1, 1))], -1
            ).astype(np.float32),
            valid=np.ones((steps, 1), bool),
            rewards=np.zeros((steps, 1), np.float32),
            instruction="pick up the black bowl",
            success=True,
        )
        for _ in range(2)
    ]
    demos = write_demos(tmp_path / "demos.h5", episodes, {"env": ENV_ID})
    run_dir = tmp_path / "bc"
    result = bc.main([
        "--demos", str(demos), "--env", f"test_openvla:{ENV_ID}", "--policy", "openvla",
        "--policy-kwargs", json.dumps({"model_path": str(folder)}), "--epochs", "2", "--batch-size", "4",
        "--val-fraction", "0", "--eval-every", "-1", "--no-progress", "--no-tensorboard", "--no-video",
        "--num-envs", "1", "--run-dir", str(run_dir),
    ])  # fmt: skip
    assert math.isfinite(result["train/bc_loss"])
    stats = json.loads((run_dir / "checkpoints" / "dataset_statistics.json").read_text())
    assert list(stats) == ["demos"] and stats["demos"]["action"]["mask"] == [True] * 6 + [False]
    _, data = latest_checkpoint(run_dir)
    assert data["policy"]["name"] == "policies.openvla:OpenVLAPolicy"
    policy = load_policy(run_dir, OBS_SPACE, ACT_SPACE)
    assert isinstance(policy, OpenVLAPolicy) and policy.unnorm_key == "demos"
    np.testing.assert_allclose(policy.q01.numpy(), np.float32(stats["demos"]["action"]["q01"]))
    # the published recipe (trainers.bc's default for openvla): LoRA rank 32 on the frozen base
    fc3 = policy.model.projector.fc3
    assert torch.equal(fc3.weight, read_state_dict(folder)["projector.fc3.weight"])  # the base, frozen
    assert fc3.lora_A["default"].weight.shape[0] == 32
    assert fc3.lora_B["default"].weight.abs().sum() > 0  # the adapter trained (it starts at zero)


# --------------------------------------------------------------------------------------- bad inputs
def test_bad_inputs_are_named(folder, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="7-D actions, the env's actions are 6-D"):
        _policy(folder, act_space=spaces.Box(-1, 1, (6,), np.float32))
    with pytest.raises(ValueError, match=r"one action per step: expected an action space of shape \(D,\)"):
        _policy(folder, act_space=spaces.Box(-1, 1, (4, D), np.float32))
    with pytest.raises(ValueError, match=r"unnorm_key 'bridge_orig' not in.*\['libero_spatial_no_noops'\]"):
        _policy(folder, unnorm_key="bridge_orig")
    two_keys = {"libero_10_no_noops": {"action": TINY_STATS}}
    with pytest.raises(ValueError, match=r"statistics for \['libero_10_no_noops', 'libero_spa.*unnorm_key="):
        _policy(folder, unnorm_key=None, norm_stats=two_keys)
    assert _policy(folder, unnorm_key="libero_10", norm_stats=two_keys).unnorm_key == "libero_10_no_noops"
    with pytest.raises(ValueError, match="temperature must be > 0"):
        _policy(folder, temperature=0.0)
    with pytest.raises(ValueError, match="gripper must be 'libero' or None"):
        _policy(folder, gripper="bridge")
    with pytest.raises(ValueError, match="image key 'wrist_image'"):
        _policy(folder, image_keys=("wrist_image",))
    with pytest.raises(ValueError, match=r"LoRA target modules \['qkv_proj'\] are not in OpenVLA;"):
        _policy(folder, lora_rank=2, lora_targets=["q_proj", "qkv_proj"])
    with pytest.raises(RuntimeError, match="use_critic=False"):
        _policy(folder, use_critic=False).value(_obs())

    with pytest.raises(FileNotFoundError, match="OpenVLA checkpoint folder .* lacks config.json"):
        _policy(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="hf download nobody/nothing"):
        _policy("nobody/nothing")  # never downloaded without download=True
    with pytest.raises(ValueError, match="download=True needs a pinned revision"):
        _policy("nobody/nothing", download=True)


# ------------------------------------------------------------------------------- LoRA and bfloat16
def test_lora_starts_as_the_base_model_and_bfloat16_runs(folder):
    obs = _obs()
    tokens = torch.randint(0, 256, (3, D), generator=torch.Generator().manual_seed(2))
    base = _policy(folder)
    lora = _policy(folder, lora_rank=4, freeze_vision=True)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("value_head.") for n in trainable)
    assert not any("vision_backbone" in n for n in trainable)
    assert torch.allclose(_teacher_forced(lora, obs, tokens), _teacher_forced(base, obs, tokens), atol=1e-6)

    bf16 = _policy(folder, dtype="bfloat16", temperature=1.6)
    assert all(p.dtype == torch.bfloat16 for p in bf16.model.parameters())
    out = bf16.act(obs)
    assert out.actions.dtype == out.log_probs.dtype == out.value.dtype == torch.float32
    ev = bf16.evaluate(out.replay)
    assert torch.isfinite(ev.log_probs).all()
    # decoding and the teacher-forced pass round differently in bfloat16: close, not equal in general
    assert torch.allclose(ev.log_probs, out.log_probs, atol=0.05)


# ------------------------------------------------------------------------------------ LIBERO trainers
@pytest.mark.slow
@requires_libero
def test_grpo_on_libero_spatial_rescores_its_samples_exactly(folder, tmp_path):
    from trainers import checkpoint as ckpt
    from trainers.grpo import train as grpo_train

    env = {"chunk_size": None, "image_size": 32, "max_episode_steps": 8, "task_ids": [0]}
    policy_kwargs = {"model_path": str(folder), "unnorm_key": "libero_spatial", "temperature": 1.6}
    run_dir = tmp_path / "grpo"
    result = grpo_train.main([
        "--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps(env), "--policy", "openvla",
        "--policy-kwargs", json.dumps(policy_kwargs), "--num-envs", "2", "--group-size", "2",
        "--no-dynamic-sampling", "--total-steps", "16", "--eval-episodes", "1", "--no-progress",
        "--torch-threads", "1", "--run-dir", str(run_dir),
    ])  # fmt: skip
    assert result["iteration"] == 1 and math.isfinite(result["train/loss"])
    assert result["env/episode_len"] == 8.0
    # the stored replays rescored by evaluate give the sampled log-probs
    assert result["train/ratio"] == pytest.approx(1.0, abs=1e-5)
    assert result["train/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    _, data = ckpt.latest_checkpoint(run_dir)
    assert data["policy"]["name"] == "policies.openvla:OpenVLAPolicy"
    assert not any(k.startswith("value_head.") for k in data["policy"]["state_dict"])  # no critic
