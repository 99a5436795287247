"""A chunked vector env whose envs live in Ray actors, on any node of a Ray cluster.

Each actor (``EnvHost``) builds the backend's own vector env for its share of the envs (LIBERO with
its worker processes, a world model on the actor's GPU). This process keeps what the base class
owns: validation, autoreset, episode bookkeeping and statistics, the info dict, the RNG that draws
initial frames. So for the same initial frames and actions the observations, rewards and statistics
are those of the local vector env. Per step, every actor gets one call (its envs' chunks) and all
run concurrently; arrays come back through Ray's object store.

Every call on an actor has a deadline (``step_timeout_s`` for a step, ``reset_timeout_s`` for a
reset and every other call; by default a margin over the backend's own deadlines for its workers,
so LIBERO's ``step_timeout_s`` bounds a step on Ray too). An actor that dies, or has not answered
by then (hung, or stopped with SIGSTOP), is lost, as a local worker is: a silent one is killed,
Ray starts a fresh one with the same arguments (``max_restarts``), the call returns with the other
actors' results, and the lost actor's envs are truncated with ``worker_restarted`` and start again
at their next reset (the next call on the actor first waits until the fresh one answers).

Seeding: ``reset(seed=s)`` seeds the frame draws here, and actor j's own streams (a world model's
noise, LIBERO's ``scene_seed=None`` layouts) with ``s + j``: with one actor, everything equals the
local env seeded with ``s``. A restarted actor's streams start unseeded.

``get_state()`` / ``load_state()`` save and restore the episodes (this process's bookkeeping and
every actor's backend state) where the backend has them (world models); a state that does not fit
is refused before this process or any actor changes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode

from envs.core.errors import bad_input, check_float, describe
from envs.core.frames import InitialFrame
from envs.core.vector_env import ChunkedVectorEnv, ChunkResult
from envs.ray.actors import ActorHost, ActorSet, needs_state
from nets.errors import BadInput

STATE_KIND = "RayVectorEnv"  # marks get_state's bytes, told apart from a local env's


class EnvHost(ActorHost):
    """What runs inside one Ray actor: the backend's vector env over this actor's envs, driven
    through the backend hooks (the ``RayVectorEnv`` in the driver owns the bookkeeping)."""

    def __init__(self, vector_class: str, num_envs: int, env_kwargs: dict[str, Any]) -> None:
        kwargs = {**env_kwargs, "autoreset_mode": AutoresetMode.DISABLED}
        super().__init__(lambda: load_env_creator(vector_class)(num_envs=num_envs, **kwargs))
        self._backup: bytes | None = None  # the state before stage_state, until finish_state

    def describe(self) -> dict[str, Any]:
        base = super().describe()
        env = self.env
        overrides = type(env)._episode_stats is not ChunkedVectorEnv._episode_stats
        return {
            **base,
            "env_id": env.env_id,
            "observation_space": env.single_observation_space,
            "action_space": env.single_action_space,
            "chunk_size": env.chunk_size,
            "initial_frames": env.initial_frames,
            "render_mode": env.render_mode,
            "metadata": {k: v for k, v in env.metadata.items() if k not in ("autoreset_mode", "chunk_size")},
            "has_episode_stats": overrides,
            "backend": f"{type(env).__module__}.{type(env).__qualname__}",
            "has_state": callable(getattr(env, "get_state", None))
            and callable(getattr(env, "load_state", None)),
            # the backend's own deadlines for its workers (LIBERO), which the driver's allow for
            "step_timeout_s": getattr(env, "step_timeout_s", None),
            "reset_timeout_s": getattr(env, "reset_timeout_s", None),
        }

    @needs_state
    def check_frames(self, frames: list[InitialFrame]) -> list[str | None]:
        return [self.env._check_frame(f) for f in frames]

    @needs_state
    def reset_envs(
        self, env_ids: np.ndarray, frames: list[InitialFrame], seed: int | None
    ) -> tuple[dict[str, np.ndarray], list[int]]:
        if seed is not None:
            self.seed(seed)
        obs = self.env._reset_envs(env_ids, frames)
        return obs, [int(self.env._max_episode_steps(f)) for f in frames]

    @needs_state
    def step_envs(self, env_ids: np.ndarray, actions: np.ndarray, max_steps: np.ndarray) -> ChunkResult:
        return self.env._step_envs(env_ids, actions, max_steps)

    @needs_state
    def episode_stats(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        return self.env._episode_stats(env_ids)

    @needs_state
    def get_state(self) -> bytes:
        return self.env.get_state()

    @needs_state
    def stage_state(self, data: bytes) -> str | None:
        """Load ``data``, keeping the state before it until ``finish_state``. If it does not load,
        return why (a ``ValueError``'s message) or re-raise, with this actor back where it was."""
        backup = self.env.get_state()
        try:
            self.env.load_state(data)
        except ValueError as e:
            self.env.load_state(backup)
            return str(e)
        except BaseException:
            self.env.load_state(backup)
            raise
        self._backup = backup
        return None

    @needs_state
    def finish_state(self, keep: bool) -> None:
        """Keep the staged state, or (``keep=False``) go back to the state before it."""
        backup, self._backup = self._backup, None
        if not keep and backup is not None:
            self.env.load_state(backup)

    @needs_state
    def seed(self, seed: int) -> None:
        self.env._np_random, self.env._np_random_seed = gym.utils.seeding.np_random(seed)
        self.env._seed_backend(seed)

    @needs_state
    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        attr = getattr(self.env, name)
        return attr(*args, **kwargs) if callable(attr) else attr

    @needs_state
    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.env, name, value)


