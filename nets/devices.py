"""Device and dtype choices, parsed in one place for every package: ``default_device`` (the device
used when none is given) and ``parse_dtype`` (a dtype from the names configs and command lines use).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from nets.errors import BadInput

# Every accepted spelling of a dtype name (case-insensitive; a leading "torch." is ignored, so
# ``str(torch.bfloat16)`` parses back). The union of what the world-model envs (torch's own names),
# the VLA policies and ``--fsdp-param-dtype`` accepted, plus the usual short forms.
DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


def default_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` when given, else CUDA when available, else CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def parse_dtype(
    value: str | torch.dtype | None,
    *,
    what: str = "dtype",
    optional: bool = True,
    allowed: Collection[torch.dtype] | None = None,
    also: Sequence[str] = (),
) -> torch.dtype | None:
    """The ``torch.dtype`` that ``value`` names: a name of ``DTYPES`` (``"bfloat16"``/``"bf16"``,
    ``"float16"``/``"fp16"``/``"half"``, ``"float32"``/``"fp32"``/``"float"``,
    ``"float64"``/``"fp64"``/``"double"``; any case, ``"torch."`` prefix allowed) or a ``torch.dtype``.
    None stays None when ``optional``. ``allowed`` narrows the dtypes a caller can use (the VLAs:
    float32 and bfloat16), whatever the spelling. Anything else raises a ``ValueError`` that names
    ``what`` and the accepted spellings (``also``: those the caller handles itself, e.g. ``"auto"``)."""
    if value is None and optional:
        return None
    dtype = value if isinstance(value, torch.dtype) else None
    if isinstance(value, str):
        dtype = DTYPES.get(value.strip().lower().removeprefix("torch."))
    if dtype is not None and (allowed is None or dtype in allowed):
        return dtype
    names = [name for name, d in DTYPES.items() if allowed is None or d in allowed]
    choices = [*also, *names] + (["None"] if optional else [])
    raise BadInput(f"{what} must be one of {choices} (a torch dtype name or its short form), got {value!r}")
