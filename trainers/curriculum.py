"""A task curriculum over an env's start frames: practise most the tasks the policy fails.

Each task's recent success rate ``p`` (the last ``window`` episodes that started from one of its
frames, with one success and one failure added as a prior: ``(s + 1) / (n + 2)``) gives it the weight
``max(1 - p, floor)``; a start is drawn by choosing a task in proportion to its weight, then one of its
frames uniformly. Before any episode every task weighs the same (``p = 1/2``), as the env's own draw.

The trainer's collector restarts finished envs at ``draw``'s frames (``trainers.rollout.Collector``,
``start_frames``) and feeds the ended episodes, which carry their ``frame``, back to ``record``. The
env must have start frames that name their task (``trainers.env_contract.frame_tasks``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from nets.errors import BadInput


class TaskCurriculum:
    """Per-task success rates over the last ``window`` episodes and the start draw they set.

    Args:
        frame_tasks: the task of every start frame (frame id -> task name).
        floor: the least weight a task keeps, in (0, 1], so that tasks it has learned are still practised.
        window: how many of a task's latest episodes its success rate counts.
        seed: the draw's random stream.
    """

    def __init__(self, frame_tasks: Sequence[str], floor: float, window: int, seed: int) -> None:
        if not frame_tasks:
            raise BadInput("a task curriculum needs start frames that name their task; the env has none")
        if not 0.0 < floor <= 1.0:
            raise BadInput(f"curriculum floor must be in (0, 1], got {floor}")
        if window < 1:
            raise BadInput(f"curriculum window must be >= 1, got {window}")
        self.frame_tasks = [str(t) for t in frame_tasks]
        self.tasks = list(dict.fromkeys(self.frame_tasks))
        ids = np.arange(len(self.frame_tasks))
        self.frames_of = {t: ids[np.array(self.frame_tasks) == t] for t in self.tasks}
        self.floor, self.window = float(floor), int(window)
        self.outcomes: dict[str, deque[bool]] = {t: deque(maxlen=self.window) for t in self.tasks}
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        """Draw from a new random stream (an actor process's own, at each of its starts)."""
        self.rng = np.random.default_rng(seed)

    def record(self, episodes: Iterable[dict[str, Any]]) -> None:
        """Count the ended episodes that say which frame they started from (``frame``, ``success``)."""
        for ep in episodes:
            frame = ep.get("frame")
            if frame is None or not 0 <= int(frame) < len(self.frame_tasks):
                continue
            self.outcomes[self.frame_tasks[int(frame)]].append(bool(ep.get("success", 0)))

    def success_rates(self) -> np.ndarray:
        """Each task's smoothed recent success rate, in ``self.tasks`` order."""
        return np.array([(sum(o) + 1.0) / (len(o) + 2.0) for o in self.outcomes.values()])

    def task_weights(self) -> np.ndarray:
        """Each task's share of the starts drawn (sums to 1), in ``self.tasks`` order."""
        w = np.maximum(1.0 - self.success_rates(), self.floor)
        return w / w.sum()

    def draw(self, count: int) -> list[int]:
        """``count`` start frame ids."""
        tasks = self.rng.choice(len(self.tasks), size=count, p=self.task_weights())
        return [int(self.rng.choice(self.frames_of[self.tasks[k]])) for k in tasks]

    def state_dict(self) -> dict[str, Any]:
        return {
            "outcomes": {t: list(o) for t, o in self.outcomes.items()},
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        outcomes = state.get("outcomes") if isinstance(state, dict) else None
        if not isinstance(outcomes, dict) or set(outcomes) != set(self.tasks):
            raise BadInput(
                f"curriculum state names tasks {sorted(outcomes or {})!r:.300}, "
                f"the env's are {self.tasks!r:.300}"
            )
        for t, o in outcomes.items():
            self.outcomes[t] = deque((bool(x) for x in o), maxlen=self.window)
        self.rng.bit_generator.state = state["rng"]
