"""node/runtime/latency_trace.py: off without XRAFT_LATENCY_TRACE; with it, a process's rows
reach <dir>/trace-<pid>.tsv when it exits, appends and answers only."""
import os
import subprocess
import sys

from xraft.node.runtime import latency_trace

CHILD = """
from xraft.node.raft.types import Entry, Message, MessageType
from xraft.node.runtime import latency_trace as lt
assert lt.ON
lt.mark("propose", 7)
lt.mark_messages("queued", 2, [
    Message(type=MessageType.APP, to=2, entries=(Entry(index=6, term=1), Entry(index=7, term=1))),
    Message(type=MessageType.APP, to=2),                      # commit-only: skipped
    Message(type=MessageType.APP_RESP, to=1, index=7),
    Message(type=MessageType.APP_RESP, to=1, index=9, reject=True),   # a refusal: skipped
    Message(type=MessageType.HEARTBEAT, to=2),               # skipped
])
print(__import__("os").getpid())
"""


def test_off_without_the_variable():
    env = {k: v for k, v in os.environ.items() if k != latency_trace.ENV}
    out = subprocess.run([sys.executable, "-c", "from xraft.node.runtime import latency_trace as lt; print(lt.ON)"],
                         env=env, check=True, capture_output=True, text=True).stdout.strip()
    assert out == "False"


def test_rows_written_at_exit(tmp_path):
    env = {"XRAFT_LATENCY_TRACE": str(tmp_path / "t")}
    pid = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, **env},
                         check=True, capture_output=True, text=True).stdout.strip()
    rows = [line.split("\t") for line in (tmp_path / "t" / f"trace-{pid}.tsv").read_text().splitlines()]
    assert [r[1:] for r in rows] == [["propose", "7", "0"], ["queued_app", "7", "2"], ["queued_resp", "7", "2"]]
    times = [int(r[0]) for r in rows]
    assert times == sorted(times)
