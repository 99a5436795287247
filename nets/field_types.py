"""Check a setting's value against its dataclass field's annotation (trainer configs, VLA options).

Handles what settings use: ``bool``, ``int``, ``float`` (finite; an int becomes a float), ``str``, ``None``,
unions (``X | None``), ``Literal[...]``, ``dict`` / ``Mapping``, ``list`` / ``tuple`` / ``Sequence``
(a JSON list; a ``Sequence[X]``'s items are checked too), ``Path`` (a str or a path) and classes
(an instance). Anything else (``Any``, type variables) passes unchecked.
"""

from __future__ import annotations

import collections.abc
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from nets.errors import BadInput


def check_value(annotation: Any, value: Any) -> Any:
    """``value`` if it fits ``annotation`` (an int where a float is wanted becomes a float, a list
    where a tuple is wanted a tuple), else a ``ValueError`` saying what was expected."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        for option in args:
            try:
                return None if option is type(None) and value is None else check_value(option, value)
            except ValueError:
                continue
        raise BadInput(f"expected {describe(annotation)}")
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        raise BadInput(f"expected one of {list(args)}")
    if annotation is type(None):
        if value is None:
            return None
        raise BadInput("expected null")
    if annotation is bool or annotation is int or annotation is str:
        if isinstance(value, annotation) and (annotation is bool or not isinstance(value, bool)):
            return value
        raise BadInput(f"expected {annotation.__name__}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # NaN or inf: never a setting (None says "no limit")
                raise BadInput("expected a finite number")
            return float(value)
        raise BadInput("expected a number")
    if annotation is Path:
        if isinstance(value, (str, os.PathLike)):
            return value
        raise BadInput("expected a path (a string)")
    kind = origin or annotation
    if kind in (dict, collections.abc.Mapping):
        if isinstance(value, collections.abc.Mapping):
            return value
        raise BadInput("expected a JSON object")
    if kind in (list, tuple):
        if isinstance(value, (list, tuple)):
            return tuple(value) if kind is tuple else list(value)
        raise BadInput("expected a JSON list")
    if kind is collections.abc.Sequence:
        if not isinstance(value, (list, tuple)):
            raise BadInput(f"expected a JSON list{f' of {describe(args[0])}' if args else ''}")
        if args:
            for item in value:
                try:
                    check_value(args[0], item)
                except ValueError:
                    raise BadInput(f"expected a JSON list of {describe(args[0])}") from None
        return value
    if isinstance(annotation, type) and annotation.__module__ not in ("typing", "builtins"):
        if isinstance(value, annotation):
            return value
        raise BadInput(f"expected a {annotation.__name__}")
    return value  # an annotation without a check here (Any, a type variable...)


def describe(annotation: Any) -> str:
    """An annotation as a reader writes it: ``str | None``, ``Sequence[str]``."""
    text = str(annotation).replace("<class '", "").replace("'>", "")
    return re.sub(r"\b(?:[a-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", text)  # module paths dropped
