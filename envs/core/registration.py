"""Register a chunked vector env under one id, for both ``gym.make`` and ``gym.make_vec``.

``gym.make_vec(id, num_envs, ...)`` builds the env's vector env class in this process (its simulators
in local worker processes), or, with ``ray_actors=M``, spread over M Ray actors
(``envs/ray/ray_env.py``; Ray is imported only then).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode

from envs.core.errors import bad_input, describe
from envs.core.single import SingleEnvView
from envs.core.vector_env import ChunkedVectorEnv
from nets.errors import BadInput

RAY_KWARGS = (
    "ray_options",
    "ray_placement",
    "ray_address",
    "ray_max_restarts",
    "ray_step_timeout_s",
    "ray_reset_timeout_s",
    "ray_restart_timeout_s",
)


def make_vector(
    vector_class: str,
    num_envs: int = 1,
    *,
    ray_actors: int | None = None,
    ray_options: dict[str, Any] | None = None,
    ray_placement: str | None = None,
    ray_address: str | None = None,
    ray_max_restarts: int | None = None,
    ray_step_timeout_s: float | None = None,
    ray_reset_timeout_s: float | None = None,
    ray_restart_timeout_s: float | None = None,
    **kwargs: Any,
) -> ChunkedVectorEnv:
    """The vector entry point of every registered id: ``vector_class`` (``"module:Class"``) in this process,
    or over ``ray_actors`` Ray actors (with ``ray_options``, ``ray_placement``, ``ray_address``,
    ``ray_max_restarts`` and the deadlines ``ray_step_timeout_s``, ``ray_reset_timeout_s``,
    ``ray_restart_timeout_s``: see ``RayVectorEnv``; None: its default)."""
    creator = load_env_creator(vector_class)  # imports the class's module only (no simulator)
    ray_kwargs = {
        name: value
        for name, value in (
            ("actor_options", ray_options),
            ("placement", ray_placement),
            ("address", ray_address),
            ("max_restarts", ray_max_restarts),
            ("step_timeout_s", ray_step_timeout_s),
            ("reset_timeout_s", ray_reset_timeout_s),
            ("restart_timeout_s", ray_restart_timeout_s),
        )
        if value is not None
    }
    if ray_actors is None:
        if ray_kwargs:
            given = ["ray_options" if k == "actor_options" else f"ray_{k}" for k in ray_kwargs]
            raise BadInput(
                f"{kwargs.get('env_id', vector_class)}: {given} need ray_actors=<number of actors>"
            )
        check_keywords(kwargs.get("env_id", vector_class), creator, kwargs)
        return creator(num_envs=num_envs, **kwargs)
    from envs.ray.ray_env import RayVectorEnv

    check_keywords(kwargs.get("env_id", vector_class), creator, kwargs)  # on the driver, before any actor
    return RayVectorEnv(vector_class, num_envs, num_actors=ray_actors, env_kwargs=kwargs, **ray_kwargs)


def keywords(function: Any) -> set[str]:
    """The names ``function`` takes by keyword (not ``self`` nor its ``**`` catch-all)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n for n, p in inspect.signature(function).parameters.items() if p.kind in kinds} - {"self"}


def check_keywords(env_id: str, creator: Any, kwargs: dict[str, Any]) -> None:
    """Refuse a keyword that ``creator`` does not take with a ``ValueError`` naming it and the accepted
    ones (not Python's ``TypeError``, and before any worker starts). A creator with a ``**`` catch-all
    (the world-model backends) checks its own."""
    params = inspect.signature(creator).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = keywords(creator) | set(RAY_KWARGS) | {"ray_actors"}
    unknown = [name for name in kwargs if name not in accepted]
    if unknown:
        raise unknown_keywords(env_id, {name: kwargs[name] for name in unknown}, accepted)


def unknown_keywords(env_id: str, unknown: dict[str, Any], accepted: set[str]) -> BadInput:
    """The ``ValueError`` for keywords an env does not take: each with its value, every accepted
    keyword, and the closest accepted ones."""
    what = ("argument " if len(unknown) == 1 else "arguments ") + ", ".join(map(repr, unknown))
    got = ", ".join(f"{name}={describe(value)}" for name, value in unknown.items())
    close = [m for name in unknown for m in difflib.get_close_matches(name, accepted, n=1)]
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    return bad_input(env_id, what, f"one of {', '.join(sorted(accepted))}", got + hint)


def make_single(vector_class: str, **kwargs: Any) -> SingleEnvView:
    """Build the one-env view of a registered chunked vector env."""
    if kwargs.pop("autoreset_mode", AutoresetMode.DISABLED) != AutoresetMode.DISABLED:
        raise BadInput("the one-env view (gym.make) has no autoreset; use gym.make_vec for autoreset modes")
    return SingleEnvView(
        make_vector(vector_class, num_envs=1, autoreset_mode=AutoresetMode.DISABLED, **kwargs)
    )


def register_env(env_id: str, vector_class: str, **kwargs: Any) -> None:
    """Register ``env_id``: ``gym.make_vec`` builds the native vector env of ``vector_class``
    (``"module:Class"``, locally or on Ray actors), ``gym.make`` its one-env view."""
    gym.register(
        id=env_id,
        entry_point=make_single,
        vector_entry_point="envs.core.registration:make_vector",
        kwargs={"env_id": env_id, "vector_class": vector_class, **kwargs},
    )
