"""Demonstration files, behaviour cloning, and RL starting from the cloned policy."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch
from conftest import requires_libero

import envs  # noqa: F401  (registers the LIBERO ids)
from policies import BinnedPolicy, CategoricalPolicy, FlowPolicy, GaussianPolicy
from trainers import bc
from trainers.checkpoint import export_policy, latest_checkpoint
from trainers.datasets.demos import Demos, Episode, read_demos, write_demos
from trainers.demos import collect_episodes
from trainers.grpo.algorithm import GRPOConfig
from trainers.optim import BadUpdateGuard
from trainers.run import Run, RunConfig


def _episode(rng, chunks: int, k: int = 4, text: str = "put the bowl on the plate") -> Episode:
    valid = np.ones((chunks, k), bool)
    valid[-1, 2:] = False  # the episode ended inside its last chunk
    return Episode(
        obs={
            "image": rng.integers(0, 255, (chunks, 8, 8, 3), dtype=np.uint8),
            "proprio": rng.normal(size=(chunks, 8)).astype(np.float32),
        },
        actions=rng.uniform(-1, 1, (chunks, k, 7)).astype(np.float32),
        valid=valid,
        rewards=np.zeros((chunks, k), np.float32),
        instruction=text,
        task="libero_spatial/some_task",
        initial_frame=3,
        success=True,
    )


def test_demo_file_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    episodes = [_episode(rng, 3), _episode(rng, 5, text="pick up the soup")]
    path = write_demos(
        tmp_path / "d.h5", episodes, {"env": "x", "env_kwargs": {"image_size": 8}, "chunk_size": 4}
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.h5"]  # no temporary file left
    demos = read_demos(path)
    assert demos.meta["env_kwargs"] == {"image_size": 8} and demos.meta["chunk_size"] == 4
    assert len(demos.episodes) == 2
    for got, want in zip(demos.episodes, episodes):
        for key in want.obs:
            np.testing.assert_array_equal(got.obs[key], want.obs[key])
        np.testing.assert_array_equal(got.actions, want.actions)
        np.testing.assert_array_equal(got.valid, want.valid)
        assert (got.instruction, got.task, got.initial_frame, got.success) == (
            want.instruction,
            want.task,
            3,
            True,
        )
        assert got.length == want.valid.sum()
    chunks = demos.chunks(["image", "proprio", "instruction"])
    assert chunks["actions"].shape == (8, 4, 7) and chunks["obs"]["image"].shape == (8, 8, 8, 3)
    assert chunks["obs"]["instruction"][3] == "pick up the soup"
    with pytest.raises(KeyError, match="'wrist_image' is not in the demonstrations"):
        demos.chunks(["wrist_image"])
    with pytest.raises(ValueError, match="can only be used with chunk_size 4"):
        demos.chunks(["proprio"], 2)

    # one action per step, cut into chunks of 2 at every step
    single = _episode(rng, 3, k=1)
    single.valid[:] = True
    cut = read_demos(write_demos(tmp_path / "s.h5", [single], {})).chunks(["proprio"], 2)
    np.testing.assert_array_equal(cut["valid"], [[True, True], [True, True], [True, False]])
    np.testing.assert_array_equal(cut["actions"][0], single.actions[:2, 0])
    np.testing.assert_array_equal(cut["actions"][2, 0], single.actions[2, 0])
    np.testing.assert_array_equal(cut["obs"]["proprio"], single.obs["proprio"])

    def interrupted():
        yield episodes[0]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_demos(tmp_path / "cut.h5", interrupted(), {"env": "x"})
    assert not (tmp_path / "cut.h5").exists()
    partial = read_demos(tmp_path / f"cut.h5.{os.getpid()}.tmp")  # the complete episodes written before
    assert len(partial.episodes) == 1 and partial.episodes[0].length == episodes[0].length

    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.attrs["format"] = "something else"
    with pytest.raises(ValueError, match="is not a vla-gym-demos file"):
        read_demos(tmp_path / "other.h5")
    with pytest.raises(FileNotFoundError):
        read_demos(tmp_path / "missing.h5")


def test_demo_files_are_compressed_and_uncompressed_ones_still_read(tmp_path):
    rng = np.random.default_rng(1)
    episodes = [_episode(rng, 6), _episode(rng, 4)]
    episodes[0].sim_states = rng.normal(size=(6, 5))
    episodes[1].obs["empty"] = np.zeros((4, 0), np.float32)  # HDF5 cannot chunk an empty array
    meta = {"env": "x", "env_kwargs": {"image_size": 8}, "chunk_size": 4}
    path = write_demos(tmp_path / "new.h5", episodes, meta)
    with h5py.File(path, "r") as f:
        datasets = []
        f["episodes"].visititems(lambda _, o: datasets.append(o) if isinstance(o, h5py.Dataset) else None)
        assert len(datasets) == 12
        for d in datasets:
            if d.size == 0:
                assert d.chunks is None
                continue
            # one chunk per dataset (the whole episode), gzip after shuffle
            assert (d.compression, d.shuffle, d.chunks) == ("gzip", True, d.shape), d.name

    # a file as earlier versions wrote it: no filters, contiguous, the earliest HDF5 format
    with h5py.File(tmp_path / "old.h5", "w") as f:
        f.attrs.update({"format": "vla-gym-demos", "version": 1, "env": "x", "chunk_size": 4})
        f.attrs["env_kwargs"] = json.dumps({"image_size": 8})
        for n, ep in enumerate(episodes):
            g = f.create_group(f"episodes/{n:06d}")
            g.attrs.update(
                {
                    "instruction": ep.instruction,
                    "task": ep.task,
                    "initial_frame": ep.initial_frame,
                    "success": ep.success,
                    "return": 0.0,
                    "length": ep.length,
                }
            )
            for key, value in ep.obs.items():
                g.create_dataset(f"obs/{key}", data=value)
            for key in ("actions", "valid", "rewards", "sim_states"):
                if getattr(ep, key) is not None:
                    g.create_dataset(key, data=getattr(ep, key))
    new, old = read_demos(path), read_demos(tmp_path / "old.h5")
    assert new.meta["env_kwargs"] == old.meta["env_kwargs"] == {"image_size": 8}
    for a, b, want in zip(new.episodes, old.episodes, episodes):
        for got in (a, b):
            assert got.obs.keys() == want.obs.keys()
            for key in want.obs:
                np.testing.assert_array_equal(got.obs[key], want.obs[key])
                assert got.obs[key].dtype == want.obs[key].dtype
            for key in ("actions", "valid", "rewards", "sim_states"):
                np.testing.assert_array_equal(getattr(got, key), getattr(want, key))


def test_the_format_lives_in_datasets_and_trainers_demos_still_exports_it():
    from trainers import demos
    from trainers.datasets import demos as demo_format

    for name in ("FORMAT", "VERSION", "Episode", "Demos", "write_demos", "read_demos", "check_format"):
        assert getattr(demos, name) is getattr(demo_format, name), name
        assert name in demos.__all__
    assert not hasattr(demo_format, "collect_episodes")  # collection and its command line stay


@pytest.mark.parametrize(
    "cls, kwargs",
    [(GaussianPolicy, {"squash": True}), (GaussianPolicy, {}), (BinnedPolicy, {}), (FlowPolicy, {})],
)
@pytest.mark.slow
def test_imitation_loss_falls_for_each_box_policy(cls, kwargs):
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    act_space = gym.spaces.Box(-1, 1, (2, 2), np.float32)
    policy = cls(obs_space, act_space, use_critic=False, **kwargs)
    obs = torch.randn(64, 3)
    actions = torch.tanh(obs[:, :2, None].expand(64, 2, 2) * 2)  # a function of the observation
    mask = torch.ones(64, 2, dtype=torch.bool)
    mask[:8, 1] = False
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        loss = policy.imitation_loss(obs, actions, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.5
    if cls is not FlowPolicy:  # the mode of the cloned policy is near the demonstrated actions
        act = policy.act(obs, deterministic=True).actions
        assert (act - actions).abs().mean() < 0.25


def test_bc_learning_rate_schedule_is_openvla_ofts_and_counts_optimizer_steps():
    """``lr_warmup_steps``: linear from 10% of the rate; ``lr_decay_steps``: 10x lower from then on
    (OpenVLA-OFT's recipe); off by default. ``train_epoch`` sets each minibatch step's rate from the
    run's step count, so a resumed run continues the same schedule."""
    assert bc.BCConfig(learning_rate=0.1).lr_at(12345) == 0.1
    cfg = bc.BCConfig(learning_rate=0.1, batch_size=2, image_shift=0, lr_warmup_steps=20, lr_decay_steps=20)
    assert cfg.lr_at(0) == pytest.approx(0.1 * (0.1 + 0.9 / 20))
    assert [cfg.lr_at(s) for s in (19, 20, 1000)] == pytest.approx([0.1, 0.01, 0.01])
    with pytest.raises(ValueError, match="lr_warmup_steps"):
        bc.BCConfig(lr_warmup_steps=-1)

    class Evaluator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, imitation):
            obs, actions, mask, _ = imitation
            return ((self.w * torch.as_tensor(obs["x"])).sum(-1) - actions[:, 0, 0]).abs().mean()

    evaluator = Evaluator()
    optimizer = torch.optim.AdamW(evaluator.parameters(), lr=cfg.learning_rate)
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    data = {
        "obs": {"x": np.ones((5, 1), np.float32)},
        "actions": torch.zeros(5, 1, 1),
        "valid": np.ones((5, 1), bool),
    }
    guard = BadUpdateGuard(3)
    bc.train_epoch(evaluator, optimizer, data, np.arange(5), cfg, guard, None, None, "cpu", first_step=18)
    assert seen == pytest.approx([cfg.lr_at(18), 0.1, 0.01])  # three minibatches: steps 18, 19, 20


