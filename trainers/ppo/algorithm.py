"""PPO for action-chunk policies: GAE over sub-steps or chunks, the clipped objective, the update.

With K = 1 and the defaults of ``PPOConfig`` this is Stable-Baselines3's PPO: same GAE (with the
timeout bootstrap ``r += gamma * V(final obs)`` on truncation), per-minibatch advantage
normalization, clipped surrogate, MSE value loss with ``vf_coef``, entropy bonus, grad clipping.
The VLA options follow RLinf: GAE per chunk, element/step/chunk log-prob ratios, asymmetric
and dual clip, Huber value loss with value clipping, global advantage normalization.

Time layout (Rollout): step t pairs the policy output on obs_t with the reward and done that the
env returned for it; ``last_values`` = V(obs_T).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from nets.errors import BadInput
from policies.base import ActionChunkPolicy
from trainers import parallel, update
from trainers.losses import (
    LOG_PROB_LEVELS,
    LogProbLevel,
    explained_variance,
    masked_mean,
    normalize,
    policy_loss,
    policy_loss_weights,
    to_level,
)
from trainers.optim import BadUpdateGuard, flatten_time, fused_ok
from trainers.parallel import Evaluate
from trainers.rollout import Bootstrap, Rollout


@dataclass
class PPOConfig:
    """PPO hyperparameters. Defaults = Stable-Baselines3 2.9 ``PPO`` when K = 1."""

    # -- rollout and optimisation
    n_steps: int = 2048
    """policy steps per env per rollout"""
    batch_size: int = 64
    """chunk-steps per minibatch"""
    n_epochs: int = 10
    """passes over the rollout per update"""
    learning_rate: float = 3e-4
    """Adam step size (see lr_schedule)"""
    adam_eps: float = 1e-5
    """Adam epsilon (SB3: 1e-5)"""
    max_grad_norm: float | None = 0.5
    """clip the gradient norm per minibatch (none: no clipping)"""
    target_kl: float | None = None
    """stop the epochs once the approx KL per chunk-step (trainers.losses.chunk_kl) > 1.5 * target_kl
    (SB3's rule and, for K = 1, SB3's approx_kl)"""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """linear: value * (fraction of the step budget left after this rollout), as SB3's "lin_" schedules"""
    clip_schedule: Literal["constant", "linear"] = "constant"
    """the clip range, as lr_schedule"""
    # -- advantages
    gamma: float = 0.99
    """discount per time unit (time_unit)"""
    gae_lambda: float = 0.95
    """GAE lambda (1: Monte Carlo returns, 0: one-step TD)"""
    time_unit: Literal["step", "chunk"] = "step"
    """discount per sub-step, or per chunk (SMDP)"""
    bootstrap: Bootstrap = "truncated"
    """which ended episodes add gamma * V(final obs)"""
    adv_norm: Literal["minibatch", "global", "none"] = "minibatch"
    """standardise advantages per minibatch (SB3), over the whole rollout, or not at all"""
    adv_norm_eps: float = 1e-8
    """added to the std when standardising advantages"""
    # -- policy loss
    clip_low: float = 0.2
    """the ratio is clipped to [1 - clip_low, 1 + clip_high]"""
    clip_high: float = 0.2
    """upper clip of the ratio (DAPO raises it above clip_low)"""
    dual_clip: float | None = None
    """c > 1 caps the loss of A < 0 samples at c |A|"""
    log_prob_level: LogProbLevel = "chunk"
    """ "chunk" = SB3's sum over action dims when K = 1"""
    ent_coef: float = 0.0
    """weight of the entropy bonus"""
    # -- value loss
    value_loss: Literal["mse", "huber"] = "mse"
    """the critic's loss to the returns"""
    huber_delta: float = 10.0
    """huber: quadratic below this error, linear above"""
    clip_value: float | None = None
    """clip V around the rollout's V (max of both losses)"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    critic_warmup_iters: int = 0
    """first iterations train the critic only (the actor is frozen): a critic added to a pretrained actor
    starts random, and its advantages would only push the actor around"""
    # -- safety
    max_bad_updates: int = 10
    """raise after this many non-finite updates in a row"""

    def __post_init__(self) -> None:
        _choice("time_unit", self.time_unit, ("step", "chunk"))
        _choice("bootstrap", self.bootstrap, ("truncated", "done", "none"))
        _choice("adv_norm", self.adv_norm, ("minibatch", "global", "none"))
        _choice("log_prob_level", self.log_prob_level, LOG_PROB_LEVELS)
        _choice("value_loss", self.value_loss, ("mse", "huber"))
        _choice("lr_schedule", self.lr_schedule, ("constant", "linear"))
        _choice("clip_schedule", self.clip_schedule, ("constant", "linear"))
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise BadInput(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if not (0.0 <= self.clip_low < 1.0 and self.clip_high >= 0.0):
            raise BadInput(
                f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low} and {self.clip_high}"
            )
        if self.target_kl is not None and self.target_kl <= 0:
            raise BadInput(f"target_kl must be > 0 (or None), got {self.target_kl}")
        for name in ("n_steps", "batch_size", "n_epochs", "max_bad_updates"):
            if getattr(self, name) < 1:
                raise BadInput(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.critic_warmup_iters < 0:
            raise BadInput(f"critic_warmup_iters must be >= 0, got {self.critic_warmup_iters}")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.gae_lambda <= 1.0):
            raise BadInput(f"gamma and gae_lambda must be in [0, 1], got {self.gamma}, {self.gae_lambda}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise BadInput(f"{name} must be one of {allowed}, got {value!r}")


def make_optimizer(policy: torch.nn.Module, config: PPOConfig) -> torch.optim.Optimizer:
    """Adam over the trainable parameters, as SB3 (eps 1e-5); the fused kernel (same update rule,
    one kernel for all parameters) where torch has it for the parameters' device."""
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.Adam(params, lr=config.learning_rate, eps=config.adam_eps, fused=fused_ok(params))


