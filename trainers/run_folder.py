"""The rules of a run folder (DESIGN.md, "Run folders"): it is written only after its inputs are
validated; every file in it is written atomically (``trainers.files``); one writer at a time (a
lock); a non-empty folder is resumed or refused, never mixed; nothing is written through a symbolic
link out of it.

* ``resumable``: what ``--resume`` names, checked before anything is written: an existing run
  folder (``RUN`` with its ``config.json``, or a checkpoint in ``RUN/checkpoints``, the newest one),
  whose checkpoint is a full one of the same algorithm and env, and whose logs are readable (a
  damaged line before the last one is a ``ValueError``; a torn last line is dropped, with a warning,
  when the logs are opened).
* ``claim``: the folder's lock (``<run>/.lock``, an exclusive ``flock`` held for the run's life, so
  a second run on the folder gets a ``RuntimeError``), then, under it, a new run's folder must be
  empty (``.lock`` aside) unless ``overwrite``: then the old run's own files are removed (links
  unlinked, never followed; anything that is not a run file is refused, never deleted).

Symbolic links: a run file or folder (``config.json``, ``metrics.jsonl``, ``checkpoints/``, ...)
that is a link is refused with a ``ValueError`` when a run starts on the folder; one planted during
a run is replaced, never written through, by the whole-file writers, and refused by the appends.
The run folder itself may be a link (it is the path you gave).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import weakref
from pathlib import Path
from typing import Any

from nets.errors import BadInput
from trainers import checkpoint as ckpt
from trainers import parallel
from trainers.files import TEMP_SUFFIX, fsync_dir, link_error
from trainers.metrics import METRICS_FILE, parse_jsonl
from trainers.report import EVAL_EPISODES_FILE

LOCK_FILE = ".lock"
CONFIG_FILE = "config.json"
RUN_FILES = (CONFIG_FILE, METRICS_FILE, EVAL_EPISODES_FILE, "summary.md", "learning_curve.png")
RUN_FOLDERS = ("checkpoints", "videos", "tb", "wandb")
LOG_FILES = (METRICS_FILE, EVAL_EPISODES_FILE)


def env_id(env: str) -> str:
    """The gymnasium id of an ``env`` setting (``"module:Env-v0"`` -> ``"Env-v0"``)."""
    return env.split(":")[-1]


def is_run_entry(name: str) -> bool:
    """Whether a name in a run folder is one a run writes (its files and folders, the lock, the
    temporary files of its atomic writes)."""
    temp = name.startswith(".") and name.endswith(TEMP_SUFFIX)
    return (
        name in RUN_FILES
        or name.endswith("_episodes.jsonl")  # the episodes of a named evaluation (Evaluation(name=...))
        or name in RUN_FOLDERS
        or name == LOCK_FILE
        or (temp and any(name.startswith(f".{f}.") for f in RUN_FILES))
    )


def check_links(folder: Path) -> None:
    """A ``ValueError`` if a run file or folder of ``folder`` is a symbolic link."""
    for name in (*RUN_FILES, *RUN_FOLDERS, LOCK_FILE):
        if (folder / name).is_symlink():
            raise link_error(folder / name)


def resumable(source: str | Path, algo: str, env: str) -> tuple[Path, Path, dict[str, Any]]:
    """``(run folder, checkpoint, its content)`` for ``--resume source``, or an error; reads only.

    ``source`` must exist (a resume never creates a folder): a run folder, or a checkpoint file in
    one's ``checkpoints/`` (not older than the folder's newest: resuming it would mix two
    histories). The checkpoint must be a full one (an exported policy is for ``--init-policy``) of
    ``algo`` on ``env``; the folder must hold ``config.json``, no symbolic link among its run files,
    and logs damaged at most in their last line."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"--resume {source}: no such run folder or checkpoint (nothing is created)")
    path, data = ckpt.latest_checkpoint(source)  # the file is read safely before anything else
    if "optimizer" not in data:
        raise BadInput(f"{path} holds a policy only (exported): start from it with --init-policy")
    if data.get("algo") != algo:
        raise BadInput(
            f"{path} is a {data.get('algo')} checkpoint, not {algo}: resume it with --algo "
            f"{data.get('algo')}, or start a new {algo} run from its policy with --init-policy {path}"
        )
    config = data.get("config")
    run = config.get("run") if isinstance(config, dict) else None
    saved = run.get("env") if isinstance(run, dict) else None
    if isinstance(saved, str) and env_id(saved) != env_id(env):
        raise BadInput(
            f"--resume {source}: the run trains on {saved!r}, not {env!r}; a resumed run keeps its env "
            f"(start a new run from its policy with --init-policy {path})"
        )
    folder = source
    if source.is_file():
        folder = source.parent.parent
        if source.parent.name != "checkpoints" or not os.path.lexists(folder / CONFIG_FILE):
            raise BadInput(
                f"--resume {source}: a checkpoint file resumes the run folder it belongs to "
                f"(RUN/checkpoints/iter_*.pt beside RUN/{CONFIG_FILE}) and this one is in none; start a "
                f"new run from its policy with --init-policy {source}"
            )
        newer = [p.name for p in ckpt.checkpoint_paths(folder) if p.name > source.name]
        if newer:
            raise BadInput(
                f"--resume {source}: {folder} has newer checkpoints ({', '.join(newer)}); resuming an "
                f"older one would mix two histories in one folder: resume the folder ({folder}), or "
                "copy it and remove the newer checkpoints from the copy"
            )
    elif not os.path.lexists(folder / CONFIG_FILE):
        raise BadInput(f"--resume {source}: not a run folder (it has no {CONFIG_FILE})")
    check_links(folder)
    for name in LOG_FILES:
        if (folder / name).exists():
            parse_jsonl(folder / name)  # a damaged line before the last one: a ValueError naming it
    return folder, path, data


