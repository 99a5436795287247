"""One error type for bad input, and how a command line reports it.

``BadInput`` is what the project raises for input it refuses: a flag, a setting, a keyword, a file or
an entry in one. It is a ``ValueError`` (so ``except ValueError`` keeps working) whose message names
the flag or file and the entry, what was expected and what came. Every reader converts what its
parser raises (``KeyError``, ``TypeError``, ``RecursionError``, ``UnicodeDecodeError``...) into it,
so a caller that handles ``BadInput`` handles every refusal. Errors that are not the input's fault
(a bug, a full disk, a dead worker) keep their own types.

``run_cli(main)`` is how each ``python -m ...`` entry point runs: a ``BadInput`` is one line on stderr
and exit status 2 (argparse's status for a usage error), with no traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn


class BadInput(ValueError):
    """Input this project refuses; the message names the flag or file, the entry, what was expected
    and what came. Raised before anything is written."""


def naming(source: object, error: BaseException) -> BadInput:
    """``error`` as a ``BadInput`` whose message starts with ``source`` (a path or a flag), unless it
    already names it."""
    text = str(error) or type(error).__name__
    if isinstance(error, KeyError) and error.args:  # KeyError's str() is the repr of the key
        text = f"missing entry {error.args[0]!r}"
    if not isinstance(error, ValueError):
        text = f"{text} ({type(error).__name__})"
    named = str(source)
    return BadInput(text if named and named in text else f"{named}: {text}")


@contextmanager
def reading(source: object, *kinds: type[BaseException]) -> Iterator[None]:
    """Inside it, a ``ValueError`` or one of ``kinds`` (what a parser raises on malformed data) becomes
    a ``BadInput`` naming ``source``; a ``BadInput`` passes unchanged."""
    try:
        yield
    except BadInput:
        raise
    except (ValueError, RecursionError, *kinds) as e:
        raise naming(source, e) from e


def program_name() -> str:
    """``python -m trainers`` (the module ``python -m`` ran), else the script's name."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    return f"python -m {name.removesuffix('.__main__')}" if name else os.path.basename(sys.argv[0])


def exit_bad_input(error: BadInput) -> NoReturn:
    """Report ``error`` as a usage error: one line on stderr, exit status 2."""
    sys.stderr.write(f"{program_name()}: error: {error}\n")
    raise SystemExit(2)


def run_cli(main: Callable[[], Any]) -> None:
    """Run a command line's ``main``; a ``BadInput`` ends it as a usage error, without a traceback."""
    try:
        main()
    except BadInput as e:
        exit_bad_input(e)
