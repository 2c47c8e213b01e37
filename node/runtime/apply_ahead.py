"""Costly applies off the loop: the part of an entry's apply that the state machine can do
ahead of it, as a pure computation, runs in a thread while the node's event loop serves
every other group.

Why. One event loop runs all the groups of a node, so an apply that takes tens of ms (a
slot move's chunk at the target group: decoding and checking a 100k-entry stream with a
10k-entry PEL, 30-45 ms on a quiet machine) delays every other group's commits on this node
by as much; and all three nodes host the target group, so a commit of another group, which
needs two nodes, could wait for two such applies in a row (bench/README.md, session 10).

How (GroupDriver._finish / _apply_ahead). The machine's optional
`prepare(index, data, record) -> callable | None` (FsmAdapter -> StateMachine.prepare)
names that part for entries of at least its `prepare_min_bytes`. The driver stops applying
a Ready's committed entries before such an entry; the group stays busy (its core and
storage are not touched and nothing else applies to its machine, exactly as during an
fsync); the callable runs in the host's `prepare_executor` (one thread per node); then the
driver applies the entry and goes on with the Ready on the loop. The callable only fills a
cache that the apply consults, and the apply checks that the cached work was made from its
own inputs: the results and the state are the same whether it ran or not. A callable that
raises is only logged: the apply then does all of the work itself.

The GIL. The thread's work is Python, so it shares the interpreter with the loop: by
default a thread that waits for the GIL gets it after a 5 ms switch interval, so each
wake-up of the loop could wait that long. While any prepare runs, the interval is
SWITCH_INTERVAL_S instead (process-wide, restored when the last one ends).
"""
from __future__ import annotations

import contextlib
import sys
from concurrent.futures import ThreadPoolExecutor

SWITCH_INTERVAL_S = 0.0005

_running = 0                 # prepares in flight in this process (loop thread only)
_saved_interval = 0.005


def new_executor(node_id: int) -> ThreadPoolExecutor:
    """The host's prepare_executor: one thread (the node's groups' prepares take turns; a
    second thread would only compete for the same GIL), started now: a ThreadPoolExecutor
    starts its thread at the first submit and waits for it there, which on a loaded machine
    held the loop for up to 80 ms in the middle of a slot move (XRAFT_STALL_TRACE)."""
    ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"xraft-prepare-{node_id}")
    ex.submit(int)
    return ex


@contextlib.contextmanager
def gil_shared():
    """Around awaiting a prepare (loop thread): the loop gets the GIL back within about
    SWITCH_INTERVAL_S while the prepare's thread runs Python."""
    global _running, _saved_interval
    if _running == 0:
        _saved_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL_S))
    _running += 1
    try:
        yield
    finally:
        _running -= 1
        if _running == 0:
            sys.setswitchinterval(_saved_interval)
