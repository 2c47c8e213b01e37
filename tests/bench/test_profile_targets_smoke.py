"""Smoke test of bench/profile_targets.py: one short phase under py-spy runs end to end and splits
every process's CPU into areas that add up, the nodes' including the engine's apply.

Only that the profiler works is checked, never a figure: timings on a shared machine are not test
material (bench/README.md has them)."""
import json
import os
import shutil
import sys

import pytest

from .bench_run import run_bench

LIMIT_S = 300   # a hang guard only


def _py_spy():
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


@pytest.mark.skipif(_py_spy() is None, reason="py-spy is not installed (pip install -e '.[dev]' installs it)")
def test_one_profiled_phase_splits_every_process(tmp_path):
    out = tmp_path / "profile.json"
    code, text = run_bench("profile_targets.py", ["--phases", "batch", "--seconds", "2", "--json", str(out)],
                           tmp_path / "work", ("batch",), LIMIT_S)
    assert code == 0, text
    (phase,) = json.loads(out.read_text())["phases"]
    assert phase["phase"] == "batch" and phase["per_s"] > 0, text
    assert {p.removesuffix("(L)") for p in phase["processes"]} == {"node1", "node2", "node3", "client"}, text
    leaders = [p for p in phase["processes"] if p.endswith("(L)")]
    assert len(leaders) == 1, text
    for name, proc in phase["processes"].items():
        assert proc["samples"] > 0, f"{name}: no running samples\n{text}"
        assert abs(sum(a["share"] for a in proc["areas"].values()) - 1.0) < 1e-6, name
    # Some node's samples land in the engine's apply. Not "the leader's": at 25 Hz for 2 s it has
    # ~20 running samples, and apply is ~15 % of its CPU (a followers' is ~40 %).
    assert any(proc["areas"].get("engine apply", {}).get("share", 0) > 0
               for name, proc in phase["processes"].items() if name != "client"), text
