"""Typed options of the pretrained VLAs (``openvla``, ``openvla_oft``, ``pi05``, ``cosmos_policy``).

Each of them has a frozen dataclass of its options (``OpenVLAOptions``, ``OpenVLAOFTOptions``,
``Pi05Options``, ``CosmosPolicyOptions``, the policy class's ``options_type``): one field per keyword
of its constructor, with the constructor's default and, right below it, a docstring (what
``python -m trainers --policy-help NAME`` shows). The constructor takes the options as keywords,
as ``--policy-kwargs`` and saved checkpoints give them, or as ``options=``: an instance, or a dict
of some of its fields. ``build_options`` checks them before anything is loaded: a keyword the
dataclass does not have, or a required one left out, is an ``OptionsError`` naming it and the
keywords the policy accepts, and so is a value whose type does not fit its field's annotation
(``nets.field_types.check_value``: ``"temperature": "hot"``); the dataclass's ``__post_init__``
checks what the values mean.

An options dataclass may take the fields of a field's own options type as keywords too
(``KEYWORD_GROUPS``): pi0.5 takes ``num_steps=4`` as well as ``sampling={"num_steps": 4}``
(``FlowSampling``'s fields, with pi0.5's defaults).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from nets.errors import BadInput
from nets.field_types import check_value

T = TypeVar("T")


class OptionsError(BadInput, TypeError):
    """A keyword a policy does not take, or a required one left out: a ``ValueError`` as every bad
    setting, and a ``TypeError`` as Python's own error for a wrong keyword argument."""


def keyword_groups(cls: type) -> dict[str, tuple[type, dict[str, Any]]]:
    """``cls.KEYWORD_GROUPS``: field name -> (its options type, whose fields are keywords of ``cls``
    too, and the policy's own defaults for them); empty when ``cls`` has none."""
    return dict(getattr(cls, "KEYWORD_GROUPS", {}))


def accepted_keywords(cls: type) -> list[str]:
    """The keywords an options dataclass is built from: its fields, then its keyword groups' fields."""
    names = [f.name for f in dataclasses.fields(cls)]
    for group, _ in keyword_groups(cls).values():
        names += [f.name for f in dataclasses.fields(group)]
    return names


def build_options(cls: type[T], options: Any, keywords: Mapping[str, Any], owner: str) -> T:
    """The ``cls`` instance a policy (``owner``, for the errors) is built with: ``options`` (an
    instance of ``cls``, a mapping of some of its keywords, or None) and the constructor's other
    ``keywords``. An unknown keyword, a required field left out, a keyword given both ways or beside
    an instance is an ``OptionsError``; the fields of ``KEYWORD_GROUPS`` are gathered into their
    group's options type (its ``from_options``, with the policy's defaults)."""
    accepted = accepted_keywords(cls)
    if options is not None and not isinstance(options, (cls, Mapping)):
        raise OptionsError(
            f"{owner}: options must be a {cls.__name__} or a dict of its fields, got {type(options).__name__}"
        )
    given = {} if options is None or isinstance(options, cls) else dict(options)
    unknown = sorted(set(keywords) - set(accepted)) + sorted(set(given) - set(accepted))
    if unknown:
        raise OptionsError(f"{owner} got unexpected keyword arguments {unknown}; it accepts {accepted}")
    if isinstance(options, cls):
        if keywords:
            raise OptionsError(
                f"{owner}: {sorted(keywords)} given as keywords beside options={cls.__name__}(...): put "
                "them in it"
            )
        return options
    both = sorted(set(given) & set(keywords))
    if both:
        raise OptionsError(f"{owner}: {both} given both in options= and as keywords: give each once")
    values = {**given, **keywords}
    groups = keyword_groups(cls)
    hints = typing.get_type_hints(cls)
    for group, _ in groups.values():
        hints = {**typing.get_type_hints(group), **hints}
    for name, value in values.items():
        try:
            values[name] = check_value(hints[name], value)
        except ValueError as e:
            raise OptionsError(f"{owner}: option {name}: {e}, got {value!r:.100}") from None
    for name, (group, defaults) in groups.items():
        flat = {f.name: values.pop(f.name) for f in dataclasses.fields(group) if f.name in values}
        values[name] = group.from_options(values.get(name), flat, **defaults)  # type: ignore[attr-defined]
    missing = [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in values
    ]
    if missing:
        raise OptionsError(f"{owner} needs the keyword arguments {missing}; it accepts {accepted}")
    return cls(**values)
