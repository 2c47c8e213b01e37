"""ReadIndex bookkeeping on the leader (thesis §6.4, etcd read_only.go).

SAFE: each read records the commit index at arrival, then a heartbeat round
carrying the read's context must be acknowledged by a quorum, proving that no
newer leader exists; only then is the read answered with that index.
LEASE_BASED: answered at once, trusting that no other leader can exist within
the election timeout (valid only with CheckQuorum and bounded clock drift).
"""
from __future__ import annotations

import enum
from typing import Optional

from .types import Message

MAX_PENDING_READS = 4096  # reads awaiting their heartbeat quorum per leader


class ReadOnlyOption(enum.IntEnum):
    SAFE = 0
    LEASE_BASED = 1


class ReadIndexStatus:
    __slots__ = ("req", "index", "acks")

    def __init__(self, req: Message, index: int) -> None:
        self.req = req  # the READ_INDEX message (local or forwarded)
        self.index = index  # leader's commit index when the read arrived
        self.acks: dict[int, bool] = {}  # voters that acknowledged the heartbeat carrying ctx


class ReadOnly:
    __slots__ = ("option", "pending", "queue")

    def __init__(self, option: ReadOnlyOption) -> None:
        self.option = option
        self.pending: dict[bytes, ReadIndexStatus] = {}  # ctx -> status
        self.queue: list[bytes] = []  # ctxs in arrival order. Invariant: same keys as pending

    def add_request(self, index: int, m: Message) -> bool:
        """Track a read; False if the context is already pending or the queue is full."""
        ctx = m.context
        if ctx in self.pending or len(self.queue) >= MAX_PENDING_READS:
            return False
        self.pending[ctx] = ReadIndexStatus(m, index)
        self.queue.append(ctx)
        return True

    def recv_ack(self, node_id: int, ctx: bytes) -> Optional[dict[int, bool]]:
        rs = self.pending.get(ctx)
        if rs is None:
            return None
        rs.acks[node_id] = True
        return rs.acks

    def advance(self, ctx: bytes) -> list[ReadIndexStatus]:
        """Pop every read up to and including ctx (earlier reads are confirmed too)."""
        if ctx not in self.pending:
            return []
        out: list[ReadIndexStatus] = []
        i = 0
        for i, c in enumerate(self.queue):
            out.append(self.pending.pop(c))
            if c == ctx:
                break
        self.queue = self.queue[i + 1:]
        return out

    def last_pending_request_ctx(self) -> bytes:
        return self.queue[-1] if self.queue else b""
