"""Diagonal Gaussian policy over a Box action space, with optional tanh squashing.

Defaults reproduce Stable-Baselines3's ``MlpPolicy`` for K = 1 on vector observations: separate
64-64 tanh actor and critic MLPs, orthogonal init (sqrt(2) hidden, 0.01 mean head, 1.0 value head),
state-independent ``log_std`` initialised to 0, actions sampled and returned unclipped (the env
or the trainer clips them to the Box).

Noise inside a chunk is independent per sub-step by default. ``noise_correlation = rho`` makes it
an AR(1) process over the K sub-steps (one per action dimension): ``eta_0 ~ N(0, 1)``,
``eta_k = rho eta_{k-1} + sqrt(1 - rho^2) xi_k``, ``u_k = mean_k + std_k eta_k``. Each sub-step is
still N(mean_k, std_k^2) on its own, but the chunk drifts coherently instead of jittering; rho near
1 is one noise sample per chunk. Element log-probs are the conditionals ``log p(u_k | u_{k-1})``,
so summing them over any executed prefix of the chunk gives its exact joint log-probability.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from nets.errors import BadInput

from .base import ActionChunk, PolicyEval, masked_chunk_mean
from .torso_policy import TorsoPolicy, box_bounds, box_chunk_shape

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
BC_EDGE = 1e-3  # squashed BC: demonstrated actions are pulled this far inside the bounds (finite atanh)
# Stable-Baselines3's SAC actor: 256-256 ReLU, no orthogonal init, a state-dependent log-std head
# clamped to [-20, 2], tanh squashing (what SAC's trainer and DSRL's noise actor build by default)
SAC_ACTOR: dict[str, Any] = {
    "squash": True,
    "state_dependent_std": True,
    "log_std_bounds": (-20.0, 2.0),
    "hidden_sizes": (256, 256),
    "activation": "relu",
    "ortho_init": False,
}


# squashed: a sampled element whose tanh slope is below this (|u| > 2.64, the action within 1% of a
# bound) is not charged to the on-policy gradient (``act``/``evaluate`` give it log-prob 0): its
# noise barely moves the action, yet its log-prob term would pull the mean at full size
SATURATED_SLOPE = 0.02


class _InwardClamp(torch.autograd.Function):
    """``x.clamp(low, high)`` whose gradient also passes outside the range when a descent step
    moves ``x`` back toward it (plain ``clamp`` passes none there, so a value past a bound could
    never return)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, low: float, high: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (x,) = ctx.saved_tensors
        inside = (x >= ctx.low) & (x <= ctx.high)
        inward = ((x > ctx.high) & (grad > 0)) | ((x < ctx.low) & (grad < 0))
        return grad * (inside | inward), None, None


