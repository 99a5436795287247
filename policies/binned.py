"""OpenVLA-style policy: 256 action bins per element, sampled at a temperature, un-normalized
with q01/q99 statistics.

Tokens here are positions in OpenVLA's 256-wide action slice of the vocabulary: token ``j`` is
vocabulary id ``vocab_size - n_bins + j`` (31744 + j for LLaMA-2's 32000). The formulas are
OpenVLA's (Kim et al., 2024; ``ActionTokenizer`` in openvla's
``prismatic/vla/action_tokenizer.py`` and ``predict_action``'s un-normalization)::

    bins = linspace(-1, 1, n_bins);  centers = (bins[:-1] + bins[1:]) / 2        # n_bins - 1 centers
    token -> a_norm:  centers[clip(n_bins - 1 - j, 0, n_bins - 2)]              # j = 0 and 1 share a center
    a_norm -> token:  j = n_bins - digitize(clip(a_norm, -1, 1), bins)            # np.digitize
    unnormalize:      a = 0.5 * (a_norm + 1) * (q99 - q01 + 1e-8) + q01  where mask, else a_norm
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from .base import ActionChunk, PolicyEval, masked_chunk_mean
from .torso_policy import TorsoPolicy, box_bounds, box_chunk_shape


def bin_edges(n_bins: int = 256) -> torch.Tensor:
    """``linspace(-1, 1, n_bins)``: OpenVLA's bin edges (float32)."""
    return torch.linspace(-1.0, 1.0, n_bins)


def bin_centers(n_bins: int = 256) -> torch.Tensor:
    """The ``n_bins - 1`` midpoints of consecutive edges."""
    edges = bin_edges(n_bins)
    return (edges[:-1] + edges[1:]) / 2


def tokens_to_normalized(tokens: torch.Tensor, n_bins: int = 256) -> torch.Tensor:
    """Action-slice tokens ``j`` -> normalized actions in ``[-1, 1]`` (bin centers)."""
    centers = bin_centers(n_bins).to(tokens.device)
    return centers[(n_bins - 1 - tokens.long()).clamp(0, n_bins - 2)]


def normalized_to_tokens(a_norm: torch.Tensor, n_bins: int = 256) -> torch.Tensor:
    """Inverse used by OpenVLA's ActionTokenizer (SFT, tests); RL code stores tokens instead."""
    edges = bin_edges(n_bins).to(a_norm.device)
    # np.digitize(x, edges) == torch.bucketize(x, edges, right=True)
    return n_bins - torch.bucketize(a_norm.clamp(-1.0, 1.0), edges, right=True)


def unnormalize(
    a_norm: torch.Tensor,
    q01: torch.Tensor,
    q99: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps: float = 1e-8,
) -> torch.Tensor:
    """BOUNDS_Q99 un-normalization over the last dim; ``mask`` False dims pass through unchanged."""
    a = 0.5 * (a_norm + 1) * (q99 - q01 + eps) + q01
    return a if mask is None else torch.where(mask, a, a_norm)


