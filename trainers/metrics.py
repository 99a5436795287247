"""Where a run's numbers go: a JSONL file (always), TensorBoard, Weights & Biases (optional), a
console progress bar and the final summary table.

Metric names follow RLinf's: ``env/*`` (training episodes: ``return``, ``success_once``,
``episode_len``...), ``eval/*``, ``train/*`` (losses, ``approx_kl``, ``clip_fraction``,
``entropy``, ``grad_norm``), ``rollout/*`` and ``time/*`` (``sps``: env steps per second).
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nets.errors import BadInput
from trainers.files import open_append, write_atomic

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """Writes one row per call to ``<run_dir>/metrics.jsonl`` and to the optional backends.

    Args:
        run_dir: the run's directory.
        tensorboard: also write TensorBoard event files under ``<run_dir>/tb``.
        wandb_project: log to this Weights & Biases project (needs ``pip install wandb``).
        config: the run's settings (sent to W&B).
        resume_iteration: when resuming, rows of later iterations (logged after the checkpoint
            the run resumes from) are dropped so that the file reads as one uninterrupted run (the
            file is rewritten atomically; a torn last line, from a write cut short, is dropped with
            a warning; a damaged line before it is a ``ValueError`` naming the line).
        resume_step: the env step of that checkpoint (TensorBoard purges later events).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        config: Mapping[str, Any] | None = None,
        resume_iteration: int | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        if resume_iteration is not None and self.path.exists():
            rows = read_jsonl(self.path, drop_torn_tail=True)  # a torn last line: dropped, with a warning
            kept = [r for r in rows if r.get("iteration", 0) <= resume_iteration]
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open_append(self.path)  # closed in close(); a symbolic link is refused
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                warnings.warn(
                    "tensorboard is not installed: no TensorBoard logs", RuntimeWarning, stacklevel=2
                )
            else:
                purge = None if resume_step is None else resume_step + 1  # drop events after the checkpoint
                self._tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=purge)
        self._wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("wandb_project is set but wandb is not installed: pip install wandb") from e
            self._wandb = wandb.init(
                project=wandb_project,
                dir=str(run_dir),
                config=dict(config or {}),
                name=Path(run_dir).name,
                resume="allow",
                id=Path(run_dir).name,
            )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at env step ``step`` (non-finite values are kept in JSON as null)."""
        row = {"step": int(step)}
        for key, value in metrics.items():
            row[key] = float(value) if math.isfinite(float(value)) else None
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for key, value in row.items():
            if key == "step" or value is None:
                continue
            if self._tb is not None:
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if v is not None}, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def parse_jsonl(path: str | Path) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of a JSON-lines file, and what is wrong with its last line if that one is not a
    JSON object (a torn write: a run killed, or a disk full, in the middle of a line), else None.
    A line before the last that is not a JSON object is a ``ValueError`` naming file and line."""
    path = Path(path)
    lines = [(n, line) for n, line in enumerate(path.read_bytes().split(b"\n"), 1) if line.strip()]
    rows: list[dict[str, Any]] = []
    for k, (n, line) in enumerate(lines):
        try:
            row = json.loads(line)
            problem = None if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            problem = f"{type(e).__name__}: {e}"
        if problem is None:
            rows.append(row)
        elif k == len(lines) - 1:
            return rows, f"{path}, line {n}: {problem} ({line[:60]!r})"
        else:
            raise BadInput(
                f"{path}, line {n} of {lines[-1][0]}: {problem}; the file is damaged before its last "
                "line (not a write cut short): repair or remove that line"
            )
    return rows, None


def read_jsonl(
    path: str | Path, missing_ok: bool = False, drop_torn_tail: bool = False
) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (``[]`` for a missing file when ``missing_ok``). A last line
    that is not a JSON object (a torn write) is dropped with a warning when ``drop_torn_tail``, else
    a ``ValueError``, as is any damaged line before it (``parse_jsonl``)."""
    path = Path(path)
    if missing_ok and not path.exists():
        return []
    rows, torn = parse_jsonl(path)
    if torn is not None:
        if not drop_torn_tail:
            raise BadInput(torn)
        warnings.warn(f"dropped a torn last line (a write cut short): {torn}", RuntimeWarning, stacklevel=2)
    return rows


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl``."""
    return read_jsonl(Path(run_dir) / METRICS_FILE)


class Progress:
    """A tqdm bar over env steps (quiet when disabled), showing a few headline metrics."""

    SHOWN = {"env/return": "return", "env/success_once": "success", "eval/return": "eval", "time/sps": "sps"}

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, desc: str = "") -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                unit="step",
                desc=desc,
                dynamic_ncols=True,
                mininterval=1.0,
                file=sys.stderr,
            )
        self._shown: dict[str, str] = {}

    def update(self, steps: int, metrics: Mapping[str, float]) -> None:
        if self._bar is None:
            return
        for key, short in self.SHOWN.items():
            if key in metrics and math.isfinite(metrics[key]):
                self._shown[short] = f"{metrics[key]:.3g}"
        self._bar.set_postfix(self._shown, refresh=False)
        self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def named_metrics(prefix: str, stats: Mapping[str, float]) -> dict[str, float]:
    """Episode statistics under ``prefix/`` names (``length`` -> ``episode_len``), finite ones only."""
    names = {"length": "episode_len"}
    return {f"{prefix}/{names.get(k, k)}": float(v) for k, v in stats.items() if math.isfinite(float(v))}


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate."""
    if trials == 0:
        return (float("nan"), float("nan"))
    p = successes / trials
    center = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return (max(0.0, center - half), min(1.0, center + half))


def mcnemar_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value of a paired before/after comparison: ``gained`` pairs turned
    into successes, ``lost`` into failures (pairs that did not change carry no information)."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


def fmt(value: Any) -> str:
    """Numbers to 4 significant digits; anything else as ``str``."""
    if isinstance(value, float):
        return "nan" if not math.isfinite(value) else f"{value:.4g}"
    return str(value)


def format_table(rows: list[tuple[str, Any]], title: str | None = None) -> str:
    """A two-column plain-text table (name, value), numbers to 4 significant digits."""

    cells = [(name, fmt(value)) for name, value in rows]
    width = max((len(n) for n, _ in cells), default=4)
    vwidth = max((len(v) for _, v in cells), default=5)
    line = f"+{'-' * (width + 2)}+{'-' * (vwidth + 2)}+"
    out = [line]
    if title:
        out += [f"| {title:<{width + vwidth + 3}} |", line]
    out += [f"| {n:<{width}} | {v:>{vwidth}} |" for n, v in cells]
    out.append(line)
    return "\n".join(out)
