"""Reading files that other people publish without running code from them.

``torch.save`` files, ``.npy`` object arrays and ``.pkl`` files are pickles, and a pickle can run any
code when it is loaded. Every vla-gym loader of weights, checkpoints, frame sets and env states
goes through this module:

* ``torch_load``: ``torch.load`` whose pickle is read by a restricted unpickler (what
  ``weights_only=True`` reads: tensors, dicts, lists, tuples, strings, numbers), plus numpy arrays,
  dtypes and scalars when ``numpy=True`` and the classes in ``allow``.
* ``restricted_unpickle``: for formats that are plain pickles by definition (RLinf's
  ``dataset/*.npy``, Cosmos Policy's T5 ``.pkl``): only numpy arrays, dtypes and scalars, torch
  tensors, and Python's containers, strings and numbers.
* ``load_npy``: ``np.load`` whose object arrays are read by ``restricted_unpickle``.

Anything else raises ``UnsafeFileError`` naming the file and what it asked for. Each call carries
its own allow list (no process-wide switch such as ``torch.serialization.safe_globals`` is flipped
around a load), so loads in several threads at once are safe. ``trust_pickle=True``
(a named opt-in at each public loader) loads a full pickle instead: only for files you trust.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import collections
import functools
import io
import math
import os
import pickle
import tokenize
import types
import zipfile
from collections.abc import Iterable
from typing import IO, Any

import numpy as np
import torch

from nets.errors import BadInput
from nets.files import regular_file

PathOrFile = str | os.PathLike | IO[bytes]


class UnsafeFileError(BadInput):
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


def _named(objects: Iterable[Any]) -> dict[tuple[str, str], Any]:
    """``(module, name) -> object`` as a pickle names each of ``objects`` (classes, functions)."""
    return {(obj.__module__, obj.__qualname__): obj for obj in objects}


class _NotPlainDataError(Exception):
    """Raised inside an unpickle for what is refused beyond its globals (becomes an
    ``UnsafeFileError`` naming the file)."""


def _no_hooks(rebuild: Any, hooks_at: int, layout: bool = False) -> Any:
    """``rebuild`` (a torch tensor rebuild function) refusing backward hooks, which a plain
    data file never has (they would be called later, on a backward pass), and with ``layout`` (its
    arguments start ``storage, offset, size, stride``) elements that overlap (``_check_layout``)."""

    def checked(*args: Any) -> Any:
        if len(args) > hooks_at and args[hooks_at]:
            raise _NotPlainDataError("a tensor with backward hooks")
        if layout:
            _check_layout(args[2], args[3])
        return rebuild(*args)

    return checked


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()``, how protocol 2 writes an empty bytes object (the data of a zero-size numpy array).
    Called with anything it is refused: ``bytes(n)`` would allocate n bytes for a few in the file."""
    if args:
        raise _NotPlainDataError(f"bytes() called with {len(args)} argument(s) (only the empty bytes object)")
    return b""


def _check_layout(size: Any, stride: Any) -> None:
    """Refuse a tensor whose elements share memory (a zero or overlapping stride): a few bytes in the
    file that read as gigabytes once any operation copies them."""
    dims = sorted((int(st), int(n)) for n, st in zip(size, stride, strict=True) if int(n) > 1)
    span = 1
    for st, n in dims:
        if st < span:
            raise _NotPlainDataError(
                f"a tensor of size {tuple(size)} with strides {tuple(stride)}, whose elements overlap in "
                "memory (a zero or overlapping stride)"
            )
        span = st * n


@functools.cache
def _torch_globals() -> dict[tuple[str, str], Any]:
    """What plain torch data needs: tensors, parameters, sizes, devices, dtypes, layouts, and
    Python's containers (the ``Storage`` classes torch resolves itself)."""
    utils = torch._utils
    allowed: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor"): _no_hooks(utils._rebuild_tensor, 4, layout=True),
        ("torch._utils", "_rebuild_tensor_v2"): _no_hooks(utils._rebuild_tensor_v2, 5, layout=True),
        ("torch._utils", "_rebuild_parameter"): _no_hooks(utils._rebuild_parameter, 2),
        ("torch._utils", "_rebuild_parameter_with_state"): _no_hooks(utils._rebuild_parameter_with_state, 2),
        ("torch", "Size"): torch.Size,
        ("torch", "device"): torch.device,
        ("torch.storage", "UntypedStorage"): torch.storage.UntypedStorage,
        ("torch", "UntypedStorage"): torch.storage.UntypedStorage,
        ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("builtins", "complex"): complex,
        ("builtins", "bytearray"): bytearray,
        ("builtins", "bytes"): _empty_bytes,  # protocol 2's empty bytes: a zero-size numpy array's data
        ("_codecs", "encode"): codecs.encode,  # how protocol 2 writes bytes
    }
    if hasattr(utils, "_rebuild_tensor_v3"):
        allowed[("torch._utils", "_rebuild_tensor_v3")] = _no_hooks(utils._rebuild_tensor_v3, 5, layout=True)
    for name, value in vars(torch).items():
        if isinstance(value, torch.dtype):
            allowed[("torch", name)] = value
    return allowed


