"""Pretrained VLA checkpoint folders: find them, read their safetensors strictly, write them.

A checkpoint is a Hugging Face ``save_pretrained`` folder: ``config.json``, the weights as
``model.safetensors`` or shards listed in ``model.safetensors.index.json``, plus whatever files
the model needs (tokenizer, normalization statistics). ``find_checkpoint`` takes a local folder or a
hub id, ``owner/name`` or ``owner/name@revision``; a hub id is looked up in the Hugging Face cache
(at that revision when one is given), and downloaded only with ``download=True``, a pinned revision
and ``HF_HUB_OFFLINE`` unset. Missing files raise an error that names them, where they were looked
for and the command that gets them. Weights are read from safetensors only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from nets import files
from nets.devices import default_device, parse_dtype
from nets.errors import BadInput
from nets.files import atomic_path, write_atomic
from nets.shards import INDEX_FILE, read_shard_index

from .base import ActionChunkPolicy
from .torso_policy import box_chunk_shape

SINGLE_FILE = "model.safetensors"


def require_vla_extra(what: str, also: tuple[str, ...] = (), extras: str = "vla") -> None:
    """Fail early, naming the extra(s) to install, when the VLA dependencies are not installed."""
    import importlib.util

    modules = ("transformers", "safetensors", "accelerate", *also)
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f'{what} needs {", ".join(missing)}: pip install "vla-gym[{extras}]"')


def find_checkpoint(
    name_or_path: str | os.PathLike,
    required: Sequence[str],
    *,
    what: str = "checkpoint",
    download: bool = False,
) -> Path:
    """The folder holding ``required`` files (``"a|b"`` means either), from a directory or a hub id
    ``owner/name[@revision]`` (``download=True`` needs the revision: downloads are pinned)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        missing = missing_files(path, required)
        if missing:
            raise FileNotFoundError(f"{what} folder {path} lacks {', '.join(missing)}")
        return path
    repo, _, revision = str(name_or_path).partition("@")
    if repo.count("/") != 1 or path.exists():
        raise FileNotFoundError(
            f"{what} not found: {str(name_or_path)!r} is neither a folder nor a hub id "
            "'owner/name[@revision]'"
        )
    if download and not revision:
        raise BadInput(
            f"{what} {repo!r}: download=True needs a pinned revision, '{repo}@<commit hash>' (vla-gym "
            f"does not download an unpinned repository), or download it yourself and pass the folder"
        )
    tried = []
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    for local_only in (True, False) if download and not offline else (True,):
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(repo, revision=revision or None, local_files_only=local_only))
        except Exception as e:  # not cached, offline, no network: all end in the same advice
            tried.append(f"{'cache' if local_only else 'download'}: {type(e).__name__}")
            continue
        missing = missing_files(folder, required)
        if not missing:
            return folder
        tried.append(f"{folder}: missing {', '.join(missing)}")
    pin = f" --revision {revision}" if revision else ""
    raise FileNotFoundError(
        f"{what} {repo!r} not found in the Hugging Face cache ({'; '.join(tried)}). Looked for "
        f"{', '.join(required)}. Get it with `hf download {repo}{pin} --local-dir <dir>` and pass the folder "
        f"'<dir>' instead of the hub id (or set HF_HOME to the cache that has it)."
    )


def missing_files(folder: Path, required: Sequence[str]) -> list[str]:
    """The entries of ``required`` absent from ``folder`` (``"a|b"``: present if either is)."""
    return [name for name in required if not any((folder / n).is_file() for n in name.split("|"))]


def weight_files(folder: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a checkpoint folder and the index's key -> file map (None if unsharded)."""
    if (folder / INDEX_FILE).is_file():
        return read_shard_index(folder / INDEX_FILE)
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE], None
    raise FileNotFoundError(f"{folder}: no {INDEX_FILE} or {SINGLE_FILE}")


