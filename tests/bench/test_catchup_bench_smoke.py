"""Smoke test of bench/catchup.py: a small state, one catch-up of a stopped follower by snapshot
install, its figure written as a positive number. No figure is checked against a target.
Behind `soak`: 156 s at load average 15 (not timed quiet) (scale.py's smoke already runs the same catch-up in CI)."""
import json
import math

import pytest

from .bench_run import run_bench

LIMIT_S = 300  # a hang guard only


@pytest.mark.soak
def test_catchup_bench_writes_its_figure(tmp_path):
    out = tmp_path / "figures.json"
    code, text = run_bench("catchup.py", ["--state-mb", "16", "--runs", "1", "--snapshot-entries", "100",
                                          "--json", str(out)], tmp_path / "work", ("cluster",), LIMIT_S)
    assert code == 0, text
    figures = json.loads(out.read_text())
    run = figures["run_1"]
    assert run["snapshot_catchup_installed"] >= 1, text
    value = figures["snapshot_catchup_mb_per_s_best"]
    assert isinstance(value, float) and math.isfinite(value) and value > 0, f"{value!r}\n{text}"
