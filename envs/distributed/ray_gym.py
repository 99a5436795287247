"""Any gymnasium env id's vector env spread over Ray actors: ``gym.make_vec("Ray-v0", num_envs, env=ID)``.

For ids that are not ours (``CartPole-v1``, a MuJoCo task, a third party's env): each actor builds
``gym.make_vec(ID, its share, vectorization_mode=...)`` and this class joins what the actors return
(observations, rewards, flags, gymnasium's info dicts with their ``_key`` masks, ``final_obs`` /
``final_info``). Autoreset happens inside each actor's vector env, in the mode asked for.
``reset(seed=s)`` seeds actor j with ``s + offsets[j]``: gymnasium seeds sub-env i of a vector env
with ``seed + i``, so the envs get exactly the seeds of one local vector env seeded with ``s``.
(This project's ids take ``ray_actors=`` directly: ``envs/distributed/ray_env.py``.)

Semantics are gymnasium's vector envs': in ``Disabled`` mode a finished env must be reset (with
``reset_mask``) before the next step. The trainers, which expect this project's envs to keep
finished envs frozen in that mode, run it with ``--autoreset-mode same_step``. An actor that dies is
restarted by Ray and the call raises: a generic env has no notion of a truncated episode to report,
so the caller resets.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from envs.core.errors import bad_input, describe
from envs.distributed.actors import ActorHost, ActorSet


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
        super().describe()
        env = self.env
        return {
            "observation_space": env.single_observation_space,
            "action_space": env.single_action_space,
            "metadata": env.metadata,
            "render_mode": env.render_mode,
        }

    def reset(self, seed: int | list[int] | None, options: dict | None) -> tuple[Any, dict]:
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: Any) -> tuple:
        return self.env.step(actions)

    def render(self) -> Any:
        return self.env.render()


class RayGymVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` envs of any registered id over ``ray_actors`` Ray actors.

    Args:
        num_envs: envs in all.
        env: the gymnasium id (``"module:Env-v0"`` imports ``module`` in each actor first).
        ray_actors, ray_options, ray_placement, ray_address, ray_max_restarts: as for this
            project's ids (``RayVectorEnv``).
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
            hosts = self.actors.start(GymHost, args)
            desc = self._ray.get([host.describe.remote() for host in hosts])[0]
        except BaseException:
            self.actors.release()
            raise
        self.env_id, self.num_envs, self.num_actors = env, num_envs, ray_actors
        self.single_observation_space = desc["observation_space"]
        self.single_action_space = desc["action_space"]
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = dict(desc["metadata"])
        self.autoreset_mode = self.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.render_mode = desc["render_mode"]
        self._last_obs: list[Any] | None = None  # per actor, for partial resets

    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is not None:
            mask = np.asarray(mask)
            if mask.dtype != np.bool_ or mask.shape != (self.num_envs,) or self._last_obs is None:
                expected = f"a bool array of shape ({self.num_envs},), after a first reset of all envs"
                raise bad_input(self.env_id, "reset_mask", expected, describe(mask))
        if isinstance(seed, Sequence) and len(seed) != self.num_envs:
            raise bad_input(self.env_id, "seed", f"an int or {self.num_envs} of them", describe(seed))
        calls = {}
        for j, (lo, hi) in enumerate(zip(self.actors.offsets[:-1], self.actors.offsets[1:])):
            if mask is not None and not mask[lo:hi].any():
                continue  # nothing of this actor's to reset
            part = dict(options)
            if mask is not None:
                part["reset_mask"] = mask[lo:hi]
            seeds = (
                seed
                if seed is None
                else (list(seed[lo:hi]) if isinstance(seed, Sequence) else seed + int(lo))
            )
            calls[j] = self.actors.hosts[j].reset.remote(seeds, part or None)
        results = dict(zip(calls, self._ray.get(list(calls.values()))))
        if mask is not None and len(results) < self.num_actors:  # actors not reset keep their last obs
            for j in set(range(self.num_actors)) - set(results):
                results[j] = (self._last_obs[j], {})
        parts = [results[j] for j in range(self.num_actors)]
        self._last_obs = [obs for obs, _ in parts]
        obs = join_batches(self.single_observation_space, self._last_obs)
        return obs, join_infos([info for _, info in parts], self.actors.sizes)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = np.asarray(actions)
        if actions.shape[:1] != (self.num_envs,):
            raise bad_input(self.env_id, "actions", f"a batch of {self.num_envs}", describe(actions))
        bounds = zip(self.actors.offsets[:-1], self.actors.offsets[1:])
        refs = [host.step.remote(actions[lo:hi]) for host, (lo, hi) in zip(self.actors.hosts, bounds)]
        parts = self._ray.get(refs)  # one round trip: all actors step at once
        self._last_obs = [p[0] for p in parts]
        obs = join_batches(self.single_observation_space, self._last_obs)
        rewards, terminated, truncated = (np.concatenate([p[k] for p in parts]) for k in (1, 2, 3))
        return obs, rewards, terminated, truncated, join_infos([p[4] for p in parts], self.actors.sizes)

    def render(self) -> tuple | None:
        frames = self._ray.get([host.render.remote() for host in self.actors.hosts])
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
        filled = []
        for v, n in zip(values, sizes):
            if v is None:
                v = np.zeros((n, *template.shape[1:]), bool if key.startswith("_") else template.dtype)
                if template.dtype == object:
                    v = np.full((n, *template.shape[1:]), None, object)
            filled.append(np.asarray(v))
        out[key] = np.concatenate(filled)
    return out


def register() -> None:
    gym.register(id="Ray-v0", vector_entry_point="envs.distributed.ray_gym:RayGymVectorEnv")