# ---------------------------------------------------------------------- GAE
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    valid: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> torch.Tensor:
    """Generalized advantage estimation over a time axis ``[S, N]``.

    ``dones[s]``: the episode ended with step s (cuts the recursion; add any truncation bootstrap
    to ``rewards[s]`` beforehand). Invalid steps (not decisions: NEXT_STEP resets, frozen envs,
    sub-steps after a done) are transparent: advantage 0, and the recursion passes over them.
    """
    # the recursion runs in numpy: thousands of tiny steps cost ~20x less there than as torch ops
    r, v, d, ok = (x.detach().cpu().numpy() for x in (rewards, values, dones, valid))
    not_done = 1.0 - d.astype(r.dtype)
    advantages = np.zeros_like(r)
    next_value = last_values.detach().cpu().numpy().astype(r.dtype)
    next_adv = np.zeros_like(next_value)
    for s in reversed(range(r.shape[0])):
        delta = r[s] + gamma * next_value * not_done[s] - v[s]
        adv = delta + gamma * gae_lambda * not_done[s] * next_adv
        advantages[s] = np.where(ok[s], adv, 0.0)
        next_value = np.where(ok[s], v[s], next_value)
        next_adv = np.where(ok[s], adv, next_adv)
    return torch.as_tensor(advantages, device=rewards.device)


