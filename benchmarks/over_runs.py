"""Recipes compared over their training runs: each run of ``rl_recipe_study`` is one number, its
held-out success.

The study's pooled McNemar test (``rl_recipe_study --compare``) pairs two runs' evaluation episodes
and takes them as the only randomness. Two training runs of one recipe land further apart than that
(on the selection split one recipe and seed gave 62 and 48 of 100: benchmarks/README.md), so a bar
such as "+10 points over the longer clone" is a question about runs. Here, per variant: each run's
successes, their mean and t-interval; between two variants: the difference of the means, its Welch
interval and Welch's t-test.

    python -m benchmarks.over_runs runs/a runs/b runs/c          # every */result.json below them
    python -m benchmarks.over_runs runs/* --compare sil-recipe clone-sil-recipe
    python -m benchmarks.over_runs runs/* --alias old-name=new-name   # one recipe under two names

Runs count together only when they were judged on the same pairs: the same number of episodes and,
where the study's ``rl_recipe_study.json`` beside them says so, the same held-out init states.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.report import table, write_json
from nets.errors import BadInput, program_name, run_cli


def find_runs(folders: list[str | Path], aliases: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every finished study run (``result.json``) at any depth below ``folders``, once each, with its
    variant (renamed by ``aliases``), seed, successes, episodes and held-out init states (None where
    no study summary sits beside it)."""
    aliases = aliases or {}
    runs, seen = [], set()
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise BadInput(f"{folder}: expected a folder of rl_recipe_study runs, found none there")
        for path in sorted(folder.rglob("result.json")):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            result = json.loads(path.read_text())
            if not {"variant", "seed", "after"} <= set(result):
                raise BadInput(f"{path}: not an rl_recipe_study result (expected variant, seed and after)")
            study = path.parent.parent / "rl_recipe_study.json"  # the invocation's arguments
            args = json.loads(study.read_text())["args"] if study.is_file() else {}
            after = result["after"]
            runs.append({
                "path": str(path.parent), "variant": aliases.get(result["variant"], result["variant"]),
                "seed": result["seed"], "successes": sum(bool(ep["success"]) for ep in after),
                "trials": len(after), "eval_init_states": args.get("eval_init_states"),
                # imitation's counter is samples trained, not env steps
                "env_steps": result.get("env_steps") if result.get("algo") != "bc" else None,
            })  # fmt: skip
    return runs


def summarize(points: list[float]) -> dict[str, Any]:
    """Mean, sample sd and 95% t-interval of the runs' success (points of 100); no interval for one run
    or no spread."""
    from scipy.stats import ttest_1samp

    n, mean = len(points), sum(points) / len(points)
    sd = math.sqrt(sum((x - mean) ** 2 for x in points) / (n - 1)) if n > 1 else None
    ci = list(map(float, ttest_1samp(points, 0.0).confidence_interval(0.95))) if sd else None
    return {"runs": n, "points": points, "mean": mean, "sd": sd, "ci95": ci}


def welch(a: list[float], b: list[float]) -> dict[str, Any]:
    """A's mean minus B's, the 95% Welch interval of that difference and Welch's two-sided t-test p
    (None with fewer than two runs on a side, or no spread at all)."""
    from scipy.stats import ttest_ind

    diff = sum(a) / len(a) - sum(b) / len(b)
    if len(a) < 2 or len(b) < 2 or len(set(a)) == len(set(b)) == 1:
        return {"difference": diff, "ci95": None, "p": None, "df": None}
    test = ttest_ind(a, b, equal_var=False)
    ci = list(map(float, test.confidence_interval(0.95)))
    return {"difference": diff, "ci95": ci, "p": float(test.pvalue), "df": float(test.df)}


