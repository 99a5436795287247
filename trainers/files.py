"""The atomic-write helpers of the run folder and checkpoints (``write_atomic``, ``open_append``,
...): they live in ``nets.files``, the ground floor every package may import; this module re-exports
them under their old import path."""

from nets.files import (
    TEMP_SUFFIX,
    atomic_folder,
    atomic_path,
    fsync_dir,
    fsync_file,
    link_error,
    open_append,
    write_atomic,
)

__all__ = [
    "TEMP_SUFFIX",
    "atomic_folder",
    "atomic_path",
    "fsync_dir",
    "fsync_file",
    "link_error",
    "open_append",
    "write_atomic",
]
