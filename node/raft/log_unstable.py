"""The not-yet-persisted tail of the log (etcd's unstable).

Entries and a pending snapshot live here from the moment the core accepts them
until the application reports them durable (advance). `offset_in_progress`
separates what a Ready already handed to the application (being written) from
what is new since, so a second Ready never repeats a write in flight.

    storage:  [ ... persisted ... ]
    unstable:                     [offset ........ offset_in_progress ......... last]
                                   ^ handed to app, not yet acked  ^ not yet handed out
"""
from __future__ import annotations

from typing import Optional

from ..invariant import invariant
from .types import Entry, Snapshot


class Unstable:
    __slots__ = ("snapshot", "entries", "offset", "snapshot_in_progress", "offset_in_progress")

    def __init__(self, offset: int) -> None:
        self.snapshot: Optional[Snapshot] = None  # incoming snapshot not yet persisted
        self.entries: list[Entry] = []  # Invariant: entries[i].index == offset + i
        self.offset = offset  # index of entries[0] (or where it would be)
        self.snapshot_in_progress = False  # snapshot handed to the app in a Ready
        # Invariant: offset <= offset_in_progress <= offset + len(entries)
        self.offset_in_progress = offset

    def maybe_first_index(self) -> Optional[int]:
        if self.snapshot is not None:
            return self.snapshot.metadata.index + 1
        return None

    def maybe_last_index(self) -> Optional[int]:
        if self.entries:
            return self.offset + len(self.entries) - 1
        if self.snapshot is not None:
            return self.snapshot.metadata.index
        return None

    def maybe_term(self, i: int) -> Optional[int]:
        if i < self.offset:
            if self.snapshot is not None and self.snapshot.metadata.index == i:
                return self.snapshot.metadata.term
            return None
        last = self.maybe_last_index()
        if last is None or i > last:
            return None
        return self.entries[i - self.offset].term

    def next_entries(self) -> list[Entry]:
        k = self.offset_in_progress - self.offset
        return self.entries[k:] if k < len(self.entries) else []

    def next_snapshot(self) -> Optional[Snapshot]:
        if self.snapshot is None or self.snapshot_in_progress:
            return None
        return self.snapshot

    def accept_in_progress(self) -> None:
        if self.entries:
            self.offset_in_progress = self.entries[-1].index + 1
        if self.snapshot is not None:
            self.snapshot_in_progress = True

    def stable_to(self, index: int, term: int) -> None:
        """Entries up to (index, term) are durable; ignore if they were since replaced."""
        t = self.maybe_term(index)
        if t is None or t != term or index < self.offset:
            return  # stale ack: entry truncated and replaced, or already stabilised
        # In place (no copy of the remaining tail): nothing outside keeps a reference to
        # `entries`; next_entries() and slice() hand out copies.
        del self.entries[:index + 1 - self.offset]
        self.offset = index + 1
        self.offset_in_progress = max(self.offset_in_progress, self.offset)

    def stable_snap_to(self, i: int) -> None:
        if self.snapshot is not None and self.snapshot.metadata.index == i:
            self.snapshot = None
            self.snapshot_in_progress = False

    def restore(self, snap: Snapshot) -> None:
        self.offset = snap.metadata.index + 1
        self.offset_in_progress = self.offset
        self.entries = []
        self.snapshot = snap
        self.snapshot_in_progress = False

    def truncate_and_append(self, ents: list[Entry]) -> None:
        if not ents:
            return
        from_index = ents[0].index
        end = self.offset + len(self.entries)
        if from_index == end:
            self.entries.extend(ents)
        elif from_index <= self.offset:
            # Replace everything unstable; storage's suffix is overwritten when the app appends.
            self.offset = from_index
            self.entries = list(ents)
        else:
            if from_index >= end:
                invariant(False, f"unstable gap: {from_index} after {end - 1}")
            del self.entries[from_index - self.offset:]
            self.entries.extend(ents)
        # Anything at or after from_index is new and must be written again.
        self.offset_in_progress = min(self.offset_in_progress, from_index)
        self.offset_in_progress = max(self.offset_in_progress, self.offset)

    def slice(self, lo: int, hi: int) -> list[Entry]:
        if not self.offset <= lo <= hi <= self.offset + len(self.entries):  # no f-string per call
            invariant(False, f"unstable slice [{lo},{hi}) out of "
                             f"[{self.offset},{self.offset + len(self.entries)}]")
        return self.entries[lo - self.offset:hi - self.offset]
