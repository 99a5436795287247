"""Any gymnasium env id's vector env spread over Ray actors: ``gym.make_vec("Ray-v0", num_envs, env=ID)``.

For ids that are not ours (``CartPole-v1``, a MuJoCo task, a third party's env): each actor builds
``gym.make_vec(ID, its share, vectorization_mode=...)`` and this class joins what the actors return
(observations, rewards, flags, gymnasium's info dicts with their ``_key`` masks, ``final_obs`` /
``final_info``). Autoreset happens inside each actor's vector env, in the mode asked for.
``reset(seed=s)`` seeds actor j with ``s + offsets[j]``: gymnasium seeds sub-env i of a vector env
with ``seed + i``, so the envs get exactly the seeds of one local vector env seeded with ``s``.
(This project's ids take ``ray_actors=`` directly: ``envs/ray/ray_env.py``.)

Semantics are gymnasium's vector envs': in ``Disabled`` mode a finished env must be reset (with
``reset_mask``) before the next step (a step that would step one is refused here, before any actor
is called). The trainers, which expect this project's envs to keep finished envs frozen in that
mode, run it with ``--autoreset-mode same_step``. Actions are checked here too, as this project's
envs check theirs: the batch's shape, a numeric dtype, finite values, Box actions clipped to the
bounds (and cast to the space's dtype), discrete ones within their range; a bad batch raises
``ValueError`` and no actor is called.

Lost actors, as for this project's ids (``actors.py``): every call has a deadline
(``ray_step_timeout_s``, ``ray_reset_timeout_s``); an actor that dies or does not answer by then
(hung, stopped) is killed and Ray starts a fresh one, whose envs are reset (unseeded). The step
reports the lost actor's envs as truncated with ``info["worker_restarted"]`` (reward 0), keeping the
other actors' results, in gymnasium's terms for the autoreset mode: ``NextStep`` returns their last
observation and the next step starts them again (reward 0, the action ignored); ``SameStep`` returns
the new episode's first observation, the last one in ``final_obs`` and ``worker_restarted`` in
``final_info`` too; ``Disabled`` returns their last observation and they must be reset before the
next step. An actor lost outside a step (in a reset of other envs, ``render``) is reported at the
next step; a reset that loses an actor starts it again and resets its envs on the fresh one.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import iterate

from envs.core.errors import bad_input, check_float, closed_env, describe
from envs.ray.actors import ActorHost, ActorSet, needs_state
from nets.errors import BadInput


class GymHost(ActorHost):
    """Inside a Ray actor: ``gym.make_vec`` of the id over this actor's envs."""

    def __init__(
        self, env: str, num_envs: int, vectorization: str, vector_kwargs: dict, kwargs: dict
    ) -> None:
        def build() -> gym.vector.VectorEnv:
            env_id = env
            if ":" in env_id:  # "module:Env-v0": the module registers the id
                module, _, env_id = env_id.partition(":")
                importlib.import_module(module)
            return gym.make_vec(
                env_id, num_envs, vectorization_mode=vectorization, vector_kwargs=vector_kwargs, **kwargs
            )

        super().__init__(build)

    def describe(self) -> dict[str, Any]:
        base = super().describe()
        env = self.env
        return {
            **base,
            "observation_space": env.single_observation_space,
            "action_space": env.single_action_space,
            "metadata": env.metadata,
            "render_mode": env.render_mode,
        }

    @needs_state
    def reset(self, seed: int | list[int] | None, options: dict | None) -> tuple[Any, dict]:
        return self.env.reset(seed=seed, options=options)

    @needs_state
    def step(self, actions: Any) -> tuple:
        return self.env.step(actions)

    @needs_state
    def render(self) -> Any:
        return self.env.render()


class RayGymVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` envs of any registered id over ``ray_actors`` Ray actors.

    Args:
        num_envs: envs in all.
        env: the gymnasium id (``"module:Env-v0"`` imports ``module`` in each actor first).
        ray_actors, ray_options, ray_placement, ray_address, ray_max_restarts: as for this
            project's ids (``RayVectorEnv``).
        ray_step_timeout_s: how long an actor may take to answer a step before it counts as hung or
            stopped: killed and restarted, its envs truncated with ``worker_restarted``.
        ray_reset_timeout_s: the same for a reset and ``render``.
        ray_restart_timeout_s: how long an actor may take to build its envs, at the start and after
            a restart, before it is given up (``RuntimeError``).
        vectorization: how each actor vectorizes its share: ``"sync"`` or ``"async"``.
        autoreset_mode: gymnasium's autoreset mode of the actors' vector envs (default: theirs).
        **kwargs: the env's own keyword arguments.
    """

    def __init__(
        self,
        num_envs: int = 1,
        *,
        env: str,
        ray_actors: int = 1,
        ray_options: dict[str, Any] | None = None,
        ray_placement: str = "pack",
        ray_address: str | None = None,
        ray_max_restarts: int = -1,
        ray_step_timeout_s: float = 120.0,
        ray_reset_timeout_s: float = 300.0,
        ray_restart_timeout_s: float = 300.0,
        vectorization: str = "sync",
        autoreset_mode: str | AutoresetMode | None = None,
        ready_timeout_s: float = 60.0,
        **kwargs: Any,
    ) -> None:
        name = f"Ray-v0({env})"
        if not isinstance(env, str) or not env:
            raise bad_input(name, "env", "a gymnasium id", describe(env))
        if vectorization not in ("sync", "async"):
            raise bad_input(name, "vectorization", "'sync' or 'async'", describe(vectorization))
        self.step_timeout_s = check_float(name, "ray_step_timeout_s", ray_step_timeout_s, low=0.01)
        self.reset_timeout_s = check_float(name, "ray_reset_timeout_s", ray_reset_timeout_s, low=0.01)
        check_float(name, "ray_restart_timeout_s", ray_restart_timeout_s, low=0.01)
        vector_kwargs = {} if autoreset_mode is None else {"autoreset_mode": AutoresetMode(autoreset_mode)}
        self.actors = ActorSet(
            name,
            num_envs,
            ray_actors,
            ray_options,
            ray_placement,
            ray_address,
            ray_max_restarts,
            ready_timeout_s,
        )
        self._ray = self.actors.ray
        try:
            args = [(env, n, vectorization, vector_kwargs, kwargs) for n in self.actors.sizes]
            desc = self.actors.start(GymHost, args, ray_restart_timeout_s)[0]
        except BaseException:
            self.actors.release()
            raise
        self.actors.after_restart = self._after_restart
        self.env_id, self.num_envs, self.num_actors = env, num_envs, ray_actors
        self.single_observation_space = desc["observation_space"]
        self.single_action_space = desc["action_space"]
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = dict(desc["metadata"])
        self.autoreset_mode = self.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.render_mode = desc["render_mode"]
        self._last_obs: list[Any] | None = None  # per actor, for partial resets and lost envs
        self._unreported = np.zeros(num_envs, bool)  # envs of a lost actor: the next step truncates them
        self._autoreset = np.zeros(num_envs, bool)  # NextStep: truncated lost envs, started at the next step
        self._finished = np.zeros(num_envs, bool)  # Disabled: ended episodes, to be reset before a step
        self._fresh: dict[int, tuple[Any, dict]] = {}  # a restarted actor's first reset

    def _bounds(self, j: int) -> tuple[int, int]:
        return int(self.actors.offsets[j]), int(self.actors.offsets[j + 1])

    def _check_open(self, call: str) -> None:
        if self.closed:
            raise closed_env(self.env_id, call)

    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset")
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is not None:
            mask = np.asarray(mask)
            if mask.dtype != np.bool_ or mask.shape != (self.num_envs,) or self._last_obs is None:
                expected = f"a bool array of shape ({self.num_envs},), after a first reset of all envs"
                raise bad_input(self.env_id, "reset_mask", expected, describe(mask))
        if isinstance(seed, Sequence) and len(seed) != self.num_envs:
            raise bad_input(self.env_id, "seed", f"an int or {self.num_envs} of them", describe(seed))
        reset = np.ones(self.num_envs, bool) if mask is None else mask

        def call(j: int) -> Any:
            lo, hi = self._bounds(j)
            part = dict(options)
            if mask is not None:
                part["reset_mask"] = mask[lo:hi]
            seeds = (
                seed
                if seed is None
                else (list(seed[lo:hi]) if isinstance(seed, Sequence) else seed + int(lo))
            )
            return self.actors.host(j).reset.remote(seeds, part or None)

        todo = [j for j in range(self.num_actors) if reset[slice(*self._bounds(j))].any()]
        results: dict[int, Any] = {}
        for _ in range(2):  # an actor lost in the reset gets one more try, on its fresh actor
            got, lost, error = self.actors.gather({j: call(j) for j in todo}, self.reset_timeout_s)
            results.update(got)
            for j, (hung, what) in lost.items():
                self._lose(j, hung, what, "reset")
            if error is not None:
                raise error
            todo = sorted(lost)
            if not todo:
                break
        else:
            raise RuntimeError(f"{self.env_id}: Ray actors {todo} were lost twice in one reset")
        for j in range(self.num_actors):
            lo, hi = self._bounds(j)
            if j not in results:  # nothing of this actor's reset: it keeps its last obs
                results[j] = (self._last_obs[j], {})
            elif (keep := self._unreported[lo:hi] & ~reset[lo:hi]).any():
                obs, info = results[j]  # lost envs not reset show their last obs until reported
                results[j] = (pick(self.single_observation_space, obs, self._last_obs[j], keep), info)
        self._unreported &= ~reset
        self._autoreset &= ~reset
        self._finished &= ~reset
        parts = [results[j] for j in range(self.num_actors)]
        self._last_obs = [obs for obs, _ in parts]
        obs = join_batches(self.single_observation_space, self._last_obs)
        return obs, join_infos([info for _, info in parts], self.actors.sizes)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_open("step")
        if self._last_obs is None:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        actions = self._check_actions(actions)
        if self._finished.any():
            raise BadInput(
                f"{self.env_id}: envs {np.flatnonzero(self._finished).tolist()} have ended (autoreset mode "
                "Disabled): reset them (reset_mask) before the next step"
            )
        same = self.autoreset_mode == AutoresetMode.SAME_STEP
        host = self.actors.host
        # per actor: envs to report lost (R), to start again (X) and to step (S)
        plans = {}
        for j in range(self.num_actors):
            lo, hi = self._bounds(j)
            lost, auto = self._unreported[lo:hi].copy(), self._autoreset[lo:hi].copy()
            plans[j] = (lost, auto | (lost if same else False), ~(lost | auto))
        calls: dict[int, Any] = {}
        for j, (_, start, run) in plans.items():
            lo, hi = self._bounds(j)
            if run.any():  # the whole share steps; envs to start again are reset after it
                calls[j] = host(j).step.remote(actions[lo:hi])
            elif start.any():
                calls[j] = host(j).reset.remote(None, None if start.all() else {"reset_mask": start})
        got, lost_now, error = self.actors.gather(calls, self.step_timeout_s)  # all actors at once
        for j, (hung, what) in lost_now.items():  # the others' results are kept
            self._lose(j, hung, what, "step")
            plans[j] = self._lost_plan(j)
        if error is not None:
            raise error
        # the envs to start again of actors that also stepped
        again = {
            j: host(j).reset.remote(None, {"reset_mask": start})
            for j, (_, start, run) in plans.items()
            if j in got and run.any() and start.any()
        }
        started, lost_again, error = self.actors.gather(again, self.reset_timeout_s)
        for j, (hung, what) in lost_again.items():
            self._lose(j, hung, what, "step")
            plans[j] = self._lost_plan(j)
            del got[j]
        if error is not None:
            raise error
        if same:  # the lost envs' new episodes start now: their first obs from the fresh actor
            for j in [*lost_now, *lost_again]:
                host(j)  # waits for the fresh actor, which resets its envs (_after_restart)
                started[j] = self._fresh.pop(j)
        parts = []
        for j, (lost, start, run) in plans.items():
            lo, hi = self._bounds(j)
            parts.append(self._assemble(j, got.get(j) if run.any() else None, lost, start, run, started, got))
            self._unreported[lo:hi] = False
            self._autoreset[lo:hi] = lost if self.autoreset_mode == AutoresetMode.NEXT_STEP else False
        self._last_obs = [p[0] for p in parts]
        obs = join_batches(self.single_observation_space, self._last_obs)
        rewards, terminated, truncated = (np.concatenate([p[k] for p in parts]) for k in (1, 2, 3))
        if self.autoreset_mode == AutoresetMode.DISABLED:
            self._finished = terminated | truncated
        return obs, rewards, terminated, truncated, join_infos([p[4] for p in parts], self.actors.sizes)

    def _lost_plan(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actor j lost in this step: all its envs are reported lost (and start again in SameStep)."""
        n, same = self.actors.sizes[j], self.autoreset_mode == AutoresetMode.SAME_STEP
        return np.ones(n, bool), np.full(n, same), np.zeros(n, bool)

    def _assemble(
        self,
        j: int,
        stepped: tuple | None,
        lost: np.ndarray,
        start: np.ndarray,
        run: np.ndarray,
        started: dict[int, tuple[Any, dict]],
        got: dict[int, Any],
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Actor j's part of a step: its stepped envs' results, its envs started again (reward 0,
        their first obs and reset info) and its lost envs (truncated, ``worker_restarted``)."""
        space, n, last = self.single_observation_space, self.actors.sizes[j], self._last_obs[j]
        if stepped is not None:
            obs, rewards, terminated, truncated, info = stepped
            rewards, terminated, truncated = np.array(rewards), np.array(terminated), np.array(truncated)
        else:
            obs, info = last, {}
            rewards, terminated, truncated = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
        if start.any():
            first, first_info = started[j] if j in started else got[j]  # got: reset instead of a step
            obs, info = pick(space, obs, first, start), pick_infos(info, first_info, start)
            rewards[start], terminated[start], truncated[start] = 0.0, False, False
        if lost.any():
            flags = {"worker_restarted": lost.copy(), "_worker_restarted": lost.copy()}
            same = self.autoreset_mode == AutoresetMode.SAME_STEP
            report = {**(pick_infos({}, info, lost) if same else {}), **flags}  # SameStep: + reset info
            if same:
                final_obs = np.full(n, None, object)
                for i, single in enumerate(iterate(space, last)):
                    if lost[i]:
                        final_obs[i] = single
                report.update(final_obs=final_obs, _final_obs=lost.copy())
                report.update(final_info=dict(flags), _final_info=lost.copy())
            else:
                obs = pick(space, obs, last, lost)
            info = pick_infos(info, report, lost)
            rewards[lost], terminated[lost], truncated[lost] = 0.0, False, True
        return obs, rewards, terminated, truncated, info

    def _check_actions(self, actions: Any) -> Any:
        """The batch checked against the action space, before any actor is called (``ValueError``):
        shape, a numeric dtype, finite values; Box actions clipped to the bounds and cast to the
        space's dtype, discrete ones within their range; any other space through its ``contains``."""
        space, n = self.single_action_space, self.num_envs
        spaces = gym.spaces
        if not isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary):
            if not self.action_space.contains(actions):
                raise bad_input(
                    self.env_id, "actions", f"an element of {self.action_space}", describe(actions)
                )
            return actions
        a = np.asarray(actions)
        shape = (n,) if isinstance(space, spaces.Discrete) else (n, *space.shape)
        if a.shape != shape:
            raise bad_input(self.env_id, "actions", f"shape {shape} (one action per env)", describe(a))
        integers = np.issubdtype(a.dtype, np.integer) or (
            isinstance(space, spaces.MultiBinary) and a.dtype == bool
        )
        if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
            if not (integers or np.issubdtype(a.dtype, np.floating)):
                raise bad_input(self.env_id, "actions", f"a float array ({space.dtype})", describe(a))
            if not np.isfinite(a).all():
                bad = np.argwhere(~np.isfinite(a))[0].tolist()
                raise bad_input(self.env_id, "actions", "finite values", f"NaN/inf at index {bad}")
            return np.clip(a, space.low, space.high).astype(space.dtype)
        if not integers:
            raise bad_input(self.env_id, "actions", f"an integer array for {space}", describe(a))
        if isinstance(space, spaces.Box):
            return np.clip(a, space.low, space.high).astype(space.dtype)
        if isinstance(space, spaces.MultiBinary):
            low, high = 0, 1
        else:
            nvec = space.n if isinstance(space, spaces.Discrete) else space.nvec
            low, high = space.start, space.start + nvec - 1
        low, high = np.broadcast_to(low, a.shape), np.broadcast_to(high, a.shape)
        outside = (a < low) | (a > high)
        if outside.any():
            at = tuple(np.argwhere(outside)[0])
            raise bad_input(
                self.env_id,
                "actions",
                f"values in [{low[at]}, {high[at]}]",
                f"{a[at]} at index {[int(i) for i in at]}",
            )
        return a

    def _lose(self, j: int, hung: bool, what: str, call: str) -> None:
        """Actor j was lost (died, hung, stopped): a fresh one is started and its envs are reported
        truncated (``worker_restarted``) at the next step, unless a reset starts them first."""
        lo, hi = self._bounds(j)
        self._unreported[lo:hi] = True
        self._autoreset[lo:hi] = False
        self._finished[lo:hi] = False
        self.actors.lose(j, hung, what, call)

    def _after_restart(self, j: int) -> None:
        """A fresh actor's envs are reset (unseeded) at once, so each of them can be stepped or
        reset on its own; the first obs are kept for a SameStep step that reports the loss."""
        try:
            self._fresh[j] = self._ray.get(
                self.actors.hosts[j].reset.remote(None, None), timeout=self.reset_timeout_s
            )
        except Exception as e:
            raise RuntimeError(
                f"{self.env_id}: Ray actor {j} was restarted but its envs did not reset: {e}"
            ) from e

    def render(self) -> tuple | None:
        self._check_open("render")
        refs = {j: self.actors.host(j).render.remote() for j in range(self.num_actors)}
        frames, lost, error = self.actors.gather(refs, self.reset_timeout_s)
        for j, (hung, what) in lost.items():
            self._lose(j, hung, what, "render")
        if error is not None:
            raise error
        for j in lost:  # the fresh actor's envs, reported truncated at the next step
            frames[j] = self._ray.get(self.actors.host(j).render.remote(), timeout=self.reset_timeout_s)
        frames = [frames[j] for j in range(self.num_actors)]
        return None if any(f is None for f in frames) else tuple(im for f in frames for im in f)

    def actor_pids(self) -> list[int]:
        return self.actors.pids()

    def close_extras(self, **kwargs: Any) -> None:
        self.actors.release()


def join_batches(space: gym.Space, parts: list[Any]) -> Any:
    """Batched values of ``space`` (one per actor) joined along the env axis."""
    if isinstance(space, gym.spaces.Dict):
        return {k: join_batches(sub, [p[k] for p in parts]) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(join_batches(sub, [p[i] for p in parts]) for i, sub in enumerate(space.spaces))
    if isinstance(space, gym.spaces.Text):
        return tuple(x for p in parts for x in p)
    return np.concatenate([np.asarray(p) for p in parts])


def join_infos(parts: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Gymnasium vector-env info dicts (one per actor, arrays over its envs, ``_key`` masks, nested
    dicts) joined into one over all envs; an actor without a key gets zeros (None for objects) and
    a False mask there."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for p in parts for k in p))
    for key in keys:
        values = [p.get(key) for p in parts]
        if any(isinstance(v, dict) for v in values):
            out[key] = join_infos([v if isinstance(v, dict) else {} for v in values], sizes)
            continue
        template = np.asarray(next(v for v in values if v is not None))
        filled = [np.asarray(v) if v is not None else _blank(key, template, n) for v, n in zip(values, sizes)]
        out[key] = np.concatenate(filled)
    return out


def pick(space: gym.Space, base: Any, other: Any, mask: np.ndarray) -> Any:
    """Batched values of ``space`` over one actor's envs: ``other``'s where ``mask``, else ``base``'s."""
    if isinstance(space, gym.spaces.Dict):
        return {k: pick(sub, base[k], other[k], mask) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(pick(sub, base[i], other[i], mask) for i, sub in enumerate(space.spaces))
    if isinstance(base, np.ndarray):
        out = base.copy()
        out[mask] = np.asarray(other)[mask]
        return out
    return type(base)(o if m else b for b, o, m in zip(base, other, mask))  # tuples: Text, Graph, ...


def pick_infos(base: dict[str, Any], other: dict[str, Any], mask: np.ndarray) -> dict[str, Any]:
    """Info dicts over one actor's envs (as ``join_infos`` takes them): ``other``'s rows (values and
    ``_key`` masks) where ``mask``, else ``base``'s; a key one of them lacks is blank there."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys([*base, *other]):
        a, b = base.get(key), other.get(key)
        if isinstance(a, dict) or isinstance(b, dict):
            out[key] = pick_infos(a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {}, mask)
            continue
        template = np.asarray(a if a is not None else b)
        a = np.asarray(a) if a is not None else _blank(key, template, len(mask))
        b = np.asarray(b) if b is not None else _blank(key, template, len(mask))
        value = a.astype(np.result_type(a.dtype, b.dtype), copy=True)
        value[mask] = b[mask]
        out[key] = value
    return out


def _blank(key: str, template: np.ndarray, n: int) -> np.ndarray:
    """What an env without ``key`` holds in an info dict: False for a ``_key`` mask, zeros, or None."""
    if template.dtype == object:
        return np.full((n, *template.shape[1:]), None, object)
    return np.zeros((n, *template.shape[1:]), bool if key.startswith("_") else template.dtype)


def register() -> None:
    gym.register(id="Ray-v0", vector_entry_point="envs.ray.ray_gym:RayGymVectorEnv")
