"""Reading HDF5 files that other people publish: nothing outside the file, no allocation the file
cannot back.

Every vla-gym reader of HDF5 data (our demos, LIBERO's demonstration files, reward-model frame
sets) opens files with ``SafeHDF5`` and reads arrays with ``SafeHDF5.read``. On opening, the whole
file is checked before anything is read from it:

* **nothing outside the file**: external links (``h5py.ExternalLink``), user-defined links,
  datasets whose data are in external raw files (``dataset.external``) and virtual datasets
  (``dataset.is_virtual``) are refused, never followed. Soft links stay inside the file and are
  allowed.
* **declared sizes against what the file holds**: a dataset declares a shape and a dtype, and reading
  it allocates shape x itemsize bytes, whatever the file stores (unwritten HDF5 storage reads as
  fill values). The rule: uncompressed data, contiguous or chunked, is stored byte for byte, so it
  may declare at most what is stored (contiguous and compact: the file's size; chunked: the
  allocated chunks, ``id.get_storage_size()``, at most the file's size). Compressed (filtered)
  chunks may expand, by at most ``MAX_EXPANSION`` (1100) times their stored bytes: deflate (gzip),
  the strongest filter h5py writes, cannot exceed 1032:1 and LZF about 100:1; shuffle and fletcher32
  do not compress. The bytes each dataset needs at least (declared, divided by ``MAX_EXPANSION`` when
  filtered) must also fit in the file all together, and attributes may declare at most the file's
  size.
* while reading, ``read`` counts the bytes each read needs at least, the same way, and refuses a read
  that would take the total past the file's size (the same dataset reached through many hard links
  is counted each time).

A refusal is ``UnsafeHDF5Error`` (a ``ValueError``) naming the file, the object, what it declares
and what the file can hold. Filters that compress more than 1100:1 (several deflate filters in a
row, scale-offset on constant data, Blosc of zeros) are refused: no demonstration file needs them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from nets.errors import BadInput
from nets.files import regular_file

MAX_EXPANSION = 1100  # deflate's ceiling is 1032:1
UNCOMPRESSING_FILTERS = (2, 3)  # H5Z_FILTER_SHUFFLE, H5Z_FILTER_FLETCHER32: same size out as in


class UnsafeHDF5Error(BadInput):
    """An HDF5 file that reaches outside itself or declares more data than it holds (not read)."""


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - h5py is a core dependency
        raise ImportError("HDF5 files need h5py: pip install h5py") from e
    return h5py


def _bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def declared_bytes(shape: tuple[int, ...] | None, dtype: np.dtype) -> int:
    """What reading an array of ``shape`` and ``dtype`` allocates (0 for a null dataspace)."""
    if shape is None:
        return 0
    return math.prod(int(s) for s in shape) * int(dtype.itemsize)


# what h5py raises on a damaged file or on an entry that is not there or not what a reader expects
UNREADABLE = (KeyError, RuntimeError, OSError, TypeError, IndexError, AttributeError)


class SafeHDF5:
    """An HDF5 file open for reading, checked as the module docstring says.

    ``file`` is the open ``h5py.File`` (navigate it as usual: after the check no link leads out of
    it); read arrays with ``read(dataset)``. A context manager; ``close()`` closes the file.
    """

    def __init__(self, path: str | Path) -> None:
        h5py = _h5py()
        self.path = regular_file(path)
        self.size = self.path.stat().st_size
        try:
            self.file = h5py.File(self.path, "r")
        except OSError as e:
            raise UnsafeHDF5Error(
                f"{self.path}: not a readable HDF5 file ({e}); is it truncated or damaged?"
            ) from None
        self._read = 0  # bytes the reads so far need at least
        try:
            self._check_file()
        except UNREADABLE as e:
            self.file.close()
            raise self._refuse(f"its structure cannot be read ({type(e).__name__}: {e})") from None
        except BaseException:
            self.file.close()
            raise

    def __enter__(self) -> SafeHDF5:
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        """Closes the file; what h5py raised while the block read it (a missing entry, a dataset of
        another shape, damaged bytes) becomes a ``ValueError`` naming the file and the entry."""
        self.close()
        if isinstance(error, UNREADABLE) and not isinstance(error, ValueError):
            raise UnsafeHDF5Error(
                f"{self.path}: not the file its reader expects ({type(error).__name__}: {error})"
            ) from error

    def close(self) -> None:
        self.file.close()

    # ------------------------------------------------------------------ the check on opening
    def _refuse(self, message: str) -> UnsafeHDF5Error:
        return UnsafeHDF5Error(f"{self.path}: {message}; refused (a damaged or crafted file)")

    def _check_file(self) -> None:
        h5py = _h5py()
        links: list[tuple[str, Any]] = []
        self.file.visititems_links(lambda name, link: links.append((name, link)))
        for name, link in links:
            if isinstance(link, h5py.ExternalLink):
                raise self._refuse(
                    f"{name} is an external link to {link.filename}:{link.path}; links to other files "
                    "are never followed"
                )
            if not isinstance(link, h5py.HardLink | h5py.SoftLink):
                raise self._refuse(f"{name} is a {type(link).__name__}; only hard and soft links are read")
            if isinstance(link, h5py.SoftLink) and self.file.get(name) is None:
                raise self._refuse(f"{name} is a soft link to {link.path}, which does not exist")
        self._check_attrs(self.file, "/")
        seen: set[int] = set()
        total = 0
        for name, link in links:
            if not isinstance(link, h5py.HardLink):
                continue
            obj = self.file[name]
            key = hash(obj.id)
            if key in seen:
                continue
            seen.add(key)
            self._check_attrs(obj, name)
            if isinstance(obj, h5py.Dataset):
                total += self._needed(obj, name)
        if total > self.size:
            raise self._refuse(
                f"its datasets need at least {_bytes(total)} of storage all together, more than the "
                f"file's {_bytes(self.size)}"
            )

    def _check_attrs(self, obj: Any, where: str) -> None:
        for key in obj.attrs:
            attr = obj.attrs.get_id(key)
            size = declared_bytes(attr.shape, attr.dtype)
            if size > self.size:
                raise self._refuse(
                    f"attribute {key!r} of {where} declares {attr.shape} {attr.dtype} "
                    f"({_bytes(size)}), more than the file's {_bytes(self.size)}"
                )

    def _needed(self, ds: Any, name: str) -> int:
        """The bytes ``ds`` needs at least in the file; a refusal if it cannot hold them."""
        h5py = _h5py()
        if ds.is_virtual:
            raise self._refuse(f"dataset {name} is a virtual dataset (its data are in other files)")
        if ds.external:
            files = ", ".join(str(e[0]) for e in ds.external)
            raise self._refuse(f"dataset {name} keeps its data in external files ({files})")
        declared = declared_bytes(ds.shape, ds.dtype)
        plist = ds.id.get_create_plist()
        what = f"dataset {name} declares {ds.shape} {ds.dtype} ({_bytes(declared)})"
        if plist.get_layout() != h5py.h5d.CHUNKED:  # contiguous or compact: stored as is
            if declared > self.size:
                raise self._refuse(
                    f"{what}; uncompressed data can hold at most the file's {_bytes(self.size)}"
                )
            return declared
        stored = min(int(ds.id.get_storage_size()), self.size)
        filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        if any(code not in UNCOMPRESSING_FILTERS for code in filters):
            if declared > stored * MAX_EXPANSION:
                raise self._refuse(
                    f"{what}; its compressed chunks store {_bytes(stored)}, which expand to at most "
                    f"{MAX_EXPANSION} times that ({_bytes(stored * MAX_EXPANSION)})"
                )
            return -(-declared // MAX_EXPANSION)
        if declared > stored:
            raise self._refuse(f"{what}; its uncompressed chunks store only {_bytes(stored)}")
        return declared

    # ------------------------------------------------------------------ reading
    def read(self, ds: Any) -> Any:
        """``ds[()]``: the whole dataset, refused if the reads of this file so far and this one need
        more bytes than the file has (see the module docstring)."""
        h5py = _h5py()
        if not isinstance(ds, h5py.Dataset):
            raise BadInput(f"{self.path}: {ds.name} is a {type(ds).__name__}, not a dataset")
        need = self._needed(ds, ds.name)
        if self._read + need > self.size:
            raise self._refuse(
                f"reading {ds.name} ({_bytes(declared_bytes(ds.shape, ds.dtype))}) takes the data read "
                f"from it past what the file can hold ({_bytes(self.size)}): datasets reached through "
                "several links"
            )
        self._read += need
        return ds[()]
