"""``python -m trainers.world_model`` (issue 49): the OpenSora objective, the loss falling on a few synthetic
episodes, an exact resume, the bundle in the env, and every bad input refused before training."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch

import trainers.world_model.train as train_module
from nets.errors import BadInput
from trainers.datasets.demos import Episode, write_demos
from trainers.metrics import read_metrics
from trainers.world_model.__main__ import main
from trainers.world_model.data import clip_indices
from trainers.world_model.objective import CONDITION_TIMESTEP, add_noise, flow_loss, frame_mask

assert Path(train_module.__file__).resolve().parents[2] == Path(__file__).resolve().parents[1]

SIZE = 32  # frames: 32x32 -> 4x4 latents -> 2x2 tokens per frame


def moving_square(rng: np.random.Generator, steps: int, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """An episode whose frames follow its actions: a square moved by the first two action dimensions."""
    actions = rng.uniform(-1, 1, (steps, 7)).astype(np.float32)
    actions[:, 6] = np.sign(actions[:, 6])  # a LIBERO-like gripper
    frames = np.zeros((steps, size, size, 3), np.uint8)
    frames[..., 2] = 60
    y, x = rng.integers(4, size - 12, 2).astype(float)
    for t in range(steps):
        frames[t, int(y) : int(y) + 8, int(x) : int(x) + 8] = (220, 180, 40)
        y = float(np.clip(y + 2 * actions[t, 1], 0, size - 8))
        x = float(np.clip(x + 2 * actions[t, 0], 0, size - 8))
    return frames, actions


def synthetic_demos(path: Path, episodes: int = 3, steps: int = 16, size: int = SIZE, seed: int = 0) -> Path:
    """A demos file recorded one action per step with an ``image``, as ``python -m trainers.demos`` writes."""
    rng = np.random.default_rng(seed)
    eps = []
    for n in range(episodes):
        frames, actions = moving_square(rng, steps, size)
        eps.append(
            Episode(
                obs={"image": frames},
                actions=actions[:, None],
                valid=np.ones((steps, 1), bool),
                rewards=np.zeros((steps, 1), np.float32),
                instruction=f"move the square {n % 2}",
                task=f"square_{n % 2}",
                initial_frame=n,
                success=True,
            )
        )
    meta = {"env": "envs:Libero-Spatial-v0", "env_kwargs": {"image_size": size}, "policy": "synthetic",
            "chunk_size": 1, "action_dim": 7, "seed": seed}  # fmt: skip
    return write_demos(path, eps, meta)


def args(tmp_path: Path, demos: Path, *extra: str, out: str = "bundle") -> list[str]:
    return ["--demos", str(demos), "--out", str(tmp_path / out), "--torch-threads", "1", "--no-progress",
            "--no-tensorboard", "--batch-size", "4", "--learning-rate", "1e-3", "--ema-decay", "0.9",
            "--eval-clips", "8", "--seed", "0", *extra]  # fmt: skip


# ---- the objective ----------------------------------------------------------------------------------------


def test_objective_noises_targets_keeps_context_nearly_clean_and_scores_targets_only():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 4, 6, 2, 2, generator=g)
    noise = torch.randn(x0.shape, generator=g)
    t = torch.tensor([1000.0, 500.0])
    mask = frame_mask(2, 2, 4)
    assert mask.tolist() == [[False, False, True, True, True, True]] * 2
    seen = {}

    def perfect(x, level, x_mask):
        seen.update(x=x, level=level, x_mask=x_mask)
        velocity = x0 - noise
        velocity[:, :, :2] += 100.0  # wrong on the context frames: not scored
        return torch.cat([velocity, torch.zeros_like(velocity)], dim=1)  # a learned-sigma half, ignored

    loss = flow_loss(perfect, x0, noise, t, mask)
    assert torch.equal(loss, torch.zeros(2))
    assert torch.allclose(seen["x"][0, :, 2:], noise[0, :, 2:])  # t = 1000: pure noise
    assert torch.allclose(seen["x"][1, :, 2:], 0.5 * x0[1, :, 2:] + 0.5 * noise[1, :, 2:])
    context = add_noise(x0, noise, torch.full((2,), CONDITION_TIMESTEP))[:, :, :2]
    assert torch.allclose(seen["x"][:, :, :2], context)  # both clips: level 15 whatever t
    assert torch.equal(seen["x_mask"], mask)


def test_clips_follow_the_fork_windows():
    frames, actions = clip_indices([10], condition_frames=4, chunk=3)
    assert len(frames) == 7  # s = 0 .. 10 - 3 - 1
    assert frames[0].tolist() == [0, 0, 0, 0, 1, 2, 3]  # the first frame repeated, as the env's reset
    assert actions[0].tolist() == [0, 1, 2]  # action s leads from frame s to s + 1
    assert frames[5].tolist() == [2, 3, 4, 5, 6, 7, 8] and actions[5].tolist() == [5, 6, 7]
    frames, _ = clip_indices([10, 5], condition_frames=4, chunk=3)
    assert frames[-1].tolist() == [10, 10, 10, 11, 12, 13, 14]  # the second episode starts at 10


# ---- training ---------------------------------------------------------------------------------------------


def test_loss_falls_and_the_bundle_runs_in_the_env(tmp_path):
    import envs  # noqa: F401  (registers the ids)

    demos = synthetic_demos(tmp_path / "demos.h5", episodes=4)
    record = main(args(tmp_path, demos, "--steps", "60", "--eval-every", "30", "--log-every", "10"))
    start, end = record["losses"]["start"], record["losses"]["end"]
    assert end["eval/train_loss"] < 0.7 * start["eval/train_loss"], (start, end)
    assert end["eval/loss"] < start["eval/loss"]
    rows = read_metrics(tmp_path / "bundle.run")
    assert [r["iteration"] for r in rows] == [0, 10, 20, 30, 40, 50, 60]
    assert end["eval/train_loss"] == rows[-1]["eval/train_loss"]

    bundle = tmp_path / "bundle"
    info = json.loads((bundle / "training.json").read_text())
    assert info["suite"] == "envs:Libero-Spatial-v0" and info["tasks"] == ["square_0", "square_1"]
    assert info["steps"] == 60 and info["image_size"] == [SIZE, SIZE] and info["chunk"] == 8
    assert sorted(info["episodes"]["train"] + info["episodes"]["held_out"]) == [0, 1, 2, 3]
    assert len(list((bundle / "dataset").glob("*.npy"))) == 4

    env = gym.make_vec(
        "OpenSoraWM-LiberoSpatial-v0", num_envs=2, model_dir=bundle, image_size=(SIZE, SIZE),
        model_options={"num_steps": 2}, device="cpu",
    )  # fmt: skip
    try:
        obs, _ = env.reset(seed=0, options={"initial_frames": [0, 1]})
        first = np.load(bundle / "dataset" / "episode_000000.npy", allow_pickle=True)[0]["image"]
        assert np.array_equal(obs["image"][0], first)  # reset from the bundle's initial frames
        obs, reward, terminated, truncated, info = env.step(np.zeros((2, 8, 7), np.float32))
        assert obs["image"].shape == (2, SIZE, SIZE, 3) and obs["image"].dtype == np.uint8
        assert info["chunk_rewards"].shape == (2, 8) and not terminated.any()  # the placeholder: no success
    finally:
        env.close()


def test_resume_equals_an_uninterrupted_run(tmp_path):
    demos = synthetic_demos(tmp_path / "demos.h5", episodes=3)
    # stopped at step 3: between two logged rows (their losses travel in the checkpoint)
    common = ["--eval-every", "4", "--log-every", "2", "--checkpoint-every", "2", "--keep-checkpoints", "0"]
    main(args(tmp_path, demos, "--steps", "8", *common, out="whole"))
    main(args(tmp_path, demos, "--steps", "3", *common, out="part"))
    main(["--resume", str(tmp_path / "part.run"), "--steps", "8", "--overwrite"])  # --out: the run's

    whole, part = read_metrics(tmp_path / "whole.run"), read_metrics(tmp_path / "part.run")
    assert [r["iteration"] for r in part] == [0, 2, 4, 6, 8]
    for a, b in zip(whole, part, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
            k: v for k, v in b.items() if not k.startswith("time/")
        }
    from safetensors.torch import load_file

    name = "model-00001-of-00001.safetensors"
    a, b = load_file(tmp_path / "whole" / name), load_file(tmp_path / "part" / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    info = json.loads((tmp_path / "part" / "training.json").read_text())
    assert info["steps"] == 8 and info["steps_this_call"] == 5


def test_fine_tune_from_a_bundle_keeps_its_model_statistics_and_reward(tmp_path):
    demos = synthetic_demos(tmp_path / "demos.h5", episodes=2)
    main(args(tmp_path, demos, "--steps", "2", "--hidden-size", "32", "--depth", "1", out="first"))
    other = synthetic_demos(tmp_path / "other.h5", episodes=2, seed=1)
    record = main(args(tmp_path, other, "--steps", "2", "--init-from", str(tmp_path / "first"), out="second"))
    assert record["init_from"] == str(tmp_path / "first") and record["action_stats"] == "init"
    assert record["model"]["hidden_size"] == 32 and record["model"]["depth"] == 1  # the bundle's size
    first, second = (
        json.loads((tmp_path / n / "dataset_statistics.json").read_text()) for n in ("first", "second")
    )
    assert (
        second["action"]["q01"] == first["action"]["q01"]
        and second["action"]["q99"] == first["action"]["q99"]
    )
    assert (tmp_path / "second" / "resnet_rm.pth").read_bytes() == (
        tmp_path / "first" / "resnet_rm.pth"
    ).read_bytes()
    from safetensors.torch import load_file

    vae = "vae/diffusion_pytorch_model.safetensors"
    a, b = load_file(tmp_path / "first" / vae), load_file(tmp_path / "second" / vae)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the VAE stays frozen


# ---- bad input: refused before training --------------------------------------------------------------------


def refused(argv: list[str], match: str) -> None:
    with pytest.raises(BadInput, match=match):
        main(argv)


def test_bad_frame_size_action_dim_and_chunk(tmp_path, no_world_model_training):
    demos = synthetic_demos(tmp_path / "demos.h5", episodes=2)
    refused(args(tmp_path, demos, "--image-size", "[64, 64]"), "32x32 frames, the model takes 64x64")
    init = tmp_path / "init"
    from envs.world_models.tiny import write_tiny_bundle

    write_tiny_bundle("opensora", init)  # RLinf's layout, no training.json: 256x256, chunk 8
    refused(args(tmp_path, demos, "--init-from", str(init)), "32x32 frames, the model takes 256x256")
    refused(args(tmp_path, demos, "--init-from", str(init), "--chunk", "4"), "trained with chunks of 8")
    refused(args(tmp_path, demos, "--init-from", str(init), "--condition-frames", "2"), "its STDiT3 takes 4")

    eight = synthetic_demos(tmp_path / "eight.h5", episodes=2)
    with h5py.File(eight, "a") as f:  # 8-D actions
        for g in f["episodes"].values():
            actions = g["actions"][()]
            del g["actions"]
            g["actions"] = np.concatenate([actions, actions[..., :1]], axis=-1)
    refused(args(tmp_path, eight, "--init-from", str(init)), "8-D actions, the model takes 7-D")

    chunked = tmp_path / "chunked.h5"
    rng = np.random.default_rng(0)
    frames, actions = moving_square(rng, 16)
    ep = Episode(obs={"image": frames[:2]}, actions=actions.reshape(2, 8, 7), valid=np.ones((2, 8), bool),
                 rewards=np.zeros((2, 8), np.float32), instruction="x")  # fmt: skip
    write_demos(chunked, [ep], {"env": "x", "chunk_size": 8})
    refused(args(tmp_path, chunked), "one image per chunk of 8 actions")


def test_short_episodes_nan_actions_and_existing_out(tmp_path, no_world_model_training):
    short = synthetic_demos(tmp_path / "short.h5", episodes=2, steps=11)
    refused(args(tmp_path, short), r"fewer frames than context \+ one chunk \(4 \+ 8 = 12\): 0 \(11\)")

    nan = synthetic_demos(tmp_path / "nan.h5", episodes=2)
    with h5py.File(nan, "a") as f:
        f["episodes/000001/actions"][3, 0, 2] = np.nan
    refused(args(tmp_path, nan), "NaN")

    demos = synthetic_demos(tmp_path / "demos.h5", episodes=2)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    refused(args(tmp_path, demos, out="mine"), "already exists: pass --overwrite")
    refused(args(tmp_path, demos, "--overwrite", out="mine"), "not a world-model bundle that vla-gym wrote")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_command_line_reports_bad_input_in_one_line(tmp_path):
    import subprocess
    import sys

    short = synthetic_demos(tmp_path / "short.h5", episodes=1, steps=5)
    out = subprocess.run(
        [sys.executable, "-m", "trainers.world_model", *args(tmp_path, short)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("python -m trainers.world_model: error:") and "Traceback" not in out.stderr
    assert "fewer frames than context + one chunk" in out.stderr and not (tmp_path / "bundle.run").exists()


def test_the_model_learns_to_use_its_actions_when_only_they_predict_the_targets():
    """The action path works end to end: on latents whose every target frame is the previous one plus an
    offset linear in that frame's action, the loss with other clips' actions ends well above the loss
    with the clips' own (a broken path, or one the model could not learn through, would leave them equal)."""
    from nets.opensora_stdit3 import STDiT3, STDiT3Config

    torch.manual_seed(0)
    config = STDiT3Config(hidden_size=64, depth=2, num_heads=2, caption_channels=16, model_max_length=4)
    dit = STDiT3(config)
    dit.rope.freqs.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in dit.parameters() if p.requires_grad], lr=5e-4, eps=1e-15)
    effect = torch.randn(7, 4) * 0.5  # action -> per-channel offset

    def clips(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        context = torch.randn(n, 4, 1, 4, 4, generator=g).expand(n, 4, 4, 4, 4)
        actions = torch.rand(n, 8, 7, generator=g) * 2 - 1
        steps = (actions @ effect).cumsum(1).transpose(1, 2)[..., None, None]  # [n, 4, 8, 1, 1]
        return torch.cat([context, context[:, :, -1:] + steps], dim=2), actions

    g = torch.Generator().manual_seed(1)
    held = torch.Generator().manual_seed(2)
    x_eval, a_eval = clips(held, 32)
    noise_eval, t_eval = torch.randn(x_eval.shape, generator=held), torch.linspace(5, 995, 32)
    mask_eval = frame_mask(32, 4, 8)

    def eval_loss(actions: torch.Tensor) -> float:
        with torch.no_grad():
            loss = flow_loss(lambda x, t, m: dit(x, t, actions, m), x_eval, noise_eval, t_eval, mask_eval)
            return float(loss.mean())

    mask = frame_mask(8, 4, 8)
    for _ in range(300):
        x0, actions = clips(g, 8)
        noise, t = torch.randn(x0.shape, generator=g), torch.sigmoid(torch.randn(8, generator=g)) * 1000
        loss = flow_loss(lambda x, level, m, a=actions: dit(x, level, a, m), x0, noise, t, mask).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    own, other = eval_loss(a_eval), eval_loss(a_eval.roll(16, 0))
    assert other > 1.1 * own, (own, other)
