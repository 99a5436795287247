"""Reading a sharded safetensors checkpoint's index (``model.safetensors.index.json``, the layout of
``save_pretrained`` and of every public multi-gigabyte checkpoint): the one reader the VLA loaders
(``policies.pretrained``) and the OpenSora loader (``envs.world_models.opensora``) share.

An index is data from a file, so it is checked before any shard is opened: ``weight_map`` must map
tensor names to shard file names, and every shard must be a plain file name inside the index's own
folder. ``../x.safetensors``, ``/etc/x``, ``sub/x`` or a shard that is a symbolic link leading out of
the folder is refused (``BadInput``): an index cannot make a loader read files elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from nets.errors import BadInput
from nets.files import read_json

INDEX_FILE = "model.safetensors.index.json"


def shard_path(folder: Path, name: object, index: Path) -> Path:
    """``folder / name`` for a shard file name read from ``index``; a name that is not a plain file
    name, or whose file resolves outside ``folder``, is a ``BadInput`` naming both."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise BadInput(f"{index}: expected shard file names in 'weight_map', got {name!r:.80}")
    if "/" in name or "\\" in name or os.path.isabs(name) or "\x00" in name:
        raise BadInput(
            f"{index}: shard {name!r:.80} is not a file name in the index's folder {folder} "
            "(an index may only name files beside it)"
        )
    path = folder / name
    if path.exists() and not path.resolve().is_relative_to(folder.resolve()):
        raise BadInput(
            f"{index}: shard {name!r} is a link to {path.resolve()}, outside the index's folder {folder}"
        )
    return path


def read_shard_index(index: str | os.PathLike) -> tuple[list[Path], dict[str, str]]:
    """(the shard files, sorted by name; the ``weight_map`` of tensor name -> shard file name) of a
    safetensors index. A malformed index is a ``BadInput`` naming it; a listed shard that is missing
    is a ``FileNotFoundError`` naming every missing file."""
    index = Path(index)
    content = read_json(index, "safetensors index")
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise BadInput(
            f"{index}: expected a safetensors index with a non-empty 'weight_map' of key -> shard file"
        )
    bad_keys = [k for k in weight_map if not isinstance(k, str) or not k]
    if bad_keys:
        raise BadInput(f"{index}: 'weight_map' keys must be tensor names, got {bad_keys[0]!r:.80}")
    folder = index.parent
    names = list(weight_map.values())
    for name in names:
        if not isinstance(name, str):
            shard_path(folder, name, index)  # raises, naming it
    files = [shard_path(folder, name, index) for name in sorted(set(names))]
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise FileNotFoundError(f"{index} lists shards that are missing: {', '.join(absent)}")
    return files, weight_map
