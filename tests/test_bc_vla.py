"""``python -m trainers.bc`` with the VLAs (tiny random checkpoints in the real layouts) on a small
stand-in env with camera images: normalisation statistics computed from the demos in each model's
format, saved with the checkpoint and used when it is loaded again; clear errors, before training,
for demos that do not fit the policy, missing statistics and unknown LoRA target modules."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from policies.openvla_oft import OpenVLAOFTPolicy
from policies.openvla_oft.tiny import write_tiny_openvla
from policies.pi05.tiny import write_tiny_pi05
from trainers import bc
from trainers.checkpoint import latest_checkpoint, load_policy
from trainers.datasets.demos import Episode, write_demos

pytestmark = pytest.mark.usefixtures("one_torch_thread")

K, D, S = 4, 7, 32
ENV_ID = "VlaStandIn-v0"


class StandInEnv(gym.Env):
    """Camera images, proprio and an instruction; (K, D) action chunks; nothing else."""

    def __init__(self, wrist: bool = False):
        images = {"image": spaces.Box(0, 255, (S, S, 3), np.uint8)}
        if wrist:
            images["wrist_image"] = spaces.Box(0, 255, (S, S, 3), np.uint8)
        self.observation_space = spaces.Dict(
            {**images, "proprio": spaces.Box(-10, 10, (8,), np.float32), "instruction": spaces.Text(256)}
        )
        self.action_space = spaces.Box(-1.0, 1.0, (K, D), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=StandInEnv)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vla_models")
    return {"oft": write_tiny_openvla(root / "oft"), "pi05": write_tiny_pi05(root / "pi05")}


def _demos(path, episodes: int = 2, steps: int = 3, d: int = D, k: int = K, seed: int = 0):
    rng = np.random.default_rng(seed)
    eps = []
    for _ in range(episodes):
        arm = rng.uniform(-0.8, 0.8, (steps, k, d - 1)).astype(np.float32)
        gripper = rng.choice([-1.0, 1.0], (steps, k, 1)).astype(np.float32)
        eps.append(
            Episode(
                obs={
                    "image": rng.integers(0, 256, (steps, S, S, 3), dtype=np.uint8),
                    "proprio": rng.standard_normal((steps, 8)).astype(np.float32),
                },
                actions=np.concatenate([arm, gripper], -1),
                valid=np.ones((steps, k), bool),
                rewards=np.zeros((steps, k), np.float32),
                instruction="pick up the black bowl",
                success=True,
            )
        )
    return write_demos(path, eps, {"env": ENV_ID})


def _bc(demos, run_dir, policy: str, policy_kwargs: dict, *extra: str, env_kwargs: dict | None = None):
    return bc.main(
        [
            "--demos",
            str(demos),
            "--env",
            f"test_bc_vla:{ENV_ID}",
            "--env-kwargs",
            json.dumps(env_kwargs or {}),
        ]
        + ["--policy", policy, "--policy-kwargs", json.dumps(policy_kwargs), "--epochs", "2"]
        + ["--batch-size", "4", "--val-fraction", "0", "--eval-every", "-1", "--no-progress"]
        + ["--no-tensorboard", "--no-video", "--num-envs", "1", "--run-dir", str(run_dir), *extra]
    )


def _executed(demos_path):
    from trainers.datasets.demos import read_demos

    demos = read_demos(demos_path)
    actions = np.concatenate([ep.actions[ep.valid] for ep in demos.episodes]).astype(np.float64)
    proprio = np.concatenate([ep.obs["proprio"] for ep in demos.episodes]).astype(np.float64)
    return actions, proprio


def test_openvla_statistics_from_the_demos_travel_with_the_checkpoint(models, tmp_path):
    demos = _demos(tmp_path / "demos.h5")
    kwargs = {"model_path": str(models["oft"]), "action_head": "l1", "new_action_head": True}
    _bc(demos, tmp_path / "bc", "openvla_oft", kwargs, "--bf16")
    stats = json.loads((tmp_path / "bc" / "checkpoints" / "dataset_statistics.json").read_text())
    assert list(stats) == ["demos"]  # unnorm_key "demos" unless policy_kwargs name one
    actions, proprio = _executed(demos)
    model_actions = np.concatenate([actions[:, :6], (1 - actions[:, 6:]) / 2], 1)  # gripper -> 0 / 1
    entry = stats["demos"]
    np.testing.assert_allclose(entry["action"]["q01"], np.quantile(model_actions, 0.01, 0), rtol=1e-6)
    np.testing.assert_allclose(entry["action"]["q99"], np.quantile(model_actions, 0.99, 0), rtol=1e-6)
    assert entry["action"]["mask"] == [True] * 6 + [False]
    assert set(entry["action"]) == {"mean", "std", "max", "min", "q01", "q99", "mask"}
    np.testing.assert_allclose(entry["proprio"]["q99"], np.quantile(proprio, 0.99, 0), rtol=1e-6)
    assert entry["num_transitions"] == len(actions) and entry["num_trajectories"] == 2

    _, data = latest_checkpoint(tmp_path / "bc")
    assert (
        data["policy"]["kwargs"]["norm_stats"] == stats and data["policy"]["kwargs"]["unnorm_key"] == "demos"
    )
    env = StandInEnv()
    policy = load_policy(tmp_path / "bc", env.observation_space, env.action_space)
    assert isinstance(policy, OpenVLAOFTPolicy) and policy.unnorm_key == "demos"
    np.testing.assert_allclose(policy.q01.numpy(), np.float32(entry["action"]["q01"]))
    trained = {k: v for k, v in data["policy"]["state_dict"].items() if k.startswith("action_head.")}
    assert trained and all(torch.equal(policy.state_dict()[k], v) for k, v in trained.items())


def test_openvla_oft_fine_tunes_a_new_proprio_projector_on_the_demos_state(models, tmp_path):
    """``use_proprio`` + ``new_proprio_projector``: the state is normalised by the demos' proprio
    q01/q99 (computed by trainers.bc, saved with the checkpoint) and the projector is trained."""
    demos = _demos(tmp_path / "demos.h5")
    kwargs = {"model_path": str(models["oft"]), "action_head": "l1", "new_action_head": True,
              "use_proprio": True, "new_proprio_projector": True}  # fmt: skip
    _bc(demos, tmp_path / "bc", "openvla_oft", kwargs)
    _, proprio = _executed(demos)
    _, data = latest_checkpoint(tmp_path / "bc")
    env = StandInEnv()
    policy = load_policy(tmp_path / "bc", env.observation_space, env.action_space)
    assert policy.proprio_projector is not None and "proprio" in policy.required_observation_keys()
    np.testing.assert_allclose(policy.proprio_q99.numpy(), np.quantile(proprio, 0.99, 0), rtol=1e-5)
    state = data["policy"]["state_dict"]
    for key in ("proprio_projector.fc1.weight", "proprio_projector.fc2.bias"):
        assert torch.equal(policy.state_dict()[key], state[key])
    # the imitation loss reaches the projector (what BC trained)
    from trainers.datasets.demos import read_demos

    episode = read_demos(demos).episodes[0]
    obs = {**episode.obs, "instruction": (episode.instruction,) * len(episode.actions)}
    policy.imitation_loss(obs, torch.as_tensor(episode.actions)).backward()
    assert policy.proprio_projector.fc1.weight.grad.abs().sum() > 0


def test_pi05_statistics_in_openpis_format(models, tmp_path):
    demos = _demos(tmp_path / "demos.h5")
    kwargs = {
        "model_path": str(models["pi05"]),
        "cameras": ["image"],
        "num_steps": 2,
        "train_expert_only": True,
    }
    _bc(demos, tmp_path / "bc", "pi05", kwargs)
    stats = json.loads((tmp_path / "bc" / "checkpoints" / "norm_stats.json").read_text())
    actions, proprio = _executed(demos)
    assert set(stats["norm_stats"]) == {"actions", "state"}
    for key, x in (("actions", actions), ("state", proprio)):
        entry = stats["norm_stats"][key]
        assert set(entry) == {"mean", "std", "q01", "q99"}
        np.testing.assert_allclose(entry["q01"], np.quantile(x, 0.01, 0), rtol=1e-6)
        np.testing.assert_allclose(entry["std"], x.std(0), rtol=1e-6)
    env = StandInEnv()
    policy = load_policy(tmp_path / "bc", env.observation_space, env.action_space)
    np.testing.assert_allclose(
        policy.action_stats.q99.numpy(), np.float32(stats["norm_stats"]["actions"]["q99"])
    )


def test_demos_that_do_not_fit_and_missing_statistics_are_named(models, tmp_path):
    kwargs = {"model_path": str(models["oft"])}
    six = _demos(tmp_path / "six.h5", d=6)
    with pytest.raises(ValueError, match=r"demonstrated actions are 6-D, the env's actions 7-D"):
        _bc(six, tmp_path / "a", "openvla_oft", kwargs)
    three = _demos(tmp_path / "three.h5", k=3)
    with pytest.raises(ValueError, match="chunks of 3 actions; they can only be used with chunk_size 3"):
        _bc(three, tmp_path / "b", "openvla_oft", kwargs)
    demos = _demos(tmp_path / "demos.h5")
    wrist = {**kwargs, "image_keys": ["image", "wrist_image"]}
    with pytest.raises(
        ValueError,
        match=r"reads the observations \['image', 'wrist_image', 'instruction'.*; the demos have no \['wrist",
    ):
        _bc(demos, tmp_path / "c", "openvla_oft", wrist, env_kwargs={"wrist": True})
    # the model's own statistics have no key "my_data": named, with the way out
    with pytest.raises(ValueError, match=r"unnorm_key 'my_data' not in.*--norm-stats demos computes them"):
        _bc(
            demos,
            tmp_path / "d",
            "openvla_oft",
            {**kwargs, "unnorm_key": "my_data"},
            "--norm-stats",
            "checkpoint",
        )
    with pytest.raises(ValueError, match="policy_kwargs gives norm_stats as well"):
        _bc(demos, tmp_path / "e", "openvla_oft", {**kwargs, "norm_stats": {}}, "--norm-stats", "demos")
    no_state = {"norm_stats": {"actions": {"q01": [-1.0] * 7, "q99": [1.0] * 7}}}
    env = StandInEnv()
    with pytest.raises(
        ValueError, match="expected norm_stats.state.*this policy normalizes the state and the actions"
    ):
        from policies.pi05 import Pi05Policy

        Pi05Policy(env.observation_space, env.action_space, model_path=models["pi05"], cameras=["image"],
                   norm_stats=no_state, discrete_state_input=True)  # fmt: skip


def test_lora_targets_are_checked(models):
    env = StandInEnv()
    from policies.pi05 import Pi05Policy

    with pytest.raises(
        ValueError, match=r"LoRA target modules \['qkv_proj'\] are not in OpenVLA-OFT.*'q_proj'"
    ):
        OpenVLAOFTPolicy(env.observation_space, env.action_space, model_path=models["oft"], lora_rank=2,
                         lora_targets=["q_proj", "qkv_proj"])  # fmt: skip
    policy = Pi05Policy(env.observation_space, env.action_space, model_path=models["pi05"], cameras=["image"],
                        lora_rank=2, train_expert_only=True)  # fmt: skip
    trained = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert any("gemma_expert" in n and "lora_A" in n for n in trained)
    assert not any("paligemma.model" in n or ("lora_" not in n and "gemma_expert" in n) for n in trained)
    assert "model.action_out_proj.weight" in trained  # the projections stay fully trained
    with pytest.raises(ValueError, match=r"LoRA target modules \['attn'\] are not in pi0.5"):
        Pi05Policy(env.observation_space, env.action_space, model_path=models["pi05"], cameras=["image"],
                   lora_rank=2, lora_targets=["attn"])  # fmt: skip
