"""Smoke test of bench/latency.py: a short traced run follows writes through all three
processes, and every phase of the breakdown is there and never negative (the trace points are
stamped with one clock in causal order: a negative phase means a point moved off the path).

Figures are not checked against targets: timings on a shared machine are not test material.
"""
import json
import math

from .bench_run import run_bench

LIMIT_S = 240  # a hang guard only


def test_latency_bench_follows_writes_through_every_phase(tmp_path):
    out = tmp_path / "figures.json"
    code, text = run_bench("latency.py", ["--seconds", "0.5", "--no-untraced", "--json", str(out)],
                           tmp_path / "work", ("traced",), LIMIT_S)
    assert code == 0, text
    figures = json.loads(out.read_text())
    assert figures["followed"] >= 1, text
    phases = figures["phases_ms"]
    assert len(phases) == 19, sorted(phases)
    for name, row in phases.items():
        for q in ("p50", "p99", "mean"):
            assert math.isfinite(row[q]) and row[q] >= 0, (name, row, text)
    path = [v["mean"] for k, v in phases.items() if not k.startswith(("leader:", "total"))]
    assert math.isclose(sum(path), phases["total (client)"]["mean"], rel_tol=1e-6), text
    groups = figures["groups_ms"]                 # every path phase in exactly one group
    assert len(groups) == 5, sorted(groups)
    assert math.isclose(sum(g["mean"] for g in groups.values()), sum(path), rel_tol=1e-6), text
