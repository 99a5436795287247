"""Reading files that other people publish without running code from them.

``torch.save`` files, ``.npy`` object arrays and ``.pkl`` files are pickles, and a pickle can run any
code when it is loaded. Every vla-gym loader of weights, checkpoints, frame sets and env states
goes through this module:

* ``torch_load``: ``torch.load(weights_only=True)`` (tensors, dicts, lists, tuples, strings,
  numbers), plus numpy arrays, dtypes and scalars when ``numpy=True`` and the classes in ``allow``.
* ``restricted_unpickle``: for formats that are plain pickles by definition (RLinf's
  ``dataset/*.npy``, Cosmos Policy's T5 ``.pkl``): only numpy arrays, dtypes and scalars, torch
  tensors, and Python's containers, strings and numbers.
* ``load_npy``: ``np.load`` whose object arrays are read by ``restricted_unpickle``.

Anything else raises ``UnsafeFileError`` naming the file and what it asked for. ``trust_pickle=True``
(a named opt-in at each public loader) loads a full pickle instead: only for files you trust.
"""

from __future__ import annotations

import codecs
import collections
import io
import os
import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

PathOrFile = str | os.PathLike | IO[bytes]


class UnsafeFileError(ValueError):
    """A file asked for something outside the safe-loading allow list (it was not loaded)."""


def _refusal(source: Any, what: str, opt_in: str | None) -> UnsafeFileError:
    advice = (
        f"If you trust where it came from, pass {opt_in}."
        if opt_in
        else "This kind of file never needs more."
    )
    return UnsafeFileError(
        f"{source}: refused to load: the file asks for {what}, which is not plain data (tensors, numpy "
        f"arrays, containers, strings, numbers); loading it could run code from the file. {advice}"
    )


def _numpy_globals() -> list[Any]:
    """What ``torch.load(weights_only=True)`` needs for numpy arrays, dtypes and scalars, under
    both numpy 2's and numpy 1's module names."""
    rebuild, scalar = np._core.multiarray._reconstruct, np._core.multiarray.scalar
    dtype_classes = {type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGSUVOMm"}
    return [
        rebuild,
        (rebuild, "numpy.core.multiarray._reconstruct"),
        scalar,
        (scalar, "numpy.core.multiarray.scalar"),
        np.ndarray,
        np.dtype,
        *dtype_classes,
    ]


def torch_load(
    file: PathOrFile,
    *,
    numpy: bool = False,
    allow: Iterable[Any] = (),
    mmap: bool = False,
    trust_pickle: bool = False,
    opt_in: str | None = "trust_pickle=True",
) -> Any:
    """``torch.load`` onto the CPU that runs no code from the file.

    ``numpy`` also accepts numpy arrays, dtypes and scalars; ``allow`` names more classes (plain
    data classes of ours). ``trust_pickle=True`` is ``weights_only=False``: only for trusted files.
    ``opt_in`` is how the caller's user asks for that, quoted in the refusal (None: no way). A file
    that is no readable torch file (truncated, garbage) raises a ``ValueError`` naming it."""
    source = getattr(file, "name", file)
    allowed = [*(_numpy_globals() if numpy else []), *allow]
    try:
        if trust_pickle:
            return torch.load(file, map_location="cpu", mmap=mmap, weights_only=False)
        with torch.serialization.safe_globals(allowed):
            return torch.load(file, map_location="cpu", mmap=mmap, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e) and found:
            raise _refusal(source, f"the global {found.group(1)!r}", opt_in) from None
        raise ValueError(f"{source}: cannot read as a torch file ({type(e).__name__}: {e})") from e


def _tensor_from_bytes(data: bytes) -> Any:
    """A storage that ``pickle.dump`` of a tensor wrote (it nests a legacy ``torch.save``)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


# (module, name) -> the object a restricted unpickle may use for it
_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "bytearray"): bytearray,
    ("_codecs", "encode"): codecs.encode,  # how protocol 2 writes bytes
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch.storage", "_load_from_bytes"): _tensor_from_bytes,
}
for _module in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_module, "_reconstruct")] = np._core.multiarray._reconstruct
    _ALLOWED[(_module, "scalar")] = np._core.multiarray.scalar


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], source: Any, opt_in: str | None) -> None:
        super().__init__(file)
        self._source, self._opt_in = source, opt_in

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _refusal(self._source, f"the global '{module}.{name}'", self._opt_in) from None


def restricted_unpickle(
    file: PathOrFile, *, trust_pickle: bool = False, opt_in: str | None = "trust_pickle=True"
) -> Any:
    """Unpickle ``file`` allowing only numpy arrays/dtypes/scalars, torch tensors, containers,
    strings and numbers (``trust_pickle=True``: a full ``pickle.load``, for trusted files)."""
    if isinstance(file, (str, os.PathLike)):
        with open(file, "rb") as f:
            return restricted_unpickle(f, trust_pickle=trust_pickle, opt_in=opt_in)
    if trust_pickle:
        return pickle.load(file)  # noqa: S301  (the caller's explicit opt-in)
    return _RestrictedUnpickler(file, getattr(file, "name", file), opt_in).load()


def load_npy(
    path: str | os.PathLike, *, trust_pickle: bool = False, opt_in: str | None = "trust_pickle=True"
) -> Any:
    """``np.load`` of one ``.npy`` file; an object array is read with ``restricted_unpickle``."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0}.get(
                version,
                np.lib.format.read_array_header_2_0,  # 2.0 and 3.0 headers
            )
            shape, _, dtype = read_header(f)
        except ValueError as e:
            raise ValueError(f"{path}: not a .npy file ({e})") from None
        if not dtype.hasobject:
            f.seek(0)
            return np.load(f, allow_pickle=False)
        array = restricted_unpickle(f, trust_pickle=trust_pickle, opt_in=opt_in)
    if not isinstance(array, np.ndarray) or array.shape != shape:
        raise ValueError(f"{path}: the pickled array does not match its header (shape {shape})")
    return array
