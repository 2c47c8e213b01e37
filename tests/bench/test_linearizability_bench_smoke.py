"""Smoke test of bench/linearizability.py: on the synthetic soak-shaped key and a small
nemesis history (the register ops of tests/ops/test_nemesis_check.py's clean run), every
row is written with both checkers' answers (a few seconds: the plain search spends its
2,000,000 steps). No time is checked."""
import json
import subprocess
import sys

from tests.ops.test_nemesis_check import CLEAN_FINAL, clean

from .bench_run import BENCH_DIR

LIMIT_S = 120  # a hang guard only


def test_linearizability_bench_writes_every_row(tmp_path):
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in clean().final(**CLEAN_FINAL)))
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(BENCH_DIR / "linearizability.py"), str(history), "--json", str(out)],
                          capture_output=True, text=True, timeout=LIMIT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert [(r["key"], r["ops"]) for r in rows] == [("k", 3000), ("r", 4)], rows
    synthetic, small = rows
    assert synthetic["plain"]["answer"] == "undecided" and synthetic["checker"]["answer"] is True
    assert small["plain"]["answer"] is True and small["checker"]["answer"] is True
