"""Child processes that start cleanly and never outlive their parent (shared by ``envs`` and
``trainers``: simulator workers, the SAC actor process)."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import threading
from collections.abc import Iterator

_MAIN_LOCK = threading.Lock()
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@contextlib.contextmanager
def without_main_module() -> Iterator[None]:
    """While a child process starts (``spawn`` / ``forkserver``), hide where ``__main__`` came from,
    so multiprocessing's start-up in the child does not run the parent's main script again (for
    ``python -`` it cannot: the script is ``<stdin>``; for a real script it would import torch and
    everything the script imports). Children must run code that lives in importable modules."""
    main = sys.modules["__main__"]
    with _MAIN_LOCK:
        saved_file, saved_spec = main.__dict__.pop("__file__", None), getattr(main, "__spec__", None)
        main.__spec__ = None
        try:
            yield
        finally:
            main.__spec__ = saved_spec
            if saved_file is not None:
                main.__file__ = saved_file


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux ``prctl``), so a
    killed parent leaves no orphan. Returns whether it was set (False elsewhere than Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
