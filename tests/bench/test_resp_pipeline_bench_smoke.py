"""Smoke test of bench/resp_pipeline.py: `--quick --json --profile` runs end to end, writes
both figures and their ratio as numbers, and every node leaves its cProfile file
(node_main.py's XRAFT_CPROFILE). No figure is checked against a target."""
import json
import math

from .bench_run import run_bench

KEYS = ("redis_replicas_pipelined_xadd_per_s", "resp_pipelined_xadd_per_s", "resp_pipelined_vs_redis_replicas")
LIMIT_S = 300  # a hang guard only


def test_resp_pipeline_bench_quick_writes_its_keys_and_profiles(tmp_path):
    out, prof = tmp_path / "figures.json", tmp_path / "prof"
    code, text = run_bench("resp_pipeline.py", ["--quick", "--json", str(out), "--profile", str(prof)],
                           tmp_path / "work", ("cluster",), LIMIT_S)
    assert code == 0, text
    figures = json.loads(out.read_text())
    for key in KEYS:
        value = figures.get(key)
        assert isinstance(value, float) and math.isfinite(value) and value > 0, f"{key} = {value!r}\n{text}"
    assert sorted(p.name for p in prof.iterdir()) == ["node-1.prof", "node-2.prof", "node-3.prof"]
    assert "by own time" in text