def test_bc_sets_fixed_obs_norm_statistics_from_the_demos(tmp_path):
    """``obs_norm="fixed"``: behaviour cloning standardises the vector observations by the demos'
    statistics (every chunk start of the training episodes), saved with the clone."""
    if "SacCounting-v0" not in gym.registry:
        gym.register("SacCounting-v0", vector_entry_point="counting_env:CountingVectorEnv")
    eps = []
    for goal in (3, 5):
        pos = np.arange(goal, dtype=np.float32)
        eps.append(Episode(
            obs={"image": np.zeros((goal, 2, 2, 3), np.uint8),
                 "proprio": np.stack([pos * 10, np.full(goal, goal)], 1).astype(np.float32)},
            actions=np.ones((goal, 1, 2), np.float32), valid=np.ones((goal, 1), bool),
            rewards=np.zeros((goal, 1), np.float32), instruction="walk", success=True,
        ))  # fmt: skip
    meta = {"env": "SacCounting-v0", "chunk_size": 1, "action_dim": 2}
    path = write_demos(tmp_path / "demos.h5", eps, meta)
    kwargs = {"hidden_sizes": [8], "torso_kwargs": {"obs_norm": "fixed"}}
    bc.main(
        ["--demos", str(path), "--env", "SacCounting-v0", "--env-kwargs", '{"chunk_size": 1}',
         "--num-envs", "1", "--policy", "gaussian", "--policy-kwargs", json.dumps(kwargs), "--epochs", "2",
         "--val-fraction", "0", "--eval-every", "-1", "--run-dir", str(tmp_path / "bc"),
         "--no-progress", "--no-tensorboard", "--no-video"]
    )  # fmt: skip
    state = latest_checkpoint(tmp_path / "bc")[1]["policy"]["state_dict"]
    proprio = np.concatenate([ep.obs["proprio"] for ep in eps]).astype(np.float64)
    assert int(state["torso.encoders.proprio.norm_count"]) == 8
    np.testing.assert_allclose(state["torso.encoders.proprio.norm_mean"].numpy(), proprio.mean(0))
    np.testing.assert_allclose(state["torso.encoders.proprio.norm_var"].numpy(), proprio.var(0))