def normalize(
    a: torch.Tensor, q01: torch.Tensor, q99: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """Inverse of ``unnormalize``: env actions -> ``[-1, 1]`` (clipped); ``mask`` False dims pass through."""
    a_norm = (2 * (a - q01) / (q99 - q01 + eps) - 1).clamp(-1.0, 1.0)
    return a_norm if mask is None else torch.where(mask, a_norm, a)


def top_k_mask(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep the ``top_k`` largest logits per row (ties with the k-th kept, as HF's TopKLogitsWarper);
    ``top_k`` broadcasts over the leading dims, 0 keeps everything. Removed entries get the float
    minimum rather than -inf so that stale samples give a finite (huge negative) log-prob."""
    sorted_logits = logits.sort(dim=-1, descending=True).values
    k = top_k.to(logits.device).long()
    kth = sorted_logits.gather(-1, (k - 1).clamp(min=0)[..., None].expand(*logits.shape[:-1], 1))
    remove = (logits < kth) & (k > 0)[..., None]
    return logits.masked_fill(remove, torch.finfo(logits.dtype).min)


def tempered_log_softmax(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor
) -> torch.Tensor:
    """``log_softmax(top_k(logits / T))`` over the last dim, with a temperature ``[B]`` and a top-k ``[B]``
    per sample (the first dim of ``logits``)."""
    lead = (-1,) + (1,) * (logits.ndim - 2)
    logits = logits / temperature.to(logits).reshape(*lead, 1)
    return torch.log_softmax(top_k_mask(logits, top_k.reshape(lead)), dim=-1)


class BinnedPolicy(TorsoPolicy):
    """Logits ``[B, K, D, n_bins]`` from the torso; tokens sampled from ``softmax(logits / T)``
    (after optional top-k); actions are the un-normalized bin centers; E = D.

    Args:
        observation_space: single-env observation space.
        action_space: Box of shape ``(D,)`` (K = 1) or ``(K, D)``.
        q01, q99: per-dimension action statistics ``[D]``; default: the Box's low / high, or
            -1 / 1 where those are infinite.
        mask: ``[D]`` booleans, False dims (e.g. a gripper) are not un-normalized; default all True.
        n_bins: action bins (OpenVLA: 256).
        temperature: sampling temperature (RLinf / SimpleVLA LIBERO GRPO: 1.6). Stored per sample
            in the replay; ``evaluate`` scores each sample at the temperature it was drawn at.
        top_k: keep only the k most likely tokens (0: all); stored in the replay like temperature.
        **torso_options (hidden_sizes, activation, share_torso, use_critic, ortho_init, torso_kwargs): see
            ``TorsoPolicy``.

    Replay: ``obs/<key>``, ``tokens`` int64 ``[B, K, D]`` (0..n_bins-1), ``temperature`` float32
    ``[B]`` and ``top_k`` int64 ``[B]``.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        q01: Sequence[float] | np.ndarray | None = None,
        q99: Sequence[float] | np.ndarray | None = None,
        mask: Sequence[bool] | np.ndarray | None = None,
        n_bins: int = 256,
        temperature: float = 1.0,
        top_k: int = 0,
        **torso_options: Any,
    ):
        super().__init__(observation_space, **torso_options)  # see TorsoPolicy for the options
        self.chunk_size, self.action_dim = box_chunk_shape(action_space)
        self.log_prob_dim = self.action_dim
        self.n_bins, self.temperature, self.top_k = n_bins, float(temperature), int(top_k)
        low, high = box_bounds(action_space)
        low = torch.where(torch.isfinite(low[0]), low[0], -1.0)
        high = torch.where(torch.isfinite(high[0]), high[0], 1.0)
        d = self.action_dim
        self.register_buffer(
            "q01", low if q01 is None else torch.as_tensor(q01, dtype=torch.float32).reshape(d)
        )
        self.register_buffer(
            "q99", high if q99 is None else torch.as_tensor(q99, dtype=torch.float32).reshape(d)
        )
        mask_t = torch.ones(d, dtype=torch.bool) if mask is None else torch.as_tensor(mask).bool().reshape(d)
        self.register_buffer("mask", mask_t)
        self.logits_head = nn.Linear(self.torso.out_dim, self.chunk_size * d * n_bins)
        self._init_head(self.logits_head, 0.01)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Raw logits ``[B, K, D, n_bins]``."""
        return self.logits_head(features).reshape(-1, self.chunk_size, self.action_dim, self.n_bins)

    def tokens_to_actions(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens ``[..., D]`` -> env actions (bin centers, un-normalized)."""
        return unnormalize(tokens_to_normalized(tokens, self.n_bins), self.q01, self.q99, self.mask)

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        features = self.torso(prepared)
        logits = self.logits(features)
        b = logits.shape[0]
        temperature = torch.full((b,), self.temperature, device=logits.device)
        top_k = torch.full((b,), self.top_k, dtype=torch.long, device=logits.device)
        if deterministic:
            tokens, log_probs = logits.argmax(-1), None
        else:
            logp = tempered_log_softmax(logits, temperature, top_k)
            probs = logp.exp().reshape(-1, self.n_bins)
            tokens = torch.multinomial(probs, 1, generator=self._rng(probs.device)).reshape(logp.shape[:-1])
            log_probs = logp.gather(-1, tokens[..., None])[..., 0]
        replay = {**self._obs_replay(prepared), "tokens": tokens, "temperature": temperature, "top_k": top_k}
        return ActionChunk(self.tokens_to_actions(tokens), log_probs, self._value(prepared, features), replay)

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        """Log-probs and entropy of the tempered (top-k restricted) distribution of each sample."""
        prepared = self._prepare(self._replay_obs(replay))
        features = self.torso(prepared)
        logits = self.logits(features)
        logp = tempered_log_softmax(logits, replay["temperature"], replay["top_k"].to(logits.device))
        tokens = replay["tokens"].to(logits.device).long()
        log_probs = logp.gather(-1, tokens[..., None])[..., 0]
        entropy = -(logp.exp() * logp).sum(-1)
        return PolicyEval(log_probs, entropy, self._value(prepared, features))

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-entropy of the demonstrated actions' tokens (OpenVLA's SFT loss), temperature 1."""
        logits = self.logits(self.torso(self._prepare(obs)))
        a_norm = normalize(actions.to(logits), self.q01, self.q99, self.mask)
        tokens = normalized_to_tokens(a_norm, self.n_bins)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None])[..., 0]
        return masked_chunk_mean(-logp.sum(-1), mask)
