"""One LIBERO scene living in the current process (a worker process; never pickled).

Exactness of the fast reset. The reference reset of a scene is
``np.random.seed(scene_seed); env.reset()`` (robosuite hard reset: new MJCF, MjModel, MjData) then
``env.set_init_state(init_state)`` and ``settle_steps`` no-op steps. The fast path keeps the
compiled model and calls robosuite's soft reset (``hard_reset=False``: ``mj_resetData`` plus the
same re-sampling code). Three pieces of state survive a soft reset but not a hard one, and each
changes the scene:

* the Panda gripper's ``current_action``: the gripper command is integrated over sub-steps
  (``current_action += speed * sign(a)``), starting from 0 in a freshly built robot; after a soft
  reset it started from the previous episode's value (this is the "first episode differs" effect);
* LIBERO's ``object_property_initializers`` list (drawer/door/knob samplers): every model load
  *appends* to it, so a hard reset draws more random numbers than the last one, shifting the
  fixture placement (numpy's global RNG) by the number of earlier hard resets;
* ``model.site_rgba``: site visibility is toggled in place (robosuite hides with ``-a``, LIBERO's
  stove burner toggles with ``1 - a``), so alphas drift across episodes that turn a stove on;
* the fixtures' ``model.body_pos`` / ``body_quat`` (cabinet, stove, ...): a reset places them there, and
  a soft reset starts from the last episode's placement instead of the compiled pose (the origin).
  LIBERO's site samplers (``On obj fixture_site``, ``In obj fixture_region``) add the fixture's new
  pose to the site's *world* position, read before the fixtures move, so they are right only with
  the fixtures at their compiled pose; from a placed fixture they double its offset (a bowl "on the
  stove" lands ~25 cm behind it and ~0.9 m up).

They are normalised before every reset, soft or hard, to the state of the first reset after
construction (fresh gripper; the samplers of two model loads; compiled site colours; fixtures at
their compiled pose). After that, mjModel and mjData after a soft reset equal those after a hard one
(checked field by field; tests/test_libero_fresh.py checks the reset state itself).
Fixture placement is re-drawn from
``np.random.seed(scene_seed)`` in both paths, so a cached scene serves any seed. The caller's
global numpy RNG state is restored afterwards.

Stepping and rendering. ``env.step`` runs through ``envs.libero.fast_step.FastStep``: the same
floating-point operations as robosuite's step without its per-sub-step Python (see that module).
Scenes are built with robosuite's camera observations off, so a step never renders; the MuJoCo data
is copied at the instant robosuite would have sampled its observations, and images are rendered from
that copy (same MuJoCo calls as robosuite's renderer) once per chunk, so they are bit-identical to the
camera observations of a plain ``OffScreenRenderEnv.step``.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import glob
import logging
import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.core.images import resize_bilinear, to_uint8
from envs.libero.suites import LiberoTask
from nets.errors import BadInput

CAMERAS: dict[str, tuple[str, str]] = {  # our camera name -> (MuJoCo camera, observation key)
    "agentview": ("agentview", "image"),
    "wrist": ("robot0_eye_in_hand", "wrist_image"),
}
NOOP_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])  # no motion, gripper open
PROPRIO_OBSERVABLES = ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")  # what _observe reads


_libmujoco: Any = None


def _release_build_memory() -> None:
    """Return what compiling a model leaves behind (the compiled model stays): about 600 MB of a
    LIBERO scene's 950.

    ``mujoco.MjModel.from_xml_string`` (robosuite's way in) keeps the parsed spec, decoded textures
    and meshes included (~370 MB), for ``mj_saveLastXML`` until the next load; ``mj_freeLastXML``
    (not in the Python bindings: called through ctypes) frees it, after which robosuite's
    ``sim.model.get_xml()`` no longer works (nothing here uses it). ``malloc_trim`` hands the heap
    pages the compiler freed back to the OS. Compiled models and simulation are unchanged.
    """
    global _libmujoco
    if _libmujoco is None:
        import mujoco

        libs = glob.glob(os.path.join(os.path.dirname(mujoco.__file__), "libmujoco.so*"))
        _libmujoco = ctypes.CDLL(libs[0]) if libs else False  # the library already loaded
    free_last_xml = getattr(_libmujoco, "mj_freeLastXML", None) if _libmujoco else None
    if free_last_xml is not None:  # absent from other MuJoCo builds: then only the trim below
        free_last_xml()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@dataclass
class ChunkOutcome:
    obs: dict[str, np.ndarray]
    rewards: np.ndarray  # float32 [k]: 1.0 at the success sub-step, else 0
    success: np.ndarray  # bool [k]
    executed: int  # sub-steps actually run (<= min(k, max_steps))
    frames: list[np.ndarray] | None  # agentview after each executed sub-step (record_frames=True)
    ended: bool = False  # the episode terminated in this chunk (success, plus steps_after_success)


def quat_xyzw_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """Axis-angle (axis * angle, angle = 2 acos(w) in [0, 2pi]) of an xyzw quaternion.

    Same convention as the LIBERO state used by OpenVLA/openpi (no shortest-arc wrapping)."""
    q = np.asarray(quat, dtype=np.float64)
    w = float(np.clip(q[3], -1.0, 1.0))
    s = np.sqrt(1.0 - w * w)
    if np.isclose(s, 0.0):
        return np.zeros(3)
    return q[:3] * (2.0 * np.arccos(w) / s)


_robosuite_quieted = False


def _import_libero() -> Any:
    """Import LIBERO's env module once, with its config in place and robosuite's noise filtered."""
    global _robosuite_quieted
    if not _robosuite_quieted:
        from envs.libero.install import ensure_config

        ensure_config()
        os.environ.setdefault("MUJOCO_GL", "egl")

        class _NoMacroNag(logging.Filter):  # "No private macro file found!" and its two follow-ups
            def filter(self, record: logging.LogRecord) -> bool:
                return "macro" not in record.getMessage()

        logging.getLogger("robosuite_logs").addFilter(_NoMacroNag())
        _robosuite_quieted = True
    from libero.libero.envs import env_wrapper

    return env_wrapper


_live_renderers: weakref.WeakSet[_Renderer] = weakref.WeakSet()
_atexit_registered = False


def _close_live_renderers() -> None:
    for renderer in list(_live_renderers):
        renderer.close()


class _Renderer:
    """Offscreen MuJoCo renderer with exactly robosuite's settings (MjRenderContext)."""

    def __init__(self, model: Any, size: int) -> None:
        import mujoco
        from robosuite.utils import binding_utils

        self.model = model
        if size > model.vis.global_.offwidth or size > model.vis.global_.offheight:
            model.vis.global_.offwidth = max(size, model.vis.global_.offwidth)
            model.vis.global_.offheight = max(size, model.vis.global_.offheight)
        global _atexit_registered
        self.gl = binding_utils.GLContext(max_width=640, max_height=480, device_id=-1)
        if not _atexit_registered:
            # Registered after robosuite's atexit eglTerminate (first context), so it runs before
            # it: no EGLError noise at exit when a LiberoSim was not closed.
            atexit.register(_close_live_renderers)
            _atexit_registered = True
        _live_renderers.add(self)
        self.gl.make_current()
        self.con = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.con)
        self.scn = mujoco.MjvScene(model, maxgeom=1000)
        self.cam = mujoco.MjvCamera()
        self.cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self.vopt = mujoco.MjvOption()
        self.vopt.geomgroup[0] = 0  # collision meshes off (robosuite: render_collision_mesh=False)
        self.vopt.geomgroup[1] = 1  # visual meshes on
        self.pert = mujoco.MjvPerturb()
        self.pert.active = 0
        self.pert.select = 0
        self.pert.skinselect = -1
        self.size = size

    def render(self, data: Any, camera: str) -> np.ndarray:
        """Raw robosuite image (OpenGL convention: upside down), uint8 [size, size, 3]."""
        import mujoco

        self.gl.make_current()  # several cached scenes may each hold a context
        self.cam.fixedcamid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        mujoco.mjv_updateScene(
            self.model, data, self.vopt, self.pert, self.cam, mujoco.mjtCatBit.mjCAT_ALL, self.scn
        )
        viewport = mujoco.MjrRect(0, 0, self.size, self.size)
        mujoco.mjr_render(viewport, self.scn, self.con)
        rgb = np.empty((self.size, self.size, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(rgb, None, viewport, self.con)
        return rgb

    def close(self) -> None:
        if self in _live_renderers:
            _live_renderers.discard(self)
            self.gl.make_current()
            self.con.free()
            self.gl.free()


def _compiled_fixture_poses(inner: Any) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Body id -> (pos, quat wxyz) of each LIBERO fixture's root body as the MJCF compiles it (what a
    hard reset's model has before the placement sampler moves it)."""
    poses = {}
    for fixture in inner.fixtures_dict.values():
        element = inner.model.worldbody.find(f"./body[@name='{fixture.root_body}']")
        if element is None or any(k in element.attrib for k in ("euler", "axisangle", "xyaxes", "zaxis")):
            raise RuntimeError(f"fixture body {fixture.root_body} is not a plain worldbody child")
        pos = np.array(element.get("pos", "0 0 0").split(), dtype=np.float64)
        quat = np.array(element.get("quat", "1 0 0 0").split(), dtype=np.float64)
        poses[inner.sim.model.body_name2id(fixture.root_body)] = (pos, quat / np.linalg.norm(quat))
    return poses


class _Scene:
    """A built LIBERO env plus what we keep next to it."""

    def __init__(self, task: LiberoTask) -> None:
        env_wrapper = _import_libero()  # first: it quiets robosuite's import-time warnings

        self.env = env_wrapper.ControlEnv(
            bddl_file_name=task.bddl_file,
            use_camera_obs=False,  # we render ourselves, once per chunk
            has_renderer=False,
            has_offscreen_renderer=False,  # no GL context unless we render (see _Renderer)
            ignore_done=True,  # robosuite's 1000-step horizon never ends an episode
        )
        self.inner = self.env.env
        _release_build_memory()
        self.base_inits = list(self.inner.object_property_initializers)  # one model load's worth
        self.site_rgba = self.inner.sim.model._model.site_rgba.copy()  # as compiled from the MJCF
        self.fixture_poses = _compiled_fixture_poses(self.inner)  # construction's reset moved them
        self.renderer: _Renderer | None = None
        self.raw_obs: dict[str, Any] = {}
        self.stepper: Any = None  # a FastStep, made after each reset (robosuite remakes the controller)
        self._snapshot: Any = None  # MjData the stepper copies into at observation instants
        self._snapshot_model: Any = None
        self._camera_default: tuple[Any, np.ndarray, np.ndarray] | None = None  # model, agentview pos, quat
        # model, its light fields, its headlight ambient
        self._light_default: tuple[Any, dict[str, np.ndarray], np.ndarray] | None = None

    def reset(self, seed: int, hard: bool) -> None:
        from robosuite.utils.errors import RandomizationError

        inner = self.inner
        np.random.seed(seed)
        while True:
            # Normalise the Python state that a soft reset would otherwise carry over (module doc).
            # A hard reset appends one more model load's samplers itself.
            inner.object_property_initializers[:] = self.base_inits * (1 if hard else 2)
            if not hard:  # site alphas are toggled in place (robosuite: -a, LIBERO's burner: 1 - a)
                model = inner.sim.model._model
                model.site_rgba[:] = self.site_rgba
                for body, (pos, quat) in self.fixture_poses.items():  # where a rebuilt model has them
                    model.body_pos[body] = pos
                    model.body_quat[body] = quat
            for robot in inner.robots:
                if robot.has_gripper:
                    robot.gripper.current_action = np.zeros(robot.gripper.dof)
            inner.hard_reset = hard
            try:
                inner.reset()
                break
            except RandomizationError:  # LIBERO's ControlEnv.reset retries the same way
                continue
        if hard:
            _release_build_memory()
        if hard and self.renderer is not None:  # the model was rebuilt
            self.renderer.close()
            self.renderer = None

    def set_camera(self, view: tuple[int, ...] | None) -> None:
        """Put the agent-view camera where LIBERO-Plus's view parameters (H, V, S, R, E) say, or back
        where the model has it (None). Takes effect at the next forward (``set_init_state``)."""
        import mujoco

        from envs.libero.plus import camera_pose

        model = self.inner.sim.model._model
        cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, CAMERAS["agentview"][0])
        if self._camera_default is None or self._camera_default[0] is not model:  # a new model
            self._camera_default = (model, model.cam_pos[cam].copy(), model.cam_quat[cam].copy())
        pos, quat = self._camera_default[1:] if view is None else camera_pose(*view)
        model.cam_pos[cam] = pos
        model.cam_quat[cam] = np.asarray(quat) / np.linalg.norm(quat)

    def set_light(self, variant: int | None) -> None:
        """Re-light the scene as light variant ``variant`` says (``envs/libero/plus.py``: ``lighting``),
        or back as the model has it (None). Takes effect at the next forward (``set_init_state``)."""
        from scipy.spatial.transform import Rotation

        from envs.libero.plus import PIVOT, lighting

        model = self.inner.sim.model._model
        if self._light_default is None or self._light_default[0] is not model:  # a new model
            fields = ("light_diffuse", "light_specular", "light_pos", "light_dir", "light_castshadow")
            lights = {f: getattr(model, f).copy() for f in fields}
            self._light_default = (model, lights, model.vis.headlight.ambient.copy())
        _, default, ambient = self._light_default
        for field, value in default.items():
            getattr(model, field)[:] = value
        model.vis.headlight.ambient[:] = ambient
        if variant is None:
            return
        light = lighting(variant)
        turn = Rotation.from_euler("z", light.azimuth, degrees=True) * Rotation.from_euler(
            "y", light.tilt, degrees=True
        )
        model.light_diffuse[:] = default["light_diffuse"] * light.intensity * np.asarray(light.tint)
        model.light_specular[:] = default["light_specular"] * light.intensity
        model.light_pos[:] = turn.apply(default["light_pos"] - PIVOT) + PIVOT
        model.light_dir[:] = turn.apply(default["light_dir"])
        if light.shadows:
            model.light_castshadow[:] = 1
        model.vis.headlight.ambient[:] = np.minimum(ambient + light.ambient, 1.0)

    def with_arm(self, state: np.ndarray, qpos: np.ndarray) -> np.ndarray:
        """A copy of the flattened MuJoCo ``state`` (time, qpos, qvel) with the arm's 7 joints at
        ``qpos`` and at rest."""
        model = self.inner.sim.model._model
        state = np.array(state, dtype=np.float64)
        for i, angle in enumerate(qpos):
            joint = self.inner.sim.model.joint_name2id(f"robot0_joint{i + 1}")
            state[1 + model.jnt_qposadr[joint]] = angle
            state[1 + model.nq + model.jnt_dofadr[joint]] = 0.0
        return state

    def set_init_state(self, init_state: np.ndarray, observables: tuple[str, ...] | None) -> None:
        """LIBERO's ``set_init_state`` (state, forward, forced observation), then a new stepper
        sampling ``observables`` (None: all)."""
        self.raw_obs = self.env.set_init_state(init_state)
        from envs.libero.fast_step import FastStep  # imports robosuite: after _import_libero's set-up

        self.stepper = FastStep(self.inner, observables)

    def take_snapshots(self, on: bool) -> None:
        """Copy the MuJoCo data at each observation instant (``snap``, what images and object poses
        are read from) from now on, or stop."""
        import mujoco

        model = self.inner.sim.model._model
        if on and (self._snapshot is None or self._snapshot_model is not model):
            self._snapshot, self._snapshot_model = mujoco.MjData(model), model  # one per model
            mujoco.mj_copyData(self._snapshot, model, self.inner.sim.data._data)
        self.stepper.snapshot = self._snapshot if on else None

    def step(self, action: np.ndarray) -> tuple[float, bool]:
        """LIBERO's ``env.step(action)``: (reward, done = success); observations via ``observe()``."""
        return self.stepper.step(action)

    def observe(self) -> dict[str, Any]:
        """robosuite's observations after the last step (the sampled ones)."""
        self.raw_obs = self.stepper.observations()
        return self.raw_obs

    @property
    def snap(self) -> Any:
        """MuJoCo data at the instant of the last observation (``take_snapshots``)."""
        return None if self.stepper is None else self.stepper.snapshot

    def render(self, camera: str, size: int) -> np.ndarray:
        if self.renderer is None:
            self.renderer = _Renderer(self.inner.sim.model._model, size)
        return self.renderer.render(self.snap, camera)

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None
        self.stepper = self._snapshot = self._snapshot_model = None
        self.env.close()


class LiberoSim:
    """One LIBERO scene in this process; scenes are built lazily and kept in a small LRU cache."""

    def __init__(
        self,
        *,
        image_size: int | tuple[int, int] = 128,
        cameras: tuple[str, ...] = ("agentview", "wrist"),
        upright: bool = True,
        settle_steps: int = 10,
        fast_reset: bool = True,
        max_cached_scenes: int = 1,
        task_state: bool = False,
        object_state: bool = False,
    ) -> None:
        """``object_state``: keep every robosuite observable up to date (what ``object_state()``
        reads); otherwise each step samples only the robot observables the observation reads."""
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise BadInput(f"unknown cameras {unknown}; valid: {list(CAMERAS)}")
        if max_cached_scenes < 1:
            raise BadInput("max_cached_scenes must be >= 1")
        self.image_size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.cameras = tuple(cameras)
        self.upright = upright
        self.settle_steps = settle_steps
        self.fast_reset = fast_reset
        self.max_cached_scenes = max_cached_scenes
        self.task_state = task_state
        self.object_state_on = object_state
        self._task_state: Any = None  # TaskStateBuilder of the current episode (task_state=True)
        self._episode_step = 0
        self._first_success: int | None = None  # episode step of the first successful sub-step
        self._scenes: OrderedDict[str, _Scene] = OrderedDict()  # bddl file -> scene, LRU order
        self._scene: _Scene | None = None  # the scene of the current episode
        self._noise = 0  # LIBERO-Plus sensor-noise level of the episode (0: none), and its RNG
        self._noise_rng = np.random.default_rng(0)

    def __getstate__(self) -> None:
        raise TypeError("LiberoSim holds a simulator and a GL context; create it inside the worker")

    # -- episode API ------------------------------------------------------------------------------

    def reset(
        self, task: LiberoTask, init_state: np.ndarray, scene_seed: int, resume: dict[str, Any] | None = None
    ) -> dict[str, np.ndarray]:
        """Put ``task`` in ``init_state`` (fixture layout from ``scene_seed``), settle, observe.

        ``resume`` (a ``restart_point()`` taken mid-episode, with that episode's ``scene_seed``)
        continues that episode instead: the gripper's integrated command, the observables' clock and
        the episode's step count come back, the controller reads its next goal from this state as
        after a step, and nothing settles or moves the arm (a LIBERO-Plus robot pose applies at the
        episode's own start only; its sensor noise draws afresh)."""
        rng_state = np.random.get_state()  # construction and resets draw from numpy's global RNG
        try:
            scene = self._scenes.pop(task.bddl_file, None)
            if scene is None:
                evicted = False
                while len(self._scenes) >= self.max_cached_scenes:
                    old = self._scenes.popitem(last=False)[1]
                    old.close()
                    if old is self._scene:
                        self._scene = None
                    del old
                    evicted = True
                if evicted:  # robosuite envs are reference cycles: free the old model before the build
                    gc.collect()
                scene = _Scene(task)
            self._scenes[task.bddl_file] = scene
            self._scene = scene
            scene.reset(int(scene_seed), hard=not self.fast_reset)
            perturbation = dict(task.perturbation)  # LIBERO-Plus (envs/libero/plus.py)
            scene.set_camera(perturbation.get("camera"))
            scene.set_light(perturbation.get("light"))
            state = np.asarray(init_state, dtype=np.float64)
            if "robot" in perturbation and not resume:
                from envs.libero.plus import robot_qpos

                state = scene.with_arm(state, robot_qpos(perturbation["robot"]))
            scene.set_init_state(state, self._observables())
            scene.take_snapshots(self._snapshots())
            settle = 0 if resume else self.settle_steps
            if resume:  # as after a step: the controller's next goal from this state, the clocks
                for robot in scene.inner.robots:
                    robot.gripper.current_action = np.array(resume["gripper_state"], dtype=np.float64)
                    robot.controller.new_update = True
                for clock in scene.stepper.clocks:
                    clock._time_since_last_sample = float(resume["sample_clock"][0])
                    clock._sampled = bool(resume["sample_clock"][1])
            for _ in range(settle):
                scene.step(NOOP_ACTION.copy())
            if settle:
                scene.observe()
        finally:
            np.random.set_state(rng_state)
        self._episode_step = int(resume["episode_step"]) if resume else 0
        self._first_success = None
        self._noise = int(perturbation.get("noise", 0))
        self._noise_rng = np.random.default_rng([int(scene_seed), self._noise])
        if self.task_state:
            from envs.libero.task_state import TaskStateBuilder

            self._task_state = TaskStateBuilder(scene.inner)
        return self._observe(scene)

    def run_chunk(
        self, actions: np.ndarray, max_steps: int, record_frames: bool = False, steps_after_success: int = 0
    ) -> ChunkOutcome:
        """Run up to min(len(actions), max_steps) sub-steps; stop ``steps_after_success`` sub-steps
        after the episode's first successful one (0: right after it, LIBERO's own termination).

        ``success[i]`` is LIBERO's success check after sub-step i (it may turn false again while the
        episode keeps running); the reward is 1.0 at the episode's first success only, so a
        return is the same whatever ``steps_after_success`` is."""
        scene = self._require_scene()
        scene.take_snapshots(self._snapshots() or record_frames)
        acts = np.array(actions, dtype=np.float64)
        k = acts.shape[0]
        rewards = np.zeros(k, dtype=np.float32)
        success = np.zeros(k, dtype=bool)
        frames: list[np.ndarray] | None = [] if record_frames else None
        executed, ended = 0, False
        for i in range(min(k, max(0, int(max_steps)))):
            # LIBERO's step returns done = _check_success() (ignore_done=True: never the horizon).
            _, done = scene.step(acts[i])
            executed += 1
            self._episode_step += 1
            if frames is not None:
                frames.append(self._image(scene, "agentview"))
            success[i] = bool(done)
            if done and self._first_success is None:
                self._first_success = self._episode_step
                rewards[i] = 1.0
            solved_for = None if self._first_success is None else self._episode_step - self._first_success
            if solved_for is not None and solved_for >= steps_after_success:
                ended = True
                break
        reuse = frames[-1].copy() if frames else None
        if executed:
            scene.observe()
        return ChunkOutcome(self._observe(scene, reuse), rewards, success, executed, frames, ended)

    def object_state(self) -> dict[str, np.ndarray]:
        """Poses for scripted policies, at the instant of the last observation.

        robosuite's low-dimensional observations (``robot0_*``; per movable object ``<obj>_pos``,
        ``<obj>_quat`` (xyzw), ``<obj>_to_robot0_eef_pos/quat``), plus per fixture ``<fixture>_pos``
        and ``<fixture>_quat`` (xyzw), plus ``<obj>_joint_qpos`` for articulated objects/fixtures.
        """
        scene = self._require_scene()
        if not self.object_state_on:
            raise RuntimeError("object_state() needs LiberoSim(object_state=True) (every observable sampled)")
        out = {k: np.array(v) for k, v in scene.raw_obs.items() if np.ndim(v) > 0 and k != "image-state"}
        inner = scene.inner
        data = scene.snap if scene.snap is not None else inner.sim.data._data
        for name in inner.fixtures_dict:
            body = inner.obj_body_id[name]
            out[f"{name}_pos"] = np.array(data.xpos[body])
            out[f"{name}_quat"] = np.array(data.xquat[body][[1, 2, 3, 0]])
        model = inner.sim.model
        for name, obj in {**inner.objects_dict, **inner.fixtures_dict}.items():
            hinges = [j for j in obj.joints if model._model.jnt_type[model.joint_name2id(j)] >= 2]
            if hinges:
                out[f"{name}_joint_qpos"] = np.array(
                    [data.qpos[model.get_joint_qpos_addr(j)] for j in hinges], dtype=np.float64
                )
        return out

    def restart_point(self) -> dict[str, Any]:
        """What ``reset(..., resume=)`` needs to continue the current episode from here:
        ``sim_state``, the gripper's integrated command, the observables' sampling clock and the
        episode's sub-step count. The continuation steps exactly as the episode would have; its
        first observation is read at this state, where the episode's own was sampled a sub-step
        earlier (robosuite samples before the last sub-step's integration)."""
        scene = self._require_scene()
        clock = scene.stepper.clocks[0]
        return {
            "sim_state": self.sim_state(),
            "gripper_state": np.array(scene.inner.robots[0].gripper.current_action, dtype=np.float64),
            "sample_clock": [float(clock._time_since_last_sample), float(clock._sampled)],
            "episode_step": self._episode_step,
        }

    def sim_state(self) -> np.ndarray:
        """Flattened MuJoCo state [time, qpos, qvel], the format of LIBERO's init states."""
        return np.asarray(self._require_scene().env.get_sim_state(), dtype=np.float64).copy()

    def close(self) -> None:
        while self._scenes:
            self._scenes.popitem()[1].close()
        self._scene = None

    # -- helpers ------------------------------------------------------------------------------------

    def _observables(self) -> tuple[str, ...] | None:
        """The robosuite observables each step samples: all (None) for ``object_state()``, else the
        ones ``_observe`` reads."""
        return None if self.object_state_on else PROPRIO_OBSERVABLES

    def _snapshots(self) -> bool:
        """Whether steps copy the MuJoCo data at observation instants: for images and object poses."""
        return bool(self.cameras) or self.object_state_on

    def _require_scene(self) -> _Scene:
        if self._scene is None:
            raise RuntimeError("LiberoSim.reset() must be called first")
        return self._scene

    def _image(self, scene: _Scene, camera: str) -> np.ndarray:
        img = scene.render(CAMERAS[camera][0], max(self.image_size))
        if img.shape[:2] != self.image_size:  # non-square: stretch a square render
            img = to_uint8(resize_bilinear(img, self.image_size))
        return np.ascontiguousarray(img[::-1, ::-1]) if self.upright else img

    def _observe(self, scene: _Scene, agentview: np.ndarray | None = None) -> dict[str, np.ndarray]:
        obs: dict[str, np.ndarray] = {}
        for cam in self.cameras:
            if cam == "agentview" and agentview is not None:
                obs[CAMERAS[cam][1]] = agentview
            else:
                obs[CAMERAS[cam][1]] = self._image(scene, cam)
        if self._noise and "agentview" in self.cameras:  # LIBERO-Plus sensor noise: the agent view only
            from envs.libero.plus_noise import corrupt

            key = CAMERAS["agentview"][1]
            obs[key] = corrupt(obs[key], self._noise, self._noise_rng)
        raw = scene.raw_obs
        axis_angle = quat_xyzw_to_axis_angle(raw["robot0_eef_quat"])
        obs["proprio"] = np.concatenate(
            [raw["robot0_eef_pos"], axis_angle, raw["robot0_gripper_qpos"]]
        ).astype(np.float32)
        if self._task_state is not None:
            obs["task_state"] = self._task_state(scene.inner, self._episode_step)
        return obs
