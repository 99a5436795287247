"""What a callback sees of its run (``RunContext``): the run's settings, folder, ranks, counters
and trained state, its logs, and the means to write a checkpoint. ``trainers.run.Run`` builds one
and hands it to every hook of its callbacks (``trainers/callbacks.py``); a callback stops the run by
returning ``False`` from ``on_iteration_end`` or ``on_row_logged`` (``stop``).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.base import ActionChunkPolicy
from trainers import parallel
from trainers.checkpoint import RunCheckpoints
from trainers.metrics import MetricsLogger, Progress
from trainers.run_config import RunConfig


@dataclass
class RunContext:
    """What a callback sees of its run: its settings, folder, ranks, counters and trained state
    (``checkpoints``: policy, optimizer, ...), and the means to log a row and write a checkpoint.
    ``Run`` builds it and fills in the logs and the state as the run starts."""

    algo: str  # "ppo", "grpo", "sac", "bc": stored in the run's checkpoints
    config: RunConfig
    dir: Path
    ranks: parallel.Ranks
    checkpoints: RunCheckpoints
    counters: dict[str, Any] = field(
        default_factory=lambda: {"iteration": 0, "env_steps": 0, "episodes": 0, "elapsed": 0.0}
    )
    logger: MetricsLogger | None = None  # rank 0, from training start
    progress: Progress | None = None  # rank 0's progress bar
    stop: bool = False  # a callback returned False: the loop ends after this iteration
    final_checkpoint: Path | None = None  # written by Checkpointing at the end
    clock: float = field(default_factory=time.perf_counter)  # elapsed time counts from here
    env_spaces: tuple[Any, Any] | None = None  # the policy's single-env spaces (Run.make_policy)

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
    def policy(self) -> ActionChunkPolicy:
        """The trained policy (attached by ``Run.restore``; under FSDP whole only inside ``gathered``)."""
        return self.checkpoints.policy

    @property
    def finished(self) -> bool:
        """``total_steps`` or ``max_iterations`` reached, or a callback stopped the run."""
        c, cfg = self.counters, self.config
        return self.stop or c["env_steps"] >= cfg.total_steps or 0 < cfg.max_iterations <= c["iteration"]

    def elapsed(self) -> float:
        """Seconds of training, over every resumed part of the run."""
        return float(self.counters["elapsed"]) + time.perf_counter() - self.clock

    def gathered(self) -> AbstractContextManager[None]:
        """A context with whole parameters in the policy (rollouts, evaluation); a no-op
        unless sharded (``parallel.gathered``)."""
        return parallel.gathered(self.checkpoints.sharded)

    def log(self, row: dict[str, Any]) -> None:
        """Write one metrics row at the current env step; only rank 0 writes."""
        if not self.is_main:
            return
        assert self.logger is not None, "call restore() before logging"
        self.logger.log(self.counters["env_steps"], row)

    def save(self) -> Path:
        """A checkpoint of everything needed to continue exactly from here (``RunCheckpoints``)."""
        return self.checkpoints.save({**self.counters, "elapsed": self.elapsed()})

    def open_logs(self, configs: dict[str, Any], resumed: bool) -> None:
        """Rank 0's ``metrics.jsonl`` (with TensorBoard, W&B; a resumed one cut at its checkpoint)
        and progress bar; ``configs``: the settings sent to W&B."""
        c, cfg = self.counters, self.config
        self.logger = MetricsLogger(
            self.dir,
            tensorboard=cfg.tensorboard,
            wandb_project=cfg.wandb_project,
            config=configs,
            resume_iteration=c["iteration"] if resumed else None,
            resume_step=c["env_steps"] if resumed else None,
        )
        self.progress = Progress(cfg.total_steps, c["env_steps"], cfg.progress, desc=f"{self.algo} {cfg.env}")

    def close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    def close_logs(self) -> None:
        """Close the progress bar and the metrics log (idempotent)."""
        self.close_progress()
        if self.logger is not None:
            self.logger.close()
            self.logger = None
