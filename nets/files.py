"""Writing files and folders so that they are never torn and never written through a symbolic link:
the one home of the atomic-write helpers every package uses (the run folder and checkpoints in
``trainers``, datasets and reward models, frame sets in ``envs``, VLA checkpoints in ``policies``).
No torch here: ``import envs`` stays cheap.

* ``write_atomic(path, data)``: the whole content (bytes, text, or a function that writes to the
  open binary file) goes to a new temporary file beside the target (created with
  ``O_EXCL | O_NOFOLLOW``), is flushed and fsynced, renamed over the target (``os.replace``) and the
  folder fsynced: a reader, a killed writer or a full disk leaves the old file or the new one,
  never half of one.
* ``atomic_path(path)``: the same for writers that need a file name rather than an open file
  (``h5py.File``, ``safetensors.save_file``): a context manager that yields the temporary path and
  renames it into place when the block ends without error.
* ``atomic_folder(target)``: a whole folder (a frame set, a dataset) built in a staging folder beside
  ``target``, every file and folder in it fsynced, then swapped in; an existing ``target`` is moved
  aside and removed only once the new one is in place.
* ``open_append(path)``: append to a log, refusing a symbolic link at its path (``O_NOFOLLOW``).
* ``regular_file(path)``: what every reader checks before it opens a file: a FIFO, socket, device or
  folder where a file is expected is a ``BadInput`` at once (opening a FIFO waits for a writer
  forever). ``read_json(path)``: a JSON file through it, malformed content a ``BadInput``.

Symbolic links: a link at the target of ``write_atomic``, ``atomic_path`` or ``atomic_folder`` is
*replaced* (by the file or folder; the link's own target is never touched), as ``os.replace`` does;
``open_append`` *refuses* one (``BadInput``), since appending must go through the path itself.
On any error the temporary file or staging folder is removed and the target is left as it was.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO

from nets.errors import BadInput

TEMP_SUFFIX = ".tmp"


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def regular_file(path: str | os.PathLike) -> Path:
    """``path`` if it names a regular file (a symbolic link to one counts); anything else that is
    there is a ``ValueError`` naming it and what it is, before anything opens it. A missing path is
    ``FileNotFoundError``, as ``open`` would raise."""
    path = Path(path)
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise BadInput(f"{path} is {kind}, not a regular file: only regular files are read")
    return path


def read_json(path: str | os.PathLike, what: str = "JSON file", expected: str = "JSON") -> Any:
    """The content of the JSON file ``path`` (a regular file, ``regular_file``); text that is not
    UTF-8, malformed or nested too deep to parse is a ``BadInput`` naming ``what`` and the file."""
    try:
        return json.loads(regular_file(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = "nested too deep" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
        raise BadInput(
            f"{what} {path}: expected {expected}, got a file that does not parse as JSON ({why}); "
            "is it truncated?"
        ) from None


def check_output(
    path: str | os.PathLike,
    *,
    overwrite: bool,
    ours: Callable[[Path], bool],
    what: str,
    flag: str = "--out",
    sources: Iterable[str | os.PathLike] = (),
) -> Path:
    """The one rule for every writer's output ``path`` (``flag`` names it in errors, ``what`` says what
    it is), checked before anything is written: a source being read (``sources``) is never the
    output; an existing output is refused unless ``overwrite``; with it, one that ``ours`` does not
    recognise as this project's own (a file of its format, a folder holding only its own files) is
    refused too, so ``--overwrite`` never deletes a user's other files."""
    path = Path(path)
    for source in sources:
        if path.exists() and Path(source).exists() and os.path.samefile(path, source):
            raise BadInput(f"{flag} {path} is also the source being read: write it elsewhere")
    empty = path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    if empty or not (path.exists() or path.is_symlink()):
        return path  # nothing there to replace (an empty folder is no output)
    if not overwrite:
        raise BadInput(
            f"{flag} {path} already exists: pass --overwrite to replace it, or choose another {flag}"
        )
    if path.is_symlink() or not ours(path):
        raise BadInput(
            f"{flag} {path} exists and is not {what} that vla-gym wrote: --overwrite replaces only this "
            f"project's own outputs; move it, or choose another {flag}"
        )
    return path


def only_entries(folder: Path, names: Collection[str]) -> bool:
    """Whether ``folder`` is a folder (not a link) holding nothing but entries named in ``names``
    (and temporary files of them): a writer's own output folder."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return all(p.name in names or p.name.endswith(TEMP_SUFFIX) for p in folder.iterdir())


def fsync_dir(folder: str | Path) -> None:
    """Flush a folder's entries (a rename, a new or removed file) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    """Flush a file written by someone else (a library given its name) to disk; a link is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_error(path: Path) -> BadInput:
    return BadInput(
        f"{path} is a symbolic link: run files are written only inside their folder, never through "
        "a link (replace the link by the file itself, or remove it)"
    )


