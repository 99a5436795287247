"""``OpenVLAOptions``: the options of ``OpenVLAPolicy`` (``--policy openvla``): OpenVLA-OFT's common
ones (``OpenVLACommonOptions``) and the decoding's KV cache (see ``policies/options.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..openvla_oft.options import OpenVLACommonOptions


@dataclass(frozen=True)
class OpenVLAOptions(OpenVLACommonOptions):
    """What ``OpenVLAPolicy`` is built with besides its spaces."""

    use_cache: bool = True
    """Decode the action tokens with a KV cache (False: re-run the whole sequence for each token; the
    same tokens and log-probs, slower)."""
