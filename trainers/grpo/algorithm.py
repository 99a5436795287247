"""GRPO with the DAPO options, for action-chunk policies.

Envs ``[g * G, (g + 1) * G)`` form group g: G rollouts from the same initial frame (reset them
with the same seed or frame id, e.g. ``group_seeds``). Each env contributes its first episode in
the rollout (``Rollout.first_episode``); its score is the sum of that episode's rewards. The
advantage of every element of trajectory i is ``(R_i - mean(R_group)) / (std(R_group) + eps)``.

DAPO: asymmetric clip (``clip_low`` 0.2, ``clip_high`` 0.28), dynamic sampling (groups whose
scores are all equal carry no signal: masked out, or reported by ``groups_to_resample`` so the
caller can run them again), token-level loss averaging, no KL (``kl_beta`` 0; with > 0 a frozen
reference policy adds the k3 estimate of KL(pi || pi_ref)).

Beyond DAPO: ``target_kl`` ends an update early once a minibatch's approximate KL to the
collecting policy, per chunk-step, passes 1.5x it (SB3's rule), and self-imitation (``sil_coef``)
adds the NLL of buffered chunk-steps of episodes that beat their group's mean, each weighted by its
episode's clipped advantage (``imitation_weights``, ``trainers/self_imitation.py``); ``pg_coef``
weighs the clipped policy-gradient loss (0: self-imitation alone).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch

from nets.errors import BadInput
from policies.base import ActionChunkPolicy
from trainers import parallel, update
from trainers.grpo.groups import keep_groups, num_groups
from trainers.losses import (
    LOG_PROB_LEVELS,
    LogProbLevel,
    loss_grid_mask,
    masked_mean,
    policy_loss,
    policy_loss_weights,
    to_level,
)
from trainers.optim import BadUpdateGuard, flatten_time, fused_ok
from trainers.parallel import Evaluate
from trainers.rollout import Rollout
from trainers.self_imitation import SuccessBuffer, imitation_nll

# the settings a ``variant`` names (fields left None take them): plain GRPO (Shao et al. 2024:
# symmetric clip, every group trained, each trajectory's loss averaged over its own steps) and DAPO
# (Yu et al. 2025: clip-higher, dynamic sampling, token-level averaging)
VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": {"clip_high": 0.2, "dynamic_sampling": False, "loss_agg": "traj_mean"},
    "dapo": {"clip_high": 0.28, "dynamic_sampling": True, "loss_agg": "token_mean"},
}


@dataclass
class GRPOConfig:
    """GRPO/DAPO hyperparameters (defaults: RLinf / SimpleVLA-RL OpenVLA-OFT LIBERO settings, except
    ``group_size``)."""

    group_size: int = 4
    """rollouts per start; a rollout of N envs updates on N / group_size starts. 4 (RLinf and SimpleVLA-RL
    use 8, over 64+ envs): with 16 envs an update sees 4 starts, not 2, and moves the actions of starts
    outside the batch less blindly"""
    std: Literal["unbiased", "population", "none"] = "unbiased"
    """ "none": mean only (Dr. GRPO)"""
    adv_eps: float = 1e-6
    """added to the group std of the scores"""
    variant: Literal["dapo", "grpo"] = "dapo"
    """ "dapo" or "grpo": the settings of VARIANTS for clip_high, dynamic_sampling and loss_agg where those
    are left unset (None); a value given for one of them wins"""
    clip_low: float = 0.2
    """the ratio is clipped to [1 - clip_low, 1 + clip_high]"""
    clip_high: float | None = None
    """upper clip of the ratio (None: the variant's, DAPO 0.28)"""
    dual_clip: float | None = None
    """c > 1 caps the loss of A < 0 samples at c |A| (none: off)"""
    log_prob_level: LogProbLevel = "element"
    """the ratio per action element, per sub-step or per chunk"""
    loss_agg: Literal["token_mean", "traj_mean"] | None = None
    """ "token_mean": every loss entry of the batch weighs the same; "traj_mean": each trajectory counts
    once (None: the variant's)"""
    kl_beta: float = 0.0
    """weight of the k3 KL to the starting policy (0: none, as DAPO)"""
    sil_coef: float = 0.0
    """self-imitation (trainers/self_imitation.py): sil_coef x the NLL of buffered chunk-steps of episodes
    that beat their group's mean score, added to every minibatch's loss"""
    pg_coef: float = 1.0
    """weight of the clipped policy-gradient loss (0 with sil_coef > 0: self-imitation alone)"""
    sil_capacity: int = 20_000
    """chunk-steps kept (oldest dropped first)"""
    sil_baseline: bool = True
    """each stored chunk-step weighs its episode's clipped group advantage when stored, (R - group mean)+ /
    (group std + adv_eps) with `std` as the policy gradient's (imitation_weights); False: weight 1 on every
    episode above its group's mean (baseline-free, as before issue 31)"""
    dynamic_sampling: bool | None = None
    """mask groups whose scores are all equal (None: the variant's)"""
    overlong: Literal["off", "filter", "punish"] = "off"
    """DAPO's overlong shaping of episodes cut by the time limit: "filter" masks a truncated first episode
    out of the loss (its score still counts in its group's baseline); "punish" adds the soft penalty 0 up
    to overlong_max_steps - overlong_buffer executed sub-steps, falling linearly to -1 at
    overlong_max_steps (and -1 beyond) to the episode's score. Off by default: in LIBERO a truncation is
    how a failure ends"""
    overlong_max_steps: int | None = None
    """the episode limit in sub-steps (None: the env's)"""
    overlong_buffer: int = 0
    """sub-steps before the limit over which the penalty grows"""
    score_low: float | None = None
    """also mask groups whose mean score is outside [low, high]"""
    score_high: float | None = None
    """(see score_low)"""
    resample_rounds: int = 0
    """> 0: collect up to this many extra rounds to replace dropped groups"""
    rollout_steps: int = 0
    """policy steps per round; 0: until every env finished its episode"""
    same_task_iters: int = 1
    """where groups start (trainers/grpo/groups.py): groups keep their start's task for this many
    iterations (envs that rebuild a scene on a task switch, LIBERO, reset several times faster);
    "informative" draws tasks by the share of their groups that carried signal"""
    start_weighting: Literal["uniform", "informative"] = "uniform"
    """how tasks are drawn (see above)"""
    n_epochs: int = 1
    """passes over the rollout per update"""
    batch_size: int | None = None
    """chunk-steps per minibatch; None = the whole rollout"""
    target_kl: float | None = None
    """stop the update once a minibatch's approx KL per chunk-step (trainers.losses.chunk_kl, whatever
    log_prob_level is) passes 1.5 * target_kl (SB3's rule)"""
    learning_rate: float = 2e-5
    """AdamW step size"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    max_grad_norm: float | None = 1.0
    """clip the gradient norm per minibatch (none: no clipping)"""
    max_bad_updates: int = 10
    """stop the run after this many non-finite updates in a row"""
    placebo: bool = False
    """a control, not a method: each batch's episode scores permuted among its episodes before the update
    and self-imitation see them (same starts and update sizes, no information); the reported env success
    stays the real one"""

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise BadInput(f"variant must be one of {sorted(VARIANTS)}, got {self.variant!r}")
        for name, value in VARIANTS[self.variant].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.overlong not in ("off", "filter", "punish"):
            raise BadInput(f"overlong must be 'off', 'filter' or 'punish', got {self.overlong!r}")
        if self.overlong_buffer < 0 or (self.overlong_max_steps is not None and self.overlong_max_steps < 1):
            raise BadInput(
                f"need overlong_buffer >= 0 and overlong_max_steps >= 1 (or None), got "
                f"{self.overlong_buffer} and {self.overlong_max_steps}"
            )
        if self.group_size < 1:
            raise BadInput(f"group_size must be >= 1, got {self.group_size}")
        if self.std not in ("unbiased", "population", "none"):
            raise BadInput(f"std must be 'unbiased', 'population' or 'none', got {self.std!r}")
        if self.log_prob_level not in LOG_PROB_LEVELS:
            raise BadInput(f"log_prob_level must be one of {LOG_PROB_LEVELS}, got {self.log_prob_level!r}")
        if self.loss_agg not in ("token_mean", "traj_mean"):
            raise BadInput(f"loss_agg must be 'token_mean' or 'traj_mean', got {self.loss_agg!r}")
        if not (0.0 <= self.clip_low < 1.0 and self.clip_high >= 0.0):
            raise BadInput(
                f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low} and {self.clip_high}"
            )
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise BadInput(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        for name in ("resample_rounds", "rollout_steps"):
            if getattr(self, name) < 0:
                raise BadInput(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.pg_coef < 0:
            raise BadInput(f"pg_coef must be >= 0, got {self.pg_coef}")
        if self.sil_coef < 0 or self.sil_capacity < 1:
            raise BadInput(
                f"need sil_coef >= 0 and sil_capacity >= 1, got {self.sil_coef}, {self.sil_capacity}"
            )
        if self.target_kl is not None and self.target_kl <= 0:
            raise BadInput(f"target_kl must be > 0 (or None), got {self.target_kl}")
        if self.start_weighting not in ("uniform", "informative"):
            raise BadInput(
                f"start_weighting must be 'uniform' or 'informative', got {self.start_weighting!r}"
            )
        if self.same_task_iters < 1:
            raise BadInput(f"same_task_iters must be >= 1, got {self.same_task_iters}")


def make_optimizer(policy: torch.nn.Module, config: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (lr, weight decay from the config)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused_ok(params)
    )


# ---------------------------------------------------------------------- scores and advantages
def episode_scores(rewards: torch.Tensor, first_episode: torch.Tensor) -> torch.Tensor:
    """Score of each env's first episode: the sum of its rewards ``[T, N, K] -> [N]``."""
    return (rewards * first_episode).sum((0, 2))


def first_episode_truncated(rollout: Rollout) -> torch.Tensor:
    """``[N]``: whether each env's first episode was cut by the time limit (truncated, not terminated)."""
    ended_here = rollout.first_episode.any(-1)  # [T, N]: the first episode's steps, its last included
    return (rollout.truncated & ~rollout.terminated & ended_here).any(0)


def overlong_penalty(lengths: torch.Tensor, max_steps: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment of episodes of ``lengths`` executed sub-steps: 0 up to
    ``max_steps - buffer``, then linear down to -1 at ``max_steps``, -1 beyond (a step at the
    limit when ``buffer`` is 0)."""
    start = max_steps - buffer
    ramp = (start - lengths.double()) / max(buffer, 1)
    return torch.where(lengths <= start, 0.0, torch.where(lengths <= max_steps, ramp, -1.0)).to(torch.float32)


def shuffle_scores(rollout: Rollout, generator: torch.Generator) -> Rollout:
    """The placebo's rollout: every env's first-episode score moved to a random other env (a
    permutation), each put on the first sub-step of that env's first episode; other rewards 0."""
    scores = episode_scores(rollout.rewards, rollout.first_episode)
    perm = torch.randperm(len(scores), generator=generator).to(scores.device)
    t, n, k = rollout.rewards.shape
    first = rollout.first_episode.permute(1, 0, 2).reshape(n, t * k)  # [N, T*K]
    rewards = torch.zeros(n, t * k, dtype=rollout.rewards.dtype, device=scores.device)
    rewards[torch.arange(n), first.float().argmax(1)] = scores[perm]
    return dataclasses.replace(rollout, rewards=rewards.reshape(n, t, k).permute(1, 0, 2).contiguous())


def group_advantages(
    scores: torch.Tensor,
    group_size: int,
    std: Literal["unbiased", "population", "none"] = "unbiased",
    eps: float = 1e-6,
) -> torch.Tensor:
    """``(R_i - mean) / (std + eps)`` within each group of ``group_size`` consecutive envs.

    ``std``: "unbiased" (N - 1, RLinf and SimpleVLA-RL), "population" (N, cosmos-rl) or "none"
    (subtract the mean only). A group of one keeps its score (mean 0, std 1, as SimpleVLA-RL).
    """
    groups = scores.reshape(num_groups(scores.numel(), group_size), group_size).double()
    if group_size == 1:
        return scores.clone()
    centred = groups - groups.mean(1, keepdim=True)
    if std != "none":
        centred = centred / (groups.std(1, unbiased=std == "unbiased", keepdim=True) + eps)
    return centred.reshape(-1).to(scores.dtype)


def imitation_weights(
    scores: torch.Tensor,
    group_size: int,
    std: Literal["unbiased", "population", "none"] = "unbiased",
    eps: float = 1e-6,
    baseline: bool = True,
) -> torch.Tensor:
    """Self-imitation weight of each env's first episode ``[N]`` (0: not stored).

    ``baseline``: the clipped group advantage ``max(0, group_advantages(...))`` (Oh et al. 2018's
    ``(R - b)+`` with b the group's mean score, normalised by the group's std as the policy gradient
    is; ``std="none"``: the raw ``R - mean``). A group whose scores are all equal, and a group of
    one (its own baseline), weigh 0. Otherwise weight 1 on every episode above its group's mean.
    """
    means = scores.reshape(num_groups(scores.numel(), group_size), group_size).mean(1)
    above = scores > means.repeat_interleave(group_size) + 1e-8  # also no float noise of equal scores
    if not baseline:
        return above.to(scores.dtype)
    if group_size == 1:
        return torch.zeros_like(scores)
    return group_advantages(scores, group_size, std, eps).clamp_min(0.0) * above


# ---------------------------------------------------------------------- update
def grpo_update(
    policy: ActionChunkPolicy,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    config: GRPOConfig,
    *,
    ref_policy: ActionChunkPolicy | None = None,
    generator: torch.Generator | None = None,
    guard: BadUpdateGuard | None = None,
    sil: SuccessBuffer | None = None,
    evaluator: torch.nn.Module | None = None,
    sil_generator: torch.Generator | None = None,
) -> dict[str, float]:
    """``n_epochs`` passes of minibatches of chunk-steps over a group rollout.

    Every element of env i's first episode gets env i's group advantage; groups dropped by dynamic
    sampling and everything after the first done are masked out. With ``sil`` and ``sil_coef > 0``
    each minibatch also imitates as many chunk-steps drawn from the buffer, from ``sil_generator``
    (default: ``generator``).

    Data parallel (``trainers/parallel.py``; ``evaluator`` is then the DDP-wrapped policy): each
    rank holds whole groups, so advantages need no communication; the update engine
    (``trainers/update.py``) takes the loss denominators (token count, or trajectory count for
    ``traj_mean``) and the decisions over all ranks. Self-imitation: ``sil`` must hold the same rows
    on every rank (``SuccessBuffer.add`` gathers them); each minibatch's rows are drawn whole, as
    many as the minibatch has over all ranks, from ``sil_generator``, which must then be in the
    same state on every rank (default: one seeded here from rank 0's ``generator``), and each rank
    evaluates its contiguous share of them in the minibatch's forward.
    """
    if config.kl_beta > 0 and ref_policy is None:
        raise BadInput("kl_beta > 0 needs a frozen reference policy (ref_policy=...)")
    guard = guard or BadUpdateGuard(config.max_bad_updates)
    device = next(policy.parameters()).device
    world = parallel.world_size()
    T, N, K = rollout.rewards.shape
    G, level = config.group_size, config.log_prob_level

    # 1. scores (DAPO's overlong shaping), group-normalized advantages, dynamic sampling (within
    # this rank's groups)
    scores = episode_scores(rollout.rewards, rollout.first_episode)
    truncated = first_episode_truncated(rollout)
    if config.overlong == "punish":
        if config.overlong_max_steps is None:
            raise BadInput("overlong 'punish' needs overlong_max_steps (the episode limit in sub-steps)")
        penalty = overlong_penalty(
            rollout.first_episode.sum((0, 2)), config.overlong_max_steps, config.overlong_buffer
        )
        scores = scores + penalty.to(scores)
    advantages = group_advantages(scores, G, config.std, config.adv_eps)
    keep = torch.ones(N // G, dtype=torch.bool)
    if config.dynamic_sampling:
        keep = keep_groups(scores, G, config.score_low, config.score_high)
    env_keep = keep.repeat_interleave(G)
    if config.overlong == "filter":  # truncated episodes leave the loss, not their group's baseline
        env_keep = env_keep & ~truncated.to(env_keep.device)
    valid = rollout.first_episode & env_keep[None, :, None]  # [T, N, K]

    all_scores, all_keep, all_adv = (parallel.all_gather_cat(x) for x in (scores, keep, advantages))
    all_env_keep = all_keep.repeat_interleave(G)
    metrics: dict[str, float] = {
        "score_mean": all_scores.mean().item(),
        "groups_kept": all_keep.float().mean().item(),
        "advantages_mean": all_adv[all_env_keep].mean().item() if all_env_keep.any() else 0.0,
        "advantages_abs_max": all_adv.abs().max().item(),
        "truncated": parallel.all_gather_cat(truncated.float()).mean().item(),
    }

    # 2. one row per chunk-step that still has something to learn from
    E = rollout.log_probs.shape[-1]
    per_step = loss_grid_mask(flatten_time(valid), level, 1).sum((1, 2)) * (E if level == "element" else 1)
    traj_size = per_step.reshape(T, N).sum(0)  # loss entries of each env's trajectory
    data = {
        "log_probs": flatten_time(rollout.log_probs).detach(),
        "valid": flatten_time(valid),
        "advantages": advantages.float().repeat(T)[:, None],  # sample m = t * N + n -> env n
        # traj_mean: each loss entry weighs 1 / (entries of its trajectory), so every trajectory
        # counts once however long it is (exact on a full batch, self-normalized on a minibatch)
        "weights": (1.0 / traj_size.clamp_min(1)).repeat(T),
    }
    replay = {k: flatten_time(v) for k, v in rollout.replay.items()}
    rows = update.select(data, replay, data["valid"].any(-1), blank_masks=("valid",))
    if rows.total == 0:
        return {**metrics, "updates": 0.0, "skipped_updates": 0.0, "samples": 0.0}
    if config.kl_beta > 0:  # reference log-probs, once
        rows.data["ref_log_probs"] = _reference_log_probs(
            ref_policy, rows.replay, len(rows.data["valid"]), config.batch_size, device
        )
    use_sil = sil is not None and config.sil_coef > 0 and len(sil) > 0
    if use_sil and world > 1 and sil_generator is None:  # a stream common to all ranks: rank 0's seed
        seed = int(torch.randint(2**62, (), generator=generator))
        sil_generator = torch.Generator().manual_seed(parallel.broadcast(seed))
    if sil_generator is None:
        sil_generator = generator

    # 3. clipped surrogate (+ KL to the reference, + self-imitation), token-level or per-trajectory
    def weights_of(mb: dict[str, torch.Tensor]) -> torch.Tensor | None:
        return mb["weights"] if config.loss_agg == "traj_mean" else None

    def weight_sums(mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return policy_loss_weights(mb["log_probs"], mb["valid"], level, 1, weights_of(mb))

    def loss_fn(batch: update.Minibatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        mb, counts = batch.data, batch.counts
        replays, sil_rows, sil_count = [batch.replay], None, None
        if use_sil and world > 1:  # DDP wants one forward per backward: the same one as the minibatch
            sil_rows, sil_count = _sil_share(sil, batch.rows, sil_generator, E)
            replays.append({k: v.to(device) for k, v in sil_rows[0].items()})
        outs = batch.evaluate(*replays)
        out = outs[0]
        pg_loss, stats = policy_loss(
            out.log_probs,
            mb["log_probs"],
            mb["advantages"],
            mb["valid"],
            level,
            config.clip_low,
            config.clip_high,
            config.dual_clip,
            weights_of(mb),
            weight_sums=counts or None,
        )
        if batch.kl_exceeded(stats["approx_kl_chunk"]):
            return None
        loss = config.pg_coef * pg_loss
        kl = torch.zeros(())
        if config.kl_beta > 0:
            new, mask = to_level(out.log_probs, mb["valid"], level)
            ref, _ = to_level(mb["ref_log_probs"], mb["valid"], level)
            d = ref - new
            kl = masked_mean(torch.exp(d) - d - 1.0, mask, counts.get("level"))  # k3 of KL(pi || pi_ref)
            loss = loss + config.kl_beta * kl
        sil_loss = torch.zeros(())
        if use_sil:
            if sil_rows is None:  # single process: drawn after the early-stop check
                sil_rows = sil.sample(batch.rows, sil_generator)
                outs += batch.evaluate({k: v.to(device) for k, v in sil_rows[0].items()})
            sil_loss = imitation_nll(
                outs[1].log_probs, sil_rows[1].to(device), sil_count, sil_rows[2].to(device)
            )
            loss = loss + config.sil_coef * sil_loss
        with torch.no_grad():  # logged only: GRPO has no entropy bonus
            elem = out.entropy if out.entropy is not None else -out.log_probs
            ent, ent_mask = to_level(elem.detach(), mb["valid"], level)
            entropy = masked_mean(ent, ent_mask, counts.get("level"))
        return loss, {**stats, "policy_loss": pg_loss, "kl_ref": kl, "sil_loss": sil_loss, "entropy": entropy}

    metrics |= update.optimize(
        rows,
        optimizer,
        loss_fn,
        evaluator=evaluator or Evaluate(policy),
        device=device,
        n_epochs=config.n_epochs,
        batch_size=config.batch_size,
        target_kl=config.target_kl,
        max_grad_norm=config.max_grad_norm,
        guard=guard,
        generator=generator,
        weight_sums=weight_sums,
    )
    return {**metrics, "samples": rows.total}


def _reference_log_probs(
    ref_policy: ActionChunkPolicy,
    replay: dict[str, torch.Tensor],
    num_rows: int,
    batch_size: int | None,
    device: torch.device,
) -> torch.Tensor:
    """The reference policy's log-probs of the ``num_rows`` rows of ``replay``, on the CPU,
    evaluated ``batch_size`` rows at a time (None: all at once)."""
    with torch.no_grad():
        return torch.cat(
            [
                ref_policy.evaluate({k: v[i].to(device) for k, v in replay.items()}).log_probs.cpu()
                for i in torch.arange(num_rows).split(batch_size or num_rows)
            ]
        )


def _sil_share(
    sil: SuccessBuffer, batch_size: int, generator: torch.Generator | None, num_elements: int
) -> tuple[tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]:
    """Data parallel: this rank's share of a minibatch's self-imitation rows, and the loss
    entries of all of them (the NLL's denominator over all ranks).

    The ``batch_size`` rows (the minibatch's over all ranks) are drawn whole, the same on every
    rank, and rank r takes its contiguous slice: together the ranks evaluate the rows that one
    process would draw with ``generator``. A rank whose slice is empty (fewer rows than ranks)
    evaluates one row with no executed sub-step, so that it still runs forward and backward.
    """
    drawn = sil.draw(batch_size, generator)
    weight_sum = torch.tensor(float(sil.valid[drawn].sum()) * num_elements)
    mine = parallel.shard(batch_size, parallel.rank(), parallel.world_size())
    if len(mine) == 0:
        replay, valid, weights = sil.rows(drawn[:1])
        return (replay, torch.zeros_like(valid), weights), weight_sum
    return sil.rows(drawn[mine.start : mine.stop]), weight_sum
