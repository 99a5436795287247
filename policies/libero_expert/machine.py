"""The scripted pick-and-place controller behind ``LiberoExpert``: one phase machine per env.

Phases: approach (above the grasp point, gripper open, yaw aligned) -> descend -> close -> extract
(slide the object out from under an overhang, if ``ring_free`` says it is under one) -> lift ->
carry (above the target, with clearance over the target and the start area) -> lower -> release ->
retreat. Grasps: objects wider than ``wide_threshold`` on both horizontal sides (bowls, plates) by
the rim, on a side clear of obstacles (``ring_free``, ``ring_free_low``); others at their centre across
their shortest horizontal side. A proportional controller drives the OSC delta-pose actions (the
hand kept pointing down, gripper yaw set by the grasp). Recovery: when the object is no longer
held during lift / carry / lower, or the gripper closed on nothing, or the descent is blocked,
the gripper opens and the machine starts over from approach (``max_retries`` times).
"""

from __future__ import annotations

import numpy as np


def quat2mat(q: np.ndarray) -> np.ndarray:
    x, y, z, w = q / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def mat2axisangle(R: np.ndarray) -> np.ndarray:
    cos = np.clip((np.trace(R) - 1) / 2, -1.0, 1.0)
    ang = np.arccos(cos)
    if ang < 1e-6:
        return np.zeros(3)
    v = np.array([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]])
    if np.pi - ang < 1e-3:  # near pi: use the diagonal
        axis = np.sqrt(np.clip((np.diag(R) + 1) / 2, 0, None))
        axis *= np.sign(v + 1e-12)
        return axis / np.linalg.norm(axis) * ang
    return v / (2 * np.sin(ang)) * ang


def rotz(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]])


R_DOWN = np.diag([1.0, -1.0, -1.0])  # robot0_right_hand orientation with the gripper pointing down, yaw 0
# At yaw psi (hand R = rotz(psi) @ R_DOWN) the fingers close along world (-sin psi, cos psi, 0).


def wrap(a: float) -> float:
    return (a + np.pi) % (2 * np.pi) - np.pi


