"""The VAE stage of ``python -m trainers.world_model`` (``vae_steps`` > 0, issue 49): the tiny VAE's
reconstruction error falls on a few frames, a run stopped in either stage resumes exactly, the bundle's
trained VAE loads in the env, and bad settings are refused before training."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_world_model_train import SIZE, args, refused, synthetic_demos

import trainers.world_model.train as train_module
import trainers.world_model.vae as vae_module
from nets.errors import BadInput
from nets.opensora_vae import SDXLVAE
from trainers.metrics import read_metrics
from trainers.world_model.__main__ import main
from trainers.world_model.config import WorldModelConfig
from trainers.world_model.vae import reconstruction_mae

VAE_FILE = "vae/diffusion_pytorch_model.safetensors"
DIT_FILE = "model-00001-of-00001.safetensors"


def vae_args(tmp_path: Path, demos: Path, *extra: str, out: str = "bundle") -> list[str]:
    return args(tmp_path, demos, "--vae-learning-rate", "3e-3", "--vae-batch-size", "8", *extra, out=out)


def test_vae_loss_falls_and_the_trained_vae_is_the_bundles_and_loads_in_the_env(tmp_path):
    import envs  # noqa: F401  (registers the ids)

    demos = synthetic_demos(tmp_path / "demos.h5", episodes=3)
    record = main(vae_args(tmp_path, demos, "--vae-steps", "60", "--steps", "2", "--eval-every", "30"))
    rows = read_metrics(tmp_path / "bundle.run")
    vae_rows = [r for r in rows if "vae/train_mae" in r]
    assert [r["iteration"] for r in vae_rows] == [0, 30, 60]
    start, end = vae_rows[0], vae_rows[-1]
    assert end["vae/train_mae"] < 0.5 * start["vae/train_mae"], (start, end)  # uint8 units
    assert end["vae/eval_mae"] < start["vae/eval_mae"]  # the held-out episode's frames, never trained on
    assert all("vae/loss" in r for r in rows if r["iteration"] in (10, 20, 30, 40, 50, 60) and "vae/kl" in r)
    world = [r for r in rows if "eval/train_loss" in r]
    assert [r["iteration"] for r in world] == [60]  # the world model's step 0 follows the VAE's last

    info = record["vae_training"]
    assert info["steps"] == 60 and info["end"]["vae/train_mae"] == pytest.approx(end["vae/train_mae"])
    assert info["latent_std"] == pytest.approx(1.0, abs=1e-3)  # calibrated: unit-variance scaled latents
    assert 0 < info["posterior_std"] < 10  # the learned spread (wide after 60 steps), scaled with the mean
    bundle = tmp_path / "bundle"
    saved = json.loads((bundle / "training.json").read_text())
    assert saved["vae"].startswith("tiny, trained 60 steps") and saved["vae_training"]["steps"] == 60

    # the bundle's VAE is the trained one, in the diffusers layout the env loads
    vae = SDXLVAE.from_pretrained(bundle / "vae")
    frames = np.load(bundle / "dataset" / "episode_000000.npy", allow_pickle=True)
    first = np.stack([f["image"] for f in frames[:8]])
    assert reconstruction_mae(vae, first) < 0.6 * start["vae/train_mae"]
    env = gym.make_vec(
        "OpenSoraWM-LiberoSpatial-v0", num_envs=2, model_dir=bundle, image_size=(SIZE, SIZE),
        model_options={"num_steps": 2}, device="cpu",
    )  # fmt: skip
    try:
        obs, _ = env.reset(seed=0, options={"initial_frames": [0, 1]})
        obs, *_ = env.step(np.zeros((2, 8, 7), np.float32))
        assert obs["image"].shape == (2, SIZE, SIZE, 3) and obs["image"].dtype == np.uint8
    finally:
        env.close()


def stop_at(monkeypatch, cls: type, step: int) -> None:
    """Make ``cls.step`` raise once ``step`` optimizer steps are done (a run killed mid-stage)."""
    original = cls.step

    def step_or_stop(self):
        if self.step_index == step:
            raise KeyboardInterrupt(f"stopped at step {step}")
        return original(self)

    monkeypatch.setattr(cls, "step", step_or_stop)


def test_a_run_stopped_in_either_stage_resumes_exactly(tmp_path, monkeypatch):
    demos = synthetic_demos(tmp_path / "demos.h5", episodes=3)
    common = ["--vae-steps", "6", "--steps", "4", "--eval-every", "2", "--log-every", "1",
              "--checkpoint-every", "2", "--keep-checkpoints", "0"]  # fmt: skip
    main(vae_args(tmp_path, demos, *common, out="whole"))
    with monkeypatch.context() as m:  # killed after VAE step 3 (the newest checkpoint: step 2)
        stop_at(m, vae_module.VaeTrainer, 3)
        with pytest.raises(KeyboardInterrupt):
            main(vae_args(tmp_path, demos, *common, out="part"))
    with monkeypatch.context() as m:  # resumed, then killed after world-model step 1 (checkpoint: step 0)
        stop_at(m, train_module.Trainer, 1)
        with pytest.raises(KeyboardInterrupt):
            main(["--resume", str(tmp_path / "part.run")])
    names = sorted(p.name for p in (tmp_path / "part.run" / "checkpoints").glob("iter_*.pt"))
    assert names == ["iter_000002.pt", "iter_000004.pt", "iter_000006.pt"]  # 6: the world model's step 0
    main(["--resume", str(tmp_path / "part.run"), "--overwrite"])

    whole, part = read_metrics(tmp_path / "whole.run"), read_metrics(tmp_path / "part.run")
    assert [r["iteration"] for r in part] == [r["iteration"] for r in whole]
    for a, b in zip(whole, part, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
            k: v for k, v in b.items() if not k.startswith("time/")
        }
    for name in (VAE_FILE, DIT_FILE):
        a, b = load_file(tmp_path / "whole" / name), load_file(tmp_path / "part" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

    # a resume must keep the run's VAE stage
    refused(["--resume", str(tmp_path / "part.run"), "--vae-steps", "8", "--overwrite"],
            "was started with vae_steps 6")  # fmt: skip


def test_bad_vae_settings_are_refused_before_training(tmp_path, no_world_model_training):
    demos = synthetic_demos(tmp_path / "demos.h5", episodes=2)
    refused(args(tmp_path, demos, "--vae-steps", "-1"), "vae_steps: expected >= 0, got -1")
    refused(args(tmp_path, demos, "--vae-steps", "5", "--vae-learning-rate", "0"), "vae_learning_rate")
    refused(args(tmp_path, demos, "--vae-steps", "5", "--vae-batch-size", "0"), "vae_batch_size")
    refused(args(tmp_path, demos, "--vae-steps", "5", "--vae-kl-weight", "-1"), "vae_kl_weight")
    with pytest.raises(BadInput, match="vae_loss: expected 'l1' or 'mse'"):
        WorldModelConfig(vae_loss="lpips")  # type: ignore[arg-type]  (as a config file could hold)

    from envs.world_models.tiny import write_tiny_bundle
    from nets.opensora_tiny import write_tiny_vae

    init = write_tiny_bundle("opensora", tmp_path / "init")
    refused(args(tmp_path, demos, "--vae-steps", "5", "--init-from", str(init)),
            r"vae_steps 5: the --init-from bundle .* pretrained and stays frozen")  # fmt: skip
    folder = write_tiny_vae(tmp_path / "sdxl_like")
    refused(args(tmp_path, demos, "--vae-steps", "5", "--vae", str(folder)),
            "is a pretrained VAE and stays frozen")  # fmt: skip
