"""Costly applies off the loop: the part of an entry's apply that the state machine can do
ahead of it, as a pure computation, runs in a thread while the node's event loop serves
every other group.

Why. One event loop runs all the groups of a node, so an apply that takes tens of ms (a
slot move's chunk at the target group: decoding and checking a 100k-entry stream with a
10k-entry PEL, 30-45 ms on a quiet machine) delays every other group's commits on this node
by as much; and all three nodes host the target group, so a commit of another group, which
needs two nodes, could wait for two such applies in a row (bench/README.md, session 10).

How (GroupDriver._finish, ApplyAhead below). The machine's optional
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
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..raft.types import Entry, EntryType

log = logging.getLogger("xraft.driver")

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


class ApplyAhead:
    """GroupDriver's part that runs entries' prepares (the module doc). Uses the driver's
    _prepare, _prepare_min_bytes, _prep_executor and _ahead (set in its __init__), and its
    _finish, _maybe_snapshot, _job_ended, _run_host and fail_stop."""

    def _prepare_of(self, e: Entry):
        """The machine's callable for the costly part of e's apply, or None."""
        if (e.type != EntryType.NORMAL or len(e.data) < self._prepare_min_bytes or not e.data
                or e.index <= self.applied):
            return None
        p = self._pending.get(e.index)
        decoded = p.decoded if p is not None and p.term == e.term else None
        try:
            return self._prepare(e.index, e.data, decoded)
        except Exception:  # the apply meets the same bytes and decides about them itself
            log.exception("group %d node %d: prepare of entry %d failed", self.group_id, self.node_id, e.index)
            return None

    async def run_off_loop(self, fn: Callable[[], Any]) -> Any:
        """fn() in the node's prepare thread (apply_ahead.py; inline without one), for a
        costly read of state that no apply changes meanwhile (the caller's promise: e.g. the
        keys of slots a move has sealed). The loop serves every group while it runs."""
        if self._prep_executor is None:
            return fn()
        with gil_shared():
            return await self.host.loop.run_in_executor(self._prep_executor, fn)

    async def run_held(self, fn: Callable[[], Any]) -> Any:
        """fn() in the node's prepare thread while this group is held as during an fsync
        (busy: nothing applies to its machine, its storage is untouched), for a costly read
        of state that only this group's applies change (a slot move's pre-copy EXPORT while
        the source still serves the slots). Only this group's commits wait for it; the loop
        serves every other group meanwhile. Inline without a prepare thread."""
        if self._prep_executor is None:
            return fn()
        while self.busy:                    # no await between the last check and busy = True
            await self.wait_idle()
        self.busy = True
        try:
            with gil_shared():
                return await self.host.loop.run_in_executor(self._prep_executor, fn)
        finally:
            self._job_ended()
            self._run_host()

    def _start_ahead(self) -> None:
        """The group stays busy while _apply_ahead() finishes the Ready (a job like a storage
        job); then, as a storage job's end does, a due snapshot, the job's end, a pump."""
        self.busy = True
        self.task = self.host.loop.create_task(self._ahead_job())

    async def _ahead_job(self) -> None:
        try:
            await self._apply_ahead()
        except Exception as exc:
            self.fail_stop(exc)
        self.task = None
        if self.failed is None and not self.host.closing and self._maybe_snapshot(job_ending=True):
            self._run_host()  # a snapshot job took over; the group stays busy
            return
        self._job_ended()
        self._run_host()

    async def _apply_ahead(self) -> None:
        """In _ahead_job (the group is busy): run each stopped entry's prepare in the prepare
        thread, then finish the Ready from that entry on (apply_ahead.py)."""
        while self._ahead is not None:
            rd, i, fn = self._ahead
            self._ahead = None
            try:
                with gil_shared():
                    await self.host.loop.run_in_executor(self._prep_executor, fn)
                self.stats.prepared_off_loop += 1
            except Exception:  # the apply does all of its work itself then
                log.exception("group %d node %d: prepare of entry %d failed", self.group_id, self.node_id,
                              rd.committed_entries[i].index)
            if self.failed is not None:
                return                      # fail-stopped meanwhile: apply nothing more
            if self._finish(rd, i):
                break
