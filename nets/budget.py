"""One memory budget check for sizes that come from a file or an argument, made before anything that
size is allocated: ``check_memory(nbytes, what)`` refuses a request larger than the memory available
now (Linux's ``MemAvailable``), with an error that names what asked for it."""

from __future__ import annotations

from pathlib import Path

from nets.errors import BadInput


def available_memory() -> int | None:
    """Bytes of memory available to new allocations without swapping (``MemAvailable`` of
    ``/proc/meminfo``), or None where the system does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


def check_memory(nbytes: int, what: str) -> None:
    """Refuse (``ValueError``) ``what``, which needs about ``nbytes`` of memory, when that is more than
    the memory available now; where the system does not say, nothing is checked."""
    available = available_memory()
    if available is not None and nbytes > available:
        raise BadInput(f"{what} needs about {gib(nbytes)} of memory; {gib(available)} is available")