def test_categorical_imitation_loss_and_bad_actions():
    policy = CategoricalPolicy(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3, start=1))
    obs = torch.randn(4, 2)
    assert torch.isfinite(policy.imitation_loss(obs, torch.tensor([1.0, 2.0, 3.0, 1.0]).reshape(4, 1, 1)))
    with pytest.raises(ValueError, match="outside the action space"):
        policy.imitation_loss(obs, torch.full((4, 1, 1), 4.0))


@pytest.mark.slow
def test_demos_of_a_discrete_env_and_their_imitation_loss():
    """CartPole (Discrete) takes integer actions; the demos keep them as [C, 1, 1] floats."""
    from gymnasium.vector import AutoresetMode

    env = gym.make_vec(
        "CartPole-v1", 2, vectorization_mode="sync", vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}
    )
    torch.manual_seed(0)
    policy = CategoricalPolicy(env.single_observation_space, env.single_action_space)
    episodes = list(collect_episodes(env, policy, 3, seed=0))
    with pytest.raises(RuntimeError, match=r"did not finish an episode in max_steps=2 policy steps"):
        next(collect_episodes(env, policy, 1, seed=0, max_steps=2))
    env.close()
    assert len(episodes) == 3
    for ep in episodes:
        assert ep.actions.shape == (ep.length, 1, 1) and set(np.unique(ep.actions)) <= {0.0, 1.0}
        assert ep.obs["obs"].shape == (ep.length, 4) and ep.valid.all()
    obs = torch.as_tensor(np.concatenate([ep.obs["obs"] for ep in episodes]))
    actions = torch.as_tensor(np.concatenate([ep.actions for ep in episodes]))
    assert torch.isfinite(policy.imitation_loss(obs, actions, torch.ones(len(obs), 1, dtype=torch.bool)))


