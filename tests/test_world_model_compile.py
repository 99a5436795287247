"""``compile_blocks``: the world-model DiTs' blocks under ``torch.compile`` (regional compilation) give
the eager numbers and keep their weights' names, so a compiled model loads and saves as before."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from nets.cosmos_tiny import build_tiny_dit  # noqa: E402
from nets.opensora_tiny import build_tiny_stdit3  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]  # ~20 s each: compiling


def _same_after_compile(dit: torch.nn.Module, call) -> None:
    keys = list(dit.state_dict())
    with torch.no_grad():
        eager = call(dit)
        dit.compile_blocks()
        compiled = call(dit)
    assert list(dit.state_dict()) == keys
    assert torch.allclose(compiled, eager, atol=1e-4, rtol=1e-4), (compiled - eager).abs().max()


def test_cosmos_dit_compiled_blocks_match_eager():
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(2, 16, 4, 8, 10, generator=g), torch.rand(2, 4, generator=g)
    action, context = torch.randn(2, 12, 7, generator=g), torch.randn(2, 5, 32, generator=g)
    cond_mask = torch.zeros(2, 4)
    cond_mask[:, 0] = 1.0
    _same_after_compile(build_tiny_dit(), lambda dit: dit(x, t, action, context, cond_mask))


def test_opensora_stdit3_compiled_blocks_match_eager():
    g = torch.Generator().manual_seed(0)
    z, actions = torch.randn(2, 4, 12, 4, 4, generator=g), torch.randn(2, 8, 7, generator=g)
    mask = torch.tensor([False] * 4 + [True] * 8).expand(2, -1)
    t = torch.full((2,), 900.0)
    _same_after_compile(build_tiny_stdit3(seed=0), lambda dit: dit(z, t, actions, mask, height=32, width=32))
