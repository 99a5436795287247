"""Optimisation plumbing the trainers share: fused Adam, one guarded optimizer step, and the guard
that skips non-finite updates. PPO's and GRPO's epochs over minibatches are in ``trainers/update.py``."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from nets.errors import BadInput


def flatten_time(x: torch.Tensor) -> torch.Tensor:
    """``[T, N, ...] -> [T * N, ...]`` (sample m = t * N + n)."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def fused_ok(params: list[torch.Tensor]) -> bool | None:
    """Whether torch's fused Adam/AdamW kernel takes these parameters (float, CPU or CUDA);
    None lets torch choose."""
    if not params:
        return None
    return (
        all(
            p.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
            and p.device.type in ("cpu", "cuda")
            for p in params
        )
        or None
    )


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


class BadUpdateGuard:
    """Skips an update whose loss or gradient norm is NaN/inf, with a warning; raises after
    ``max_in_a_row`` skips in a row (a run that only produces NaNs should stop, not crawl on).

    Keep one guard for a whole training run so the count carries across rollouts.
    """

    def __init__(self, max_in_a_row: int = 10) -> None:
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0
        self.total = 0

    def counters(self) -> dict[str, int]:
        """The counts a checkpoint keeps (``restore_counters`` takes them back)."""
        return {"bad_updates": self.total, "bad_in_a_row": self.in_a_row}

    def restore_counters(self, counters: dict[str, Any]) -> None:
        self.total, self.in_a_row = int(counters["bad_updates"]), int(counters["bad_in_a_row"])

    def ok(self, loss: torch.Tensor, grad_norm: torch.Tensor | None = None) -> bool:
        """True if the update may go ahead; counts (and maybe raises) otherwise. One host sync."""
        values = loss.detach().reshape(1)
        if grad_norm is not None:
            values = torch.cat([values, grad_norm.detach().reshape(1).to(values.dtype)])
        if bool(torch.isfinite(values).all()):
            self.in_a_row = 0
            return True
        bad_loss = not bool(torch.isfinite(loss.detach()))
        what = f"loss {loss.item()}" if bad_loss else f"gradient norm {float(grad_norm)}"
        self.in_a_row += 1
        self.total += 1
        if self.in_a_row >= self.max_in_a_row:
            raise RuntimeError(
                f"{self.in_a_row} updates in a row had a non-finite {what.split()[0]} (last: {what}); "
                "stopping. Lower the learning rate, check the rewards and the policy's log-probs."
            )
        warnings.warn(
            f"skipping a minibatch update: non-finite {what} ({self.in_a_row} in a row)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False


def step_optimizer(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float | None,
    guard: BadUpdateGuard,
    guard_loss: torch.Tensor | None = None,
) -> tuple[bool, torch.Tensor]:
    """Backward, clip gradients, step; skip (and zero the gradients) if the loss or the gradient
    norm is not finite. Returns ``(stepped, grad_norm)`` (the norm as a 0-dim tensor, so that
    callers can average it without a host sync per minibatch).

    ``guard_loss``: the loss the guard checks instead of ``loss`` (data parallel: the loss over
    all ranks, so that every rank takes the same decision; the norm is of the all-reduced
    gradients, the same on every rank).
    """
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in optimizer_params(optimizer) if p.grad is not None]
    if not params:
        return False, torch.zeros(())
    norm = torch.nn.utils.clip_grad_norm_(params, math.inf if max_grad_norm is None else max_grad_norm)
    if hasattr(norm, "full_tensor"):  # FSDP's sharded gradients give a DTensor: the whole norm
        norm = norm.full_tensor()
    if not guard.ok(loss if guard_loss is None else guard_loss, norm):
        optimizer.zero_grad(set_to_none=True)
        return False, norm.detach()
    optimizer.step()
    return True, norm.detach()


class WeightEMA:
    """An exponential moving average of a module's trained parameters (Polyak averaging, as
    diffusion and flow policies are usually evaluated): after each optimizer step
    ``avg <- decay * avg + (1 - decay) * param``, in float32 whatever the parameter's dtype.

    Only parameters that require gradients are averaged (a frozen VLA backbone costs nothing).
    ``swap`` exchanges the module's weights with the average in place, so the module can be
    evaluated and saved with the averaged weights and swapped back to keep training; the state a
    checkpoint needs is the other side of the swap (``state_dict``).
    """

    def __init__(self, module: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self.average = {n: p.detach().float().clone() for n, p in self.params.items()}
        self.swapped = False

    @torch.no_grad()
    def update(self) -> None:
        """Move the average toward the current weights (call after each optimizer step)."""
        if self.swapped:
            raise RuntimeError("WeightEMA.update while the average is swapped in: swap back first")
        for name, p in self.params.items():
            self.average[name].lerp_(p.detach().float(), 1.0 - self.decay)

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange the module's weights and the average (twice restores both)."""
        for name, p in self.params.items():
            held = p.detach().float().clone()
            p.copy_(self.average[name].to(p.dtype))
            self.average[name] = held
        self.swapped = not self.swapped

    @torch.no_grad()
    def averaged_state(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``module``'s state dict as CPU copies, with the average in place of the trained
        parameters (whichever side of the swap the module holds now)."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        if not self.swapped:
            for name, average in self.average.items():
                state[name] = average.to("cpu", state[name].dtype, copy=True)
        return state

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What is not in the module now: the average, or the trained weights while swapped."""
        return {n: t.clone() for n, t in self.average.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], swapped: bool) -> None:
        """Take ``state`` (from ``state_dict``) as the other side of the module's weights."""
        missing = set(self.params) - set(state)
        if missing:
            raise KeyError(f"EMA state lacks {len(missing)} parameters, e.g. {sorted(missing)[0]!r}")
        for name in self.params:
            if tuple(state[name].shape) != tuple(self.params[name].shape):
                raise ValueError(
                    f"EMA state {name!r}: shape {tuple(state[name].shape)}, the parameter's "
                    f"{tuple(self.params[name].shape)}"
                )
            self.average[name] = state[name].detach().float().clone()
        self.swapped = swapped


# the checkpoint's ``extra`` entry holding the trained weights while the policy entry holds the average
EMA_KEY = "ema_trained_weights"


def restore_ema(
    policy: torch.nn.Module, decay: float, extra: dict[str, Any], resumed: bool, sharded: bool
) -> WeightEMA | None:
    """The weight average of a run with ``decay`` > 0 (None when off), holding the trained weights
    of a resumed checkpoint (``extra``): its policy entry is the average, swapped out here so that
    training goes on from the trained weights."""
    if decay == 0:
        if EMA_KEY in extra:
            raise BadInput(
                "--resume: the run averaged its weights (its checkpoint's policy is the average); resume "
                "it with the same ema_decay, or start a new run from it with --init-policy"
            )
        return None
    if sharded:
        raise BadInput("ema_decay is not supported with FSDP (data_parallel fsdp): use ddp or ema_decay 0")
    ema = WeightEMA(policy, decay)
    if resumed:  # the policy holds the average, the checkpoint's extra the trained weights
        if EMA_KEY not in extra:
            raise BadInput(
                f"--resume with ema_decay {decay}: the run did not average its weights; resume it with "
                "ema_decay 0, or start a new run from it with --init-policy"
            )
        ema.load_state_dict(extra[EMA_KEY], swapped=True)
        ema.swap()
    return ema
