"""OpenVLA-OFT with the continuous L1-regression action head (``action_head="l1"``) on a tiny random
checkpoint in the real layout: the head file's names and loading, the head reading the action
positions' hidden states, L1 imitation loss and a fine-tune to demo frames, the Laplace sampling's
log-probs (act == evaluate), saving and loading with trainer checkpoints, statistics passed in."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gymnasium import spaces

from policies.openvla_oft import OpenVLAOFTPolicy
from policies.openvla_oft.action_heads import find_head_file, read_head_state, write_head_file
from policies.openvla_oft.tiny import TINY_STATS, write_tiny_openvla
from trainers.checkpoint import load_policy_state, policy_state

pytestmark = pytest.mark.usefixtures("one_torch_thread")

K, D, S = 4, 7, 32
OBS_SPACE = spaces.Dict({"image": spaces.Box(0, 255, (S, S, 3), np.uint8), "instruction": spaces.Text(256)})
ACT_SPACE = spaces.Box(-1.0, 1.0, (K, D), np.float32)
# the public head's parameter names (prismatic/models/action_heads.py, 2 residual blocks)
BLOCKS = tuple(f"mlp_resnet_blocks.{i}.ffn.{j}" for i in (0, 1) for j in (0, 1))
HEAD_KEYS = {
    f"model.{name}.{p}"
    for name in ("layer_norm1", "fc1", "layer_norm2", "fc2", *BLOCKS)
    for p in ("weight", "bias")
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_openvla(tmp_path_factory.mktemp("oft_l1") / "tiny", action_head=True)


def _policy(folder, **kwargs) -> OpenVLAOFTPolicy:
    kwargs.setdefault("unnorm_key", "libero_spatial")
    kwargs.setdefault("action_head", "l1")
    kwargs.setdefault("use_critic", False)
    return OpenVLAOFTPolicy(OBS_SPACE, ACT_SPACE, model_path=folder, **kwargs)


def _obs(n: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    words = ("pick up the black bowl", "open the top drawer", "put the bowl on the stove")
    return {
        "image": rng.integers(0, 256, (n, S, S, 3), dtype=np.uint8),
        "instruction": tuple(words[i % 3] for i in range(n)),
    }


def test_head_file_has_the_public_names_and_loads_strictly(folder, tmp_path):
    path = find_head_file(folder)
    assert path.name == "action_head--0_checkpoint.pt"
    raw = torch.load(path, weights_only=True)
    assert {k.removeprefix("module.") for k in raw} == HEAD_KEYS and all(k.startswith("module.") for k in raw)
    policy = _policy(folder)
    hidden = policy.model.language_model.config.hidden_size
    assert raw["module.model.fc1.weight"].shape == (hidden, D * hidden)  # K steps x (D hidden states)
    for key, value in read_head_state(path).items():
        torch.testing.assert_close(policy.action_head.state_dict()[key], value)
    # the tokens mode of the same folder ignores the head file
    assert _policy(folder, action_head="tokens").action_head is None

    bare = shutil.copytree(folder, tmp_path / "bare")
    path_in_bare = find_head_file(bare)
    path_in_bare.unlink()
    with pytest.raises(FileNotFoundError, match=r"action_head--\*checkpoint.pt.*new_action_head=True"):
        _policy(bare)
    assert _policy(bare, new_action_head=True).action_head is not None
    # a head of another width or action size is refused, naming both sides
    bad = {k: v for k, v in raw.items()}
    bad["module.model.fc2.weight"] = torch.zeros(6, bad["module.model.fc2.weight"].shape[1])
    torch.save(bad, path_in_bare)
    with pytest.raises(ValueError, match=r"wrong shape: model.fc2.weight.*7-D actions"):
        _policy(bare)
    torch.save({k: v for k, v in raw.items()}, bare / "action_head--5_checkpoint.pt")
    with pytest.raises(ValueError, match="several action heads"):
        _policy(bare)
    with pytest.raises(ValueError, match="action_head must be 'tokens' or 'l1'"):
        _policy(folder, action_head="diffusion")


@torch.no_grad()
def test_head_reads_the_action_positions_hidden_states(folder):
    policy = _policy(folder).eval()
    obs = _obs()
    prepared = policy._prepare(obs)
    pixels = policy.model.vision_backbone.pixel_values(prepared["images"])
    n = K * D
    logits, _ = policy.model(prepared["input_ids"], prepared["attention_mask"], pixels, n, policy.stop_id)
    hidden, _ = policy.model(
        prepared["input_ids"], prepared["attention_mask"], pixels, n, policy.stop_id, "hidden"
    )
    # the logits are the LM head over the same hidden states the L1 head reads
    torch.testing.assert_close(policy.model.language_model.lm_head(hidden).float(), logits)
    by_hand = policy.action_head.model(hidden.reshape(3, K, D * hidden.shape[-1]))
    mean, _ = policy._forward(prepared)
    torch.testing.assert_close(mean, by_hand)
    acted = policy.act(obs, deterministic=True)
    expected = policy.normalized_to_actions(mean).clamp(-1, 1)
    torch.testing.assert_close(acted.actions, expected)
    assert acted.log_probs is None and set(acted.actions[..., 6].unique().tolist()) <= {-1.0, 1.0}


def test_sampling_is_laplace_and_evaluate_gives_the_acted_log_probs(folder):
    policy = _policy(folder, l1_scale=0.1, temperature=2.0).eval()
    policy.seed(0)
    obs = _obs()
    out = policy.act(obs)
    replay = out.replay
    torch.testing.assert_close(replay["scale"], torch.full((3,), 0.2))
    ev = policy.evaluate(replay)
    torch.testing.assert_close(ev.log_probs, out.log_probs)
    mean, _ = policy._forward(policy._prepare(obs))
    by_hand = torch.distributions.Laplace(mean, 0.2).log_prob(replay["normalized"])
    torch.testing.assert_close(out.log_probs, by_hand)
    torch.testing.assert_close(ev.entropy, torch.distributions.Laplace(mean, 0.2).entropy())
    # the samples spread around the head's output at the Laplace scale (mean |x - mu| = scale)
    many = torch.cat([policy.act(obs).replay["normalized"] - mean for _ in range(30)])
    assert many.abs().mean().item() == pytest.approx(0.2, rel=0.1)
    # seeded sampling repeats
    policy.seed(3)
    a = policy.act(obs).actions
    policy.seed(3)
    assert torch.equal(a, policy.act(obs).actions)


def test_imitation_loss_is_l1_and_fine_tunes_to_the_demos(folder):
    """The L1 loss of the normalised chunk; a few hundred Adam steps on three demo frames bring it
    down 10x (and on, to 60x) and the deterministic action reproduces the demos: the arm's error
    within 1.5% of the q01..q99 range on average and 6% at most, the gripper exactly."""
    torch.manual_seed(0)
    policy = _policy(folder)
    q01, q99 = torch.tensor(TINY_STATS["q01"]), torch.tensor(TINY_STATS["q99"])
    arm = q01[:6] + (q99[:6] - q01[:6]) * torch.rand(3, K, 6)
    gripper = torch.tensor([1.0, -1.0])[torch.randint(0, 2, (3, K, 1))]
    demo = torch.cat([arm, gripper], dim=-1)
    target = policy.actions_to_normalized(demo)
    assert torch.equal(target[..., 6], (1 - demo[..., 6]) / 2)  # LIBERO close (+1) -> 0
    torch.testing.assert_close(policy.normalized_to_actions(target), demo)
    obs = _obs()
    mean, _ = policy._forward(policy._prepare(obs))
    first = policy.imitation_loss(obs, demo)
    assert first.item() == pytest.approx((mean - target).abs().sum(-1).mean().item(), rel=1e-5)
    mask = torch.ones(3, K, dtype=torch.bool)
    mask[:, -1] = False
    masked = (mean - target).abs().sum(-1)[mask].mean()
    assert policy.imitation_loss(obs, demo, mask).item() == pytest.approx(masked.item(), rel=1e-5)
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(400):
        loss = policy.imitation_loss(obs, demo)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < first.item() / 60:
            break
    assert loss.item() < first.item() / 10, (first.item(), loss.item())
    acted = policy.act(obs, deterministic=True).actions
    error = (acted[..., :6] - demo[..., :6]).abs() / (q99[:6] - q01[:6])
    assert error.mean() <= 0.015 and error.max() <= 0.06, (error.mean(), error.max())
    assert torch.equal(acted[..., 6], demo[..., 6])


def test_head_saves_and_loads_with_trainer_checkpoints_and_as_a_head_file(folder, tmp_path):
    policy = _policy(folder, lora_rank=2, freeze_vision=True)
    assert all(p.requires_grad for p in policy.action_head.parameters())  # LoRA leaves the head trained
    with torch.no_grad():
        for p in policy.action_head.parameters():
            p.add_(0.05)
    state, omitted = policy_state(policy)
    assert {f"action_head.{k}" for k in HEAD_KEYS} <= set(state)
    fresh = _policy(folder, lora_rank=2, freeze_vision=True)
    load_policy_state(fresh, {"state_dict": state, "omitted": omitted}, "ckpt")
    obs = _obs()
    torch.testing.assert_close(
        fresh.act(obs, deterministic=True).actions, policy.act(obs, deterministic=True).actions
    )
    # exported in OFT's layout beside a copy of the model, it is what the folder loads
    copy = shutil.copytree(folder, tmp_path / "copy")
    find_head_file(copy).unlink()
    written = write_head_file(policy.action_head, copy, step=100)
    assert written.name == "action_head--100_checkpoint.pt"
    loaded = _policy(copy)
    for key, value in policy.action_head.state_dict().items():
        torch.testing.assert_close(loaded.action_head.state_dict()[key], value)


def test_norm_stats_passed_in_replace_the_checkpoints(folder, tmp_path):
    stats = {
        "my_demos": {
            "action": {"q01": [-0.5] * 6 + [0.0], "q99": [0.5] * 6 + [1.0], "mask": [True] * 6 + [False]}
        }
    }
    policy = _policy(folder, unnorm_key="my_demos", norm_stats=stats)
    assert policy.unnorm_key == "my_demos" and torch.equal(policy.q99[:6], torch.full((6,), 0.5))
    path = tmp_path / "dataset_statistics.json"
    import json

    path.write_text(json.dumps(stats))
    assert _policy(folder, unnorm_key="my_demos", norm_stats=str(path)).unnorm_key == "my_demos"
    with pytest.raises(ValueError, match="unnorm_key 'other' not in the checkpoint's statistics"):
        _policy(folder, unnorm_key="other", norm_stats=stats)
