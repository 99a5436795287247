"""Run folders (issue 32): checked before anything is written, whole files written atomically, one
writer at a time (a lock), a non-empty folder resumed or refused (or cleared with --overwrite), torn
log lines dropped on resume, nothing written through a symbolic link. Tiny PPO runs on CartPole
(about a second each)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from trainers import checkpoint as ckpt
from trainers.__main__ import main
from trainers.config import save_config
from trainers.files import open_append, write_atomic
from trainers.metrics import read_metrics
from trainers.ppo import PPOConfig
from trainers.ppo import train as ppo_train
from trainers.run import Run, RunConfig
from trainers.run_folder import FolderLock

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]
ROOT = Path(__file__).resolve().parent.parent


def _args(run_dir: Path, *extra: str) -> list[str]:
    return [
        "--env", "CartPole-v1", "--num-envs", "2", "--n-steps", "32", "--batch-size", "64",
        "--total-steps", "128", "--checkpoint-every", "1", "--eval-every", "-1",
        "--run-dir", str(run_dir), *FAST, *extra,
    ]  # fmt: skip


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (but the lock) and its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A finished 2-iteration PPO run with checkpoints at iterations 1 and 2."""
    ppo_train.main(_args(tmp_path / "run"))
    return tmp_path / "run"


def _iterations(run_dir: Path) -> list[int]:
    return [int(r["iteration"]) for r in read_metrics(run_dir) if "train/loss" in r]


# ---------------------------------------------------------------------- validated before writing
def test_refused_resumes_write_nothing_and_the_run_still_resumes(run_dir, tmp_path):
    before = _files(run_dir)
    with pytest.raises(ValueError, match="the run trains on 'CartPole-v1', not 'Pendulum-v1'"):
        main(["--resume", str(run_dir), "--env", "Pendulum-v1"])
    with pytest.raises(
        ValueError, match=r"iter_000002.pt is a ppo checkpoint, not grpo: resume it with --algo ppo"
    ):
        main(["--resume", str(run_dir), "--algo", "grpo", "--group-size", "2"])
    with pytest.raises(ValueError, match=r"has newer checkpoints \(iter_000002.pt\)"):
        main(["--resume", str(run_dir / "checkpoints" / "iter_000001.pt")])
    with pytest.raises(ValueError, match="resume continues the run in its folder, overwrite clears"):
        main(["--resume", str(run_dir), "--overwrite"])
    assert _files(run_dir) == before  # config.json included: the run can still be resumed as it was

    # a checkpoint outside a run folder: nothing is written beside it (once, config.json went to
    # its grandparent folder)
    elsewhere = tmp_path / "elsewhere" / "deep"
    elsewhere.mkdir(parents=True)
    shutil.copy(run_dir / "checkpoints" / "iter_000002.pt", elsewhere / "iter_000002.pt")
    with pytest.raises(ValueError, match="resumes the run folder it belongs to"):
        main(["--algo", "ppo", "--resume", str(elsewhere / "iter_000002.pt")])
    assert sorted(p.name for p in (tmp_path / "elsewhere").rglob("*")) == ["deep", "iter_000002.pt"]
    # a missing path is not created
    with pytest.raises(FileNotFoundError, match="no such run folder or checkpoint"):
        main(["--algo", "ppo", "--resume", str(tmp_path / "missing")])
    assert not (tmp_path / "missing").exists()
    # a folder that is no run folder
    (tmp_path / "plain" / "checkpoints").mkdir(parents=True)
    shutil.copy(run_dir / "checkpoints" / "iter_000002.pt", tmp_path / "plain" / "checkpoints")
    with pytest.raises(ValueError, match="not a run folder"):
        main(["--algo", "ppo", "--resume", str(tmp_path / "plain")])

    ppo_train.main(
        ["--resume", str(run_dir / "checkpoints" / "iter_000002.pt"), "--total-steps", "256", *FAST]
    )
    assert _iterations(run_dir) == [1, 2, 3, 4]


