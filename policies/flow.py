"""pi0-like flow-matching policy with stochastic denoising steps: pi0's flow matching (Black et al.,
2024), sampled with the SDE of Flow-GRPO (Liu et al., 2025), coefficients-preserving sampling (CPS,
Wang et al., 2025) or a learned noise head (RLinf's pi0 RL, 2025).

Time runs from t = 1 (noise) to t = 0 (action) on the grid ``t_i = linspace(1, 1/N, N)``, then
``t_N = 0``; ``Delta = 1/N``. A velocity MLP ``v(x_t, t, obs)`` gives
``x0_hat = x - t v`` and ``x1_hat = x + (1 - t) v``, and step i is the Gaussian transition
``x_{i+1} ~ N(mu_i, std_i^2)`` with ``t' = t_i - Delta`` and noise level ``a``:

* ``flow_ode``: ``mu = (1-t') x0_hat + t' x1_hat`` (= ``x - Delta v``), ``std = 0``;
* ``flow_sde``: ``mu = (1-t') x0_hat + (t' - s^2 Delta / (2t)) x1_hat``, ``std = sqrt(Delta) s`` with
  ``s = a sqrt(t_i / (1 - t_i))`` (at ``t_0 = 1`` the denominator uses ``t_1``);
* ``flow_cps``: ``mu = (1-t') x0_hat + t' cos(pi a / 2) x1_hat``, ``std = t' sin(pi a / 2)``;
* ``flow_noise``: the ODE mean, ``std`` from a learned head whose log-variance is squashed into
  ``[log s_min^2, log s_max^2]``.

The chain ``x_0 ~ N(0, I), x_1, ..., x_N`` is the sampled decision: the replay stores it, and
``evaluate`` recomputes ``mu, std`` of the stochastic step(s) under the current weights and scores
the stored next element. Without ``joint_logprob`` one step index k (uniform over the N steps, or
the first N-1 with ``ignore_last``) per ``act`` call, shared by the batch, uses the noise method
and all others are ODE steps; with it every step is stochastic and the element log-prob is the
mean of the N + 1 terms ``log N(x_0; 0, I), l_0, ..., l_{N-1}``. The Gaussian log-density is 0
wherever ``std == 0`` (e.g. the last CPS step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from nets.errors import BadInput

from .base import ActionChunk, PolicyEval, masked_chunk_mean
from .torso_policy import TorsoPolicy, box_bounds, box_chunk_shape
from .torsos import mlp

NOISE_METHODS = ("flow_ode", "flow_sde", "flow_cps", "flow_noise")
OUTCOMES = {"none": 0, "success": 1, "failure": 2}
"""Labels of an outcome-conditioned flow policy's ``outcome`` input (0: unconditional)."""


