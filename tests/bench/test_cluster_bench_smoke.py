"""Smoke test of bench/cluster.py: `--quick --json` runs end to end (about 30 s on
the shared 2-core VM) and writes every headline key as a number.

Only that the benchmark works is checked, never a figure against its target:
timings on a shared machine are not test material (bench/README.md has them).
"""
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from xraft.ops import local_cluster as lc

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cluster.py"
KEYS = ("xadd_batch100_entries_per_s", "xadd_p50_ms", "xadd_p99_ms", "xadd_c64_per_s",
        "grpc_floor_unary_c64_per_s", "consume_ack_entries_per_s", "failover_s",
        "redis_wait1_batch100_entries_per_s", "sharded_xadd_batch100_entries_per_s")
LIMIT_S = 300  # a hang guard only; the run normally takes well under a minute


def test_cluster_bench_quick_writes_every_key(tmp_path):
    work, out = tmp_path / "work", tmp_path / "figures.json"
    proc = subprocess.Popen([sys.executable, str(BENCH), "--quick", "--json", str(out), "--dir", str(work)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)           # the bench stops its nodes and redis-servers on SIGTERM
        text, _ = proc.communicate(timeout=30)
        raise AssertionError(f"bench/cluster.py --quick still running after {LIMIT_S} s:\n{text}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # Nodes run in their own sessions: make sure none outlives a failed run.
        for cluster_dir in (work / "cluster", work / "sharded"):
            if lc.cluster_file(cluster_dir).exists():
                cluster = lc.load(str(cluster_dir))
                for node in cluster.nodes:
                    if lc.is_alive(cluster, node):
                        os.kill(node.pid, signal.SIGKILL)
    assert proc.returncode == 0, text
    figures = json.loads(out.read_text())
    for key in KEYS:
        assert key in figures, f"{key} missing from {sorted(figures)}\n{text}"
        value = figures[key]
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), \
            f"{key} = {value!r}"
