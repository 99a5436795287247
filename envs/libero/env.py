"""LIBERO as a chunked gymnasium vector env, with simulators in worker processes."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from envs.core.errors import check_float, check_image_size, check_int
from envs.core.frames import InitialFrame
from envs.core.spaces import FieldBox, observation_space
from envs.core.vector_env import ChunkedVectorEnv, ChunkResult
from envs.core.workers import WorkerPool
from envs.libero.fresh import MAX_FRESH_ID, fresh_init_states
from envs.libero.suites import _BASE_SUITES, SUITES, LiberoTask, load_init_states, suite_tasks
from envs.libero.task_state import TASK_STATE_FIELDS
from nets.budget import check_memory
from nets.errors import BadInput

ACTION_DIM = 7  # delta eef position (3), delta rotation (3), gripper (-1 open, +1 close)
# the proprio observation, published as the named fields of its FieldBox
PROPRIO_FIELDS = (("eef_pos", 3), ("eef_axis_angle", 3), ("gripper_qpos", 2))
PROPRIO_DIM = sum(size for _, size in PROPRIO_FIELDS)
CAMERAS = ("agentview", "wrist")
# memory of one env's simulator, at least (measured: 390-450 MB PSS per env without cameras, 2-4 envs)
ENV_BYTES = 300 * 2**20
# largest |value| of a MuJoCo state entry (time, qpos, qvel) a frame may hold; LIBERO's init states: < 3
SIM_STATE_BOUND = 1e3


def _perturbation_options(
    env_id: str,
    camera_view: Sequence[int] | None,
    robot_pose: int | None,
    sensor_noise: int | None,
    lighting: int | None,
) -> dict[str, object]:
    """The LIBERO-Plus options given, checked: a ``BadInput`` naming the option and its range."""
    out: dict[str, object] = {}
    if camera_view is not None:
        view = list(camera_view) if isinstance(camera_view, list | tuple) else None
        ok = (
            view is not None
            and len(view) == 5
            and all(isinstance(v, int) and not isinstance(v, bool) for v in view)
        )
        if not ok or not (0 <= view[0] < 360 and 0 <= view[1] < 360 and 1 <= view[2] <= 1000):
            raise BadInput(
                f"{env_id}: camera_view must be 5 ints (H, V, S, R, E): H and V degrees in [0, 360), S the "
                f"distance in % in [1, 1000], R and E degrees; got {camera_view!r}"
            )
        out["camera"] = tuple(view)
    if robot_pose is not None:
        check_int(env_id, "robot_pose", robot_pose, low=1, high=500)
        out["robot"] = int(robot_pose)
    if sensor_noise is not None:
        check_int(env_id, "sensor_noise", sensor_noise, low=1, high=50)
        out["noise"] = int(sensor_noise)
    if lighting is not None:
        check_int(env_id, "lighting", lighting, low=1, high=500)
        out["light"] = int(lighting)
    return out


def task_key(task: LiberoTask) -> str:
    return f"{task.suite}/{task.name}"


@functools.cache
def _all_tasks() -> dict[str, LiberoTask]:
    return {task_key(t): t for t in suite_tasks("130")}


def find_task(key: str) -> LiberoTask | None:
    """The task of a frame's ``task`` key: LIBERO's, or a LIBERO-Pro category's
    (``libero_spatial_lan/<name>``); None for no task."""
    task = _all_tasks().get(key)
    if task is not None or "/" not in key:
        return task
    folder = key.split("/", 1)[0]
    if "_plus_" in folder:  # LIBERO-Plus: libero_spatial_plus_camera/<variant>
        benchmark, _, category = folder.partition("_plus_")
        suite = next((k for k, v in _BASE_SUITES.items() if v == benchmark), None)
        try:
            return None if suite is None else _plus_index(suite, category).get(key)
        except ValueError:
            return None
    from envs.libero.pro import PRO_SUITES

    for suite in PRO_SUITES:
        prefix = _BASE_SUITES[suite] + "_"
        if folder.startswith(prefix):
            try:
                return _pro_index(suite, folder[len(prefix) :]).get(key)
            except ValueError:
                return None
    return None


@functools.cache
def _plus_index(suite: str, category: str) -> dict[str, LiberoTask]:
    from envs.libero.plus import plus_tasks

    return {task_key(t): t for t in plus_tasks(suite, category)}


@functools.cache
def _pro_index(suite: str, category: str) -> dict[str, LiberoTask]:
    from envs.libero.pro import pro_tasks

    return {task_key(t): t for t in pro_tasks(suite, category)}


class LiberoInitialFrames(Sequence[InitialFrame]):
    """The (task, init state) pairs of a suite, as ``InitialFrame``s, task-major: with every init
    state, id = task_pos * 50 + state; with ``init_states`` (the same indices for every task, e.g.
    ``range(40)`` to hold out the last 10), id = task_pos * len(init_states) + position.

    Init states are read from disk on first use of each task.
    """

    def __init__(self, tasks: Sequence[LiberoTask], init_states: Sequence[int] | None = None) -> None:
        self.tasks = list(tasks)
        if init_states is not None and not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in init_states
        ):
            raise BadInput(f"init_states must be a non-empty list of ints, got {list(init_states)!r:.200}")
        self.init_states = None if init_states is None else [int(i) for i in init_states]
        if self.init_states is not None:
            if not self.init_states or not all(0 <= i <= MAX_FRESH_ID for i in self.init_states):
                expected = (
                    f"a non-empty list of ints in [0, {MAX_FRESH_ID}] (past a task's official ones: fresh)"
                )
                raise BadInput(f"init_states must be {expected}, got {init_states}")
            if len(set(self.init_states)) != len(self.init_states):
                raise BadInput(f"init_states must not repeat an index, got {init_states}")
        self._fresh: dict[int, dict[int, np.ndarray]] = {}
        per_task = None if self.init_states is None else len(self.init_states)
        counts = [per_task or t.num_init_states for t in self.tasks]
        self._offsets = np.cumsum([0, *counts])

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """(position of the task in ``self.tasks``, init-state index) of frame ``index``."""
        pos = int(np.searchsorted(self._offsets, index, side="right") - 1)
        offset = index - int(self._offsets[pos])
        return pos, offset if self.init_states is None else self.init_states[offset]

    def __getitem__(self, index: int) -> InitialFrame:  # type: ignore[override]
        if not isinstance(index, int | np.integer) or not 0 <= index < len(self):
            raise IndexError(f"initial frame id {index} out of range [0, {len(self)})")
        pos, state = self.locate(int(index))
        task = self.tasks[pos]
        fresh = state >= task.num_init_states
        return InitialFrame(
            instruction=task.instruction,
            task=task_key(task),
            sim_state=self._fresh_states(pos)[state] if fresh else load_init_states(task)[state],
            meta={
                "suite": task.suite,
                "task_index": task.index,
                "init_state_index": state,
                **({"fresh": True} if fresh else {}),  # drawn by envs/libero/fresh.py
            },
        )

    def _fresh_states(self, pos: int) -> dict[int, np.ndarray]:
        """The fresh init states (``envs/libero/fresh.py``) this frame set uses for task ``pos``, all
        generated on the first use of one of them."""
        if pos not in self._fresh:
            task = self.tasks[pos]
            ids = [i for i in self.init_states or () if i >= task.num_init_states]
            self._fresh[pos] = dict(zip(ids, fresh_init_states(task, ids), strict=True)) if ids else {}
        return self._fresh[pos]


class _Slot:
    """Worker-side adapter: one ``LiberoSim`` and the one-message-per-chunk calls the env makes."""

    def __init__(self, sim_kwargs: dict[str, Any]) -> None:
        from envs.libero.sim import LiberoSim

        self.sim = LiberoSim(**sim_kwargs)

    def reset(
        self,
        task: LiberoTask,
        state: np.ndarray,
        scene_seed: int,
        with_objects: bool,
        resume: dict | None = None,
    ) -> dict:
        obs = self.sim.reset(task, state, scene_seed, resume)
        return {"obs": obs, "objects": self.sim.object_state() if with_objects else None}

    def run_chunk(
        self,
        actions: np.ndarray,
        max_steps: int,
        record: bool,
        with_objects: bool,
        after_success: int = 0,
        restart: bool = False,
    ) -> dict:
        out = self.sim.run_chunk(actions, max_steps, record_frames=record, steps_after_success=after_success)
        return {
            "out": out,
            "objects": self.sim.object_state() if with_objects else None,
            "restart": self.sim.restart_point() if restart else None,
        }

    def close(self) -> None:
        self.sim.close()


def _worker_environ(render_gpus: Sequence[int], rank: int, size: int) -> dict[str, str]:
    env = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if "LP_NUM_THREADS" not in os.environ:  # llvmpipe threads: share the cores between workers
        env["LP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // size))
    if render_gpus:
        env["MUJOCO_EGL_DEVICE_ID"] = str(render_gpus[rank % len(render_gpus)])
    return env


def _preload_in_forkserver(module: str) -> None:
    """Add ``module`` to what multiprocessing's forkserver imports when it starts; nothing if it is
    running already (too late) or if this Python's forkserver does not expose its preload list."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    modules = getattr(server, "_preload_modules", None)
    if modules is None or getattr(server, "_forkserver_pid", None) is not None or module in modules:
        return
    forkserver.set_forkserver_preload([*modules, module])


