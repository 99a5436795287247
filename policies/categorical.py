"""Categorical policy over Discrete or MultiDiscrete action spaces.

Defaults reproduce Stable-Baselines3's ``MlpPolicy`` for a Discrete space (CartPole): separate
64-64 tanh actor and critic MLPs, orthogonal init with 0.01 on the logits head.

Actions are returned as float32 ``[B, K, D]`` holding the chosen value (index + the space's
``start``), so that every policy returns the same type; the trainer / env adapter converts them to
int (and, for a Discrete space, drops the trailing ``[1, 1]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from nets.errors import BadInput

from .base import ActionChunk, PolicyEval, masked_chunk_mean
from .torso_policy import TorsoPolicy


class CategoricalPolicy(TorsoPolicy):
    """One categorical choice per action element; E = D.

    Args:
        observation_space: single-env observation space.
        action_space: ``Discrete(n)`` (K = D = E = 1), ``MultiDiscrete`` of shape ``(D,)`` (K = 1)
            or ``(K, D)`` (a chunk). Dimensions with fewer choices than the largest are masked.
        **torso_options (hidden_sizes, activation, share_torso, use_critic, ortho_init, torso_kwargs): see
            ``TorsoPolicy``.

    Replay: ``obs/<key>`` and ``tokens`` int64 ``[B, K, D]`` (chosen index, without ``start``).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Discrete | spaces.MultiDiscrete,
        **torso_options: Any,
    ):
        super().__init__(observation_space, **torso_options)  # see TorsoPolicy for the options
        if isinstance(action_space, spaces.Discrete):
            nvec = np.array([[int(action_space.n)]])
            start = np.array([[int(action_space.start)]])
        elif isinstance(action_space, spaces.MultiDiscrete) and action_space.nvec.ndim in (1, 2):
            nvec = action_space.nvec.reshape(-1, action_space.nvec.shape[-1])
            start = np.broadcast_to(action_space.start, action_space.nvec.shape).reshape(nvec.shape).copy()
        else:
            raise TypeError(f"expected Discrete or MultiDiscrete of rank 1 or 2, got {action_space}")
        self.chunk_size, self.action_dim = nvec.shape
        self.log_prob_dim = self.action_dim
        self.num_choices = int(nvec.max())
        valid = torch.arange(self.num_choices) < torch.as_tensor(nvec)[..., None]
        self.register_buffer("valid", valid)  # [K, D, n]
        self.register_buffer("start", torch.as_tensor(start, dtype=torch.float32))  # [K, D]
        self.logits_head = nn.Linear(self.torso.out_dim, self.chunk_size * self.action_dim * self.num_choices)
        self._init_head(self.logits_head, 0.01)

    def _log_softmax(self, features: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[B, K, D, n]`` (invalid choices at the float minimum)."""
        logits = self.logits_head(features).reshape(-1, self.chunk_size, self.action_dim, self.num_choices)
        logits = logits.masked_fill(~self.valid, torch.finfo(logits.dtype).min)
        return torch.log_softmax(logits, dim=-1)

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        features = self.torso(prepared)
        logp = self._log_softmax(features)
        if deterministic:
            tokens = logp.argmax(-1)
        else:
            probs = logp.exp().reshape(-1, self.num_choices)
            tokens = torch.multinomial(probs, 1, generator=self._rng(probs.device)).reshape(logp.shape[:-1])
        log_probs = None if deterministic else logp.gather(-1, tokens[..., None])[..., 0]
        actions = tokens.float() + self.start
        replay = {**self._obs_replay(prepared), "tokens": tokens}
        return ActionChunk(actions, log_probs, self._value(prepared, features), replay)

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        prepared = self._prepare(self._replay_obs(replay))
        features = self.torso(prepared)
        logp = self._log_softmax(features)
        tokens = replay["tokens"].to(logp.device).long()
        log_probs = logp.gather(-1, tokens[..., None])[..., 0]
        entropy = -torch.where(self.valid, logp.exp() * logp, 0.0).sum(-1)
        return PolicyEval(log_probs, entropy, self._value(prepared, features))

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-entropy of the demonstrated choices (actions hold the chosen values, as ``act`` returns)."""
        logp = self._log_softmax(self.torso(self._prepare(obs)))
        tokens = (actions.to(logp).reshape(-1, self.chunk_size, self.action_dim) - self.start).round().long()
        if bool(((tokens < 0) | (tokens >= self.valid.sum(-1))).any()):
            raise BadInput(f"{type(self).__name__}: demonstrated actions outside the action space")
        return masked_chunk_mean(-logp.gather(-1, tokens[..., None])[..., 0].sum(-1), mask)