class FolderLock:
    """An exclusive ``flock`` on ``<folder>/.lock`` (which holds the owner's process id), held
    until ``release()``, until this object is collected, or until the process ends (the system
    drops the lock of a killed process: a stale ``.lock`` file locks nothing). A folder whose lock
    is held, by another process or another ``Run`` of this one, is a ``RuntimeError``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise link_error(self.path) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            who = f"another run (process {holder})" if holder.isdigit() else "another run"
            raise RuntimeError(
                f"{self.folder} is in use: {who} holds its lock {self.path}. A run folder has one "
                "writer at a time: wait for that run to end, or choose another --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._finalizer = weakref.finalize(self, _unlock, fd)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        """Unlock (the ``.lock`` file stays: removing it could let two runs lock two files)."""
        self._finalizer()


def _unlock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _old_entries(folder: Path, overwrite: bool) -> list[Path]:
    """What a new run in ``folder`` would have to remove (refused without ``overwrite``, and with it
    if anything is not a run's own file)."""
    entries = sorted(p for p in folder.iterdir() if p.name != LOCK_FILE)
    if not entries:
        return []
    names = ", ".join(p.name for p in entries[:6]) + (", ..." if len(entries) > 6 else "")
    foreign = [p.name for p in entries if not is_run_entry(p.name)]
    if not overwrite:
        if foreign:
            raise BadInput(f"--run-dir {folder} is not empty ({names}): choose a new or empty folder")
        raise BadInput(
            f"--run-dir {folder} already holds a run ({names}): continue it with --resume {folder}, "
            "start over with --overwrite (its files are removed first), or choose another --run-dir"
        )
    if foreign:
        raise BadInput(
            f"--overwrite removes a run's own files only, and {folder} also holds {foreign[:6]}: "
            "move them, or choose another --run-dir"
        )
    for entry in entries:  # another run made inside this one's folders (its own .lock) is not removed
        if entry.is_dir() and not entry.is_symlink():
            for parent, _, files in os.walk(entry):  # links are not followed
                if LOCK_FILE in files:
                    raise BadInput(
                        f"--overwrite removes a run's own files only, and {parent} holds another run: "
                        "move it, or choose another --run-dir"
                    )
    return entries


def claim(folder: str | Path, *, resume: bool, overwrite: bool) -> FolderLock:
    """Lock ``folder`` for a run (``resume``: a folder ``resumable`` accepted; else a new run, in a
    folder created if missing, which must be empty, ``.lock`` aside, unless ``overwrite``: then the
    old run's files are removed first, under the lock). Returns the held lock."""
    folder = Path(folder)
    if not resume:
        if folder.exists() and not folder.is_dir():
            raise BadInput(f"--run-dir {folder} is not a folder")
        if folder.is_dir():
            _old_entries(folder, overwrite)  # refused before anything is created in it
        folder.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(folder)
    try:
        if resume:
            check_links(folder)
            for stale in folder.iterdir():  # temporary files of a killed writer (we hold the lock)
                if is_run_entry(stale.name) and stale.name.endswith(TEMP_SUFFIX) and not stale.is_dir():
                    stale.unlink(missing_ok=True)
        else:
            old = _old_entries(folder, overwrite)  # again, under the lock
            for entry in old:
                if entry.is_symlink() or not entry.is_dir():
                    entry.unlink(missing_ok=True)  # a link is removed, never followed
                else:
                    shutil.rmtree(entry)  # does not follow links inside
            if old:
                fsync_dir(folder)
                print(f"--overwrite: removed the old run's {', '.join(p.name for p in old)} from {folder}")
    except BaseException:
        lock.release()
        raise
    return lock


def claim_on_main(folder: Path, ranks: parallel.Ranks, *, resume: bool, overwrite: bool) -> FolderLock | None:
    """``claim`` on rank 0 (the one writer; None on the other ranks), its refusal raised on every
    rank (a ``ValueError`` stays one; anything else is a ``RuntimeError`` elsewhere)."""
    lock, error = None, None
    if ranks.is_main:
        try:
            lock = claim(folder, resume=resume, overwrite=overwrite)
        except (OSError, ValueError, RuntimeError) as e:
            error = e
    if ranks.world_size > 1:
        shared = parallel.broadcast(None if error is None else (isinstance(error, ValueError), str(error)))
        if error is None and shared is not None:
            error = (ValueError if shared[0] else RuntimeError)(f"rank 0: {shared[1]}")
    if error is not None:
        raise error
    return lock