class PickPlaceMachine:
    """Phase machine: approach -> descend -> close -> lift -> carry -> lower -> release -> retreat.

    Recovery: if the object is not held (moved away from the fingers, or the gripper closed on nothing)
    during lift/carry/lower, open and go back to approach (at most ``max_retries`` times).
    """

    POS_SCALE = 0.05  # OSC output_max for position (m per unit action)
    ROT_SCALE = 0.5  # OSC output_max for rotation (rad per unit action)

    def __init__(
        self,
        pos_gain: float = 2.0,
        rot_gain: float = 1.0,
        ki: float = 0.15,  # integral gain on xy error while carrying/lowering
        wide_threshold: float = 0.075,  # objects wider than this (both horizontal sides) get a rim grasp
        rim_inset: float = 0.012,  # rim grasp: eef this far inside the rim
        rim_depth: float = 0.02,  # rim grasp: eef this far below the top
        grasp_depth: float = 0.03,  # centre grasp: eef this far below the top ...
        min_grasp_above_bottom: float = 0.012,  # ... but at least this far above the object's bottom
        approach_height: float = 0.10,
        clearance_on: float = 0.08,  # carried object's bottom this far above the target top
        clearance_in: float = 0.04,
        start_clearance: float = 0.03,  # ... and this far above where it started
        place_gap_on: float = 0.01,  # 'on': release when object bottom is this far above target top
        place_gap_in: float = -0.03,  # 'in': release when object bottom is this far above target top
        close_steps: int = 12,
        open_steps: int = 8,
        max_retries: int = 3,
        hand_reach: float = 0.10,  # rim grasp: the hand reaches this far beyond the rim (obstacles above top)
        finger_reach: float = 0.05,  # ... the outer finger this far (obstacles above top - 0.045)
        escape_margin: float = 0.015,  # keep this much horizontal clearance to obstacles above the object
        max_escape: float = 0.04,
        near_obstacle: float = 0.06,  # obstacles closer than this to the object's side are lifted over
        rim_pref: tuple[float, float] = (-1.0, 0.0),  # preferred rim side (toward the robot base: less reach)
    ) -> None:
        self.__dict__.update({k: v for k, v in locals().items() if k != "self"})
        self.reset()

    def reset(self) -> None:
        self.phase = "approach"
        self.t_phase = 0
        self.retries = 0
        self.grasp_offset = None  # obj_pos - eef_pos at grasp time
        self.grasp_plan = None
        self.start_bottom = None
        self.rim_u = None
        self.i_xy = np.zeros(2)
        self._last_eef: np.ndarray | None = None  # descend: eef at the previous step (stall test)
        self.extract_tgt: np.ndarray | None = None

    # ---- geometry --------------------------------------------------------------------------------
    def _obj_geom(self, s):
        R = quat2mat(s["obj_quat"])
        center = s["obj_pos"] + R @ s["obj_local_center"]
        half_w = np.abs(R) @ s["obj_local_half"]  # world AABB half extents
        k = int(np.argmax(np.abs(R[2, :])))  # local axis most vertical
        horiz = [i for i in range(3) if i != k]
        return R, center, half_w, horiz

    def _choose_rim_dir(self, s, radius: float) -> np.ndarray:
        n = len(s["ring_free"])
        best, best_cost = None, np.inf
        for k in range(n):
            a = 2 * np.pi * k / n
            u = np.array([np.cos(a), np.sin(a)])
            # the hand is long along u (the finger axis) and narrow across it: only sector k matters.
            # hand-level obstacles (above the object's top) out to ~radius + 0.10, and finger-level
            # obstacles (above top - 0.045) out to ~radius + 0.05 block this side
            cost = 1.0 * float(s["ring_free"][k] < radius + self.hand_reach)
            cost += 0.5 * float(s["ring_free_low"][k] < radius + self.finger_reach)
            cost += 0.01 * float(np.dot(u, self.rim_pref) < 0.9) - 0.001 * float(np.dot(u, self.rim_pref))
            if cost < best_cost:
                best, best_cost = u, cost
        return best

    def _plan_grasp(self, s, yaw_now: float):
        R, center, half_w, horiz = self._obj_geom(s)
        top, bottom = center[2] + half_w[2], center[2] - half_w[2]
        sizes = [2 * s["obj_local_half"][i] for i in horiz]
        if min(sizes) > self.wide_threshold:  # bowl: grasp the rim
            if self.rim_u is None:
                self.rim_u = self._choose_rim_dir(s, max(half_w[0], half_w[1]))
            u = self.rim_u
            radius = min(half_w[0], half_w[1])
            xy = center[:2] + u * (radius - self.rim_inset)
            z = top - self.rim_depth
            axis = u  # fingers close radially across the rim
        else:
            i = horiz[int(np.argmin(sizes))]
            axis = R[:, i][:2]
            axis = axis / (np.linalg.norm(axis) + 1e-9)
            xy = center[:2]
            z = max(top - self.grasp_depth, bottom + self.min_grasp_above_bottom)
        # fingers along (-sin psi, cos psi)  =>  psi = atan2(-ax, ay); mod pi (symmetric gripper)
        psi = np.arctan2(-axis[0], axis[1])
        psi = yaw_now + wrap(2 * (psi - yaw_now)) / 2  # closest equivalent (mod pi)
        return np.array([xy[0], xy[1], z]), psi

    # ---- low-level control -----------------------------------------------------------------------
    def _ctrl(
        self, s, target_pos, yaw, grip: float, max_speed: float = 1.0, integral: bool = False
    ) -> np.ndarray:
        a = np.zeros(7)
        err = target_pos - s["eef_pos"]
        dp = err / self.POS_SCALE * self.pos_gain
        if integral:
            self.i_xy = np.clip(self.i_xy + err[:2], -0.3, 0.3)
            dp[:2] += self.ki * self.i_xy / self.POS_SCALE
        n = np.max(np.abs(dp))
        if n > max_speed:
            dp *= max_speed / n
        a[:3] = dp
        Rc = quat2mat(s["eef_quat"])
        Rd = rotz(yaw) @ R_DOWN
        a[3:6] = np.clip(mat2axisangle(Rd @ Rc.T) / self.ROT_SCALE * self.rot_gain, -1, 1)
        a[6] = grip
        return a

    @staticmethod
    def _yaw(s) -> float:
        R = quat2mat(s["eef_quat"])
        return float(np.arctan2(R[1, 0], R[0, 0]))

    def _goto(self, phase: str) -> None:
        self.phase, self.t_phase = phase, 0
        self.i_xy = np.zeros(2)

    # ---- policy ------------------------------------------------------------------------------------
    def act(self, s: dict[str, np.ndarray]) -> np.ndarray:
        """The next 7-d action (unclipped) from one env's named ``task_state`` fields."""
        self.t_phase += 1
        eef = s["eef_pos"]
        R, center, half_w, _ = self._obj_geom(s)
        obj_bottom = center[2] - half_w[2]
        if self.start_bottom is None:
            self.start_bottom, self.start_xy = obj_bottom, center[:2].copy()
            # lift the object's bottom above nearby obstacles (drawer walls) before carrying
            near = s["ring_free"] < max(half_w[0], half_w[1]) + self.near_obstacle
            h = max(float(np.max(s["ring_height"][near])), 0.0) if near.any() else 0.0
            self.start_lift = center[2] + half_w[2] + h + 0.02
        goal_in = s["goal_in"][0] > 0.5
        ttop = float(s["target_top"][0])

        if self.phase == "approach":
            gp, psi = self._plan_grasp(s, self._yaw(s))
            self.grasp_plan = (gp, psi)
            above = gp + np.array([0, 0, self.approach_height])
            err = above - eef
            yaw_err = abs(wrap(psi - self._yaw(s)))
            if (np.linalg.norm(err[:2]) < 0.01 and abs(err[2]) < 0.03 and yaw_err < 0.1) or self.t_phase > 80:
                self._goto("descend")
            tgt = above.copy()
            if np.linalg.norm(err[:2]) > 0.03:  # move horizontally at a safe height first, then down
                tgt[2] = max(above[2], eef[2])
            return self._ctrl(s, tgt, psi, -1.0)

        if self.phase == "descend":
            gp, psi = self._plan_grasp(s, self._yaw(s))
            self.grasp_plan = (gp, psi)
            err = gp - eef
            stalled = self.t_phase > 10 and abs(err[2]) > 0.02 and self._stall(eef)
            if np.linalg.norm(err) < 0.008 or self.t_phase > 40 or stalled:
                if stalled and abs(err[2]) > 0.04:  # blocked high above the grasp: try another side
                    return self._retry(s, blocked=True)
                self._goto("close")
            self._last_eef = eef.copy()
            return self._ctrl(s, gp, psi, -1.0, max_speed=0.6 if abs(err[2]) < 0.04 else 1.0)

        if self.phase == "close":
            gp, psi = self.grasp_plan
            if self.t_phase >= self.close_steps:
                self.grasp_offset = s["obj_pos"] - eef
                shift = self._escape(s, half_w)
                if np.linalg.norm(shift) > 0.005:  # object partly under an overhang: slide it out first
                    self.extract_tgt = eef + np.array([shift[0], shift[1], 0.003])
                    self._goto("extract")
                else:
                    self._goto("lift")
            return self._ctrl(s, gp, psi, 1.0)

        if self.phase == "extract":
            if np.linalg.norm(self.extract_tgt - eef) < 0.005 or self.t_phase > 25:
                self._goto("lift")
            return self._ctrl(s, self.extract_tgt, self.grasp_plan[1], 1.0, max_speed=0.5)

        held = self.grasp_offset is not None and np.linalg.norm(s["obj_pos"] - eef - self.grasp_offset) < 0.04
        closed_empty = self.rim_u is None and s["gripper_qpos"][0] - s["gripper_qpos"][1] < 0.004
        clearance = self.clearance_in if goal_in else self.clearance_on
        carry_bottom = max(ttop + clearance, self.start_bottom + self.start_clearance, self.start_lift)
        eef_to_bottom = eef[2] - obj_bottom  # eef height above the carried object's bottom
        _, psi = self.grasp_plan

        if self.phase == "lift":
            tgt = np.array([*self.grasp_plan[0][:2], carry_bottom + eef_to_bottom])
            lifted = obj_bottom - self.start_bottom > 0.02
            if self.t_phase > 6 and (not held or closed_empty):
                return self._retry(s)
            if lifted and (abs(tgt[2] - eef[2]) < 0.02 or self.t_phase > 40):
                self._goto("carry")
            elif self.t_phase > 40:
                return self._retry(s)
            return self._ctrl(s, tgt, psi, 1.0)

        if self.phase in ("carry", "lower"):
            if not held or closed_empty:
                return self._retry(s)
            obj_ref = s["obj_pos"]  # the point the success check uses (body origin)
            xy = eef[:2] + (s["target_pos"][:2] - obj_ref[:2])
            xy_err = np.linalg.norm(xy - eef[:2])
            if self.phase == "carry":
                if np.linalg.norm(center[:2] - self.start_xy) > 0.10:  # left the start area: no need
                    carry_bottom = ttop + clearance  # to stay above the start height (reach limits)
                tgt = np.array([xy[0], xy[1], carry_bottom + eef_to_bottom])
                if (xy_err < 0.01 and abs(tgt[2] - eef[2]) < 0.03) or self.t_phase > 100:
                    self._goto("lower")
                if eef[2] < tgt[2] - 0.02:  # rise first, then travel
                    tgt[:2] = eef[:2]
                return self._ctrl(s, tgt, psi, 1.0, integral=True)
            gap = self.place_gap_in if goal_in else self.place_gap_on
            z = ttop + gap + eef_to_bottom
            dz = eef[2] - z
            tgt = np.array([xy[0], xy[1], z if (xy_err < 0.015 or dz > 0.03) else eef[2]])
            if (dz < 0.006 and xy_err < 0.015) or self.t_phase > 60:
                self._goto("release")
            return self._ctrl(s, tgt, psi, 1.0, max_speed=1.0 if dz > 0.04 else 0.4, integral=True)

        if self.phase == "release":
            if self.t_phase >= self.open_steps:
                self._goto("retreat")
            return self._ctrl(s, eef, psi, -1.0)

        # retreat / done: move up and stay
        tgt = eef.copy()
        tgt[2] = max(eef[2], ttop + 0.15)
        return self._ctrl(s, tgt, psi, -1.0, max_speed=0.5)

    def _escape(self, s, half_w) -> np.ndarray:
        """Horizontal shift that moves the object's footprint out from under obstacles (ring_free)."""
        radius = max(half_w[0], half_w[1]) + self.escape_margin
        shift = np.zeros(2)
        n = len(s["ring_free"])
        for k in range(n):
            pen = radius - s["ring_free"][k]
            if pen > 0:
                a = 2 * np.pi * k / n
                shift -= pen * np.array([np.cos(a), np.sin(a)])
        norm = np.linalg.norm(shift)
        return shift if norm <= self.max_escape else shift * self.max_escape / norm

    def _stall(self, eef) -> bool:
        last = self._last_eef
        return last is not None and np.linalg.norm(eef - last) < 0.001

    def _retry(self, s, blocked: bool = False) -> np.ndarray:
        self.retries += 1
        self.grasp_offset = None
        if blocked and self.rim_u is not None:  # rotate the rim grasp side by 90 degrees
            self.rim_u = np.array([-self.rim_u[1], self.rim_u[0]])
        self._goto("approach" if self.retries <= self.max_retries else "retreat")
        a = np.zeros(7)
        a[6] = -1.0
        return a