def check_same_pairs(runs: list[dict[str, Any]]) -> None:
    """Runs compared must have been judged on the same pairs: refuse a mix, naming two runs."""
    first = runs[0]
    for run in runs[1:]:
        states = (first["eval_init_states"], run["eval_init_states"])
        if run["trials"] != first["trials"] or (None not in states and states[0] != states[1]):
            raise BadInput(
                f"{run['path']} was judged on {run['trials']} episodes of init states {states[1]}, "
                f"{first['path']} on {first['trials']} of {states[0]}: expected runs on the same pairs"
            )


def compare(runs: list[dict[str, Any]], wanted: list[list[str]] | None) -> dict[str, Any]:
    """Per variant its runs' summary; per wanted (A, B) pair ``welch``. By default every variant
    against each imitation control (``clone-*``) that ran."""
    points: dict[str, list[float]] = {}
    for run in runs:
        points.setdefault(run["variant"], []).append(100 * run["successes"] / run["trials"])
    if wanted is None:
        clones = [v for v in points if v.startswith("clone-")]
        wanted = [[v, c] for v in points if v not in clones for c in clones]
    missing = sorted({v for pair in wanted for v in pair} - set(points))
    if missing:
        raise BadInput(f"--compare names variants with no runs: {missing}; found {sorted(points)}")
    for a, b in wanted:
        check_same_pairs([r for r in runs if r["variant"] in (a, b)])
    return {
        "variants": {v: summarize(p) for v, p in points.items()},
        "comparisons": [{"a": a, "b": b, **welch(points[a], points[b])} for a, b in wanted],
    }


def _interval(ci: list[float] | None, sign: str = "") -> str:
    return "n/a" if ci is None else f"[{ci[0]:{sign}.1f}, {ci[1]:{sign}.1f}]"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="folders holding rl_recipe_study runs (searched below)")
    parser.add_argument(
        "--compare", nargs=2, action="append", metavar=("A", "B"), default=None,
        help="variant A against B over runs (repeatable; default: each variant against the clone-* ones)",
    )  # fmt: skip
    parser.add_argument(
        "--alias", action="append", default=[], metavar="OLD=NEW", help="count variant OLD's runs as NEW's"
    )
    parser.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    aliases = {}
    for item in args.alias:
        old, sep, new = item.partition("=")
        if not (sep and old and new):
            raise BadInput(f"--alias expects OLD=NEW, got {item!r}")
        aliases[old] = new
    runs = find_runs(args.folders, aliases)
    if not runs:
        raise BadInput(f"no rl_recipe_study runs (result.json) below {args.folders}")
    found = compare(runs, args.compare)
    print(
        table(
            ["variant", "seed", "held-out success", "env steps", "run folder"],
            [
                [r["variant"], r["seed"], f"{r['successes']}/{r['trials']}", r["env_steps"] or "-", r["path"]]
                for r in sorted(runs, key=lambda r: (r["variant"], r["seed"]))
            ],  # fmt: skip
            "the runs, each one number",
        )
    )
    print(
        table(
            ["variant", "runs", "success of each (points)", "mean", "sd", "95% t-interval"],
            [
                [
                    v,
                    s["runs"],
                    " ".join(f"{x:.0f}" for x in s["points"]),
                    f"{s['mean']:.1f}",
                    "n/a" if s["sd"] is None else f"{s['sd']:.1f}",
                    _interval(s["ci95"]),
                ]
                for v, s in found["variants"].items()
            ],  # fmt: skip
            "per variant, over its runs",
        )
    )
    if found["comparisons"]:
        print(
            table(
                ["A", "B", "A - B (points)", "95% Welch interval", "Welch t p"],
                [
                    [
                        c["a"],
                        c["b"],
                        f"{c['difference']:+.1f}",
                        _interval(c["ci95"], "+"),
                        "n/a" if c["p"] is None else f"{c['p']:.3g}",
                    ]
                    for c in found["comparisons"]
                ],  # fmt: skip
                "A against B, each run one draw (Welch: unequal spreads)",
            )
        )
    summary = {"runs": runs, **found}
    if args.out:
        write_json(args.out, summary)
    return summary


if __name__ == "__main__":
    run_cli(main)
