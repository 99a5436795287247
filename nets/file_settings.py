"""Settings read from a file the user did not hand over as settings (a resumed run's ``config.json``, a
checkpoint's saved policy arguments) are typed data, checked against an allow-list.

A file may carry a setting only where all of these hold:

* the consumer takes it: a keyword of the class or function it is passed to, found in its signature
  (``Schema``; a constructor that passes ``**kwargs`` on to its parent's takes the parent's too), or a
  field of a nested options dataclass. An unknown key is refused, naming its path in the file;
* its value fits the parameter's annotation (``nets.field_types.check_value``) and is plain data at
  any depth: dicts with string keys, lists, tuples, strings, finite numbers, booleans, None;
* nothing in it names code, an executable, an address or a remote resource: a key of
  ``CALLER_ONLY`` at any depth, a ``"module:Name"`` string outside this project's packages, and a URL
  are refused. They come only from the user's own command line or call.

Opt-ins that widen what a loader loads or fetches (``OPT_IN_KEYS``, and any key that spells trust or
download in another case or separator) are dropped with a warning: the user gives them again.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import typing
import warnings
from collections.abc import Collection, Mapping
from typing import Any

from nets.errors import BadInput
from nets.field_types import check_value, describe

# keyword arguments that widen what a loader loads or fetches
OPT_IN_KEYS = frozenset({"trust_pickle", "download", "revision", "trust_remote_code"})
# keys that name code, an executable, an address or a remote resource: never from a file
CALLER_ONLY: dict[str, str] = {
    "ray_options": "Ray actor options (a runtime_env runs a command and installs code on every actor)",
    "ray_address": "the address of a Ray cluster",
    "runtime_env": "a Ray runtime environment (runs a command, installs code)",
    "py_executable": "an executable to run",
    "address": "a network address",
    "vector_class": "a class to import",
    "entry_point": "a class or function to import",
    "allow_policies": "modules the user allows to be imported",
    "wandb_project": "a remote logging service",
    "wandb_entity": "a remote logging service",
}
PROJECT_PACKAGES = ("envs", "policies", "nets", "trainers")  # modules a file may name for import
MAX_SETTINGS_DEPTH = 64
_MODULE_REF = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_][\w.\-]*$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_opt_in(key: str) -> bool:
    """Whether ``key`` is an opt-in in any spelling (``trust_pickle``, ``TrustRemoteCode``,
    ``allow-download``...)."""
    plain = re.sub(r"[^a-z]", "", key.lower())
    return key in OPT_IN_KEYS or "trust" in plain or "download" in plain


def is_project_module(name: str) -> bool:
    """Whether ``name`` (``"module"`` or ``"module:Name"``) is a module of this project, which a
    file may name for import (any other module is imported only when the user names it)."""
    module = name.partition(":")[0]
    parts = module.split(".")
    return all(p.isidentifier() for p in parts) and parts[0] in PROJECT_PACKAGES


@dataclasses.dataclass(frozen=True)
class Schema:
    """What a settings dict read from a file may hold: ``keys`` maps each accepted name to the
    annotation its value must fit (or a nested ``Schema``); ``open`` accepts other names too (a
    ``**kwargs`` consumer whose keywords go further than its signature shows), checked as data;
    ``flat``: a nested group of options whose fields its owner also takes as keywords."""

    owner: str
    keys: Mapping[str, Any]
    open: bool = False
    flat: bool = False  # its fields are also keywords of the schema it is nested in

    def __or__(self, other: Schema) -> Schema:
        return Schema(f"{self.owner} / {other.owner}", {**self.keys, **other.keys}, self.open and other.open)


def _hints(function: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function)
    except Exception:  # a name only imported for type checking: those annotations are not checked
        return {}


def schema_of(consumer: Any, owner: str | None = None, stop: type | None = None) -> Schema:
    """The keywords ``consumer`` (a class or a function) takes, with their annotations. For a class,
    as long as a constructor takes ``**kwargs`` its parent's constructor is read too (up to ``stop``);
    the fields of an options dataclass (a class's ``options_type``) are keywords as well. A
    parameter annotated with a dataclass is a nested schema of its fields."""
    owner = owner or getattr(consumer, "__qualname__", str(consumer))
    keys: dict[str, Any] = {}
    options = getattr(consumer, "options_type", None)
    if dataclasses.is_dataclass(options):
        keys.update(_dataclass_keys(options))
    functions = []
    if isinstance(consumer, type):
        for klass in consumer.__mro__:
            if klass is stop or klass is object:
                break
            if "__init__" in vars(klass):
                functions.append(vars(klass)["__init__"])
    else:
        functions.append(consumer)
    is_open = not functions
    for function in functions:
        hints = _hints(function)
        params = list(inspect.signature(function).parameters.values())
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                keys.setdefault(p.name, _nested(hints.get(p.name, Any)))
                _add_flat(keys, keys[p.name])
        is_open = any(p.kind is p.VAR_KEYWORD for p in params)
        if not is_open:
            break
    return Schema(owner, keys, is_open)


def _dataclass_keys(cls: type) -> dict[str, Any]:
    hints = _hints(cls)
    keys = {f.name: _nested(hints.get(f.name, Any)) for f in dataclasses.fields(cls)}
    for spec in list(keys.values()):
        _add_flat(keys, spec)
    return keys


def _add_flat(keys: dict[str, Any], spec: Any) -> None:
    """A group of options (a dataclass with ``from_options``, such as ``FlowSampling``) is also given
    field by field as keywords of its owner: its fields are keys beside it."""
    if isinstance(spec, Schema) and spec.flat:
        for name, value in spec.keys.items():
            keys.setdefault(name, value)


def _nested(annotation: Any) -> Any:
    """A dataclass among ``annotation``'s options (``Options | Mapping | None``) as a nested schema."""
    for option in (annotation, *typing.get_args(annotation)):
        if isinstance(option, type) and dataclasses.is_dataclass(option):
            return Schema(option.__qualname__, _dataclass_keys(option), flat=hasattr(option, "from_options"))
    return annotation


def _refuse(path: str, what: str) -> BadInput:
    return BadInput(
        f"{path}: {what}; it comes only from your own command line or call, never from a file being "
        "loaded: give it again yourself if you trust it"
    )


def check_data(value: Any, path: str, depth: int = 0, allow: Collection[str] = ()) -> Any:
    """``value`` read from a file, as plain data with the opt-ins dropped (warning); a ``ValueError``
    names the path of anything else: an object, NaN or inf, a ``CALLER_ONLY`` key, a module of
    another package (unless in ``allow``: names the user gave), a URL, nesting deeper than
    ``MAX_SETTINGS_DEPTH``."""
    if depth > MAX_SETTINGS_DEPTH:
        raise BadInput(f"{path}: settings nested deeper than {MAX_SETTINGS_DEPTH} levels")
    if isinstance(value, Mapping):
        return check_file_settings(value, None, path, depth, allow)
    if isinstance(value, (list, tuple)):
        return type(value)(check_data(v, f"{path}[{i}]", depth + 1, allow) for i, v in enumerate(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise BadInput(f"{path}: expected a finite number, got {value}")
    if isinstance(value, str):
        if _URL.match(value):
            raise _refuse(path, f"{value!r:.100} is a URL (a remote resource)")
        if _MODULE_REF.match(value) and not is_project_module(value) and value not in allow:
            raise _refuse(path, f"{value!r:.100} imports a module that is not vla-gym's")
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise BadInput(f"{path}: expected plain data (JSON values), got a {type(value).__name__}")


def check_file_settings(
    values: Mapping[str, Any],
    schema: Schema | None,
    where: str,
    depth: int = 0,
    allow: Collection[str] = (),
) -> dict[str, Any]:
    """``values`` (a settings dict read from the file ``where`` names) checked against ``schema``
    (None: any key, each value checked as data; ``allow``: module names the user gave): a copy without
    the opt-ins (dropped with a warning) or a ``ValueError`` naming the first entry that is not
    allowed, by its path in the file."""
    if depth > MAX_SETTINGS_DEPTH:
        raise BadInput(f"{where}: settings nested deeper than {MAX_SETTINGS_DEPTH} levels")
    out, dropped = {}, {}
    for key, value in values.items():
        path = f"{where}.{key}"
        if not isinstance(key, str):
            raise BadInput(f"{where}: expected string keys, got {key!r:.100}")
        if is_opt_in(key):
            if value not in (False, None):
                dropped[key] = value
            continue
        if key in CALLER_ONLY:
            raise _refuse(path, f"it is {CALLER_ONLY[key]}")
        spec: Any = Any
        if schema is not None:
            if key not in schema.keys and not schema.open:
                takes = ", ".join(sorted(schema.keys))
                raise BadInput(f"{path}: {schema.owner} takes no setting {key!r} (it takes {takes})")
            spec = schema.keys.get(key, Any)
        if isinstance(spec, Schema):
            if isinstance(value, Mapping):
                out[key] = check_file_settings(value, spec, path, depth + 1, allow)
                continue
            spec = Any
        if spec is not Any:
            try:
                check_value(spec, value)
            except ValueError as e:
                raise BadInput(f"{path}: {e} ({describe(spec)}), got {value!r:.100}") from None
        out[key] = check_data(value, path, depth + 1, allow)
    if dropped:
        warnings.warn(
            f"{where}: ignored {dropped}: opt-ins that widen what is loaded or fetched come only from your "
            "own command line or call, never from a file being loaded; give them again yourself if you "
            "trust what they load",
            RuntimeWarning,
            stacklevel=2,
        )
    return out


def strip_opt_ins(settings: Any, source: Any) -> Any:
    """``settings`` read from ``source`` (a file) checked as data (``check_data``): the opt-ins dropped
    with a warning, anything that names code, an address or a remote resource refused."""
    return check_data(settings, str(source))
