"""The chunked vector env base: everything but the simulator, written once.

A backend fills in two hooks, both batched over a set of env indices:

* ``_reset_envs(env_ids, frames)`` puts those envs at the given initial frames and returns their
  observations;
* ``_step_envs(env_ids, actions, max_steps)`` runs one action chunk ``(n, K, D)`` per env, stopping an
  env's chunk early when its episode terminates or after ``max_steps`` sub-steps, and returns a
  ``ChunkResult``.

This class owns the rest: action and option validation, autoreset (NEXT_STEP, SAME_STEP, DISABLED
with ``reset_mask``), episode bookkeeping and statistics, time limits, and gymnasium's info
conventions (``_key`` masks, ``final_obs``/``final_info``), and refusing any use after ``close()``
(``ClosedEnvError``) so a backend's released resources are never touched.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode

from envs.core.errors import bad_input, check_int, closed_env, describe
from envs.core.frames import InitialFrame, frame_problem
from envs.core.spaces import chunk_action_space
from nets.errors import BadInput

RESET_OPTIONS = ("initial_frames", "reset_mask")


@dataclass
class ChunkResult:
    """What a backend returns for ``n`` envs after one chunk of K sub-steps.

    ``valid[i, k]`` says sub-step k of env i was executed; rewards and success of unexecuted
    sub-steps are ignored. ``terminated[i]``: the episode ended by the task (e.g. success).
    ``crashed[i]``: the env's simulator died and was restarted; the episode is cut (truncated).
    ``cut[i]``: the backend ends the episode without a task termination (truncated), e.g. a world
    model that restarts every env when one finishes.
    """

    obs: dict[str, np.ndarray]
    rewards: np.ndarray
    valid: np.ndarray
    success: np.ndarray
    terminated: np.ndarray
    info: dict[str, np.ndarray] = field(default_factory=dict)
    crashed: np.ndarray | None = None
    cut: np.ndarray | None = None


class ChunkedVectorEnv(gym.vector.VectorEnv):
    """A ``gymnasium.vector.VectorEnv`` whose actions are chunks of K sub-step actions.

    ``single_action_space`` is ``Box(low, high, (K, D))`` (``(D,)`` when ``chunk_size`` is None). One
    ``step()`` runs the whole chunk; once an env's episode ends inside a chunk, the rest of its chunk
    is not executed. The step reward is the sum over executed sub-steps, whose detail is in
    ``info["chunk_rewards"]``, ``info["chunk_valid"]`` and ``info["chunk_success"]`` (the backend's
    success signal after each executed sub-step, False elsewhere) ``[N, K]``. Actions outside the bounds are
    clipped; wrong shapes, non-float dtypes and NaN/inf raise ``ValueError``.

    ``reset(seed=, options=)`` options: ``initial_frames``, one entry per env being reset, each an
    int id into ``self.initial_frames`` or an ``InitialFrame``; ``reset_mask``, a bool ``(N,)``
    array selecting the envs to reset (the others keep their state). Without ``initial_frames`` the
    ids are drawn uniformly from the env's RNG, which ``seed`` seeds.

    Episode statistics (``success`` at the end, ``success_once``, ``return``, ``length`` in
    sub-steps) come in ``info["episode"]`` at the step an episode ends, and in SAME_STEP mode also
    in ``info["final_info"]["episode"]``.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        *,
        env_id: str,
        num_envs: int,
        single_observation_space: gym.spaces.Dict,
        action_low: np.ndarray,
        action_high: np.ndarray,
        chunk_size: int | None,
        initial_frames: Sequence[InitialFrame],
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        render_mode: str | None = "rgb_array",
    ) -> None:
        self.env_id = env_id
        self.num_envs = check_int(env_id, "num_envs", num_envs, low=1)  # a bool is no count: refused
        chunk_size = check_int(env_id, "chunk_size", chunk_size, low=1, none_ok=True)
        self.chunk_size = chunk_size
        try:
            self.autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            modes = [m.value for m in AutoresetMode]
            raise bad_input(env_id, "autoreset_mode", f"one of {modes}", describe(autoreset_mode)) from None
        # what trainers read (trainers/env_contract.py); wrappers forward metadata, not attributes
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": self.autoreset_mode,
            "chunk_size": chunk_size,
        }
        self.render_mode = render_mode
        self.initial_frames = initial_frames
        self.single_observation_space = single_observation_space
        self.single_action_space = chunk_action_space(action_low, action_high, chunk_size)
        self.observation_space = gym.vector.utils.batch_space(single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._has_text = "instruction" in single_observation_space.spaces
        self._array_keys = [k for k in single_observation_space.spaces if k != "instruction"]

        n = self.num_envs
        self._obs = {
            k: np.zeros((n, *single_observation_space[k].shape), single_observation_space[k].dtype)
            for k in self._array_keys
        }
        self._frames: list[InitialFrame | None] = [None] * n
        self._frame_ids = np.full(n, -1, np.int64)
        self._length = np.zeros(n, np.int64)
        self._return = np.zeros(n, np.float64)
        self._success_once = np.zeros(n, bool)
        self._last_success = np.zeros(n, bool)
        self._limit = np.zeros(n, np.int64)
        self._ended = np.zeros(n, bool)  # episode over, waiting for (auto)reset
        self._started = np.zeros(n, bool)  # reset at least once

    # ------------------------------------------------------------------ hooks for backends
    def _reset_envs(self, env_ids: np.ndarray, frames: list[InitialFrame]) -> dict[str, np.ndarray]:
        """Put ``env_ids`` at ``frames``; return their batched observations (no instruction)."""
        raise NotImplementedError

    def _step_envs(self, env_ids: np.ndarray, actions: np.ndarray, max_steps: np.ndarray) -> ChunkResult:
        """Run one chunk ``actions[i]`` (K, D) on each env, at most ``max_steps[i]`` sub-steps."""
        raise NotImplementedError

    def _check_frame(self, frame: InitialFrame) -> str | None:
        """Return why ``frame`` cannot start an episode here, or None if it can."""
        return None

    def _max_episode_steps(self, frame: InitialFrame) -> int:
        """Sub-step limit of an episode started from ``frame``."""
        raise NotImplementedError

    def _seed_backend(self, seed: int) -> None:
        """Seed the backend's own random streams (a world model's noise); ``reset(seed=)`` calls it
        after validating the call and seeding the env's RNG."""

    def _episode_stats(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Backend-specific statistics of episodes ending now in ``env_ids`` (their final state is
        still current), added to ``info["episode"]``; e.g. B1K's partial-success q-score."""
        return {}

    # ------------------------------------------------------------------ reset
    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        self._check_open("reset")
        if options is not None and not isinstance(options, dict):
            raise bad_input(self.env_id, "reset options", "a dict or None", describe(options))
        options = dict(options or {})
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise bad_input(self.env_id, "reset option", f"keys among {RESET_OPTIONS}", unknown)
        mask = self._parse_mask(options.get("reset_mask"))
        if not self._started.all() and not mask.all():
            raise bad_input(self.env_id, "reset_mask", "all True on the first reset", mask)
        env_ids = np.flatnonzero(mask)
        spec = options.get("initial_frames")
        frames = None if spec is None else self._resolve_frames(spec, len(env_ids))
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(self._seed_int(seed))
            self._seed_backend(self._seed_int(seed))
        if frames is None:
            frames = self._draw_frames(len(env_ids))
        infos: dict[str, Any] = {}
        self._start_episodes(env_ids, frames, infos)
        return self._observations(), infos

    def _check_open(self, call: str) -> None:
        if self.closed:
            raise closed_env(self.env_id, call)

    def _parse_mask(self, mask: Any) -> np.ndarray:
        if mask is None:
            return np.ones(self.num_envs, bool)
        mask = np.asarray(mask)
        if mask.dtype != np.bool_ or mask.shape != (self.num_envs,) or not mask.any():
            raise bad_input(
                self.env_id,
                "reset_mask",
                f"a bool array of shape ({self.num_envs},) with a True",
                describe(mask),
            )
        return mask

    def _max_seed(self) -> int:
        """The largest int seed every random stream here takes (torch generators: 2**64 - 1)."""
        return 2**64 - 1

    def _seed_int(self, seed: int | Sequence[int]) -> int:
        """``seed`` as the int every stream is seeded with, or a ``ValueError`` before any is seeded.

        An int must be in ``[0, _max_seed()]``: larger ones are refused, not reduced (numpy would take
        them, a world model's ``torch.Generator`` would not). A non-empty list of non-negative ints
        (any size) is reduced to one 32-bit int by ``np.random.SeedSequence``.
        """

        def ok(value: Any, high: int | None) -> bool:
            integer = isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)
            return integer and 0 <= value and (high is None or value <= high)

        high = self._max_seed()
        if ok(seed, high):
            return int(seed)
        listed = isinstance(seed, Sequence) and not isinstance(seed, str) and len(seed) > 0
        if listed and all(ok(s, None) for s in seed):
            return int(np.random.SeedSequence([int(s) for s in seed]).generate_state(1)[0])
        raise bad_input(
            self.env_id,
            "seed",
            f"an int in [0, 2**64 - {2**64 - high}] or a non-empty list of non-negative ints",
            describe(seed),
        )

    def _resolve_frames(self, spec: Any, count: int) -> list[tuple[InitialFrame, int]]:
        if isinstance(spec, InitialFrame | int | np.integer):
            spec = [spec]
        if not isinstance(spec, Sequence | np.ndarray) or isinstance(spec, str):
            raise bad_input(
                self.env_id,
                "initial_frames",
                "an int id, an InitialFrame or a sequence of them",
                describe(spec),
            )
        spec = list(spec)
        if len(spec) != count:
            raise bad_input(self.env_id, "initial_frames", f"{count} entries (one per env reset)", len(spec))
        out = []
        for item in spec:
            if isinstance(item, InitialFrame):
                why = self._check_frame(item)
                if why:
                    raise bad_input(
                        self.env_id, "initial frame", why, describe(item.task or item.instruction)
                    )
                out.append((item, -1))
            elif isinstance(item, int | np.integer) and not isinstance(item, bool):
                if not 0 <= item < len(self.initial_frames):
                    raise bad_input(
                        self.env_id,
                        "initial frame id",
                        f"an int in [0, {len(self.initial_frames)})",
                        int(item),
                    )
                out.append((self.initial_frames[int(item)], int(item)))
            else:
                raise bad_input(
                    self.env_id, "initial_frames entry", "an int id or an InitialFrame", describe(item)
                )
        return out

    def _draw_frames(self, count: int) -> list[tuple[InitialFrame, int]]:
        ids = self.np_random.integers(0, len(self.initial_frames), size=count)
        return [(self.initial_frames[int(i)], int(i)) for i in ids]

    def _start_episodes(
        self, env_ids: np.ndarray, frames: list[tuple[InitialFrame, int]], infos: dict
    ) -> None:
        """Reset ``env_ids`` through the backend and start fresh episode bookkeeping."""
        obs = self._reset_envs(env_ids, [f for f, _ in frames])
        for key in self._array_keys:
            self._obs[key][env_ids] = obs[key]
        for i, (frame, frame_id) in zip(env_ids, frames, strict=True):
            self._frames[i] = frame
            self._frame_ids[i] = frame_id
            self._limit[i] = self._max_episode_steps(frame)
        self._length[env_ids] = 0
        self._return[env_ids] = 0.0
        self._success_once[env_ids] = False
        self._last_success[env_ids] = False
        self._ended[env_ids] = False
        self._started[env_ids] = True
        _put(infos, "initial_frame_id", self._frame_ids[env_ids], env_ids, self.num_envs)

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_open("step")
        if not self._started.all():
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        actions = self._check_actions(actions)
        n, k = self.num_envs, actions.shape[1]
        rewards = np.zeros(n, np.float64)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        chunk_rewards = np.zeros((n, k), np.float32)
        chunk_valid = np.zeros((n, k), bool)
        chunk_success = np.zeros((n, k), bool)
        infos: dict[str, Any] = {}

        if self.autoreset_mode == AutoresetMode.NEXT_STEP and self._ended.any():
            to_reset = np.flatnonzero(self._ended)
            self._start_episodes(to_reset, self._draw_frames(len(to_reset)), infos)
            active = np.flatnonzero(~np.isin(np.arange(n), to_reset))
        else:  # DISABLED: ended envs stay frozen (zero reward, no sub-step executed)
            active = np.flatnonzero(~self._ended)

        if len(active):
            res = self._step_envs(active, actions[active], self._limit[active] - self._length[active])
            self._check_result(res, len(active), k)
            for key in self._array_keys:
                self._obs[key][active] = res.obs[key]
            valid = res.valid.astype(bool)
            r = np.where(valid, res.rewards, 0.0).astype(np.float32)
            chunk_rewards[active], chunk_valid[active] = r, valid
            rewards[active] = r.sum(1, dtype=np.float64)
            self._length[active] += valid.sum(1)
            self._return[active] += rewards[active]
            success = res.success.astype(bool) & valid
            chunk_success[active] = success
            self._success_once[active] |= success.any(1)
            ran = valid.any(1)
            last = np.maximum(valid.sum(1) - 1, 0)
            self._last_success[active] = np.where(
                ran, success[np.arange(len(active)), last], self._last_success[active]
            )
            term = res.terminated.astype(bool)
            crashed = np.zeros(len(active), bool) if res.crashed is None else res.crashed.astype(bool)
            cut = np.zeros(len(active), bool) if res.cut is None else res.cut.astype(bool)
            trunc = ~term & ((self._length[active] >= self._limit[active]) | crashed | cut)
            terminated[active], truncated[active] = term, trunc
            for key, value in res.info.items():
                _put(infos, key, value, active, n)
            if crashed.any():
                _put(infos, "worker_restarted", crashed, active, n)
            self._finish_episodes(active[term | trunc], infos)

        infos["chunk_rewards"], infos["chunk_valid"] = chunk_rewards, chunk_valid
        infos["chunk_success"] = chunk_success
        return self._observations(), rewards, terminated, truncated, infos

    def _finish_episodes(self, done: np.ndarray, infos: dict[str, Any]) -> None:
        if not len(done):
            return
        self._ended[done] = True
        stats = {
            "success": self._last_success[done].copy(),
            "success_once": self._success_once[done].copy(),
            "return": self._return[done].copy(),
            "length": self._length[done].copy(),
            **self._episode_stats(done),
        }
        episode = infos.setdefault("episode", {})
        for key, value in stats.items():
            _put(episode, key, value, done, self.num_envs)
        done_mask = np.isin(np.arange(self.num_envs), done)
        infos["_episode"] = infos.get("_episode", np.zeros(self.num_envs, bool)) | done_mask
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in done:
                final_obs[i] = self._single_obs(i)
            final_info: dict[str, Any] = {}
            for key, value in infos.items():
                if not key.startswith("_") and "_" + key in infos:
                    final_info[key], final_info["_" + key] = value, infos["_" + key] & done_mask
            infos["final_obs"], infos["_final_obs"] = final_obs, done_mask
            infos["final_info"], infos["_final_info"] = final_info, done_mask.copy()
            self._start_episodes(done, self._draw_frames(len(done)), infos)

    def _check_actions(self, actions: Any) -> np.ndarray:
        """Validate the batch of actions; return float32 ``(N, K, D)`` clipped to the bounds."""
        a = np.asarray(actions)
        expected = self.action_space.shape
        if a.shape != expected:
            raise bad_input(self.env_id, "actions", f"shape {expected}", describe(a))
        if not np.issubdtype(a.dtype, np.floating):
            raise bad_input(self.env_id, "actions", "a float array (float32)", describe(a))
        if not np.isfinite(a).all():
            bad = np.argwhere(~np.isfinite(a))[0].tolist()
            raise bad_input(self.env_id, "actions", "finite values", f"NaN/inf at index {bad}")
        a = np.clip(a.astype(np.float32), self.action_space.low, self.action_space.high)
        return a[:, None, :] if self.chunk_size is None else a

    def _check_result(self, res: ChunkResult, n: int, k: int) -> None:
        for name in ("rewards", "valid", "success"):
            shape = np.shape(getattr(res, name))
            if shape != (n, k):
                raise RuntimeError(
                    f"{self.env_id}: backend returned {name} of shape {shape}, expected {(n, k)}"
                )
        if np.shape(res.terminated) != (n,):
            raise RuntimeError(
                f"{self.env_id}: backend returned terminated of shape {np.shape(res.terminated)}"
            )
        if not np.isfinite(res.rewards).all():
            raise RuntimeError(f"{self.env_id}: backend returned non-finite rewards {res.rewards}")

    # ------------------------------------------------------------------ bookkeeping state
    _EPISODE_FIELDS = ("_obs", "_frames", "_frame_ids", "_length", "_return", "_success_once",
                       "_last_success", "_limit", "_ended", "_started")  # fmt: skip

    def _episode_state(self) -> dict[str, Any]:
        """A deep copy of everything this class tracks per env, plus its RNG (for ``get_state``)."""
        self._check_open("get_state")
        state = {name: copy.deepcopy(getattr(self, name)) for name in self._EPISODE_FIELDS}
        state["np_random"] = copy.deepcopy(self.np_random.bit_generator.state)
        return state

    def _check_episode_state(self, state: Any) -> None:
        """Raise ``ValueError`` unless ``state`` is an ``_episode_state`` this env can go on from;
        changes nothing. Checked: every entry present; the same ``num_envs``, observation shapes and
        dtypes, array shapes and dtypes and RNG kind; finite float observations and returns;
        well-formed ``InitialFrame``s; every env started or none (the first reset starts all), a
        started env with a frame, a never-started one without; frame ids -1 (a frame given at
        reset) or in range, naming a frame with the same instruction and task; lengths >= 0, limits
        >= 1, a running episode's length below its limit, an ended one's at most its limit."""
        if not isinstance(state, dict):
            raise bad_input(self.env_id, "state", "an episode state (a dict)", type(state).__name__)
        missing = [name for name in (*self._EPISODE_FIELDS, "np_random") if name not in state]
        if missing:
            raise BadInput(f"{self.env_id}: bad state: missing entries {missing}")

        def bad(name: str, expected: str, received: Any) -> BadInput:
            return bad_input(self.env_id, f"state['episode']['{name}']", expected, received)

        want = {k: (v.shape, v.dtype) for k, v in self._obs.items()}
        obs = state["_obs"]
        if not (
            isinstance(obs, dict)
            and set(obs) == set(want)
            and all(_array_like(v, self._obs[k]) for k, v in obs.items())
        ):
            got = {k: describe(v) for k, v in obs.items()} if isinstance(obs, dict) else describe(obs)
            raise bad("_obs", f"observations of shapes and dtypes {want}", got)
        for key, value in obs.items():
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                raise bad("_obs", "finite observations", f"NaN/inf in {key!r}")
        frames = state["_frames"]
        if type(frames) is not list or len(frames) != self.num_envs:
            raise bad("_frames", f"a list of {self.num_envs} episode starts", describe(frames))
        for i, frame in enumerate(frames):
            why = None if frame is None else frame_problem(frame)
            if why:
                raise bad("_frames", "InitialFrames (or None before the first reset)", f"env {i}: {why}")
        for name in self._EPISODE_FIELDS:
            if name in ("_obs", "_frames"):
                continue
            mine, value = getattr(self, name), state[name]
            if not _array_like(value, mine):
                raise bad(name, f"an array of shape {mine.shape} and dtype {mine.dtype}", describe(value))
        started, ended = state["_started"], state["_ended"]
        if started.any() and not started.all():
            raise bad(
                "_started", "all True or all False (the first reset starts every env)", started.tolist()
            )
        ids, count = state["_frame_ids"], len(self.initial_frames)
        for i in range(self.num_envs):
            if not started[i]:
                if frames[i] is not None or ids[i] != -1 or ended[i]:
                    got = f"env {i} not reset: frame {describe(frames[i])}, id {ids[i]}, ended {ended[i]}"
                    raise bad("_started", "no frame, frame id -1 and not ended before the first reset", got)
                continue
            if frames[i] is None:
                raise bad("_frames", "an InitialFrame for every env that was reset", f"None for env {i}")
            if not -1 <= ids[i] < count:
                raise bad(
                    "_frame_ids", f"ints in [-1, {count}) (-1: a frame given at reset)", f"env {i}: {ids[i]}"
                )
            if ids[i] >= 0:
                mine = self.initial_frames[int(ids[i])]
                if (mine.instruction, mine.task) != (frames[i].instruction, frames[i].task):
                    raise bad(
                        "_frame_ids",
                        f"ids of this env's initial frames (id {ids[i]}: {mine.instruction!r})",
                        f"env {i}: a frame of {frames[i].instruction!r} (a state of another frame set?)",
                    )
        length, limit = state["_length"], state["_limit"]
        if (length < 0).any():
            raise bad("_length", "sub-step counts >= 0", length.tolist())
        if (started & (limit < 1)).any():
            raise bad("_limit", "step limits >= 1", limit.tolist())
        running = started & ~ended
        over = (running & (length >= limit)) | (started & (length > limit))
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise bad(
                "_length",
                "lengths below the limit (at most the limit once the episode ended)",
                f"env {i}: length {length[i]}, limit {limit[i]}, ended {ended[i]}",
            )
        if not np.isfinite(state["_return"]).all():
            raise bad("_return", "finite returns", state["_return"].tolist())
        try:  # on a new generator of the same kind, so ours is untouched
            type(self.np_random.bit_generator)().state = state["np_random"]
        except Exception as e:
            raise bad_input(
                self.env_id, "state['episode']['np_random']", "the env's RNG state", f"unusable ({e})"
            ) from None

    def _load_episode_state(self, state: dict[str, Any]) -> None:
        """Inverse of ``_episode_state``; checks all of it first so nothing is half-applied."""
        self._check_open("load_state")
        self._check_episode_state(state)
        for name in self._EPISODE_FIELDS:
            setattr(self, name, state[name])
        self.np_random.bit_generator.state = state["np_random"]

    # ------------------------------------------------------------------ observations and frames
    def _observations(self) -> dict[str, Any]:
        obs: dict[str, Any] = {k: v.copy() for k, v in self._obs.items()}
        if self._has_text:
            obs["instruction"] = tuple(f.instruction if f else "" for f in self._frames)
        return obs

    def _single_obs(self, i: int) -> dict[str, Any]:
        obs: dict[str, Any] = {k: v[i].copy() for k, v in self._obs.items()}
        if self._has_text:
            obs["instruction"] = self._frames[i].instruction
        return obs

    def current_frames(self) -> list[InitialFrame]:
        """Each env's current observation as an ``InitialFrame`` (images, instruction, task).

        Right after a reset these are the episodes' starts: save them with ``save_initial_frames``
        to start a world model (or another simulator run) from the same places.
        """
        self._check_open("current_frames")
        frames = []
        for i, start in enumerate(self._frames):
            if start is None:
                raise RuntimeError(f"{self.env_id}: call reset() before current_frames()")
            frames.append(
                InitialFrame(
                    instruction=start.instruction,
                    task=start.task,
                    image=self._obs["image"][i].copy() if "image" in self._obs else None,
                    wrist_image=self._obs["wrist_image"][i].copy() if "wrist_image" in self._obs else None,
                    sim_state=start.sim_state,
                    meta=dict(start.meta),
                )
            )
        return frames

    def render(self) -> tuple[np.ndarray, ...] | None:
        """The current main-camera image of every env (``rgb_array`` mode)."""
        self._check_open("render")
        if self.render_mode != "rgb_array" or "image" not in self._obs:
            return None
        return tuple(self._obs["image"].copy())


def _array_like(value: Any, mine: np.ndarray) -> bool:
    """``value`` is a writeable numpy array of ``mine``'s shape and dtype (a state entry that can
    replace ``mine``)."""
    return (
        type(value) is np.ndarray
        and value.shape == mine.shape
        and value.dtype == mine.dtype
        and value.flags.writeable
    )


def _put(infos: dict[str, Any], key: str, values: np.ndarray, env_ids: np.ndarray, num_envs: int) -> None:
    """Write per-env ``values`` for ``env_ids`` into ``infos[key]`` with its ``_key`` mask."""
    values = np.asarray(values)
    if key not in infos:
        infos[key] = np.zeros((num_envs, *values.shape[1:]), values.dtype)
        infos["_" + key] = np.zeros(num_envs, bool)
    infos[key][env_ids] = values
    infos["_" + key][env_ids] = True
