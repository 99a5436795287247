"""Typed config dataclasses <-> command-line flags and JSON.

Every field of the given dataclasses becomes a flag (``n_steps`` -> ``--n-steps``) typed from its
annotation: ``int``, ``float``, ``str``, ``bool`` and ``bool | None`` (``--flag`` / ``--no-flag``),
``X | None`` (the word ``none`` gives None), ``Literal[...]`` (choices), ``dict`` (a JSON object) and
``tuple[...]``/``list[...]`` (a JSON list). A field's docstring, the string literal right below it
in its dataclass (CleanRL's and tyro's convention: ``lr: float = 3e-4`` and, on the next line,
a triple-quoted ``Adam learning rate.``), is its flag's ``--help`` text. ``--config FILE.json``
sets defaults from a file written by ``save_config``; flags given on the command line override it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import sys
import textwrap
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from nets import files
from nets.errors import BadInput, naming, program_name
from nets.field_types import check_value, describe
from trainers.files import write_atomic

T = TypeVar("T")


def _parser_for(annotation: Any) -> tuple[Any, dict[str, Any]]:
    """``(convert, extra argparse kwargs)`` for one field annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        convert, extra = _parser_for(inner[0] if len(inner) == 1 else Union[tuple(inner)])  # noqa: UP007
        extra.pop("choices", None)

        def optional(text: str) -> Any:
            return None if text.lower() == "none" else convert(text)

        optional.__name__ = getattr(convert, "__name__", "value") + " or none"
        return optional, extra
    if origin is Literal:
        kind = type(args[0])
        return kind, {"choices": list(args)}
    if annotation in (int, float, str):
        return annotation, {}
    if origin in (dict, list, tuple) or annotation in (dict, list, tuple):

        def from_json(text: str) -> Any:
            value = json.loads(text)
            return tuple(value) if (origin or annotation) is tuple else value

        from_json.__name__ = "JSON"
        return from_json, {}
    raise TypeError(f"no command-line parser for the annotation {annotation!r}")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring: the string literal right below the field in the class body,
    its whitespace collapsed into one paragraph. Fields inherited from dataclasses ``cls`` derives
    from have their own class's docstrings (a redefinition's docstring wins). Fields without one,
    and classes whose source is not available, have none."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_own_field_docs(klass))
    return out


