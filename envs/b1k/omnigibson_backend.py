"""OmniGibson behind ``B1KBackend``: the BEHAVIOR-1K 2025 challenge setup (BEHAVIOR-1K v3.7.x).

Written against the v3.7.x APIs as the challenge's ``eval.py``, cosmos-rl and RLinf use them (config
from ``generate_basic_environment_config`` / ``generate_robot_config``, N environments in one
simulation via ``omnigibson.envs.VectorEnvironment``, instance resets from ``*-tro_state.json``:
load the object states and robot pose, settle 25 physics steps, make it the scene's reset state).
It has NOT run on a real OmniGibson here (no RTX GPU, no Isaac Sim): check it with
``python -m benchmarks.b1k_smoke`` on a machine that has them.

Importing this module imports nothing of OmniGibson. ``OmniGibsonBackend()`` checks the
requirements first and raises ``B1KUnavailableError`` listing everything missing; it also catches
OmniGibson's own import failures, which on a machine without CUDA are an ``AssertionError`` (its
vision utilities allocate a CUDA tensor at import), not an ``ImportError``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from envs.b1k.backend import StepResult
from envs.b1k.layout import CAMERAS, flatten_obs
from envs.b1k.tasks import CHALLENGE_TASKS, default_instruction

INSTALL = (
    "BEHAVIOR-1K needs an NVIDIA RTX-class GPU (ray-tracing cores) with CUDA torch, Isaac Sim and the "
    "challenge data. The 2025 challenge code: `git clone -b v3.7.2 https://github.com/StanfordVL/BEHAVIOR-1K "
    "&& cd BEHAVIOR-1K && ./setup.sh --omnigibson --bddl --joylo --dataset` (Python 3.10, Isaac Sim 4.5 "
    "from pypi.nvidia.com); later releases (>= 3.8) use Python 3.11 and Isaac Sim 5.1. Then set "
    "OMNIGIBSON_DATA_PATH to the folder holding 2025-challenge-task-instances."
)
INSTANCES_DIR = "2025-challenge-task-instances"
SETTLE_STEPS = 25  # physics steps after loading an instance (eval.py)


class B1KUnavailableError(ImportError):
    """OmniGibson (or what it needs) is not usable on this machine."""


def check_requirements() -> list[str]:
    """Everything that keeps OmniGibson from running here, checked without importing it."""
    problems = []
    if importlib.util.find_spec("omnigibson") is None:
        problems.append("the omnigibson package is not installed")
    if importlib.util.find_spec("isaacsim") is None and not os.environ.get("ISAAC_PATH"):
        problems.append("Isaac Sim is not installed (no isaacsim package, ISAAC_PATH unset)")
    try:
        import torch

        if not torch.cuda.is_available():
            problems.append("no CUDA GPU visible to torch (OmniGibson needs an RTX-class NVIDIA GPU)")
    except ImportError:
        problems.append("torch is not installed")
    if sys.version_info[:2] not in ((3, 10), (3, 11)):
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        problems.append(f"Python {version} (BEHAVIOR-1K: 3.10 for v3.7.x, 3.11 for >= 3.8)")
    data = os.environ.get("OMNIGIBSON_DATA_PATH")
    if data and not (Path(data) / INSTANCES_DIR).is_dir():
        problems.append(f"OMNIGIBSON_DATA_PATH={data} has no {INSTANCES_DIR}/")
    return problems


def import_omnigibson() -> Any:
    """The ``omnigibson`` module, or ``B1KUnavailableError`` saying what is missing and how to install it."""
    problems = check_requirements()
    if problems:
        raise B1KUnavailableError("BEHAVIOR-1K cannot run here: " + "; ".join(problems) + ". " + INSTALL)
    try:
        import omnigibson
    except Exception as e:  # AssertionError without CUDA, KeyError('ISAAC_PATH') without Isaac Sim, ...
        raise B1KUnavailableError(f"importing omnigibson failed ({type(e).__name__}: {e}). {INSTALL}") from e
    return omnigibson


class OmniGibsonBackend:
    """BEHAVIOR-1K challenge tasks in OmniGibson (see the module docstring).

    Args:
        instructions: a JSON / JSONL file mapping task names to instructions (the challenge's
            ``behavior_task.jsonl`` rows ``{"task_name", "task"}``, or ``{name: text}``); default:
            the activity name as words.
    """

    def __init__(self, instructions: str | Path | None = None) -> None:
        self.og = import_omnigibson()
        from omnigibson.macros import gm

        self.data = Path(gm.DATA_PATH)
        if not (self.data / INSTANCES_DIR).is_dir():
            raise B1KUnavailableError(
                f"OmniGibson's data path {self.data} has no {INSTANCES_DIR}/. {INSTALL}"
            )
        self._instructions = _read_instructions(Path(instructions)) if instructions else {}
        self.venv = None
        self.task: str | None = None

    # ---------------------------------------------------------------- task data
    # Read once per task: the env asks for these at every episode start.
    @functools.cache  # noqa: B019  (one backend per process; it lives as long as the simulator)
    def _task_cfg(self, task: str) -> dict:
        from gello.robots.sim_robot.og_teleop_utils import load_available_tasks

        return load_available_tasks()[task][0]

    def _instance_dir(self, task: str) -> Path:
        from omnigibson.utils.asset_utils import get_task_instance_path

        scene = self._task_cfg(task)["scene_model"]
        return Path(get_task_instance_path(scene)) / "json" / f"{scene}_task_{task}_instances"

    @functools.cache  # noqa: B019
    def instances(self, task: str) -> list[int]:
        # files "{scene}_task_{task}_{definition}_{instance}_template-tro_state.json"
        files = self._instance_dir(task).glob("*-tro_state.json")
        return sorted(int(f.name.split("_template")[0].rsplit("_", 1)[1]) for f in files)

    def instruction(self, task: str) -> str:
        return self._instructions.get(task, default_instruction(task))

    @functools.cache  # noqa: B019
    def max_steps(self, task: str) -> int:
        index = CHALLENGE_TASKS.index(task)
        lengths = []
        with open(self.data / INSTANCES_DIR / "metadata" / "episodes.jsonl") as f:
            for line in f:
                row = json.loads(line)
                if int(row["episode_index"] // 10_000) == index:
                    lengths.append(row["length"])
        return int(2 * np.mean(lengths)) if lengths else 2000

    # ---------------------------------------------------------------- simulation
    def load(self, task: str, num_envs: int, image_size: int) -> None:
        from gello.robots.sim_robot.og_teleop_utils import generate_robot_config
        from omnigibson.envs import VectorEnvironment
        from omnigibson.learning.utils.eval_utils import (
            PROPRIOCEPTION_INDICES,
            generate_basic_environment_config,
        )
        from omnigibson.macros import gm, macros

        gm.HEADLESS, gm.USE_GPU_DYNAMICS, gm.ENABLE_FLATCACHE = True, False, True
        gm.ENABLE_OBJECT_STATES, gm.ENABLE_TRANSITION_RULES = True, True
        macros.robots.manipulation_robot.GRASP_WINDOW = 0.75
        task_cfg = self._task_cfg(task)
        cfg = generate_basic_environment_config(task_name=task, task_cfg=task_cfg)
        robot = generate_robot_config(task_name=task, task_cfg=task_cfg)
        robot["obs_modalities"] = ["proprio", "rgb"]
        robot["proprio_obs"] = list(PROPRIOCEPTION_INDICES["R1Pro"].keys())
        cfg["robots"] = [robot]
        cfg["task"]["include_obs"] = False
        cfg["task"]["termination_config"]["max_steps"] = 10**9  # the vector env owns the time limit
        self.venv = VectorEnvironment(num_envs, cfg)
        for env in self.venv.envs:
            for name in CAMERAS.values():
                sensor = env.robots[0].sensors[name.split("::")[1]]
                sensor.image_height, sensor.image_width = image_size, image_size
            env.load_observation_space()
        self.task = task

    def _instance_state(self, instance: int) -> dict:
        from omnigibson.tasks.behavior_task import BehaviorTask
        from omnigibson.utils.python_utils import recursively_convert_to_torch

        name = BehaviorTask.get_cached_activity_scene_filename(
            scene_model=self._task_cfg(self.task)["scene_model"],
            activity_name=self.task,
            activity_definition_id=0,
            activity_instance_id=instance,
        )
        with open(self._instance_dir(self.task) / f"{name}-tro_state.json") as f:
            return recursively_convert_to_torch(json.load(f))

    def reset_to_instance(self, env_idx: int, instance: int) -> dict[str, Any]:
        og, env = self.og, self.venv.envs[env_idx]
        for key, value in self._instance_state(instance).items():
            if key == "robot_poses":
                robot = env.robots[0]
                pose = value[getattr(robot, "model_name", "R1Pro")][0]
                robot.set_position_orientation(pose["position"], pose["orientation"])
                env.scene.write_task_metadata(key=key, data=value)
            else:
                env.task.object_scope[key].load_state(value, serialized=False)
        for _ in range(SETTLE_STEPS):
            og.sim.step_physics()
            for entity in env.task.object_scope.values():
                if not entity.is_system and entity.exists:
                    entity.keep_still()
        env.scene.update_initial_file()
        env.scene.reset()
        env.reset()
        for _ in range(4):  # let the camera buffers catch up
            og.sim.render()
        return self.observe(env_idx)

    def step(self, env_ids: list[int], actions: np.ndarray, get_obs: bool) -> StepResult:
        import torch

        envs = [self.venv.envs[i] for i in env_ids]
        commands = [torch.as_tensor(a, dtype=torch.float32) for a in actions]
        for env, action in zip(envs, commands):
            env._pre_step(action)
        self.og.sim.step()
        obs, reward, terminated, truncated, success, infos = [], [], [], [], [], []
        for env, action in zip(envs, commands):
            o, r, term, trunc, info = env._post_step(action)
            obs.append(flatten_obs(o))
            reward.append(float(r))
            terminated.append(bool(term))
            truncated.append(bool(trunc))
            success.append(bool(info.get("done", {}).get("success", False)))
            infos.append(info)
        return StepResult(
            obs if get_obs else None,
            np.asarray(reward, np.float32),
            np.asarray(terminated),
            np.asarray(truncated),
            np.asarray(success),
            infos,
        )

    def observe(self, env_idx: int) -> dict[str, Any]:
        obs, _ = self.venv.envs[env_idx].get_obs()
        return flatten_obs(obs)

    def goal_predicates(self, env_idx: int) -> list[list[bool]]:
        task = self.venv.envs[env_idx].task
        return [[bool(p.evaluate()) for p in option] for option in task.ground_goal_state_options]

    def close(self) -> None:
        if self.venv is not None and not self.og.sim.is_stopped():
            self.og.sim.stop()
        self.venv = None


def _read_instructions(path: Path) -> dict[str, str]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return {row["task_name"]: row["task"] for row in rows}
    return dict(json.loads(text))