def test_a_resume_that_fails_while_loading_keeps_config_json(run_dir, monkeypatch):
    """config.json of a resumed run is rewritten only once its state is loaded and an iteration
    ran: a failed resume with changed flags does not make them the run's settings."""
    import trainers.run as run_module

    before = (run_dir / "config.json").read_bytes()

    def broken(*args, **kwargs):
        raise ValueError("the checkpoint does not fit")

    monkeypatch.setattr(run_module.ckpt, "restore_rng_state", broken)
    with pytest.raises(ValueError, match="does not fit"):
        ppo_train.main(["--resume", str(run_dir), "--total-steps", "256", "--learning-rate", "0.5", *FAST])
    assert (run_dir / "config.json").read_bytes() == before
    monkeypatch.undo()
    ppo_train.main(["--resume", str(run_dir), "--total-steps", "256", *FAST])  # the lock was released
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["run"]["total_steps"] == 256 and saved["ppo"]["learning_rate"] == PPOConfig().learning_rate


# ---------------------------------------------------------------------- settings a resume keeps
@pytest.mark.parametrize(
    "flag, value, theirs",
    [
        ("--seed", "3", "seed 0"),
        ("--policy", "gaussian", "policy 'auto'"),
        ("--policy-kwargs", '{"hidden_sizes": [8]}', "policy_kwargs {}"),
        ("--init-policy", "runs/other", "init_policy None"),
        ("--run-dir", "runs/other", "run_dir '{run_dir}'"),
        ("--adam-eps", "0.1", "adam_eps 1e-05"),
    ],
)
def test_flags_a_resumed_run_would_not_apply_are_refused_and_write_nothing(run_dir, flag, value, theirs):
    """Issue 32 item 8: a setting the resumed run takes from its checkpoint, given again with another
    value, is refused naming the flag, the run's value and the given one (it used to be written to
    config.json without taking effect)."""
    before = _files(run_dir)
    theirs = theirs.replace("{run_dir}", str(run_dir))
    with pytest.raises(ValueError) as refused:
        main(["--resume", str(run_dir), "--total-steps", "256", flag, value, *FAST])
    message = str(refused.value)
    assert message.startswith(f"{flag} ")  # then the value given, as parsed
    assert f"has {theirs} ({run_dir / 'config.json'}), and a resumed run keeps it" in message
    assert f"--init-policy {run_dir}" in message
    assert _files(run_dir) == before
    assert not Path("runs/other").exists()


def test_the_runs_own_values_are_accepted_on_resume(run_dir):
    same = ["--seed", "0", "--run-dir", str(run_dir), "--adam-eps", "1e-5", "--policy", "auto"]
    ppo_train.main(["--resume", str(run_dir), "--total-steps", "256", *same, "--policy-kwargs", "{}", *FAST])
    assert _iterations(run_dir) == [1, 2, 3, 4]
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["run"]["total_steps"] == 256 and saved["run"]["seed"] == 0


def test_settings_a_resume_keeps_per_algorithm_and_from_a_config_file(tmp_path):
    """The check on the command line alone (``parse_cli``): GRPO's optimizer settings, a --config file's
    entries, and --policy-kwargs with an opt-in only (the run's arguments are kept, plus the opt-in)."""
    from trainers.config import parse_cli
    from trainers.grpo import GRPOConfig

    folder = tmp_path / "run"
    folder.mkdir()
    kept = {"hidden_sizes": [16], "trust_pickle": True}
    save_config(folder / "config.json", {"run": RunConfig(policy_kwargs=kept), "grpo": GRPOConfig()})
    classes = {"run": RunConfig, "grpo": GRPOConfig}
    resume = ["--resume", str(folder)]
    with pytest.raises(ValueError, match=r"^--learning-rate 0.001: the run in .* has learning_rate 2e-05"):
        parse_cli(classes, [*resume, "--learning-rate", "1e-3"])
    with pytest.raises(ValueError, match=r"^--weight-decay 0.5: .* has weight_decay 0.01"):
        parse_cli(classes, [*resume, "--weight-decay", "0.5"])
    assert parse_cli(classes, [*resume, "--learning-rate", "2e-5"])["grpo"].learning_rate == 2e-5
    with pytest.warns(RuntimeWarning, match="trust_pickle"):  # the file's opt-in is not the user's
        run = parse_cli(classes, [*resume, "--policy-kwargs", '{"download": false}'])["run"]
    assert run.policy_kwargs == {"hidden_sizes": [16], "download": False}
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"run": {"seed": 5}}))
    with pytest.raises(ValueError, match=r"^run.seed = 5 in .*recipe.json: the run in .* has seed 0"):
        parse_cli(classes, [*resume, "--config", str(recipe)])
    recipe.write_text(json.dumps({"run": {"seed": 0, "total_steps": 10}}))
    assert parse_cli(classes, [*resume, "--config", str(recipe)])["run"].total_steps == 10


