"""Rollout collection: drive any ``gymnasium.vector.VectorEnv`` with an ``ActionChunkPolicy``.

The env may be chunked (``trainers.env_contract``: ``single_action_space`` a ``Box`` of shape
``(K, D)``, as ours) or plain (``(D,)`` Box, ``Discrete``, ``MultiDiscrete``: the policy then has
K = 1), in any autoreset mode (read from ``env.metadata["autoreset_mode"]``):

* NEXT_STEP (gymnasium's default): the step after a done only resets that env and ignores its
  action. That transition is not a decision: it is stored with ``valid = False`` and its
  observation starts the new episode. A truncated episode's final obs is the obs the policy sees
  on that reset step, so its value from that ``act`` call is the bootstrap value.
* SAME_STEP: the env resets in the done step; ``info["final_obs"]`` holds the last obs, whose value
  is computed to bootstrap a truncation.
* DISABLED: finished envs stay finished. With ``reset_finished=True`` (the default, needed by
  gymnasium's own vector envs, which refuse to step a finished env) the collector resets them with
  ``reset(options={"reset_mask": done})`` after the step; with ``False`` they stay frozen (ours
  allow stepping them: nothing runs) and are masked until ``Collector.reset`` (GRPO). With
  ``start_frames`` the collector chooses where they restart (a curriculum: ``trainers/curriculum.py``).

Where the env reports ``info["initial_frame_id"]`` at its resets (ours do), each ended episode says
which start frame it came from (``frame``).

Per step t the rollout stores what the policy did on obs_t and what the env gave back for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from nets.errors import BadInput
from policies.base import ActionChunk, ActionChunkPolicy
from policies.torsos import OBS_PREFIX
from trainers import parallel
from trainers.env_contract import chunk_detail, chunk_size, episode_stats, start_ids

Bootstrap = Literal["truncated", "done", "none"]

# env seeds of a resumed run: seed + stride * iteration (new episodes, not the first run's again)
RESUME_SEED_STRIDE = 7919


@dataclass
class Rollout:
    """T steps of N envs. K sub-steps per chunk, E log-prob elements, Kv values per step.

    Attributes:
        replay: the policy's replay records stacked over time, each ``[T, N, ...]``.
        actions: env-unit actions ``[T, N, K, D]`` as the policy returned them.
        log_probs: element log-probs ``[T, N, K, E]`` at collection time (zeros if deterministic).
        values: ``[T, N, Kv]`` or None (policy without a critic).
        rewards: ``[T, N, K]`` per executed sub-step (0 elsewhere).
        valid: ``[T, N, K]`` sub-step executed in an episode (False on NEXT_STEP reset steps, for
            frozen envs, and after a done inside a chunk).
        terminated, truncated: ``[T, N]`` the episode ended in this step.
        first_episode: ``[T, N, K]`` valid and no done in an earlier step of this rollout (GRPO:
            one episode per env; the step that ends the episode is included).
        bootstrap_values: ``[T, N]`` V(final obs) of the episodes that ended in this step and are
            bootstrapped (truncated ones by default), 0 elsewhere.
        last_values: ``[N, Kv]`` V(obs after the last step), or None without a critic.
        episodes: one dict per episode that ended (``return``, ``length`` and whatever the env
            reports: ``success``, ``success_once``...), with ``env`` (index) and ``step`` (t).
        observations: with ``collect(record_obs=True)``, the env's batched observation each step's
            action was chosen from (a list of T), else None.
        final_observations: with ``record_obs``, the last observation of every episode that ended,
            keyed by ``(t, env)`` (one env's observation, unbatched), else None.
    """

    replay: dict[str, torch.Tensor]
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor | None
    rewards: torch.Tensor
    valid: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    first_episode: torch.Tensor
    bootstrap_values: torch.Tensor
    last_values: torch.Tensor | None
    episodes: list[dict[str, float]] = field(default_factory=list)
    observations: list[Any] | None = None
    final_observations: dict[tuple[int, int], Any] | None = None

    @property
    def num_steps(self) -> int:
        return self.rewards.shape[0]

    @property
    def num_envs(self) -> int:
        return self.rewards.shape[1]

    @property
    def chunk_size(self) -> int:
        return self.rewards.shape[2]

    @property
    def dones(self) -> torch.Tensor:
        return self.terminated | self.truncated


def update_running_obs_stats(policy: ActionChunkPolicy, rollout: Rollout) -> None:
    """Observation normalisation of a policy built with ``obs_norm="running"``: merge the vector
    observations of the rollout's executed chunk-steps (every rank's) into its statistics. Called
    after the update that used the rollout, so acting and re-evaluating it saw the same ones."""
    if getattr(policy, "obs_norm", "off") != "running":
        return
    rows = rollout.valid.any(-1).reshape(-1)
    obs = {
        key[len(OBS_PREFIX) :]: parallel.all_gather_cat(
            value.reshape(-1, *value.shape[2:])[rows.to(value.device)]
        )
        for key, value in rollout.replay.items()
        if key.startswith(OBS_PREFIX) and value.is_floating_point()
    }
    policy.update_obs_stats(obs)


def env_name(env: gym.vector.VectorEnv) -> str:
    """The env's registered id if it has one, else its class name (for error messages)."""
    spec = getattr(env, "spec", None)
    return getattr(spec, "id", None) or type(env).__name__


