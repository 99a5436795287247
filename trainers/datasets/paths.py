"""Files of a dataset folder stay inside it.

A dataset folder names its own files: LeRobot's ``info.json`` holds the ``data_path`` and
``video_path`` templates, feature names go into paths, and any file in the folder may be a symlink.
A published folder could so make a reader open files elsewhere on the machine (``../../``, an
absolute path, a link to a private file). Every file a reader opens goes through ``inside``: the
path is resolved (symlinks followed, ``..`` removed) and must lie inside the dataset folder, also
resolved, or a ``ValueError`` names the file and where it leads.

One exception: a folder in the Hugging Face hub cache (``<cache>/datasets--<owner>--<name>/
snapshots/<revision>``, what ``hf download`` without ``--local-dir`` gives) holds symlinks into its
repository's ``blobs`` folder; those stay allowed.
"""

from __future__ import annotations

from pathlib import Path

from nets.errors import BadInput


def allowed_roots(root: str | Path) -> tuple[Path, ...]:
    """The resolved folders the files of the dataset folder ``root`` may resolve into."""
    real = Path(root).resolve()
    roots = [real]
    repo = real.parent.parent
    if real.parent.name == "snapshots" and repo.name.startswith("datasets--") and (repo / "blobs").is_dir():
        roots.append(repo / "blobs")
    return tuple(roots)


def inside(root: str | Path, path: str | Path, what: str) -> Path:
    """``root / path``, resolved; a ValueError if it resolves outside the dataset folder ``root``.

    ``what`` says which file it is in the message (e.g. "data file", "video file").
    """
    root = Path(root)
    full = root / path
    real = full.resolve()
    roots = allowed_roots(root)
    if not any(real.is_relative_to(r) for r in roots):
        raise BadInput(
            f"{root}: {what} {path} resolves to {real}, outside the dataset folder {roots[0]}; "
            "a dataset may only read its own files (refused)"
        )
    return real