def test_an_opt_in_the_resumed_policy_has_no_argument_for(tmp_path, monkeypatch):
    """Issue 32: ``--resume RUN --policy-kwargs '{"trust_pickle": false}'`` on a Gaussian-policy run
    was TorsoPolicy's TypeError. An opt-in that asks for nothing (False) is what the policy does
    anyway: left out, the run resumes. One that asks for something (True) is a ValueError naming it
    and the policy, before any env is built, the folder left as it was."""
    run_dir = tmp_path / "run"
    ppo_train.main([a if a != "CartPole-v1" else "Pendulum-v1" for a in _args(run_dir)])  # Gaussian
    before = _files(run_dir)
    resume = ["--resume", str(run_dir), "--total-steps", "192", *FAST, "--policy-kwargs"]
    with monkeypatch.context() as patched:
        patched.setattr(Run, "make_env", lambda *a, **k: pytest.fail("an env was built"))
        with pytest.raises(
            ValueError,
            match=r"^policy_kwargs trust_pickle=True: the policy of .*iter_000002.pt "
            r"\(policies.gaussian:GaussianPolicy\) has no trust_pickle argument \(of the opt-ins .* it "
            r"takes none\)",
        ):
            main([*resume, '{"trust_pickle": true}'])
    assert _files(run_dir) == before
    main([*resume, '{"trust_pickle": false}'])
    assert _iterations(run_dir) == [1, 2, 3]
    assert "trust_pickle" not in ckpt.latest_checkpoint(run_dir)[1]["policy"]["kwargs"]


# ---------------------------------------------------------------------- torn and damaged logs
def test_torn_last_lines_are_dropped_on_resume_and_damage_before_them_is_named(tmp_path):
    run_dir = tmp_path / "run"
    ppo_train.main(_args(run_dir, "--eval-every", "1", "--eval-episodes", "2"))
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 192, "iteration": 3, "train/lo')  # a full disk cut this line short
    with open(run_dir / "eval_episodes.jsonl", "ab") as f:
        f.write(b"\x00\x00garbage\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ppo_train.main(["--resume", str(run_dir), "--total-steps", "256", *FAST])
    torn = [str(w.message) for w in caught if "dropped a torn last line" in str(w.message)]
    assert len(torn) == 2 and "metrics.jsonl, line " in torn[0] and "eval_episodes.jsonl, line 5" in torn[1]
    assert _iterations(run_dir) == [1, 2, 3, 4]
    episodes = [json.loads(line) for line in (run_dir / "eval_episodes.jsonl").read_text().splitlines()]
    assert sorted({e["env_step"] for e in episodes}) == [64, 128, 192, 256]  # every line whole

    before = _files(run_dir)
    for name in ("metrics.jsonl", "eval_episodes.jsonl"):
        lines = (run_dir / name).read_text().splitlines()
        (run_dir / name).write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
        with pytest.raises(ValueError, match=rf"{name}, line 2 of \d+: .*damaged before its last line"):
            ppo_train.main(["--resume", str(run_dir), "--total-steps", "384", *FAST])
        (run_dir / name).write_text("\n".join(lines) + "\n")
    assert _files(run_dir) == before


# ---------------------------------------------------------------------- atomic writes
def test_whole_files_are_written_atomically_and_never_through_a_link(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text("old")

    def full_disk(f):
        f.write(b"half of the new")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, full_disk)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]

    def no_fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_fsync)  # the data never reached the disk
    with pytest.raises(OSError):
        save_config(path, {"run": RunConfig()})
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    monkeypatch.undo()

    target = tmp_path / "outside.txt"
    target.write_text("not yours")
    link = tmp_path / "summary.md"
    link.symlink_to(target)
    write_atomic(link, "the summary")  # the link is replaced, its target untouched
    assert not link.is_symlink() and link.read_text() == "the summary" and target.read_text() == "not yours"
    log = tmp_path / "metrics.jsonl"
    log.symlink_to(target)
    with pytest.raises(ValueError, match="metrics.jsonl is a symbolic link"):
        open_append(log)
    assert target.read_text() == "not yours"


