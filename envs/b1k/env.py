"""BEHAVIOR-1K challenge tasks as a chunked vector env with the shared reset-from-initial-frame API.

One env object runs one task (its scene is loaded once; switching scenes takes minutes in
OmniGibson). Its initial frames are the task's saved instances (the challenge's
``*-tro_state.json`` files): ``reset(options={"initial_frames": [ids]})`` restores them;
``current_frames()`` right after a reset gives them with the rendered head image.

Observations: ``image`` (head camera), ``wrist_image`` (left wrist), ``right_wrist_image``, uint8
RGB at ``image_size``; ``proprio``, the 23-D robot state (``layout.robot_state``); ``instruction``.
Actions: chunks ``(K, 23)`` of R1Pro joint targets (``layout.ACTION_PARTS``), one 30 Hz step per row;
an env's chunk stops at its episode's end. Cameras are read at the last step of a chunk (and when
an episode ends inside it). Episodes end with success (all goal predicates, ``terminated``) or at the
time limit (twice the mean human demonstration, ``truncated``); ``info["episode"]`` adds the
challenge's partial-success ``q_score``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envs.b1k.backend import B1KBackend
from envs.b1k.layout import ACTION_HIGH, ACTION_LOW, CAMERAS, PROPRIO_KEY, STATE_DIM, rgb, robot_state
from envs.b1k.qscore import q_score
from envs.b1k.tasks import CHALLENGE_TASKS
from envs.core import ChunkedVectorEnv, ChunkResult, InitialFrame
from envs.core.spaces import observation_space
from nets.errors import BadInput


def b1k_observation_space(
    image_size: int = 224, cameras: Sequence[str] = tuple(CAMERAS), include_instruction: bool = True
) -> spaces.Dict:
    """The single-env observation space of ``B1KVectorEnv`` (no simulator needed); the action space
    is ``chunk_action_space(ACTION_LOW, ACTION_HIGH, chunk_size)``."""
    cameras = tuple(cameras)
    if not cameras or not set(cameras) <= set(CAMERAS) or cameras[0] != "image":
        raise BadInput(f"cameras must start with 'image' and be among {tuple(CAMERAS)}, got {cameras}")
    if not isinstance(image_size, int | np.integer) or image_size < 1:
        raise BadInput(f"image_size must be a positive int, got {image_size!r}")
    obs_space = observation_space(
        image_size=(int(image_size), int(image_size)),
        wrist=False,
        proprio_dim=STATE_DIM,
        proprio_bound=100.0,  # joint positions (rad, m) and base velocities
        instruction=include_instruction,
    )
    for key in cameras[1:]:
        obs_space.spaces[key] = obs_space.spaces["image"]
    return spaces.Dict(
        {k: obs_space.spaces[k] for k in (*cameras, "proprio", "instruction") if k in obs_space.spaces}
    )


class B1KInitialFrames(Sequence[InitialFrame]):
    """The saved instances of one task as ``InitialFrame``s (``meta["instance_id"]``)."""

    def __init__(self, task: str, instruction: str, instances: Sequence[int]) -> None:
        self.task, self.instruction, self.instances = task, instruction, [int(i) for i in instances]

    def __len__(self) -> int:
        return len(self.instances)

    def __getitem__(self, index: int) -> InitialFrame:  # type: ignore[override]
        if not isinstance(index, int | np.integer) or not 0 <= index < len(self):
            raise IndexError(f"initial frame id {index} out of range [0, {len(self)})")
        meta = {"instance_id": self.instances[int(index)]}
        return InitialFrame(instruction=self.instruction, task=task_key(self.task), meta=meta)


def task_key(task: str) -> str:
    return f"b1k/{task}"


class B1KVectorEnv(ChunkedVectorEnv):
    """A BEHAVIOR-1K challenge task as a chunked vector env (see the module docstring).

    Args:
        task: one of the 50 challenge activities (``envs.b1k.tasks.CHALLENGE_TASKS``).
        num_envs: parallel envs (scenes in one OmniGibson simulation).
        chunk_size: actions per step K (cosmos-rl's B1K GRPO: 10); None for ``(23,)`` actions.
        image_size: camera resolution (the challenge's low-resolution track: 224).
        cameras: observation images among ``image``, ``wrist_image``, ``right_wrist_image``.
        instances: saved instance ids to start from (default: all the backend has).
        max_episode_steps: override the task's limit (twice the mean human demonstration).
        backend: the simulator (default ``OmniGibsonBackend()``, which needs OmniGibson, Isaac Sim
            and an RTX GPU); tests pass ``tests/fake_omnigibson.py``'s fake.
    """

    def __init__(
        self,
        task: str | None = None,
        num_envs: int = 1,
        *,
        chunk_size: int | None = 10,
        image_size: int = 224,
        cameras: Sequence[str] = tuple(CAMERAS),
        instances: Sequence[int] | None = None,
        max_episode_steps: int | None = None,
        include_instruction: bool = True,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        backend: B1KBackend | None = None,
        render_mode: str | None = "rgb_array",
        env_id: str | None = None,
    ) -> None:
        env_id = env_id or "B1K-v0"
        if task not in CHALLENGE_TASKS:
            raise BadInput(
                f"{env_id}: task must be one of the 50 challenge tasks {CHALLENGE_TASKS}, got {task!r}"
            )
        cameras = tuple(cameras)
        if not cameras or not set(cameras) <= set(CAMERAS) or cameras[0] != "image":
            raise BadInput(
                f"{env_id}: cameras must start with 'image' and be among {tuple(CAMERAS)}, got {cameras}"
            )
        if not isinstance(image_size, int | np.integer) or image_size < 1:
            raise BadInput(f"{env_id}: image_size must be a positive int, got {image_size!r}")
        if backend is None:
            from envs.b1k.omnigibson_backend import OmniGibsonBackend

            backend = OmniGibsonBackend()
        available = backend.instances(task)
        chosen = list(available) if instances is None else [int(i) for i in instances]
        unknown = sorted(set(chosen) - set(available))
        if not chosen or unknown:
            raise BadInput(
                f"{env_id}: instances must be a non-empty subset of {task}'s {available}, got {chosen}"
            )
        obs_space = b1k_observation_space(image_size, cameras, include_instruction)
        super().__init__(
            env_id=env_id,
            num_envs=num_envs,
            single_observation_space=obs_space,
            action_low=ACTION_LOW,
            action_high=ACTION_HIGH,
            chunk_size=chunk_size,
            initial_frames=B1KInitialFrames(task, backend.instruction(task), chosen),
            autoreset_mode=autoreset_mode,
            render_mode=render_mode,
        )
        self.task, self.image_size, self.cameras = task, int(image_size), cameras
        self.max_episode_steps_override = max_episode_steps
        self.backend = backend
        self._initial_predicates: list[list[list[bool]] | None] = [None] * self.num_envs
        backend.load(task, self.num_envs, self.image_size)

    # ---------------------------------------------------------------- backend hooks
    def _check_frame(self, frame: InitialFrame) -> str | None:
        if frame.task != task_key(self.task):
            return f"a frame of this env's task {task_key(self.task)!r}"
        instance = frame.meta.get("instance_id")
        if instance not in self.backend.instances(self.task):
            return f"meta['instance_id'] among {self.task}'s saved instances (got {instance!r})"
        return None

    def _max_episode_steps(self, frame: InitialFrame) -> int:
        return self.max_episode_steps_override or self.backend.max_steps(self.task)

    def _reset_envs(self, env_ids: np.ndarray, frames: list[InitialFrame]) -> dict[str, np.ndarray]:
        raw = [
            self.backend.reset_to_instance(int(i), int(f.meta["instance_id"]))
            for i, f in zip(env_ids, frames)
        ]
        for i in env_ids:
            self._initial_predicates[i] = self.backend.goal_predicates(int(i))
        return self._map_obs(raw)

    def _step_envs(self, env_ids: np.ndarray, actions: np.ndarray, max_steps: np.ndarray) -> ChunkResult:
        n, k_total = actions.shape[:2]
        rewards = np.zeros((n, k_total), np.float32)
        valid = np.zeros((n, k_total), bool)
        success = np.zeros((n, k_total), bool)
        terminated = np.zeros(n, bool)
        cut = np.zeros(n, bool)  # OmniGibson's own timeout
        active = np.ones(n, bool)
        last_obs: list[dict[str, Any] | None] = [None] * n
        for k in range(k_total):
            run = np.flatnonzero(active & (k < max_steps))
            if not len(run):
                break
            res = self.backend.step([int(env_ids[j]) for j in run], actions[run, k], get_obs=k == k_total - 1)
            rewards[run, k], valid[run, k], success[run, k] = res.reward, True, res.success
            term, trunc = np.asarray(res.terminated, bool), np.asarray(res.truncated, bool)
            terminated[run] |= term
            cut[run] |= trunc & ~term
            ended = term | trunc | (k + 1 >= max_steps[run])
            if res.obs is not None:
                for j, obs in zip(run, res.obs):
                    last_obs[j] = obs
            if res.obs is None:  # an episode ended inside the chunk: read its cameras now
                for j in run[ended]:
                    last_obs[j] = self.backend.observe(int(env_ids[j]))
            active[run[ended]] = False
        missing = [int(env_ids[j]) for j in range(n) if last_obs[j] is None]
        if missing:
            raise RuntimeError(f"{self.env_id}: no observation for envs {missing} after their chunk")
        return ChunkResult(self._map_obs(last_obs), rewards, valid, success, terminated, cut=cut)

    def _episode_stats(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        scores = [
            q_score(
                self._initial_predicates[i], self.backend.goal_predicates(int(i)), bool(self._last_success[i])
            )
            for i in env_ids
        ]
        return {"q_score": np.asarray(scores, np.float64)}

    def _map_obs(self, raw: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        """Flattened OmniGibson observations -> our batched keys."""
        out: dict[str, list[np.ndarray]] = {key: [] for key in (*self.cameras, "proprio")}
        size = (self.image_size, self.image_size, 3)
        for obs in raw:
            for key in self.cameras:
                name = f"{CAMERAS[key]}::rgb"
                if name not in obs:
                    raise RuntimeError(
                        f"{self.env_id}: the simulator returned no {name!r}; it has {sorted(obs)}"
                    )
                image = rgb(obs[name])
                if image.shape != size:
                    raise RuntimeError(
                        f"{self.env_id}: {name} is {image.shape}, expected {size} (image_size)"
                    )
                out[key].append(image)
            if PROPRIO_KEY not in obs:
                raise RuntimeError(
                    f"{self.env_id}: the simulator returned no {PROPRIO_KEY!r}; it has {sorted(obs)}"
                )
            proprio = obs[PROPRIO_KEY]
            proprio = proprio.detach().cpu().numpy() if hasattr(proprio, "detach") else np.asarray(proprio)
            out["proprio"].append(robot_state(proprio))
        return {key: np.stack(values) for key, values in out.items()}

    def close_extras(self, **kwargs: Any) -> None:
        self.backend.close()
