"""Residual policy: a frozen Gaussian base policy plus a small learned correction.

``u = base_mean(obs) + r(obs) + std * eta`` before squashing, ``a = squash(u)`` as the base does;
``r`` is an MLP whose output layer starts at exactly zero, so before training the policy's mean
action is the base's. RL then learns only the correction: the behaviour the base was cloned to
do cannot be forgotten, and the exploration noise lives around it.

The base is any ``GaussianPolicy`` spec (``{"name": ..., "kwargs": ...}``), built inside and kept
as the frozen submodule ``base`` (its weights are in this policy's state dict). The trainers fill
it from a checkpoint: ``--policy residual --init-policy bc.pt`` (``trainers.run``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from nets.errors import BadInput

from .base import ActionChunk
from .gaussian import GaussianPolicy, clamp_inward
from .registry import make_policy


class ResidualPolicy(GaussianPolicy):
    """Gaussian policy whose mean is a frozen base policy's mean plus a learned correction.

    Args:
        observation_space, action_space: single-env spaces (the base is built on the same).
        base: the base policy, ``{"name": registry name or "module:Class", "kwargs": {...}}``; it
            must be a ``GaussianPolicy`` (squashing and bounds are taken from it).
        hidden_sizes, activation: the correction's MLP (its own torso).
        log_std_init: None (default): the std starts as the base's fitted one, and the policy
            learns an offset to it; a float: a constant initial ``log_std`` of its own.
        log_std_bounds, noise_correlation, noise_dims, saturated_slope: as ``GaussianPolicy``
            (``saturated_slope`` through ``torso_options``); dimensions outside
            ``noise_dims`` get no correction either (they follow the base exactly).
        **torso_options: ``use_critic``, ``share_torso``, ``torso_kwargs`` (see ``TorsoPolicy``).

    Replay: ``obs/<key>``, ``raw_action`` (pre-squash sample) and ``base_mean`` ``[B, K, D]`` (the
    frozen base's part, stored so ``evaluate`` does not recompute it).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        base: Mapping[str, Any],
        hidden_sizes: Sequence[int] = (256, 256),
        activation: str = "relu",
        log_std_init: float | None = None,
        log_std_bounds: tuple[float, float] | None = None,
        noise_correlation: float = 0.0,
        noise_dims: Sequence[int] | None = None,
        **torso_options: Any,
    ):
        if not isinstance(base, Mapping) or "name" not in base:
            raise BadInput(
                f"base must be a policy spec {{'name': ..., 'kwargs': {{...}}}}, got {base!r:.200}"
            )
        base_policy = make_policy(
            base["name"], observation_space, action_space, **dict(base.get("kwargs", {}))
        )
        if not isinstance(base_policy, GaussianPolicy):
            raise TypeError(
                f"the base of a ResidualPolicy must be a GaussianPolicy, got {type(base_policy).__name__}"
            )
        super().__init__(
            observation_space,
            action_space,
            log_std_init=0.0 if log_std_init is None else float(log_std_init),
            log_std_bounds=log_std_bounds,
            squash=base_policy.squash,
            noise_correlation=noise_correlation,
            noise_dims=noise_dims,
            hidden_sizes=hidden_sizes,
            activation=activation,
            **torso_options,
        )
        if (base_policy.chunk_size, base_policy.action_dim) != (self.chunk_size, self.action_dim):
            raise BadInput("the base policy's chunk does not match the action space")
        self.base = base_policy.requires_grad_(False).eval()
        self.log_std_from_base = log_std_init is None  # self.log_std is then an offset to the base's
        nn.init.zeros_(self.mean_head.weight)
        nn.init.zeros_(self.mean_head.bias)

    def train(self, mode: bool = True) -> ResidualPolicy:
        super().train(mode)
        self.base.eval()  # frozen: never in training mode
        return self

    def _mean_log_std(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The correction ``[B, K, D]`` and the log-std used (the base's plus the offset, clamped)."""
        shape = (features.shape[0], self.chunk_size, self.action_dim)
        correction = self.mean_head(features).reshape(shape)
        if self.log_prob_dim < self.action_dim:  # dimensions without noise follow the base exactly
            correction = correction * self._noise_mask
        log_std = self.log_std + self.base.log_std.detach() if self.log_std_from_base else self.log_std
        if self.log_std_bounds is not None:
            log_std = clamp_inward(log_std, *self.log_std_bounds)
        return correction, log_std.reshape(shape[1:]).expand(shape)

    @torch.no_grad()
    def base_mean(self, obs: Any) -> torch.Tensor:
        """The frozen base's pre-squash mean ``[B, K, D]``."""
        return self.base._mean_log_std(self.base.torso(self.base._prepare(obs)))[0]

    rsample = None  # no reparametrised sample through the frozen base: SAC refuses this policy

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        features = self.torso(prepared)
        correction, log_std = self._mean_log_std(features)
        base_mean = self.base_mean(obs)
        mean = base_mean + correction
        u, log_probs = (mean, None) if deterministic else self._sample(mean, log_std)
        if log_probs is not None:
            log_probs = self._charged(log_probs, u)
        replay = {**self._obs_replay(prepared), "raw_action": u, "base_mean": base_mean}
        return ActionChunk(self._to_action(u), log_probs, self._value(prepared, features), replay)

    def _replayed_mean_log_std(
        self, replay: dict[str, torch.Tensor], features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        correction, log_std = self._mean_log_std(features)
        return replay["base_mean"].to(features.device) + correction, log_std

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        raise NotImplementedError("ResidualPolicy: clone the base policy (a GaussianPolicy) instead")
