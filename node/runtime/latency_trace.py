"""Latency trace points for bench/latency.py: off unless XRAFT_LATENCY_TRACE names a directory.

When on, each process keeps (CLOCK_MONOTONIC ns, event, key, peer) rows in memory and writes
them to <dir>/trace-<pid>.tsv as the process exits (atexit; a node exits that way on SIGTERM)
or when MAX_ROWS are buffered. CLOCK_MONOTONIC is one clock for every process on a machine, so
bench/latency.py lines up a write's steps across the client, the leader and the followers by
time and by log index without estimating anything.

Call sites test `latency_trace.ON` first (one global load when off) and pass ints only:
`key` is a log index (0 when none applies), `peer` a node id (0 when none applies). The
events and where they are taken are listed in bench/latency.py.

Bounded: at most MAX_FILE_ROWS rows per process are written; past that, rows are counted
and dropped (a trace left on by mistake must not fill the disk).
"""
from __future__ import annotations

import atexit
import os
import threading
import time

ENV = "XRAFT_LATENCY_TRACE"
MAX_ROWS = 200_000          # buffered before a write (~20 MB): a 5 s bench run never flushes mid-run
MAX_FILE_ROWS = 2_000_000   # per process, in all

_dir = os.environ.get(ENV, "")
ON = bool(_dir)

_rows: list[tuple[int, str, int, int]] = []
_lock = threading.Lock()    # mark() runs on the loop thread and in the fsync executor
_written = 0
dropped = 0

_now_ns = time.monotonic_ns


def mark(event: str, key: int = 0, peer: int = 0) -> None:
    """One row now. list.append is atomic under the GIL; only the flush takes the lock, so a
    row another thread marks while a flush swaps the buffer may be lost (a bench tool's trade)."""
    _rows.append((_now_ns(), event, key, peer))
    if len(_rows) >= MAX_ROWS:
        flush()


def flush() -> None:
    global _rows, _written, dropped
    if not ON:
        return
    with _lock:
        rows, _rows = _rows, []
        room = max(0, MAX_FILE_ROWS - _written)
        dropped += max(0, len(rows) - room)
        rows = rows[:room]
        if not rows:
            return
        _written += len(rows)
        with open(os.path.join(_dir, f"trace-{os.getpid()}.tsv"), "a") as fh:
            fh.write("".join(f"{t}\t{e}\t{k}\t{p}\n" for t, e, k, p in rows))


if ON:
    os.makedirs(_dir, exist_ok=True)
    atexit.register(flush)


_APP, _APP_RESP = 3, 4      # raft.types.MessageType.APP / APP_RESP (ints: no import at this layer's top)


def mark_messages(prefix: str, peer: int, messages) -> None:
    """`<prefix>_app` per append that carries entries (key: its last index) and
    `<prefix>_resp` per append accepted (key: the index it acknowledges); others are skipped."""
    for m in messages:
        t = m.type
        if t == _APP and m.entries:
            mark(prefix + "_app", m.entries[-1].index, peer)
        elif t == _APP_RESP and not m.reject:
            mark(prefix + "_resp", m.index, peer)
