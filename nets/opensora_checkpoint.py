"""STDiT3 in an HF ``save_pretrained`` folder: ``config.json`` plus one or more safetensors shards
(``model.safetensors.index.json``). ``load_stdit3`` reads it strictly on the checkpoint's key set;
``save_stdit3`` writes it (tiny test checkpoints, ``trainers.world_model``'s bundles)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nets.errors import BadInput
from nets.files import read_json
from nets.opensora_stdit3 import CONFIG_FILE, SINGLE_FILE, STDiT3, STDiT3Config
from nets.shards import INDEX_FILE, read_shard_index


def _locate(path: Path) -> tuple[list[Path], dict[str, str] | None, Path]:
    """(safetensors files, index weight map or None, folder of config.json) for a checkpoint path."""
    if path.is_dir():
        if (path / INDEX_FILE).is_file():
            return (*read_shard_index(path / INDEX_FILE), path)
        if (path / SINGLE_FILE).is_file():
            return [path / SINGLE_FILE], None, path
        files = sorted(path.glob("model*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path}: no {INDEX_FILE}, {SINGLE_FILE} or model-*.safetensors found")
        return files, None, path
    if not path.exists():
        raise FileNotFoundError(f"STDiT3 checkpoint not found: {path}")
    if path.name.endswith(".json"):
        return (*read_shard_index(path), path.parent)
    if path.suffix == ".safetensors":
        return [path], None, path.parent
    raise BadInput(f"expected a checkpoint folder, a .safetensors file or an index .json, got {path}")


def _short(keys: list[str], limit: int = 8) -> str:
    more = f" ... (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _read_state(files: list[Path], weight_map: dict[str, str] | None, dtype: torch.dtype) -> dict:
    from safetensors import safe_open

    state, origin = {}, {}
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"STDiT3 shard not found: {file}")
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                if key in state:
                    raise BadInput(f"{file}: key {key!r} is also in {origin[key].name}")
                state[key], origin[key] = f.get_tensor(key).to(dtype), file
    if weight_map is not None:
        wrong = sorted(
            k for k in set(weight_map) | set(state) if origin.get(k, Path()).name != weight_map.get(k)
        )
        if wrong:
            names = ", ".join(f.name for f in files)
            raise BadInput(f"index weight_map disagrees with the shards ({names}) on {_short(wrong)}")
    return state


def load_stdit3(
    path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> STDiT3:
    """Load an STDiT3 checkpoint strictly, in eval mode with gradients off.

    Args:
        path: a folder in HF ``save_pretrained`` layout (``config.json`` + ``model.safetensors`` or shards
            with ``model.safetensors.index.json``), one ``.safetensors`` file, or an index ``.json``. Shape
            parameters come from ``config.json`` next to the weights when present, else the XL/2 defaults.
        dtype, device: where the weights end up.

    Raises:
        ValueError: missing, unexpected or wrongly shaped keys (named, with the files).
    """
    path = Path(path)
    files, weight_map, folder = _locate(path)
    config_file = folder / CONFIG_FILE
    config = STDiT3Config.from_dict(read_json(config_file, "model config")) if config_file.is_file() else None
    with torch.device("meta"):
        model = STDiT3(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = _read_state(files, weight_map, dtype)

    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    common = sorted(set(expected) & set(state))
    shapes = [
        f"{k} {list(state[k].shape)} != {list(expected[k])}" for k in common if state[k].shape != expected[k]
    ]
    if missing or extra or shapes:
        problems = []
        if missing:
            problems.append(f"missing keys: {_short(missing)}")
        if extra:
            problems.append(f"unexpected keys: {_short(extra)}")
        if shapes:
            problems.append(f"wrong shapes (file != expected): {_short(shapes)}")
        source = str(config_file) if config else "the default XL/2 config (no config.json)"
        names = ", ".join(str(f) for f in files)
        raise BadInput(f"{names}: does not match STDiT3 of {source}: " + "; ".join(problems))
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device).eval().requires_grad_(False)


def save_stdit3(model: STDiT3, directory: str | Path, *, shards: int = 1, indexed: bool = False) -> Path:
    """Write ``model`` as HF ``save_pretrained`` does, into ``directory`` (created); returns it.

    ``config.json`` always; ``shards == 1``: ``model.safetensors``; ``shards > 1`` or ``indexed``:
    ``model-0000k-of-0000n.safetensors`` plus ``model.safetensors.index.json`` (RLinf's bundles name
    the index, even of one shard). Weights are saved in their own dtype, on the CPU.
    """
    from safetensors.torch import save_file

    if shards < 1:
        raise BadInput(f"save_stdit3: expected shards >= 1, got {shards}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    config = {"architectures": ["STDiT3"], "model_type": "STDiT3", "torch_dtype": dtype}
    (directory / CONFIG_FILE).write_text(json.dumps({**config, **model.config.to_dict()}, indent=2))
    keys = list(state)
    if shards == 1 and not indexed:
        save_file(state, str(directory / SINGLE_FILE), metadata={"format": "pt"})
        return directory
    weight_map = {}
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {key: state[key] for key in keys[k::shards]}
        save_file(part, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return directory


def load_action_stats(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q01, q99)`` float32 vectors from a ``dataset_statistics.json``.

    Accepts ``{"action": {"q01": [...], "q99": [...], ...}, ...}`` or the same nested one level under a
    dataset name (``{"libero_spatial_no_noops": {"action": ...}}``).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"action statistics not found: {path} (expected dataset_statistics.json)")
    data = read_json(path, "action statistics")
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a JSON object, got {type(data).__name__}")
    stats = data.get("action")
    if stats is None:
        nested = {k: v["action"] for k, v in data.items() if isinstance(v, dict) and "action" in v}
        if len(nested) != 1:
            raise BadInput(
                f"{path}: expected an 'action' entry at the top level or under exactly one dataset name, "
                f"got datasets with one: {sorted(nested)} (top-level keys {sorted(data)[:8]})"
            )
        stats = next(iter(nested.values()))
    if not isinstance(stats, dict) or "q01" not in stats or "q99" not in stats:
        got = sorted(stats) if isinstance(stats, dict) else type(stats).__name__
        raise BadInput(f"{path}: expected 'action' to hold 'q01' and 'q99', got {got}")
    try:
        q01 = torch.tensor(stats["q01"], dtype=torch.float32)
        q99 = torch.tensor(stats["q99"], dtype=torch.float32)
    except (TypeError, ValueError) as e:
        raise BadInput(f"{path}: expected numeric lists for action q01/q99 ({e})") from e
    if q01.ndim != 1 or q01.shape != q99.shape:
        raise BadInput(
            f"{path}: expected q01 and q99 of equal length, got {list(q01.shape)}, {list(q99.shape)}"
        )
    if not bool((q99 > q01).all()):
        raise BadInput(
            f"{path}: expected q99 > q01 in every dimension, got q01={q01.tolist()} q99={q99.tolist()}"
        )
    return q01, q99
