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
import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
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


SCHEDULES = ("step", "cosine", "linear")


@dataclass(frozen=True)
class FineTuneRecipe:
    """A VLA's published fine-tuning recipe: the defaults ``trainers.bc`` uses for it (each policy's
    ``fine_tune_recipe``, written beside its options with the source cited). A flag given to
    ``trainers.bc`` wins over the recipe; ``policy_kwargs`` are defaults of a new policy's keywords.

    The step size of optimizer step ``i`` is ``learning_rate`` times a factor (``lr_factor``):

    * ``"step"`` (OpenVLA-OFT's ``finetune.py``): linear warmup from ``lr_warmup_start`` over
      ``lr_warmup_steps`` (its ``0.1 + 0.9 min((i + 1) / warmup, 1)``), then ``lr_decay_to`` from
      ``lr_decay_steps`` on (its ``MultiStepLR``; 0: never);
    * ``"cosine"`` (openpi's ``CosineDecaySchedule``, optax ``warmup_cosine_decay_schedule``): linear
      from ``1 / (warmup + 1)`` to 1 over ``lr_warmup_steps``, then a cosine from 1 to ``lr_decay_to``
      at step ``lr_decay_steps`` (counted from 0, warmup included), flat after;
    * ``"linear"`` (Cosmos Policy's ``LambdaLinearScheduler``, two cycles): linear from
      ``lr_warmup_start`` to 1 over ``lr_warmup_steps``, linear down to ``lr_decay_to`` at
      ``lr_decay_steps``, then ``lr_after_decay`` (None: ``lr_decay_to``) for ever.
    """

    source: str
    """Where the numbers come from (repository file, paper or model card)."""
    learning_rate: float
    batch_size: int
    lr_schedule: str = "step"
    lr_warmup_steps: int = 0
    lr_warmup_start: float = 0.1
    lr_decay_steps: int = 0
    lr_decay_to: float = 0.1
    lr_after_decay: float | None = None
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    """0: no clipping."""
    image_shift: int = 4
    """trainers.bc's random-shift augmentation, in pixels (0: off)."""
    ema_decay: float | None = None
    """The recipe's EMA of the weights (recorded here; trainers.bc keeps no EMA copy)."""
    policy_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Defaults of a new policy's keywords (the recipe's loss head, LoRA rank)."""

    def __post_init__(self) -> None:
        if self.lr_schedule not in SCHEDULES:
            raise BadInput(f"lr_schedule must be one of {SCHEDULES}, got {self.lr_schedule!r}")
        if self.learning_rate <= 0 or self.batch_size < 1:
            raise BadInput(
                f"a recipe needs learning_rate > 0 and batch_size >= 1, got {self.learning_rate}, "
                f"{self.batch_size}"
            )
        if self.lr_warmup_steps < 0 or self.lr_decay_steps < 0:
            raise BadInput(
                f"lr_warmup_steps and lr_decay_steps must be >= 0, got {self.lr_warmup_steps}, "
                f"{self.lr_decay_steps}"
            )


def lr_factor(recipe: Any, step: int) -> float:
    """The step-size factor of optimizer step ``step`` (from 0) under ``recipe``'s schedule (any
    object with ``FineTuneRecipe``'s ``lr_*`` fields; see its docstring)."""
    warmup, decay = recipe.lr_warmup_steps, recipe.lr_decay_steps
    if recipe.lr_schedule == "step":
        f = 1.0
        if warmup:
            start = recipe.lr_warmup_start
            f = start + (1 - start) * min((step + 1) / warmup, 1.0)
        return f * (recipe.lr_decay_to if decay and step >= decay else 1.0)
    if step < warmup:
        start = 1 / (warmup + 1) if recipe.lr_schedule == "cosine" else recipe.lr_warmup_start
        return start + (1 - start) * step / warmup
    end = recipe.lr_decay_to
    if decay <= warmup:  # no decay phase
        return 1.0
    if step >= decay:
        after = recipe.lr_after_decay if recipe.lr_schedule == "linear" else None
        return end if after is None else after
    frac = (step - warmup) / (decay - warmup)
    if recipe.lr_schedule == "cosine":
        return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * frac))
    return 1 + (end - 1) * frac


RECIPE_FILE = "fine_tune_recipe.json"
TINY_ABOUT = (
    "A tiny random checkpoint: the published recipe is for billions of pretrained weights, batches of "
    "hundreds and tens of thousands of steps; these settings fine-tune this model on a few demos on a CPU."
)


def write_recipe_file(
    folder: str | Path, about: str, bc: Mapping[str, Any], policy_kwargs: Mapping[str, Any] | None = None
) -> Path:
    """Write a checkpoint folder's own fine-tuning settings (``RECIPE_FILE``, read by ``trainers.bc``
    over the policy's published recipe): ``bc`` recipe settings and defaults of the policy's keywords."""
    path = Path(folder) / RECIPE_FILE
    content = {"about": about, "bc": dict(bc), "policy_kwargs": dict(policy_kwargs or {})}
    path.write_text(json.dumps(content, indent=2) + "\n")
    return path
