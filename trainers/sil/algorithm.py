"""Self-imitation from success: its settings, the buffer of ended episodes' chunk-steps, one update.

The update is the policy's own imitation loss (Gaussian NLL, flow matching, a VLA's L1...) on a
minibatch of ``batch_size`` chunk-steps: ``prior_ratio`` of them drawn from the prior
demonstrations and the rest from the successful episodes the policy collected itself (all from the
prior data until the first success; all from the successes when there is no prior data).

With ``failure_share`` > 0 (an outcome-conditioned flow policy: ``outcome_conditioned``) that share
of the minibatch comes from failed episodes, and every row is labelled with its outcome (the prior
data and the successes: success; the rest: failure), a random ``unconditioned_share`` of them
unlabelled. The policy then learns what success and failure look like and what any episode looks
like, and acts with classifier-free guidance towards success (``guidance``; CFGRL, Frans et al.,
2025): the failures, which plain self-imitation throws away, tell it which way not to go.

With ``value_weighting`` the successes are drawn as Oh et al.'s (2018) self-imitation weighs them,
in proportion to ``max(R - V(s), 0) = 1 - V(s)``, with V learned from every ended episode
(``trainers/sil/value.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput
from policies.flow import OUTCOMES
from trainers.bc import batch_obs
from trainers.optim import BadUpdateGuard, WeightEMA, step_optimizer


@dataclass
class SILConfig:
    prior_data: str | None = None
    """demonstrations imitated beside the successes (our demos file, LIBERO HDF5, LeRobot v3)"""
    prior_ratio: float = 0.5
    """share of each minibatch drawn from the prior data once there are successes"""
    steps_per_iteration: int = 16
    """vector steps collected per iteration (each env chooses and executes one chunk per step)"""
    updates_per_iteration: int = 16
    """gradient steps after each iteration's collection (async: at most this many while the
    iteration's vector steps are stepped; fewer when the envs are faster than the learner)"""
    learning_starts: int = 0
    """successful chunk-steps collected before the first update (0: update from the first iteration)"""
    warmup_updates: int = 0
    """updates on the prior data alone before the first env step (0: none): imitation of the demos,
    which costs no env steps, so that self-imitation starts from a longer clone within the same
    budget (their time counts in ``max_minutes``)"""
    batch_size: int = 512
    """chunk-steps per minibatch"""
    learning_rate: float = 1e-3
    """Adam's step size"""
    max_grad_norm: float = 1.0
    """clip the gradient norm (0: no clipping)"""
    ema_decay: float = 0.999
    """exponential moving average of the weights, which collect, are evaluated and saved (0: off; the
    trained weights travel in the checkpoint for --resume)"""
    buffer_size: int = 200_000
    """successful chunk-steps kept (the oldest leave first); as many failed ones with ``failure_share``
    or ``value_weighting``"""
    failure_share: float = 0.0
    """share of each minibatch drawn from failed episodes and labelled failure, once there are some
    (0: failures are not kept; > 0 needs an outcome-conditioned flow policy: ``--policy-kwargs
    '{"outcome_conditioned": true, "guidance": 2.0}'``)"""
    unconditioned_share: float = 0.1
    """outcome-conditioned policies: share of each minibatch's rows whose outcome label is dropped,
    so that the policy also learns the unconditioned velocity that guidance steers away from"""
    balance_tasks: bool = False
    """draw the minibatch's successful rows so that every task (told apart by the ``instruction``
    observation: each wording counts as a task) is equally likely, however many of its episodes
    succeeded (default: every row the same, so tasks that often succeed dominate those that rarely
    do); the ``prior_ratio`` share is drawn from the prior data as before"""
    value_weighting: bool = False
    """Oh et al.'s self-imitation weights (``trainers/sil/value.py``): a success's chunk-step is drawn
    in proportion to ``1 - V(s)``, V the learned chance that the policy succeeds from its observation
    (trained on the chunk-steps of every ended episode, so failures are kept): what the policy would
    have done anyway weighs little, successes from states where it usually fails weigh most"""
    value_every: int = 4
    """value_weighting: one update of V (a minibatch of ``batch_size``) every this many policy updates;
    the weights are recomputed over the whole success buffer once per iteration"""
    task_curriculum: bool = False
    """start more episodes on the tasks the policy fails (``trainers/curriculum.py``): a task is drawn
    in proportion to ``max(1 - p, curriculum_floor)``, p its success rate over its last
    ``curriculum_window`` episodes, then one of its start frames (default: the env draws every frame
    alike); needs start frames that name their task (ours do)"""
    curriculum_floor: float = 0.1
    """task_curriculum: the least weight a task keeps, in (0, 1] (1: every task alike)"""
    curriculum_window: int = 50
    """task_curriculum: how many of a task's latest episodes its success rate counts"""
    failure_restarts: float = 0.0
    """share of the restarts (in [0, 1)) that continue a recent failed episode from one of its
    states instead of starting at a start frame (``trainers/restarts.py``): practice where the
    policy goes wrong; the env must report ``info["restart_frame"]`` (LIBERO: ``env_kwargs``
    ``restart_frames_in_info`` true). 0: off"""
    restart_pool: int = 256
    """failure_restarts: how many of the latest failed episodes' states are kept to restart in"""
    restart_depth: float = 1.0
    """failure_restarts: how far into a failed episode a restart may go, in [0, 1] (1: any of its
    chunk boundaries; 0: the first, one chunk in: the start it failed from, replayed)"""
    deterministic_collect: bool = False
    """collect with the policy's deterministic actions (default: sampled, which explores)"""
    placebo: bool = False
    """control: the success flags of each iteration's finished episodes are shuffled among them
    (same number kept, chosen without the reward)"""
    max_bad_updates: int = 10
    """stop after this many non-finite updates in a row"""
    # -- the async loop (run.loop "async": trainers/actors/, trainers/sil/actors.py)
    max_policy_lag: int = 64
    """async: a chunk is chosen with weights at most this many learner updates old (0: the newest)"""
    weight_sync_every: int = 8
    """async: learner updates between two copies of the weights (the average) to the actor process"""
    actor_nice: int = 19
    """async: niceness (0-19) added to the actor process and its env workers, so the learner has its
    core whenever it can use it and the envs take every cycle it leaves"""

    def __post_init__(self) -> None:
        if not 0.0 <= self.prior_ratio < 1.0:
            raise BadInput(f"sil prior_ratio must be in [0, 1), got {self.prior_ratio}")
        if not 0.0 <= self.failure_share < 1.0 or self.prior_ratio + self.failure_share >= 1.0:
            raise BadInput(
                f"sil failure_share must be in [0, 1) with prior_ratio + failure_share < 1 (some rows are "
                f"successes), got {self.failure_share} beside prior_ratio {self.prior_ratio}"
            )
        if not 0.0 <= self.unconditioned_share <= 1.0:
            raise BadInput(f"sil unconditioned_share must be in [0, 1], got {self.unconditioned_share}")
        for name in ("steps_per_iteration", "batch_size", "buffer_size"):
            if getattr(self, name) < 1:
                raise BadInput(f"sil {name} must be >= 1, got {getattr(self, name)}")
        if self.updates_per_iteration < 0 or self.learning_starts < 0 or self.warmup_updates < 0:
            raise BadInput("sil updates_per_iteration, learning_starts and warmup_updates must be >= 0")
        if self.warmup_updates and not self.prior_data:
            raise BadInput(f"sil warmup_updates ({self.warmup_updates}) imitate prior_data: set it")
        if not self.learning_rate > 0 or self.max_grad_norm < 0:
            raise BadInput("sil learning_rate must be > 0 and max_grad_norm >= 0")
        if not 0.0 <= self.ema_decay < 1.0:
            raise BadInput(f"sil ema_decay must be in [0, 1) (0: no averaging), got {self.ema_decay}")
        if self.value_every < 1:
            raise BadInput(f"sil value_every must be >= 1, got {self.value_every}")
        if self.value_weighting and self.balance_tasks:
            raise BadInput("sil value_weighting and balance_tasks both set how successes are drawn: pick one")
        if not 0.0 < self.curriculum_floor <= 1.0 or self.curriculum_window < 1:
            raise BadInput(
                f"sil curriculum_floor must be in (0, 1] and curriculum_window >= 1, got "
                f"{self.curriculum_floor} and {self.curriculum_window}"
            )
        if self.task_curriculum and self.placebo:
            raise BadInput("sil placebo chooses without the reward, but task_curriculum reads it: pick one")
        if not 0.0 <= self.failure_restarts < 1.0 or self.restart_pool < 1:
            raise BadInput(
                f"sil failure_restarts must be in [0, 1) and restart_pool >= 1, got "
                f"{self.failure_restarts} and {self.restart_pool}"
            )
        if not 0.0 <= self.restart_depth <= 1.0:
            raise BadInput(f"sil restart_depth must be in [0, 1], got {self.restart_depth}")
        if self.failure_restarts and self.placebo:
            raise BadInput("sil placebo chooses without the reward, but failure_restarts reads it: pick one")
        if self.max_policy_lag < 0:
            raise BadInput(f"sil max_policy_lag must be >= 0, got {self.max_policy_lag}")
        if self.weight_sync_every < 1:
            raise BadInput(f"sil weight_sync_every must be >= 1, got {self.weight_sync_every}")
        if not 0 <= self.actor_nice <= 19:
            raise BadInput(f"sil actor_nice must be in [0, 19], got {self.actor_nice}")


