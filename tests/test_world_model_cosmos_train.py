"""``python -m trainers.world_model --backend cosmos`` (issue 49): the Cosmos objective, the loss falling on a
few synthetic episodes, the bundle in ``CosmosWM-LiberoSpatial-v0``, an exact resume, and every bad input
refused before training."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch
from test_world_model_train import refused

from nets.cosmos_noise import logit_normal_quantiles, sample_sigma_logit_normal
from nets.cosmos_sampler import SIGMA_CONDITIONAL
from trainers.datasets.demos import Episode, write_demos
from trainers.metrics import read_metrics
from trainers.world_model.__main__ import main
from trainers.world_model.cosmos_data import episode_clips
from trainers.world_model.cosmos_objective import condition_mask, denoising_loss
from trainers.world_model.data import EpisodeFrames

H, W = 32, 48  # frames: 4x6 latents -> 2x3 tokens per latent frame


def moving_square(
    rng: np.random.Generator, steps: int, h: int = H, w: int = W
) -> tuple[np.ndarray, np.ndarray]:
    """An episode whose frames follow its actions: a square moved by the first two action dimensions."""
    actions = rng.uniform(-1, 1, (steps, 7)).astype(np.float32)
    actions[:, 6] = np.sign(actions[:, 6])  # a LIBERO-like gripper
    frames = np.zeros((steps, h, w, 3), np.uint8)
    frames[..., 2] = 60
    y, x = float(rng.integers(4, h - 12)), float(rng.integers(4, w - 12))
    for t in range(steps):
        frames[t, int(y) : int(y) + 8, int(x) : int(x) + 8] = (220, 180, 40)
        y = float(np.clip(y + 2 * actions[t, 1], 0, h - 8))
        x = float(np.clip(x + 2 * actions[t, 0], 0, w - 8))
    return frames, actions


def synthetic_demos(
    path: Path, episodes: int = 3, steps: int = 16, seed: int = 0, size: tuple[int, int] = (H, W)
) -> Path:
    """A demos file recorded one action per step with an ``image``, as ``python -m trainers.demos`` writes."""
    rng = np.random.default_rng(seed)
    eps = []
    for n in range(episodes):
        frames, actions = moving_square(rng, steps, *size)
        eps.append(Episode(obs={"image": frames}, actions=actions[:, None], valid=np.ones((steps, 1), bool),
                           rewards=np.zeros((steps, 1), np.float32), instruction=f"move the square {n % 2}",
                           task=f"square_{n % 2}", initial_frame=n, success=True))  # fmt: skip
    meta = {"env": "envs:Libero-Spatial-v0", "env_kwargs": {"image_size": list(size)}, "policy": "synthetic",
            "chunk_size": 1, "action_dim": 7, "seed": seed}  # fmt: skip
    return write_demos(path, eps, meta)


def args(tmp_path: Path, demos: Path, *extra: str, out: str = "bundle") -> list[str]:
    return ["--backend", "cosmos", "--demos", str(demos), "--out", str(tmp_path / out), "--torch-threads",
            "1", "--no-progress", "--no-tensorboard", "--batch-size", "4", "--learning-rate", "1e-3",
            "--ema-decay", "0.9", "--eval-clips", "8", "--seed", "0", *extra]  # fmt: skip


# ---- the objective ----------------------------------------------------------------------------------------


class Oracle(torch.nn.Module):
    """A "DiT" that returns the exact velocity eps - x0 on the denoised latents (garbage on the condition
    latent, which is replaced): the perfect predictor. Records what it was given."""

    def __init__(self, x0: torch.Tensor, noise: torch.Tensor) -> None:
        super().__init__()
        self.x0, self.noise, self.seen = x0, noise, {}
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def forward(self, x, timesteps, action, context, cond_mask):
        self.seen.update(x=x, timesteps=timesteps, action=action)
        velocity = self.noise - self.x0
        velocity[:, :, :1] += 100.0  # wrong on the condition latent: not charged
        return velocity + 0 * self.anchor


def test_a_perfect_predictor_has_zero_loss_and_the_condition_latent_is_not_charged():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 16, 4, 2, 2, generator=g)
    noise = torch.randn(x0.shape, generator=g)
    sigma = torch.tensor([0.05, 5.0, 80.0])
    mask = condition_mask(3, 4)
    assert mask.tolist() == [[1.0, 0.0, 0.0, 0.0]] * 3
    oracle = Oracle(x0, noise)
    action = torch.randn(3, 12, 7)
    loss = denoising_loss(oracle, x0, noise, sigma, action, mask)
    assert loss.shape == (3,) and float(loss.detach().abs().max()) < 1e-8
    t = sigma / (1 + sigma)
    assert torch.allclose(oracle.seen["x"][:, :, :1], x0[:, :, :1])  # the clean condition latent
    expected = (1 - t).view(-1, 1, 1, 1, 1) * (x0 + sigma.view(-1, 1, 1, 1, 1) * noise)
    assert torch.allclose(oracle.seen["x"][:, :, 1:], expected[:, :, 1:], atol=1e-6)
    t_cond = SIGMA_CONDITIONAL / (1 + SIGMA_CONDITIONAL)
    assert torch.allclose(oracle.seen["timesteps"][:, 0], torch.full((3,), t_cond))
    assert torch.allclose(oracle.seen["timesteps"][:, 1:], t[:, None].expand(3, 3))
    assert oracle.seen["action"] is action

    # an error of e on one denoised latent: w (t e)^2 = e^2 (the velocity error), averaged over 3 latents
    class Off(Oracle):
        def forward(self, *a):
            out = super().forward(*a)
            out[:, :, 2] += 0.5
            return out

    loss = denoising_loss(Off(x0, noise), x0, noise, sigma, action, mask)
    assert torch.allclose(loss, torch.full((3,), 0.25 / 3), rtol=1e-4)


def test_noise_levels_follow_the_shifted_logit_normal():
    g = torch.Generator().manual_seed(1)
    sigma = sample_sigma_logit_normal(200_000, g, shift=5.0).double()
    assert sigma.median().item() == pytest.approx(5.0, rel=0.02)  # Predict2.5: median 5
    assert sigma.log().std().item() == pytest.approx(1.0, abs=0.01)  # 5 * exp(N(0, 1))
    assert sample_sigma_logit_normal(200_000, g, shift=2.0).median().item() == pytest.approx(2.0, rel=0.02)
    fixed = logit_normal_quantiles(9, 5.0)
    assert fixed[4].item() == pytest.approx(5.0) and bool((fixed.diff() > 0).all())


def test_clips_are_13_frames_and_the_12_actions_between_them():
    eps = [EpisodeFrames(np.zeros((15, 8, 8, 3), np.uint8), np.zeros((15, 7), np.float32), n, "", "")
           for n in range(2)]  # fmt: skip
    frames, actions, owner = episode_clips(eps, 12)
    assert len(frames) == 6 and owner.tolist() == [0, 0, 0, 1, 1, 1]  # starts 0, 1, 2 of each episode
    assert frames[1].tolist() == list(range(1, 14)) and actions[1].tolist() == list(range(1, 13))
    assert frames[3].tolist() == list(range(15, 28))  # the second episode starts at 15
    frames, _, owner = episode_clips(eps, 12, stride=2)
    assert frames[:, 0].tolist() == [0, 2, 15, 17]


# ---- training ---------------------------------------------------------------------------------------------


def test_loss_falls_and_the_bundle_runs_in_the_env(tmp_path):
    import envs  # noqa: F401  (registers the ids)

    demos = synthetic_demos(tmp_path / "demos.h5", episodes=4, steps=20)
    record = main(args(tmp_path, demos, "--steps", "50", "--eval-every", "25", "--log-every", "10"))
    start, end = record["losses"]["start"], record["losses"]["end"]
    assert end["eval/train_loss"] < 0.7 * start["eval/train_loss"], (start, end)
    assert end["eval/loss"] < start["eval/loss"]
    rows = read_metrics(tmp_path / "bundle.run")
    assert [r["iteration"] for r in rows] == [0, 10, 20, 25, 30, 40, 50]

    bundle = tmp_path / "bundle"
    info = json.loads((bundle / "training.json").read_text())
    assert info["backend"] == "cosmos" and info["image_size"] == [H, W] and info["chunk"] == 12
    assert info["condition_frames"] == 1 and info["objective"]["action_scaler"] == 20.0
    assert (
        info["objective"]["sigma_shift"] == 5.0 and info["clips"]["train"] + info["clips"]["held_out"] == 32
    )
    checkpoint = torch.load(bundle / "libero-spatial-2b-19k.pt", weights_only=True)
    assert any(k.startswith("net.") for k in checkpoint) and any(k.startswith("net_ema.") for k in checkpoint)

    env = gym.make_vec(
        "CosmosWM-LiberoSpatial-v0", num_envs=2, model_dir=bundle, image_size=(H, W),
        model_options={"num_steps": 2}, device="cpu",
    )  # fmt: skip
    try:
        obs, _ = env.reset(seed=0, options={"initial_frames": [0, 1]})
        first = np.load(bundle / "dataset" / "episode_000000.npy", allow_pickle=True)[0]["image"]
        assert np.array_equal(obs["image"][0], first)  # reset from the bundle's initial frames
        obs, reward, terminated, truncated, info = env.step(np.zeros((2, 8, 7), np.float32))
        assert obs["image"].shape == (2, H, W, 3) and obs["image"].dtype == np.uint8
        assert not terminated.any()  # the placeholder reward model: no success
    finally:
        env.close()


def test_resume_equals_an_uninterrupted_run(tmp_path):
    demos = synthetic_demos(tmp_path / "demos.h5", episodes=3, steps=14)
    common = ["--eval-every", "4", "--log-every", "2", "--checkpoint-every", "2", "--keep-checkpoints", "0"]
    main(args(tmp_path, demos, "--steps", "6", *common, out="whole"))
    main(args(tmp_path, demos, "--steps", "3", *common, out="part"))
    cache = tmp_path / "part.run" / "checkpoints" / "latents.pt"
    stamp = cache.stat().st_mtime_ns
    main(["--resume", str(tmp_path / "part.run"), "--steps", "6", "--overwrite"])  # --out: the run's
    assert cache.stat().st_mtime_ns == stamp  # the clips were not encoded again

    whole, part = read_metrics(tmp_path / "whole.run"), read_metrics(tmp_path / "part.run")
    assert [r["iteration"] for r in part] == [0, 2, 4, 6]
    for a, b in zip(whole, part, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
            k: v for k, v in b.items() if not k.startswith("time/")
        }
    a, b = (
        torch.load(tmp_path / n / "libero-spatial-2b-19k.pt", weights_only=True) for n in ("whole", "part")
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    info = json.loads((tmp_path / "part" / "training.json").read_text())
    assert info["steps"] == 6 and info["steps_this_call"] == 3


def test_fine_tune_from_a_bundle_keeps_its_tokenizer_reward_model_and_size(tmp_path):
    demos = synthetic_demos(tmp_path / "demos.h5", episodes=2, steps=13)
    small = ["--hidden-size", "32", "--num-heads", "1", "--depth", "1", "--eval-clips", "2"]
    main(args(tmp_path, demos, "--steps", "1", *small, out="first"))
    other = synthetic_demos(tmp_path / "other.h5", episodes=2, steps=13, seed=1)
    record = main(args(tmp_path, other, "--steps", "1", "--init-from", str(tmp_path / "first"),
                       "--eval-clips", "2", out="second"))  # fmt: skip
    assert record["init_from"] == str(tmp_path / "first")
    assert record["model"]["model_channels"] == 32 and record["model"]["num_blocks"] == 1  # the bundle's
    for name in ("tokenizer/tokenizer.pth", "resnet_rm.pth"):  # the VAE stays frozen, byte for byte
        assert (tmp_path / "second" / name).read_bytes() == (tmp_path / "first" / name).read_bytes()
    # a fresh DiT over a given tokenizer.pth (kept as is too)
    tokenizer = tmp_path / "first" / "tokenizer" / "tokenizer.pth"
    main(args(tmp_path, demos, "--steps", "1", *small, "--vae", str(tokenizer), out="third"))
    assert (tmp_path / "third" / "tokenizer" / "tokenizer.pth").read_bytes() == tokenizer.read_bytes()


def test_a_vae_stage_trains_the_wan_vae_on_clips_and_the_bundle_keeps_it(tmp_path):
    """``--vae-steps`` with Cosmos: the tiny Wan VAE trains on 5-frame clips (its reconstruction error
    falls), is calibrated to unit-variance latents, frozen, and is the bundle's ``tokenizer.pth``."""
    from nets.wan_vae import WanVAE
    from trainers.world_model.cosmos_data import to_clip_pixels

    demos = synthetic_demos(tmp_path / "demos.h5", episodes=3, steps=14)
    small = ["--hidden-size", "32", "--num-heads", "1", "--depth", "1", "--eval-clips", "2"]
    record = main(args(tmp_path, demos, *small, "--steps", "2", "--vae-steps", "40", "--vae-batch-size", "2",
                       "--vae-learning-rate", "3e-3", "--eval-every", "20"))  # fmt: skip
    rows = [r for r in read_metrics(tmp_path / "bundle.run") if "vae/train_mae" in r]
    assert [r["iteration"] for r in rows] == [0, 20, 40]
    assert rows[-1]["vae/train_mae"] < 0.7 * rows[0]["vae/train_mae"], rows
    info = record["vae_training"]
    assert info["steps"] == 40 and info["latent_std"] == pytest.approx(1.0, abs=0.05)
    assert info["trained_on"] == "the training episodes' 5-frame clips"
    assert record["vae"].startswith("tiny Wan 2.1 VAE (base_dim 8), trained 40 steps")
    # the bundle's tokenizer is the trained VAE: it reconstructs a clip as well as the stage measured
    vae = WanVAE.from_tokenizer(tmp_path / "bundle" / "tokenizer" / "tokenizer.pth", dtype=torch.float32)
    frames = np.load(tmp_path / "bundle" / "dataset" / "episode_000000.npy", allow_pickle=True)
    clip = to_clip_pixels(np.stack([f["image"] for f in frames[:5]])[None])
    error = float(((vae.decode(vae.encode(clip)).clamp(-1, 1) - clip).abs() * 127.5).mean())
    assert error < 0.7 * rows[0]["vae/train_mae"], error


