"""benchmarks/scale_out.py: envs on Ray actors against the local worker pool (starts a Ray cluster, so it
runs in the Ray files' test process: ``_RAY_FILES`` in conftest.py)."""

from __future__ import annotations

import json

import pytest
from conftest import requires_libero


@requires_libero
@pytest.mark.slow
def test_scale_out_compares_ray_actors_with_local_workers(tmp_path, capsys):
    from benchmarks.scale_out import main

    small = ["--update-envs", "4", "--update-steps", "16", "--update-hidden", "16", "--update-repeats", "1"]
    rows = main(
        ["--num-envs", "2", "--actors", "2", "--rounds", "2", "--steps", "2", *small, "--out", str(tmp_path)]
    )
    assert [r["what"] for r in rows] == ["local workers", "ray, 2 actors"]
    assert all(r["steps"] == 2 * 2 * 8 and r["steps_per_s"] > 0 and r["round_trip_ms"] > 0 for r in rows)
    out = capsys.readouterr().out
    assert "empty actor call round trip" in out and "2 processes" in out
    saved = json.loads((tmp_path / "scale_out.json").read_text())
    assert set(saved["update_seconds"]) == {"1", "2"} and all(t > 0 for t in saved["update_seconds"].values())
