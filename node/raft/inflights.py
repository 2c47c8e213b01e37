"""Inflights: the leader's window of unacknowledged MsgApp per follower (flow control).

Each entry is (last index carried by a MsgApp, its payload bytes). The window is
full when either the count reaches `max_count` or the bytes reach `max_bytes`;
a full window pauses replication to that follower until acks free it.
"""
from __future__ import annotations

from collections import deque

from ..invariant import invariant


class Inflights:
    __slots__ = ("max_count", "max_bytes", "_q", "bytes")

    def __init__(self, max_count: int, max_bytes: int) -> None:
        invariant(max_count > 0, "inflights max_count must be positive")
        self.max_count = max_count  # Invariant: len(_q) <= max_count
        self.max_bytes = max_bytes  # 0 = no byte limit
        self._q: deque[tuple[int, int]] = deque()  # Invariant: indexes strictly increasing
        self.bytes = 0  # sum of payload bytes in _q

    def clone(self) -> "Inflights":
        c = Inflights(self.max_count, self.max_bytes)
        c._q = deque(self._q)
        c.bytes = self.bytes
        return c

    def add(self, index: int, nbytes: int) -> None:
        invariant(not self.full(), "cannot add into a full inflights window")
        if self._q and self._q[-1][0] >= index:  # guarded: no f-string per MsgApp
            invariant(False, f"inflight index {index} not increasing")
        self._q.append((index, nbytes))
        self.bytes += nbytes

    def free_le(self, to: int) -> None:
        """Acknowledge every inflight message whose last index is <= to."""
        q = self._q
        while q and q[0][0] <= to:
            self.bytes -= q.popleft()[1]

    def full(self) -> bool:
        return len(self._q) >= self.max_count or (self.max_bytes > 0 and self.bytes >= self.max_bytes)

    def count(self) -> int:
        return len(self._q)

    def reset(self) -> None:
        self._q.clear()
        self.bytes = 0
