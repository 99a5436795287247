"""Writing a file so that it is never torn and never written through a symbolic link: the one helper
every run-folder writer uses (``config.json``, ``summary.md``, ``learning_curve.png``, evaluation
videos, the logs rewritten on resume, checkpoints).

* ``write_atomic``: the whole content goes to a new temporary file beside the target (created with
  ``O_EXCL | O_NOFOLLOW``), is flushed and fsynced, renamed over the target (``os.replace``) and the
  folder fsynced: a reader, a killed writer or a full disk leaves the old file or the new one,
  never half of one. A symbolic link at the target is replaced by the file, never written through.
* ``open_append``: append to a log, refusing a symbolic link at its path (``O_NOFOLLOW``).
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, TextIO

TEMP_SUFFIX = ".tmp"


def fsync_dir(folder: str | Path) -> None:
    """Flush a folder's entries (a rename, a new or removed file) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_error(path: Path) -> ValueError:
    return ValueError(
        f"{path} is a symbolic link: run files are written only inside their folder, never through "
        "a link (replace the link by the file itself, or remove it)"
    )


def write_atomic(
    path: str | Path,
    data: bytes | str | Callable[[IO[bytes]], None],
    *,
    temp_suffix: str = TEMP_SUFFIX,
) -> Path:
    """Replace ``path`` with ``data`` (bytes, text as UTF-8, or a function that writes to the open
    binary file) atomically: temporary file ``.<name>.<random><temp_suffix>`` in the same folder,
    fsync, ``os.replace``, fsync of the folder. On any error the temporary file is removed and
    ``path`` is left as it was."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{temp_suffix}")
        try:
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


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
