"""Package-level rules: cheap imports and the dependency direction between the packages
(README, "Layout"): ``trainers`` never imports ``envs``; ``envs`` never imports ``policies`` or
``trainers``; ``nets`` imports none of ``envs``, ``policies``, ``trainers``."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "envs": {"policies", "trainers"},
    "policies": {"envs", "trainers"},
    "trainers": {"envs"},
    "nets": {"envs", "policies", "trainers"},
}
# "package.module:attr", the form entry points and registries load by name
ENTRY_POINT = re.compile(r"([A-Za-z_]\w*)(\.[A-Za-z_]\w*)*:[A-Za-z_][\w.]*")
IMPORT_BY_NAME = {"import_module", "__import__", "find_spec"}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in IMPORT_BY_NAME and isinstance(node.args[0].value, str):
                names.add(node.args[0].value.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if ENTRY_POINT.fullmatch(node.value):
                names.add(node.value.split(":")[0].split(".")[0])
    return names


def test_dependency_direction():
    for package, forbidden in FORBIDDEN.items():
        for path in (ROOT / package).rglob("*.py"):
            bad = _imported_packages(path) & forbidden
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_dependency_check_sees_imports_by_name(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import importlib\nimportlib.import_module('trainers.run')\n"
        "SPEC = 'policies.gaussian:GaussianPolicy'\nNOT_A_MODULE = 'envs:Libero-Spatial-v0'\n"
    )
    assert _imported_packages(module) == {"importlib", "trainers", "policies"}


def test_import_envs_is_cheap_and_registers_every_id():
    code = (
        "import sys, envs, gymnasium as gym; "
        "print(sorted(m for m in ('robosuite', 'libero', 'mujoco', 'torch', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
    import envs  # noqa: F401

    for env_id in (
        "Libero-Spatial-v0",
        "Libero-Object-v0",
        "Libero-Goal-v0",
        "Libero-10-v0",
        "Libero-90-v0",
        "Libero-130-v0",
        "CosmosWM-LiberoSpatial-v0",
        "OpenSoraWM-LiberoSpatial-v0",
        "OpenSoraWM-LiberoObject-v0",
    ):
        spec = gym.spec(env_id)
        assert spec.vector_entry_point and spec.entry_point


# issue 34's renames; the old paths work, with a DeprecationWarning, for one release
OLD_PATHS = {
    "trainers.distributed": "trainers.parallel",
    "envs.distributed": "envs.ray",
    "envs.distributed.actors": "envs.ray.actors",
    "envs.distributed.ray_env": "envs.ray.ray_env",
    "envs.distributed.ray_gym": "envs.ray.ray_gym",
}
_OLD_PATHS_PROBE = """
import importlib, json, sys, warnings
import gymnasium as gym
from gymnasium.envs.registration import load_env_creator
out = {}
for old, new in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(f"import {old} as module", "<caller>", "exec"), scope := {})
    out[old] = {
        "same": scope["module"] is importlib.import_module(new),
        "warnings": [[w.category.__name__, str(w.message), w.filename] for w in caught],
    }
from envs.distributed import RayVectorEnv
from envs.distributed.ray_env import _deadline
from trainers import distributed
import envs.ray.ray_env, trainers.parallel
out["names"] = [
    RayVectorEnv is envs.ray.ray_env.RayVectorEnv,
    _deadline is envs.ray.ray_env._deadline,
    distributed.Evaluate is trainers.parallel.Evaluate,
]
gym.register(id="OldPathRay-v0", vector_entry_point="envs.distributed.ray_gym:RayGymVectorEnv")
out["entry_point"] = load_env_creator(gym.spec("OldPathRay-v0").vector_entry_point).__module__
out["ray imported"] = "ray" in sys.modules
print(json.dumps(out))
"""


def test_old_module_paths_still_work_and_warn():
    import json

    out = subprocess.run(
        [sys.executable, "-c", _OLD_PATHS_PROBE, json.dumps(OLD_PATHS)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    result = json.loads(out.stdout)
    for old, new in OLD_PATHS.items():
        if old != "envs.distributed":  # a package of aliases, not an alias itself
            assert result[old]["same"], f"{old} is not {new}"
        # importing an envs.distributed module first imports (and warns for) the package, once
        warned = [w for w in result[old]["warnings"] if old in w[1]]
        assert len(warned) == 1, result[old]
        category, message, filename = warned[0]
        assert category == "DeprecationWarning" and f"import {new} instead" in message
        assert filename == "<caller>"  # stacklevel: the line that imports the old path
    assert result["names"] == [True, True, True]
    assert result["entry_point"] == "envs.ray.ray_gym" and not result["ray imported"]
    assert not any(
        "filterwarnings" in line and "error" in line
        for line in (ROOT / "pyproject.toml").read_text().splitlines()
    )  # the test suite itself treats the warnings as warnings
