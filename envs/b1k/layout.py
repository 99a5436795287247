"""The R1Pro robot of the BEHAVIOR-1K 2025 challenge as OmniGibson reports it (BEHAVIOR-1K v3.7.x,
``omnigibson/learning/utils/eval_utils.py``): action layout, cameras, proprioception slices.

Actions are 23 absolute joint targets at 30 Hz (``action_normalize=False``): base velocity
(x, y, yaw), torso and arm joint positions, grippers in [-1, 1] (smooth multi-finger controller).
Observations from ``og.Environment`` are flattened with ``"::"`` (as the challenge's ``eval.py`` does):
``<camera>::rgb`` RGBA uint8 ``(H, W, 4)``, ``robot_r1::proprio`` float ``(256,)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nets.errors import BadInput

ACTION_DIM = 23
ACTION_PARTS = {  # name -> slice of the 23-D action
    "base": slice(0, 3),
    "torso": slice(3, 7),
    "left_arm": slice(7, 14),
    "left_gripper": slice(14, 15),
    "right_arm": slice(15, 22),
    "right_gripper": slice(22, 23),
}
# Bounds: the base controller's output limits (m/s, m/s, rad/s) and the grippers' [-1, 1]; joint
# positions get loose +-2 pi bounds (the robot's controllers enforce the real joint limits).
ACTION_LOW = np.full(ACTION_DIM, -2 * np.pi, np.float32)
ACTION_HIGH = np.full(ACTION_DIM, 2 * np.pi, np.float32)
ACTION_LOW[ACTION_PARTS["base"]], ACTION_HIGH[ACTION_PARTS["base"]] = (-0.75, -0.75, -1.0), (0.75, 0.75, 1.0)
for _grip in ("left_gripper", "right_gripper"):
    ACTION_LOW[ACTION_PARTS[_grip]], ACTION_HIGH[ACTION_PARTS[_grip]] = -1.0, 1.0

ROBOT = "robot_r1"
CAMERAS = {  # our observation key -> OmniGibson sensor name
    "image": "robot_r1::robot_r1:zed_link:Camera:0",  # head
    "wrist_image": "robot_r1::robot_r1:left_realsense_link:Camera:0",
    "right_wrist_image": "robot_r1::robot_r1:right_realsense_link:Camera:0",
}
PROPRIO_KEY = "robot_r1::proprio"
PROPRIO_SIZE = 256
# Slices of the 256-D proprio vector (PROPRIOCEPTION_INDICES["R1Pro"], v3.7.x).
PROPRIO_SLICES = {
    "arm_left_qpos": slice(158, 165),
    "gripper_left_qpos": slice(193, 195),
    "arm_right_qpos": slice(197, 204),
    "gripper_right_qpos": slice(232, 234),
    "trunk_qpos": slice(236, 240),
    "base_qvel": slice(253, 256),
}
STATE_DIM = 23


def robot_state(proprio: np.ndarray) -> np.ndarray:
    """The 23-D state the B1K policies read (cosmos-rl's ``extract_state_from_proprio``, pi0.5's
    ``pi05_behavior``): base velocity 3, torso 4, left arm 7, right arm 7, then each gripper's
    opening as the sum of its two finger positions. ``proprio`` ``[..., 256]``."""
    p = np.asarray(proprio, np.float32)
    if p.shape[-1] != PROPRIO_SIZE:
        raise BadInput(f"expected R1Pro proprio of size {PROPRIO_SIZE}, got shape {p.shape}")
    s = PROPRIO_SLICES
    joints = [p[..., s[name]] for name in ("base_qvel", "trunk_qpos", "arm_left_qpos", "arm_right_qpos")]
    grippers = [
        p[..., s[name]].sum(-1, keepdims=True) for name in ("gripper_left_qpos", "gripper_right_qpos")
    ]
    return np.concatenate(joints + grippers, axis=-1)


def rgb(image) -> np.ndarray:
    """An OmniGibson camera image (torch or numpy, RGBA or RGB, ``(H, W, C)``) as uint8 RGB numpy."""
    arr = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if arr.ndim != 3 or arr.shape[-1] not in (3, 4):
        raise BadInput(f"expected a camera image (H, W, 3 or 4), got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise BadInput(f"expected a uint8 camera image, got {arr.dtype}")
    return np.ascontiguousarray(arr[..., :3])


def flatten_obs(obs: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """OmniGibson's nested observation dict with keys joined by ``"::"`` (as the challenge's eval.py):
    ``{"robot_r1": {"robot_r1:zed_link:Camera:0": {"rgb": x}}}`` ->
    ``{"robot_r1::robot_r1:zed_link:Camera:0::rgb": x}``."""
    flat: dict[str, Any] = {}
    for key, value in obs.items():
        name = f"{prefix}::{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten_obs(value, name))
        else:
            flat[name] = value
    return flat
