"""Where world-model weights come from: a directory, an environment variable, or the Hugging Face hub.

A bundle is the folder RLinf's checkpoints ship as: the video model, its VAE, the reward model
``resnet_rm.pth``, the initial-frame ``dataset/`` and ``dataset_statistics.json``. Lookup order:

1. the ``model_dir=`` keyword of the env;
2. the bundle's environment variable (e.g. ``VLA_GYM_COSMOS_LIBERO_SPATIAL=/data/cosmos``);
3. the Hugging Face cache, downloading the bundle there only when asked (``download=True``, a
   pinned ``revision``, ``HF_HUB_OFFLINE`` unset): a download fetches exactly that commit of the
   repository, never whatever its newest files are.

When none has the files, the error names the files looked for, where, and the command that gets them.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from nets.errors import BadInput


@dataclass(frozen=True)
class Bundle:
    """A public checkpoint folder: hub repo, folder inside it, the files an env needs."""

    name: str
    repo: str
    subfolder: str
    env_var: str
    files: tuple[str, ...]  # relative paths; a trailing "/" means a non-empty directory

    def command(self, target: str = "<dir>", revision: str | None = None) -> str:
        include = f' --include "{self.subfolder}/*"' if self.subfolder else ""
        pin = f" --revision {revision}" if revision else ""
        return f"hf download {self.repo}{pin}{include} --local-dir {target}"


COSMOS_LIBERO_SPATIAL = Bundle(
    name="Cosmos-Predict2.5 LIBERO-Spatial",
    repo="tayalmanan/cosmos-robotics",
    subfolder="models/Cosmos-Predict2.5-LIBERO-Spatial",
    env_var="VLA_GYM_COSMOS_LIBERO_SPATIAL",
    files=("libero-spatial-2b-19k.pt", "tokenizer/tokenizer.pth", "resnet_rm.pth", "dataset/"),
)
_OPENSORA_FILES = ("config.json", "model.safetensors.index.json", "vae/config.json", "resnet_rm.pth",
                   "dataset/", "dataset_statistics.json")  # fmt: skip
OPENSORA_LIBERO_SPATIAL = Bundle(
    name="OpenSora LIBERO-Spatial",
    repo="RLinf/RLinf-OpenSora-LIBERO-Spatial",
    subfolder="",
    env_var="VLA_GYM_OPENSORA_LIBERO_SPATIAL",
    files=_OPENSORA_FILES,
)
OPENSORA_LIBERO_OBJECT = Bundle(
    name="OpenSora LIBERO-Object",
    repo="RLinf/RLinf-OpenSora-LIBERO-Object",
    subfolder="",
    env_var="VLA_GYM_OPENSORA_LIBERO_OBJECT",
    files=_OPENSORA_FILES,
)


def missing_files(bundle: Bundle, directory: Path, skip: Collection[str] = ()) -> list[str]:
    """The bundle files absent from ``directory`` (those in ``skip`` are not needed)."""
    missing = []
    for rel in bundle.files:
        if rel in skip:
            continue
        path = directory / rel.rstrip("/")
        ok = path.is_dir() and any(path.iterdir()) if rel.endswith("/") else path.is_file()
        if not ok:
            missing.append(rel)
    return missing


def find_bundle(
    bundle: Bundle,
    model_dir: str | os.PathLike | None = None,
    download: bool = False,
    revision: str | None = None,
    skip: Collection[str] = (),
) -> Path:
    """The folder holding ``bundle``'s files (see the module docstring for the lookup order).

    ``revision`` (a commit hash or tag of the hub repository) pins what the cache lookup and a
    download use; ``download=True`` without one is refused: vla-gym does not fetch an unpinned
    repository (its owner could change what it holds). Files in ``skip`` are not needed (e.g.
    ``resnet_rm.pth`` when the env is given its own reward model)."""
    if download and not revision:
        raise BadInput(
            f"{bundle.name}: download=True needs revision='<commit hash>' of {bundle.repo} (downloads "
            f"are pinned); or get the files yourself with `{bundle.command('<dir>')}` and pass model_dir"
        )
    tried: list[str] = []
    if model_dir is not None:
        return _checked(bundle, Path(model_dir), "model_dir", skip)
    if os.environ.get(bundle.env_var):
        return _checked(bundle, Path(os.environ[bundle.env_var]), f"${bundle.env_var}", skip)
    tried.append(f"${bundle.env_var} (unset)")
    found, why = _from_hub(bundle, download, revision, skip)
    if found is not None:
        return found
    tried.append(why)
    raise FileNotFoundError(_advice(bundle, tried))


def _checked(bundle: Bundle, directory: Path, source: str, skip: Collection[str]) -> Path:
    missing = missing_files(bundle, directory, skip)
    if missing:
        raise FileNotFoundError(_advice(bundle, [f"{source} = {directory}: missing {', '.join(missing)}"]))
    return directory


def _from_hub(
    bundle: Bundle, download: bool, revision: str | None, skip: Collection[str]
) -> tuple[Path | None, str]:
    """The bundle from the Hugging Face cache, downloaded first if allowed; else (None, why)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None, 'Hugging Face cache (huggingface_hub not installed: pip install "vla-gym[wm]")'
    patterns = [f"{bundle.subfolder}/*"] if bundle.subfolder else None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    for local_only in (True, False) if download and not offline else (True,):
        try:
            root = Path(
                snapshot_download(
                    bundle.repo, revision=revision, allow_patterns=patterns, local_files_only=local_only
                )
            )
        except Exception as e:  # offline, unknown repo, no network: all end in the same advice
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            continue
        directory = root / bundle.subfolder if bundle.subfolder else root
        missing = missing_files(bundle, directory, skip)
        if not missing:
            return directory, ""
        why = f"missing {', '.join(missing)}"
    where = "Hugging Face cache" + ("" if download and not offline else " (downloads off: download=False)")
    return None, f"{where}, repo {bundle.repo}: {why}"


def _advice(bundle: Bundle, tried: list[str]) -> str:
    sub = f"/{bundle.subfolder}" if bundle.subfolder else ""
    return (
        f"{bundle.name} weights not found. Looked for {', '.join(bundle.files)} in: "
        + "; ".join(tried)
        + f". Get them with `{bundle.command('<dir>')}` and pass model_dir='<dir>{sub}' "
        f"(or set {bundle.env_var}=<dir>{sub})."
    )