@functools.cache
def _numpy_globals() -> dict[tuple[str, str], Any]:
    """What numpy arrays, dtypes and scalars need, under numpy 2's and numpy 1's module names."""
    rebuild, scalar = np._core.multiarray._reconstruct, np._core.multiarray.scalar
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = rebuild
        allowed[(module, "scalar")] = scalar
    for code in "?bBhHiIlLqQefdgFDGSUVOMm":
        cls = type(np.dtype(code))
        allowed[(cls.__module__, cls.__qualname__)] = cls
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ``allowed`` (this call's allow list: no
    process-wide state, so loads in several threads never see each other's)."""

    def __init__(
        self,
        file: IO[bytes],
        *,
        allowed: dict[tuple[str, str], Any],
        source: Any,
        opt_in: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(file, **kwargs)
        self._allowed, self._source, self._opt_in = allowed, source, opt_in

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names that protocol 2 (torch.save's) writes, e.g. __builtin__.bytes
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        try:
            return self._allowed[(module, name)]
        except (KeyError, TypeError):
            raise _refusal(self._source, f"the global '{module}.{name}'", self._opt_in) from None


def _pickle_module(allowed: dict[tuple[str, str], Any], source: Any, opt_in: str | None) -> Any:
    """A stand-in for the ``pickle`` module that ``torch.load(pickle_module=...)`` reads the file
    with: its ``Unpickler`` resolves only ``allowed``."""

    class Unpickler(_RestrictedUnpickler):
        def __init__(self, file: IO[bytes], **kwargs: Any) -> None:
            super().__init__(file, allowed=allowed, source=source, opt_in=opt_in, **kwargs)

    def load(file: IO[bytes], **kwargs: Any) -> Any:
        return Unpickler(file, **kwargs).load()

    return types.SimpleNamespace(__name__=f"{__name__}.restricted", Unpickler=Unpickler, load=load)


def _is_torchscript(file: PathOrFile) -> bool:
    """Whether ``file`` is a TorchScript archive, which ``torch.load`` would hand to
    ``torch.jit.load`` (that runs the archive's code). Asked as ``torch.load`` asks it, with
    torch's own zip reader; Python's ``zipfile`` where those helpers are missing."""
    ts = torch.serialization
    helpers = ("_open_file_like", "_is_zipfile", "_open_zipfile_reader", "_is_torchscript_zip")
    try:
        if all(hasattr(ts, h) for h in helpers):
            with ts._open_file_like(file, "rb") as opened:
                position = opened.tell()
                try:
                    if not ts._is_zipfile(opened):
                        return False
                    with ts._open_zipfile_reader(opened) as archive:
                        return bool(ts._is_torchscript_zip(archive))
                finally:
                    opened.seek(position)
        position = None if isinstance(file, (str, os.PathLike)) else file.tell()
        try:
            with zipfile.ZipFile(file) as archive:
                return any(n == "constants.pkl" or n.endswith("/constants.pkl") for n in archive.namelist())
        finally:
            if position is not None:
                file.seek(position)
    except FileNotFoundError:
        raise
    except (OSError, RuntimeError, ValueError, zipfile.BadZipFile):
        return False  # not a readable zip: torch's legacy format or garbage, read (or refused) below


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

    Plain torch data loads (tensors, parameters, containers, strings, numbers, dtypes, devices);
    ``numpy`` also accepts numpy arrays, dtypes and scalars; ``allow`` names more classes (plain
    data classes of ours). The allow list belongs to this call alone (a restricted unpickler, no
    process-wide switch), so loads in several threads at once are safe. ``trust_pickle=True`` is
    ``weights_only=False``: only for trusted files. ``opt_in`` is how the caller's user asks for
    that, quoted in the refusal (None: no way). A file that is no readable torch file (truncated,
    garbage) raises a ``ValueError`` naming it."""
    source = getattr(file, "name", file)
    if isinstance(file, (str, os.PathLike)):
        regular_file(file)
    if trust_pickle:
        try:
            return torch.load(file, map_location="cpu", mmap=mmap, weights_only=False)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise BadInput(f"{source}: cannot read as a torch file ({type(e).__name__}: {e})") from e
    allowed = {**_torch_globals(), **(_numpy_globals() if numpy else {}), **_named(allow)}
    if _is_torchscript(file):
        raise _refusal(source, "TorchScript code (a torch.jit archive)", opt_in)
    try:
        return torch.load(
            file,
            map_location="cpu",
            mmap=mmap,
            weights_only=False,  # with pickle_module: read by the restricted unpickler
            pickle_module=_pickle_module(allowed, source, opt_in),
        )
    except (FileNotFoundError, UnsafeFileError):
        raise
    except _NotPlainDataError as e:
        raise _refusal(source, str(e), opt_in) from None
    except Exception as e:
        raise BadInput(f"{source}: cannot read as a torch file ({type(e).__name__}: {e})") from e


def _tensor_from_bytes(data: bytes) -> Any:
    """A storage that ``pickle.dump`` of a tensor wrote (it nests a legacy ``torch.save``)."""
    return torch_load(io.BytesIO(data), opt_in=None)


def _plain_pickle_globals() -> dict[tuple[str, str], Any]:
    """What ``restricted_unpickle`` resolves: numpy's and torch's plain data."""
    return {
        **_torch_globals(),
        **_numpy_globals(),
        ("torch.storage", "_load_from_bytes"): _tensor_from_bytes,
    }


def restricted_unpickle(
    file: PathOrFile, *, trust_pickle: bool = False, opt_in: str | None = "trust_pickle=True"
) -> Any:
    """Unpickle ``file`` allowing only numpy arrays/dtypes/scalars, torch tensors, containers,
    strings and numbers (``trust_pickle=True``: a full ``pickle.load``, for trusted files)."""
    if isinstance(file, (str, os.PathLike)):
        with open(regular_file(file), "rb") as f:
            return restricted_unpickle(f, trust_pickle=trust_pickle, opt_in=opt_in)
    source = getattr(file, "name", file)
    if trust_pickle:
        try:
            return pickle.load(file)  # noqa: S301  (the caller's explicit opt-in)
        except (pickle.UnpicklingError, EOFError) as e:
            raise _unreadable_pickle(source, e) from None
    try:
        return _RestrictedUnpickler(
            file, allowed=_plain_pickle_globals(), source=source, opt_in=opt_in
        ).load()
    except UnsafeFileError:
        raise
    except _NotPlainDataError as e:
        raise _refusal(source, str(e), opt_in) from None
    except Exception as e:  # a truncated or damaged stream: whatever the unpickler tripped on
        raise _unreadable_pickle(source, e) from None


def _unreadable_pickle(source: Any, error: Exception) -> BadInput:
    return BadInput(
        f"{source}: expected a whole pickle of plain data, got one that stops or breaks before its end "
        f"({type(error).__name__}: {str(error)[:200]}); is the file truncated or damaged?"
    )


def load_npy(
    path: str | os.PathLike, *, trust_pickle: bool = False, opt_in: str | None = "trust_pickle=True"
) -> Any:
    """``np.load`` of one ``.npy`` file; an object array is read with ``restricted_unpickle``."""
    path = regular_file(path)
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0}.get(
                version,
                np.lib.format.read_array_header_2_0,  # 2.0 and 3.0 headers
            )
            shape, _, dtype = read_header(f)
        except (ValueError, SyntaxError, tokenize.TokenError) as e:  # a damaged header's dict literal
            raise BadInput(f"{path}: not a .npy file ({type(e).__name__}: {e})") from None
        if not dtype.hasobject:
            declared = math.prod(shape) * dtype.itemsize
            held = os.fstat(f.fileno()).st_size - f.tell()
            if declared > held:  # checked before numpy allocates what the header declares
                raise BadInput(
                    f"{path}: its header declares a {shape} {dtype} array ({declared:,} bytes) but the file "
                    f"holds {held:,} bytes after it; is the file truncated or crafted?"
                )
            f.seek(0)
            try:
                return np.load(f, allow_pickle=False)
            except (ValueError, EOFError) as e:  # numpy: "Failed to read all data for array"
                raise BadInput(
                    f"{path}: expected the {shape} {dtype} array its header declares, got fewer bytes "
                    f"({e}); is the file truncated?"
                ) from None
        array = restricted_unpickle(f, trust_pickle=trust_pickle, opt_in=opt_in)
    if not isinstance(array, np.ndarray) or array.shape != shape:
        raise BadInput(f"{path}: the pickled array does not match its header (shape {shape})")
    return array
