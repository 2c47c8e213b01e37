"""Smoke test of bench/scale.py: `--quick --json` runs every phase end to end (redis memory
reference, XADD empty and full, XACK at both PEL sizes, kill -9 + restart, snapshot catch-up of
a stopped follower) and writes every figure as a positive number. No figure is checked against
a target."""
import json
import math

from .bench_run import run_bench

KEYS = ("xadd_per_s_empty", "xadd_per_s_at_10m", "xack_per_s_at_1k_pending", "xack_per_s_at_1m_pending",
        "bytes_per_entry_10m", "redis_bytes_per_entry_10m", "restart_s_1gb", "snapshot_catchup_mb_per_s")
LIMIT_S = 400  # a hang guard only


def test_scale_bench_quick_writes_its_keys(tmp_path):
    out = tmp_path / "figures.json"
    code, text = run_bench("scale.py", ["--quick", "--json", str(out)], tmp_path / "work", ("cluster",), LIMIT_S)
    assert code == 0, text
    figures = json.loads(out.read_text())
    for key in KEYS:
        value = figures.get(key)
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, f"{key} = {value!r}\n{text}"
    assert figures["scale_entries"] == 20_000 and figures["snapshot_catchup_installed"] >= 1
