"""Smoke test of bench/ab_issue13.py: both A/B modes run end to end at their smallest
size (one round) and print each side's figure and the ratio. No figure is checked
against a target: timings on a shared machine are not test material."""
import re

from .bench_run import run_bench

LIMIT_S = 240  # a hang guard only


def _ran(args, tmp_path, name) -> str:
    code, text = run_bench("ab_issue13.py", args, tmp_path / name, ("cluster",), LIMIT_S)
    assert code == 0, text
    assert re.search(r"^summed: .* ratio \d+\.\d\d$", text, re.M), text
    return text


def test_idmp_ab_prints_both_sides(tmp_path):
    text = _ran(["idmp", "--rounds", "1", "--seconds", "0.5", "--per-entry-ids"], tmp_path, "idmp")
    assert re.search(r"round 1: plain [\d,]+/s  IDMP [\d,]+/s  ratio", text), text
    assert re.search(r"\| IDMP per-entry [\d,]+/s ratio \d+\.\d\d", text), text      # the third side
    assert re.search(r"^summed IDMP per-entry: [\d,]+  ratio to plain \d+\.\d\d$", text, re.M), text


def test_crossshard_ab_prints_both_sides(tmp_path):
    text = _ran(["crossshard", "--rounds", "1", "--entries", "600"], tmp_path, "cross")
    assert re.search(r"round 1: single-stream Consume [\d,]+/s  cross-shard consume\(\) [\d,]+/s  ratio", text), text
