"""Self-imitation on the asynchronous actor-learner (``--loop async``, trainers/actors/ and
trainers/sil/actors.py): the same kept data as the sync loop, each chunk's policy lag within its
bound, a learner that does at most ``updates_per_iteration`` updates per iteration while the envs
step, kill and resume without orphans, and the bad input it refuses before anything starts."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys

import numpy as np
import pytest
import sac_envs  # noqa: F401  (registers SacClock-v0, SacReach-v0 here and in the actor process)
from learner_kill import kill_flooded_learner, kill_learner_midway, subprocess_env

from nets.errors import BadInput
from trainers import checkpoint as ckpt
from trainers.metrics import read_metrics
from trainers.sil import train as sil_train

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]


def _args(run_dir, *extra):
    """SacClock: every episode ends after 6 steps by termination (a success), whatever the actions."""
    return [
        "--env", "sac_envs:SacClock-v0", "--num-envs", "2", "--total-steps", "240",
        "--steps-per-iteration", "10", "--updates-per-iteration", "3", "--batch-size", "16",
        "--ema-decay", "0.9", "--checkpoint-every", "0", "--eval-every", "-1", "--run-dir", str(run_dir),
        "--policy", "gaussian", "--policy-kwargs", '{"hidden_sizes": [16], "squash": true}', *FAST, *extra,
    ]  # fmt: skip


def _actor_processes() -> list:
    return [p for p in multiprocessing.active_children() if p.name == "sil-actor"]


@pytest.mark.parametrize("max_lag", [0, 5])
def test_async_keeps_what_sync_keeps_and_counts_its_updates(tmp_path, max_lag):
    """On an env whose course does not depend on the actions both loops keep the same episodes in
    the same order (the same observations; other actions, from other weights and sampling streams);
    each async chunk was chosen at most ``max_lag`` updates late, and the learner did at most
    ``updates_per_iteration`` per iteration."""
    sil_train.main(_args(tmp_path / "sync"))
    sil_train.main(_args(tmp_path / "async", "--loop", "async", "--max-policy-lag", str(max_lag),
                         "--weight-sync-every", "2"))  # fmt: skip
    sync, asyn = (ckpt.latest_checkpoint(tmp_path / name)[1] for name in ("sync", "async"))
    a, b = sync["extra"]["successes"], asyn["extra"]["successes"]
    assert len(a["actions"]) == len(b["actions"]) == a["rows_added"] == 240  # every episode succeeds
    assert a["episodes"] == b["episodes"] == 40
    for key in a["obs"]:
        np.testing.assert_array_equal(a["obs"][key], b["obs"][key])
    assert not np.array_equal(a["actions"], b["actions"])
    assert a["lags"].max() == 0 and 0 <= b["lags"].min() and b["lags"].max() <= max_lag
    iterations = sync["counters"]["iteration"]
    assert iterations == asyn["counters"]["iteration"] == 12
    assert sync["extra"]["updates"] == 3 * iterations
    assert 0 < asyn["extra"]["updates"] <= 3 * iterations
    rows = read_metrics(tmp_path / "async")
    assert rows[-1]["train/updates"] == asyn["extra"]["updates"]
    assert rows[-1]["train/updates_per_chunk"] == pytest.approx(asyn["extra"]["updates"] / 240)
    assert 0 <= rows[-1]["train/policy_lag_max"] <= max_lag
    assert "train/policy_lag_max" not in read_metrics(tmp_path / "sync")[-1]
    assert not _actor_processes()


def test_async_learner_that_fails_stops_its_actor(tmp_path, monkeypatch):
    real, calls = sil_train.sil_update, []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sil_train, "sil_update", dying)
    with pytest.raises(KeyboardInterrupt):
        sil_train.main(_args(tmp_path / "run", "--loop", "async"))
    assert not _actor_processes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_async_run_killed_leaves_no_orphan_and_resumes(tmp_path):
    """SIGKILL the learner mid-run: its actor process dies with it; ``--resume`` continues from the
    last checkpoint (buffer, weights and average, counters) to the end, on the async loop."""
    run = tmp_path / "run"
    args = _args(run, "--loop", "async")
    args[args.index("--total-steps") + 1] = "6000"
    args[args.index("--checkpoint-every") + 1] = "1"
    kill_learner_midway(["--algo", "sil", *args], run)

    saved = ckpt.latest_checkpoint(run)[1]
    kept = saved["extra"]["successes"]
    assert kept["rows_added"] > 0
    resumed = subprocess.run(
        [sys.executable, "-m", "trainers", "--resume", str(run), "--env", "sac_envs:SacClock-v0",
         "--total-steps", str(saved["counters"]["env_steps"] + 60), *FAST],
        env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = ckpt.latest_checkpoint(run)[1]
    assert final["counters"]["env_steps"] == saved["counters"]["env_steps"] + 60
    assert final["extra"]["successes"]["rows_added"] == kept["rows_added"] + 60  # 10 new episodes of 6
    np.testing.assert_array_equal(
        final["extra"]["successes"]["actions"][: len(kept["actions"])], kept["actions"]
    )
    assert final["extra"]["updates"] > saved["extra"]["updates"]
    assert json.loads((run / "config.json").read_text())["run"]["loop"] == "async"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_actor_waiting_on_a_full_queue_dies_with_its_learner():
    """The learner dies while its actor waits to send on a full queue (the learner read nothing): the
    actor must not wait for ever to report its end, or to flush the queue into a pipe no one reads."""
    kill_flooded_learner()


def test_async_bad_input_is_refused_before_anything_starts(tmp_path):
    for flag, value, why in (("--max-policy-lag", "-1", "max_policy_lag must be >= 0, got -1"),
                             ("--weight-sync-every", "0", "weight_sync_every must be >= 1, got 0"),
                             ("--actor-nice", "20", r"actor_nice must be in \[0, 19\], got 20")):  # fmt: skip
        with pytest.raises(BadInput, match=why):
            sil_train.main(_args(tmp_path / "a", "--loop", "async", flag, value))
        assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="device 'cuda:3'"):
        sil_train.main(_args(tmp_path / "b", "--loop", "async", "--device", "cuda:3"))
    assert not _actor_processes()


def test_resume_with_another_loop_is_refused(tmp_path):
    run = tmp_path / "run"
    args = _args(run)
    args[args.index("--total-steps") + 1] = "40"
    sil_train.main(args)
    before = sorted(p.name for p in run.rglob("*"))
    with pytest.raises(ValueError, match="loop"):
        sil_train.main(["--resume", str(run), "--env", "sac_envs:SacClock-v0", "--loop", "async",
                        "--total-steps", "80", *FAST])  # fmt: skip
    assert sorted(p.name for p in run.rglob("*")) == before


def test_sync_loop_resumes_bit_for_bit(tmp_path):
    """The sync loop stays exact: stopped after 4 iterations and resumed to 8, a run ends with the
    weights, average, buffer and sampling streams of one that ran 8 straight (SacClock's episodes
    end with every iteration of 6 vector steps, so no unfinished episode is dropped)."""
    args = ["--steps-per-iteration", "6", "--checkpoint-every", "1"]
    straight = _args(tmp_path / "straight", *args)
    straight[straight.index("--total-steps") + 1] = "96"
    sil_train.main(straight)
    first = _args(tmp_path / "parts", *args)
    first[first.index("--total-steps") + 1] = "48"
    sil_train.main(first)
    sil_train.main(["--resume", str(tmp_path / "parts"), "--env", "sac_envs:SacClock-v0",
                    "--total-steps", "96", *FAST])  # fmt: skip
    a, b = (ckpt.latest_checkpoint(tmp_path / name)[1] for name in ("straight", "parts"))
    del a["counters"]["elapsed"], b["counters"]["elapsed"]
    assert a["counters"] == b["counters"] and a["counters"]["iteration"] == 8
    for name, value in a["policy"]["state_dict"].items():
        assert np.array_equal(value.numpy(), b["policy"]["state_dict"][name].numpy()), name
    for name, value in a["extra"]["ema_trained_weights"].items():
        assert np.array_equal(value.numpy(), b["extra"]["ema_trained_weights"][name].numpy()), name
    np.testing.assert_array_equal(a["extra"]["successes"]["actions"], b["extra"]["successes"]["actions"])
    assert a["extra"]["updates"] == b["extra"]["updates"] == 8 * 3


def test_async_guided_run_keeps_the_failed_episodes(tmp_path):
    """With ``failure_share`` the actor sends failed episodes too (SacReach never succeeds: each of its
    10-step episodes is a failure) and the learner keeps them apart from the (no) successes."""
    flow = json.dumps({"hidden_sizes": [16], "velocity_hidden": [16], "outcome_conditioned": True})
    args = _args(tmp_path / "run", "--loop", "async", "--failure-share", "0.25")
    args[args.index("sac_envs:SacClock-v0")] = "sac_envs:SacReach-v0"
    args[args.index("gaussian")], args[args.index("--policy-kwargs") + 1] = "flow", flow
    sil_train.main(args)
    extra = ckpt.latest_checkpoint(tmp_path / "run")[1]["extra"]
    assert extra["failures"]["episodes"] == 24 and len(extra["failures"]["actions"]) == 240
    assert extra["successes"]["episodes"] == 0 and extra["updates"] == 0


def test_async_value_weighted_run_trains_its_value_and_weighs_the_successes(tmp_path):
    """``value_weighting`` on the async loop: V is updated beside the policy (every episode of SacClock
    succeeds, so V learns towards 1 and each success's weight 1 - V falls below the untrained 0.5),
    its weights are logged per iteration, and the checkpoint carries V."""
    sil_train.main(_args(tmp_path / "run", "--loop", "async", "--value-weighting", "--value-every", "1"))
    extra = ckpt.latest_checkpoint(tmp_path / "run")[1]["extra"]
    assert extra["updates"] > 0 and extra["failures"]["episodes"] == 0 and "net" in extra["value"]
    rows = [r for r in read_metrics(tmp_path / "run") if "train/success_weight_mean" in r]
    assert rows and np.isfinite(rows[-1]["train/value_loss"]) and rows[-1]["train/success_weight_mean"] < 0.5
