"""The nemesis run's report, table, --json shape and picture, from hand-made histories
(no cluster, no root)."""
import json

from click.testing import CliRunner

from xraft.ops import cli
from xraft.ops import nemesis_run as nr

from .test_nemesis_check import CLEAN_FINAL, clean


def nemesis_events(records):
    records.insert(0, {"op": None, "time": 0.05, "process": "nemesis", "type": "info", "f": "start",
                       "value": {"kind": "partition", "detail": "halves"}})
    records.insert(1, {"op": None, "time": 0.6, "process": "nemesis", "type": "info", "f": "stop",
                       "value": {"kind": "partition", "detail": "network healed"}})
    return records


def test_report_of_a_clean_run():
    rep = nr.report(nemesis_events(clean().final(**CLEAN_FINAL)), {"partition": 1}, {}, [])
    summary = nr.json_summary(rep)
    assert set(summary) == {"ops", "ok", "fail", "info", "anomalies", "unavailable_s"}
    assert json.loads(json.dumps(summary)) == summary
    assert not any(summary["anomalies"].values())
    text = nr.table(rep)
    assert text.endswith("VALID") and "partition x1" in text


def test_report_counts_anomalies_and_workload_errors():
    final = dict(CLEAN_FINAL, streams={"s": [["2-0", "v2"]]})
    rep = nr.report(clean().final(**final), {}, {"netem": "no sch_netem"}, ["resp-xadd-1: KeyError(1)"])
    assert rep["anomalies"]["streams"] == 1 and rep["anomalies"]["workload-errors"] == 1
    text = nr.table(rep)
    assert "streams: lost" in text and "not injected: netem: no sch_netem" in text
    assert text.endswith("ANOMALIES FOUND")


def test_picture(tmp_path):
    path = tmp_path / "latency.png"
    nr.draw(nemesis_events(clean().final(**CLEAN_FINAL)), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_nemesis_kind_is_refused(tmp_path):
    result = CliRunner().invoke(cli.main, ["nemesis", "run", "--dir", str(tmp_path), "--nemesis", "meteor"])
    assert result.exit_code == 1 and "meteor" in result.output and not list(tmp_path.iterdir())
