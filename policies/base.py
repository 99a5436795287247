"""The action-chunk policy contract shared by small policies, VLAs and the trainers.

One ``act`` call returns one chunk of K env actions per batch element. Log-probabilities are
returned per element (``[B, K, E]``: E = D Gaussian coordinates or tokens, E = 1 for one
categorical choice) so that a trainer can form token-, step- or chunk-level ratios. Env actions
cannot always be turned back into what was sampled (OpenVLA tokens, pi0's denoising chain, a
pre-tanh Gaussian sample), so ``act`` also returns an opaque ``replay`` record from which
``evaluate`` recomputes log-probs, entropy and value under the current weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class ActionChunk:
    """One chunk of actions for a batch.

    Attributes:
        actions: float32 ``[B, K, D]`` in env units.
        log_probs: element log-probs ``[B, K, E]`` of what was sampled (None when deterministic).
        value: state value ``[B, Kv]`` (Kv = 1 or K), or None for policies without a critic.
        replay: tensors with leading dim B that ``evaluate`` needs; the trainer stores them.
    """

    actions: torch.Tensor
    log_probs: torch.Tensor | None = None
    value: torch.Tensor | None = None
    replay: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class PolicyEval:
    """What ``evaluate`` returns: log-probs ``[B, K, E]``, entropy ``[B, K, E]`` (or None), value ``[B, Kv]``
    (or None)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None
    value: torch.Tensor | None


class ActionChunkPolicy(nn.Module):
    """Base class of every policy. Subclasses set the sizes and implement the three methods."""

    chunk_size: int  # K
    action_dim: int  # D
    log_prob_dim: int  # E
    # Sampling draws from this generator when set (``seed``), else from torch's global RNG.
    generator: torch.Generator | None = None
    # True when the constructor loads the frozen parameters itself (pretrained VLAs): trainer
    # checkpoints then store only the trainable ones (``trainers.checkpoint.policy_state``).
    rebuilds_frozen_weights: bool = False

    def seed(self, seed: int) -> None:
        """Give this policy its own seeded ``torch.Generator`` for sampling (on the policy's device).

        Checkpoint ``policy.generator.get_state()`` to resume sampling exactly.
        """
        self.generator = torch.Generator(device=self._param_device()).manual_seed(seed)

    def _rng(self, device: torch.device) -> torch.Generator | None:
        """The generator to sample on ``device`` with (None: global RNG). After a move to another
        device, sampling continues on a generator for that device seeded from the old one."""
        g = self.generator
        if g is not None and g.device != torch.device(device):
            seed = int(torch.randint(0, 2**62, (1,), generator=g, device=g.device))
            g = self.generator = torch.Generator(device=device).manual_seed(seed)
        return g

    def _param_device(self) -> torch.device:
        for tensor in self.parameters():
            return tensor.device
        for tensor in self.buffers():
            return tensor.device
        return torch.device("cpu")

    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        """Sample (or, if ``deterministic``, pick the mode of) one chunk for each observation."""
        raise NotImplementedError

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        """Recompute log-probs, entropy and value of recorded samples under the current weights."""
        raise NotImplementedError

    def value(self, obs: Any) -> torch.Tensor:
        """State value ``[B, Kv]`` (used to bootstrap truncated episodes)."""
        raise NotImplementedError

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Behaviour-cloning loss of demonstrated chunks ``actions`` ``[B, K, D]`` (env units), summed
        over D and averaged over the sub-steps where ``mask`` ``[B, K]`` is True. Lower is better."""
        raise NotImplementedError(f"{type(self).__name__} has no behaviour-cloning loss")


def masked_chunk_mean(loss: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of a per-sub-step loss ``[B, K]`` over the True entries of ``mask`` ``[B, K]`` (all if None)."""
    if mask is None:
        return loss.mean()
    mask = mask.to(loss.device, loss.dtype)
    return (loss * mask).sum() / mask.sum().clamp_min(1.0)
