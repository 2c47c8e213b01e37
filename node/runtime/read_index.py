"""ReadIndexQueue: a GroupDriver's linearizable reads, from the caller's future to
the applied index that answers it (Raft thesis 6.4, "processing read-only queries").

    read_index() --add()--> queued --issue()--> by_ctx[ctx] --on_read_state()--> waiting
                             (one ReadIndex round       (the core confirmed    (heap on index;
                              for all queued reads)      leadership: index)     resolve(applied))

Why one ctx for a whole batch: every read queued since the last pump shares one
ReadIndex round (one heartbeat broadcast), however many callers there are.
Contexts carry a random per-incarnation prefix, so a ReadState answering a
previous incarnation's ctx (a restart) is never taken for ours.

Nothing here touches the core's internals: issue() calls rn.read_index(ctx), and
the driver hands back the ReadStates of each Ready and the applied index.
Loop thread only.
"""
from __future__ import annotations

import asyncio
import heapq
import os
from typing import Any, Optional

from ..raft.types import ProposalDropped as CoreProposalDropped, ReadState
from .driver_api import ReadFailed


def settle(fut, result: Any = None, exc: Optional[BaseException] = None) -> bool:
    """Resolve unless already done (expired or cancelled); True if this call resolved it."""
    if fut.done():
        return False
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
    return True


class _Read:
    __slots__ = ("fut", "timer", "index")

    def __init__(self, fut: asyncio.Future):
        self.fut = fut
        self.timer: Optional[asyncio.TimerHandle] = None
        self.index = 0  # the read index the core confirmed; 0 until then


class ReadIndexQueue:
    def __init__(self, group_id: int, max_pending: int):
        self.group_id = group_id
        self.max_pending = max_pending  # bound on count
        self._queue: list[_Read] = []  # not yet given to the core
        self._by_ctx: dict[bytes, tuple[int, int, list[_Read]]] = {}  # ctx -> (term, lead, reads) in a round
        self._waiting: list[tuple[int, int, _Read]] = []  # heap (index, seq, read): confirmed, awaiting apply
        self.count = 0  # Invariant: reads not yet resolved or dropped from the three structures above
        self._seq = 0  # ctx numbers and heap tie-breaks; only grows
        self._ctx_prefix = os.urandom(8)  # read contexts never collide with a previous incarnation's

    def add(self, loop: asyncio.AbstractEventLoop, timeout: Optional[float]) -> asyncio.Future:
        """Queue one read; its future resolves with the read index once it is applied here."""
        if self.count >= self.max_pending:
            raise ReadFailed(self.group_id, "too many pending reads")
        rd = _Read(loop.create_future())
        if timeout is not None:
            rd.timer = loop.call_later(timeout, self._expire, rd)
        self._queue.append(rd)
        self.count += 1
        return rd.fut

    @property
    def queued(self) -> bool:
        return bool(self._queue)

    @property
    def in_round(self) -> bool:
        return bool(self._by_ctx)

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def issue(self, rn) -> None:
        """One ReadIndex round for every read queued since the last call."""
        queued, self._queue = self._queue, []
        reads = []
        for rd in queued:
            if rd.fut.done():  # expired or cancelled before it was issued
                self._done(rd)
            else:
                reads.append(rd)
        if not reads:
            return
        r = rn.raft
        self._seq += 1
        ctx = self._ctx_prefix + self._seq.to_bytes(8, "big")
        try:
            rn.read_index(ctx)
        except CoreProposalDropped as exc:
            for rd in reads:
                self._done(rd, exc=ReadFailed(self.group_id, exc.reason))
            return
        self._by_ctx[ctx] = (r.term, r.lead, reads)

    def on_read_state(self, rs: ReadState) -> None:
        entry = self._by_ctx.pop(rs.request_ctx, None)
        if entry is None:
            return  # not ours (an earlier incarnation's) or already failed
        for rd in entry[2]:
            rd.index = rs.index
            self._seq += 1
            heapq.heappush(self._waiting, (rs.index, self._seq, rd))

    def resolve(self, applied: int) -> None:
        """Answer every confirmed read whose index this replica has applied."""
        w = self._waiting
        while w and w[0][0] <= applied:
            _, _, rd = heapq.heappop(w)
            self._done(rd, result=rd.index)

    def fail_stale(self, term: int, lead: int) -> None:
        """Rounds started under another (term, leader): that leader's answer may never come."""
        stale = [ctx for ctx, (t, ld, _) in self._by_ctx.items() if t != term or ld != lead]
        for ctx in stale:
            for rd in self._by_ctx.pop(ctx)[2]:
                self._done(rd, exc=ReadFailed(self.group_id, "leader changed"))

    def prune(self) -> None:
        """Forget rounds whose callers all gave up: the core may drop a forwarded
        read silently, and then no ReadState ever comes for its ctx."""
        dead = [ctx for ctx, (_, _, reads) in self._by_ctx.items() if all(rd.fut.done() for rd in reads)]
        for ctx in dead:
            for rd in self._by_ctx.pop(ctx)[2]:
                self._done(rd)

    def fail_all(self, reason: str) -> None:
        reads = self._queue
        self._queue = []
        for _, _, rs in self._by_ctx.values():
            reads.extend(rs)
        self._by_ctx.clear()
        reads.extend(rd for _, _, rd in self._waiting)
        self._waiting = []
        for rd in reads:
            self._done(rd, exc=ReadFailed(self.group_id, reason))

    def _expire(self, rd: _Read) -> None:
        # Stays in its structure until reached; the count is released there.
        settle(rd.fut, exc=ReadFailed(self.group_id, "deadline passed"))

    def _done(self, rd: _Read, result: Any = None, exc: Optional[BaseException] = None) -> None:
        self.count -= 1
        if rd.timer is not None:
            rd.timer.cancel()
        settle(rd.fut, result, exc)
