"""RaftLog: storage (durable prefix) + unstable (tail) seen as one log (etcd's raftLog).

    snapshot.index      first_index                     committed   last_index
          |                  |                               |           |
    [ compacted ........ ][ storage entries ............ ][ unstable ........ ]
                                  applied <= applying <= committed

Invariants: applied <= applying <= committed <= last_index; committed never
decreases and a committed entry is never truncated (Log Matching, §5.3/§5.4).
"""
from __future__ import annotations

from typing import Optional

from ..invariant import invariant
from .codec import entry_encoded_size
from .log_unstable import Unstable
from .storage import NO_LIMIT, Storage, encoded_size, limit_size
from .types import Compacted, Entry, Snapshot, StorageStateError, Unavailable


class RaftLog:
    __slots__ = ("storage", "unstable", "committed", "applying", "applied", "max_applying_size")

    def __init__(self, storage: Storage, max_applying_size: int = NO_LIMIT) -> None:
        self.storage = storage
        first = storage.first_index()
        last = storage.last_index()
        snap = storage.snapshot()
        # A restarted node must see a contiguous history: the snapshot covers everything before
        # the log. The log may also start BEFORE the snapshot index: the application creates a
        # snapshot at its applied index but compacts to a lower index, keeping a tail of entries
        # for slow followers (etcd's snapshotCatchUpEntries); the simulator found the stricter
        # check `first == snapshot + 1` refusing to restart such a node.
        if not snap.is_empty() and not (first - 1 <= snap.metadata.index <= last):
            raise StorageStateError("snapshot does not border the log",
                                    first_index=first, last_index=last, snapshot_index=snap.metadata.index)
        if last < first - 1:
            raise StorageStateError("last index before first index", first_index=first, last_index=last)
        self.unstable = Unstable(last + 1)
        self.committed = first - 1  # Invariant: never decreases
        self.applying = first - 1  # highest index handed to the app in a Ready
        self.applied = first - 1  # highest index the app reported applied
        self.max_applying_size = max_applying_size  # bytes of committed entries per Ready

    def __repr__(self) -> str:
        return (f"RaftLog(committed={self.committed}, applied={self.applied}, applying={self.applying}, "
                f"unstable.offset={self.unstable.offset}, len(unstable)={len(self.unstable.entries)})")

    # ------------------------------------------------ bounds and terms

    def first_index(self) -> int:
        i = self.unstable.maybe_first_index()
        return i if i is not None else self.storage.first_index()

    def last_index(self) -> int:
        i = self.unstable.maybe_last_index()
        return i if i is not None else self.storage.last_index()

    def term(self, i: int) -> int:
        """Term of entry i (0 for index 0). Raises Compacted / Unavailable."""
        t = self.unstable.maybe_term(i)
        if t is not None:
            return t
        dummy = self.first_index() - 1
        if i < dummy:
            raise Compacted(i, dummy + 1)
        if i > self.last_index():
            raise Unavailable(i, self.last_index())
        return self.storage.term(i)

    def term_or_zero(self, i: int) -> int:
        try:
            return self.term(i)
        except (Compacted, Unavailable):
            return 0

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, i: int, t: int) -> bool:
        try:
            return self.term(i) == t
        except (Compacted, Unavailable):
            return False

    def is_up_to_date(self, lasti: int, term: int) -> bool:
        """§5.4.1: is a candidate's log (lasti, term) at least as up-to-date as ours?"""
        lt = self.last_term()
        return term > lt or (term == lt and lasti >= self.last_index())

    # ------------------------------------------------ appending

    def find_conflict(self, ents: tuple[Entry, ...] | list[Entry]) -> int:
        """Index of the first entry whose term differs from ours (or is new); 0 if none.

        `ents` are consecutive, so the first one beyond our last index is new and so is every
        one after it: only the overlap with our log is compared term by term.
        """
        last = self.last_index()
        for e in ents:
            if e.index > last or not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """Largest (i, term(i)) with i <= index and term(i) <= term (fast backtracking, §5.3)."""
        while index > 0:
            try:
                t = self.term(index)
            except (Compacted, Unavailable):
                return index, 0
            if t <= term:
                return index, t
            index -= 1
        return 0, 0

    def maybe_append(self, index: int, log_term: int, committed: int,
                     ents: tuple[Entry, ...]) -> Optional[int]:
        """Follower side of AppendEntries; returns the last new index, or None on mismatch."""
        if not self.match_term(index, log_term):
            return None
        lastnewi = index + len(ents)
        ci = self.find_conflict(ents)
        if ci != 0:
            invariant(ci > self.committed,
                      f"conflicting entry {ci} at or below committed {self.committed}")
            self.append(list(ents[ci - index - 1:]))
        self.commit_to(min(committed, lastnewi))
        return lastnewi

    def append(self, ents: list[Entry]) -> int:
        if not ents:
            return self.last_index()
        after = ents[0].index - 1
        if after < self.committed:  # guarded: the f-string would be built on every call
            invariant(False, f"append after {after} is below committed {self.committed}")
        self.unstable.truncate_and_append(ents)
        return self.last_index()

    # ------------------------------------------------ commit / apply

    def commit_to(self, tocommit: int) -> None:
        if self.committed < tocommit:
            if tocommit > self.last_index():
                invariant(False, f"commit {tocommit} beyond last index {self.last_index()}")
            self.committed = tocommit

    def maybe_commit(self, max_index: int, term: int) -> bool:
        """Commit max_index if its entry is of `term` (only current-term entries, §5.4.2)."""
        if max_index > self.committed and self.term_or_zero(max_index) == term:
            self.commit_to(max_index)
            return True
        return False

    def applied_to(self, i: int) -> None:
        if i == 0:
            return
        if not self.applied <= i <= self.committed:
            invariant(False, f"applied {i} outside [{self.applied}, {self.committed}]")
        self.applied = i
        self.applying = max(self.applying, i)

    def accept_applying(self, i: int) -> None:
        if i > self.committed:
            invariant(False, f"applying {i} beyond committed {self.committed}")
        self.applying = max(self.applying, i)

    def _max_appliable_index(self, allow_unstable: bool) -> int:
        hi = self.committed
        if not allow_unstable:
            hi = min(hi, self.unstable.offset - 1)
        return hi

    def has_next_committed_ents(self, allow_unstable: bool = True) -> bool:
        if self.committed <= self.applying:
            return False  # the idle case, checked on every has_ready(): skip first_index()
        if self.has_pending_snapshot():
            return False  # apply the snapshot first
        lo = max(self.applying, self.first_index() - 1) + 1
        return lo <= self._max_appliable_index(allow_unstable)

    def next_committed_ents(self, allow_unstable: bool = True) -> list[Entry]:
        if self.has_pending_snapshot():
            return []
        lo = max(self.applying, self.first_index() - 1) + 1
        hi = self._max_appliable_index(allow_unstable) + 1
        if lo >= hi:
            return []
        return self.slice(lo, hi, self.max_applying_size)

    def has_pending_snapshot(self) -> bool:
        return self.unstable.snapshot is not None

    def next_unstable_ents(self) -> list[Entry]:
        return self.unstable.next_entries()

    def has_next_unstable_ents(self) -> bool:
        return self.unstable.offset_in_progress < self.unstable.offset + len(self.unstable.entries)

    def snapshot(self) -> Snapshot:
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()

    def stable_to(self, index: int, term: int) -> None:
        self.unstable.stable_to(index, term)

    def stable_snap_to(self, i: int) -> None:
        self.unstable.stable_snap_to(i)

    def restore(self, snap: Snapshot) -> None:
        """Replace the whole log by a snapshot (which is committed by definition)."""
        self.committed = snap.metadata.index
        self.unstable.restore(snap)

    # ------------------------------------------------ reading ranges

    def entries(self, i: int, max_bytes: int = NO_LIMIT) -> list[Entry]:
        if i > self.last_index():
            return []
        return self.slice(i, self.last_index() + 1, max_bytes)

    def all_entries(self) -> list[Entry]:
        try:
            return self.entries(self.first_index())
        except Compacted:  # racing compaction; retry once from the new start
            return self.entries(self.first_index())

    def slice(self, lo: int, hi: int, max_bytes: int = NO_LIMIT) -> list[Entry]:
        """Entries [lo, hi) limited to max_bytes (at least one). Raises Compacted."""
        first = self.first_index()
        if lo < first:
            raise Compacted(lo, first)
        if not lo <= hi <= self.last_index() + 1:
            invariant(False, f"slice [{lo},{hi}) out of bounds")
        if lo == hi:
            return []
        out: list[Entry] = []
        uoff = self.unstable.offset
        if lo < uoff:
            out = list(self.storage.entries(lo, min(hi, uoff), max_bytes))
            if len(out) < min(hi, uoff) - lo:
                return out  # hit the size limit inside storage
        if hi > uoff:
            uns = self.unstable.slice(max(lo, uoff), hi)
            if out:
                size = encoded_size(out)
                for e in uns:
                    size += entry_encoded_size(e)
                    if size > max_bytes:
                        return out
                    out.append(e)
                return out
            return limit_size(uns, max_bytes)
        return out
