"""RaftLog, Unstable and MemoryStorage (incl. crash/sync modelling)."""
import pytest

from xraft.node.invariant import InvariantViolation
from xraft.node.raft.codec import ENTRY_OVERHEAD
from xraft.node.raft.log import RaftLog
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import (
    Compacted,
    ConfState,
    Entry,
    HardState,
    Snapshot,
    SnapshotMetadata,
    SnapshotOutOfDate,
    StorageStateError,
    Unavailable,
)


def ents(*pairs):
    """ents((index, term), ...)"""
    return [Entry(term=t, index=i) for i, t in pairs]


def log_with(terms, committed=0):
    st = MemoryStorage()
    st.append([Entry(term=t, index=i + 1) for i, t in enumerate(terms)])
    lg = RaftLog(st)
    lg.committed = committed
    return lg


def test_find_conflict():
    lg = log_with([1, 2, 3])
    assert lg.find_conflict(ents((1, 1), (2, 2))) == 0
    assert lg.find_conflict(ents((2, 2), (3, 3), (4, 4))) == 4  # new entries
    assert lg.find_conflict(ents((2, 2), (3, 4))) == 3  # term mismatch
    assert lg.find_conflict([]) == 0


def test_find_conflict_by_term_skips_whole_terms():
    lg = log_with([1, 1, 2, 2, 2, 5, 5])
    assert lg.find_conflict_by_term(7, 4) == (5, 2)
    assert lg.find_conflict_by_term(7, 5) == (7, 5)
    assert lg.find_conflict_by_term(4, 1) == (2, 1)
    assert lg.find_conflict_by_term(3, 0) == (0, 0)


def test_maybe_append_truncates_only_real_conflicts():
    lg = log_with([1, 2, 2, 2], committed=1)
    # matching prefix, nothing new: no truncation of the later entries
    assert lg.maybe_append(1, 1, 1, tuple(ents((2, 2)))) == 2
    assert lg.last_index() == 4
    # real conflict at 3: suffix replaced
    assert lg.maybe_append(2, 2, 3, tuple(ents((3, 3)))) == 3
    assert [e.term for e in lg.all_entries()] == [1, 2, 3]
    assert lg.committed == 3
    # mismatching prev term: refused
    assert lg.maybe_append(3, 2, 3, ()) is None


def test_committed_entry_is_never_truncated():
    lg = log_with([1, 1, 1], committed=3)
    with pytest.raises(InvariantViolation):
        lg.maybe_append(1, 1, 3, tuple(ents((2, 2))))
    assert [e.term for e in lg.all_entries()] == [1, 1, 1]


def test_commit_never_decreases_and_never_passes_last():
    lg = log_with([1, 1], committed=2)
    lg.commit_to(1)
    assert lg.committed == 2
    with pytest.raises(InvariantViolation):
        lg.commit_to(5)


def test_is_up_to_date():
    lg = log_with([1, 2, 3])
    assert lg.is_up_to_date(3, 3) and lg.is_up_to_date(1, 4) and lg.is_up_to_date(9, 3)
    assert not lg.is_up_to_date(2, 3) and not lg.is_up_to_date(9, 2)


def test_unstable_lifecycle_and_stale_stable_acks():
    lg = log_with([1, 1])
    lg.append(ents((3, 2), (4, 2)))
    assert [e.index for e in lg.next_unstable_ents()] == [3, 4]
    lg.unstable.accept_in_progress()
    assert lg.next_unstable_ents() == [] and not lg.has_next_unstable_ents()
    lg.append(ents((5, 2)))
    assert [e.index for e in lg.next_unstable_ents()] == [5]
    # truncation below the in-progress mark makes those entries new again
    lg.append(ents((4, 3)))
    assert [(e.index, e.term) for e in lg.next_unstable_ents()] == [(4, 3)]
    lg.stable_to(4, 2)  # stale ack for the replaced entry: ignored
    assert lg.unstable.offset == 3
    lg.stable_to(3, 2)
    assert lg.unstable.offset == 4 and lg.term(4) == 3


