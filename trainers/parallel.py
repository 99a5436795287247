"""Data-parallel training with ``torch.distributed``, launched by ``torchrun``.

    torchrun --nproc-per-node 2 -m trainers.ppo --env CartPole-v1 --num-envs 8
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m trainers ...

Each process (rank) steps its own ``num_envs / world_size`` envs (behaviour cloning: trains on its
share of each minibatch of demos) and computes its share of every loss; ``DistributedDataParallel``
sums the gradients over ranks during ``backward``, so that every rank applies the same update to the
same weights. The loss math stays in the algorithms (``trainers/ppo/algorithm.py``,
``trainers/grpo/algorithm.py``, ``trainers/bc.py``); what they need from here is small: sums of a
few numbers over ranks (``sum_over_ranks``), gathering python objects (``all_gather``), and the DDP
wrapper (``data_parallel``). At world size 1 (no ``torchrun``, or ``--nproc-per-node 1``) no process
group is started and every helper returns its input: a single-process run is exactly what it was.

``--data-parallel fsdp`` shards the policy instead (FSDP2 ``fully_shard``, ``fully_shard_policy``):
each rank keeps a shard of every parameter, gradient and optimizer state; ``Evaluate(policy)`` is
the root whose forward all-gathers the parameters, with the sub-modules a policy lists in
``fsdp_units()`` (e.g. transformer blocks) sharded first; bf16 compute (``--fsdp-param-dtype``)
and activation checkpointing are options. Rollouts and evaluations run inside ``gathered`` (whole
parameters for ``policy.act``). Checkpoints keep the single-process format (``full_state``,
``load_optimizer_state``), so a run resumes on any number of ranks with ddp or fsdp. At world
size 1, fsdp is the plain policy (no process group is started for one rank).

Rank 0 alone logs and writes files; ``Run`` (``trainers/run.py``) asks ``is_main``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import inspect
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from nets.devices import parse_dtype
from nets.errors import BadInput
from policies.base import ActionChunkPolicy, PolicyEval


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in the job, from torchrun's environment variables."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> Ranks:
    """``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` as torchrun sets them (a single process without)."""
    ranks = Ranks(
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )
    if ranks.world_size < 1 or not 0 <= ranks.rank < ranks.world_size:
        raise BadInput(f"RANK={ranks.rank} and WORLD_SIZE={ranks.world_size} do not fit together")
    return ranks


def check_split(num_envs: int, world_size: int, group_size: int | None = None) -> int:
    """The envs per rank; a ``ValueError`` naming the numbers unless ``num_envs`` splits evenly
    over the ranks and (GRPO) each rank's envs into whole groups of ``group_size``."""
    if num_envs % world_size:
        raise BadInput(
            f"num_envs={num_envs} does not split over {world_size} ranks (world size): "
            f"use a multiple of {world_size}"
        )
    local = num_envs // world_size
    if group_size is not None and local % group_size:
        raise BadInput(
            f"num_envs={num_envs} over {world_size} ranks gives {local} envs per rank, not a multiple "
            f"of group_size={group_size} (groups stay within a rank): use num_envs a multiple of "
            f"{world_size * group_size}"
        )
    return local


def init(num_envs: int, device: str = "cpu", group_size: int | None = None) -> tuple[Ranks, bool]:
    """Check how the envs split over the ranks, then start the process group when there is more
    than one rank (backend nccl for CUDA, gloo otherwise; torchrun's ``env://`` rendezvous).

    Returns the ranks and whether this call started the group (then ``shutdown`` ends it). A group
    someone else started (a test, a larger program) is used as it is.
    """
    ranks = from_env()
    if dist.is_available() and dist.is_initialized():
        ranks = Ranks(dist.get_rank(), dist.get_world_size(), ranks.local_rank)
    check_split(num_envs, ranks.world_size, group_size)
    if ranks.world_size == 1 or dist.is_initialized():
        return ranks, False
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(ranks.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    return ranks, True


def shutdown() -> None:
    """End the process group (``init`` started it), once every rank has got here.

    Two ways a finished rank can die with SIGABRT ("terminate called without an active exception")
    are closed here: a rank destroying its gloo group while another is still finishing (rank 0
    writing the report), hence the barrier; and a DDP wrapper left in a reference cycle, whose
    reducer keeps the group's threads alive until the interpreter's final collection, hence the
    collections now and at exit, while the interpreter still runs.
    """
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
        atexit.unregister(gc.collect)  # registered once however often a process shuts down
        atexit.register(gc.collect)


def local_device(device: str, ranks: Ranks) -> str:
    """This rank's device: ``cuda:LOCAL_RANK`` for ``cuda`` when there are several ranks."""
    if ranks.world_size > 1 and device == "cuda":
        return f"cuda:{ranks.local_rank}"
    return device


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def rank_seed(seed: int, rank: int, iteration: int) -> int:
    """A seed of its own for each (rank, iteration) of a data-parallel run: its random streams
    (sampling, minibatch shuffles, torch/numpy/python) after a start or a resume."""
    return int(np.random.SeedSequence([seed, rank, iteration]).generate_state(1)[0])


# ---------------------------------------------------------------------- collectives
def _comm_device() -> torch.device:
    """Where the backend takes tensors: this rank's GPU for nccl, the CPU for gloo."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over ranks (a new tensor on ``x``'s device, no gradient); ``x`` itself at world
    size 1."""
    if world_size() == 1:
        return x
    out = x.detach().to(_comm_device(), copy=True)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(x.device)


def sum_over_ranks(values: Mapping[str, torch.Tensor | float]) -> dict[str, torch.Tensor]:
    """Named scalars summed over ranks in one ``all_reduce`` (float64, so counts stay exact);
    each comes back as a 0-dim tensor of its own dtype and device (integers: float64), without
    gradient. At world size 1 the values are returned as they are."""
    if world_size() == 1:
        return {k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in values.items()}
    tensors = {k: torch.as_tensor(v).detach() for k, v in values.items()}
    stacked = torch.stack([t.to(_comm_device(), torch.float64).reshape(()) for t in tensors.values()])
    dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
    return {
        k: total.to(t.device, t.dtype if t.is_floating_point() else torch.float64)
        for (k, t), total in zip(tensors.items(), stacked)
    }


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order: ``[obj]`` at world size 1."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def all_gather_cat(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (sizes may differ along it);
    ``x`` itself at world size 1. For small tensors (metrics): it goes through pickling."""
    if world_size() == 1:
        return x
    return torch.cat([t.to(x.device) for t in all_gather(x.detach().cpu())], dim=dim)


def average(rows: list[Mapping[str, float]]) -> dict[str, float]:
    """Each key's mean over the rows that have it (the ranks' metrics, from ``all_gather``)."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return {k: float(np.mean([row[k] for row in rows if k in row])) for k in keys}


def gather_iteration(
    env_steps: int, episodes: list[dict[str, float]], metrics: dict[str, float], num_envs: int
) -> tuple[int, list[dict[str, float]], dict[str, float]]:
    """One iteration over every rank: the env steps summed, the episodes gathered (each rank's
    ``env`` index made global: rank r's env i is env ``r * num_envs / world size + i``) and the
    metrics averaged; the arguments themselves at world size 1."""
    if world_size() == 1:
        return env_steps, episodes, metrics
    parts = all_gather((int(env_steps), episodes, metrics))
    local = num_envs // world_size()
    episodes = [{**ep, "env": ep["env"] + r * local} for r, (_, eps, _) in enumerate(parts) for ep in eps]
    return sum(steps for steps, _, _ in parts), episodes, average([m for _, _, m in parts])


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def shard(count: int, rank: int, world_size: int) -> range:
    """Rank ``rank``'s contiguous share of ``count`` items (the first ``count % world_size``
    ranks get one more)."""
    base, extra = divmod(count, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


# ---------------------------------------------------------------------- DDP
class Evaluate(nn.Module):
    """Routes ``forward`` to ``policy.evaluate``: DDP hooks gradients to what ``forward`` computes,
    and our policies compute their training outputs in ``evaluate(replay)``.

    ``forward(*replays)`` evaluates each replay batch and returns ``(log_probs, entropy, value)``
    per batch, as plain tuples (DDP looks for output tensors in tuples); ``evaluate`` below turns
    them back into ``PolicyEval``. Several batches go through one forward (GRPO's minibatch and
    its self-imitation batch) because DDP expects one forward per backward.
    ``forward(imitation=(obs, actions, mask, extra))`` returns ``policy.imitation_loss`` instead
    (behaviour cloning, ``imitation_loss`` below).
    """

    def __init__(self, policy: ActionChunkPolicy) -> None:
        super().__init__()
        self.policy = policy
        # FSDP mixed precision: autocast to the parameters' compute dtype, since the policies mix
        # in tensors of their own (float32 buffers, constants) that FSDP does not cast
        self.autocast_dtype: torch.dtype | None = None

    def forward(
        self, *replays: dict[str, torch.Tensor], imitation: tuple[Any, ...] | None = None
    ) -> tuple[tuple[Any, ...], ...] | torch.Tensor:
        with _autocast(self.policy, self.autocast_dtype):
            if imitation is not None:
                obs, actions, mask, extra = imitation
                return self.policy.imitation_loss(obs, actions, mask, **extra)
            outs = [self.policy.evaluate(replay) for replay in replays]
        return tuple((o.log_probs, o.entropy, o.value) for o in outs)


def _autocast(module: nn.Module, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``module``'s device type (a no-op context for None)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(module.parameters()).device.type, dtype=dtype)


def data_parallel(policy: ActionChunkPolicy) -> nn.Module:
    """The module the updates call for ``evaluate``: ``Evaluate(policy)``, wrapped in
    ``DistributedDataParallel`` when there are several ranks.

    DDP copies rank 0's parameters to every rank here, so call it after the policy is loaded
    (resume, ``--init-policy``). ``find_unused_parameters``: a loss need not reach every
    parameter (PPO's critic warm-up leaves the actor out); parameters no rank used keep no
    gradient, as in a single process. Buffers are not re-broadcast each step (the policies' buffers
    are constants).
    """
    module = Evaluate(policy)
    if world_size() == 1 or not any(p.requires_grad for p in policy.parameters()):
        return module
    return wrap_ddp(module, policy._param_device())


def wrap_ddp(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` in ``DistributedDataParallel`` as the trainers use it: ``find_unused_parameters`` (a
    loss need not reach every parameter; those no rank used keep no gradient, as in one process) and no
    broadcast of buffers at each forward (the models' buffers are constants)."""
    ddp = nn.parallel.DistributedDataParallel
    # newer torch calls the option forward_sync_buffers (and warns about broadcast_buffers)
    buffers = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else ""
    return ddp(
        module,
        device_ids=[device] if device.type == "cuda" else None,
        find_unused_parameters=True,
        **{buffers or "broadcast_buffers": False},
    )


def evaluate(evaluator: nn.Module, *replays: dict[str, torch.Tensor]) -> list[PolicyEval]:
    """``policy.evaluate`` of each replay batch through ``evaluator`` (``data_parallel``'s module)."""
    return [PolicyEval(*out) for out in evaluator(*replays)]


def imitation_loss(
    evaluator: nn.Module, obs: Any, actions: torch.Tensor, mask: torch.Tensor, **extra: Any
) -> torch.Tensor:
    """``policy.imitation_loss(obs, actions, mask, **extra)`` through ``evaluator``
    (``data_parallel``'s module, or ``fully_shard_policy``'s root), so that DDP and FSDP see the
    forward (behaviour cloning)."""
    return evaluator(imitation=(obs, actions, mask, extra))


def broadcast_module(module: nn.Module) -> None:
    """Rank 0's parameters and buffers in ``module`` on every rank (a module DDP does not wrap,
    e.g. GRPO's frozen reference policy)."""
    if world_size() == 1:
        return
    for tensor in module.state_dict().values():
        dist.broadcast(tensor, src=0)


def minibatch_count(total_rows: float, batch_size: int | None) -> int:
    """Minibatches per epoch for ``total_rows`` rows over all ranks: every rank splits its own
    rows into this many parts, so that all ranks step together."""
    return max(1, math.ceil(total_rows / (batch_size or max(total_rows, 1))))


# ---------------------------------------------------------------------- FSDP2
DATA_PARALLEL = ("ddp", "fsdp")
PARAM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def param_dtype(name: str | None) -> torch.dtype | None:
    """The ``torch.dtype`` of ``--fsdp-param-dtype`` (None: the parameters' own): bfloat16, float16
    or float32 in any spelling ``nets.devices.parse_dtype`` reads (``"bf16"``, ``"fp16"``...); a
    ``ValueError`` naming the choices otherwise."""
    return parse_dtype(name, what="fsdp_param_dtype", allowed=PARAM_DTYPES)


def fsdp_units(policy: nn.Module) -> list[nn.Module]:
    """The sub-modules that ``fully_shard`` shards on their own before the root (each all-gathers
    its parameters in its own forward and frees them after, so that a big model is never whole
    at once): what the policy's method ``fsdp_units()`` lists, none when it has no such method
    (the root alone holds every parameter, gathered whole in each forward).

    A unit must be run through its ``forward`` (``unit(...)``), never by reaching into its
    sub-modules, since FSDP gathers its parameters in forward hooks. That is why repeated blocks
    are not picked automatically: pi0.5 runs its Gemma layers inline (``layer.self_attn.o_proj``),
    so sharding those layers on their own would leave their parameters unassembled.
    """
    named = getattr(policy, "fsdp_units", None)
    return list(named()) if callable(named) else []


def fully_shard_policy(
    policy: ActionChunkPolicy, dtype: torch.dtype | None = None, checkpointing: bool = False
) -> nn.Module:
    """``Evaluate(policy)`` sharded with FSDP2 over all ranks, its ``fsdp_units`` first (with
    ``checkpointing``, each unit, or the root where there are none, recomputes its activations in
    backward). Returns the root, the module the updates call.

    Rank 0's weights are broadcast first (as DDP does), then every rank keeps its shard of each
    parameter; the policy's parameters become ``DTensor``s, so build the optimizer after this
    call. ``dtype``: parameters all-gathered in it for forward and backward, gradients reduced
    in float32, the root's outputs returned in float32. Rollouts and evaluations call
    ``policy.act`` outside ``forward``: run them inside ``gathered(root)``.
    """
    from torch.distributed._composable import checkpoint
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    broadcast_module(policy)
    device = policy._param_device()
    mesh = init_device_mesh(device.type, (world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, output_dtype=torch.float32)
    root = Evaluate(policy)
    root.autocast_dtype = dtype
    units = fsdp_units(policy)
    for unit in units:
        if checkpointing:
            checkpoint(unit)  # hook-based: parameter names stay as they are
        fully_shard(unit, mesh=mesh, mp_policy=mp)
    if checkpointing and not units:
        checkpoint(root)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    # the root must be the first FSDP state to initialize: rollouts may call a unit's forward
    # (through policy.act) before the root's forward ever runs
    root._get_fsdp_state()._lazy_init()
    return root


def _fsdp_modules(root: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(evaluator: nn.Module | None) -> Iterator[None]:
    """Whole parameters in the policy for the duration (rollouts, evaluation: ``policy.act``
    outside ``forward``); a no-op unless ``evaluator`` is ``fully_shard_policy``'s root.

    Every FSDP module is all-gathered once on entry (all ranks enter together) and kept whole
    (no reshard after a unit's forward), so that ranks may then call ``act`` different numbers of
    times with no collective in between; on exit all are resharded for the update. With a
    ``param_dtype`` the whole parameters are in it: ``act`` runs under autocast to that dtype.
    """
    modules = _fsdp_modules(evaluator) if evaluator is not None else []
    if not modules:
        yield
        return
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        with _autocast(evaluator, getattr(evaluator, "autocast_dtype", None)):
            yield
    finally:
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(module is not evaluator, recurse=False)  # fully_shard's default


def is_sharded(module: nn.Module | None) -> bool:
    return module is not None and bool(_fsdp_modules(module))


# FSDP checkpoints keep the single-process format (full tensors, optimizer state keyed by the
# parameter's index as ``Optimizer.state_dict`` numbers them), so that a run resumes on any number
# of ranks with ddp or fsdp. torch.distributed.checkpoint keys the optimizer state by parameter
# name: the two helpers below translate.
def _param_names(root: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names (in ``root``) of the optimizer's parameters, in ``Optimizer.state_dict`` order."""
    names = {id(p): name for name, p in root.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_state(
    root: nn.Module, policy: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sharded policy's full state dict (policy's own names) and the optimizer's (empty
    without one), as ``state_dict()`` gives them in one process, on CPU; gathered to rank 0 (the
    other ranks get empty dicts). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    prefix = next(name for name, child in root.named_children() if child is policy) + "."
    model = {k.removeprefix(prefix): v for k, v in get_model_state_dict(root, options=options).items()}
    optim = get_optimizer_state_dict(root, optimizer, options=options) if optimizer is not None else {}
    if not optim:
        return model, optim
    index = {name: i for i, name in enumerate(_param_names(root, optimizer))}
    return model, {
        "state": {index[name]: value for name, value in optim["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]} for group in optim["param_groups"]
        ],
    }


def load_optimizer_state(
    root: nn.Module, policy: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a checkpoint's full optimizer state (``Optimizer.state_dict`` form) into the
    optimizer of the sharded policy; every rank loads the same state and keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _param_names(root, optimizer)
    named = {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(root, optimizer, named, options=StateDictOptions(full_state_dict=True))
