"""What a finished run leaves for a person: the summary table on stdout, ``learning_curve.png`` and
``summary.md`` (``write_report``, called by the ``Report`` callback at the end of a run).

Both files are drawn from the run directory's files (``metrics.jsonl``, ``eval_episodes.jsonl``)
and written atomically (``trainers.files.write_atomic``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainers.files import write_atomic
from trainers.metrics import fmt, format_table, mcnemar_p, read_jsonl, read_metrics, wilson_interval

EVAL_EPISODES_FILE = "eval_episodes.jsonl"  # one row per evaluation episode, with the env step
# the final metrics shown in the summary table, where the run has them
SUMMARY_METRICS = (
    "env/return",
    "env/success_once",
    "eval/return",
    "eval/success_once",
    "eval/success",
    "eval/episode_len",
    "train/approx_kl",
    "train/clip_fraction",
    "train/entropy",
    "train/updates_per_chunk",
    "train/policy_lag_mean",
    "train/policy_lag_max",
)


def _moving_average(
    values: list[float], weights: list[float], width: int, min_weight: float = 0.0
) -> list[float]:
    """The mean of the last ``width`` values, each weighted (an iteration by its episodes); NaN (not
    drawn) until the window holds ``min_weight`` (episodes)."""
    out = []
    for i in range(len(values)):
        v, w = values[max(0, i - width + 1) : i + 1], weights[max(0, i - width + 1) : i + 1]
        total = sum(w)
        mean = sum(a * b for a, b in zip(v, w)) / total if total > 0 else float("nan")
        out.append(mean if total >= min_weight else float("nan"))
    return out


def plot_learning_curve(run_dir: str | Path) -> Path | None:
    """Training (sampled actions) and evaluation success, or return where the env reports no
    success, against env steps; None when there is nothing to plot."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    metric = (
        "success_once" if any("env/success_once" in r or "eval/success_once" in r for r in rows) else "return"
    )
    train = [
        (r["step"], r[f"env/{metric}"], r.get("env/episodes", 1.0)) for r in rows if f"env/{metric}" in r
    ]
    evals = [(r["step"], r[f"eval/{metric}"]) for r in rows if f"eval/{metric}" in r]
    if not train and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        x, y, n = zip(*train)  # an iteration's mean and its number of episodes
        ax.scatter(
            x, y, s=[4 + 2 * k for k in n], color="tab:blue", alpha=0.3, label="iterations (dot: episodes)"
        )
        mean = _moving_average(list(y), list(n), 10, min_weight=10)  # from 10 episodes on
        ax.plot(x, mean, color="tab:blue", label="training episodes (sampled), last 10 iterations")
    if evals:
        x, y = zip(*evals)
        ax.plot(x, y, "o-", color="tab:orange", label="evaluation (deterministic)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate" if metric == "success_once" else "episode return")
    if metric == "success_once":
        ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png")
    plt.close(fig)
    return write_atomic(run_dir / "learning_curve.png", image.getvalue())


def _rate_cell(episodes: list[dict[str, Any]], key: str) -> str:
    k, n = sum(bool(e.get(key, 0)) for e in episodes), len(episodes)
    low, high = wilson_interval(k, n)
    return f"{k}/{n} = {k / max(n, 1):.1%} [{low:.2f}, {high:.2f}]"


def evaluation_table(episodes: list[dict[str, Any]]) -> list[str]:
    """Markdown rows of success per task (and overall) with 95% Wilson intervals."""
    key = "success_once" if any("success_once" in e for e in episodes) else "success"
    by_task: dict[str, list[dict[str, Any]]] = {}
    for ep in episodes:
        by_task.setdefault(str(ep.get("task") or "all"), []).append(ep)
    lines = ["| task | success (95% Wilson interval) |", "|---|---|"]
    if len(by_task) > 1:
        lines += [
            f"| {task.split('/', 1)[-1]} | {_rate_cell(eps, key)} |" for task, eps in sorted(by_task.items())
        ]
    lines.append(f"| **all** | **{_rate_cell(episodes, key)}** |")
    return lines


