"""The asynchronous actor-learner of SAC (``--loop async``, trainers/actors/, trainers/sac/actors.py):
the same data as the sync loop with the same number of updates, the policy lag bound, kill and
resume without orphans, and the bad input it refuses before anything starts."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys

import pytest
import sac_envs  # noqa: F401  (registers SacReach-v0, SacClock-v0)
import torch
from learner_kill import kill_learner_midway, subprocess_env

from trainers import checkpoint as ckpt
from trainers.metrics import read_metrics
from trainers.sac import train as sac_train
from trainers.sac.algorithm import SACConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]
CLOCK = "sac_envs:SacClock-v0"


def _args(run_dir, env="sac_envs:SacClock-v0", *extra):
    return [
        "--env", env, "--num-envs", "2", "--total-steps", "240", "--steps-per-iteration", "10",
        "--learning-starts", "30", "--batch-size", "16", "--gradient-steps", "3", "--n-step", "2",
        "--checkpoint-every", "0", "--eval-every", "-1", "--run-dir", str(run_dir),
        "--policy-kwargs", '{"hidden_sizes": [16]}', "--critic-hidden-sizes", "[16]", *FAST, *extra,
    ]  # fmt: skip


def _actor_processes() -> list:
    return [p for p in multiprocessing.active_children() if p.name == "sac-actor"]


@pytest.mark.parametrize("max_lag", [0, 4])
def test_async_stores_what_sync_stores_and_counts_its_updates(tmp_path, max_lag):
    """On an env whose course does not depend on the actions, both loops store the same rows
    (observations, rewards, discounts, next observations, in the same order); the async loop's
    actions differ only through the weights it acted with, each at most ``max_lag`` updates old,
    and it does gradient_steps updates per vector step, less those still owed when the run ends: for
    the last step received and the ``max_actor_lead`` before it at most."""
    sac_train.main(_args(tmp_path / "sync"))
    sac_train.main(_args(tmp_path / "async", "sac_envs:SacClock-v0", "--loop", "async",
                         "--max-policy-lag", str(max_lag), "--weight-sync-every", "2"))  # fmt: skip
    sync, asyn = (ckpt.latest_checkpoint(tmp_path / name)[1] for name in ("sync", "async"))
    a, b = sync["extra"]["buffer"], asyn["extra"]["buffer"]
    assert a["size"] == b["size"] == 240  # one row per env and vector step (K = 1)
    for key in ("rewards", "discounts"):
        assert torch.equal(a[key], b[key]), key
    for key in a["obs"]:
        assert torch.equal(a["obs"][key], b["obs"][key]) and torch.equal(
            a["next_obs"][key], b["next_obs"][key]
        )
    assert not torch.equal(a["actions"], b["actions"])  # other weights, other sampling streams
    assert int(a["lags"].max()) == 0 and 0 <= int(b["lags"].min()) and int(b["lags"].max()) <= max_lag
    live_steps = sync["extra"]["updates"] // 3  # vector steps once the buffer held learning_starts rows
    assert sync["extra"]["updates"] == 3 * live_steps and 100 < live_steps < 120
    lead = SACConfig().max_actor_lead
    assert 3 * (live_steps - lead - 1) <= asyn["extra"]["updates"] <= 3 * live_steps
    rows = read_metrics(tmp_path / "async")
    assert rows[-1]["train/updates"] == asyn["extra"]["updates"]
    assert 0 <= rows[-1]["train/policy_lag_max"] <= max_lag
    assert rows[-1]["train/updates_per_chunk"] == pytest.approx(asyn["extra"]["updates"] / b["size"])
    assert not _actor_processes()


def test_async_learner_that_fails_stops_its_actor(tmp_path, monkeypatch):
    real, calls = sac_train.sac_update, []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 20:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sac_train, "sac_update", dying)
    with pytest.raises(KeyboardInterrupt):
        sac_train.main(_args(tmp_path / "run", "sac_envs:SacReach-v0", "--loop", "async"))
    assert not _actor_processes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_async_run_killed_leaves_no_orphan_and_resumes(tmp_path):
    """SIGKILL the learner's process mid-run: its actor process dies with it; ``--resume`` then
    continues from the last checkpoint (buffer, learner, counters) to the end."""
    run = tmp_path / "run"
    args = _args(run, "sac_envs:SacReach-v0", "--loop", "async")
    args[args.index("--total-steps") + 1] = "4000"
    args[args.index("--checkpoint-every") + 1] = "1"
    kill_learner_midway(["--algo", "sac", *args], run)

    saved = ckpt.latest_checkpoint(run)[1]
    assert saved["extra"]["buffer"]["size"] > 0
    resumed = subprocess.run(
        [sys.executable, "-m", "trainers", "--resume", str(run), "--env", "sac_envs:SacReach-v0",
         "--total-steps", str(saved["counters"]["env_steps"] + 200), *FAST],
        env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = ckpt.latest_checkpoint(run)[1]
    assert final["counters"]["env_steps"] == saved["counters"]["env_steps"] + 200
    assert final["extra"]["buffer"]["size"] == saved["extra"]["buffer"]["size"] + 200  # 2 envs, K = 1
    assert final["extra"]["updates"] > saved["extra"]["updates"]
    assert json.loads((run / "config.json").read_text())["run"]["loop"] == "async"


# ---------------------------------------------------------------------- bad input
def test_async_bad_input_is_refused_before_anything_starts(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="max_policy_lag must be >= 0, got -1"):
        sac_train.main(
            _args(tmp_path / "a", "sac_envs:SacClock-v0", "--loop", "async", "--max-policy-lag", "-1")
        )
    from trainers.ppo.train import main as ppo_main

    with pytest.raises(
        ValueError, match="loop 'async' .* is built for --algo sac and sil; --algo ppo runs with loop 'sync'"
    ):
        ppo_main(["--env", "CartPole-v1", "--loop", "async", "--run-dir", str(tmp_path / "b"), *FAST])
    for device, why in (("cuda:3", "CUDA is not available|has 1 CUDA"), ("meta", "cpu, cuda or cuda:N"),
                        ("gpu", "not a device name")):  # fmt: skip
        with pytest.raises(ValueError, match=f"device '{device}'.*({why})"):
            sac_train.main(
                _args(tmp_path / "c", "sac_envs:SacClock-v0", "--loop", "async", "--device", device)
            )
    from trainers.run_config import RunConfig

    with pytest.raises(ValueError, match="loop must be 'sync' or 'async', got 'later'"):
        RunConfig(loop="later")
    # Ray not installed: here, and in the actor process (a fresh interpreter on this sys.path)
    fake = tmp_path / "no_ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'ray' (a test's stand-in)\")\n")
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.syspath_prepend(str(fake.parent))
    with pytest.raises(ImportError, match="ray_actors asks for envs on Ray actors, which need Ray"):
        sac_train.main(_args(tmp_path / "e", "envs:Ray-v0", "--loop", "async",
                             "--env-kwargs", '{"env": "Pendulum-v1", "ray_actors": 1}'))  # fmt: skip
    assert not _actor_processes()


def test_resume_with_another_loop_is_refused(tmp_path):
    run = tmp_path / "run"
    args = _args(run)
    args[args.index("--total-steps") + 1] = "60"
    sac_train.main(args)
    before = sorted(p.name for p in run.rglob("*"))
    with pytest.raises(ValueError, match="loop"):
        sac_train.main(["--resume", str(run), "--env", "sac_envs:SacClock-v0", "--loop", "async",
                        "--total-steps", "120", *FAST])  # fmt: skip
    assert sorted(p.name for p in run.rglob("*")) == before
