"""Smoke test of bench/cluster.py: `--quick --json` runs end to end (about 40 s on
the shared 2-core VM) and writes every headline key as a number.

Only that the benchmark works is checked, never a figure against its target:
timings on a shared machine are not test material (bench/README.md has them).
"""
import json
import math

from .bench_run import run_bench

KEYS = ("xadd_batch100_entries_per_s", "xadd_p50_ms", "xadd_p99_ms", "xadd_c64_per_s",
        "grpc_floor_unary_c64_per_s", "consume_ack_entries_per_s", "failover_s",
        "redis_wait1_batch100_entries_per_s", "sharded_xadd_batch100_entries_per_s", "slot_move_s",
        "slot_move_write_wait_ms", "crossshard_consume_entries_per_s", "resp_pipelined_xadd_per_s",
        "redis_replicas_pipelined_xadd_per_s", "sharded_resp_pipelined_xadd_per_s",
        "idmp_xadd_batch100_entries_per_s", "crossshard_single_stream_same_cluster_entries_per_s",
        "slot_move_other_group_wait_ms", "no_move_other_group_wait_ms")
LIMIT_S = 300  # a hang guard only; the run normally takes well under a minute


def test_cluster_bench_quick_writes_every_key(tmp_path):
    out = tmp_path / "figures.json"
    code, text = run_bench("cluster.py", ["--quick", "--json", str(out)], tmp_path / "work",
                           ("cluster", "sharded"), LIMIT_S)
    assert code == 0, text
    figures = json.loads(out.read_text())
    for key in KEYS:
        assert key in figures, f"{key} missing from {sorted(figures)}\n{text}"
        value = figures[key]
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), \
            f"{key} = {value!r}"