class ChunkRows:
    """Chunk-steps of ended episodes (the successful ones, or the failed ones), as imitation data:
    ``obs`` (``{key: [M, ...]}``, text keys as lists), ``actions`` ``[M, K, D]``, ``valid``
    ``[M, K]``, and ``lags`` ``[M]`` (the learner updates between the weights that chose each chunk
    and the choice: 0 in the sync loop); at most ``capacity`` rows (FIFO)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.obs: dict[str, Any] = {}
        self.actions = np.zeros((0, 0, 0), np.float32)
        self.valid = np.zeros((0, 0), bool)
        self.lags = np.zeros(0, np.int64)
        self.tasks = np.zeros(0, np.int64)  # each row's task: its instruction's index in task_ids
        self.task_ids: dict[str, int] = {}
        self._task_p: np.ndarray | None = None  # balanced draw probabilities, until rows change
        self.episodes = 0  # episodes added, over the whole run
        self.rows_added = 0  # chunk-steps added, over the whole run

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def data(self) -> dict[str, Any]:
        """The rows as imitation data (``obs``, ``actions``, ``valid``), as ``take`` reads them."""
        return {"obs": self.obs, "actions": self.actions, "valid": self.valid}

    def add(self, rows: list[tuple[dict[str, Any], np.ndarray, np.ndarray, int]]) -> None:
        """One ended episode's chunk-steps: ``(obs_row, action [K, D], valid [K], lag)`` each."""
        if not rows:
            return
        keys = list(rows[0][0])
        new_obs = {
            k: [r[0][k] for r in rows]
            if isinstance(rows[0][0][k], str)
            else np.stack([r[0][k] for r in rows])
            for k in keys
        }
        actions = np.stack([r[1] for r in rows]).astype(np.float32)
        valid = np.stack([r[2] for r in rows]).astype(bool)
        lags = np.array([r[3] for r in rows], np.int64)
        tasks = self._task_of(new_obs)
        if not len(self):
            self.obs, self.actions, self.valid, self.lags, self.tasks = new_obs, actions, valid, lags, tasks
        else:
            self.obs = {
                k: (self.obs[k] + v) if isinstance(v, list) else np.concatenate([self.obs[k], v])
                for k, v in new_obs.items()
            }
            self.actions = np.concatenate([self.actions, actions])
            self.valid = np.concatenate([self.valid, valid])
            self.lags = np.concatenate([self.lags, lags])
            self.tasks = np.concatenate([self.tasks, tasks])
        drop = len(self) - self.capacity
        if drop > 0:
            self.obs = {k: v[drop:] for k, v in self.obs.items()}
            self.actions, self.valid, self.lags = self.actions[drop:], self.valid[drop:], self.lags[drop:]
            self.tasks = self.tasks[drop:]
        self._task_p = None
        self.episodes += 1
        self.rows_added += len(rows)

    def _task_of(self, obs: dict[str, Any]) -> np.ndarray:
        """Task indices of rows ``obs`` (all 0 without an ``instruction`` observation)."""
        texts = obs.get("instruction")
        if not isinstance(texts, list):
            return np.zeros(len(next(iter(obs.values()))), np.int64)
        return np.array([self.task_ids.setdefault(t, len(self.task_ids)) for t in texts], np.int64)

    def sample(
        self, n: int, rng: np.random.Generator, balance_tasks: bool = False, weights: np.ndarray | None = None
    ) -> np.ndarray:
        """``n`` row indices drawn with replacement: uniformly, with ``balance_tasks`` each task
        (instruction) equally likely and its rows uniformly within it, or in proportion to
        ``weights`` (one per row, >= 0, as ``value_weighting`` gives them)."""
        if weights is not None:
            if weights.shape != (len(self),):
                raise BadInput(f"sample weights: expected one per row ({len(self)}), got {weights.shape}")
            p = weights + 1e-9  # never all zero
            return rng.choice(len(self), size=n, p=p / p.sum())
        if not balance_tasks:
            return rng.integers(len(self), size=n)
        if not self.task_ids:
            raise BadInput("sil balance_tasks tells tasks apart by the 'instruction' observation: none seen")
        if self._task_p is None:  # once per change of the rows, not per update
            weights = 1.0 / np.bincount(self.tasks)[self.tasks]
            self._task_p = weights / weights.sum()
        return rng.choice(len(self), size=n, p=self._task_p)

    def state_dict(self) -> dict[str, Any]:
        counts = {"episodes": self.episodes, "rows_added": self.rows_added}
        if not len(self):  # nothing added yet: no arrays (their shapes come with the first episode)
            return counts
        return {"obs": self.obs, "actions": self.actions, "valid": self.valid, "lags": self.lags, **counts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "actions" not in state:  # saved empty
            self.__init__(self.capacity)
            self.episodes = int(state["episodes"])
            self.rows_added = int(state.get("rows_added", 0))
            return
        n = len(state["actions"])
        lags = state.get("lags", np.zeros(n, np.int64))  # (saved before lags were kept: sync, 0)
        if len(state["valid"]) != n or len(lags) != n or any(len(v) != n for v in state["obs"].values()):
            raise BadInput("self-imitation buffer state: obs, actions, valid and lags differ in length")
        self.obs, self.actions, self.valid = dict(state["obs"]), state["actions"], state["valid"]
        self.lags = np.asarray(lags, np.int64)
        self.task_ids = {}
        self.tasks = self._task_of(self.obs)  # relabelled, the same groups: the same draws
        self._task_p = None
        self.episodes = int(state["episodes"])
        self.rows_added = int(state.get("rows_added", n))


def chosen(successes: list[bool], placebo: bool, generator: torch.Generator) -> list[bool]:
    """Which finished episodes join the buffer: the successful ones, or with ``placebo`` the same
    number chosen without the reward (the flags shuffled among the episodes)."""
    if not placebo or not successes:
        return list(successes)
    return [successes[j] for j in torch.randperm(len(successes), generator=generator).tolist()]


def take(data: dict[str, Any], idx: np.ndarray) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """Rows ``idx`` of imitation data (``ChunkRows`` or ``Demos.chunks``): obs, actions, valid."""
    obs = batch_obs(data["obs"], idx)
    return obs, torch.as_tensor(data["actions"][idx]), torch.as_tensor(data["valid"][idx])


def concat_obs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Observation batches (as ``take`` gives them) joined row-wise; text keys stay lists."""
    return {
        k: sum((p[k] for p in parts), []) if isinstance(parts[0][k], list)
        else np.concatenate([p[k] for p in parts])
        for k in parts[0]
    }  # fmt: skip


def sil_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    prior: dict[str, Any] | None,
    successes: ChunkRows,
    config: SILConfig,
    rng: np.random.Generator,
    guard: BadUpdateGuard,
    ema: WeightEMA | None,
    failures: ChunkRows | None = None,
    success_weights: np.ndarray | None = None,
) -> dict[str, torch.Tensor]:
    """One gradient step of the imitation loss on a minibatch mixing prior, successful and (with
    ``failures`` and ``failure_share``) failed rows; an outcome-conditioned policy gets their labels.
    ``success_weights`` (one per success row: ``value_weighting``) draws the successes in proportion."""
    n_prior = len(prior["actions"]) if prior is not None else 0
    n_fail = len(failures) if failures is not None else 0
    from_failures = round(config.batch_size * config.failure_share) if n_fail else 0
    rest = config.batch_size - from_failures
    if n_prior and len(successes):
        from_prior = round(config.batch_size * config.prior_ratio)
    else:
        from_prior = rest if n_prior else 0
    parts, labels = [], []
    if from_prior:
        parts.append(take(prior, rng.integers(n_prior, size=from_prior)))
        labels.append(np.full(from_prior, OUTCOMES["success"]))
    if rest - from_prior:
        picked = successes.sample(rest - from_prior, rng, config.balance_tasks, success_weights)
        parts.append(take(successes.data, picked))
        labels.append(np.full(rest - from_prior, OUTCOMES["success"]))
    if from_failures:
        parts.append(take(failures.data, failures.sample(from_failures, rng, config.balance_tasks)))
        labels.append(np.full(from_failures, OUTCOMES["failure"]))
    obs = concat_obs([p[0] for p in parts])
    actions = torch.cat([p[1] for p in parts])
    valid = torch.cat([p[2] for p in parts])
    if getattr(policy, "outcome_conditioned", False):
        outcome = np.concatenate(labels)
        outcome[rng.random(len(outcome)) < config.unconditioned_share] = OUTCOMES["none"]
        loss = policy.imitation_loss(obs, actions, valid, outcome=torch.as_tensor(outcome, dtype=torch.long))
    else:
        loss = policy.imitation_loss(obs, actions, valid)
    stepped, norm = step_optimizer(loss, optimizer, config.max_grad_norm or None, guard)
    if stepped and ema is not None:
        ema.update()
    return {
        "sil_loss": loss.detach(),
        "grad_norm": norm,
        "prior_share": torch.tensor(from_prior / config.batch_size),
        "failure_share": torch.tensor(from_failures / config.batch_size),
    }
