"""Soft actor-critic over action chunks: the config and one gradient step, on one screen.

With the defaults and K = 1 this is Stable-Baselines3's SAC (Haarnoja et al. 2018, v2): twin
critics, target critics moved by Polyak averaging, an automatically tuned temperature with
target entropy ``-dim(A)``, one gradient step per env step, log-probs in normalised action units,
and SB3's order inside a step (temperature, then critics, then actor; the temperature used in the
losses is the one before its step). The options the sample-efficient methods add:

* RLPD (Ball et al. 2023): ``n_critics`` > 2 with ``critic_subsample`` (the target is the min
  over a random subset), ``critic_layer_norm``, a high update-to-data ratio (``gradient_steps``)
  and batches half prior data (``prior_ratio``, in ``trainers/sac/train.py``);
* Q-chunking (Li et al. 2025): the critic scores the whole chunk ``[K, D]``, the reward sums the
  executed sub-steps and the bootstrap discount is ``gamma^(executed)`` (``trainers/sac/replay.py``),
  ``n_step`` chains chunk-steps, and ``bc_coef`` keeps the actor near the prior data (the actor's
  negative log-likelihood of the prior rows' chunks).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from gymnasium import spaces
from torch import nn

from nets.errors import BadInput
from policies.torso_policy import box_bounds, box_chunk_shape
from trainers.optim import BadUpdateGuard, fused_ok
from trainers.sac.critic import QEnsemble
from trainers.sac.replay import Batch


@dataclass
class SACConfig:
    """SAC settings (defaults: SB3's SAC)."""

    learning_rate: float = 3e-4
    """Adam, for actor, critics and temperature"""
    buffer_size: int = 1_000_000
    """transitions kept"""
    batch_size: int = 256
    """transitions per gradient step (online and prior rows together)"""
    gamma: float = 0.99
    """discount per env sub-step"""
    tau: float = 0.005
    """Polyak factor of the target critics"""
    learning_starts: int = 100
    """transitions in the buffer before the first update"""
    steps_per_iteration: int = 1000
    """env steps of every env (vector steps) per iteration; each iteration logs a row"""
    gradient_steps: int = 1
    """gradient steps after each vector step (the update-to-data ratio)"""
    actor_every: int = 1
    """update the actor and the temperature on every N-th gradient step only, the critics on every one
    (RLPD's JAX code: one actor step per round of UTD critic steps; CleanRL's SAC: 2)"""
    actor_starts: int = 0
    """gradient steps that update the critics only before the actor's first step (a critic warm-up: the
    actor is not pulled by critics that have not yet learned the rewards; offline steps count)"""
    n_step: int = 1
    """chunk-steps per return (each chunk's executed sub-steps are always summed)"""
    # -- temperature
    init_alpha: float = 1.0
    """the entropy temperature alpha at the start"""
    learn_alpha: bool = True
    """tune alpha toward target_entropy (False: alpha stays init_alpha)"""
    target_entropy: float | None = None
    """None: -(number of sampled action elements per chunk)"""
    # -- critics
    n_critics: int = 2
    """Q ensemble members"""
    critic_subsample: int = 0
    """the target's min over this many random members (0: all)"""
    critic_layer_norm: bool = False
    """LayerNorm after each hidden layer of the critics (RLPD)"""
    critic_hidden_sizes: tuple[int, ...] = (256, 256)
    """each critic member's hidden layers"""
    critic_activation: str = "relu"
    """a name of policies.torsos.ACTIVATIONS"""
    actor_q: Literal["min", "mean"] = "min"
    """how the actor's loss reduces the members' Q"""
    critic_obs_norm: Literal["actor", "prior"] = "actor"
    """the critics' observation standardisation: "actor" as the actor does (its obs_norm), "prior"
    fixed from the prior data's statistics whatever the actor does (e.g. a clone fed raw features)"""
    actor_obs_norm: Literal["keep", "prior"] = "keep"
    """with "prior" an actor fed raw observations (a clone trained without obs_norm) is switched to fixed
    standardisation by the prior data's statistics with the same function (its first layer absorbs
    them), so that its updates move every input feature on the same scale; "keep": as it is"""
    warmup: Literal["uniform", "policy"] = "uniform"
    """actions before learning_starts: uniform in the Box (SB3) or the policy's own"""
    # -- prior data (RLPD)
    prior_data: str | None = None
    """demonstrations (any trainers.datasets format) or an earlier SAC run"""
    prior_ratio: float = 0.5
    """share of every batch drawn from the prior data"""
    offline_steps: int = 0
    """gradient steps on the prior data alone before the first env step"""
    bc_coef: float = 0.0
    """weight of the actor's imitation loss on the batch's prior rows"""
    max_grad_norm: float | None = None
    """clip each loss's gradient norm (None: no clipping, as SB3)"""
    max_bad_updates: int = 10
    """non-finite updates in a row before the run stops"""
    # -- the async loop (run.loop "async": trainers/actors/, trainers/sac/actors.py)
    max_policy_lag: int = 32
    """async: a chunk is chosen with weights at most this many learner updates old (0: the newest)"""
    weight_sync_every: int = 8
    """async: learner updates between two copies of the weights to the actor process"""
    max_actor_lead: int = 2
    """async: vector steps the actor may run ahead of the learner's updates for them (the env step and
    those updates overlap; gradient_steps per vector step is kept)"""
    actor_nice: int = 19
    """async: niceness (0-19) added to the actor process and its env workers: the learner has its core
    whenever it can use it and the envs take every cycle it leaves (benchmarks.actor_learner: 19 gave
    1.16x the env steps/s of 0, and 94% of the machine busy)"""
    placebo: bool = False
    """a control, not a method: each batch's (reward, discount) pairs permuted among its rows, so the
    update has the same data and sizes but no information on what each chunk earned"""

    def __post_init__(self) -> None:
        for name in ("buffer_size", "batch_size", "steps_per_iteration", "n_step", "n_critics"):
            if getattr(self, name) < 1:
                raise BadInput(f"sac {name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.actor_nice <= 19:
            raise BadInput(f"sac actor_nice must be in [0, 19], got {self.actor_nice}")
        for name in ("actor_every", "weight_sync_every", "max_actor_lead"):
            if getattr(self, name) < 1:
                raise BadInput(f"sac {name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "learning_starts",
            "gradient_steps",
            "offline_steps",
            "critic_subsample",
            "max_policy_lag",
            "actor_starts",
        ):
            if getattr(self, name) < 0:
                raise BadInput(f"sac {name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.gamma <= 1.0 or not 0.0 < self.tau <= 1.0:
            raise BadInput(f"sac gamma and tau must be in (0, 1], got {self.gamma} and {self.tau}")
        if not 0.0 <= self.prior_ratio < 1.0:
            raise BadInput(f"sac prior_ratio must be in [0, 1), got {self.prior_ratio}")
        if self.init_alpha <= 0 or self.learning_rate <= 0 or self.bc_coef < 0:
            raise BadInput("sac init_alpha and learning_rate must be > 0 and bc_coef >= 0")
        if self.critic_subsample > self.n_critics:
            raise BadInput(f"critic_subsample {self.critic_subsample} > n_critics {self.n_critics}")
        if self.critic_obs_norm not in ("actor", "prior"):
            raise BadInput(f"sac critic_obs_norm must be actor or prior, got {self.critic_obs_norm!r}")
        if self.actor_obs_norm not in ("keep", "prior"):
            raise BadInput(f"sac actor_obs_norm must be keep or prior, got {self.actor_obs_norm!r}")
        for name in ("critic_obs_norm", "actor_obs_norm"):
            if getattr(self, name) == "prior" and not self.prior_data:
                raise BadInput(f"sac {name} 'prior' takes its statistics from prior_data, not set")
        if self.actor_q not in ("min", "mean") or self.warmup not in ("uniform", "policy"):
            raise BadInput(
                f"actor_q must be min or mean and warmup uniform or policy, got {self.actor_q}, {self.warmup}"
            )


class Learner(nn.Module):
    """What SAC trains besides the actor: the critics, their targets and the temperature.

    Actions reach the critics in normalised units: ``(a - center) / scale`` on a bounded Box;
    observations standardised by ``obs_norm`` (``policies.torsos.make_torso``'s modes): the actor's
    mode, or ``"fixed"`` with the prior data's statistics (``SACConfig.critic_obs_norm``).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        config: SACConfig,
        obs_norm: str = "off",
    ) -> None:
        super().__init__()
        low, high = box_bounds(action_space)
        bounded = torch.isfinite(low).all() and torch.isfinite(high).all()
        self.register_buffer("action_center", (high + low) / 2 if bounded else torch.zeros_like(low))
        self.register_buffer("action_scale", (high - low) / 2 if bounded else torch.ones_like(low))
        self.critic = QEnsemble(
            observation_space,
            box_chunk_shape(action_space),
            config.n_critics,
            config.critic_hidden_sizes,
            config.critic_activation,
            config.critic_layer_norm,
            torso_kwargs={"obs_norm": obs_norm},
        )
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.init_alpha)))

    def update_obs_stats(self, obs: Any) -> None:
        """Merge observations into the critics' (and their targets') normalisation statistics."""
        self.critic.encoder.update_obs_stats(obs)
        self.critic_target.encoder.update_obs_stats(obs)

    def q(
        self, obs: Any, actions: torch.Tensor, target: bool = False, members: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[N, B]``: every member's Q of env-unit ``actions`` ``[B, K, D]`` (or ``members``' only)."""
        normalised = (actions - self.action_center) / self.action_scale
        return (self.critic_target if target else self.critic)(obs, normalised, members)


def make_optimizer(actor: nn.Module, learner: Learner, config: SACConfig) -> torch.optim.Adam:
    """One Adam over three parameter groups (actor, critics, temperature). Each loss is stepped
    with only its own group's gradients set (``sac_update``), so Adam moves every group exactly as
    three separate optimizers would, and the run checkpoints one optimizer state."""
    groups = [
        [p for p in actor.parameters() if p.requires_grad],
        list(learner.critic.parameters()),
        [learner.log_alpha],
    ]
    params = [p for g in groups for p in g]
    return torch.optim.Adam([{"params": g} for g in groups], lr=config.learning_rate, fused=fused_ok(params))


def _step(
    loss: torch.Tensor,
    group: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float | None,
    guard: BadUpdateGuard,
) -> None:
    """Step ``group``'s parameters alone on ``loss`` (other groups keep no gradient)."""
    optimizer.zero_grad(set_to_none=True)
    grads = torch.autograd.grad(loss, group, allow_unused=True)
    for p, g in zip(group, grads):
        p.grad = g
    params = [p for p in group if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, math.inf if max_grad_norm is None else max_grad_norm)
    if guard.ok(loss, norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def sac_update(
    actor: Any,
    learner: Learner,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    config: SACConfig,
    generator: torch.Generator,
    guard: BadUpdateGuard,
    target_entropy: float,
    update_actor: bool = True,
) -> dict[str, torch.Tensor]:
    """One SAC gradient step on ``batch``; returns its metrics as 0-dim tensors (no host sync).

    ``actor`` is a policy with ``rsample(obs) -> (actions [B, K, D], log-probs [B, K, E])``
    (``policies.gaussian.GaussianPolicy``); ``generator`` draws the critics' target subset. With
    ``update_actor`` False only the critics step (``SACConfig.actor_every``).
    """
    actor_group, critic_group, alpha_group = (g["params"] for g in optimizer.param_groups)
    alpha = learner.log_alpha.detach().exp()
    metrics: dict[str, torch.Tensor] = {"alpha": alpha}
    if update_actor:  # temperature: alpha_loss = -log_alpha * (log pi + target entropy)
        pi_actions, log_prob = actor.rsample(batch.obs)
        log_prob = log_prob.sum((1, 2))
        alpha_loss = -(learner.log_alpha * (log_prob.detach() + target_entropy)).mean()
        if config.learn_alpha:
            _step(alpha_loss, alpha_group, optimizer, config.max_grad_norm, guard)
        metrics.update(alpha_loss=alpha_loss.detach(), entropy=-log_prob.detach().mean())

    # critics: y = r + discount * (min_subset Q_targ(s', a') - alpha log pi(a'|s')), a' ~ pi(s')
    with torch.no_grad():
        next_actions, next_log_prob = actor.rsample(batch.next_obs)
        members = None  # the target's random subset of members: only those are computed
        if 0 < config.critic_subsample < config.n_critics:
            members = torch.randperm(config.n_critics, generator=generator)[: config.critic_subsample]
            members = members.to(learner.log_alpha.device)
        q_next = learner.q(batch.next_obs, next_actions, target=True, members=members)
        soft_next = q_next.min(0).values - alpha * next_log_prob.sum((1, 2))
        target = batch.rewards + batch.discounts * soft_next
    q = learner.q(batch.obs, batch.actions)
    critic_loss = 0.5 * ((q - target) ** 2).mean(1).sum()
    _step(critic_loss, critic_group, optimizer, config.max_grad_norm, guard)
    metrics.update(critic_loss=critic_loss.detach(), q=q.detach().mean(), target_q=target.mean())

    if update_actor:  # actor: E[alpha log pi(a|s) - Q(s, a)], a ~ pi(s) (reparametrised), after the critics
        q_pi = learner.q(batch.obs, pi_actions)
        q_pi = q_pi.min(0).values if config.actor_q == "min" else q_pi.mean(0)
        actor_loss = (alpha * log_prob - q_pi).mean()
        bc_loss = torch.zeros((), device=q.device)
        if config.bc_coef > 0 and bool(batch.prior.any()):
            prior_obs = _rows(batch.obs, batch.prior.cpu().numpy())
            bc_loss = actor.imitation_loss(prior_obs, batch.actions[batch.prior])
            actor_loss = actor_loss + config.bc_coef * bc_loss
        _step(actor_loss, actor_group, optimizer, config.max_grad_norm, guard)
        metrics.update(actor_loss=actor_loss.detach(), bc_loss=bc_loss.detach())

    with torch.no_grad():  # Polyak: targ <- (1 - tau) targ + tau critic
        torch._foreach_lerp_(
            list(learner.critic_target.parameters()), list(learner.critic.parameters()), config.tau
        )
    return metrics


def shuffle_outcomes(batch: Batch, generator: torch.Generator) -> Batch:
    """The placebo's batch: the rows' (reward, discount) pairs randomly permuted among the rows."""
    perm = torch.randperm(len(batch.rewards), generator=generator).to(batch.rewards.device)
    return dataclasses.replace(batch, rewards=batch.rewards[perm], discounts=batch.discounts[perm])


def _rows(obs: Any, mask: Any) -> Any:
    """The rows ``mask`` of a batched observation (dict of arrays, string tuples)."""
    if isinstance(obs, dict):
        return {k: _rows(v, mask) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(x for x, keep in zip(obs, mask) if keep)
    return obs[mask]
