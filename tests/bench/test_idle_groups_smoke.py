"""Smoke test of bench/idle_groups.py: a 4-group (quiescing), a 4-group --no-quiesce and a
1-group 3-node cluster, 1 s of measurement each (about 20 s on the shared 2-core VM), write
the figures as JSON.

Only that the benchmark works is checked, never a figure against its target.
"""
import json
import math

from .bench_run import run_bench

LIMIT_S = 240  # a hang guard only


def test_idle_groups_bench_writes_both_figures(tmp_path):
    out = tmp_path / "figures.json"
    code, text = run_bench("idle_groups.py", ["--groups", "4", "--seconds", "1", "--json", str(out)],
                           tmp_path / "work", ("g1", "g4", "g4-loud"), LIMIT_S)
    assert code == 0, text
    figures = json.loads(out.read_text())
    assert figures["idle_groups"] == 4, figures
    for key in ("idle_groups_cpu_pct", "idle_1group_cpu_pct", "idle_groups_noquiesce_cpu_pct"):
        value = figures[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, f"{key} = {value!r}"
    # Measured with the leaders where the slot map prefers them: groups 1-4 on nodes 1, 2, 3, 1.
    assert sorted(figures["per_node"]["4"]["leads"].values()) == [1, 1, 2], figures
