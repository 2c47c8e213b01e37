"""Smoke test of bench/idle_groups.py: a 4-group and a 1-group 3-node cluster, 1 s of
measurement each (about 15 s on the shared 2-core VM), write the figures as JSON.

Only that the benchmark works is checked, never a figure against its target.
"""
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from xraft.ops import local_cluster as lc

BENCH = Path(__file__).resolve().parents[2] / "bench" / "idle_groups.py"
LIMIT_S = 240  # a hang guard only


def test_idle_groups_bench_writes_both_figures(tmp_path):
    work, out = tmp_path / "work", tmp_path / "figures.json"
    proc = subprocess.Popen([sys.executable, str(BENCH), "--groups", "4", "--seconds", "1", "--json", str(out),
                             "--dir", str(work)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)           # the bench stops its nodes on SIGTERM
        text, _ = proc.communicate(timeout=30)
        raise AssertionError(f"bench/idle_groups.py still running after {LIMIT_S} s:\n{text}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for cluster_dir in (work / "g1", work / "g4"):   # nodes run in their own sessions
            if lc.cluster_file(cluster_dir).exists():
                cluster = lc.load(str(cluster_dir))
                for node in cluster.nodes:
                    if lc.is_alive(cluster, node):
                        os.kill(node.pid, signal.SIGKILL)
    assert proc.returncode == 0, text
    figures = json.loads(out.read_text())
    assert figures["idle_groups"] == 4, figures
    for key in ("idle_groups_cpu_pct", "idle_1group_cpu_pct"):
        value = figures[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, f"{key} = {value!r}"
    # Every node of the 4-group cluster led a group when measured (preferred leaders: 2, 1, 1).
    assert sorted(figures["per_node"]["4"]["leads"].values()) == [1, 1, 2], figures