def _new_temp(path: Path, temp_suffix: str) -> tuple[Path, int]:
    """A new file ``.<name>.<random><temp_suffix>`` beside ``path``, created exclusively (never an
    existing file, never through a link), and its open descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{temp_suffix}")
        try:
            return tmp, os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
        except FileExistsError:
            continue


def write_atomic(
    path: str | Path,
    data: bytes | str | Callable[[IO[bytes]], None],
    *,
    temp_suffix: str = TEMP_SUFFIX,
) -> Path:
    """Replace ``path`` with ``data`` (bytes, text as UTF-8, or a function that writes to the open
    binary file) atomically: temporary file ``.<name>.<random><temp_suffix>`` in the same folder,
    fsync, ``os.replace``, fsync of the folder. On any error the temporary file is removed and
    ``path`` is left as it was. A symbolic link at ``path`` is replaced, never written through."""
    path = Path(path)
    tmp, fd = _new_temp(path, temp_suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError | RuntimeError) and _failed_write(e):
            code = getattr(e, "errno", None) or errno.EIO
            raise OSError(code, f"writing {path} failed ({e}); {path} is as it was") from e
        raise
    fsync_dir(path.parent)
    return path


def _failed_write(error: BaseException) -> bool:
    """Whether ``error`` says a write did not reach the disk (a full disk, a quota, an I/O error):
    an ``OSError``, or torch.save's ``RuntimeError`` ("unexpected pos", "file write failed")."""
    if isinstance(error, OSError):
        return True
    text = str(error)
    return "unexpected pos" in text or "write failed" in text


@contextmanager
def atomic_path(
    path: str | Path,
    *,
    temp: str | Path | None = None,
    keep_on_error: bool = False,
    temp_suffix: str = TEMP_SUFFIX,
) -> Iterator[Path]:
    """``with atomic_path(path) as tmp:`` write the file named ``tmp``; when the block ends without
    error it is fsynced, renamed over ``path`` (``os.replace``) and the folder fsynced. For writers
    that take a file name (``h5py.File``, ``safetensors.save_file``, ``np.save``).

    ``tmp`` is a new empty file ``.<name>.<random><temp_suffix>`` beside ``path`` unless ``temp``
    names a fixed one (in the same folder; whatever is there first, a stale file or a link, is
    removed, so the writer creates it afresh). On an error the temporary file is removed, or kept
    with ``keep_on_error`` (a partial file worth reading, e.g. the demos recorded before a crash),
    and ``path`` is left as it was. A symbolic link at ``path`` is replaced, never written through."""
    path = Path(path)
    if temp is None:
        tmp, fd = _new_temp(path, temp_suffix)
        os.close(fd)
    else:
        tmp = Path(temp)
        if tmp.parent.resolve() != path.parent.resolve():
            raise BadInput(f"atomic_path: the temporary file {tmp} must be in {path}'s folder")
        tmp.unlink(missing_ok=True)
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        if not keep_on_error:
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_tree(folder: str | Path) -> None:
    """fsync every regular file and folder under ``folder`` (links are not followed), the folder last."""
    for parent, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            file = os.path.join(parent, name)
            if os.path.isfile(file) and not os.path.islink(file):  # regular files only
                fsync_file(file)
        for name in dirs:
            if not os.path.islink(os.path.join(parent, name)):
                fsync_dir(os.path.join(parent, name))
    fsync_dir(folder)


@contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """``with atomic_folder(target) as staging:`` write the folder's files into ``staging`` (a new
    empty folder ``.<name>.staging-<random>`` beside ``target``, whose parent must exist); when the
    block ends without error, everything in it is fsynced and it is renamed to ``target``. An
    existing ``target`` (a folder, a file, or a symbolic link, which is replaced and not followed)
    is moved aside first and removed once the new folder is in place, so a reader finds the old
    folder or the new one, never a mix. On an error the staging folder is removed and ``target``
    is left as it was."""
    target = Path(target)
    parent = target.parent
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=parent))
    try:
        yield staging
        fsync_tree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not os.path.lexists(target):
        staging.rename(target)
        fsync_dir(parent)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=parent))
    target.rename(old / target.name)
    try:
        staging.rename(target)
    except BaseException:
        (old / target.name).rename(target)  # put the old folder back
        old.rmdir()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_dir(parent)
    shutil.rmtree(old)


def open_append(path: str | Path) -> TextIO:
    """``path`` opened for appending text (created if missing); a symbolic link there is refused
    with a ``ValueError`` rather than followed."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise link_error(path) from None
        raise
    return os.fdopen(fd, "a")