class RayVectorEnv(ChunkedVectorEnv):
    """A registered env's vector env with its ``num_envs`` envs spread over ``num_actors`` Ray actors.

    Usually built through ``gym.make_vec(id, num_envs, ray_actors=M, ray_options=..., ...)``; the
    rest of the keyword arguments go to the backend in every actor. Same contract as the local vector
    env: chunks, ``initial_frames`` ids and ``InitialFrame``s, ``reset_mask``, the three autoreset
    modes, ``current_frames()``, episode statistics, ``get_state``/``load_state`` where the backend has
    them; bad input is refused here, before any actor is called. Actor ``j`` holds envs
    ``offsets[j]`` to ``offsets[j + 1] - 1`` (sizes differ by at most 1).

    Args:
        vector_class: the backend's vector env class, ``"module:Class"`` (what the id registered).
        num_envs: envs in all.
        num_actors: Ray actors to spread them over (at most ``num_envs``).
        env_kwargs: the backend's keyword arguments (``autoreset_mode`` applies here).
        actor_options: per-actor Ray resources: ``num_cpus`` (default 1), ``num_gpus`` (a world model
            on a GPU; Ray sets the actor's ``CUDA_VISIBLE_DEVICES``, which LIBERO's EGL rendering
            follows too), ``memory``, ``resources``, ``runtime_env``, ``accelerator_type``.
        placement: ``pack`` (as few nodes as possible), ``spread``, ``strict_pack`` or ``strict_spread``;
            the actors are placed in one Ray placement group with this strategy.
        address: the Ray cluster to join when Ray is not yet initialized in this process (``"auto"``,
            ``"host:port"``, ``"ray://host:port"``, ``"local"``: always a new one on this machine);
            None: Ray's default (the cluster ``ray start`` started on this node, else a new local one).
        max_restarts: how often Ray restarts a lost actor (-1: always; 0: a lost actor is an error).
        ready_timeout_s: how long to wait for the cluster to place the actors.
        restart_timeout_s: how long an actor may take to build its env, at the start and after a
            restart, before it is given up (``RuntimeError``).
        step_timeout_s: how long an actor may take to answer a step before it counts as hung or
            stopped: killed and restarted, its envs truncated with ``worker_restarted``. Default:
            the backend's own ``step_timeout_s`` plus half of it (at least 10 s) where it has one
            (LIBERO: its deadline for its workers runs out first), else 120 s.
        reset_timeout_s: the same for a reset and every other call (default: the backend's
            ``reset_timeout_s`` plus half of it, at least 30 s, else 600 s).
    """

    def __init__(
        self,
        vector_class: str,
        num_envs: int,
        *,
        num_actors: int,
        env_kwargs: dict[str, Any] | None = None,
        actor_options: dict[str, Any] | None = None,
        placement: str = "pack",
        address: str | None = None,
        max_restarts: int = -1,
        ready_timeout_s: float = 60.0,
        restart_timeout_s: float = 300.0,
        step_timeout_s: float | None = None,
        reset_timeout_s: float | None = None,
    ) -> None:
        env_kwargs = dict(env_kwargs or {})
        name = str(env_kwargs.get("env_id") or vector_class)
        autoreset_mode = env_kwargs.pop("autoreset_mode", AutoresetMode.NEXT_STEP)
        check_float(name, "ray_restart_timeout_s", restart_timeout_s, low=0.01)
        for what, value in (("ray_step_timeout_s", step_timeout_s), ("ray_reset_timeout_s", reset_timeout_s)):
            if value is not None:
                check_float(name, what, value, low=0.01)
        self.actors = ActorSet(
            name, num_envs, num_actors, actor_options, placement, address, max_restarts, ready_timeout_s
        )
        ray = self.actors.ray
        try:
            desc = self.actors.start(
                EnvHost, [(vector_class, n, env_kwargs) for n in self.actors.sizes], restart_timeout_s
            )[0]
            self._hosts = self.actors.hosts
            space = desc["action_space"]
            chunked = desc["chunk_size"] is not None
            super().__init__(
                env_id=desc["env_id"],
                num_envs=num_envs,
                single_observation_space=desc["observation_space"],
                action_low=space.low[0] if chunked else space.low,
                action_high=space.high[0] if chunked else space.high,
                chunk_size=desc["chunk_size"],
                initial_frames=desc["initial_frames"],
                autoreset_mode=autoreset_mode,
                render_mode=desc["render_mode"],
            )
        except BaseException:
            self.actors.release()
            raise
        self.metadata = {**desc["metadata"], **self.metadata}
        self.vector_class = vector_class
        self.num_actors = num_actors
        self.offsets = self.actors.offsets
        self.max_restarts, self.restart_timeout_s = max_restarts, restart_timeout_s
        self.step_timeout_s = float(step_timeout_s or _deadline(desc["step_timeout_s"], 120.0, 10.0))
        self.reset_timeout_s = float(reset_timeout_s or _deadline(desc["reset_timeout_s"], 600.0, 30.0))
        self.actors.after_restart = self._after_restart
        self._ray = ray
        self._has_episode_stats = desc["has_episode_stats"]
        self._backend, self._has_state = desc["backend"], desc["has_state"]
        self._lost = np.zeros(num_envs, bool)  # env whose actor died: truncated, waits for a reset
        self._pending_seed: int | None = None
        self._limits: list[int] = []
        self._checked: dict[int, str | None] = {}
        self._record_frames = False

    # ---------------------------------------------------------------- backend hooks (one call per actor)
    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        self._pending_seed = None if seed is None else self._seed_int(seed)
        try:
            return super().reset(seed=seed, options=options)
        finally:
            self._pending_seed = None

    def _max_seed(self) -> int:
        return 2**64 - self.num_actors  # actor j's streams get seed + j: each must fit a torch generator

    def _resolve_frames(self, spec: Any, count: int) -> list[tuple[InitialFrame, int]]:
        items = (
            list(spec) if isinstance(spec, Sequence | np.ndarray) and not isinstance(spec, str) else [spec]
        )
        given = [item for item in items if isinstance(item, InitialFrame)]
        if given:  # checked by the backend in one call, not one round trip per frame
            self._check_open("reset")
            reasons = self._ask(0, "check_frames", given)
            self._checked = {id(f): why for f, why in zip(given, reasons)}
        try:
            return super()._resolve_frames(spec, count)
        finally:
            self._checked = {}

    def _check_frame(self, frame: InitialFrame) -> str | None:
        if id(frame) in self._checked:
            return self._checked[id(frame)]
        return self._ask(0, "check_frames", [frame])[0]

    def _max_episode_steps(self, frame: InitialFrame) -> int:
        return self._limits.pop(0)  # the backend's limits, in reset order (see _reset_envs)

    def _reset_envs(self, env_ids: np.ndarray, frames: list[InitialFrame]) -> dict[str, np.ndarray]:
        seed = self._pending_seed
        parts = self._split(env_ids)
        calls = {j: (local, [frames[p] for p in pos]) for j, pos, local in parts}
        results: dict[int, Any] = {}
        host = self.actors.host  # waits for an actor being restarted
        try:
            for attempt in range(2):  # a restarted actor gets one more try
                refs = {
                    j: host(j).reset_envs.remote(local, fr, None if seed is None else seed + j)
                    for j, (local, fr) in calls.items()
                    if j not in results
                }
                if seed is not None and attempt == 0:  # actors without envs in this reset follow the seed
                    for j in sorted(set(range(self.num_actors)) - set(calls)):
                        refs[j] = host(j).seed.remote(seed + j)
                got, lost, error = self.actors.gather(refs, self.reset_timeout_s)
                results.update({j: r for j, r in got.items() if j in calls})
                for j, (hung, what) in lost.items():
                    self._lose(j, hung, what, "reset")
                if error is not None:
                    raise error
                died = [j for j in lost if j in calls]
                if not died:
                    break
            else:
                raise RuntimeError(f"{self.env_id}: Ray actors {died} were lost twice in one reset")
        except BaseException:
            # some actors may be at their new starts, others not: none is where the bookkeeping says
            self._lost[env_ids] = True
            raise
        self._lost[env_ids] = False
        obs = {
            key: np.empty((len(env_ids), *self._obs[key].shape[1:]), self._obs[key].dtype)
            for key in self._obs
        }
        limits = np.zeros(len(env_ids), np.int64)
        for j, pos, _ in parts:
            actor_obs, actor_limits = results[j]
            for key in obs:
                obs[key][pos] = actor_obs[key]
            limits[pos] = actor_limits
        self._limits = limits.tolist()
        return obs

    def _step_envs(self, env_ids: np.ndarray, actions: np.ndarray, max_steps: np.ndarray) -> ChunkResult:
        n, k = actions.shape[:2]
        crashed = self._lost[env_ids].copy()
        where, refs = {}, {}
        for j, pos, local in self._split(env_ids):
            live = ~crashed[pos]  # lost envs (lost actor, failed reset) wait for their next reset
            if live.any():
                where[j], local = pos[live], local[live]
                refs[j] = self.actors.host(j).step_envs.remote(local, actions[where[j]], max_steps[where[j]])
        results, lost, error = self.actors.gather(refs, self.step_timeout_s)  # all actors at once
        out = ChunkResult(
            obs={key: self._obs[key][env_ids].copy() for key in self._array_keys},  # kept where crashed
            rewards=np.zeros((n, k), np.float32),
            valid=np.zeros((n, k), bool),
            success=np.zeros((n, k), bool),
            terminated=np.zeros(n, bool),
            crashed=crashed,
            cut=np.zeros(n, bool),
        )
        for j, (hung, what) in lost.items():  # the others' results are kept
            self._lose(j, hung, what, "step")
            out.crashed[where[j]] = True
        if error is not None:
            raise error
        for j, res in results.items():
            pos = where[j]
            for key in self._array_keys:
                out.obs[key][pos] = res.obs[key]
            out.rewards[pos], out.valid[pos], out.success[pos] = res.rewards, res.valid, res.success
            out.terminated[pos] = res.terminated
            if res.crashed is not None:
                out.crashed[pos] |= res.crashed
            if res.cut is not None:
                out.cut[pos] = res.cut
            for key, value in res.info.items():
                value = np.asarray(value)
                if key not in out.info:
                    out.info[key] = np.zeros((n, *value.shape[1:]), value.dtype)
                out.info[key][pos] = value
        return out

    def _episode_stats(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        if not self._has_episode_stats:
            return {}
        stats: dict[str, np.ndarray] = {}
        where, refs = {}, {}
        for j, pos, local in self._split(env_ids):
            if not self._lost[env_ids[pos]].any():
                where[j], refs[j] = pos, self.actors.host(j).episode_stats.remote(local)
        results, lost, error = self.actors.gather(refs, self.reset_timeout_s)
        for j, (hung, what) in lost.items():
            self._lose(j, hung, what, "episode statistics")
        if error is not None:
            raise error
        for j, part in results.items():
            for key, value in part.items():
                value = np.asarray(value)
                stat = stats.setdefault(key, np.zeros((len(env_ids), *value.shape[1:]), value.dtype))
                stat[where[j]] = value
        return stats

    # ---------------------------------------------------------------- helpers
    def _split(self, env_ids: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        return self.actors.split(env_ids)

    def _lose(self, j: int, hung: bool, what: str, call: str) -> None:
        """Actor j was lost (died, hung or stopped): its envs are lost (truncated with
        ``worker_restarted`` at the next step, until their next reset) and a fresh actor is started;
        the next call on it waits for it (``ActorSet.host``)."""
        self._lost[self.offsets[j] : self.offsets[j + 1]] = True
        self.actors.lose(j, hung, what, call)

    def _after_restart(self, j: int) -> None:
        """A fresh actor takes this env's settings that are not constructor arguments."""
        if self._record_frames:
            host = self.actors.hosts[j]
            self._ray.get(host.set_attr.remote("record_frames", True), timeout=self.reset_timeout_s)

    def _ask(self, j: int, method: str, *args: Any) -> Any:
        """``method(*args)`` on actor j under the reset deadline; an actor lost on the way is
        restarted (its envs lost) and asked once more."""
        for _ in range(2):
            ref = getattr(self.actors.host(j), method).remote(*args)
            results, lost, error = self.actors.gather({j: ref}, self.reset_timeout_s)
            if error is not None:
                raise error
            if j in results:
                return results[j]
            self._lose(j, *lost[j], method)
        raise RuntimeError(f"{self.env_id}: Ray actor {j} was lost twice in {method}")

    # ---------------------------------------------------------------- saving and restoring episodes
    def get_state(self) -> bytes:
        """Everything needed to continue these episodes later (not the weights), as bytes: the
        bookkeeping here and every actor's backend ``get_state()`` (world models have one).

        Raises ``NotImplementedError`` when the backend cannot save its state (LIBERO, B1K).
        """
        self._check_open("get_state")
        self._check_state_support("get_state")
        import torch  # here, not at import: `import envs` stays light

        refs = {j: self.actors.host(j).get_state.remote() for j in range(self.num_actors)}  # all at once
        results, lost, error = self.actors.gather(refs, self.reset_timeout_s)
        for j, (hung, what) in lost.items():
            self._lose(j, hung, what, "get_state")  # its envs are lost: saved as lost, with the new actor
        if error is not None:
            raise error
        parts = [results[j] if j in results else self._ask(j, "get_state") for j in range(self.num_actors)]
        state = {
            "kind": STATE_KIND,
            "env_id": self.env_id,
            "sizes": [int(n) for n in self.actors.sizes],
            "episode": self._episode_state(),
            "lost": self._lost.copy(),
            "actors": [torch.from_numpy(np.frombuffer(part, np.uint8).copy()) for part in parts],
        }
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()

    def load_state(self, data: bytes) -> None:
        """Restore a ``get_state`` snapshot of a Ray env of the same id, ``num_envs`` and actor split.

        The bytes are read as plain data: no code in them runs. Everything is checked (here, then
        by every actor's backend) before anything changes: a bad state raises ``ValueError`` and
        leaves this env and all its actors as they were.
        """
        self._check_open("load_state")
        self._check_state_support("load_state")
        state = self._read_state(data)
        parts = [part.numpy().tobytes() for part in state["actors"]]
        host = self.actors.host
        refs = {j: host(j).stage_state.remote(part) for j, part in enumerate(parts)}
        # an actor whose backend failed went back by itself; the others go back too
        results, lost, error = self.actors.gather(refs, self.reset_timeout_s)
        staged = [j for j, why in results.items() if why is None]
        refused = {j: why for j, why in results.items() if why is not None}
        if refused or lost or error is not None:
            back = {j: host(j).finish_state.remote(False) for j in staged}
            _, lost_back, _ = self.actors.gather(back, self.reset_timeout_s)
            for j, (hung, what) in {**lost, **lost_back}.items():
                self._lose(j, hung, what, "load_state")
            if error is not None:
                raise error
            if refused:
                j, why = next(iter(refused.items()))
                raise BadInput(
                    f"{self.env_id}: bad state: actor {j}'s part does not load ({why}); nothing was loaded"
                )
            raise RuntimeError(
                f"{self.env_id}: Ray actors {sorted(lost)} were lost during load_state; nothing was loaded"
            )
        keep = {j: host(j).finish_state.remote(True) for j in range(self.num_actors)}
        _, lost, _ = self.actors.gather(keep, self.reset_timeout_s)
        self._load_episode_state(state["episode"])  # checked in _read_state: cannot fail
        self._lost = state["lost"].copy()
        for j, (hung, what) in lost.items():  # its envs are lost, as after any lost actor
            self._lose(j, hung, what, "load_state")

    def _check_state_support(self, call: str) -> None:
        if not self._has_state:
            raise NotImplementedError(
                f"{self.env_id}: {call}() is not available: the backend {self._backend} cannot save its "
                "state (it has no get_state/load_state); world-model envs can"
            )

    def _read_state(self, data: Any) -> dict[str, Any]:
        """``get_state``'s bytes read safely and checked against this env (nothing is changed)."""
        import torch

        from nets.safe_load import UnsafeFileError, torch_load

        expected = "the bytes RayVectorEnv.get_state returned"
        if not isinstance(data, bytes | bytearray):
            raise bad_input(self.env_id, "state", expected, type(data).__name__)
        try:
            state = torch_load(io.BytesIO(data), numpy=True, allow=[InitialFrame], opt_in=None)
        except UnsafeFileError:
            raise
        except Exception as e:
            raise bad_input(self.env_id, "state", expected, f"unreadable ({e})") from None
        keys = {"kind", "env_id", "sizes", "episode", "lost", "actors"}
        if not isinstance(state, dict) or not keys <= set(state) or not _equal(state["kind"], STATE_KIND):
            got = f"entries {sorted(map(str, state))}" if isinstance(state, dict) else type(state).__name__
            raise bad_input(self.env_id, "state", expected, f"{got} (a local env's state?)")
        if not _equal(state["env_id"], self.env_id):
            raise bad_input(self.env_id, "state", f"a state of {self.env_id}", describe(state["env_id"]))
        sizes = [int(n) for n in self.actors.sizes]
        if not _equal(state["sizes"], sizes):
            raise bad_input(
                self.env_id,
                "state",
                f"a state of {self.num_envs} envs over {self.num_actors} actors of sizes {sizes}",
                f"actor sizes {describe(state['sizes'])}",
            )
        actors = state["actors"]
        if (
            not isinstance(actors, list)
            or len(actors) != self.num_actors
            or not all(
                isinstance(a, torch.Tensor) and a.dtype == torch.uint8 and a.dim() == 1 for a in actors
            )
        ):
            raise bad_input(
                self.env_id, "state", f"{self.num_actors} byte tensors (one per actor)", describe(actors)
            )
        lost = state["lost"]
        if not isinstance(lost, np.ndarray) or lost.dtype != np.bool_ or lost.shape != (self.num_envs,):
            raise bad_input(self.env_id, "state", f"lost flags of shape ({self.num_envs},)", describe(lost))
        self._check_episode_state(state["episode"])
        return state

    def call(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call method ``name`` (or read attribute ``name``) of every actor's backend env; one
        result per actor (e.g. ``offload`` / ``onload`` of world-model envs)."""
        self._check_open(name)
        refs = {j: self.actors.host(j).call.remote(name, args, kwargs) for j in range(self.num_actors)}
        results, lost, error = self.actors.gather(refs, self.reset_timeout_s)
        for j, (hung, what) in lost.items():
            self._lose(j, hung, what, name)
        if error is not None:
            raise error
        if lost:
            raise RuntimeError(
                f"{self.env_id}: Ray actors {sorted(lost)} were lost during {name}() and restarted (their "
                "envs are truncated with worker_restarted at the next step); call it again"
            )
        return [results[j] for j in range(self.num_actors)]

    @property
    def record_frames(self) -> bool:
        """Put every sub-step's frame in ``info["frames"]`` (backends that support it)."""
        return self._record_frames

    @record_frames.setter
    def record_frames(self, value: bool) -> None:
        self._check_open("record_frames")
        self._record_frames = bool(value)  # a restarted actor takes it too (_after_restart)
        refs = {
            j: self.actors.host(j).set_attr.remote("record_frames", bool(value))
            for j in range(self.num_actors)
        }
        _, lost, error = self.actors.gather(refs, self.reset_timeout_s)
        for j, (hung, what) in lost.items():
            self._lose(j, hung, what, "record_frames")
        if error is not None:
            raise error

    def actor_pids(self) -> list[int]:
        """Process ids of the actors (on their nodes)."""
        return self.actors.pids()

    def close_extras(self, **kwargs: Any) -> None:
        self.actors.release()


def _deadline(backend_s: float | None, default_s: float, slack_s: float) -> float:
    """The driver's deadline for a call: the backend's own (for its workers) with room for the
    restart that follows it, else ``default_s``."""
    return default_s if backend_s is None else float(backend_s) + max(slack_s, float(backend_s) / 2)


def _equal(value: Any, expected: str | list[int]) -> bool:
    """``value == expected`` for a value read from a state file, whatever its type."""
    if isinstance(expected, list):
        return (
            type(value) is list
            and len(value) == len(expected)
            and all(type(v) is int and v == e for v, e in zip(value, expected))
        )
    return type(value) is type(expected) and value == expected