def compute_advantages(
    rollout: Rollout, gamma: float, gae_lambda: float, time_unit: Literal["step", "chunk"] = "step"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advantages, returns (= advantages + values) and their mask, each ``[T, N, U]``.

    ``time_unit="step"``: U = K, one entry per sub-step, gamma per sub-step; needs one value per
    sub-step (Kv = K) when K > 1. ``time_unit="chunk"``: U = 1, rewards summed inside the chunk
    (no discount within it), gamma per chunk, the value of the chunk's first obs (``values[..., 0]``).
    ``rollout.bootstrap_values`` is added as ``gamma * V(final obs)`` to the last executed reward of
    the step where the episode ended.
    """
    if rollout.values is None or rollout.last_values is None:
        raise BadInput("PPO needs a policy with a value head (ActionChunk.value was None)")
    T, N, K = rollout.rewards.shape
    Kv = rollout.values.shape[-1]
    dones, valid = rollout.dones, rollout.valid
    boot = gamma * rollout.bootstrap_values

    if time_unit == "chunk":
        rewards = (rollout.rewards * valid).sum(-1) + boot
        values = rollout.values[..., 0]
        ok = valid.any(-1)
        adv = gae(rewards, values, dones, ok, rollout.last_values[:, 0], gamma, gae_lambda)
        return adv[..., None], (adv + values)[..., None] * ok[..., None], ok[..., None]

    if time_unit != "step":
        raise BadInput(f"time_unit must be 'step' or 'chunk', got {time_unit!r}")
    if Kv != K:
        raise BadInput(
            f"time_unit='step' with K={K} sub-steps needs one value per sub-step (Kv=K), got Kv={Kv}; "
            "use time_unit='chunk' or a per-sub-step value head"
        )
    # the done (and the bootstrap) belongs to the chunk's last executed sub-step
    k = torch.arange(K)
    last = torch.where(valid, k, -1).amax(-1, keepdim=True)  # [T, N, 1]
    sub_done = dones[..., None] & (k == last)
    rewards = rollout.rewards + torch.where(sub_done, boot[..., None], 0.0)

    def flat(x: torch.Tensor) -> torch.Tensor:  # [T, N, K] -> [T * K, N] in time order
        return x.permute(0, 2, 1).reshape(T * K, N)

    def unflat(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(T, K, N).permute(0, 2, 1)

    last_v = rollout.last_values[:, 0]
    adv = unflat(
        gae(flat(rewards), flat(rollout.values), flat(sub_done), flat(valid), last_v, gamma, gae_lambda)
    )
    return adv, (adv + rollout.values) * valid, valid


# ---------------------------------------------------------------------- losses
def value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    kind: Literal["mse", "huber"] = "mse",
    clip: float | None = None,
    huber_delta: float = 10.0,
    weight_sum: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked mean of ``(R - V)^2`` (SB3, no 1/2) or Huber(R - V); with ``clip`` the pessimistic
    max of the unclipped and the clipped (``V_old + clamp(V - V_old, -clip, clip)``) losses.
    ``weight_sum``: the mask's count over all ranks (see ``masked_mean``)."""

    def err(v: torch.Tensor) -> torch.Tensor:
        if kind == "mse":
            return (returns - v) ** 2
        return F.huber_loss(v, returns, reduction="none", delta=huber_delta)

    loss = err(new_values)
    if clip is not None:
        clipped = old_values + (new_values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, err(clipped))
    return masked_mean(loss, mask, weight_sum)


# ---------------------------------------------------------------------- update
def ppo_update(
    policy: ActionChunkPolicy,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    config: PPOConfig,
    *,
    generator: torch.Generator | None = None,
    guard: BadUpdateGuard | None = None,
    train_actor: bool = True,
    evaluator: torch.nn.Module | None = None,
) -> dict[str, float]:
    """``n_epochs`` passes of shuffled minibatches of chunk-steps over one rollout.

    ``train_actor=False`` (critic warm-up) minimizes the value loss alone: the actor gets no
    gradient and its ratios stay 1. Returns the mean of each minibatch metric plus rollout-level
    ones (explained variance, advantage and return statistics, updates done and skipped).

    Data parallel (``trainers/parallel.py``; ``evaluator`` is then the DDP-wrapped policy): each
    rank holds its own envs' rollout, and the update engine (``trainers/update.py``) keeps the
    ranks in step. Every mean (losses, advantage normalization, statistics) divides by its count
    over all ranks, so each rank's loss is its share of the loss over the whole minibatch.
    """
    guard = guard or BadUpdateGuard(config.max_bad_updates)
    level = config.log_prob_level

    # advantages on the whole rollout, then one row per chunk-step with at least one valid entry
    adv, ret, mask = compute_advantages(rollout, config.gamma, config.gae_lambda, config.time_unit)
    if config.adv_norm == "global":
        adv = normalize(adv, mask, config.adv_norm_eps, reduce=parallel.all_reduce_sum)
    width = adv.shape[-1]
    values = rollout.values[..., :width]
    data = {
        "log_probs": flatten_time(rollout.log_probs).detach(),
        "valid": flatten_time(rollout.valid),
        "values": flatten_time(values),
        "advantages": flatten_time(adv),
        "returns": flatten_time(ret),
        "mask": flatten_time(mask),
    }
    replay = {k: flatten_time(v) for k, v in rollout.replay.items()}
    rows = update.select(data, replay, data["mask"].any(-1), blank_masks=("valid", "mask"))

    def weight_sums(mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**policy_loss_weights(mb["log_probs"], mb["valid"], level, width), "value": mb["mask"].sum()}

    def loss_fn(batch: update.Minibatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        mb, counts = batch.data, batch.counts
        (out,) = batch.evaluate(batch.replay)
        a = mb["advantages"]
        if config.adv_norm == "minibatch" and batch.rows > 1:
            a = normalize(a, mb["mask"], config.adv_norm_eps, reduce=parallel.all_reduce_sum)
        pg_loss, stats = policy_loss(
            out.log_probs,
            mb["log_probs"],
            a,
            mb["valid"],
            level,
            config.clip_low,
            config.clip_high,
            config.dual_clip,
            weight_sums=counts or None,
        )
        if out.value is None:
            raise BadInput("PPO needs policy.evaluate to return a value")
        if batch.kl_exceeded(stats["approx_kl_chunk"]):
            return None
        v_loss = value_loss(
            out.value[..., :width],
            mb["values"],
            mb["returns"],
            mb["mask"],
            config.value_loss,
            config.clip_value,
            config.huber_delta,
            counts.get("value"),
        )
        # entropy of the distribution at the ratio's level (or -log_prob when not available)
        elem = out.entropy if out.entropy is not None else -out.log_probs
        ent, ent_mask = to_level(elem, mb["valid"], level)
        entropy = masked_mean(ent, ent_mask, counts.get("level"))

        loss = config.vf_coef * v_loss
        if train_actor:
            loss = loss + pg_loss - config.ent_coef * entropy
        return loss, {**stats, "policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy}

    metrics = update.optimize(
        rows,
        optimizer,
        loss_fn,
        evaluator=evaluator or Evaluate(policy),
        device=next(policy.parameters()).device,
        n_epochs=config.n_epochs,
        batch_size=config.batch_size,
        target_kl=config.target_kl,
        max_grad_norm=config.max_grad_norm,
        guard=guard,
        generator=generator,
        weight_sums=weight_sums,
    )
    # rollout-level statistics over every rank's envs
    values, ret, mask, adv = (parallel.all_gather_cat(x, dim=1) for x in (values, ret, mask, adv))
    return {
        **metrics,
        "explained_variance": explained_variance(values, ret, mask),
        "advantages_mean": masked_mean(adv, mask).item(),
        "returns_mean": masked_mean(ret, mask).item(),
        "samples": rows.total,
    }