@dataclass(frozen=True)
class FlowSampling:
    """How a flow policy samples its denoising chain: the options ``FlowPolicy`` (``flow``) and
    ``Pi05Policy`` (``pi05``) share. Each field is also accepted as a keyword of those policies
    (``--policy-kwargs '{"num_steps": 4, "noise_level": 0.3}'``), or all together as
    ``sampling={...}``; the policy's own default wins for a field given neither way (pi0.5:
    ``num_steps=10``)."""

    num_steps: int = 5
    """Denoising steps N: network calls per action chunk."""
    noise_method: str = "flow_sde"
    """``flow_ode`` (no exploration: log-probs are 0), ``flow_sde``, ``flow_cps`` or ``flow_noise``
    (a learned std head); see the module docstring for each step's mean and std."""
    noise_level: float = 0.5
    """``a`` of flow_sde / flow_cps. A policy's ``noise_level`` attribute may be changed (annealed)
    between calls: the replay keeps each sample's value and ``evaluate`` uses that one."""
    joint_logprob: bool = False
    """Every step stochastic; the log-prob is averaged over the N + 1 chain terms (meant for
    flow_noise). False: one random step per call is stochastic, the others are ODE steps."""
    ignore_last: bool = False
    """Draw the single stochastic step from the first N - 1 only (use with flow_cps, whose last step
    has std 0); unused with ``joint_logprob``."""
    noise_std_range: tuple[float, float] = (0.08, 0.16)
    """``(s_min, s_max)`` of the flow_noise head's std (RLinf: 0.08, 0.16)."""

    def __post_init__(self):
        if self.noise_method not in NOISE_METHODS:
            raise BadInput(f"noise_method must be one of {NOISE_METHODS}, got {self.noise_method!r}")
        if self.ignore_last and self.num_steps < 2 and not self.joint_logprob:
            raise BadInput("ignore_last needs num_steps >= 2")

    @classmethod
    def from_options(
        cls, sampling: FlowSampling | Mapping[str, Any] | None, options: dict[str, Any], **defaults: Any
    ) -> FlowSampling:
        """The sampling of a policy built with ``sampling=`` (a ``FlowSampling`` or a dict of some of
        its fields) or with the fields as keywords: those are taken out of ``options`` (the rest stay
        there); ``defaults`` are the policy's own defaults. A field given both ways is an error."""
        names = [f.name for f in fields(cls)]
        flat = {name: options.pop(name) for name in names if name in options}
        if isinstance(sampling, FlowSampling):
            if flat:
                raise BadInput(f"{sorted(flat)} given as keywords beside a FlowSampling: put them in it")
            return sampling
        sampling = dict(sampling or {})
        unknown = sorted(set(sampling) - set(names))
        if unknown:
            raise BadInput(f"sampling: unknown keys {unknown}; FlowSampling's fields are {names}")
        both = sorted(set(sampling) & set(flat))
        if both:
            raise BadInput(f"{both} given both in sampling= and as keywords: give each once")
        return cls(**{**defaults, **sampling, **flat})

    def attach(self, module: nn.Module) -> None:
        """Give ``module`` the sampler's attributes (``num_steps``, ``noise_method``, ``noise_level``,
        ``joint_logprob``, ``ignore_last``) and the time grid buffers ``timesteps`` / ``sigma_ratios``."""
        module.num_steps, module.noise_method = self.num_steps, self.noise_method
        module.noise_level = float(self.noise_level)
        module.joint_logprob, module.ignore_last = self.joint_logprob, self.ignore_last
        module.register_buffer("timesteps", flow_timesteps(self.num_steps))
        module.register_buffer("sigma_ratios", sde_sigma_ratios(self.num_steps))

    def attach_noise_bounds(self, module: nn.Module) -> None:
        """With flow_noise: the buffers ``logvar_min`` / ``logvar_max`` of the learned std's range."""
        s_min, s_max = self.noise_std_range
        module.register_buffer("logvar_min", torch.tensor(math.log(s_min**2)))
        module.register_buffer("logvar_max", torch.tensor(math.log(s_max**2)))


def flow_timesteps(num_steps: int) -> torch.Tensor:
    """``[1, ..., 1/N, 0]`` (N + 1 values)."""
    return torch.cat([torch.linspace(1.0, 1.0 / num_steps, num_steps), torch.zeros(1)])


def sde_sigma_ratios(num_steps: int) -> torch.Tensor:
    """``sqrt(t_i / (1 - t_i))`` for i < N, using ``t_1`` instead of ``t_0 = 1`` in the denominator;
    ``flow_sde``'s ``sigma_i`` is the noise level times this."""
    t = flow_timesteps(num_steps)
    denom = torch.where(t == 1, t[1], t)
    return torch.sqrt(t / (1 - denom))[:-1]


