"""The success statistics of benchmarks.evaluate."""

from __future__ import annotations

import pytest

from benchmarks.evaluate import summarize, wilson_interval


def test_wilson_interval_known_values():
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(20, 20)[0] == pytest.approx(0.8389, abs=1e-4)


def test_summarize_per_task_and_overall():
    episodes = [
        {"task": "libero_spatial/a", "success": True, "length": 100},
        {"task": "libero_spatial/a", "success": False, "length": 220},
        {"task": "libero_spatial/b", "success": True, "length": 80},
    ]
    s = summarize(episodes)
    assert [(r["task"], r["successes"], r["trials"]) for r in s["tasks"]] == [("a", 1, 2), ("b", 1, 1)]
    assert s["tasks"][0]["mean_steps_success"] == 100.0
    assert (s["successes"], s["trials"]) == (2, 3) and s["rate"] == pytest.approx(2 / 3)
