"""Plumbing shared by the small policies: actor torso, critic (separate or shared), obs replay."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from .base import ActionChunkPolicy
from .torsos import SQRT2, make_torso, obs_from_replay, obs_to_replay, orthogonal_init


class TorsoPolicy(ActionChunkPolicy):
    """Base of the small policies: ``self.torso`` (actor features) and a value head ``[B, 1]``.

    Args:
        observation_space: single-env observation space (see ``make_torso``).
        hidden_sizes, activation: the torso's trunk MLP (defaults: SB3 ``MlpPolicy``, 64-64 tanh).
        share_torso: the critic reads the actor's features (gradients of the value loss then reach
            the actor torso); default False: a separate critic torso of the same shape, as SB3.
        use_critic: False for critic-free training (GRPO): ``value`` is then None in every output.
        ortho_init: SB3 init: orthogonal torso layers with gain sqrt(2), value output gain 1
            (subclasses init their action heads, 0.01 in SB3).
        torso_kwargs: extra ``make_torso`` arguments (image_channels, image_features,
            instruction_dim, num_buckets, max_tokens, obs_norm: ``"off"``, ``"fixed"`` or
            ``"running"`` standardisation of the vector observations, see ``make_torso``).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        share_torso: bool = False,
        use_critic: bool = True,
        ortho_init: bool = True,
        torso_kwargs: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        kwargs = dict(torso_kwargs or {})
        self.ortho_init = ortho_init
        self.torso = make_torso(observation_space, hidden_sizes, activation, **kwargs)
        self.critic_torso = None
        self.value_head = None
        if use_critic:
            if not share_torso:
                self.critic_torso = make_torso(observation_space, hidden_sizes, activation, **kwargs)
            self.value_head = nn.Linear(self.torso.out_dim, 1)
        if ortho_init:
            for module in (self.torso, self.critic_torso):
                if module is not None:
                    orthogonal_init(module, SQRT2)
            if self.value_head is not None:
                orthogonal_init(self.value_head, 1.0)

    @property
    def device(self) -> torch.device:
        return self.torso.device

    @property
    def obs_norm(self) -> str:
        """How the vector observations are standardised: ``"off"``, ``"fixed"`` or ``"running"``."""
        return self.torso.obs_norm

    def obs_stats_count(self) -> int:
        return self.torso.obs_stats_count()

    def fold_standardisation(self, obs: Any) -> None:
        """Standardise the vector observations of a policy trained on raw ones by the statistics of
        ``obs``, keeping its function (``Torso.fold_standardisation``); ``obs_norm`` becomes
        ``"fixed"`` (rebuild it with ``torso_kwargs={"obs_norm": "fixed"}`` to load its weights)."""
        for torso in (self.torso, self.critic_torso):
            if torso is not None:
                torso.fold_standardisation(obs)

    def update_obs_stats(self, obs: Any) -> None:
        """Merge a batch of observations into the normalisation statistics of every torso."""
        for torso in (self.torso, self.critic_torso):
            if torso is not None:
                torso.update_obs_stats(obs)

    def _init_head(self, head: nn.Module, gain: float) -> None:
        if self.ortho_init:
            orthogonal_init(head, gain)

    def _prepare(self, obs: Any) -> dict[str, torch.Tensor]:
        return self.torso.prepare(obs)

    def _value(self, prepared: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor | None:
        """Value ``[B, 1]`` from the prepared obs (separate critic) or the actor features (shared)."""
        if self.value_head is None:
            return None
        if self.critic_torso is not None:
            features = self.critic_torso(prepared)
        return self.value_head(features)

    def value(self, obs: Any) -> torch.Tensor:
        if self.value_head is None:
            raise RuntimeError(f"{type(self).__name__} was built with use_critic=False")
        prepared = self._prepare(obs)
        if self.critic_torso is not None:
            return self.value_head(self.critic_torso(prepared))
        return self.value_head(self.torso(prepared))

    @staticmethod
    def _obs_replay(prepared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return obs_to_replay(prepared)

    @staticmethod
    def _replay_obs(replay: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return obs_from_replay(replay)


def box_chunk_shape(action_space: spaces.Space) -> tuple[int, int]:
    """``(K, D)`` of a Box action space of shape ``(D,)`` (K = 1) or ``(K, D)``."""
    if not isinstance(action_space, spaces.Box) or len(action_space.shape) not in (1, 2):
        raise TypeError(f"expected a Box action space of shape (D,) or (K, D), got {action_space}")
    shape = action_space.shape
    return (1, int(shape[0])) if len(shape) == 1 else (int(shape[0]), int(shape[1]))


def box_bounds(action_space: spaces.Box) -> tuple[torch.Tensor, torch.Tensor]:
    """The Box's low / high as float32 tensors ``[K, D]``."""
    k, d = box_chunk_shape(action_space)
    low = torch.as_tensor(action_space.low, dtype=torch.float32).reshape(k, d)
    high = torch.as_tensor(action_space.high, dtype=torch.float32).reshape(k, d)
    return low, high