def paired_change(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """Markdown lines on the change between two evaluations of the same initial frames: the
    difference in success and the exact McNemar test on the frames whose outcome changed."""
    key = "success_once" if any("success_once" in e for e in after) else "success"
    first = {e["frame"]: bool(e.get(key, 0)) for e in before if "frame" in e}
    pairs = [(first[e["frame"]], bool(e.get(key, 0))) for e in after if e.get("frame") in first]
    if not pairs:
        return []
    gained = sum(b < a for b, a in pairs)
    lost = sum(b > a for b, a in pairs)
    change = (sum(a for _, a in pairs) - sum(b for b, _ in pairs)) / len(pairs)
    p = mcnemar_p(gained, lost)
    return [
        f"**Change on the {len(pairs)} initial frames evaluated before and after: {change:+.1%}** "
        f"({gained} turned into successes, {lost} into failures; exact McNemar p = {p:.3g})."
    ]


def write_summary(
    run_dir: str | Path, title: str, rows: list[tuple[str, Any]], files: dict[str, str]
) -> Path:
    """``summary.md``: the final table, every evaluation (per task where the env says which), the
    files of the run and how to look at them."""
    run_dir = Path(run_dir)
    lines = [f"# {title}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {fmt(value)} |" for name, value in rows]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for ep in read_jsonl(run_dir / EVAL_EPISODES_FILE, missing_ok=True):
        by_step.setdefault(int(ep["env_step"]), []).append(ep)
    for step, eps in sorted(by_step.items()):
        when = "before training" if step == 0 else f"after {step} env steps"
        lines += ["", f"## Evaluation {when} ({len(eps)} episodes, deterministic actions)", ""]
        lines += evaluation_table(eps)
    if 0 in by_step and len(by_step) > 1:
        lines += ["", *paired_change(by_step[0], by_step[max(by_step)])]
    if files:
        lines += ["", "## Files", ""]
        lines += [f"- {name}: [`{path}`]({path})" for name, path in files.items()]
    lines += ["", f"TensorBoard: `tensorboard --logdir {run_dir / 'tb'}`", ""]
    return write_atomic(run_dir / "summary.md", "\n".join(lines))


def summary_rows(
    *,
    env: str,
    policy: str,
    init_policy: str | None,
    counters: Mapping[str, Any],
    elapsed: float,
    final: Mapping[str, float],
    run_dir: Path,
    checkpoint: Path,
) -> list[tuple[str, Any]]:
    """The summary table of a finished run: what it trained, how long, its final metrics
    (``SUMMARY_METRICS``) and where its files are."""
    rows: list[tuple[str, Any]] = [
        ("env", env),
        ("policy", policy),
        ("initial policy", init_policy or "new"),
        ("env steps", counters["env_steps"]),
        ("iterations", counters["iteration"]),
        ("episodes", counters["episodes"]),
        ("wall time (s)", float(elapsed)),
        ("env steps / s", counters["env_steps"] / max(elapsed, 1e-9)),
    ]
    rows += [(key, float(final[key])) for key in SUMMARY_METRICS if key in final]
    return rows + [("run directory", str(run_dir)), ("checkpoint", checkpoint.name)]


def write_report(run_dir: Path, algo: str, env: str, rows: list[tuple[str, Any]], checkpoint: Path) -> Path:
    """Print the summary table, then write ``learning_curve.png`` and ``summary.md`` (listing the
    run's files: final checkpoint, config, curve, evaluation videos, metrics); returns the summary."""
    print(format_table(rows, title=f"{algo} summary"))
    files = {"checkpoint": str(checkpoint.relative_to(run_dir)), "config": "config.json"}
    plot = plot_learning_curve(run_dir)
    if plot is not None:
        files["learning curve"] = plot.name
    for video in sorted((run_dir / "videos").glob("eval_*.mp4")):
        files[f"evaluation video at env step {int(video.stem[5:])}"] = str(video.relative_to(run_dir))
    files["metrics (one row per iteration)"] = "metrics.jsonl"
    path = write_summary(run_dir, f"{algo} on {env}", rows, files)
    print(f"summary: {path}")
    return path