def clamp_inward(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``x`` clamped to ``[low, high]``; the gradient passes inside, and outside toward the range."""
    return _InwardClamp.apply(x, low, high)


def tanh_log_abs_det(u: torch.Tensor) -> torch.Tensor:
    """``log(1 - tanh(u)^2)`` computed stably as ``2 (log 2 - u - softplus(-2u))``."""
    return 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))


class GaussianPolicy(TorsoPolicy):
    """``a ~ N(mean(obs), diag(exp(log_std)^2))`` per element of a ``[K, D]`` chunk; E = D.

    Args:
        observation_space: single-env observation space.
        action_space: Box of shape ``(D,)`` (K = 1) or ``(K, D)``.
        log_std_init: initial value of the state-independent ``log_std`` parameter ``[K*D]``.
        log_std_bounds: ``(low, high)``: the ``log_std`` used is clamped to this range (None: not
            clamped). RL from a behaviour-cloned policy needs it: BC fits a tiny std to dimensions
            the demonstrations hold still, so every small step of the mean makes the probability
            ratio explode there, while dimensions BC fits badly get a std so wide that sampled
            rollouts fail. The clamp passes the gradient that moves a clamped value back inside
            (``clamp_inward``), so a clone's std above the bound can still shrink.
        squash: ``a = center + scale * tanh(u)`` maps the Gaussian sample ``u`` into the Box
            (finite bounds needed); log-probs include the Jacobian. Without it actions are the
            raw samples, not clipped.
        noise_correlation: ``rho`` in [0, 1): correlation of the noise of consecutive sub-steps
            of a chunk (module docstring); 0 is independent noise.
        noise_dims: the action dimensions that are sampled (default all); the others always take
            their mean and carry no log-prob (E = ``len(noise_dims)``). RL from a clone: the
            dimensions the demonstrations hold still (LIBERO-Spatial's rotations, std ~0.007)
            need no exploration, and their tiny stds would dominate the policy gradient (~1/std).
        state_dependent_std: ``log_std`` is a linear head on the torso's features (SB3's SAC
            actor) instead of one parameter; ``log_std_init`` is then the head's initial bias.
        saturated_slope: squashed only: sampled elements where ``1 - tanh(u)^2`` is below this get
            log-prob 0 from ``act`` and ``evaluate`` (``SATURATED_SLOPE``; 0 charges every element).
            ``rsample`` and ``imitation_loss`` always use the full density.
        **torso_options (hidden_sizes, activation, share_torso, use_critic, ortho_init, torso_kwargs): see
            ``TorsoPolicy``.

    Replay: ``obs/<key>`` (prepared observation) and ``raw_action`` ``[B, K, D]`` (the Gaussian
    sample ``u``, before any squashing).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        log_std_init: float = 0.0,
        log_std_bounds: tuple[float, float] | None = None,
        squash: bool = False,
        noise_correlation: float = 0.0,
        noise_dims: Sequence[int] | None = None,
        state_dependent_std: bool = False,
        saturated_slope: float = SATURATED_SLOPE,
        **torso_options: Any,
    ):
        super().__init__(observation_space, **torso_options)  # see TorsoPolicy for the options
        self.chunk_size, self.action_dim = box_chunk_shape(action_space)
        dims = list(range(self.action_dim)) if noise_dims is None else [int(d) for d in noise_dims]
        if not dims or len(set(dims)) != len(dims) or not all(0 <= d < self.action_dim for d in dims):
            raise BadInput(
                f"noise_dims must be distinct action dimensions in [0, {self.action_dim}), got {noise_dims}"
            )
        self.noise_dims = sorted(dims)
        self.log_prob_dim = len(self.noise_dims)
        mask = torch.zeros(self.action_dim)
        mask[self.noise_dims] = 1.0
        self.register_buffer("_noise_mask", mask, persistent=False)
        n = self.chunk_size * self.action_dim
        self.mean_head = nn.Linear(self.torso.out_dim, n)
        self._init_head(self.mean_head, 0.01)
        self.log_std_head: nn.Linear | None = None
        if state_dependent_std:
            self.log_std_head = nn.Linear(self.torso.out_dim, n)
            nn.init.constant_(self.log_std_head.bias, float(log_std_init))
        else:
            self.log_std = nn.Parameter(torch.full((n,), float(log_std_init)))
        if log_std_bounds is not None:
            lo, hi = (float(b) for b in log_std_bounds)
            if not lo <= hi:
                raise BadInput(f"log_std_bounds must be (low, high) with low <= high, got {log_std_bounds}")
            log_std_bounds = (lo, hi)
        self.log_std_bounds = log_std_bounds
        if not 0.0 <= float(noise_correlation) < 1.0:
            raise BadInput(f"noise_correlation must be in [0, 1), got {noise_correlation}")
        self.noise_correlation = float(noise_correlation)
        if not 0.0 <= float(saturated_slope) < 1.0:
            raise BadInput(f"saturated_slope must be in [0, 1), got {saturated_slope}")
        self.saturated_slope = float(saturated_slope)
        self.squash = squash
        low, high = box_bounds(action_space)
        if squash and not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise BadInput("squash=True needs finite action bounds")
        self.register_buffer("action_center", (high + low) / 2 if squash else torch.zeros_like(low))
        self.register_buffer("action_scale", (high - low) / 2 if squash else torch.ones_like(low))

    def _mean_log_std(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``[B, K, D]`` and log-std broadcast to it."""
        shape = (features.shape[0], self.chunk_size, self.action_dim)
        mean = self.mean_head(features).reshape(shape)
        if self.log_std_head is not None:
            log_std = self.log_std_head(features).reshape(shape)
        else:
            log_std = self.log_std.reshape(shape[1:]).expand(shape)
        if self.log_std_bounds is not None:
            log_std = clamp_inward(log_std, *self.log_std_bounds)
        return mean, log_std

    def _log_prob(self, u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        """``log p(u_k | u_{k-1})`` per element (written out: no torch.distributions object per call;
        with independent noise that is ``log N(u; mean, exp(log_std)^2)``), plus the tanh Jacobian
        term when squashed."""
        z = (u - mean) * torch.exp(-log_std)
        log_prob = -0.5 * z * z - log_std - HALF_LOG_2PI
        rho = self.noise_correlation
        if rho > 0 and z.shape[1] > 1:  # AR(1) conditionals for sub-steps 1..K-1
            innovation = (z[:, 1:] - rho * z[:, :-1]) / math.sqrt(1.0 - rho * rho)
            later = -0.5 * innovation * innovation - 0.5 * math.log(1.0 - rho * rho)
            log_prob = torch.cat([log_prob[:, :1], later - log_std[:, 1:] - HALF_LOG_2PI], dim=1)
        if self.squash:  # density of a = center + scale * tanh(u)
            log_prob = log_prob - tanh_log_abs_det(u) - self.action_scale.log()
        return log_prob

    def _noise(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """Standard normal noise ``[B, K, D]``, AR(1)-correlated over K when ``noise_correlation``."""
        noise = torch.randn(shape, generator=self._rng(device), device=device)
        rho = self.noise_correlation
        if rho > 0:
            scale = math.sqrt(1.0 - rho * rho)
            steps = [noise[:, 0]]
            for k in range(1, shape[1]):
                steps.append(rho * steps[-1] + scale * noise[:, k])
            noise = torch.stack(steps, dim=1)
        return noise

    def _entropy(self, log_std: torch.Tensor) -> torch.Tensor | None:
        """Per-element entropy of the conditionals, or None when squashed (no closed form)."""
        if self.squash:
            return None
        entropy = (0.5 + HALF_LOG_2PI) + log_std
        rho = self.noise_correlation
        if rho > 0 and entropy.shape[1] > 1:
            later = entropy[:, 1:] + 0.5 * math.log(1.0 - rho * rho)
            entropy = torch.cat([entropy[:, :1], later], dim=1)
        return entropy

    def _sample(self, mean: torch.Tensor, log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A pre-squash sample ``u`` (the mean on dimensions outside ``noise_dims``) and its
        log-probs ``[B, K, E]``."""
        noise = self._noise(mean.shape, mean.device)
        if self.log_prob_dim < self.action_dim:
            noise = noise * self._noise_mask
        u = mean + log_std.exp() * noise
        return u, self._explored(self._log_prob(u, mean, log_std))

    def _explored(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """Per-element values ``[B, K, D]`` -> the sampled dimensions ``[B, K, E]``."""
        if x is None or self.log_prob_dim == self.action_dim:
            return x
        return x[..., self.noise_dims]

    def _charged(self, log_probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """On-policy log-probs ``[B, K, E]`` with the saturated squashed elements set to 0."""
        if not self.squash or self.saturated_slope <= 0:
            return log_probs
        slope = 1.0 - torch.tanh(u) ** 2
        return log_probs * self._explored(slope >= self.saturated_slope)

    def _to_action(self, u: torch.Tensor) -> torch.Tensor:
        return self.action_center + self.action_scale * torch.tanh(u) if self.squash else u

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        features = self.torso(prepared)
        mean, log_std = self._mean_log_std(features)
        u, log_probs = (mean, None) if deterministic else self._sample(mean, log_std)
        if log_probs is not None:
            log_probs = self._charged(log_probs, u)
        replay = {**self._obs_replay(prepared), "raw_action": u}
        return ActionChunk(self._to_action(u), log_probs, self._value(prepared, features), replay)

    def rsample(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparametrised sample (gradients flow into the weights, as SAC's actor loss needs):
        actions ``[B, K, D]`` in env units and their log-probs ``[B, K, E]``. Squashed, the
        log-probs are of the action in units of the Box's half-width (SB3's convention: the
        entropy target then does not depend on the bounds)."""
        mean, log_std = self._mean_log_std(self.torso(self._prepare(obs)))
        u, log_probs = self._sample(mean, log_std)
        if self.squash:
            log_probs = log_probs + self._explored(self.action_scale.log().expand_as(u))
        return self._to_action(u), log_probs

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        """Entropy is the Gaussian's ``[B, K, D]``, or None when squashed (no closed form; SB3
        then uses ``-log_prob`` as the estimate)."""
        prepared = self._prepare(self._replay_obs(replay))
        features = self.torso(prepared)
        mean, log_std = self._replayed_mean_log_std(replay, features)
        u = replay["raw_action"].to(features.device)
        log_probs = self._charged(self._explored(self._log_prob(u, mean, log_std)), u)
        return PolicyEval(log_probs, self._explored(self._entropy(log_std)), self._value(prepared, features))

    def _replayed_mean_log_std(
        self, replay: dict[str, torch.Tensor], features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and log-std a stored step is scored under (a subclass may use the replay)."""
        return self._mean_log_std(features)

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Negative log-likelihood of the demonstrated actions (mean and ``log_std`` both learn).
        Squashed: of their pre-tanh values, actions at a bound scored ``BC_EDGE`` inside it."""
        mean, log_std = self._mean_log_std(self.torso(self._prepare(obs)))
        a = actions.to(mean)
        if self.squash:
            y = ((a - self.action_center) / self.action_scale).clamp(-1 + BC_EDGE, 1 - BC_EDGE)
            a = torch.atanh(y)
        return masked_chunk_mean(-self._log_prob(a, mean, log_std).sum(-1), mask)