LIBERO_KWARGS = {"image_size": 32, "max_episode_steps": 24, "chunk_size": 4}


@pytest.mark.slow
@requires_libero
def test_collect_clone_and_start_rl_from_the_clone(tmp_path):
    """Demos of a fixed deterministic policy in real LIBERO -> BC (loss falls) -> GRPO starts from it."""
    env = gym.make_vec("Libero-Spatial-v0", num_envs=2, autoreset_mode="Disabled", **LIBERO_KWARGS)
    try:
        source = GaussianPolicy(env.single_observation_space, env.single_action_space, squash=True)
        torch.nn.init.normal_(source.mean_head.weight, std=0.3)  # actions vary with the observation
        episodes = list(collect_episodes(env, source, 3, seed=0, deterministic=True))
        frames = env.initial_frames
    finally:
        env.close()
    assert len(episodes) == 3
    for ep in episodes:
        assert ep.actions.shape == (6, 4, 7) and ep.valid.all()  # 24 sub-steps = 6 chunks of 4
        assert ep.obs["image"].shape == (6, 32, 32, 3) and ep.obs["proprio"].shape == (6, 8)
        assert ep.instruction == frames[ep.initial_frame].instruction
        assert ep.task == frames[ep.initial_frame].task and not ep.success
    assert len({ep.initial_frame for ep in episodes}) == 3  # a permutation of the frame ids
    path = write_demos(tmp_path / "demos.h5", episodes, {"env": "envs:Libero-Spatial-v0"})

    common = ["--env", "envs:Libero-Spatial-v0", "--env-kwargs", json.dumps(LIBERO_KWARGS), "--num-envs", "2"]
    common += ["--eval-episodes", "2", "--no-progress", "--no-tensorboard", "--no-video"]
    bc.main(
        ["--demos", str(path), "--policy", "gaussian", "--policy-kwargs", '{"squash": true}']
        + [
            "--epochs",
            "20",
            "--batch-size",
            "4",
            "--learning-rate",
            "3e-3",
            "--run-dir",
            str(tmp_path / "bc"),
            *common,
        ]
    )
    rows = [json.loads(line) for line in (tmp_path / "bc" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/bc_loss"] for r in rows if "train/bc_loss" in r]
    assert len(losses) == 20 and losses[-1] < losses[0] - 0.5
    assert all("train/val_loss" in r for r in rows if "train/bc_loss" in r)
    _, data = latest_checkpoint(tmp_path / "bc")
    cloned = data["policy"]["state_dict"]

    # RL from the clone (exported alone: no optimizer): same class, kwargs and weights; --policy is ignored
    exported = export_policy(tmp_path / "bc", tmp_path / "bc_policy.pt")
    full = latest_checkpoint(tmp_path / "bc")[0]
    assert exported.stat().st_size < full.stat().st_size
    cfg = RunConfig(
        env="envs:Libero-Spatial-v0",
        env_kwargs=LIBERO_KWARGS,
        policy="flow",
        init_policy=str(exported),
        run_dir=str(tmp_path / "grpo"),
        num_envs=1,
    )
    run = Run("grpo", cfg, GRPOConfig())
    env = run.make_env(1)
    try:
        policy = run.make_policy(env, use_critic=False)
    finally:
        env.close()
    assert isinstance(policy, GaussianPolicy) and policy.squash
    for key, value in policy.state_dict().items():
        assert torch.equal(value, cloned[key]), key
    with pytest.raises(ValueError, match="holds a policy only"):
        Run("grpo", RunConfig(resume=str(exported)), GRPOConfig()).restore(
            policy, torch.optim.Adam(policy.parameters()), {}
        )

    # demos that do not fit the env are refused clearly
    with pytest.raises(ValueError, match="observation 'image' has shape \\(32, 32, 3\\) in the demos"):
        bc.main(
            ["--demos", str(path), "--policy", "gaussian", "--epochs", "1", "--run-dir", str(tmp_path / "x")]
            + [*common[:2], "--env-kwargs", json.dumps({**LIBERO_KWARGS, "image_size": 40}), *common[4:]]
        )


def test_future_gives_the_observation_after_each_chunk_and_its_discounted_return():
    """``Demos.future``: row for row with ``chunks``, the observation after the sample's chunk and
    ``sum_j gamma^(j - u) r_j`` from there, taken at the last step where the episode ends inside."""
    t = 5
    ep = Episode(
        obs={"proprio": np.arange(t, dtype=np.float32)[:, None]},
        actions=np.zeros((t, 1, 2), np.float32),
        valid=np.ones((t, 1), bool),
        rewards=np.eye(1, t, t - 1, dtype=np.float32).T,  # success at the last step
        instruction="go",
        success=True,
    )
    demos = Demos({}, [ep, ep])
    future = demos.future(2, gamma=0.5)
    assert len(future["returns"]) == len(demos.chunks(["proprio"], 2)["actions"]) == 2 * t
    np.testing.assert_array_equal(future["next_row"], [2, 3, 4, 4, 4, 7, 8, 9, 9, 9])
    np.testing.assert_allclose(future["returns"], [0.25, 0.5, 1.0, 1.0, 1.0] * 2)

    # stored chunks (K = 4, the last one cut after 2 sub-steps): the next row, sub-steps summed
    rng = np.random.default_rng(0)
    chunked = _episode(rng, 3)
    chunked.rewards[-1, 1] = 1.0  # success on the episode's last executed sub-step (index 9)
    future = Demos({}, [chunked]).future(None, gamma=0.5)
    np.testing.assert_array_equal(future["next_row"], [1, 2, 2])
    np.testing.assert_allclose(future["returns"], [0.5**5, 0.5**1, 1.0])
    with pytest.raises(ValueError, match="gamma"):
        demos.future(2, gamma=0.0)


def test_bc_gives_next_observations_and_returns_to_a_loss_that_takes_them(tmp_path, monkeypatch):
    """A policy whose ``imitation_loss`` takes ``next_obs`` and ``returns`` (Cosmos Policy's world-model
    and value targets) gets them, row for row with the batch."""
    if "SacCounting-v0" not in gym.registry:
        gym.register("SacCounting-v0", vector_entry_point="counting_env:CountingVectorEnv")
    goal = 4
    pos = np.arange(goal, dtype=np.float32)
    ep = Episode(
        obs={"image": np.zeros((goal, 2, 2, 3), np.uint8), "proprio": np.stack([pos, pos], 1)},
        actions=np.ones((goal, 1, 2), np.float32), valid=np.ones((goal, 1), bool),
        rewards=np.eye(1, goal, goal - 1, dtype=np.float32).T, instruction="walk", success=True,
    )  # fmt: skip
    path = write_demos(tmp_path / "demos.h5", [ep], {"env": "SacCounting-v0", "chunk_size": 1})
    seen = []
    plain = GaussianPolicy.imitation_loss

    def loss_with_future(self, obs, actions, mask=None, *, next_obs=None, returns=None):
        seen.append((obs["proprio"][:, 0].copy(), next_obs["proprio"][:, 0].copy(), returns.numpy()))
        return plain(self, obs, actions, mask)

    monkeypatch.setattr(GaussianPolicy, "imitation_loss", loss_with_future)
    bc.main(
        ["--demos", str(path), "--env", "SacCounting-v0", "--env-kwargs", '{"chunk_size": 1}',
         "--num-envs", "1", "--policy", "gaussian", "--policy-kwargs", '{"hidden_sizes": [8]}',
         "--epochs", "1", "--val-fraction", "0", "--eval-every", "-1", "--value-gamma", "0.5",
         "--run-dir", str(tmp_path / "bc"), "--no-progress", "--no-tensorboard", "--no-video"]
    )  # fmt: skip
    assert seen
    for now, after, returns in seen:
        np.testing.assert_array_equal(after, np.minimum(now + 1, goal - 1))
        np.testing.assert_allclose(returns, 0.5 ** (goal - 1 - after))


KILLED_WRITER = """
import os, signal, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from trainers.datasets.demos import Episode, write_demos

def _episode(rng, chunks):
    return Episode(
        obs={"proprio": rng.normal(size=(chunks, 8)).astype(np.float32)},
        actions=rng.uniform(-1, 1, (chunks, 4, 7)).astype(np.float32),
        valid=np.ones((chunks, 4), bool), rewards=np.zeros((chunks, 4), np.float32),
        instruction="put the bowl on the plate", task="t", initial_frame=0, success=True,
    )

rng = np.random.default_rng(0)
meta = {"env": "x", "episodes_run": 0}

def episodes():
    for n in range(5):
        meta["episodes_run"] += 1
        if n == 3:  # the 4th episode is being produced (an env stepping) when the kill comes
            os.kill(os.getpid(), signal.SIGKILL)
        yield _episode(rng, 3 + n)

write_demos(sys.argv[1], episodes(), meta)
"""


def test_a_killed_writer_leaves_a_readable_partial_file(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "killed.h5"
    root = str(Path(__file__).resolve().parents[1])
    command = [sys.executable, "-c", KILLED_WRITER, str(out), root]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert not out.exists()
    (partial,) = tmp_path.glob("killed.h5.*.tmp")
    demos = read_demos(partial)
    assert [ep.actions.shape[0] for ep in demos.episodes] == [3, 4, 5]  # every episode written before
    assert demos.meta["episodes_run"] == 3  # as of the last one written: what the kill lost is the rest
