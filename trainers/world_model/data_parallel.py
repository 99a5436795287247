"""The world model over several ranks (``torchrun``): the objective as one module's forward, wrapped in DDP
or sharded with FSDP2, and the whole weights a checkpoint or a bundle keeps.

    torchrun --nproc-per-node 8 -m trainers.world_model --config CONFIG --device cuda --data-parallel fsdp

Every rank draws the same batch, noise levels and noise (one generator, checkpointed) and computes the loss
of its own equal share of the batch; DDP (or FSDP's reduce-scatter) averages the gradients, so each step is
the one-process step on the whole batch, and a run resumes on any number of ranks. ``ddp`` keeps the whole
model on every rank; ``fsdp`` keeps a shard of every parameter, gradient, optimizer state and EMA entry
(the DiT's blocks are the units, ``fsdp_units()``), gathered whole only for checkpoints and the bundle.
The collectives themselves are ``trainers.parallel``'s; what is here is what the world model adds.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainers import parallel


class Loss(nn.Module):
    """``objective.loss(dit, ...)`` as this module's forward: DDP and FSDP hook what ``forward`` computes,
    one forward per backward."""

    def __init__(self, dit: nn.Module, objective: Any, bf16: bool) -> None:
        super().__init__()
        self.dit, self.objective, self.bf16 = dit, objective, bf16

    def forward(self, latents: torch.Tensor, actions: torch.Tensor, t: torch.Tensor,
                noise: torch.Tensor) -> torch.Tensor:  # fmt: skip
        device = latents.device.type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=self.bf16):
            return self.objective.loss(self.dit, latents, actions, t, noise)


def wrap(dit: nn.Module, objective: Any, *, bf16: bool, mode: str, checkpointing: bool) -> nn.Module:
    """The module the trainer calls for the loss: ``Loss(dit)``, its blocks recomputing their activations in
    backward with ``checkpointing``; over several ranks wrapped in DDP (``mode`` "ddp") or sharded block by
    block with FSDP2 ("fsdp": build the optimizer after this call, the parameters become ``DTensor``s)."""
    from torch.distributed._composable import checkpoint

    root = Loss(dit, objective, bf16)
    units = list(dit.fsdp_units())
    if checkpointing:
        for unit in units:
            checkpoint(unit)  # hook-based: parameter names stay as they are
    if parallel.world_size() == 1:
        return root
    device = next(dit.parameters()).device
    if mode == "ddp":
        return parallel.wrap_ddp(root, device)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    parallel.broadcast_module(dit)  # rank 0's weights, as DDP does
    mesh = init_device_mesh(device.type, (parallel.world_size(),))
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(root, mesh=mesh)
    return root


def local(root: nn.Module) -> nn.Module:
    """The module to evaluate with: DDP's inner module (no collective, every rank computes the same), the
    sharded root itself under FSDP (its forward gathers the weights: every rank must call it)."""
    return root.module if isinstance(root, nn.parallel.DistributedDataParallel) else root


def reshard(root: nn.Module) -> None:
    """Back to shards after a forward without backward (FSDP keeps the root's parameters whole after its
    forward, for the backward that usually follows); nothing without FSDP."""
    if hasattr(root, "reshard"):
        root.reshard()


def whole(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor whole and on the CPU (FSDP's ``DTensor`` shards gathered: a collective, every rank
    calls it in the same order)."""
    gathered = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in tensors.items()}
    return {k: v.detach().cpu() for k, v in gathered.items()}


def like(full: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """``full`` (float32) laid out as ``current``: this rank's shard when ``current`` is a ``DTensor``."""
    full = full.to(current.device, torch.float32)
    if not hasattr(current, "device_mesh"):
        return full.clone()
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, current.device_mesh, current.placements)


def model_and_optimizer_state(
    root: nn.Module, dit: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The DiT's and the optimizer's state as one process has them (full tensors, on the CPU): gathered to
    rank 0 under FSDP (the others get empty dicts; a collective)."""
    if parallel.is_sharded(root):
        return parallel.full_state(root, dit, optimizer)
    return {k: v.detach().cpu() for k, v in dit.state_dict().items()}, optimizer.state_dict()


def load_optimizer(root: nn.Module, dit: nn.Module, optimizer: torch.optim.Optimizer,
                   state: dict[str, Any]) -> None:  # fmt: skip
    """A checkpoint's whole optimizer state into this rank's optimizer (its shards under FSDP)."""
    if parallel.is_sharded(root):
        parallel.load_optimizer_state(root, dit, optimizer, state)
    else:
        optimizer.load_state_dict(state)