def test_symbolic_links_in_a_run_folder_are_refused(run_dir, tmp_path):
    """A run file or folder that links out of the run folder: the run is refused before it writes
    (once, config.json and summary.md overwrote the files the links pointed to)."""
    for name in ("summary.md", "config.json", "metrics.jsonl", "checkpoints"):
        outside = tmp_path / f"outside-{name}"
        (run_dir / name).rename(outside)
        (run_dir / name).symlink_to(outside)
        before = _files(outside) if outside.is_dir() else outside.read_bytes()
        with pytest.raises(ValueError, match=rf"run/{name} is a symbolic link: .* never through a link"):
            main(["--resume", str(run_dir), "--total-steps", "256", *FAST])
        assert (_files(outside) if outside.is_dir() else outside.read_bytes()) == before
        (run_dir / name).unlink()
        outside.rename(run_dir / name)
    ppo_train.main(["--resume", str(run_dir), "--total-steps", "256", *FAST])
    assert _iterations(run_dir) == [1, 2, 3, 4]


# ---------------------------------------------------------------------- one writer
def test_a_folder_has_one_writer_at_a_time(tmp_path):
    folder = tmp_path / "run"
    config = RunConfig(env="CartPole-v1", num_envs=2, run_dir=str(folder), progress=False, tensorboard=False)
    first = Run("ppo", config, PPOConfig())
    for second in (config, RunConfig(env="CartPole-v1", run_dir=str(folder), overwrite=True)):
        with pytest.raises(RuntimeError, match=rf"{folder} is in use: another run \(process {os.getpid()}\)"):
            Run("ppo", second, PPOConfig())
    code = f"from trainers.run_folder import FolderLock; FolderLock({str(folder)!r})"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "is in use: another run" in done.stderr
    first.close()
    lock = FolderLock(folder)  # released: the next run takes it
    assert lock.held and (folder / ".lock").read_text() == f"{os.getpid()}\n"
    lock.release()
    assert not lock.held


def test_a_failed_start_leaves_the_folder_reusable(tmp_path):
    folder = tmp_path / "run"
    with pytest.raises(ValueError):
        ppo_train.main(_args(folder, "--policy", "no_such_policy"))
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]  # nothing but the lock
    ppo_train.main(_args(folder))  # no --overwrite needed
    assert _iterations(folder) == [1, 2]


# ---------------------------------------------------------------------- resumed or refused, never mixed
def test_a_new_run_in_an_old_runs_folder_is_refused_unless_overwrite(run_dir, tmp_path):
    before = _files(run_dir)
    with pytest.raises(
        ValueError, match=rf"--run-dir {run_dir} already holds a run .*--resume .*--overwrite"
    ):
        ppo_train.main(_args(run_dir, "--seed", "1"))
    assert _files(run_dir) == before
    old = ckpt.latest_checkpoint(run_dir)[1]["policy"]["state_dict"]

    # --overwrite removes a run's own files only; anything else is refused, nothing removed
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"removes a run's own files only, .* \['notes.txt'\]"):
        ppo_train.main(_args(run_dir, "--seed", "1", "--overwrite"))
    assert _files(run_dir) == {**before, "notes.txt": b"mine"}
    (run_dir / "notes.txt").unlink()

    # a link among the old files is removed, never followed
    outside = tmp_path / "videos-elsewhere"
    outside.mkdir()
    (outside / "keep.mp4").write_bytes(b"not the run's")
    (run_dir / "videos").symlink_to(outside)
    ppo_train.main(_args(run_dir, "--seed", "1", "--total-steps", "64", "--overwrite"))
    assert (outside / "keep.mp4").read_bytes() == b"not the run's"
    assert not (run_dir / "videos").exists() and _iterations(run_dir) == [1]  # the new run's log only
    assert [p.name for p in ckpt.checkpoint_paths(run_dir)] == ["iter_000001.pt"]  # no old checkpoint
    saved = json.loads((run_dir / "config.json").read_text())["run"]
    assert saved["seed"] == 1 and saved["overwrite"] is False  # an overwrite is never passed on
    # a later --resume continues the new run, not the old weights
    ppo_train.main(["--resume", str(run_dir), "--total-steps", "128", *FAST])
    new = ckpt.latest_checkpoint(run_dir)[1]
    assert new["config"]["run"]["seed"] == 1 and _iterations(run_dir) == [1, 2]
    assert any(not torch.equal(new["policy"]["state_dict"][k], v) for k, v in old.items())

    # a folder of other files is no run folder, with or without --overwrite
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("1,2")
    with pytest.raises(ValueError, match="is not empty .*data.csv"):
        ppo_train.main(_args(other))
    with pytest.raises(ValueError, match="removes a run's own files only"):
        ppo_train.main(_args(other, "--overwrite"))
    assert sorted(p.name for p in other.iterdir()) == ["data.csv"]