def read_state_dict(folder: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors (cast to ``dtype`` if given); the index must agree."""
    from safetensors import safe_open

    files, weight_map = weight_files(folder)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                if key in state:
                    raise BadInput(f"{file}: key {key!r} appears in two shards")
                if weight_map is not None and weight_map.get(key) != file.name:
                    raise BadInput(f"{file}: key {key!r} is not listed for this shard in {INDEX_FILE}")
                tensor = f.get_tensor(key)
                state[key] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    if weight_map is not None and set(weight_map) - set(state):
        raise BadInput(
            f"{folder}: {INDEX_FILE} lists keys no shard has: {_short(set(weight_map) - set(state))}"
        )
    return state


# the largest value a config file may give a size (every public checkpoint's is far below): a file
# asking for more is refused before anything is built (a million layers would take an hour on meta)
SIZE_LIMITS = {
    "hidden_size": 1 << 16, "intermediate_size": 1 << 18, "num_hidden_layers": 512,
    "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 4096, "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 20,
    "width": 1 << 16, "depth": 512, "mlp_dim": 1 << 18, "num_heads": 1024, "num_kv_heads": 1024,
    "image_size": 8192, "patch_size": 1024, "embed_dim": 1 << 16, "num_layers": 512,
}  # fmt: skip


def check_sizes(values: Any, where: str) -> None:
    """Every entry of ``values`` (a config's JSON, nested) named in ``SIZE_LIMITS`` is an int in
    [1, its limit]; else a ``BadInput`` naming the file and the entry."""
    stack = [("", values)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        name = path.rsplit(".", 1)[-1]
        if name in SIZE_LIMITS and not isinstance(value, dict | list):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= SIZE_LIMITS[name]:
                raise BadInput(
                    f"{where}: {path} must be an int in [1, {SIZE_LIMITS[name]}], got {value!r:.60}"
                )


def empty_model(build: Callable[[], nn.Module], what: str = "model") -> nn.Module:
    """``build()`` with its parameters on the meta device (no memory, no random init) and its buffers
    real (computed ones such as rotary frequencies are not in checkpoints); ``load_strict`` fills them.
    It is built on the meta device first, so buffers a config sizes beyond the memory available are
    refused (``nets.budget.check_memory``) before any is allocated."""
    from accelerate import init_empty_weights

    from nets.budget import check_memory

    with torch.device("meta"):
        probe = build()
    check_memory(sum(b.numel() * b.element_size() for b in probe.buffers()), f"{what}'s buffers")
    del probe
    with init_empty_weights(include_buffers=False):
        return build()


def load_strict(module: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """``module.load_state_dict(state)`` with every key matched, shapes equal, and an error naming
    the missing, unexpected and wrongly shaped keys otherwise."""
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = sorted(
        f"{k} (checkpoint {tuple(state[k].shape)}, model {tuple(own[k].shape)})"
        for k in set(own) & set(state)
        if tuple(own[k].shape) != tuple(state[k].shape)
    )
    problems = [
        f"{label}: {_short(keys)}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes))
        if keys
    ]
    if problems:
        raise BadInput(f"{what} does not match the model: " + "; ".join(problems))
    module.load_state_dict(state, strict=True, assign=any(p.is_meta for p in own.values()))


def save_state_dict(
    state: Mapping[str, torch.Tensor], folder: str | os.PathLike, max_shard_bytes: int | None = None
) -> None:
    """Write ``state`` as ``model.safetensors``, or as shards plus ``model.safetensors.index.json``
    when it is larger than ``max_shard_bytes``; each file is written to a temporary name first."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    sizes = {k: v.numel() * v.element_size() for k, v in tensors.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for key, tensor in tensors.items():
        if max_shard_bytes and shards[-1] and used + sizes[key] > max_shard_bytes:
            shards.append({})
            used = 0
        shards[-1][key] = tensor
        used += sizes[key]
    if len(shards) == 1:
        with atomic_path(folder / SINGLE_FILE) as p:
            save_file(shards[0], p, metadata={"format": "pt"})
        return
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        with atomic_path(folder / name) as p:
            save_file(shard, p, metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": sum(sizes.values())},
        "weight_map": {k: name for name, shard in zip(names, shards) for k in shard},
    }
    write_atomic(folder / INDEX_FILE, json.dumps(index, indent=2))


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``; a clear error when it is missing or malformed."""
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    data = files.read_json(path, what)
    if not isinstance(data, dict):
        raise BadInput(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def _short(keys, limit: int = 6) -> str:
    keys = sorted(keys)
    more = f" ... (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def load_tokenizer(folder: Path):
    """The folder's ``tokenizer.json`` as a fast tokenizer: it defines the tokenizer completely
    (normalizer, pre-tokenizer, added ``<PAD>``), while converting a bare sentencepiece model depends
    on transformers' converter; OpenVLA's folders ship both."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A VLA's weight dtype: ``"auto"`` is bfloat16 when CUDA is available, else float32; else
    float32 or bfloat16 in any spelling ``nets.devices.parse_dtype`` reads (``"bf16"``, ``"fp32"``...)."""
    if dtype == "auto":
        return torch.bfloat16 if default_device().type == "cuda" else torch.float32
    return parse_dtype(dtype, optional=False, allowed=(torch.float32, torch.bfloat16), also=("auto",))


def check_observation_space(space: spaces.Space, image_keys: Sequence[str]) -> None:
    """VLAs read a Dict observation with ``instruction`` and uint8 ``[H, W, 3]`` images at ``image_keys``."""
    if not isinstance(space, spaces.Dict) or "instruction" not in space.spaces:
        raise BadInput(f"a VLA needs a Dict observation space with 'instruction', got {space}")
    for key in image_keys:
        sub = space.spaces.get(key)
        if not (
            isinstance(sub, spaces.Box)
            and sub.dtype == np.uint8
            and len(sub.shape) == 3
            and sub.shape[-1] == 3
        ):
            have = sorted(space.spaces)
            raise BadInput(f"image key {key!r}: expected a uint8 [H, W, 3] Box in the observations {have}")


def add_lora(model: nn.Module, rank: int, targets: Sequence[str], what: str = "the model") -> None:
    """Wrap the ``targets`` modules (names or name suffixes, as peft matches them) of ``model`` in LoRA
    adapters (peft; alpha = rank, Gaussian init) and train only those. A target that names no
    module is an error naming it and the linear layers there are."""
    names = [name for name, _ in model.named_modules()]
    unknown = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if unknown:
        linears = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise BadInput(
            f"LoRA target modules {unknown} are not in {what}; its linear layers are named {linears}"
        )
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:
        raise ImportError('LoRA needs peft: pip install "vla-gym[vla]"') from e
    config = LoraConfig(
        r=rank, lora_alpha=rank, lora_dropout=0.0, init_lora_weights="gaussian", target_modules=list(targets)
    )
    inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)


class PretrainedVLAPolicy(ActionChunkPolicy):
    """Base of the ``ActionChunkPolicy`` wrappers around a pretrained VLA checkpoint; E = D.

    It holds what every VLA constructor does the same way: check that the optional dependencies are
    installed (``requires``, an error naming the ``extras`` to install), read the chunk shape
    ``(K, D)`` from the action Box, check the Dict observation space (``instruction`` and uint8
    images), and find the checkpoint folder (``checkpoint_files`` in a folder or the Hugging Face
    cache, under the name ``checkpoint_name`` in errors). A subclass sets those class attributes, calls
    ``super().__init__(observation_space, action_space, image_keys)`` first, validates its own options,
    and then calls ``self.find_folder(model_path, download)`` before reading anything from disk (so a
    bad option is reported before a missing checkpoint).

    Frozen parameters come back from ``model_path`` when the policy is rebuilt, so checkpoints leave
    them out (``rebuilds_frozen_weights``).
    """

    rebuilds_frozen_weights = True
    checkpoint_name = "VLA checkpoint"
    checkpoint_files: tuple[str, ...] = ("config.json",)
    requires: tuple[str, ...] = ()  # modules needed beyond transformers, safetensors, accelerate
    extras = "vla"

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Box, image_keys: Sequence[str]):
        super().__init__()
        require_vla_extra(type(self).__name__, also=self.requires, extras=self.extras)
        self.chunk_size, self.action_dim = box_chunk_shape(action_space)
        self.log_prob_dim = self.action_dim
        check_observation_space(observation_space, image_keys)

    def find_folder(self, model_path: str | os.PathLike, download: bool = False) -> Path:
        """The checkpoint folder of ``model_path`` (a folder or a hub id; see ``find_checkpoint``)."""
        what, files = self.checkpoint_name, self.checkpoint_files
        return find_checkpoint(model_path, files, what=what, download=download)