def flow_mean_std(
    x: torch.Tensor,
    v: torch.Tensor,
    t: torch.Tensor,
    delta: torch.Tensor,
    method: str,
    noise_level: torch.Tensor | float = 0.5,
    sigma: torch.Tensor | float | None = None,
    learned_std: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std (both shaped like ``x``) of one denoising transition from time ``t`` to
    ``t - delta``. ``t``, ``delta``, ``noise_level`` and ``sigma`` (flow_sde's ``sigma_i``) broadcast
    against ``x``; ``learned_std`` is the flow_noise head's output."""
    t, delta = torch.as_tensor(t).to(x), torch.as_tensor(delta).to(x)
    x0_hat, x1_hat = x - t * v, x + (1 - t) * v
    t_next = t - delta
    w0, w1 = 1 - t_next, t_next
    if method == "flow_ode":
        std = torch.zeros_like(x)
    elif method == "flow_sde":
        sigma = torch.as_tensor(sigma).to(x)
        w1 = t_next - sigma**2 * delta / (2 * t)
        std = torch.sqrt(delta) * sigma
    elif method == "flow_cps":
        angle = math.pi * torch.as_tensor(noise_level).to(x) / 2
        w1 = t_next * torch.cos(angle)
        std = t_next * torch.sin(angle)
    elif method == "flow_noise":
        std = learned_std
    else:
        raise BadInput(f"unknown noise method {method!r}; expected one of {NOISE_METHODS}")
    return x0_hat * w0 + x1_hat * w1, torch.broadcast_to(std, x.shape)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise ``log N(x; mean, std^2)``, 0 where ``std == 0``."""
    zero = std == 0
    safe = torch.where(zero, torch.ones_like(std), std)
    log_prob = -torch.log(safe) - 0.5 * math.log(2 * math.pi) - 0.5 * ((x - mean) / safe) ** 2
    return torch.where(zero, torch.zeros_like(log_prob), log_prob)


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Elementwise ``0.5 log(2 pi e std^2)``, 0 where ``std == 0``."""
    zero = std == 0
    safe = torch.where(zero, torch.ones_like(std), std)
    return torch.where(zero, torch.zeros_like(std), 0.5 * torch.log(2 * math.pi * math.e * safe**2))


def time_embedding(
    t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0
) -> torch.Tensor:
    """Sinusoidal embedding ``[B, dim]`` (float32) of times ``t`` ``[B]``: ``[sin, cos]`` of
    ``t * 2 pi / period``, periods geometric in ``[min_period, max_period]``, in float64 (as pi0.5)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = t[:, None].double() * (2 * math.pi / period)
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).float()


def squashed_std(raw: torch.Tensor, logvar_min: torch.Tensor, logvar_max: torch.Tensor) -> torch.Tensor:
    """flow_noise's std from a head output: ``exp(logvar / 2)`` with ``logvar`` squashed by tanh into
    ``[logvar_min, logvar_max]`` (RLinf's ExploreNoiseNet)."""
    o = torch.tanh(raw)
    return torch.exp(0.5 * (logvar_min + (logvar_max - logvar_min) * (o + 1) / 2))


Transition = Callable[[torch.Tensor, int | torch.Tensor, str], tuple[torch.Tensor, torch.Tensor]]


def denoise_indices(
    num_steps: int,
    deterministic: bool,
    joint_logprob: bool,
    ignore_last: bool,
    generator: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:
    """Which steps are stochastic, ``[N]`` int64: all -1 (deterministic), ``0..N-1`` (joint), or one
    uniformly drawn k repeated (k < N - 1 with ``ignore_last``)."""
    if deterministic:
        return torch.full((num_steps,), -1, dtype=torch.long)
    if joint_logprob:
        return torch.arange(num_steps)
    high = num_steps - 1 if ignore_last else num_steps
    k = int(torch.randint(0, high, (1,), generator=generator, device=device))
    return torch.full((num_steps,), k, dtype=torch.long)


def sample_chain(
    x: torch.Tensor,
    inds: torch.Tensor,
    transition: Transition,
    noise_method: str,
    joint_logprob: bool,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the N denoising steps from the initial noise ``x``: step i uses ``noise_method`` if
    ``inds`` says it is stochastic, else the ODE mean. ``transition(x, i, method)`` gives the step's
    mean and std. Returns the chain ``[B, N+1, ...]`` and the element log-probs (None if no step was
    stochastic): the mean over the stochastic terms, with ``log N(x_0; 0, I)`` first when
    ``joint_logprob`` (and the call is not deterministic)."""
    joint = joint_logprob and bool((inds >= 0).all())
    terms = [gaussian_log_prob(x, torch.zeros_like(x), torch.ones_like(x))] if joint else []
    chain = [x]
    for i in range(len(inds)):
        stochastic = int(inds[i]) == i
        mean, std = transition(x, i, noise_method if stochastic else "flow_ode")
        if stochastic:
            x = mean + std * torch.randn(x.shape, generator=generator, device=x.device)
            terms.append(gaussian_log_prob(x, mean, std))
        else:
            x = mean
        chain.append(x)
    log_probs = torch.stack(terms, dim=1).mean(dim=1) if terms else None
    return torch.stack(chain, dim=1), log_probs


def score_chain(
    chains: torch.Tensor, inds: torch.Tensor, transition: Transition, noise_method: str, joint_logprob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute the element log-probs of a stored chain ``[B, N+1, ...]`` (and the matching Gaussian
    entropies) at its stochastic steps ``inds`` ``[B, N]``; ``transition(x, idx [B], method)``."""
    if bool((inds < 0).any()):
        raise BadInput("replay comes from a deterministic act() call: no stochastic step to score")
    rows = torch.arange(chains.shape[0], device=chains.device)
    terms, entropies = [], []
    if joint_logprob:
        x0 = chains[:, 0]
        terms.append(gaussian_log_prob(x0, torch.zeros_like(x0), torch.ones_like(x0)))
        entropies.append(gaussian_entropy(torch.ones_like(x0)))
    for j in range(inds.shape[1] if joint_logprob else 1):
        idx = inds[:, j]
        mean, std = transition(chains[rows, idx], idx, noise_method)
        terms.append(gaussian_log_prob(chains[rows, idx + 1], mean, std))
        entropies.append(gaussian_entropy(std))
    return torch.stack(terms, dim=1).mean(dim=1), torch.stack(entropies, dim=1).mean(dim=1)


class FlowPolicy(TorsoPolicy):
    """Flow-matching action-chunk policy; E = D.

    Args:
        observation_space: single-env observation space.
        action_space: Box of shape ``(D,)`` (K = 1) or ``(K, D)``; the chain lives in the same units.
        sampling: the denoising sampler (``FlowSampling``: ``num_steps`` N, default 5,
            ``noise_method``, ``noise_level``, ``joint_logprob``, ``ignore_last``,
            ``noise_std_range``), as a ``FlowSampling``, a dict of some of its fields, or its fields
            as keywords of this constructor. ``noise_level`` may be changed (annealed) between calls.
        clip_actions: clip returned actions to the Box bounds (the chain itself is never clipped).
            Default False: the env clips, as for the Gaussian policy.
        deterministic_init: with ``deterministic=True`` every step is an ODE step; the initial noise
            is still sampled (``"sample"``, as RLinf: seed the policy for reproducible evaluation)
            or is zero (``"zeros"``: the action is then a function of the observation alone).
        velocity_hidden, velocity_activation, time_dim: the velocity MLP on
            ``(x_t flattened, sinusoidal t embedding, obs features)``.
        outcome_conditioned: the obs features also carry a learned embedding of the episode's
            outcome (``OUTCOMES``: none, success, failure), zero at first so that weights of an
            unconditioned policy load unchanged (``outcome_embedding`` may be missing from them).
            Trained by ``imitation_loss(..., outcome=)``; acting follows classifier-free guidance
            towards success (CFGRL, Frans et al., 2025): ``v = v_none + guidance (v_success -
            v_none)``.
        guidance: the weight above (1: the success-conditioned policy; > 1 moves further from the
            unconditioned one). Like ``noise_level`` it may be changed between calls.
        **torso_options (hidden_sizes, activation, share_torso, use_critic, ortho_init, torso_kwargs): see
            ``TorsoPolicy``.

    Replay: ``obs/<key>``, ``chains`` float32 ``[B, N+1, K, D]`` (the whole chain, starting with the
    initial noise), ``denoise_inds`` int64 ``[B, N]`` (all k for single-step sampling,
    ``0..N-1`` with ``joint_logprob``, -1 from a deterministic call) and ``noise_level`` ``[B]``.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        sampling: FlowSampling | Mapping[str, Any] | None = None,
        clip_actions: bool = False,
        deterministic_init: str = "sample",
        velocity_hidden: Sequence[int] = (256, 256),
        velocity_activation: str = "gelu",
        time_dim: int = 32,
        outcome_conditioned: bool = False,
        guidance: float = 1.0,
        **options: Any,
    ):
        sampling = FlowSampling.from_options(sampling, options)  # the rest are TorsoPolicy's options
        if not math.isfinite(guidance) or guidance < 0:
            raise BadInput(f"guidance must be a finite number >= 0, got {guidance}")
        if guidance != 1.0 and not outcome_conditioned:
            raise BadInput(f"guidance {guidance} needs outcome_conditioned (it steers between outcomes)")
        super().__init__(observation_space, **options)
        if deterministic_init not in ("sample", "zeros"):
            raise BadInput(f"deterministic_init must be 'sample' or 'zeros', got {deterministic_init!r}")
        self.chunk_size, self.action_dim = box_chunk_shape(action_space)
        self.log_prob_dim = self.action_dim
        self.clip_actions, self.deterministic_init, self.time_dim = clip_actions, deterministic_init, time_dim
        sampling.attach(self)
        low, high = box_bounds(action_space)
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)

        n = self.chunk_size * self.action_dim
        self.velocity_net = mlp([n + time_dim + self.torso.out_dim, *velocity_hidden], velocity_activation)
        self.velocity_out = nn.Linear(velocity_hidden[-1], n)
        self.noise_head = None
        if self.noise_method == "flow_noise":  # RLinf's ExploreNoiseNet shape: hidden -> 128 -> 64 -> A, tanh
            self.noise_head = mlp([velocity_hidden[-1], 128, 64, n], "tanh", last_activation=False)
            sampling.attach_noise_bounds(self)
        self.guidance = float(guidance)
        self.outcome_embedding = None
        if outcome_conditioned:
            self.outcome_embedding = nn.Embedding(len(OUTCOMES), self.torso.out_dim)
            nn.init.zeros_(self.outcome_embedding.weight)

    @property
    def outcome_conditioned(self) -> bool:
        """Whether the policy takes an outcome label (its ``outcome_embedding``)."""
        return self.outcome_embedding is not None

    def velocity(
        self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Velocity ``[B, K, D]`` at chain element ``x`` ``[B, K, D]`` and times ``t`` ``[B]``, with
        the last hidden features ``[B, H]`` (the flow_noise head's input)."""
        inputs = torch.cat([x.flatten(1), time_embedding(t, self.time_dim), context], dim=-1)
        hidden = self.velocity_net(inputs)
        return self.velocity_out(hidden).reshape(x.shape), hidden

    def acting_velocity(
        self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The velocity the policy acts with: ``velocity``, or for an outcome-conditioned policy the
        guided ``v_none + guidance (v_success - v_none)`` (one batched call of both)."""
        if self.outcome_embedding is None:
            return self.velocity(x, t, context)
        table = self.outcome_embedding.weight
        success = context + table[OUTCOMES["success"]]
        if self.guidance == 1.0:
            return self.velocity(x, t, success)
        b = x.shape[0]
        v, hidden = self.velocity(
            torch.cat([x, x]), torch.cat([t, t]), torch.cat([success, context + table[OUTCOMES["none"]]])
        )
        return v[b:] + self.guidance * (v[:b] - v[b:]), hidden[:b]

    def learned_std(self, hidden: torch.Tensor) -> torch.Tensor:
        """flow_noise std ``[B, K, D]`` from the velocity net's last hidden features."""
        std = squashed_std(self.noise_head(hidden), self.logvar_min, self.logvar_max)
        return std.reshape(-1, self.chunk_size, self.action_dim)

    def transition(
        self,
        x: torch.Tensor,
        idx: torch.Tensor,
        context: torch.Tensor,
        method: str,
        noise_level: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std of step ``idx`` (int64 ``[B]``) from chain element ``x``."""
        t = self.timesteps[idx]
        delta = t - self.timesteps[idx + 1]
        v, hidden = self.acting_velocity(x, t, context)
        col = (slice(None), None, None)
        return flow_mean_std(
            x,
            v,
            t[col],
            delta[col],
            method,
            noise_level[col],
            sigma=noise_level[col] * self.sigma_ratios[idx][col],
            learned_std=self.learned_std(hidden) if method == "flow_noise" else None,
        )

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        context = self.torso(prepared)
        b, device = context.shape[0], context.device
        rng = self._rng(device)
        shape = (b, self.chunk_size, self.action_dim)
        if deterministic and self.deterministic_init == "zeros":
            x = torch.zeros(shape, device=device)
        else:
            x = torch.randn(shape, generator=rng, device=device)
        inds = denoise_indices(
            self.num_steps, deterministic, self.joint_logprob, self.ignore_last, rng, device
        )
        noise_level = torch.full((b,), self.noise_level, device=device)

        def transition(x_i: torch.Tensor, i: int, method: str) -> tuple[torch.Tensor, torch.Tensor]:
            step = torch.full((b,), i, dtype=torch.long, device=device)
            return self.transition(x_i, step, context, method, noise_level)

        chains, log_probs = sample_chain(x, inds, transition, self.noise_method, self.joint_logprob, rng)
        x = chains[:, -1]
        actions = torch.clamp(x, self.action_low, self.action_high) if self.clip_actions else x
        replay = {
            **self._obs_replay(prepared),
            "chains": chains,
            "denoise_inds": inds.to(device).expand(b, self.num_steps).clone(),
            "noise_level": noise_level,
        }
        return ActionChunk(actions, log_probs, self._value(prepared, context), replay)

    @property
    def noise_shape(self) -> tuple[int, int]:
        """The shape of one sample's initial noise: the chunk ``(K, D)``."""
        return (self.chunk_size, self.action_dim)

    @torch.no_grad()
    def denoise(self, obs: Any, noise: torch.Tensor) -> torch.Tensor:
        """The action chunk ``[B, K, D]`` that the deterministic (ODE) chain reaches from the initial
        noise ``[B, K, D]``: what ``act(deterministic=True)`` does after drawing its noise. DSRL
        (``policies/dsrl.py``) steers the frozen policy through this noise."""
        context = self.torso(self._prepare(obs))
        x = noise.to(context)
        b = x.shape[0]
        level = torch.full((b,), self.noise_level, device=x.device)
        for i in range(self.num_steps):
            step = torch.full((b,), i, dtype=torch.long, device=x.device)
            x, _ = self.transition(x, step, context, "flow_ode", level)
        return torch.clamp(x, self.action_low, self.action_high) if self.clip_actions else x

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        """Log-probs of the stored chain transitions under the current weights. Entropy (mean over
        the same terms) only for flow_noise, whose std is learned; None for the fixed-std methods."""
        prepared = self._prepare(self._replay_obs(replay))
        context = self.torso(prepared)
        device = context.device
        noise_level = replay["noise_level"].to(device)

        def transition(x: torch.Tensor, idx: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
            return self.transition(x, idx, context, method, noise_level)

        chains, inds = replay["chains"].to(device), replay["denoise_inds"].to(device).long()
        log_probs, entropy = score_chain(chains, inds, transition, self.noise_method, self.joint_logprob)
        entropy = entropy if self.noise_method == "flow_noise" else None
        return PolicyEval(log_probs, entropy, self._value(prepared, context))

    def imitation_loss(
        self,
        obs: Any,
        actions: torch.Tensor,
        mask: torch.Tensor | None = None,
        outcome: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Conditional flow matching (pi0's SFT loss): ``x_t = t noise + (1 - t) a`` with ``t ~ U(0, 1)``,
        the velocity regressed on ``noise - a`` (squared error summed over D). ``outcome`` (int64
        ``[B]`` of ``OUTCOMES``; outcome-conditioned policies only) labels each row; without it an
        outcome-conditioned policy learns the unconditioned velocity."""
        context = self.torso(self._prepare(obs))
        if outcome is not None and self.outcome_embedding is None:
            raise BadInput("imitation_loss got outcome labels; the policy is not outcome_conditioned")
        if self.outcome_embedding is not None:
            if outcome is None:
                outcome = torch.zeros(context.shape[0], dtype=torch.long)
            known = bool(((outcome >= 0) & (outcome < len(OUTCOMES))).all())
            if outcome.shape != (context.shape[0],) or not known:
                raise BadInput(f"outcome must be {context.shape[0]} labels in 0..{len(OUTCOMES) - 1}")
            context = context + self.outcome_embedding(outcome.to(context.device))
        a = actions.to(context)
        rng = self._rng(context.device)
        noise = torch.randn(a.shape, generator=rng, device=context.device)
        t = torch.rand(a.shape[0], generator=rng, device=context.device)
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * a
        v, _ = self.velocity(x_t, t, context)
        return masked_chunk_mean(((v - (noise - a)) ** 2).sum(-1), mask)
