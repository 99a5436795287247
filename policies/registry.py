"""Build a policy by name, so command lines and checkpoints can name one.

Names: ``gaussian``, ``categorical``, ``binned``, ``flow``, ``residual`` (a correction over a frozen
Gaussian base), ``dsrl`` (a frozen flow policy steered through its initial noise), ``libero_expert``
(scripted), ``openvla``, ``openvla_oft``,
``pi05``, ``cosmos_policy`` (pretrained VLAs: ``policy_kwargs`` name their ``model_path``; their
typed options: ``options_type``), ``auto``
(categorical for Discrete / MultiDiscrete action spaces, Gaussian for Box), or
``"package.module:ClassName"`` for any ``ActionChunkPolicy`` subclass whose constructor takes
``(observation_space, action_space, **kwargs)``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Collection
from typing import Any

from gymnasium import spaces

from nets.errors import BadInput
from nets.file_settings import Schema, schema_of

from .base import ActionChunkPolicy

POLICIES = {
    "gaussian": "policies.gaussian:GaussianPolicy",
    "categorical": "policies.categorical:CategoricalPolicy",
    "binned": "policies.binned:BinnedPolicy",
    "flow": "policies.flow:FlowPolicy",
    "residual": "policies.residual:ResidualPolicy",
    "dsrl": "policies.dsrl:NoiseSteeredPolicy",
    "libero_expert": "policies.libero_expert:LiberoExpert",
    "openvla": "policies.openvla:OpenVLAPolicy",
    "openvla_oft": "policies.openvla_oft:OpenVLAOFTPolicy",
    "pi05": "policies.pi05:Pi05Policy",
    "cosmos_policy": "policies.cosmos_policy:CosmosPolicy",
}


def resolve_policy(name: str, action_space: spaces.Space) -> str:
    """The ``module:Class`` path for ``name`` (``auto`` picks by the action space)."""
    if name == "auto":
        discrete = isinstance(action_space, spaces.Discrete | spaces.MultiDiscrete)
        name = "categorical" if discrete else "gaussian"
    if name in POLICIES:
        return POLICIES[name]
    if ":" not in name:
        raise BadInput(f"unknown policy {name!r}: expected one of {['auto', *POLICIES]} or 'module:Class'")
    return name


def check_policy_from_file(name: Any, source: Any, allow: Collection[str] = ()) -> None:
    """Refuse a policy name read from a file (a checkpoint) before anything is imported for it:
    it must be a registered policy (or its ``module:Class`` path), or one of ``allow``, the
    ``module:Class`` names the user named in their own call or command line."""
    if not isinstance(name, str):
        raise BadInput(f"{source}: expected a policy name (a string), got {type(name).__name__}")
    if name == "auto" or name in POLICIES or name in POLICIES.values() or name in allow:
        return
    raise BadInput(
        f"{source}: names the policy {name!r}, which is not one of vla-gym's policies "
        f"({', '.join(POLICIES)}); a module to import comes only from your own call, never from a "
        f"file: name it yourself if you trust it (load_policy(..., allow_policies=[{name!r}]), or "
        f"--policy {name} to the trainers)"
    )


def policy_class(name: str, action_space: spaces.Space | None = None) -> type[ActionChunkPolicy]:
    """The class ``name`` builds (imported, nothing built); ``action_space`` resolves ``auto``."""
    if name == "auto" and action_space is None:
        raise BadInput("policy 'auto' is chosen by the action space: give it")
    module_name, _, class_name = resolve_policy(name, action_space).partition(":")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, ActionChunkPolicy)):
        raise BadInput(f"{module_name}:{class_name} is not an ActionChunkPolicy subclass")
    return cls


def accepted_arguments(cls: type[ActionChunkPolicy]) -> set[str]:
    """The keyword arguments a policy class names: the fields of its typed options (``options_type``)
    if it has them, its constructor's and, as long as a constructor takes ``**options`` (passed on to
    its parent's), the parent's too, up to ``ActionChunkPolicy``."""
    return set(settings_schema(cls).keys) - {"observation_space", "action_space"}


def settings_schema(cls: type[ActionChunkPolicy]) -> Schema:
    """What a file may give ``cls`` as keyword arguments (``nets.file_settings``): its constructors'
    keywords and its options' fields, with their annotations."""
    schema = schema_of(cls, f"{cls.__module__}:{cls.__qualname__}", stop=ActionChunkPolicy)
    keys = {k: v for k, v in schema.keys.items() if k not in ("observation_space", "action_space")}
    return dataclasses.replace(schema, keys=keys)


def policy_settings_schema(name: str) -> Schema | None:
    """The allow-list of the policy ``name``'s keyword arguments for settings read from a file: its
    ``settings_schema`` (``auto``: the Gaussian's and the categorical's together), or None (any key,
    checked as data) for a name that does not resolve (building it fails later, with its own error)."""
    names = ["gaussian", "categorical"] if name == "auto" else [name]
    try:
        schemas = [settings_schema(policy_class(n)) for n in names]
    except (ImportError, AttributeError, ValueError):
        return None
    return Schema(name, {k: v for s in schemas for k, v in s.keys.items()}, all(s.open for s in schemas))


def options_type(name: str) -> type | None:
    """The options dataclass of the policy ``name`` (its class's ``options_type``: the pretrained
    VLAs', ``policies/options.py``), or None for a policy whose keywords have none."""
    return None if name == "auto" else getattr(policy_class(name), "options_type", None)


def make_policy(
    name: str, observation_space: spaces.Space, action_space: spaces.Space, **kwargs: Any
) -> ActionChunkPolicy:
    """Build the policy ``name`` for single-env ``observation_space`` / ``action_space``."""
    return policy_class(name, action_space)(observation_space, action_space, **kwargs)
