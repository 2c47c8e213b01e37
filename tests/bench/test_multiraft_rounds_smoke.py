"""Smoke test of bench/multiraft_rounds.py: 1 and 2 groups in one process, half a second
each, figures as JSON. Only that the benchmark works is checked, never a figure."""
import json
import math
import subprocess
import sys

from .bench_run import BENCH_DIR

LIMIT_S = 120  # a hang guard only


def test_multiraft_rounds_bench_writes_a_row_per_group_count(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(BENCH_DIR / "multiraft_rounds.py"), "--groups", "1,2",
                           "--seconds", "0.5", "--json", str(out), "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=LIMIT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["groups"] for r in rows] == [1, 2], rows
    for r in rows:
        assert r["proposals_per_s"] > 0 and r["leader_rounds_per_proposal"] > 0, r
        assert all(math.isfinite(r[k]) for k in ("cpu_us_per_proposal", "cpu_us_per_leader_round")), r
