"""What a run does besides collecting and updating, as callbacks (SB3's ``BaseCallback`` is the model).

A ``Run`` calls each of its callbacks, in list order, at four points:

* ``on_training_start(run)``: once the run's state is attached and its logs are open (fresh or
  resumed);
* ``on_iteration_end(run, row)``: after an iteration's update, before its metrics row is logged
  (add entries to ``row``, e.g. evaluation results);
* ``on_row_logged(run, row)``: after the row is logged. Checkpoints go here: a checkpoint never runs
  ahead of the metrics log, so a resumed run's log has no gap;
* ``on_training_end(run, final)``: at the end, while the logs are still open (add entries to
  ``final``).

The run's list: ``Evaluation`` (``eval_every``, ``eval_at_start``, ...), ``Checkpointing``
(``checkpoint_every`` and the final checkpoint), the user's callbacks
(``train(run_config, algo_config, callbacks=[...])``), then ``Report`` (the summary table,
``summary.md`` and ``learning_curve.png``, from everything the others added to ``final``).

With several ranks (torchrun) every rank calls every callback, at the same points: evaluation
is split over the ranks, and what writes files asks ``run.is_main`` (rank 0).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from trainers import distributed
from trainers.evaluation import evaluate_episodes
from trainers.files import open_append
from trainers.metrics import named_metrics
from trainers.report import EVAL_EPISODES_FILE
from trainers.rollout import episode_summary

if TYPE_CHECKING:
    from trainers.run import Run


class Callback:
    """Base class: override the hooks you need (each does nothing by default)."""

    def on_training_start(self, run: Run) -> None:
        pass

    def on_iteration_end(self, run: Run, row: dict[str, Any]) -> None:
        pass

    def on_row_logged(self, run: Run, row: dict[str, Any]) -> None:
        pass

    def on_training_end(self, run: Run, final: dict[str, Any]) -> None:
        pass


class Evaluation(Callback):
    """Deterministic episodes on a separate eval env (``RunConfig.eval_*``): before training
    (``eval_at_start``), every ``eval_every`` iterations and at the end (``eval_every`` -1: never).
    Each episode goes to ``eval_episodes.jsonl``; with ``video`` an mp4 under ``videos/``.

    With several ranks each plays its share of the episodes (``evaluate_episodes(shard=...)``: the
    same starts the single process plays) on its share of the eval envs, and the episodes are
    gathered on every rank; the video shows rank 0's.
    """

    def __init__(self) -> None:
        self.env: Any = None
        self.last: dict[str, float] = {}

    def on_training_start(self, run: Run) -> None:
        cfg = run.config
        if cfg.eval_at_start and run.counters["iteration"] == 0 and cfg.eval_every >= 0:
            run.log({"iteration": 0, **self.evaluate(run)})
            if cfg.eval_every == 0:  # not needed again until the end
                self.close()

    def on_iteration_end(self, run: Run, row: dict[str, Any]) -> None:
        every = run.config.eval_every
        if every > 0 and run.counters["iteration"] % every == 0 and not run.finished:
            row.update(self.evaluate(run))

    def on_training_end(self, run: Run, final: dict[str, Any]) -> None:
        if run.config.eval_every >= 0:
            final.update(self.evaluate(run))
            run.log({"iteration": run.counters["iteration"], **self.last})
        self.close()

    def evaluate(self, run: Run) -> dict[str, float]:
        step = run.counters["env_steps"]
        with run.gathered():  # fsdp: whole parameters (every rank, also one without a share)
            episodes = self._episodes(run, step)
        episodes = [ep for part in distributed.all_gather(episodes) for ep in part]
        if run.is_main:
            with open_append(run.dir / EVAL_EPISODES_FILE) as f:  # a symbolic link is refused
                for ep in episodes:
                    f.write(json.dumps({"env_step": step, **ep}, default=float) + "\n")
        self.last = named_metrics("eval", episode_summary(episodes))
        return self.last

    def _episodes(self, run: Run, step: int) -> list[dict[str, float]]:
        """This rank's share of the evaluation episodes."""
        cfg = run.config
        episodes: list[dict[str, float]] = []
        if len(distributed.shard(cfg.eval_episodes, run.rank, run.world_size)):  # this rank's share
            if self.env is None:
                n = math.ceil((cfg.eval_num_envs or min(cfg.eval_episodes, cfg.num_envs)) / run.world_size)
                render_mode = "rgb_array" if cfg.video else None
                self.env = run.make_env(
                    n, autoreset="disabled_native", render_mode=render_mode, evaluation=True
                )
            video = run.dir / "videos" / f"eval_{step:09d}.mp4" if cfg.video and run.is_main else None
            episodes = evaluate_episodes(
                run.policy,
                self.env,
                cfg.eval_episodes,
                seed=cfg.seed + 10**6,
                video_path=video,
                video_fps=cfg.video_fps,
                progress=cfg.progress and run.is_main,
                shard=(run.rank, run.world_size),
            )
        return episodes

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


class Checkpointing(Callback):
    """A checkpoint every ``RunConfig.checkpoint_every`` iterations, and one at the end
    (``run.final_checkpoint``)."""

    def on_row_logged(self, run: Run, row: dict[str, Any]) -> None:
        every = run.config.checkpoint_every
        if every > 0 and run.counters["iteration"] % every == 0 and not run.finished:
            run.save()

    def on_training_end(self, run: Run, final: dict[str, Any]) -> None:
        run.final_checkpoint = run.save()


class Report(Callback):
    """At the end: the summary table on stdout, ``summary.md`` and ``learning_curve.png``."""

    def on_training_end(self, run: Run, final: dict[str, Any]) -> None:
        run.close_progress()  # the table prints below a finished bar
        checkpoint = run.final_checkpoint or run.save()
        if run.is_main:
            print(run.summary(final, checkpoint))
            run.write_report(final, checkpoint)
