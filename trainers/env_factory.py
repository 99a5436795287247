"""Vector envs from names: ``"module:Env-v0"`` ids, the env's own vector env or gymnasium's
Sync/Async wrappers, and the autoreset mode a trainer needs."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode

from nets.errors import BadInput, reading
from nets.file_settings import Schema, is_project_module, schema_of

AUTORESET = {
    "next_step": AutoresetMode.NEXT_STEP,
    "same_step": AutoresetMode.SAME_STEP,
    "disabled": AutoresetMode.DISABLED,
}


def _accepts(fn: Any, name: str) -> bool:
    """Whether ``fn`` takes the keyword ``name`` (explicitly or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def env_settings_schema(env: str) -> Schema:
    """What a file may give the env ``env`` (``"module:Env-v0"``; the module is imported) as keyword
    arguments (``nets.file_settings``): for this project's ids, the keywords of the vector entry point
    and of the vector env class the id names. Another env (gymnasium's wrappers take ``gym.make``'s
    keywords too) or an id not registered (making it fails later, with gymnasium's error) gets an open
    schema: any key, checked as data."""
    module, _, env_id = env.rpartition(":")
    if module:
        importlib.import_module(module)
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        return Schema(env_id, {}, open=True)
    entry = spec.vector_entry_point
    if not (isinstance(entry, str) and is_project_module(entry)):
        return Schema(env_id, {}, open=True)
    merged = schema_of(load_env_creator(entry), env_id)
    if isinstance(spec.kwargs.get("vector_class"), str):  # what make_vector passes its **kwargs to
        merged = merged | schema_of(load_env_creator(spec.kwargs["vector_class"]), env_id)
    keys = {k: v for k, v in merged.keys.items() if k not in ("vector_class", "num_envs")}
    return Schema(env_id, keys, merged.open)


OWN_SETTINGS = {  # make_vec's and the trainer's own keywords: a user who puts them in env_kwargs means these
    "num_envs": "--num-envs (num_envs)",
    "autoreset_mode": "--autoreset-mode (autoreset_mode)",
    "vectorization_mode": "--vectorization (vectorization)",
    "vector_kwargs": "--vectorization (vectorization); vector_kwargs are not settable",
    "wrappers": "no wrappers (not settable from env_kwargs)",
}


def check_env_kwargs(env_id: str, env_kwargs: dict[str, Any] | None, name: str = "env_kwargs") -> None:
    """A ``BadInput`` if ``env_kwargs`` holds one of the trainer's own settings (``OWN_SETTINGS``)."""
    own = sorted(set(env_kwargs or {}) & OWN_SETTINGS.keys())
    if own:
        raise BadInput(
            f"{name} of {env_id}: {own} are the trainer's own settings, not the env's: give "
            + ", ".join(OWN_SETTINGS[k] for k in own)
        )


def make_vec_env(
    env_id: str,
    num_envs: int,
    env_kwargs: dict[str, Any] | None = None,
    vectorization: str = "auto",
    autoreset: str = "same_step",
    *,
    autoreset_required: bool = True,
    render_mode: str | None = None,
) -> gym.vector.VectorEnv:
    """``gym.make_vec`` of ``env_id`` (``"module:Env-v0"`` imports ``module`` first).

    ``vectorization`` ``auto`` uses the env's own vector env when it takes ``autoreset_mode`` (this
    project's envs), else gymnasium's sync wrapper. ``autoreset`` is one of ``AUTORESET`` or
    ``"disabled_native"``: DISABLED for the env's own vector env (it keeps finished envs frozen) and
    SAME_STEP for gymnasium's Sync/Async wrappers (which refuse to step a finished env). A vector
    env with a fixed mode keeps it, or raises if ``autoreset_required``.
    """
    check_env_kwargs(env_id, env_kwargs)
    if ":" in env_id:
        module, _, env_id = env_id.partition(":")
        importlib.import_module(module)
    spec = gym.spec(env_id)
    creator = load_env_creator(spec.vector_entry_point) if spec.vector_entry_point else None
    full_native = creator is not None and _accepts(creator, "autoreset_mode")
    if vectorization == "native" and creator is None:
        raise BadInput(f"env {env_id} has no vector entry point; use vectorization 'sync' or 'async'")
    native = vectorization == "native" or (vectorization == "auto" and full_native)
    if autoreset == "disabled_native":
        autoreset = "disabled" if native else "same_step"
    if autoreset not in AUTORESET:
        raise BadInput(f"autoreset must be one of {[*AUTORESET, 'disabled_native']}, got {autoreset!r}")
    mode = AUTORESET[autoreset]
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if native:
        if full_native:
            kwargs["autoreset_mode"] = mode
        elif autoreset_required:
            raise BadInput(
                f"env {env_id}: its vector env {spec.vector_entry_point} has a fixed autoreset mode; "
                f"autoreset {autoreset!r} needs vectorization 'sync' or 'async'"
            )
        with reading(f"env {env_id} with env_kwargs {env_kwargs}", TypeError):
            return gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point", **kwargs)
    vectorization = "async" if vectorization == "async" else "sync"
    vector_kwargs = {"autoreset_mode": mode}
    with reading(f"env {env_id} with env_kwargs {env_kwargs}", TypeError):
        return gym.make_vec(
            env_id, num_envs, vectorization_mode=vectorization, vector_kwargs=vector_kwargs, **kwargs
        )