def _own_field_docs(cls: type) -> dict[str, str]:
    """``field_docs`` of the fields annotated in ``cls``'s own body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    statements = body.body if isinstance(body, ast.ClassDef) else []
    out = {}
    for node, after in zip(statements, statements[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[node.target.id] = " ".join(after.value.value.split())
    return out


def describe_fields(cls: type, defaults: dict[str, Any] | None = None, width: int = 100) -> str:
    """A dataclass's fields for a reader, one per entry: ``name: type = default`` (``(required)``
    without a default; ``defaults`` override the class's) and its docstring below it, wrapped."""
    about = field_docs(cls)
    lines = []
    for f in dataclasses.fields(cls):
        kind = f.type if isinstance(f.type, str) else describe(f.type)  # as written in the class
        if defaults and f.name in defaults:
            value = f" = {defaults[f.name]!r}"
        elif f.default is not dataclasses.MISSING:
            value = f" = {f.default!r}"
        elif f.default_factory is not dataclasses.MISSING:
            value = f" = {f.default_factory()!r}"
        else:
            value = "  (required)"
        lines.append(f"  {f.name}: {kind}{value}")
        if f.name in about:
            lines += textwrap.wrap(about[f.name], width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def _is_optional_bool(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    return origin in (Union, types.UnionType) and set(typing.get_args(annotation)) == {bool, type(None)}


def add_arguments(parser: argparse.ArgumentParser, cls: type, title: str | None = None) -> None:
    """Add one flag per field of the dataclass ``cls`` (flag names must be unique in the parser)."""
    group = parser.add_argument_group(title or cls.__name__)
    hints = typing.get_type_hints(cls)
    about = field_docs(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        text = f"{about[f.name]} " if f.name in about else ""
        text = f"{text}(default: {default})".replace("%", "%%")  # argparse formats help with %
        if hints[f.name] is bool or _is_optional_bool(hints[f.name]):  # unset flags keep the default
            group.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text
            )
            continue
        convert, extra = _parser_for(hints[f.name])
        group.add_argument(flag, dest=f.name, type=convert, default=argparse.SUPPRESS, help=text, **extra)


def build(cls: type[T], values: dict[str, Any]) -> T:
    """``cls(**values)`` keeping only ``cls``'s fields (unknown keys are an error elsewhere), each
    value checked against its field's type first: a ``ValueError`` names the field, what it
    expects and what came."""
    hints = typing.get_type_hints(cls)
    checked = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            try:
                checked[f.name] = check_value(hints[f.name], values[f.name])
            except ValueError as e:
                flag = "--" + f.name.replace("_", "-")
                raise BadInput(
                    f"{cls.__name__}.{f.name}: {e}, got {values[f.name]!r:.100} (the flag {flag}, or "
                    f"{f.name} in a config file)"
                ) from None
    try:
        return cls(**checked)
    except BadInput:
        raise
    except (ValueError, TypeError) as e:  # a __post_init__ range check: it names the field
        raise naming(f"{cls.__name__} settings", e) from None


def parse(
    classes: dict[str, type],
    argv: list[str] | None = None,
    description: str | None = None,
    ignore: Collection[str] = (),
    run_config: Path | None = None,
) -> dict[str, Any]:
    """Parse ``argv`` into one instance per dataclass in ``classes`` (key -> class).

    Values come, by priority, from the flags, the ``--config`` JSON file (keys: the same as in
    ``classes``, each an object of field values; sections named in ``ignore`` are skipped), and
    the dataclass defaults. ``run_config`` is a resumed run's ``config.json``: without ``--config``
    it is the file, as a file being loaded, not the user's own settings (``untrusted_settings``);
    with or without, a setting of ``FIXED_ON_RESUME`` given (a flag or a ``--config`` entry) with
    another value than the run's is refused (``keep_resumed``).
    """
    parser = argparse.ArgumentParser(
        prog=program_name(),
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # examples keep lines
    )
    parser.add_argument("--config", type=Path, default=None, help="JSON file of settings (flags override it)")
    for key, cls in classes.items():
        add_arguments(parser, cls, key)
    args = vars(parser.parse_args(argv))
    base: dict[str, dict[str, Any]] = {key: {} for key in classes}
    config_file = args.pop("config")
    given = args  # only the flags on the command line (absent ones are suppressed)
    saved = None if run_config is None else load_config(run_config, classes, ignore)
    if config_file is not None:
        base.update(load_config(config_file, classes, ignore))
    elif saved is not None:
        base.update(untrusted_settings(saved, given, run_config))
    out = {}
    for key, cls in classes.items():
        names = {f.name for f in dataclasses.fields(cls)}
        values = {**base.get(key, {}), **{k: v for k, v in given.items() if k in names}}
        out[key] = build(cls, values)
    if saved is not None:
        from_file = {} if config_file is None else {k: (set(v), config_file) for k, v in base.items()}
        out = keep_resumed(out, saved, given, from_file, run_config)
    return out


def to_dict(configs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The JSON-ready form of a ``{key: dataclass instance}`` mapping."""
    return {key: dataclasses.asdict(cfg) for key, cfg in configs.items()}


def save_config(path: str | Path, configs: dict[str, Any]) -> None:
    """Write ``{key: dataclass}`` as JSON (readable back by ``load_config`` / ``--config``),
    atomically (``trainers.files.write_atomic``)."""
    write_atomic(path, json.dumps(to_dict(configs), indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path) -> Any:
    """A config file's content; an unreadable or malformed file is a ``BadInput`` naming it."""
    return files.read_json(path, "config")


def load_config(
    path: str | Path, classes: dict[str, type], ignore: Collection[str] = ()
) -> dict[str, dict[str, Any]]:
    """Read a JSON config, checking that every key names a field of the matching dataclass
    (sections named in ``ignore`` are dropped)."""
    data = read_json(path)
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in ignore}
    if not isinstance(data, dict) or set(data) - set(classes):
        raise BadInput(f"{path}: expected a JSON object with keys among {sorted(classes)}, got {data!r:.200}")
    for key, values in data.items():
        if not isinstance(values, dict):
            raise BadInput(f"{path}: the {key!r} settings must be a JSON object, got {values!r:.100}")
        names = {f.name for f in dataclasses.fields(classes[key])}
        unknown = set(values) - names
        if unknown:
            raise BadInput(f"{path}: unknown {key} settings {sorted(unknown)}; known: {sorted(names)}")
    return data


MODULE_FIELDS = ("env", "eval_env", "policy")  # "module:Name" values import that module


def untrusted_settings(
    sections: dict[str, dict[str, Any]], given: Mapping[str, Any], source: Any
) -> dict[str, dict[str, Any]]:
    """Settings read from a file the user did not hand over as settings (a resumed run's
    ``config.json``), for the fields not ``given`` on the command line, as typed data checked against
    an allow-list (``nets.file_settings``): ``env_kwargs`` / ``eval_env_kwargs`` hold only keywords the
    env takes and ``policy_kwargs`` only the policy's; nothing at any depth may name code, an
    executable, an address or a remote resource (a ``ValueError`` names its path); opt-ins
    (``trust_pickle``, ``download``, ...) are dropped with a warning; a module to import (``env``,
    ``eval_env``, ``policy`` as ``"module:Name"``) must be one of this project's."""
    from nets.file_settings import check_data, check_file_settings, is_project_module

    out: dict[str, dict[str, Any]] = {}
    for key, values in sections.items():
        out[key] = {}
        for name, value in values.items():
            if name in given:
                continue  # the command line's value is used
            where = f"{source}: {key}.{name}"
            if name in MODULE_FIELDS and isinstance(value, str) and ":" in value:
                if not is_project_module(value):
                    flag = "--" + name.replace("_", "-")
                    raise BadInput(
                        f"{where} is {value!r}, which imports a module that is not vla-gym's; a module "
                        f"to import comes only from your own command line: pass {flag} {value} "
                        "again if you trust it"
                    )
            if isinstance(value, Mapping):
                owner = {**values, **given}  # the env or policy these settings go to
                out[key][name] = check_file_settings(value, _settings_schema(name, owner), where)
            else:
                out[key][name] = check_data(value, where)
    return out


def _settings_schema(name: str, values: Mapping[str, Any]) -> Any:
    """The allow-list (``nets.file_settings.Schema``) of the dict setting ``name`` of a section whose
    settings are ``values``: the env's keywords for ``env_kwargs`` / ``eval_env_kwargs``, the
    policy's for ``policy_kwargs``; None (any key, checked as data) for other dict settings."""
    if name in ("env_kwargs", "eval_env_kwargs"):
        from trainers.env_factory import env_settings_schema

        env = values.get("eval_env") if name == "eval_env_kwargs" else None
        env = env or values.get("env")
        return env_settings_schema(env) if isinstance(env, str) else None
    if name == "policy_kwargs" and isinstance(values.get("policy"), str):
        from policies.registry import policy_settings_schema

        return policy_settings_schema(values["policy"])
    return None


_OPTIMIZER = "the optimizer's state, its hyperparameters included, is restored from the checkpoint"
_CRITICS = "the critics are restored from the checkpoint"
# Settings a resumed run takes from its checkpoint whatever is given: a new value would be written to
# config.json without taking effect (or only partly). On --resume, one given again with another value
# (a flag or a --config entry) is a ValueError; with the run's value it is accepted.
FIXED_ON_RESUME: dict[str, dict[str, str]] = {
    "run": {
        "policy": "the policy is rebuilt as the run built it",
        "policy_kwargs": "the policy is rebuilt with the run's arguments (only opt-ins such as "
        "trust_pickle can be added)",
        "init_policy": "the weights come from the run's own checkpoint",
        "seed": "the random streams are restored from the checkpoint and the envs are reseeded from "
        "the run's seed",
        "run_dir": "a resumed run stays in its folder",
        "loop": "a run resumes with the loop it was trained with (its buffer's policy lags and update "
        "counts come from that loop)",
    },
    "ppo": {"adam_eps": _OPTIMIZER},  # PPO sets the learning rate anew every iteration: not fixed
    "grpo": {"learning_rate": _OPTIMIZER, "weight_decay": _OPTIMIZER},
    "bc": {"learning_rate": _OPTIMIZER, "weight_decay": _OPTIMIZER},
    "sac": {
        "learning_rate": _OPTIMIZER,
        "init_alpha": "the temperature is restored from the checkpoint",
        **dict.fromkeys(
            ("n_critics", "critic_hidden_sizes", "critic_layer_norm", "critic_activation"), _CRITICS
        ),
    },
}


def keep_resumed(
    configs: dict[str, Any],
    saved: dict[str, dict[str, Any]],
    flags: Collection[str],
    from_file: dict[str, tuple[set[str], Path]],
    source: Path,
) -> dict[str, Any]:
    """``configs`` (parsed for ``--resume``) checked against the resumed run's settings ``saved``
    (read from its ``config.json``, ``source``): a setting of ``FIXED_ON_RESUME`` given in ``flags``
    or ``from_file`` (``{section: (names, --config file)}``) must have the run's value, else a
    ``ValueError`` names it, the run's value and the given one. ``policy_kwargs`` given with opt-ins
    only (or a part of the run's) become the run's plus those opt-ins. Returns the configs."""
    from nets.file_settings import OPT_IN_KEYS, strip_opt_ins

    folder = Path(source).parent
    out = dict(configs)
    for key, fixed in FIXED_ON_RESUME.items():
        if key not in out:
            continue
        cfg, cls = out[key], type(out[key])
        hints = typing.get_type_hints(cls)
        defaults = {f.name: f for f in dataclasses.fields(cls)}
        names, config_file = from_file.get(key, (set(), None))
        for name, why in fixed.items():
            if name not in defaults or (name not in flags and name not in names):
                continue
            value = getattr(cfg, name)
            if name in saved.get(key, {}):
                try:
                    theirs = check_value(hints[name], saved[key][name])
                except ValueError:
                    theirs = saved[key][name]
            else:  # a config.json of an older version: the run had the default
                f = defaults[name]
                theirs = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            if name == "run_dir":
                theirs, same = str(folder), value is None or Path(value).resolve() == folder.resolve()
            elif name == "init_policy":
                same = value == theirs or (
                    value is not None
                    and theirs is not None
                    and Path(value).resolve() == Path(theirs).resolve()
                )
            elif name == "policy_kwargs" and isinstance(theirs, dict):
                theirs = strip_opt_ins(theirs, f"{source}: {key}.{name}")
                base = value.get("base")  # a frozen base's opt-ins: {"base": {"kwargs": {opt-ins}}}
                base_opt_ins = (
                    isinstance(base, dict)
                    and set(base) == {"kwargs"}
                    and isinstance(base["kwargs"], dict)
                    and set(base["kwargs"]) <= OPT_IN_KEYS
                )
                own = {
                    k: v
                    for k, v in value.items()
                    if k not in OPT_IN_KEYS and not (k == "base" and base_opt_ins)
                }
                same = all(k in theirs and theirs[k] == v for k, v in own.items())
                if same:  # the run's arguments, with the opt-ins given (what the policy is built with)
                    merged = {**theirs, **value}
                    if base_opt_ins and isinstance(theirs.get("base"), dict):
                        ours = theirs["base"]  # the run's own base (spec or additions), opt-ins added
                        merged["base"] = {**ours, "kwargs": {**ours.get("kwargs", {}), **base["kwargs"]}}
                    out[key] = cfg = dataclasses.replace(cfg, **{name: merged})
            else:
                same = value == theirs
            if same:
                continue
            flag = "--" + name.replace("_", "-")
            where = f"{flag} {value!r}" if name in flags else f"{key}.{name} = {value!r} in {config_file}"
            raise BadInput(
                f"{where}: the run in {folder} has {name} {theirs!r} ({source}), and a resumed run keeps "
                f"it ({why}), so the value given would be written without taking effect. Give the run's "
                f"value or leave {flag} out; for another {name}, start a new run from this one's policy "
                f"(--init-policy {folder})"
            )
    return out


def parse_cli(
    classes: dict[str, type],
    argv: list[str] | None = None,
    description: str | None = None,
    ignore: Collection[str] = (),
) -> dict[str, Any]:
    """``parse`` for a trainer's command line: with ``--resume RUN`` (a run directory or a
    checkpoint in ``RUN/checkpoints``) and no ``--config``, the run's saved ``config.json`` is
    the base, so only the flags given again change anything. That file is treated as a file being
    loaded (``untrusted_settings``): its opt-ins are dropped and the modules it names checked."""
    argv = list(sys.argv[1:] if argv is None else argv)
    resume = None
    for i, arg in enumerate(argv):
        if arg == "--resume" and i + 1 < len(argv):
            resume = Path(argv[i + 1])
        elif arg.startswith("--resume="):
            resume = Path(arg.split("=", 1)[1])
    run_config = None
    if resume is not None:
        run_dir = resume.parent.parent if resume.is_file() else resume
        if (run_dir / "config.json").is_file():
            run_config = run_dir / "config.json"
    return parse(classes, argv, description, ignore, run_config)
