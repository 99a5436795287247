"""What every training run needs besides its algorithm: the env (``trainers/env_factory.py``) and
policy (``trainers/checkpoint.py``) built from names, the run directory, seeding, metrics and
resume. Evaluation, checkpoints and the final report are callbacks (``trainers/callbacks.py``) that
a user can add to.

A trainer's loop (``trainers/ppo/train.py``, ``trainers/grpo/train.py``) reads top to bottom::

    run = Run("ppo", run_config, ppo_config)
    env = run.make_env(...); policy = run.make_policy(env); optimizer = ...
    run.restore(policy, optimizer, generators)   # attach what is checkpointed; load it on resume
    while not run.finished:
        ... collect, update ...
        run.end_iteration(env_steps, episodes, metrics)   # log; callbacks evaluate, checkpoint when due
    run.finish()   # callbacks: final evaluation, final checkpoint, summary table and report

Data parallel (``torchrun --nproc-per-node N -m trainers ...``, ``trainers/distributed.py``): every
rank builds a ``Run`` and runs the same loop on its ``num_envs / N`` envs. The run sums env steps
and gathers episodes over ranks at each iteration (so every rank agrees on the counters and on
``finished``); rank 0 alone writes the run directory (config, logs, progress bar, evaluation
episodes and videos, checkpoints, report) while the others wait for each checkpoint at a barrier.
Callbacks run on every rank (evaluation is split over them); ``run.is_main`` says which one writes.
On resume every rank loads the same checkpoint, also with another number of ranks than the run
that wrote it: weights, optimizer and counters are restored; with several ranks each rank's random
streams are seeded anew from (seed, rank, iteration) (``distributed.rank_seed``), so a data-parallel
resume is reproducible but, unlike a single-process one, not the continuation the uninterrupted run
would have drawn.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from policies.base import ActionChunkPolicy
from trainers import checkpoint as ckpt
from trainers import distributed, run_folder
from trainers.callbacks import Callback, Checkpointing, Evaluation, Report
from trainers.config import save_config, to_dict
from trainers.env_factory import AUTORESET, make_vec_env
from trainers.files import write_atomic
from trainers.metrics import MetricsLogger, Progress, format_table, named_metrics, read_jsonl
from trainers.report import EVAL_EPISODES_FILE, plot_learning_curve, write_summary
from trainers.rollout import episode_summary


@dataclass
class RunConfig:
    """Settings every trainer shares.

    ``env`` is a gymnasium id; ``"module:Env-v0"`` imports ``module`` first (``envs:Libero-Spatial-v0``
    registers this project's envs; the trainers never import them themselves).
    """

    env: str = "CartPole-v1"  # a gymnasium id; "module:Env-v0" imports module first (envs:Libero-Spatial-v0)
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to gym.make_vec
    num_envs: int = 8  # over all ranks (torchrun): each rank steps num_envs / world size of them
    # auto: the env's own vector env when it takes autoreset_mode (this project's envs), else sync
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    autoreset_mode: Literal["auto", "next_step", "same_step", "disabled"] = "auto"  # auto: the trainer picks
    # a registered policy (gaussian, categorical, binned, flow, residual, dsrl, openvla_oft, pi05,
    # cosmos_policy, libero_expert; policies/registry.py), auto (from the action space), or module:Class
    policy: str = "auto"
    policy_kwargs: dict[str, Any] = field(default_factory=dict)  # JSON object: the policy's arguments
    total_steps: int = 100_000  # env steps (executed sub-steps, summed over envs)
    max_iterations: int = 0  # also stop after this many iterations (0: no limit)
    seed: int = 0  # seeds the envs, the policy's sampling, the minibatch order and torch
    device: str = "cpu"  # cuda with several ranks: cuda:LOCAL_RANK
    torch_threads: int = 0  # 0: torch's default
    run_dir: str | None = None  # default: runs/<algo>-<env>-s<seed>-<date>
    # a run directory (its newest checkpoint) or the newest checkpoint file in its checkpoints/: the
    # same algorithm and env; run_dir is then that directory
    resume: str | None = None
    # a new run in a run_dir that holds another run's files: remove them first (only a run's own
    # files, inside the folder: anything else there is refused). Without it such a folder is
    # refused (a new run never mixes its files with another's); --resume continues the run instead.
    # Never saved as true: an overwrite comes only from your own command line or call
    overwrite: bool = False
    # start from the trained policy of a run directory or checkpoint (e.g. behaviour cloning): its
    # policy class and arguments are used (policy_kwargs and the trainer's needs, e.g. a critic,
    # override them) and --policy is ignored, except --policy residual: a ResidualPolicy learns a
    # correction over that policy, kept frozen as its base
    init_policy: str | None = None
    # evaluate on another env, e.g. train in a world model and evaluate in the simulator; the
    # kwargs default to env_kwargs when eval_env is unset, else to none
    eval_env: str | None = None
    eval_env_kwargs: dict[str, Any] | None = None  # JSON object (see eval_env)
    eval_every: int = 0  # iterations between evaluations; 0: only at the end; -1: never
    eval_at_start: bool = False  # also evaluate the initial policy, before training
    eval_episodes: int = 10  # episodes per evaluation (deterministic actions)
    eval_num_envs: int = 0  # 0: min(eval_episodes, num_envs)
    video: bool = True  # an mp4 of the first eval round (needs an env that renders rgb_array)
    video_fps: int = 20  # frames per second of the eval videos
    checkpoint_every: int = 10  # iterations between checkpoints; 0: only at the end
    keep_checkpoints: int = 3  # newest checkpoints kept; 0: all
    tensorboard: bool = True  # TensorBoard event files in RUN/tb
    wandb_project: str | None = None  # also log to this Weights & Biases project (wandb installed)
    progress: bool = True  # a tqdm progress bar over env steps
    # several ranks (torchrun): ddp keeps a whole copy of the model on every rank; fsdp shards
    # parameters, gradients and optimizer state over the ranks (FSDP2 fully_shard). At world size 1
    # fsdp changes nothing (no process group, no sharding; the two options below are then unused)
    data_parallel: Literal["ddp", "fsdp"] = "ddp"
    fsdp_param_dtype: str | None = None  # fsdp: compute in this dtype (bfloat16, float16), reduce in float32
    activation_checkpointing: bool = False  # fsdp: recompute activations in backward

    def __post_init__(self) -> None:
        for name in ("num_envs", "total_steps", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_iterations", "seed", "torch_threads", "eval_num_envs", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.keep_checkpoints < 0 or self.video_fps < 1 or self.eval_every < -1:
            raise ValueError(
                "need keep_checkpoints >= 0, video_fps >= 1 and eval_every >= -1, got "
                f"{self.keep_checkpoints}, {self.video_fps} and {self.eval_every}"
            )
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}: CUDA is not available on this machine (use cpu)")
        if self.autoreset_mode not in ("auto", *AUTORESET):
            raise ValueError(
                f"autoreset_mode must be 'auto' or one of {list(AUTORESET)}, got {self.autoreset_mode!r}"
            )
        if self.data_parallel not in distributed.DATA_PARALLEL:
            raise ValueError(
                f"data_parallel must be one of {list(distributed.DATA_PARALLEL)}, got {self.data_parallel!r}"
            )
        distributed.param_dtype(self.fsdp_param_dtype)  # a ValueError naming the choices
        if self.data_parallel != "fsdp" and (self.fsdp_param_dtype or self.activation_checkpointing):
            raise ValueError("fsdp_param_dtype and activation_checkpointing need data_parallel='fsdp'")
        if self.resume and self.overwrite:
            raise ValueError("resume continues the run in its folder, overwrite clears the folder: give one")


class Run:
    """A training run: directory, seeding, logging, evaluation, checkpoints and resume.

    Args:
        algo: the trainer's name (``"ppo"``, ``"grpo"``), stored in the run and the checkpoints.
        run_config: the shared settings.
        algo_config: the algorithm's dataclass (saved with the run and in every checkpoint).
        callbacks: run after the default ``Evaluation`` and ``Checkpointing`` callbacks, before
            ``Report`` (``trainers/callbacks.py``).
        group_size: the envs of a rank must split into groups of this size (GRPO).

    Under torchrun this starts the process group (after checking that ``num_envs`` splits over
    the ranks: a ``ValueError`` before any work otherwise).

    The run directory follows ``trainers/run_folder.py``: before anything is written, a resume is
    checked (an existing run folder, a full checkpoint of the same algorithm and env, readable
    logs) and a new run's folder must be empty (or ``overwrite``); rank 0 then holds the folder's
    lock (``<run>/.lock``) until ``finish()`` or ``close()``, so a second run on the folder is a
    ``RuntimeError``. Files are written from ``restore()`` on, each whole file atomically; a
    resumed run rewrites ``config.json`` only once its first iteration has ended (a resume that
    fails while loading its state leaves the folder resumable as it was).
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
        self._lock: run_folder.FolderLock | None = None
        self._config_saved = False  # config.json: written by restore (new run) or the first iteration
        # on resume: (path, content) of the checkpoint, read and checked before anything is written
        self._resumed: tuple[Path, dict[str, Any]] | None = None
        folder: Path | None = None
        if cfg.resume:
            folder, path, data = run_folder.resumable(cfg.resume, algo, cfg.env)
            self._resumed = (path, data)
        self.ranks, self._owns_group = distributed.init(cfg.num_envs, cfg.device, group_size)
        self.device = distributed.local_device(cfg.device, self.ranks)
        self.callbacks: list[Callback] = [Evaluation(), Checkpointing(), *(callbacks or []), Report()]
        self.final_checkpoint: Path | None = None  # written by Checkpointing at the end
        if folder is not None:
            self.dir = folder
        elif cfg.run_dir:
            self.dir = Path(cfg.run_dir)
        else:
            name = f"{algo}-{cfg.env.split(':')[-1]}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
            self.dir = Path(distributed.broadcast(str(Path("runs") / name)))  # rank 0's clock names it
        self._claim_dir()
        if cfg.torch_threads > 0:
            torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        random.seed(cfg.seed)
        self.counters = {"iteration": 0, "env_steps": 0, "episodes": 0, "elapsed": 0.0}
        self.last_metrics: dict[str, float] = {}
        self.extra: dict[str, Any] = {}  # saved with every checkpoint, returned by restore on resume
        self._policy_spec: dict[str, Any] | None = None  # set by make_policy: how to rebuild the policy
        self.sharded: nn.Module | None = None  # fsdp over several ranks: shard's root module
        self._logger: MetricsLogger | None = None
        self._progress: Progress | None = None
        self._clock = time.perf_counter()

    def _claim_dir(self) -> None:
        """Rank 0 locks the run directory (and, for a new run, checks that it is empty or clears it
        with ``overwrite``); its refusal is raised on every rank."""
        error: Exception | None = None
        if self.is_main:
            try:
                self._lock = run_folder.claim(
                    self.dir, resume=bool(self.config.resume), overwrite=self.config.overwrite
                )
            except (OSError, ValueError, RuntimeError) as e:
                error = e
        if self.world_size > 1:
            shared = distributed.broadcast(
                None if error is None else (isinstance(error, ValueError), str(error))
            )
            if error is None and shared is not None:
                error = (ValueError if shared[0] else RuntimeError)(f"rank 0: {shared[1]}")
        if error is not None:
            raise error

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files and logs (rank 0)."""
        return self.ranks.is_main

    @property
    def configs(self) -> dict[str, Any]:
        """The settings as saved (``config.json``, checkpoints): ``overwrite`` is an act of this
        command line, never a setting a file passes on."""
        return {"run": dataclasses.replace(self.config, overwrite=False), self.algo: self.algo_config}

    @property
    def finished(self) -> bool:
        c, most = self.counters, self.config.max_iterations
        return c["env_steps"] >= self.config.total_steps or (most > 0 and c["iteration"] >= most)

    # ------------------------------------------------------------------ env and policy
    def make_env(
        self,
        num_envs: int | None = None,
        *,
        autoreset: str = "same_step",
        render_mode: str | None = None,
        evaluation: bool = False,
        train_env_kwargs: dict[str, Any] | None = None,
    ) -> gym.vector.VectorEnv:
        """``make_vec_env`` of the configured env (``evaluation``: of the eval env); ``autoreset`` is
        the mode used when the config says ``auto``. ``num_envs`` defaults to this rank's share.
        ``train_env_kwargs``: the training env made with these kwargs instead (e.g. a fixed subset
        of its starts to evaluate on)."""
        cfg = self.config
        env_id, env_kwargs = cfg.env, cfg.env_kwargs
        if evaluation and cfg.eval_env is not None:
            env_id, env_kwargs = cfg.eval_env, cfg.eval_env_kwargs or {}
        elif evaluation and cfg.eval_env_kwargs is not None:
            env_kwargs = cfg.eval_env_kwargs
        if train_env_kwargs is not None:
            env_id, env_kwargs = cfg.env, train_env_kwargs
        mode = cfg.autoreset_mode if cfg.autoreset_mode != "auto" else autoreset
        return make_vec_env(
            env_id,
            num_envs or cfg.num_envs // self.world_size,
            env_kwargs,
            cfg.vectorization,
            mode,
            autoreset_required=cfg.autoreset_mode != "auto",
            render_mode=render_mode,
        )

    def make_policy(self, env: gym.vector.VectorEnv, **defaults: Any) -> ActionChunkPolicy:
        """The configured policy for ``env``'s single spaces (``defaults`` under the config's
        ``policy_kwargs``), on the configured device, with its own seeded sampling generator.
        With ``init_policy`` it starts from that checkpoint's policy; on resume it is rebuilt as
        the resumed run built it."""
        cfg = self.config
        policy, self._policy_spec = ckpt.build_policy(
            cfg.policy,
            {**defaults, **cfg.policy_kwargs},
            env.single_observation_space,
            env.single_action_space,
            init_policy=cfg.init_policy,
            resume=cfg.resume,
            resumed=self._resumed,
        )
        policy = policy.to(self.device)
        policy.seed(cfg.seed)  # several ranks: reseeded per rank in restore
        return policy

    @property
    def fsdp(self) -> bool:
        """Whether the policy is sharded with FSDP (``data_parallel="fsdp"`` over several ranks)."""
        return self.config.data_parallel == "fsdp" and self.world_size > 1

    def shard(self, policy: ActionChunkPolicy) -> None:
        """With fsdp over several ranks, shard ``policy`` (``distributed.fully_shard_policy``),
        after loading the resumed run's weights into it: call it after ``make_policy`` and before
        building the optimizer (which must hold the sharded parameters). Otherwise nothing."""
        cfg = self.config
        if not self.fsdp:
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
        dtype = distributed.param_dtype(cfg.fsdp_param_dtype)
        self.sharded = distributed.fully_shard_policy(policy, dtype, cfg.activation_checkpointing)

    def data_parallel(self, policy: ActionChunkPolicy) -> nn.Module:
        """The module the updates call (after ``restore``): the FSDP root from ``shard``, or
        ``distributed.data_parallel(policy)`` (DDP; the plain policy at world size 1)."""
        return self.sharded if self.sharded is not None else distributed.data_parallel(policy)

    def gathered(self) -> Any:
        """A context with whole parameters in the policy (rollouts, evaluation); a no-op
        unless sharded (``distributed.gathered``)."""
        return distributed.gathered(self.sharded)

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        """Write a checkpoint of everything needed to continue exactly from here. Rank 0 writes it
        (the ranks hold the same weights and optimizer state; its RNG states are the ones kept)
        while the others wait, so that no rank runs ahead of a checkpoint."""
        policy, optimizer = self.policy, self.optimizer
        if self._policy_spec is None:
            raise RuntimeError("Run.save needs a policy built with Run.make_policy (its class and arguments)")
        path = self.dir / "checkpoints" / f"iter_{self.counters['iteration']:06d}.pt"
        if self.sharded is not None:  # every rank takes part in gathering the full state (to rank 0)
            full = distributed.full_state(self.sharded, policy, optimizer)
        if not self.is_main:
            distributed.barrier()
            return path
        generators = {"policy": policy.generator, **self.generators}
        if self.sharded is not None:
            state, omitted = ckpt.policy_state(policy, full[0])
            optimizer_state = full[1]
        else:
            state, omitted = ckpt.policy_state(policy)
            optimizer_state = optimizer.state_dict()
        payload = {
            "algo": self.algo,
            "config": to_dict(self.configs),
            "policy": {**self._policy_spec, "state_dict": state, "omitted": omitted},
            "optimizer": optimizer_state,
            "rng": ckpt.rng_state(generators),
            "counters": {**self.counters, "elapsed": self._elapsed()},
            "extra": self.extra,
        }
        ckpt.save_checkpoint(path, payload)
        ckpt.prune_checkpoints(self.dir, self.config.keep_checkpoints)
        distributed.barrier()
        return path

    def restore(
        self,
        policy: ActionChunkPolicy,
        optimizer: torch.optim.Optimizer,
        generators: dict[str, torch.Generator | None],
    ) -> dict[str, Any]:
        """Attach the run's trained state (checkpointed from now on), load the newest checkpoint
        into it when resuming, then open the logs.

        Returns the checkpoint's ``extra`` dict (empty when not resuming): what a loop put in
        ``run.extra`` besides the policy, optimizer and generators (GRPO: the reference policy).
        """
        self.policy, self.optimizer, self.generators = policy, optimizer, generators
        extra: dict[str, Any] = {}
        resume_iteration = resume_step = None
        if self._resumed is not None:  # checked in __init__ (run_folder.resumable)
            path, data = self._resumed
            self._resumed = None  # not kept in memory for the whole run
            if self.sharded is not None:  # the weights were loaded before sharding (shard)
                distributed.load_optimizer_state(self.sharded, policy, optimizer, data["optimizer"])
            else:
                ckpt.load_policy_state(policy, data["policy"], path)
                optimizer.load_state_dict(data["optimizer"])
            ckpt.restore_rng_state(data["rng"], {"policy": policy.generator, **generators})
            self.counters.update(data["counters"])
            extra = data["extra"]
            resume_iteration, resume_step = self.counters["iteration"], self.counters["env_steps"]
            if self.is_main:
                print(f"resumed from {path} (iteration {resume_iteration}, {resume_step} env steps)")
        if self.world_size > 1:  # each rank samples, shuffles and explores on streams of its own
            seed = distributed.rank_seed(self.config.seed, self.rank, self.counters["iteration"])
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
            for g in [policy.generator, *generators.values()]:
                if g is not None:
                    g.manual_seed(seed)
        self._clock = time.perf_counter()
        if self.is_main:
            if resume_step is None:
                self._save_config()
            self._open_logs(resume_iteration, resume_step)
        for callback in self.callbacks:
            callback.on_training_start(self)
        return extra

    def _save_config(self) -> None:
        """``config.json`` (atomically), once: a new run writes it in ``restore``, a resumed one
        after its first iteration (or at ``finish``), so that a resume refused while loading its
        state (a changed setting that does not fit the checkpoint) leaves the run's settings as
        they were."""
        if self.is_main and not self._config_saved:
            save_config(self.dir / run_folder.CONFIG_FILE, self.configs)
            self._config_saved = True

    def _open_logs(self, resume_iteration: int | None, resume_step: int | None) -> None:
        self._logger = MetricsLogger(
            self.dir,
            tensorboard=self.config.tensorboard,
            wandb_project=self.config.wandb_project,
            config=to_dict(self.configs),
            resume_iteration=resume_iteration,
            resume_step=resume_step,
        )
        self._progress = Progress(
            self.config.total_steps,
            self.counters["env_steps"],
            self.config.progress,
            desc=f"{self.algo} {self.config.env}",
        )
        episodes_file = self.dir / EVAL_EPISODES_FILE
        if resume_step is not None and episodes_file.exists():  # drop evaluations logged after the checkpoint
            rows = read_jsonl(episodes_file, drop_torn_tail=True)
            kept = [r for r in rows if float(r.get("env_step", math.inf)) <= resume_step]
            write_atomic(episodes_file, "".join(json.dumps(r) + "\n" for r in kept))

    # ------------------------------------------------------------------ per iteration
    def end_iteration(
        self, env_steps: int, episodes: list[dict[str, float]], metrics: dict[str, float]
    ) -> None:
        """Count, log, evaluate and checkpoint (when due) after one collect + update iteration.

        ``env_steps`` and ``episodes`` are this rank's: with several ranks they are summed and
        gathered over all of them, and ``metrics`` averaged (the updates' own are already the same
        on every rank).
        """
        if self.world_size > 1:
            parts = distributed.all_gather((int(env_steps), episodes, metrics))
            env_steps = sum(steps for steps, _, _ in parts)
            local = self.config.num_envs // self.world_size  # rank r's env i is env r * local + i
            episodes = [
                {**ep, "env": ep["env"] + r * local} for r, (_, eps, _) in enumerate(parts) for ep in eps
            ]
            metrics = distributed.average([m for _, _, m in parts])
        c = self.counters
        c["iteration"] += 1
        c["env_steps"] += int(env_steps)
        c["episodes"] += len(episodes)
        row = {**metrics, **(named_metrics("env", episode_summary(episodes)) if episodes else {})}
        elapsed = self._elapsed()
        row.update(
            {
                "iteration": c["iteration"],
                "time/elapsed": elapsed,
                "time/sps": c["env_steps"] / max(elapsed, 1e-9),
            }
        )
        assert not self.is_main or self._logger is not None, "call restore() before the loop"
        self._save_config()  # a resumed run: its state is loaded and an iteration has run
        for callback in self.callbacks:
            callback.on_iteration_end(self, row)
        self.last_metrics = row
        if self._logger is not None and self._progress is not None:
            self._logger.log(c["env_steps"], row)
            self._progress.update(int(env_steps), row)
        for callback in self.callbacks:
            callback.on_row_logged(self, row)

    def log(self, row: dict[str, Any]) -> None:
        """Write one metrics row at the current env step (callbacks use it for rows of their own);
        only rank 0 writes."""
        if not self.is_main:
            return
        assert self._logger is not None, "call restore() before logging"
        self._logger.log(self.counters["env_steps"], row)

    def finish(self) -> dict[str, float]:
        """The callbacks' ends (final evaluation, final checkpoint, summary and report), then close
        the logs; returns the last metrics (with ``eval/*``)."""
        final = dict(self.last_metrics)
        self._save_config()
        for callback in self.callbacks:
            callback.on_training_end(self, final)
        self.close()
        if self._owns_group:
            distributed.shutdown()
        return final

    def close(self) -> None:
        """Close the logs and release the run directory's lock: ``finish`` does it, and the PPO,
        GRPO and SAC loops when they stop on an error (the folder can be resumed at once; without
        it the lock goes with this object or the process). Idempotent."""
        self.close_progress()
        if self._logger is not None:
            self._logger.close()
            self._logger = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def close_progress(self) -> None:
        if self._progress is not None:
            self._progress.close()
            self._progress = None

    def write_report(self, final: dict[str, float], checkpoint: Path) -> None:
        """``learning_curve.png`` and ``summary.md`` in the run directory."""
        files = {"checkpoint": str(checkpoint.relative_to(self.dir)), "config": "config.json"}
        plot = plot_learning_curve(self.dir)
        if plot is not None:
            files["learning curve"] = plot.name
        for video in sorted((self.dir / "videos").glob("eval_*.mp4")):
            files[f"evaluation video at env step {int(video.stem[5:])}"] = str(video.relative_to(self.dir))
        files["metrics (one row per iteration)"] = "metrics.jsonl"
        path = write_summary(
            self.dir, f"{self.algo} on {self.config.env}", self.summary_rows(final, checkpoint), files
        )
        print(f"summary: {path}")

    def summary(self, final: dict[str, float], checkpoint: Path) -> str:
        return format_table(self.summary_rows(final, checkpoint), title=f"{self.algo} summary")

    def summary_rows(self, final: dict[str, float], checkpoint: Path) -> list[tuple[str, Any]]:
        c = self.counters
        rows: list[tuple[str, Any]] = [
            ("env", self.config.env),
            ("policy", self._policy_spec["name"] if self._policy_spec else self.config.policy),
            ("initial policy", self.config.init_policy or "new"),
            ("env steps", c["env_steps"]),
            ("iterations", c["iteration"]),
            ("episodes", c["episodes"]),
            ("wall time (s)", float(self._elapsed())),
            ("env steps / s", c["env_steps"] / max(self._elapsed(), 1e-9)),
        ]
        for key in (
            "env/return",
            "env/success_once",
            "eval/return",
            "eval/success_once",
            "eval/success",
            "eval/episode_len",
            "train/approx_kl",
            "train/clip_fraction",
            "train/entropy",
        ):
            if key in final:
                rows.append((key, float(final[key])))
        rows += [("run directory", str(self.dir)), ("checkpoint", checkpoint.name)]
        return rows

    def _elapsed(self) -> float:
        return float(self.counters["elapsed"]) + time.perf_counter() - self._clock
