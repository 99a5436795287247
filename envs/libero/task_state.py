"""Privileged task state for scripted policies: ``LiberoVectorEnv(task_state=True)`` adds the
observation ``task_state``, a float32 vector laid out as ``TASK_STATE_FIELDS`` (name, size).

It is computed in the simulator's process from MuJoCo data and the task's BDDL goal, which must be
one ``(On obj target)`` or ``(In obj target_region)`` predicate (LIBERO-Spatial, LIBERO-Object and
the pick-and-place tasks of the other suites); for any other goal ``supported`` is 0 and the rest 0.

* ``eef_pos``, ``eef_quat`` (xyzw): the grip site and the hand's orientation; ``gripper_qpos``.
* ``obj_pos``, ``obj_quat``: the goal object's body pose; ``obj_local_center`` / ``obj_local_half``:
  the box around its collision geoms, in its body frame.
* ``target_pos``, ``target_top``: the target object's body position and the top of the world box of
  its collision geoms (``On``), or the target region site's position and top (``In``); ``goal_in``:
  1 for ``In``, 0 for ``On``.
* Obstacles around the object, from vertical ray casts that skip the robot and the object, at
  distances 0, 1, ..., 16 cm from the centre of its box in 8 directions ``k * 45`` degrees:
  ``ring_height``, per direction, the highest surface 0.5-11.5 cm outside the object's horizontal
  half size, minus the object's top, clipped to [-1, 1] (where a finger would hit something);
  ``ring_free`` / ``ring_free_low``, the first distance whose surface rises above the object's top
  minus 5 mm (an overhang) / minus 45 mm (finger height), 0.2 if none.
* ``episode_step``: sub-steps since the episode started (0 in a reset's observation).
"""

from __future__ import annotations

from typing import Any

import numpy as np

TASK_STATE_FIELDS: tuple[tuple[str, int], ...] = (
    ("supported", 1),
    ("episode_step", 1),
    ("eef_pos", 3),
    ("eef_quat", 4),
    ("gripper_qpos", 2),
    ("obj_pos", 3),
    ("obj_quat", 4),
    ("obj_local_center", 3),
    ("obj_local_half", 3),
    ("target_pos", 3),
    ("target_top", 1),
    ("goal_in", 1),
    ("ring_height", 8),
    ("ring_free", 8),
    ("ring_free_low", 8),
)
TASK_STATE_DIM = sum(n for _, n in TASK_STATE_FIELDS)
RING_DIRECTIONS = 8
RING_STEP, RING_SAMPLES = 0.01, 17  # ray casts every centimetre from the object's centre


def _subtree(model: Any, root: int) -> set[int]:
    out = {root}
    for body in range(root + 1, model.nbody):  # MuJoCo numbers children after their parents
        if model.body_parentid[body] in out:
            out.add(body)
    return out


def _geom_corners(model: Any, data: Any, root: int) -> np.ndarray:
    """World corners ``[8G, 3]`` of the local boxes of the collision geoms in a body's subtree."""
    bodies = _subtree(model, root)
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], np.float64)
    corners = []
    for g in range(model.ngeom):
        if model.geom_bodyid[g] in bodies and (model.geom_contype[g] or model.geom_conaffinity[g]):
            center, half = model.geom_aabb[g][:3], model.geom_aabb[g][3:]
            corners.append(data.geom_xpos[g] + (center + signs * half) @ data.geom_xmat[g].reshape(3, 3).T)
    return np.concatenate(corners)