def test_slice_respects_size_across_storage_and_unstable():
    st = MemoryStorage()
    st.append([Entry(1, i, data=b"x" * 10) for i in range(1, 4)])
    lg = RaftLog(st)
    lg.append([Entry(1, i, data=b"x" * 10) for i in range(4, 7)])
    one = ENTRY_OVERHEAD + 10
    assert [e.index for e in lg.slice(1, 7)] == [1, 2, 3, 4, 5, 6]
    assert [e.index for e in lg.slice(2, 7, one * 4)] == [2, 3, 4, 5]
    assert [e.index for e in lg.slice(2, 7, 1)] == [2]  # always at least one
    assert [e.index for e in lg.slice(4, 7, one * 2)] == [4, 5]


def test_next_committed_ents_limited_and_not_repeated():
    lg = log_with([1] * 5, committed=4)
    lg.max_applying_size = ENTRY_OVERHEAD * 2
    assert [e.index for e in lg.next_committed_ents()] == [1, 2]
    lg.accept_applying(2)
    assert [e.index for e in lg.next_committed_ents()] == [3, 4]
    lg.accept_applying(4)
    assert not lg.has_next_committed_ents()
    lg.applied_to(4)
    assert lg.applied == 4


def test_compaction_and_restore():
    st = MemoryStorage()
    st.append(ents((1, 1), (2, 1), (3, 2), (4, 2)))
    st.create_snapshot(3, ConfState(voters=(1,)), b"img")
    st.compact(3)
    assert st.first_index() == 4 and st.term(3) == 2
    with pytest.raises(Compacted):
        st.term(2)
    with pytest.raises(Unavailable):
        st.entries(4, 6)
    with pytest.raises(SnapshotOutOfDate):
        st.create_snapshot(2, None, b"")
    lg = RaftLog(st)
    assert lg.first_index() == 4 and lg.committed == 3
    with pytest.raises(Compacted):
        lg.slice(2, 4)
    snap = Snapshot(SnapshotMetadata(10, 5, ConfState(voters=(1,))), b"s")
    lg.restore(snap)
    assert lg.last_index() == 10 and lg.committed == 10 and lg.first_index() == 11
    assert lg.term(10) == 5 and lg.has_pending_snapshot()


def test_storage_append_overwrites_suffix_and_rejects_gaps():
    st = MemoryStorage()
    st.append(ents((1, 1), (2, 1), (3, 1)))
    st.append(ents((2, 2)))
    assert st.last_index() == 2 and st.term(2) == 2
    with pytest.raises(InvariantViolation):
        st.append(ents((5, 2)))


def test_crash_keeps_only_synced_writes():
    st = MemoryStorage()
    st.append(ents((1, 1), (2, 1)))
    st.set_hard_state(HardState(1, 1, 1))
    st.sync()
    st.append(ents((3, 1)))
    st.set_hard_state(HardState(2, 0, 2))
    assert st.unsynced_writes() == 2
    after = st.crash()
    assert after.last_index() == 2 and after.initial_state()[0] == HardState(1, 1, 1)
    torn = st.crash(tear_last=True)
    assert torn.last_index() == 1
    # tearing a committed entry is a caller bug
    st.sync()
    st.set_hard_state(HardState(2, 0, 3))
    st.sync()
    with pytest.raises(InvariantViolation):
        st.crash(tear_last=True)


def test_crash_replays_compaction_and_snapshots():
    st = MemoryStorage()
    st.append(ents((1, 1), (2, 1), (3, 1)))
    st.create_snapshot(2, ConfState(voters=(1,)), b"x")
    st.compact(2)
    st.sync()
    st.apply_snapshot(Snapshot(SnapshotMetadata(9, 3, ConfState(voters=(1,))), b"y"))
    a = st.crash()
    assert a.first_index() == 3 and a.snapshot().data == b"x"
    st.sync()
    b = st.crash()
    assert b.first_index() == 10 and b.snapshot().data == b"y"


class GappyStorage(MemoryStorage):
    def first_index(self):
        return super().first_index() + 1


def test_new_log_validates_snapshot_and_log_are_contiguous():
    st = GappyStorage()
    st.apply_snapshot(Snapshot(SnapshotMetadata(5, 1, ConfState(voters=(1,)))))
    with pytest.raises(StorageStateError):
        RaftLog(st)