def _default_render_gpus() -> list[int]:
    """The GPUs to render on: those in CUDA_VISIBLE_DEVICES (robosuite insists), else all CUDA GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return [int(d) for d in visible.split(",") if d.strip().isdigit()]
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


class LiberoVectorEnv(ChunkedVectorEnv):
    """LIBERO suites (hf-libero 0.1.4 on robosuite 1.4 / MuJoCo) as a chunked vector env.

    Each env can run a different task; ``initial_frames`` is every (task, init state) pair of the
    suite (optionally only ``task_ids`` and ``init_states``). A reset applies the init state after
    the scene reset, with fixture placement seeded by ``scene_seed`` (None: a random layout per
    reset, drawn from the env's RNG), then ``settle_steps`` no-op steps. Episodes terminate on
    LIBERO's own success check (``steps_after_success`` sub-steps after the first success; 0, the
    default, ends at it) and are truncated at the suite's step limit (``max_episode_steps`` overrides
    it). ``info["chunk_success"]`` has the success check after every executed sub-step. Cameras are
    rendered once per chunk, at its end; ``record_frames = True`` adds the agent-view frame after
    every sub-step in ``info["frames"]`` (for videos). Images are
    upright (rotated 180 degrees from robosuite's raw output, as OpenVLA, openpi and RLinf do)
    unless ``upright=False``. Memory per env (a worker process): ~0.8 GB, 1.4-1.9 GB rendering.

    Args:
        suite: "spatial", "object", "goal", "10", "90" or "130" (all of them).
        category: a perturbation category of the suite, its tasks, instructions and init states
            instead of LIBERO's; ``info["category"]`` names it at every step. LIBERO-Pro's
            (``envs/libero/pro.py``: "lan", "task", "with_milk", ...; ids
            ``LiberoPro-<Suite>-<Category>-v0``) or, with ``benchmark="plus"``, LIBERO-Plus's
            (``envs/libero/plus.py``: "camera", "robot", "noise", "language", "light", "background",
            "layout"; ids ``LiberoPlus-<Suite>-<Category>-v0``; init state 0 of each variant by default).
        benchmark: "pro" (the default) or "plus": whose ``category``.
        camera_view, robot_pose, sensor_noise, lighting: LIBERO-Plus's code-level perturbations as
            options, on every task of the env (any suite or category; ``envs/libero/plus.py``): the
            agent-view camera moved by the view parameters (H, V, S, R, E) (degrees about z, degrees of
            tilt, distance in % of LIBERO's, degrees of aim about z and y), the arm started at
            LIBERO-Plus's pose 1-500, the agent-view image corrupted at noise level 1-50
            (``envs/libero/plus_noise.py``, seeded per episode), the scene re-lit as light variant
            1-500 (ours: LIBERO-Plus's light scenes are not on PyPI; every camera sees it). They replace
            a variant's own. None: as the task says.
        num_envs: number of parallel envs.
        chunk_size: actions per step (K); None for a plain (7,) action space.
        image_size: camera size in pixels: an int (square) or (height, width). A non-square size
            renders a square of the larger side and stretches it bilinearly to (height, width), as
            the Cosmos world model's 256x320 frames were made from 256x256 LIBERO renders.
        proprio: include ``proprio`` in the observations (world-model envs have none).
        cameras: subset of ("agentview", "wrist"); () gives state-only envs that never render.
        task_ids: the suite's tasks to use (positions in the suite; default all).
        init_states: the init-state indices to use for every task (default all 50), e.g.
            ``range(40)`` for training and ``range(40, 50)`` held out for evaluation.
        steps_after_success: keep running the policy's actions this many sub-steps after the first
            success before the episode terminates (still within the step limit), e.g. to record
            frames of solved scenes for a success classifier (``trainers.reward_model``). The
            reward stays 1.0 at the first success only; ``success`` per sub-step and in the episode
            statistics is the check at that sub-step (the scene can be un-solved again).
        object_state_in_info: put the simulator's object poses in ``info["object_state"]``.
        restart_frames_in_info: put in ``info["restart_frame"]``, for every env that ran, an
            ``InitialFrame`` from which a reset continues its episode where the chunk left it: the
            MuJoCo state, the gripper's integrated command, the episode's sub-step count (in
            ``task_state`` and against the step limit: the restarted episode gets what was left of
            it) and the scene seed, in ``meta["resume"]``; nothing settles. ``meta["from_restart"]``
            says whether that episode itself began at a restart frame. The continuation steps as the
            episode would have (``tests/test_libero_restarts.py``); its first observation is read a
            sub-step later than the episode's own was sampled. Model-level state that no
            LIBERO-Spatial or -Object task changes (site colours of a switched-on stove) is not
            restored. E.g. to restart training episodes where failed ones went wrong.
        task_state: add the observation ``task_state``, the privileged state that scripted
            policies read (``envs/libero/task_state.py``: goal object and target poses, gripper).
        envs_per_worker: simulators per worker process.
        context: multiprocessing start method for the workers.
        warm_forkserver: with the ``forkserver`` context, when the process's forkserver has not
            started yet, add ``envs.libero.preload`` to what it imports first (robosuite, LIBERO and
            one compiled scene, ~7 s once per process): every worker forked from it then builds its
            first scene in ~1 s instead of 3-4 s. The forkserver serves the whole process, so other
            forkserver children in it share that memory too.
        render_gpus: GPU ids to spread EGL rendering over (default: all visible CUDA GPUs; none on CPU).
        step_timeout_s, reset_timeout_s: how long a worker may take to answer a chunk step / a reset
            (which may build a scene) before it counts as hung and is restarted (its envs truncated
            with ``worker_restarted``). Defaults: ``20 + 0.5 * K * envs_per_worker`` seconds for a
            step (24 s at K = 8), ``120 + 30 * envs_per_worker`` for a reset; about 10x what a loaded
            2-core machine needs.
    """

    def __init__(
        self,
        suite: str = "spatial",
        num_envs: int = 1,
        *,
        category: str | None = None,
        benchmark: str = "pro",
        camera_view: Sequence[int] | None = None,
        robot_pose: int | None = None,
        sensor_noise: int | None = None,
        lighting: int | None = None,
        chunk_size: int | None = 8,
        image_size: int | tuple[int, int] = 128,
        proprio: bool = True,
        cameras: Sequence[str] = CAMERAS,
        upright: bool = True,
        settle_steps: int = 10,
        scene_seed: int | None = 0,
        task_ids: Sequence[int] | None = None,
        init_states: Sequence[int] | None = None,
        max_episode_steps: int | None = None,
        steps_after_success: int = 0,
        include_instruction: bool = True,
        object_state_in_info: bool = False,
        restart_frames_in_info: bool = False,
        task_state: bool = False,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        fast_reset: bool = True,
        max_cached_scenes: int = 1,
        envs_per_worker: int = 1,
        context: str = "forkserver",
        warm_forkserver: bool = True,
        render_gpus: Sequence[int] | None = None,
        render_mode: str | None = "rgb_array",
        env_id: str | None = None,
        step_timeout_s: float | None = None,
        reset_timeout_s: float | None = None,
    ) -> None:
        env_id = env_id or f"Libero-{suite.capitalize()}-v0"
        cameras = tuple(cameras)
        if not set(cameras) <= set(CAMERAS) or (cameras and cameras[0] != "agentview"):
            raise BadInput(f"{env_id}: cameras must be (), ('agentview',) or {CAMERAS}, got {cameras}")
        hw = check_image_size(env_id, image_size)
        check_int(env_id, "settle_steps", settle_steps, low=0)
        check_int(env_id, "scene_seed", scene_seed, low=0, none_ok=True)
        check_int(env_id, "max_episode_steps", max_episode_steps, low=1, none_ok=True)
        check_int(env_id, "steps_after_success", steps_after_success, low=0)
        check_int(env_id, "max_cached_scenes", max_cached_scenes, low=1)
        check_int(env_id, "envs_per_worker", envs_per_worker, low=1)
        for name, value in (("step_timeout_s", step_timeout_s), ("reset_timeout_s", reset_timeout_s)):
            if value is not None:
                check_float(env_id, name, value, low=0.01)
        self.perturbation = _perturbation_options(env_id, camera_view, robot_pose, sensor_noise, lighting)
        if benchmark not in ("pro", "plus"):
            raise BadInput(
                f"{env_id}: benchmark must be 'pro' (LIBERO-Pro) or 'plus' (LIBERO-Plus), got {benchmark!r}"
            )
        if category is None:
            tasks = suite_tasks(suite)
        else:
            from envs.libero.plus import plus_tasks
            from envs.libero.pro import pro_tasks

            try:
                tasks = list((plus_tasks if benchmark == "plus" else pro_tasks)(suite, category))
            except ValueError as e:
                raise BadInput(f"{env_id}: {e}") from None
            if benchmark == "plus" and init_states is None:
                init_states = [0]  # LIBERO-Plus runs each variant once, from init state 0
        all_tasks = tasks
        if task_ids is not None:
            bad = [
                i
                for i in task_ids
                if not isinstance(i, int | np.integer) or isinstance(i, bool) or not 0 <= i < len(tasks)
            ]
            if bad:
                raise BadInput(f"{env_id}: task_ids must be in [0, {len(tasks)}), got {bad}")
            tasks = [tasks[i] for i in task_ids]
        broken = [t for t in tasks if t.problem]
        if broken:
            usable = [i for i, t in enumerate(all_tasks) if not t.problem]
            raise BadInput(
                f"{env_id}: {len(broken)} of its tasks cannot be built: "
                + "; ".join(f"task {t.index}: {t.problem}" for t in broken[:3])
                + (f"; and {len(broken) - 3} more" if len(broken) > 3 else "")
                + f". Choose others with task_ids (these can be built: {usable or 'none'})"
            )
        self.category = category or ""
        self.benchmark = benchmark if category else ""
        try:
            frames = LiberoInitialFrames(tasks, init_states)
        except ValueError as e:
            raise BadInput(f"{env_id}: {e}") from None
        obs_space = observation_space(
            image_size=hw if cameras else None,
            wrist="wrist" in cameras,
            proprio_dim=PROPRIO_DIM if proprio else 0,
            proprio_fields=PROPRIO_FIELDS,
            proprio_bound=10.0,  # metres and radians: eef position, axis-angle, finger positions
            instruction=include_instruction,
        )
        if task_state:
            obs_space.spaces["task_state"] = FieldBox(-1e4, 1e4, TASK_STATE_FIELDS)
        self.suite = suite  # before the base class: it checks frames with it
        super().__init__(
            env_id=env_id,
            num_envs=num_envs,
            single_observation_space=obs_space,
            action_low=-np.ones(ACTION_DIM),
            action_high=np.ones(ACTION_DIM),
            chunk_size=chunk_size,
            initial_frames=frames,
            autoreset_mode=autoreset_mode,
            render_mode=render_mode,
        )
        sub_steps = (self.chunk_size or 1) * envs_per_worker  # chunk_size checked by the base class
        self.step_timeout_s = float(step_timeout_s or 20 + 0.5 * sub_steps)
        self.reset_timeout_s = float(reset_timeout_s or 120 + 30 * envs_per_worker)
        self.scene_seed = scene_seed
        self.max_episode_steps_override = max_episode_steps
        self.steps_after_success = int(steps_after_success)
        self.object_state_in_info = object_state_in_info
        self.restart_frames_in_info = bool(restart_frames_in_info)
        self.record_frames = False
        self._objects: list[dict | None] = [None] * self.num_envs
        self._scene_seeds = np.zeros(self.num_envs, np.int64)  # each env's episode, for its restart frames
        sim_kwargs = dict(
            image_size=(int(hw[0]), int(hw[1])),
            cameras=cameras,
            upright=upright,
            settle_steps=settle_steps,
            fast_reset=fast_reset,
            max_cached_scenes=max_cached_scenes,
            task_state=task_state,
            object_state=object_state_in_info,
        )
        check_memory(self.num_envs * ENV_BYTES, f"{env_id}: num_envs={self.num_envs} (at least 300 MB each)")
        gpus = list(render_gpus) if render_gpus is not None else _default_render_gpus()
        if context == "forkserver" and warm_forkserver:
            _preload_in_forkserver("envs.libero.preload")
        self.pool = WorkerPool(
            functools.partial(_Slot, sim_kwargs),
            self.num_envs,
            envs_per_worker=envs_per_worker,
            context=context,
            worker_environ=functools.partial(_worker_environ, gpus),
            name=env_id,
        )

    # ---------------------------------------------------------------- backend hooks
    def _check_frame(self, frame: InitialFrame) -> str | None:
        task = find_task(frame.task)
        if task is None:
            return "a frame whose task is a LIBERO task key '<suite>/<task name>'"
        suites = SUITES[self.suite]
        if self.category:
            infix = "_plus_" if self.benchmark == "plus" else "_"
            suites = (f"{_BASE_SUITES[self.suite]}{infix}{self.category}",)
        if task.suite not in suites:
            return f"a frame of a {' or '.join(suites)} task (this env's suite), got a {task.suite} frame"
        expected = load_init_states(task).shape[1]
        if frame.sim_state is None or frame.sim_state.shape != (expected,):
            got = None if frame.sim_state is None else frame.sim_state.shape
            return f"a sim_state of shape ({expected},) for {frame.task} (got {got})"
        if not np.all(np.abs(frame.sim_state) <= SIM_STATE_BOUND):  # NaN fails too
            worst = frame.sim_state[np.argmax(np.nan_to_num(np.abs(frame.sim_state), nan=np.inf))]
            return f"a finite sim_state within +-{SIM_STATE_BOUND:g} (got {worst})"
        if "resume" in frame.meta:
            return self._resume_problem(frame)
        return None

    def _resume_problem(self, frame: InitialFrame) -> str | None:
        """What is wrong with a restart frame's ``meta["resume"]`` (None: nothing)."""
        resume = frame.meta["resume"]
        expected = (
            "a restart frame's meta['resume'] of {'gripper_state': values in [-1, 1], 'sample_clock': "
            "[time >= 0, 0 or 1], 'episode_step': an int below the step limit "
            f"{self._full_limit(frame)}, 'scene_seed': an int >= 0}}"
        )
        keys = {"gripper_state", "sample_clock", "episode_step", "scene_seed"}
        if not isinstance(resume, dict) or set(resume) != keys:
            return f"{expected} (got {resume!r:.200})"
        grip = np.asarray(resume["gripper_state"], dtype=object)
        clock = np.asarray(resume["sample_clock"], dtype=object)
        ints = [resume["episode_step"], resume["scene_seed"]]
        real = (float, int, np.floating, np.integer)
        if (
            grip.ndim != 1
            or not all(isinstance(g, real) and -1 <= g <= 1 for g in grip)
            or clock.shape != (2,)
            or not all(isinstance(c, real) for c in clock)
            or not (0 <= clock[0] < 1)
            or clock[1] not in (0, 1)
            or not all(isinstance(i, int | np.integer) and not isinstance(i, bool) for i in ints)
            or not 0 <= resume["episode_step"] < self._full_limit(frame)
            or resume["scene_seed"] < 0
        ):
            return f"{expected} (got {resume!r:.200})"
        return None

    def _full_limit(self, frame: InitialFrame) -> int:
        return self.max_episode_steps_override or find_task(frame.task).max_episode_steps

    def _max_episode_steps(self, frame: InitialFrame) -> int:
        """The step limit; a restart frame's episode gets what its episode had left."""
        resume = frame.meta.get("resume")
        return self._full_limit(frame) - (int(resume["episode_step"]) if resume else 0)

    def _reset_envs(self, env_ids: np.ndarray, frames: list[InitialFrame]) -> dict[str, np.ndarray]:
        resumes = [f.meta.get("resume") for f in frames]  # restart frames (checked by _check_frame)
        seeds = [int(r["scene_seed"]) if r else self._scene_seed() for r in resumes]
        tasks = [find_task(f.task) for f in frames]
        if self.perturbation:  # the options replace what a variant says
            tasks = [
                replace(t, perturbation=tuple(sorted({**dict(t.perturbation), **self.perturbation}.items())))
                for t in tasks
            ]
        args = [
            (t, f.sim_state, s, self.object_state_in_info, r)
            for t, f, s, r in zip(tasks, frames, seeds, resumes, strict=True)
        ]
        try:
            results, crashed = self.pool.call("reset", env_ids, args, self.reset_timeout_s)
            retry = np.flatnonzero(crashed)
            if len(retry):  # the restarted workers get one more try
                again, crashed_again = self.pool.call(
                    "reset", env_ids[retry], [args[p] for p in retry], self.reset_timeout_s
                )
                if crashed_again.any():
                    dead = env_ids[retry[crashed_again]].tolist()
                    raise RuntimeError(f"{self.env_id}: workers of envs {dead} died twice in reset")
                for p, res in zip(retry, again):
                    results[p] = res
        except Exception:
            # Some simulators of the call may be at their new start, others not: none of them is
            # where the bookkeeping says. All are lost: the next step truncates them
            # (worker_restarted) and they start again at their next reset.
            self.pool.lost.update(int(i) for i in env_ids)
            raise
        self.pool.lost.difference_update(int(i) for i in env_ids)
        self._scene_seeds[env_ids] = seeds
        for i, res in zip(env_ids, results):
            self._objects[i] = res["objects"]
        return self._stack([r["obs"] for r in results])

    def _step_envs(self, env_ids: np.ndarray, actions: np.ndarray, max_steps: np.ndarray) -> ChunkResult:
        n, k = actions.shape[:2]
        lost = np.array([int(i) in self.pool.lost for i in env_ids])
        live = np.flatnonzero(~lost)
        args = [
            (
                actions[p].astype(np.float64),
                int(max_steps[p]),
                self.record_frames,
                self.object_state_in_info,
                self.steps_after_success,
                self.restart_frames_in_info,
            )
            for p in live
        ]
        results, crashed_live = self.pool.call("run_chunk", env_ids[live], args, self.step_timeout_s)
        crashed = lost.copy()
        crashed[live] = crashed_live
        rewards = np.zeros((n, k), np.float32)
        success = np.zeros((n, k), bool)
        valid = np.zeros((n, k), bool)
        ended = np.zeros(n, bool)
        obs = {key: self._obs[key][env_ids].copy() for key in self._array_keys}  # kept where crashed
        frames = np.full(n, None, dtype=object)
        restart = np.full(n, None, dtype=object)
        for p, res in zip(live, results):
            if res is None:
                continue
            if res["restart"] is not None:
                restart[p] = self._restart_frame(int(env_ids[p]), res["restart"])
            out = res["out"]
            rewards[p], success[p], valid[p, : out.executed] = out.rewards, out.success, True
            ended[p] = out.ended
            for key in self._array_keys:
                obs[key][p] = out.obs[key]
            frames[p] = out.frames
            self._objects[env_ids[p]] = res["objects"]
        info: dict[str, np.ndarray] = {}
        if self.category:
            info["category"] = np.full(n, self.category, dtype=object)
        if self.record_frames:
            info["frames"] = frames
        if self.object_state_in_info:
            info["object_state"] = np.empty(n, dtype=object)
            info["object_state"][:] = [self._objects[i] for i in env_ids]
        if self.restart_frames_in_info:
            info["restart_frame"] = restart
        return ChunkResult(obs, rewards, valid, success, ended, info, crashed)

    def _restart_frame(self, env: int, point: dict[str, Any]) -> InitialFrame:
        """A frame continuing env ``env``'s episode from ``point`` (``LiberoSim.restart_point``)."""
        start = self._frames[env]
        meta = {k: v for k, v in start.meta.items() if k not in ("resume", "from_restart")}
        meta["from_restart"] = "resume" in start.meta  # this episode itself began at a restart frame
        meta["resume"] = {
            "gripper_state": [float(g) for g in point["gripper_state"]],
            "sample_clock": [float(c) for c in point["sample_clock"]],
            "episode_step": int(point["episode_step"]),
            "scene_seed": int(self._scene_seeds[env]),
        }
        return InitialFrame(start.instruction, task=start.task, sim_state=point["sim_state"], meta=meta)

    # ---------------------------------------------------------------- helpers
    def _scene_seed(self) -> int:
        return int(self.np_random.integers(2**31)) if self.scene_seed is None else int(self.scene_seed)

    def _stack(self, per_env: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {key: np.stack([o[key] for o in per_env]) for key in self._array_keys}

    def close_extras(self, **kwargs: Any) -> None:
        if getattr(self, "pool", None) is not None:
            self.pool.close()
            self.pool = None
