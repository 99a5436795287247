"""What every benchmark script writes: a plain-text table, JSON next to it, and a PNG plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nets.files import write_atomic
from trainers.metrics import fmt


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    cells = [[fmt(v) for v in row] for row in [list(header), *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        return "  ".join(parts).rstrip()

    rule = "-" * len(line(cells[0]))
    out = [title] if title else []
    out += [line(cells[0]), rule, *(line(r) for r in cells[1:])]
    return "\n".join(out)


def write_json(path: str | Path, data: Any) -> Path:
    """Write a benchmark's results next to its table (atomically: a reader, or a benchmark run
    beside this one, sees the old file or the new one, never half of one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(data, indent=1))


def plot_lines(
    path: str | Path,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    bands: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> Path:
    """One line per ``name: (x, y)`` (optional shaded ``bands``: ``name: (low, high)``), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for name, (x, y) in series.items():
        ax.plot(x, y, label=name)
        if bands and name in bands:
            ax.fill_between(x, *bands[name], alpha=0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