def episode_summary(episodes: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean of every numeric statistic over ``episodes`` (``env``/``step``/``frame``, where the
    episode ran, left out), plus their count."""
    out: dict[str, float] = {"episodes": float(len(episodes))}
    numeric = {k for ep in episodes for k, v in ep.items() if isinstance(v, int | float | np.number)}
    keys = sorted(numeric - {"env", "step", "frame"})
    for key in keys:
        vals = [ep[key] for ep in episodes if key in ep]
        out[key] = float(np.mean(vals))
    return out


class Collector:
    """Keeps a vector env's current observation and per-env state across ``collect`` calls.

    Args:
        env: any ``gymnasium.vector.VectorEnv``.
        policy: an ``ActionChunkPolicy``; ``act`` gets the env's batched observation as is.
        bootstrap: which ended episodes get ``V(final obs)`` stored for the trainer to bootstrap:
            ``"truncated"`` (SB3, RLinf "standard"), ``"done"`` (RLinf "always") or ``"none"``.
        reset_finished: DISABLED mode only: reset finished envs after each step (True) or leave
            them frozen until ``reset`` (False).
        clip_actions: clip ``Box`` actions to the bounds before ``env.step`` (as SB3 does).
        storage_device: where the rollout's tensors live.
        start_frames: DISABLED mode with ``reset_finished`` only: ``start_frames(n)`` gives where the
            ``n`` finished envs restart, in env order: start frame ids (``env.initial_frames``) or
            frames the env takes (ours: ``InitialFrame``s); else the env draws.
    """

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        policy: ActionChunkPolicy,
        *,
        bootstrap: Bootstrap = "truncated",
        reset_finished: bool = True,
        clip_actions: bool = True,
        storage_device: str | torch.device = "cpu",
        start_frames: Callable[[int], Sequence[int]] | None = None,
    ) -> None:
        if bootstrap not in ("truncated", "done", "none"):
            raise BadInput(f"bootstrap must be 'truncated', 'done' or 'none', got {bootstrap!r}")
        self.env, self.policy = env, policy
        self.num_envs = int(env.num_envs)
        mode = env.metadata.get("autoreset_mode", getattr(env, "autoreset_mode", AutoresetMode.NEXT_STEP))
        self.autoreset_mode = AutoresetMode(mode)
        restarts_itself = self.autoreset_mode == AutoresetMode.DISABLED and reset_finished
        if start_frames is not None and not restarts_itself:
            raise BadInput(
                f"Collector start_frames restart finished envs itself: the env's autoreset mode must be "
                f"DISABLED with reset_finished=True, got {self.autoreset_mode.name}, "
                f"reset_finished={reset_finished}"
            )
        self.start_frames = start_frames
        self.bootstrap = bootstrap
        self.reset_finished = reset_finished
        self.clip_actions = clip_actions
        self.device = torch.device(storage_device)

        space = env.single_action_space
        k = chunk_size(env)
        self.chunked = k is not None
        self.env_chunk_size = k or 1
        # what policy.act must return per env, [K, D], and the Box bounds as arrays (per-step work)
        self._chunk_shape = tuple(space.shape) if self.chunked else (1, max(int(np.prod(space.shape)), 1))
        self._box = isinstance(space, gym.spaces.Box)
        self._low = np.asarray(space.low) if self._box else None
        self._high = np.asarray(space.high) if self._box else None

        n = self.num_envs
        self.obs: Any = None
        self._pending_reset = np.zeros(n, bool)  # NEXT_STEP: env resets on the next step
        self._frozen = np.zeros(n, bool)  # DISABLED, not reset: finished and waiting
        self._ep_return = np.zeros(n, np.float64)
        self._ep_length = np.zeros(n, np.int64)
        self._frame = np.full(n, -1, np.int64)  # each env's start frame id, where the env says (-1: not)

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int | list[int] | None = None, options: dict[str, Any] | None = None) -> Any:
        """Reset all envs (or the ones in ``options["reset_mask"]``) and the collector's per-env state."""
        options = dict(options) if options else None
        mask = np.ones(self.num_envs, bool)
        if options and options.get("reset_mask") is not None:
            mask = np.asarray(options["reset_mask"], bool)
        self.obs, info = self.env.reset(seed=seed, options=options)
        self._frame[mask] = -1
        self._note_frames(info)
        self._pending_reset[mask] = False
        self._frozen[mask] = False
        self._ep_return[mask] = 0.0
        self._ep_length[mask] = 0
        return self.obs

    # ------------------------------------------------------------------ collect
    def collect(
        self,
        num_steps: int,
        *,
        deterministic: bool = False,
        until_all_done: bool = False,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        record_obs: bool = False,
    ) -> Rollout:
        """Run ``num_steps`` policy steps (fewer with ``until_all_done``, which stops once every env
        finished an episode in this call) and return what was collected. ``on_step(info)`` is called
        after every ``env.step`` with its info (e.g. to grab ``env.render()`` for a video, or the
        sub-step frames of ``info["frames"]``); ``record_obs`` keeps the observations the policy
        acted on (``Rollout.observations``, e.g. for demonstrations) and the last observation of
        every episode that ended (``Rollout.final_observations``)."""
        if num_steps < 1:
            raise BadInput(f"num_steps must be >= 1, got {num_steps}")
        if self.obs is None:
            self.reset()
        n, policy = self.num_envs, self.policy
        steps: list[dict[str, Any]] = []
        episodes: list[dict[str, float]] = []
        ever_done = np.zeros(n, bool)
        pending_boot: list[tuple[int, int]] = []  # NEXT_STEP: (t, env) waiting for V(final obs)
        observed: list[Any] | None = [] if record_obs else None
        finals: dict[tuple[int, int], Any] | None = {} if record_obs else None

        for t in range(num_steps):
            if observed is not None:
                observed.append(self.obs)
            with torch.no_grad():
                out = policy.act(self.obs, deterministic=deterministic)
            actions = self._check_actions(out)
            values = None if out.value is None else out.value.detach().float().to(self.device)
            boot = torch.zeros(n, device=self.device)
            if pending_boot and values is not None:  # NEXT_STEP: this obs was the final obs
                for t_done, i in pending_boot:
                    steps[t_done]["boot"][i] = values[i, 0]
            pending_boot = []

            skipped = self._pending_reset | self._frozen  # action ignored by the env
            next_obs, reward, term, trunc, info = self.env.step(self._to_env(actions))
            if on_step is not None:
                on_step(info)
            self._check_step(reward, term, trunc)
            try:
                rewards, valid = chunk_detail(info, reward, n, actions.shape[1])
            except ValueError as e:
                raise BadInput(f"env {env_name(self.env)}: {e}") from None
            term, trunc = np.asarray(term, bool).copy(), np.asarray(trunc, bool).copy()
            if skipped.any():
                rewards[skipped], valid[skipped], term[skipped], trunc[skipped] = 0.0, False, False, False
            done = term | trunc

            # episode statistics: our own, overridden by what the env reports
            self._ep_return += rewards.sum(1)
            self._ep_length += valid.sum(1)
            reported = episode_stats(info)
            for i in np.flatnonzero(done):
                ep = {"return": float(self._ep_return[i]), "length": float(self._ep_length[i])}
                ep.update(reported.get(i, {}))
                if self._frame[i] >= 0:
                    ep["frame"] = int(self._frame[i])
                episodes.append({**ep, "env": float(i), "step": float(t)})
            self._ep_return[done], self._ep_length[done] = 0.0, 0
            self._frame[done] = -1
            self._note_frames(info)  # SAME_STEP and NEXT_STEP autoresets start new episodes here
            if finals is not None:  # before a DISABLED reset below replaces next_obs
                same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
                for i in np.flatnonzero(done).tolist():
                    finals[(t, i)] = info["final_obs"][i] if same_step else _take_obs(next_obs, i)

            # bootstrap values of the episodes that ended here
            wanted = trunc if self.bootstrap == "truncated" else done
            if self.bootstrap != "none" and values is not None and wanted.any():
                idx = np.flatnonzero(wanted)
                if self.autoreset_mode == AutoresetMode.NEXT_STEP:
                    pending_boot = [(t, int(i)) for i in idx]
                elif self.autoreset_mode == AutoresetMode.SAME_STEP:
                    final = _stack_obs([info["final_obs"][i] for i in idx])
                    boot[torch.as_tensor(idx)] = self._value(final)
                else:
                    boot[torch.as_tensor(idx)] = self._value(_take_obs(next_obs, idx))

            # autoreset bookkeeping
            if self.autoreset_mode == AutoresetMode.NEXT_STEP:
                self._pending_reset = done
            elif self.autoreset_mode == AutoresetMode.DISABLED:
                if self.reset_finished and done.any():
                    options: dict[str, Any] = {"reset_mask": done.copy()}
                    if self.start_frames is not None:
                        options["initial_frames"] = start_ids(self.start_frames(int(done.sum())))
                    next_obs, reset_info = self.env.reset(options=options)
                    self._note_frames(reset_info)
                else:
                    self._frozen |= done
            self.obs = next_obs

            steps.append(
                {
                    "replay": {k: v.detach().to(self.device) for k, v in out.replay.items()},
                    "actions": actions,
                    "log_probs": self._log_probs(out, actions.shape[1]),
                    "values": values,
                    "rewards": rewards,
                    "valid": valid,
                    "terminated": term,
                    "truncated": trunc,
                    "boot": boot,
                }
            )
            ever_done |= done
            if until_all_done and ever_done.all():
                break

        last_values = None
        if steps[0]["values"] is not None:
            last_values = self._value(self.obs, full=True)
            for t_done, i in pending_boot:
                steps[t_done]["boot"][i] = last_values[i, 0]
        rollout = self._assemble(steps, last_values, episodes)
        rollout.observations = observed
        rollout.final_observations = finals
        return rollout

    # ------------------------------------------------------------------ helpers
    def _note_frames(self, info: dict[str, Any]) -> None:
        """Remember the start frame of every env the env says it (re)started (``initial_frame_id``)."""
        ids, mask = info.get("initial_frame_id"), info.get("_initial_frame_id")
        if ids is None or mask is None:
            return
        for i in np.flatnonzero(np.asarray(mask, bool)):
            self._frame[i] = int(np.asarray(ids)[i])

    def _check_actions(self, out: ActionChunk) -> np.ndarray:
        a = out.actions.detach().float().cpu().numpy()
        if a.shape[1:] == self._chunk_shape and a.shape[0] == self.num_envs:
            return a
        if a.ndim != 3 or a.shape[0] != self.num_envs:
            raise BadInput(
                f"policy.act returned actions of shape {a.shape}, expected [N={self.num_envs}, K, D]"
            )
        space = self.env.single_action_space
        if self.chunked:
            raise BadInput(
                f"policy chunk {a.shape[1:]} does not match the chunked action space {space.shape} "
                f"of env {env_name(self.env)}"
            )
        raise BadInput(
            f"env {env_name(self.env)} takes one action of shape {space.shape} per step, so the policy must "
            f"return [N, 1, {self._chunk_shape[1]}]; got {list(a.shape)}"
        )

    def _check_step(self, reward: Any, term: Any, trunc: Any) -> None:
        """The env must return one reward / terminated / truncated per env, finite rewards."""
        n = self.num_envs
        for name, value in (("reward", reward), ("terminated", term), ("truncated", trunc)):
            shape = np.shape(value)
            if shape != (n,):
                raise BadInput(
                    f"env {env_name(self.env)}: step returned {name} of shape {shape}, expected ({n},)"
                )
        if not np.isfinite(reward).all():
            raise BadInput(f"env {env_name(self.env)}: step returned non-finite rewards {np.asarray(reward)}")

    def _to_env(self, actions: np.ndarray) -> np.ndarray:
        """Policy actions ``[N, K, D]`` -> the env's batched action (chunk, vector or integer)."""
        space = self.env.single_action_space
        a = actions if self.chunked else actions[:, 0].reshape(self.num_envs, *space.shape)
        if self._box:
            a = a.astype(space.dtype, copy=False)
            return np.minimum(np.maximum(a, self._low), self._high) if self.clip_actions else a
        return np.rint(a).astype(space.dtype)  # Discrete, MultiDiscrete, MultiBinary

    def _log_probs(self, out: ActionChunk, k: int) -> torch.Tensor:
        if out.log_probs is not None:
            return out.log_probs.detach().float().to(self.device)
        return torch.zeros(self.num_envs, k, getattr(self.policy, "log_prob_dim", 1), device=self.device)

    def _value(self, obs: Any, full: bool = False) -> torch.Tensor:
        """``policy.value(obs)`` on the storage device: ``[B, Kv]`` if ``full``, else its first column."""
        with torch.no_grad():
            v = self.policy.value(obs).detach().float().to(self.device)
        return v if full else v[:, 0]

    def _assemble(
        self, steps: list[dict[str, Any]], last_values: torch.Tensor | None, episodes: list[dict[str, float]]
    ) -> Rollout:
        def stack_np(key: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(np.stack([s[key] for s in steps]), dtype=dtype, device=self.device)

        valid = stack_np("valid", torch.bool)
        terminated, truncated = stack_np("terminated", torch.bool), stack_np("truncated", torch.bool)
        done = (terminated | truncated).long()
        done_before = done.cumsum(0) - done
        keys = steps[0]["replay"].keys()
        return Rollout(
            replay={k: torch.stack([s["replay"][k] for s in steps]) for k in keys},
            actions=stack_np("actions", torch.float32),
            log_probs=torch.stack([s["log_probs"] for s in steps]),
            values=None if last_values is None else torch.stack([s["values"] for s in steps]),
            rewards=stack_np("rewards", torch.float32),
            valid=valid,
            terminated=terminated,
            truncated=truncated,
            first_episode=valid & (done_before == 0)[..., None],
            bootstrap_values=torch.stack([s["boot"] for s in steps]).to(self.device),
            last_values=last_values,
            episodes=episodes,
        )


# ---------------------------------------------------------------------- observation and info utilities
def _stack_obs(items: list[Any]) -> Any:
    """Batch single observations (arrays, dicts of them, strings) the way vector envs do."""
    first = items[0]
    if isinstance(first, dict):
        return {k: _stack_obs([it[k] for it in items]) for k in first}
    if isinstance(first, str):
        return tuple(items)
    if isinstance(first, tuple):
        return tuple(_stack_obs([it[j] for it in items]) for j in range(len(first)))
    return np.stack([np.asarray(it) for it in items])


def _take_obs(obs: Any, idx: np.ndarray | int) -> Any:
    """The entries ``idx`` of a batched observation (an int: that env's own, unbatched)."""
    if isinstance(obs, dict):
        return {k: _take_obs(v, idx) for k, v in obs.items()}
    if isinstance(obs, tuple | list) and (not obs or isinstance(obs[0], str)):
        return obs[idx] if isinstance(idx, int) else tuple(obs[i] for i in idx)
    if isinstance(obs, tuple):
        return tuple(_take_obs(v, idx) for v in obs)
    return obs[torch.as_tensor(idx) if isinstance(obs, torch.Tensor) and not isinstance(idx, int) else idx]
