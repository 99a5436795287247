"""OpenVLA-OFT's proprio input (``use_proprio``) on a tiny random checkpoint in the real layout: the
projector file's names and strict loading, the state normalised with the statistics' q01/q99 and
placed as one token after the image patches, act == evaluate with it, trainer checkpoints, and
refusals of what does not fit (no proprio observation, statistics or file; another size)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from gymnasium import spaces

from policies.openvla_oft import OpenVLAOFTPolicy
from policies.openvla_oft.action_heads import find_component_file
from policies.openvla_oft.proprio import PROPRIO_FILE_PATTERN
from policies.openvla_oft.tiny import write_tiny_openvla
from trainers.checkpoint import load_policy_state, policy_state

pytestmark = pytest.mark.usefixtures("one_torch_thread")

K, D, S, P = 4, 7, 32, 8
OBS_SPACE = spaces.Dict(
    {
        "image": spaces.Box(0, 255, (S, S, 3), np.uint8),
        "proprio": spaces.Box(-np.inf, np.inf, (P,), np.float32),
        "instruction": spaces.Text(256),
    }
)
ACT_SPACE = spaces.Box(-1.0, 1.0, (K, D), np.float32)
KEY = "libero_spatial_no_noops"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_openvla(tmp_path_factory.mktemp("oft_p") / "tiny", action_head=True, proprio_dim=P)


def _policy(folder, obs_space=OBS_SPACE, **kwargs) -> OpenVLAOFTPolicy:
    kwargs = {
        "unnorm_key": "libero_spatial",
        "action_head": "l1",
        "use_critic": False,
        "use_proprio": True,
        **kwargs,
    }
    return OpenVLAOFTPolicy(obs_space, ACT_SPACE, model_path=folder, **kwargs)


def _obs(n: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (n, S, S, 3), dtype=np.uint8),
        "proprio": rng.uniform(-1.5, 1.5, (n, P)).astype(np.float32),
        "instruction": ("pick up the black bowl",) * n,
    }


def test_projector_file_has_the_public_names_and_loads_strictly(folder):
    path = find_component_file(folder, PROPRIO_FILE_PATTERN, "proprio projectors")
    raw = torch.load(path, weights_only=True)
    names = {f"module.{layer}.{p}" for layer in ("fc1", "fc2") for p in ("weight", "bias")}
    assert path.name == "proprio_projector--0_checkpoint.pt" and set(raw) == names
    policy = _policy(folder)
    hidden = policy.model.language_model.config.hidden_size
    assert raw["module.fc1.weight"].shape == (hidden, P) and raw["module.fc2.weight"].shape == (
        hidden,
        hidden,
    )
    for key, value in raw.items():
        torch.testing.assert_close(policy.proprio_projector.state_dict()[key.removeprefix("module.")], value)
    assert policy.required_observation_keys() == ("image", "instruction", "proprio")
    assert _policy(folder, use_proprio=False).proprio_projector is None  # the file is then ignored


@torch.no_grad()
def test_the_state_is_normalised_and_enters_as_one_token_after_the_patches(folder):
    policy = _policy(folder).eval()
    obs = _obs()
    prepared = policy._prepare(obs)
    # BOUNDS_Q99 with the tiny statistics (q01 -1, q99 1): the state itself, clipped to [-1, 1]
    torch.testing.assert_close(prepared["proprio"], torch.as_tensor(obs["proprio"]).clamp(-1, 1))
    token = policy.proprio_projector(prepared["proprio"])
    fc1, fc2 = policy.proprio_projector.fc1, policy.proprio_projector.fc2
    by_hand = fc2(torch.nn.functional.gelu(fc1(prepared["proprio"])))  # OFT's fc1 -> GELU -> fc2
    torch.testing.assert_close(token[:, 0], by_hand)
    pixels = policy.model.vision_backbone.pixel_values(prepared["images"])
    ids, mask = prepared["input_ids"], prepared["attention_mask"]
    plain, _ = policy.model.embed_prefix(ids, mask, pixels)
    with_state, valid = policy.model.embed_prefix(ids, mask, pixels, token)
    n = policy.model.projector(policy.model.vision_backbone(pixels)).shape[1]  # patches
    torch.testing.assert_close(with_state[:, : 1 + n], plain[:, : 1 + n])
    torch.testing.assert_close(with_state[:, 1 + n], token[:, 0])
    torch.testing.assert_close(with_state[:, 2 + n :], plain[:, 1 + n :])
    assert valid.shape[1] == plain.shape[1] + 1 and valid[:, 1 + n].all()
    # the state moves the actions; the same state gives the same actions
    a = policy.act(obs, deterministic=True).actions
    moved = {**obs, "proprio": -obs["proprio"]}
    assert not torch.allclose(policy.act(moved, deterministic=True).actions, a)
    torch.testing.assert_close(policy.act(obs, deterministic=True).actions, a)


def test_evaluate_gives_the_acted_log_probs_and_checkpoints_keep_the_projector(folder):
    policy = _policy(folder, l1_scale=0.1).eval()
    policy.seed(0)
    out = policy.act(_obs())
    assert out.replay["proprio"].shape == (3, P)
    torch.testing.assert_close(policy.evaluate(out.replay).log_probs, out.log_probs)
    with torch.no_grad():
        for p in policy.proprio_projector.parameters():
            p.add_(0.05)
    state, omitted = policy_state(policy)
    assert {"proprio_projector.fc1.weight", "proprio_q01", "proprio_q99"} <= set(state)
    fresh = _policy(folder, l1_scale=0.1)
    load_policy_state(fresh, {"state_dict": state, "omitted": omitted}, "ckpt")
    obs = _obs(seed=1)
    torch.testing.assert_close(
        fresh.act(obs, deterministic=True).actions, policy.act(obs, deterministic=True).actions
    )


def test_what_does_not_fit_is_refused_naming_both_sides(folder, tmp_path):
    no_state = spaces.Dict({k: v for k, v in OBS_SPACE.spaces.items() if k != "proprio"})
    with pytest.raises(ValueError, match="use_proprio reads a 1-D Box observation 'proprio'"):
        _policy(folder, obs_space=no_state)
    other = spaces.Dict({**OBS_SPACE.spaces, "proprio": spaces.Box(-1, 1, (9,), np.float32)})
    with pytest.raises(ValueError, match="for a 8-D proprio, the env's 'proprio' observation is 9-D"):
        _policy(folder, obs_space=other)
    bare = shutil.copytree(folder, tmp_path / "bare")
    find_component_file(bare, PROPRIO_FILE_PATTERN, "proprio projectors").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"proprio_projector--\*checkpoint.pt.*new_proprio_projector=True"
    ):
        _policy(bare)
    assert _policy(bare, new_proprio_projector=True).proprio_projector is not None
    stats_file = bare / "dataset_statistics.json"
    stats = json.loads(stats_file.read_text())
    del stats[KEY]["proprio"]
    stats_file.write_text(json.dumps(stats))
    with pytest.raises(ValueError, match="have no proprio q01/q99"):
        _policy(bare, new_proprio_projector=True)