class TaskStateBuilder:
    """Computes ``task_state`` for one scene after a reset (goal and object shape are cached)."""

    def __init__(self, env: Any) -> None:
        goal = env.parsed_problem["goal_state"]
        self.supported = len(goal) == 1 and str(goal[0][0]).lower() in ("on", "in") and len(goal[0]) == 3
        if not self.supported:
            return
        predicate, self.obj, self.target = str(goal[0][0]).lower(), goal[0][1], goal[0][2]
        self.goal_in = float(predicate == "in")
        self.target_is_site = self.target in env.object_sites_dict
        model, data = env.sim.model._model, env.sim.data._data
        self.body = env.obj_body_id[self.obj]
        local = (_geom_corners(model, data, self.body) - data.xpos[self.body]) @ data.xmat[self.body].reshape(
            3, 3
        )
        low, high = local.min(0), local.max(0)
        self.obj_center, self.obj_half = (low + high) / 2, (high - low) / 2
        robot = env.robots[0]
        self.grip_site = robot.gripper.important_sites["grip_site"]
        self.hand = model.body(robot.robot_model.eef_name).id
        self.gripper_qpos = list(robot._ref_gripper_joint_pos_indexes)
        self.ignored = _subtree(model, self.body) | {
            b for b in range(model.nbody) if model.body(b).name.startswith(("robot0", "gripper0", "mount0"))
        }

    def __call__(self, env: Any, episode_step: int) -> np.ndarray:
        out = np.zeros(TASK_STATE_DIM, np.float32)
        if not self.supported:
            out[1] = episode_step
            return out
        model, data, sim_data = env.sim.model._model, env.sim.data._data, env.sim.data
        if self.target_is_site:
            target_pos = np.array(sim_data.get_site_xpos(self.target))
            rotation = np.array(sim_data.get_site_xmat(self.target))
            target_half = np.abs(rotation) @ env.object_sites_dict[self.target].size
            target_top = target_pos[2] + target_half[2]
        else:
            body = env.obj_body_id[self.target]
            target_pos = np.array(data.xpos[body])
            corners = _geom_corners(model, data, body)
            target_top = corners[:, 2].max()
        values = {
            "supported": 1.0,
            "episode_step": episode_step,
            "eef_pos": sim_data.get_site_xpos(self.grip_site),
            "eef_quat": data.xquat[self.hand][[1, 2, 3, 0]],
            "gripper_qpos": data.qpos[self.gripper_qpos],
            "obj_pos": data.xpos[self.body],
            "obj_quat": data.xquat[self.body][[1, 2, 3, 0]],
            "obj_local_center": self.obj_center,
            "obj_local_half": self.obj_half,
            "target_pos": target_pos,
            "target_top": target_top,
            "goal_in": self.goal_in,
        }
        values["ring_height"], values["ring_free"], values["ring_free_low"] = self._ring(model, data)
        return np.concatenate(
            [np.atleast_1d(np.asarray(values[k], np.float64)) for k, _ in TASK_STATE_FIELDS]
        ).astype(np.float32)

    def _ring(self, model: Any, data: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        corners = _geom_corners(model, data, self.body)
        low, high = corners.min(0), corners.max(0)
        center, top, radius = (low + high) / 2, high[2], (high - low)[:2].max() / 2
        height = np.full(RING_DIRECTIONS, -1.0)
        free, free_low = np.full(RING_DIRECTIONS, 0.2), np.full(RING_DIRECTIONS, 0.2)
        for k in range(RING_DIRECTIONS):
            angle = 2 * np.pi * k / RING_DIRECTIONS
            u = np.array([np.cos(angle), np.sin(angle)])
            for i in range(RING_SAMPLES):
                rho = i * RING_STEP
                h = self._surface(model, data, *(center[:2] + u * rho)) - top
                if radius + 0.005 < rho < radius + 0.115:
                    height[k] = max(height[k], h)
                if h > -0.005 and free[k] == 0.2:
                    free[k] = rho
                if h > -0.045 and free_low[k] == 0.2:
                    free_low[k] = rho
        return np.clip(height, -1.0, 1.0), free, free_low

    def _surface(self, model: Any, data: Any, x: float, y: float) -> float:
        """Height of the highest collision surface at (x, y), skipping the robot and the object."""
        import mujoco

        geom = np.zeros(1, np.int32)
        point = np.array([x, y, 3.0])
        collision_group = np.array([1, 0, 0, 0, 0, 0], np.uint8)
        for _ in range(20):
            dist = mujoco.mj_ray(model, data, point, np.array([0.0, 0.0, -1.0]), collision_group, 1, -1, geom)
            if dist < 0:
                return -10.0
            hit = point[2] - dist
            if model.geom_bodyid[geom[0]] not in self.ignored:
                return hit
            point = np.array([x, y, hit - 1e-4])
        return -10.0
