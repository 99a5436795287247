"""What every training run needs besides its algorithm: the env (``RunConfig.make_env``) and policy
(``trainers/checkpoint.py``) built from names, the run directory (``trainers/run_folder.py``),
seeding, metrics and resume. Evaluation, checkpoints and the final report are callbacks
(``trainers/callbacks.py``) that a user can add to; they see the run through its ``RunContext``.

A trainer's loop (``trainers/ppo/train.py``, ``trainers/grpo/train.py``) reads top to bottom::

    run = Run("ppo", run_config, ppo_config)
    env = run.make_env(...); policy = run.make_policy(env); optimizer = ...
    run.restore(policy, optimizer, generators)   # attach what is checkpointed; load it on resume
    while not run.finished:
        ... collect, update ...
        run.end_iteration(env_steps, episodes, metrics)   # log; callbacks evaluate, checkpoint when due
    run.finish()   # callbacks: final evaluation, final checkpoint, summary table and report

Data parallel (``torchrun --nproc-per-node N -m trainers ...``, ``trainers/parallel.py``): every
rank builds a ``Run`` and runs the same loop on its ``num_envs / N`` envs. Env steps are summed and
episodes gathered over ranks at each iteration, so every rank agrees on the counters and on
``finished``; callbacks run on every rank (evaluation is split over them) and rank 0 alone writes
the run directory (``run.is_main``; the others wait for each checkpoint). On resume every rank loads
the same checkpoint, also with another number of ranks than the run that wrote it; with several
ranks each rank's random streams are then seeded anew from (seed, rank, iteration)
(``parallel.rank_seed``): a data-parallel resume is reproducible but, unlike a single-process
one, not the continuation the uninterrupted run would have drawn.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from nets.errors import BadInput
from policies.base import ActionChunkPolicy
from trainers import checkpoint as ckpt
from trainers import parallel, run_folder
from trainers.callbacks import Callback, Checkpointing, Evaluation, Report, RunContext
from trainers.config import save_config, to_dict
from trainers.metrics import named_metrics
from trainers.rollout import episode_summary
from trainers.run_config import RunConfig

__all__ = ["Run", "RunConfig"]


class Run:
    """A training run: directory, seeding, logging, evaluation, checkpoints and resume.

    Args:
        algo: the trainer's name (``"ppo"``, ``"grpo"``), stored in the run and the checkpoints.
        run_config: the shared settings.
        algo_config: the algorithm's dataclass (saved with the run and in every checkpoint).
        callbacks: run after the default ``Evaluation`` and ``Checkpointing`` callbacks, before
            ``Report`` (``trainers/callbacks.py``); one returning ``False`` stops the run.
        group_size: the envs of a rank must split into groups of this size (GRPO).

    Under torchrun this starts the process group (after checking that ``num_envs`` splits over
    the ranks: a ``ValueError`` before any work otherwise).

    The run directory follows ``trainers/run_folder.py``: a resume or a new run's folder is checked
    before anything is written, and rank 0 holds the folder's lock until ``finish()`` or
    ``close()``. Files are written from ``restore()`` on; a resumed run rewrites ``config.json``
    only once its first iteration has ended (a resume that fails while loading its state leaves the
    folder resumable as it was).
    """

    def __init__(
        self,
        algo: str,
        run_config: RunConfig,
        algo_config: Any,
        callbacks: list[Callback] | None = None,
        group_size: int | None = None,
    ) -> None:
        self.algo, self.config, self.algo_config = algo, run_config, algo_config
        cfg = run_config
        if cfg.loop != "sync" and algo not in ("sac", "sil"):
            raise BadInput(
                f"loop {cfg.loop!r} (an actor process stepping the envs while the learner updates) is "
                f"built for --algo sac and sil; --algo {algo} runs with loop 'sync'"
            )
        self._config_saved = False  # config.json: written by restore (new run) or the first iteration
        # on resume: (path, content) of the checkpoint, read and checked before anything is written
        self._resumed: tuple[Path, dict[str, Any]] | None = None
        folder: Path | None = None
        if cfg.resume:
            folder, path, data = run_folder.resumable(cfg.resume, algo, cfg.env)
            data = ckpt.resume_opt_ins(data, path, cfg.policy, cfg.policy_kwargs)  # before any env
            self._resumed = (path, data)
        self.ranks, self._owns_group = parallel.init(cfg.num_envs, cfg.device, group_size)
        self.device = parallel.local_device(cfg.device, self.ranks)
        self.callbacks: list[Callback] = [Evaluation(), Checkpointing(), *(callbacks or []), Report()]
        if folder is not None:
            self.dir = folder
        elif cfg.run_dir:
            self.dir = Path(cfg.run_dir)
        else:
            name = f"{algo}-{cfg.env.split(':')[-1]}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
            self.dir = Path(parallel.broadcast(str(Path("runs") / name)))  # rank 0's clock names it
        self._lock = run_folder.claim_on_main(
            self.dir, self.ranks, resume=bool(cfg.resume), overwrite=cfg.overwrite
        )
        # what the callbacks see; its counters are the run's (the same dict)
        self.checkpoints = ckpt.RunCheckpoints(
            self.dir, algo, to_dict(self.configs), cfg.keep_checkpoints, self.ranks.is_main
        )
        self.context = RunContext(algo, cfg, self.dir, self.ranks, self.checkpoints)
        self.counters = self.context.counters
        self.last_metrics: dict[str, float] = {}
        if cfg.torch_threads > 0:
            torch.set_num_threads(cfg.torch_threads)
        ckpt.seed_all(cfg.seed)

    @property
    def rank(self) -> int:
        return self.context.rank

    @property
    def world_size(self) -> int:
        return self.context.world_size

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files and logs (rank 0): ``RunContext.is_main``."""
        return self.context.is_main

    @property
    def configs(self) -> dict[str, Any]:
        """The settings as saved (``config.json``, checkpoints): ``overwrite`` is an act of this
        command line, never a setting a file passes on."""
        return {"run": dataclasses.replace(self.config, overwrite=False), self.algo: self.algo_config}

    @property
    def finished(self) -> bool:
        """``total_steps`` or ``max_iterations`` reached, or a callback stopped the run."""
        return self.context.finished

    # ------------------------------------------------------------------ env and policy
    def make_env(self, num_envs: int | None = None, **kwargs: Any) -> gym.vector.VectorEnv:
        """``RunConfig.make_env`` (``autoreset``, ``render_mode``, ``evaluation``, ...), with
        ``num_envs`` defaulting to this rank's share."""
        return self.config.make_env(num_envs or self.config.num_envs // self.world_size, **kwargs)

    def make_policy(self, env: gym.vector.VectorEnv, **defaults: Any) -> ActionChunkPolicy:
        """The configured policy for ``env``'s single spaces (``defaults`` under the config's
        ``policy_kwargs``), on the configured device, with its own seeded sampling generator.
        With ``init_policy`` it starts from that checkpoint's policy; on resume it is rebuilt as
        the resumed run built it."""
        cfg = self.config
        policy, self.checkpoints.spec = ckpt.build_policy(
            cfg.policy,
            {**defaults, **cfg.policy_kwargs},
            env.single_observation_space,
            env.single_action_space,
            init_policy=cfg.init_policy,
            resume=cfg.resume,
            resumed=self._resumed,
        )
        self.context.env_spaces = (env.single_observation_space, env.single_action_space)
        policy = policy.to(self.device)
        policy.seed(cfg.seed)  # several ranks: reseeded per rank in restore
        return policy

    def shard(self, policy: ActionChunkPolicy) -> None:
        """With fsdp over several ranks, shard ``policy`` (``parallel.fully_shard_policy``),
        after loading the resumed run's weights into it: call it after ``make_policy`` and before
        building the optimizer (which must hold the sharded parameters). Otherwise nothing."""
        cfg = self.config
        if not (cfg.data_parallel == "fsdp" and self.world_size > 1):
            if cfg.fsdp_param_dtype or cfg.activation_checkpointing:  # fsdp at world size 1
                warnings.warn(
                    "fsdp_param_dtype and activation_checkpointing apply to fsdp over several ranks; "
                    "a single process trains the plain policy",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        if self._resumed is not None:
            path, data = self._resumed
            ckpt.load_policy_state(policy, data["policy"], path)
        dtype = parallel.param_dtype(cfg.fsdp_param_dtype)
        self.checkpoints.sharded = parallel.fully_shard_policy(policy, dtype, cfg.activation_checkpointing)

    def data_parallel(self, policy: ActionChunkPolicy) -> nn.Module:
        """The module the updates call (after ``restore``): the FSDP root from ``shard``, or
        ``parallel.data_parallel(policy)`` (DDP; the plain policy at world size 1)."""
        sharded = self.checkpoints.sharded
        return sharded if sharded is not None else parallel.data_parallel(policy)

    def gathered(self) -> AbstractContextManager[None]:
        """A context with whole parameters in the policy (rollouts); see ``RunContext.gathered``."""
        return self.context.gathered()

    # ------------------------------------------------------------------ resume and logs
    def restore(
        self,
        policy: ActionChunkPolicy,
        optimizer: torch.optim.Optimizer,
        generators: dict[str, torch.Generator | None],
    ) -> dict[str, Any]:
        """Attach the run's trained state (checkpointed from now on), load the newest checkpoint
        into it when resuming, then open the logs.

        Returns the checkpoint's ``extra`` dict (empty when not resuming): what a loop put in
        ``run.checkpoints.extra`` besides the policy, optimizer and generators (GRPO: the
        reference policy).
        """
        state = self.checkpoints
        state.policy, state.optimizer, state.generators = policy, optimizer, generators
        extra: dict[str, Any] = {}
        resumed = self._resumed is not None
        if resumed:  # checked in __init__ (run_folder.resumable)
            path, data = self._resumed
            self._resumed = None  # not kept in memory for the whole run
            counters, extra = state.restore(path, data)
            state.extra = extra  # a loop that runs no iteration (a finished run) saves it unchanged
            self.counters.update(counters)
            if self.is_main:
                c = self.counters
                print(f"resumed from {path} (iteration {c['iteration']}, {c['env_steps']} env steps)")
        if self.world_size > 1:  # each rank samples, shuffles and explores on streams of its own
            seed = parallel.rank_seed(self.config.seed, self.rank, self.counters["iteration"])
            ckpt.seed_all(seed, [policy.generator, *generators.values()])
        self.context.clock = time.perf_counter()
        if self.is_main:
            if not resumed:
                self._save_config()
            self.context.open_logs(to_dict(self.configs), resumed)
        for callback in self.callbacks:
            callback.on_training_start(self.context)
        return extra

    def _save_config(self) -> None:
        """``config.json`` (atomically), once: a new run writes it in ``restore``, a resumed one after
        its first iteration (or at ``finish``), so that a resume refused while loading its state (a
        changed setting that does not fit the checkpoint) leaves the run's settings as they were."""
        if self.is_main and not self._config_saved:
            save_config(self.dir / run_folder.CONFIG_FILE, self.configs)
            self._config_saved = True

    # ------------------------------------------------------------------ per iteration
    def end_iteration(
        self, env_steps: int, episodes: list[dict[str, float]], metrics: dict[str, float]
    ) -> None:
        """Count, log, evaluate and checkpoint (when due) after one collect + update iteration.

        ``env_steps`` and ``episodes`` are this rank's: with several ranks they are summed and
        gathered over all of them, and ``metrics`` averaged (the updates' own are already the same
        on every rank). A callback returning ``False`` stops the run (``finished``) once every
        callback has had this iteration; with several ranks, a stop on any rank stops all.
        """
        env_steps, episodes, metrics = parallel.gather_iteration(
            env_steps, episodes, metrics, self.config.num_envs
        )
        c, ctx = self.counters, self.context
        c["iteration"] += 1
        c["env_steps"] += int(env_steps)
        c["episodes"] += len(episodes)
        row = {**metrics, **(named_metrics("env", episode_summary(episodes)) if episodes else {})}
        row["iteration"], row["time/elapsed"] = c["iteration"], ctx.elapsed()
        row["time/sps"] = c["env_steps"] / max(row["time/elapsed"], 1e-9)
        assert not self.is_main or ctx.logger is not None, "call restore() before the loop"
        self._save_config()  # a resumed run: its state is loaded and an iteration has run
        stop = False
        for callback in self.callbacks:
            stop |= callback.on_iteration_end(ctx, row) is False
        self.last_metrics = row
        if ctx.logger is not None and ctx.progress is not None:
            ctx.logger.log(c["env_steps"], row)
            ctx.progress.update(int(env_steps), row)
        for callback in self.callbacks:
            stop |= callback.on_row_logged(ctx, row) is False
        stop |= 0 < self.config.max_minutes <= row["time/elapsed"] / 60
        if self.world_size > 1:  # every rank stops at the same iteration
            stop = any(parallel.all_gather(stop))
        ctx.stop = ctx.stop or stop

    def log(self, row: dict[str, Any]) -> None:
        """Write one metrics row at the current env step (``RunContext.log``; rank 0 writes)."""
        self.context.log(row)

    def finish(self) -> dict[str, float]:
        """The callbacks' ends (final evaluation, final checkpoint, summary and report), then close
        the logs; returns the last metrics (with ``eval/*``)."""
        final = dict(self.last_metrics)
        self._save_config()
        for callback in self.callbacks:
            callback.on_training_end(self.context, final)
        self.close()
        if self._owns_group:
            parallel.shutdown()
        return final

    def close(self) -> None:
        """Close the logs and release the run directory's lock: ``finish`` does it, and the PPO,
        GRPO and SAC loops when they stop on an error (the folder can be resumed at once; without
        it the lock goes with this object or the process). Idempotent."""
        self.context.close_logs()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