# ---- bad input: refused before training --------------------------------------------------------------------


def edit_actions(path: Path, change) -> Path:
    with h5py.File(path, "a") as f:
        for g in f["episodes"].values():
            actions = change(g["actions"][()])
            del g["actions"]
            g["actions"] = actions
    return path


def test_bad_frames_actions_episodes_and_init_bundle(tmp_path, no_world_model_training):
    demos = synthetic_demos(tmp_path / "demos.h5", episodes=2, steps=13)
    refused(args(tmp_path, demos, "--image-size", "[32, 32]"), "32x48 frames, the model takes 32x32")
    odd = synthetic_demos(tmp_path / "odd.h5", episodes=2, steps=13, size=(40, 48))
    refused(args(tmp_path, odd), "frames of 40x48; the model needs multiples of 16")

    eight = edit_actions(synthetic_demos(tmp_path / "eight.h5", episodes=2, steps=13),
                         lambda a: np.concatenate([a, a[..., :1]], axis=-1))  # fmt: skip
    refused(args(tmp_path, eight), "8-D actions, the model takes 7-D")

    nan = synthetic_demos(tmp_path / "nan.h5", episodes=2, steps=13)
    with h5py.File(nan, "a") as f:
        f["episodes/000001/actions"][3, 0, 2] = np.nan
    refused(args(tmp_path, nan), "NaN")

    short = synthetic_demos(tmp_path / "short.h5", episodes=2, steps=12)
    refused(args(tmp_path, short), r"fewer frames than context \+ one chunk \(1 \+ 12 = 13\): 0 \(12\)")

    refused(args(tmp_path, demos, "--chunk", "8"), "12 actions per clip")

    from envs.world_models.tiny import write_tiny_bundle

    opensora = write_tiny_bundle("opensora", tmp_path / "opensora")
    refused(args(tmp_path, demos, "--init-from", str(opensora)), "not a Cosmos bundle")
    public = write_tiny_bundle("cosmos", tmp_path / "public")  # no training.json: 256x320 frames
    refused(args(tmp_path, demos, "--init-from", str(public)), "32x48 frames, the model takes 256x320")
    refused(args(tmp_path, demos, "--init-from", str(tmp_path / "nowhere")), "no such bundle folder")


def test_the_shipped_cosmos_configs_parse():
    from trainers.config import parse_cli
    from trainers.world_model import WorldModelConfig

    root = Path(__file__).resolve().parents[1] / "configs"
    tiny, gpu = (
        parse_cli({"world_model": WorldModelConfig}, ["--config", str(root / name)])["world_model"]
        for name in ("world_model_cosmos_tiny.json", "world_model_cosmos_2b_gpu.json")
    )
    assert (tiny.backend, tiny.chunk, tiny.condition_frames, tiny.vae) == ("cosmos", 12, 1, "tiny")
    assert (
        gpu.learning_rate == pytest.approx(2**-14.5) and gpu.max_grad_norm == 0.1 and gpu.weight_decay == 0.1
    )
    assert gpu.image_size == (256, 320) and gpu.sigma_shift == 5.0 and gpu.action_scaler == 20.0
