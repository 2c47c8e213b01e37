"""Storage: the core's read view of the durable log, and an in-memory implementation.

The core only READS storage (through the `Storage` protocol); the application
writes it from each Ready (snapshot, entries, hard state) before advancing.

MemoryStorage keeps, like etcd's, a dummy entry at position 0 of its entry
list whose index/term are those of the last snapshot, so that term(i) works for
i == snapshot index and first_index() == snapshot index + 1.

Crash model (for the simulator): every write goes to the live image and is
also queued; `sync()` replays the queue onto a second, durable image.
`crash()` returns a fresh MemoryStorage holding only the durable image, i.e.
exactly what an fsync'ed disk would hold after power loss.
`crash(tear_last=True)` additionally drops the last durable entry, modelling a
torn final record that the WAL truncates on restart. That is ONLY legal when
the caller knows the append carrying that entry was never acknowledged to
anyone (no persisted_messages of its Ready were sent); otherwise it would
model losing an acknowledged write, which Raft does not tolerate.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Optional, Protocol

from ..invariant import invariant
from .codec import ENTRY_OVERHEAD, entry_encoded_size
from .types import (
    Compacted,
    ConfState,
    Entry,
    HardState,
    Snapshot,
    SnapshotMetadata,
    SnapshotOutOfDate,
    Unavailable,
)

NO_LIMIT = (1 << 63) - 1


class Storage(Protocol):
    """What the core needs from stable storage (etcd's Storage interface)."""

    def initial_state(self) -> tuple[HardState, ConfState]:
        ...

    def entries(self, lo: int, hi: int, max_bytes: int = NO_LIMIT) -> list[Entry]:
        """Entries [lo, hi), at least one if lo < hi, else stop before exceeding max_bytes.

        Raises Compacted if lo <= the snapshot index, Unavailable if hi > last_index()+1.
        """
        ...

    def term(self, i: int) -> int:
        """Term of entry i; valid for snapshot index <= i <= last_index() (else Compacted/Unavailable)."""
        ...

    def first_index(self) -> int:
        ...

    def last_index(self) -> int:
        ...

    def snapshot(self) -> Snapshot:
        ...


_data = attrgetter("data")


def payload_size(ents) -> int:
    """Sum of len(e.data): the unit of the uncommitted/inflight limits. C-level iteration."""
    return sum(map(len, map(_data, ents)))


def encoded_size(ents) -> int:
    """Sum of entry_encoded_size(e) over `ents`, without a Python call per entry."""
    return ENTRY_OVERHEAD * len(ents) + payload_size(ents)


def limit_size(ents: list[Entry], max_bytes: int) -> list[Entry]:
    """Longest prefix of `ents` within max_bytes, but never fewer than one entry."""
    if not ents or max_bytes >= NO_LIMIT or encoded_size(ents) <= max_bytes:
        return ents  # the common case: everything fits; no per-entry walk
    size = entry_encoded_size(ents[0])
    for k in range(1, len(ents)):
        size += entry_encoded_size(ents[k])
        if size > max_bytes:
            return ents[:k]
    return ents


class _LogImage:
    """One copy of (hard state, snapshot, entries) with etcd MemoryStorage semantics."""

    __slots__ = ("hard", "snap", "ents")

    def __init__(self) -> None:
        self.hard = HardState()
        self.snap = Snapshot()
        # Invariant: ents[0] is the dummy (snap index, snap term); ents are consecutive.
        self.ents: list[Entry] = [Entry(term=0, index=0)]

    def copy(self) -> "_LogImage":
        img = _LogImage()
        img.hard, img.snap, img.ents = self.hard, self.snap, list(self.ents)
        return img

    def offset(self) -> int:
        return self.ents[0].index

    def last_index(self) -> int:
        return self.ents[0].index + len(self.ents) - 1

    def apply_snapshot(self, snap: Snapshot) -> None:
        if snap.metadata.index <= self.snap.metadata.index:
            raise SnapshotOutOfDate(snap.metadata.index, self.snap.metadata.index)
        self.snap = snap
        self.ents = [Entry(term=snap.metadata.term, index=snap.metadata.index)]

    def create_snapshot(self, index: int, cs: Optional[ConfState], data: bytes) -> Snapshot:
        if index <= self.snap.metadata.index:
            raise SnapshotOutOfDate(index, self.snap.metadata.index)
        if index > self.last_index():
            raise Unavailable(index, self.last_index())
        term = self.ents[index - self.offset()].term
        conf = cs if cs is not None else self.snap.metadata.conf_state
        self.snap = Snapshot(SnapshotMetadata(index=index, term=term, conf_state=conf), bytes(data))
        return self.snap

    def compact(self, index: int) -> None:
        off = self.offset()
        if index <= off:
            raise Compacted(index, off + 1)
        if index > self.last_index():
            raise Unavailable(index, self.last_index())
        k = index - off
        head = self.ents[k]
        del self.ents[1:k + 1]  # in place, as in append()
        self.ents[0] = Entry(term=head.term, index=head.index)

    def append(self, entries: list[Entry]) -> None:
        """Append consecutive `entries` (checked by MemoryStorage.append, once for both images)."""
        if not entries:
            return
        first = self.offset() + 1
        if entries[-1].index < first:
            return  # everything already compacted away
        if entries[0].index < first:
            entries = entries[first - entries[0].index:]
        k = entries[0].index - self.offset()
        if k > len(self.ents):  # guarded: no f-string per append
            invariant(False, f"log gap: appending {entries[0].index} after {self.last_index()}")
        # Overwrite a (possibly conflicting) suffix: etcd truncates from the first new index.
        # In place: rebuilding the list copied the whole log on every append (O(log length)).
        # Safe because no reader keeps a reference to `ents` (entries() and copy() copy).
        del self.ents[k:]
        self.ents.extend(entries)


class MemoryStorage:
    """In-memory Storage with a write side and crash/sync modelling (see module doc)."""

    def __init__(self) -> None:
        self._live = _LogImage()
        self._durable = _LogImage()
        self._pending: list[tuple] = []  # writes since the last sync(), replayed in order

    # ------------------------------------------------ read side (Storage protocol)

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._live.hard, self._live.snap.metadata.conf_state

    def entries(self, lo: int, hi: int, max_bytes: int = NO_LIMIT) -> list[Entry]:
        img = self._live
        off = img.offset()
        if lo <= off:
            raise Compacted(lo, off + 1)
        if hi > img.last_index() + 1:
            raise Unavailable(hi - 1, img.last_index())
        if lo > hi:
            invariant(False, f"entries range inverted [{lo}, {hi})")
        return limit_size(img.ents[lo - off:hi - off], max_bytes)

    def term(self, i: int) -> int:
        img = self._live
        off = img.offset()
        if i < off:
            raise Compacted(i, off + 1)
        if i > img.last_index():
            raise Unavailable(i, img.last_index())
        return img.ents[i - off].term

    def first_index(self) -> int:
        return self._live.offset() + 1

    def last_index(self) -> int:
        return self._live.last_index()

    def snapshot(self) -> Snapshot:
        return self._live.snap

    def hard_state(self) -> HardState:
        return self._live.hard

    # ------------------------------------------------ write side

    def set_hard_state(self, hs: HardState) -> None:
        self._live.hard = hs
        self._pending.append(("hard", hs))

    def append(self, entries) -> None:
        # One copy of the batch (the caller's list may change, the pending queue must not);
        # the live and durable images then extend in place instead of copying the whole log.
        entries = list(entries)
        if entries:
            i0 = entries[0].index
            if [e.index for e in entries] != list(range(i0, i0 + len(entries))):  # C loops
                for a, b in zip(entries, entries[1:]):
                    invariant(b.index == a.index + 1, f"appended entries not consecutive at {a.index}")
        self._live.append(entries)
        self._pending.append(("append", entries))

    def apply_snapshot(self, snap: Snapshot) -> None:
        self._live.apply_snapshot(snap)
        self._pending.append(("apply_snapshot", snap))

    def create_snapshot(self, index: int, conf_state: Optional[ConfState], data: bytes) -> Snapshot:
        snap = self._live.create_snapshot(index, conf_state, data)
        self._pending.append(("set_snapshot", snap))
        return snap

    def compact(self, index: int) -> None:
        self._live.compact(index)
        self._pending.append(("compact", index))

    # ------------------------------------------------ durability / crashes

    def sync(self) -> None:
        """Everything written so far is durable (models fsync)."""
        img = self._durable
        for op, arg in self._pending:
            if op == "hard":
                img.hard = arg
            elif op == "append":
                img.append(arg)
            elif op == "apply_snapshot":
                img.apply_snapshot(arg)
            elif op == "set_snapshot":
                img.create_snapshot(arg.metadata.index, arg.metadata.conf_state, arg.data)
            else:
                img.compact(arg)
        self._pending.clear()

    def unsynced_writes(self) -> int:
        return len(self._pending)

    def crash(self, tear_last: bool = False) -> "MemoryStorage":
        """A new storage holding only synced writes (see module doc for tear_last)."""
        img = self._durable.copy()
        if tear_last and len(img.ents) > 1:
            torn = img.ents.pop()
            invariant(torn.index > img.hard.commit,
                      f"tearing entry {torn.index} at or below durable commit {img.hard.commit}")
        st = MemoryStorage()
        st._live = img
        st._durable = img.copy()
        return st
