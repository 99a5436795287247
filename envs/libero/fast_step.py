"""LIBERO's ``env.step`` with the same floating-point operations, without robosuite's per-sub-step Python.

One LIBERO step is 25 MuJoCo sub-steps; around each, robosuite 1.4 runs ``sim.forward()``, the OSC
controller in Python (which calls ``forward()`` again), the gripper's command integration, and a walk
over ~30 observables. ``FastStep.step`` computes the same state, bit for bit:

* **The documented split.** ``mj_step1`` (position and velocity stages), then the controller, then
  ``mj_step2`` (actuation, acceleration, constraints, Euler integration) is MuJoCo's equivalent of
  ``mj_forward`` + controller + ``mj_step`` for the Euler integrator: the controller reads only
  position- and velocity-stage quantities, and ``mj_forward`` leaves no state that ``mj_step`` reads
  (the warm start is written by the integrator only). One forward per sub-step instead of two.
* **The controller** (``OperationalSpaceController.update`` + ``run_controller``,
  ``SingleArm.control``): the same reads into arrays of the same layouts, the same numpy BLAS calls
  (``np.dot``) and the same numba functions of robosuite (``orientation_error``,
  ``opspace_matrices``, ``nullspace_torques``), called from two numba kernels instead of ~40
  Python-level numpy calls. Element-wise arithmetic is IEEE-exact in both (numba without fastmath).
  robosuite's stale first update after a reset (``new_update`` is False until the first
  ``run_controller``) is kept. The goal is set by robosuite's own ``set_goal``.
* **The gripper**: ``PandaGripper.format_action``'s clip-and-add and ``grip_action``'s rescale,
  in Python floats (the same IEEE operations).
* **Observables**: robosuite samples every observable on a clock (``Observable.update``): each
  sub-step adds ``model_timestep``, a sample is taken at the first sub-step of each period (the
  24th of 25, as robosuite's clock drifts). The clock runs here in Python floats with the same
  operations, and only the sample instants call robosuite's own ``Observable.update``: for every
  observable, or for the few the caller reads (``observables``); there the MuJoCo data may also be
  copied (``snapshot``: what images and object poses are read from), instead of ~30 observables
  walked at every sub-step.

What is not kept: robosuite's per-policy-step history buffers (``robot.recent_qpos``,
``recent_ee_forcetorques``, ...), which no LIBERO code reads. Everything else robosuite leaves behind
after a step (the controller's fields, ``robot.torques``, the gripper's ``current_action``, the
observables' clocks, ``timestep``, ``cur_time``, ``done``) is as after its own step, so LIBERO's
``env.step`` can be called in between. ``tests/test_libero_fast_step.py`` compares the MuJoCo state
after every sub-step with LIBERO's own env, byte for byte, through the scripted expert's grasps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mujoco
import numba
import numpy as np
from robosuite.utils.control_utils import nullspace_torques, opspace_matrices, orientation_error

from nets.errors import BadInput

# numba kernels (compiled once, then loaded from numba's cache in envs/libero/__pycache__)


@numba.njit(cache=True)
def _arm_state(site_xpos, site_xmat, jacp, jacr, mfull, qpos, qvel, q0, v0, n):
    """``OperationalSpaceController.update``'s copies, in its layouts (J and mass: Fortran order, as its
    fancy indexing makes them)."""
    J_pos, J_ori = np.empty((n, 3)).T, np.empty((n, 3)).T
    J_full, mass = np.empty((n, 6)).T, np.empty((n, n)).T
    for r in range(3):
        for k in range(n):
            J_pos[r, k] = J_full[r, k] = jacp[r, v0 + k]
            J_ori[r, k] = J_full[r + 3, k] = jacr[r, v0 + k]
    for r in range(n):
        for k in range(n):
            mass[r, k] = mfull[v0 + r, v0 + k]
    joint_pos, joint_vel = qpos[q0 : q0 + n].copy(), qvel[v0 : v0 + n].copy()
    return site_xpos.copy(), site_xmat.reshape(3, 3).copy(), joint_pos, joint_vel, J_pos, J_ori, J_full, mass


@numba.njit(cache=True)
def _osc_terms(goal_pos, goal_ori, ee_pos, ee_ori_mat, ee_vel, ee_ori_vel, kp, kd, mass, J_full, J_pos, J_ori):  # fmt: skip  # noqa: E501
    """``run_controller`` up to the decoupling (whose ``np.dot``s stay numpy's): lambda_pos,
    lambda_ori, the null-space matrix, the desired force and torque."""
    ori_error = orientation_error(goal_ori, ee_ori_mat)
    desired_force = (goal_pos - ee_pos) * kp[0:3] + (-ee_vel) * kd[0:3]
    desired_torque = ori_error * kp[3:6] + (-ee_ori_vel) * kd[3:6]
    _, lambda_pos, lambda_ori, nullspace = opspace_matrices(mass, J_full, J_pos, J_ori)
    return lambda_pos, lambda_ori, nullspace, desired_force, desired_torque


@numba.njit(cache=True)
def _state_and_osc(site_xpos, site_xmat, jacp, jacr, mfull, qpos, qvel, q0, v0, n, goal_pos, goal_ori, ee_vel, ee_ori_vel, kp, kd):  # fmt: skip  # noqa: E501
    """``_arm_state`` then ``_osc_terms`` (every sub-step but the policy step's): what the rest of
    the sub-step needs, (joint_pos, joint_vel, J_full, mass) + the OSC terms."""
    ee_pos, ee_ori_mat, joint_pos, joint_vel, J_pos, J_ori, J_full, mass = _arm_state(
        site_xpos, site_xmat, jacp, jacr, mfull, qpos, qvel, q0, v0, n
    )
    terms = _osc_terms(goal_pos, goal_ori, ee_pos, ee_ori_mat, ee_vel, ee_ori_vel, kp, kd, mass, J_full, J_pos, J_ori)  # fmt: skip  # noqa: E501
    return (joint_pos, joint_vel, J_full, mass) + terms


@numba.njit(cache=True)
def _arm_torques(tq, qfrc_bias, v0, mass, nullspace, initial_joint, joint_pos, joint_vel, low, high):
    """The rest of ``run_controller`` (gravity compensation, null-space torques) and
    ``SingleArm.control``'s clip to the torque limits."""
    torques = tq + qfrc_bias[v0 : v0 + tq.shape[0]]
    torques += nullspace_torques(mass, nullspace, initial_joint, joint_pos, joint_vel)
    return np.minimum(np.maximum(torques, low), high)


def unsupported_reason(env: Any) -> str | None:
    """Why ``FastStep`` cannot run this robosuite env exactly, or None if it can."""
    from libero.libero.envs.bddl_base_domain import BDDLBaseDomain
    from robosuite.controllers.osc import OperationalSpaceController
    from robosuite.environments.base import MujocoEnv
    from robosuite.environments.robot_env import RobotEnv
    from robosuite.models.grippers.panda_gripper import PandaGripper
    from robosuite.robots.manipulator import Manipulator
    from robosuite.robots.single_arm import SingleArm
    from robosuite.utils import control_utils, observables

    def owner(obj: Any, name: str, after: type | None = None) -> type | None:
        """The class whose ``name`` an attribute lookup on ``obj`` finds (past ``after`` in the MRO)."""
        mro = type(obj).__mro__
        mro = mro[mro.index(after) + 1 :] if after in mro else mro
        return next((c for c in mro if name in vars(c)), None)

    if len(getattr(env, "robots", ())) != 1:
        return f"{len(getattr(env, 'robots', ()))} robots (expected one)"
    robot = env.robots[0]
    ctl, grip = robot.controller, getattr(robot, "gripper", None)
    expected = [  # (object, method, the class it must come from, looked up past this class)
        (env, "step", BDDLBaseDomain, None), (env, "step", MujocoEnv, BDDLBaseDomain),
        (env, "_pre_action", BDDLBaseDomain, None), (env, "_pre_action", RobotEnv, BDDLBaseDomain),
        (env, "_update_observables", MujocoEnv, None), (env, "_get_observations", MujocoEnv, None),
        (robot, "control", SingleArm, None), (robot, "grip_action", Manipulator, None),
        (ctl, "run_controller", OperationalSpaceController, None),
        (ctl, "set_goal", OperationalSpaceController, None), (grip, "format_action", PandaGripper, None),
    ]  # fmt: skip
    for obj, name, cls, after in expected:
        if owner(obj, name, after) is not cls:
            return f"{type(obj).__name__}.{name} is not {cls.__name__}'s"
    if not isinstance(control_utils.opspace_matrices, numba.core.registry.CPUDispatcher):
        return "robosuite's numba is off (macros.ENABLE_NUMBA)"
    checks = {
        "OSC impedance_mode 'fixed'": ctl.impedance_mode == "fixed",
        "OSC use_delta, use_ori, uncoupling": ctl.use_delta and ctl.use_ori and ctl.uncoupling,
        "no OSC interpolators": ctl.interpolator_pos is None and ctl.interpolator_ori is None,
        "a 6-d arm action plus a 1-d gripper": ctl.control_dim == 6 and grip.dof == 1 and env.action_dim == 7,
        "two gripper actuators": len(grip.actuators) == 2,
        "contiguous arm joints": _contiguous(ctl.qpos_index) and _contiguous(ctl.qvel_index),
        "contiguous arm actuators": _contiguous(robot._ref_joint_actuator_indexes),
        "the Euler integrator": env.sim.model._model.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER,
        "no MuJoCo control callback": mujoco.get_mjcb_control() is None,
        "no viewer": env.viewer is None,
    }
    enabled = [o for o in env._observables.values() if o.is_enabled()]
    checks["observables on one clock, without delay"] = bool(enabled) and all(
        o._delayer is observables.NO_DELAY
        and o._sampling_timestep == enabled[0]._sampling_timestep
        and o._time_since_last_sample == enabled[0]._time_since_last_sample
        and o._sampled == enabled[0]._sampled
        for o in enabled
    )
    failed = [name for name, ok in checks.items() if not ok]
    return f"needs {', '.join(failed)}" if failed else None


# the controller fields ``_arm_state`` returns, in order
_CONTROLLER_STATE = (
    "ee_pos", "ee_ori_mat", "joint_pos", "joint_vel", "J_pos", "J_ori", "J_full", "mass_matrix"
)  # fmt: skip


def _contiguous(index: Any) -> bool:
    idx = [int(i) for i in index]
    return idx == list(range(idx[0], idx[0] + len(idx)))


class FastStep:
    """``env.step`` of one robosuite-1.4 LIBERO env (``ControlEnv.env``), exactly, for speed.

    Args:
        env: the robosuite env, after its reset and ``set_init_state`` (robosuite makes a new
            controller in every reset: build a ``FastStep`` after each).
        observables: the names of the observables to sample (None: all, as robosuite does). A
            subset must not read other observables' values from robosuite's ``obs_cache`` (the
            robot's ``robot0_eef_pos``, ``robot0_eef_quat``, ``robot0_gripper_qpos`` do not).
        snapshot: an ``MjData`` of the same model to copy the data into at each sample instant
            (what images and object poses are read from), or None for no copies. May be changed
            between steps.

    Raises ``NotImplementedError`` for an env it cannot reproduce exactly (``unsupported_reason``).
    ``substep_hook``, if set, is called after every MuJoCo sub-step (tests compare states there).
    """

    def __init__(self, env: Any, observables: Sequence[str] | None = None, snapshot: Any = None) -> None:
        reason = unsupported_reason(env)
        if reason is not None:
            name = type(env).__name__
            raise NotImplementedError(f"FastStep cannot reproduce {name}.step exactly: {reason}")
        self.env = env
        self.model, self.data = env.sim.model._model, env.sim.data._data
        robot = env.robots[0]
        self.robot, self.controller, self.gripper = robot, robot.controller, robot.gripper
        ctl, nv = self.controller, self.model.nv
        site = env.sim.model.site_name2id(ctl.eef_name)
        self.q0, self.v0, self.n = int(ctl.qpos_index[0]), int(ctl.qvel_index[0]), len(ctl.qvel_index)
        arm = [int(i) for i in robot._ref_joint_actuator_indexes]
        self.arm_ctrl = slice(arm[0], arm[-1] + 1)
        # site id, Jacobian and mass-matrix buffers (robosuite's update() makes them per call)
        self._buffers = (site, np.zeros((3, nv)), np.zeros((3, nv)), np.zeros((nv, nv)))
        self.wrench = np.zeros(6)
        self.torque_low, self.torque_high = robot.torque_limits
        self.grip_ids = [env.sim.model.actuator_name2id(a) for a in self.gripper.actuators]
        ctrl_range = env.sim.model.actuator_ctrlrange[self.grip_ids]
        self.grip_bias = [float(x) for x in 0.5 * (ctrl_range[:, 1] + ctrl_range[:, 0])]
        self.grip_weight = [float(x) for x in 0.5 * (ctrl_range[:, 1] - ctrl_range[:, 0])]
        self.grip_speed = [float(x) for x in np.array([-1.0, 1.0]) * self.gripper.speed]
        self.substeps = int(env.control_timestep / env.model_timestep)  # as MujocoEnv.step counts
        self.clocks = [o for o in env._observables.values() if o.is_enabled()]  # one clock (checked)
        self.period, self.dt = self.clocks[0]._sampling_timestep, env.model_timestep
        unknown = sorted(set(observables or ()) - set(env._observables))
        if unknown:
            raise BadInput(f"unknown observables {unknown}; the env has {sorted(env._observables)}")
        self.sampled = None if observables is None else [env._observables[name] for name in observables]
        self.snapshot = snapshot
        if snapshot is not None:
            mujoco.mj_copyData(snapshot, self.model, self.data)  # the last sample: set_init_state's
        self.substep_hook: Callable[[], None] | None = None

    def step(self, action: np.ndarray) -> tuple[float, bool]:
        """LIBERO's ``ControlEnv.step(action)``: returns (reward, done = task success); the
        observation is ``observations()``."""
        env, ctl = self.env, self.controller
        if env.done:
            raise BadInput("executing action in terminated episode")
        action = np.asarray(action)
        if len(action) != env.action_dim:
            raise BadInput(f"LIBERO expects a {env.action_dim}-d action, got shape {action.shape}")
        env.timestep += 1
        model, data, hook = self.model, self.data, self.substep_hook
        step1, step2, dot = mujoco.mj_step1, mujoco.mj_step2, np.dot
        jac_site, full_m, site, jacp, jacr, mfull = mujoco.mj_jacSite, mujoco.mj_fullM, *self._buffers
        qpos, qvel, wrench = data.qpos, data.qvel, self.wrench
        sx, sm, ctrl, qfrc_bias = data.site_xpos[site], data.site_xmat[site], data.ctrl, data.qfrc_bias
        q0, v0, n, arm_ctrl = self.q0, self.v0, self.n, self.arm_ctrl
        low, high, initial_joint = self.torque_low, self.torque_high, ctl.initial_joint
        sign = float(np.sign(action[6]))
        grip0, grip1 = (float(x) for x in np.broadcast_to(self.gripper.current_action, (2,)))
        speed0, speed1 = self.grip_speed[0] * sign, self.grip_speed[1] * sign
        (bias0, bias1), (weight0, weight1), (gid0, gid1) = self.grip_bias, self.grip_weight, self.grip_ids
        t, sampled = self.clocks[0]._time_since_last_sample, self.clocks[0]._sampled
        period, dt = self.period, self.dt
        stale = not ctl.new_update  # robosuite then computes with the fields of its last update
        if stale:
            state = tuple(getattr(ctl, name) for name in _CONTROLLER_STATE)
            vel = (ctl.ee_pos_vel, ctl.ee_ori_vel)
        for i in range(self.substeps):
            step1(model, data)
            if not stale:
                jac_site(model, data, jacp, jacr, site)
                full_m(model, mfull, data.qM)
                vel = (dot(jacp, qvel), dot(jacr, qvel))
            if i == 0:  # the policy step: robosuite's own set_goal, on this update's state
                if not stale:
                    state = _arm_state(sx, sm, jacp, jacr, mfull, qpos, qvel, q0, v0, n)
                ctl.ee_pos, ctl.ee_ori_mat, ctl.new_update = state[0], state[1], False
                ctl.set_goal(action[:6])
                goal_pos, goal_ori, kp, kd = ctl.goal_pos, ctl.goal_ori, ctl.kp, ctl.kd
                ee_pos, ee_ori_mat, joint_pos, joint_vel, J_pos, J_ori, J_full, mass = state
                lambda_pos, lambda_ori, nullspace, desired_force, desired_torque = _osc_terms(
                    goal_pos, goal_ori, ee_pos, ee_ori_mat, *vel, kp, kd, mass, J_full, J_pos, J_ori
                )
            else:
                out = _state_and_osc(sx, sm, jacp, jacr, mfull, qpos, qvel, q0, v0, n, goal_pos, goal_ori, *vel, kp, kd)  # fmt: skip  # noqa: E501
                joint_pos, joint_vel, J_full, mass, lambda_pos, lambda_ori, nullspace, desired_force, desired_torque = out  # fmt: skip  # noqa: E501
            stale = False
            dot(lambda_pos, desired_force, out=wrench[:3])  # robosuite: np.concatenate of the two dots
            dot(lambda_ori, desired_torque, out=wrench[3:])
            tq = dot(J_full.T, wrench)
            torques = _arm_torques(
                tq, qfrc_bias, v0, mass, nullspace, initial_joint, joint_pos, joint_vel, low, high
            )
            grip0, grip1 = min(max(grip0 + speed0, -1.0), 1.0), min(max(grip1 + speed1, -1.0), 1.0)
            ctrl[gid0], ctrl[gid1] = bias0 + weight0 * grip0, bias1 + weight1 * grip1
            ctrl[arm_ctrl] = torques
            step2(model, data)
            # Observable.update's clock (no delay): a sample at the first sub-step of each period
            before = (t, sampled)
            t += dt
            sample = not sampled and period >= t
            sampled = sampled or sample
            if t >= period:
                sample = sample or not sampled  # robosuite's late sample (never with these rates)
                t, sampled = t % period, False
            if sample:
                self._sample(*before)
            if hook is not None:
                hook()
        # leave robosuite's objects as its own step does
        for o in self.clocks:
            o._time_since_last_sample, o._sampled = t, sampled
        if self.substeps > 1:  # the last update's fields (site pose: mj_step2 leaves it as step1 made it)
            J_pos, J_ori = np.asfortranarray(J_full[:3]), np.asfortranarray(J_full[3:])
            state = (sx.copy(), sm.reshape(3, 3).copy(), joint_pos, joint_vel, J_pos, J_ori, J_full, mass)
        for name, value in zip(_CONTROLLER_STATE, state):
            setattr(ctl, name, value)
        ctl.ee_pos_vel, ctl.ee_ori_vel, ctl.torques, ctl.new_update = vel[0], vel[1], torques, True
        self.robot.torques = torques
        self.gripper.current_action = np.array([grip0, grip1])
        env.cur_time += env.control_timestep
        reward, _, _ = env._post_action(action)  # reward: success before _post_process; done flag
        return float(reward), bool(env._check_success())  # BDDLBaseDomain.step: success after it

    def _sample(self, t: float, sampled: bool) -> None:
        """Sample the observables now, through robosuite's own ``Observable.update`` from the clock
        state before this sub-step's tick (it ticks, samples, and may roll over, as in its step)."""
        if self.snapshot is not None:
            mujoco.mj_copyData(self.snapshot, self.model, self.data)
        env = self.env
        if self.sampled is None:
            for o in self.clocks:
                o._time_since_last_sample, o._sampled = t, sampled
            env._update_observables()
        else:
            for o in self.sampled:
                o._time_since_last_sample, o._sampled = t, sampled
                o.update(timestep=env.model_timestep, obs_cache=env._obs_cache)

    def observations(self) -> dict[str, Any]:
        """robosuite's observation dict after the last step (``_get_observations()``); with a subset
        of ``observables``, only those."""
        if self.sampled is None:
            return self.env._get_observations()
        return {o.name: o.obs for o in self.sampled}
