"""What a run does besides collecting and updating, as callbacks (SB3's ``BaseCallback`` is the model).

A ``Run`` (``trainers/run.py``) calls each of its callbacks, in list order, at four points, with
its ``RunContext`` (``trainers/run_context.py``: settings, folder, counters, policy, logs,
checkpoints):

* ``on_training_start(run)``: once the run's state is attached and its logs are open (fresh or
  resumed);
* ``on_iteration_end(run, row)``: after an iteration's update, before its metrics row is logged
  (add entries to ``row``, e.g. evaluation results);
* ``on_row_logged(run, row)``: after the row is logged. Checkpoints go here: a checkpoint never runs
  ahead of the metrics log, so a resumed run's log has no gap;
* ``on_training_end(run, final)``: at the end, while the logs are still open (add entries to
  ``final``).

``on_iteration_end`` or ``on_row_logged`` returning ``False`` stops the run (as SB3's ``on_step``):
the iteration's hooks all run, then the loop ends and the run finishes as at its last step (final
evaluation, final checkpoint, report). None, what a hook without ``return`` gives, goes on.

The run's list: ``Evaluation`` (``eval_every``, ``eval_at_start``, ...), ``Checkpointing``
(``checkpoint_every`` and the final checkpoint), the user's callbacks
(``train(run_config, algo_config, callbacks=[...])``), then ``Report`` (the summary table,
``summary.md`` and ``learning_curve.png``, from everything the others added to ``final``).

With several ranks (torchrun) every rank calls every callback, at the same points: evaluation
is split over the ranks, what writes files asks ``run.is_main`` (rank 0), and a stop asked on any
rank stops every rank.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import torch
from torch import nn

from nets.errors import BadInput
from trainers import parallel, report
from trainers.env_contract import initial_frames
from trainers.evaluation import evaluate_episodes
from trainers.files import open_append, write_atomic
from trainers.metrics import named_metrics, read_jsonl
from trainers.report import EVAL_EPISODES_FILE
from trainers.rollout import episode_summary
from trainers.run_context import RunContext

__all__ = ["Callback", "Checkpointing", "Evaluation", "Report", "RunContext"]


class Callback:
    """Base class: override the hooks you need (each does nothing by default). ``on_iteration_end``
    and ``on_row_logged`` may return ``False`` to stop the run."""

    def on_training_start(self, run: RunContext) -> None:
        pass

    def on_iteration_end(self, run: RunContext, row: dict[str, Any]) -> bool | None:
        pass

    def on_row_logged(self, run: RunContext, row: dict[str, Any]) -> bool | None:
        pass

    def on_training_end(self, run: RunContext, final: dict[str, Any]) -> None:
        pass


class Evaluation(Callback):
    """Episodes on a separate eval env (``RunConfig.eval_*``), deterministic: before training
    (``eval_at_start``), every ``eval_every`` iterations and at the end (``eval_every`` -1: never).
    Each episode goes to ``eval_episodes.jsonl``; with ``video`` an mp4 under ``videos/``.

    That is the run's own ``Evaluation()``. More of them can be added as user callbacks, each with
    settings of its own (None: the ``RunConfig``'s): ``name`` prefixes its metrics
    (``<name>/success_once``...) and names its episodes file (``<name>_episodes.jsonl``) and videos;
    ``every``, ``at_start``, ``episodes``, ``num_envs``, ``video`` as the ``eval_*`` fields
    (``episodes="all"``: every initial frame of the env once, for envs that have them);
    ``train_env_kwargs`` plays the *training* env made with these kwargs (e.g. a fixed set of
    training starts) instead of the eval env; ``deterministic=False`` samples the actions. Sampling
    draws from a generator of the evaluation's own, seeded the same at every evaluation (``seed`` +
    10**6 + rank; the env's resets use ``seed`` + 10**6): the policy's training stream is left where
    it was, so a run trains the same with or without the evaluation, and successive evaluations
    share their noise.

    With several ranks each plays its share of the episodes (``evaluate_episodes(shard=...)``: the
    same starts the single process plays) on its share of the eval envs, and the episodes are
    gathered on every rank; the video shows rank 0's.
    """

    def __init__(
        self,
        name: str = "eval",
        *,
        every: int | None = None,
        at_start: bool | None = None,
        episodes: int | Literal["all"] | None = None,
        num_envs: int | None = None,
        video: bool | None = None,
        train_env_kwargs: dict[str, Any] | None = None,
        deterministic: bool = True,
    ) -> None:
        if not name or "/" in name:
            raise BadInput(f"an evaluation's name must be non-empty without '/', got {name!r}")
        if episodes is not None and episodes != "all" and (not isinstance(episodes, int) or episodes < 1):
            raise BadInput(f"episodes must be >= 1 or 'all', got {episodes!r}")
        self.name, self.deterministic, self.train_env_kwargs = name, deterministic, train_env_kwargs
        self._every, self._at_start, self._episodes = every, at_start, episodes
        self._num_envs, self._video = num_envs, video
        self.file = EVAL_EPISODES_FILE if name == "eval" else f"{name}_episodes.jsonl"
        self.env: Any = None
        self.last: dict[str, float] = {}
        self.step: int | None = None  # the env step of the last evaluation

    def settings(self, run: RunContext) -> dict[str, Any]:
        """Every, at_start, episodes, num_envs and video: this evaluation's, else the run's."""
        cfg = run.config
        episodes = self._episodes or cfg.eval_episodes
        most = cfg.num_envs if episodes == "all" else min(episodes, cfg.num_envs)
        return {
            "every": cfg.eval_every if self._every is None else self._every,
            "at_start": cfg.eval_at_start if self._at_start is None else self._at_start,
            "episodes": episodes,
            "num_envs": self._num_envs or cfg.eval_num_envs or most,
            "video": cfg.video if self._video is None else self._video,
        }

    def on_training_start(self, run: RunContext) -> None:
        self.step = None  # this run has not evaluated yet (the callback may be reused)
        if run.is_main:  # a resumed run drops the episodes logged after its checkpoint
            resumed = run.config.resume is not None
            _keep_until(run.dir / self.file, run.counters["env_steps"] if resumed else None)
        s = self.settings(run)
        self._check_spaces(run, s)
        if s["at_start"] and run.counters["iteration"] == 0 and s["every"] >= 0:
            run.log({"iteration": 0, **self.evaluate(run)})
            if s["every"] == 0:  # not needed again until the end
                self.close()

    def on_iteration_end(self, run: RunContext, row: dict[str, Any]) -> None:
        every = self.settings(run)["every"]
        if every > 0 and run.counters["iteration"] % every == 0 and not run.finished:
            row.update(self.evaluate(run))

    def on_training_end(self, run: RunContext, final: dict[str, Any]) -> None:
        if self.settings(run)["every"] >= 0:
            if self.step != run.counters["env_steps"]:  # else a callback stopped the run right after one
                self.evaluate(run)
                run.log({"iteration": run.counters["iteration"], **self.last})
            final.update(self.last)
        self.close()

    def evaluate(self, run: RunContext) -> dict[str, float]:
        step = run.counters["env_steps"]
        with run.gathered():  # fsdp: whole parameters (every rank, also one without a share)
            episodes = self._episodes_of(run, step)
        episodes = [ep for part in parallel.all_gather(episodes) for ep in part]
        if run.is_main:
            with open_append(run.dir / self.file) as f:  # a symbolic link is refused
                for ep in episodes:
                    f.write(json.dumps({"env_step": step, **ep}, default=float) + "\n")
        self.last = named_metrics(self.name, episode_summary(episodes))
        self.step = step
        return self.last

    def _episodes_of(self, run: RunContext, step: int) -> list[dict[str, float]]:
        """This rank's share of the evaluation episodes."""
        cfg, s = run.config, self.settings(run)
        episodes: list[dict[str, float]] = []
        count = s["episodes"]
        if count == "all":
            frames = initial_frames(self._env(run, s))
            if frames is None:
                raise BadInput(f"evaluation {self.name!r}: episodes='all' needs an env with initial_frames")
            count = len(frames)
        if len(parallel.shard(count, run.rank, run.world_size)):  # this rank's share
            self._env(run, s)
            video = None
            if s["video"] and run.is_main:
                video = run.dir / "videos" / f"{self.name}_{step:09d}.mp4"
            sampling_seed = cfg.seed + 10**6 + run.rank
            with _own_sampling(run.policy, sampling_seed, enabled=not self.deterministic):
                episodes = evaluate_episodes(
                    run.policy,
                    self.env,
                    count,
                    seed=cfg.seed + 10**6,
                    deterministic=self.deterministic,
                    video_path=video,
                    video_fps=cfg.video_fps,
                    progress=cfg.progress and run.is_main,
                    shard=(run.rank, run.world_size),
                )
        return episodes

    def _check_spaces(self, run: RunContext, s: dict[str, Any]) -> None:
        """Before training: an eval env whose spaces are not the policy's (it may observe more keys,
        e.g. a camera for videos) is bad input (named), not a shape error at the first evaluation.
        Made at once when it evaluates at the start; else an env like it with one sub-env is made and
        closed, where its settings differ from training's."""
        cfg = run.config
        if run.env_spaces is None or s["every"] < 0:
            return
        if not s["at_start"] and cfg.eval_env is None and self.train_env_kwargs is None:
            if cfg.eval_env_kwargs is None or cfg.eval_env_kwargs == cfg.env_kwargs:
                return  # the training env's settings: its spaces
        if s["at_start"] and run.counters["iteration"] == 0:
            env = self._env(run, s)
            spaces = (env.single_observation_space, env.single_action_space)
        else:
            with closing(
                cfg.make_env(
                    1, autoreset="disabled_native", evaluation=True, train_env_kwargs=self.train_env_kwargs
                )
            ) as env:
                spaces = (env.single_observation_space, env.single_action_space)
        for what, theirs, ours in zip(("observation", "action"), spaces, run.env_spaces, strict=True):
            if isinstance(theirs, gym.spaces.Dict) and isinstance(ours, gym.spaces.Dict):  # more keys: fine
                theirs = gym.spaces.Dict({k: theirs[k] for k in ours.spaces if k in theirs.spaces})
            if theirs != ours:
                source = f"eval env {cfg.eval_env or cfg.env} with eval_env_kwargs {cfg.eval_env_kwargs}"
                raise BadInput(
                    f"evaluation {self.name!r}: the {source} has the {what} space {theirs}, but the policy "
                    f"was built for {ours} (the training env's): give an eval env with the same spaces"
                )

    def _env(self, run: RunContext, s: dict[str, Any]) -> Any:
        """This rank's eval envs, made at the first evaluation and kept until ``close``."""
        if self.env is None:
            self.env = run.config.make_env(
                math.ceil(s["num_envs"] / run.world_size),
                autoreset="disabled_native",
                render_mode="rgb_array" if s["video"] else None,
                evaluation=True,
                train_env_kwargs=self.train_env_kwargs,
            )
        return self.env

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


@contextmanager
def _own_sampling(policy: nn.Module, seed: int, enabled: bool = True) -> Iterator[None]:
    """Inside, ``policy`` samples from a generator seeded with ``seed``; afterwards its generators
    (its own and those of policies inside it) are the same objects in the same states as before,
    and so is torch's global RNG (which a policy without a generator samples from)."""
    if not enabled:
        yield
        return
    saved = [
        (m, m.generator, m.generator.get_state())
        for m in policy.modules()
        if isinstance(getattr(m, "generator", None), torch.Generator)
    ]
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    policy.seed(seed)
    try:
        yield
    finally:
        for m, g, state in saved:
            g.set_state(state)
            m.generator = g
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _keep_until(path: Path, env_step: int | None) -> None:
    """An episodes file of a resumed run keeps the rows up to ``env_step`` (the checkpoint's);
    a fresh run (None) starts without one."""
    if env_step is None or not path.exists():
        path.unlink(missing_ok=True)
        return
    rows = read_jsonl(path, missing_ok=True, drop_torn_tail=True)  # a torn last line: dropped, with a warning
    kept = [r for r in rows if float(r.get("env_step", math.inf)) <= env_step]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


class Checkpointing(Callback):
    """A checkpoint every ``RunConfig.checkpoint_every`` iterations, and one at the end
    (``run.final_checkpoint``)."""

    def on_row_logged(self, run: RunContext, row: dict[str, Any]) -> None:
        every = run.config.checkpoint_every
        if every > 0 and run.counters["iteration"] % every == 0 and not run.finished:
            run.save()

    def on_training_end(self, run: RunContext, final: dict[str, Any]) -> None:
        run.final_checkpoint = run.save()


class Report(Callback):
    """At the end: the summary table on stdout, ``summary.md`` and ``learning_curve.png``
    (``trainers/report.py``)."""

    def on_training_end(self, run: RunContext, final: dict[str, Any]) -> None:
        run.close_progress()  # the table prints below a finished bar
        checkpoint = run.final_checkpoint or run.save()
        if run.is_main:
            spec = run.checkpoints.spec
            rows = report.summary_rows(
                env=run.config.env,
                policy=spec["name"] if spec else run.config.policy,
                init_policy=run.config.init_policy,
                counters=run.counters,
                elapsed=run.elapsed(),
                final=final,
                run_dir=run.dir,
                checkpoint=checkpoint,
            )
            report.write_report(run.dir, run.algo, run.config.env, rows, checkpoint)
