"""DiskStorage on real files: restarts after each kind of write, release, repair, and a model test."""
import logging
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

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
from xraft.node.runtime.disk_storage import DiskStorage, DiskStorageOptions
from xraft.node.runtime.snapfile import SnapshotFiles
from xraft.node.runtime.wal import RECORD_HEADER_BYTES, FsyncPolicy, Wal, WalCorruption, WalOptions

CS = ConfState(voters=(1, 2, 3))


def ents(lo, hi, term, tag=b""):
    return [Entry(term=term, index=i, data=tag + b"e%d" % i) for i in range(lo, hi + 1)]


def reopen(st, options=None):
    st.close()
    return DiskStorage.open(st.dir, options or st.options)


def all_entries(st):
    return st.entries(st.first_index(), st.last_index() + 1)


def test_fresh_directory(tmp_path):
    st = DiskStorage.open(str(tmp_path))
    assert (st.first_index(), st.last_index()) == (1, 0)
    assert st.initial_state() == (HardState(), ConfState())
    assert st.term(0) == 0 and st.snapshot() == Snapshot() and st.durable
    with pytest.raises(Unavailable):
        st.term(1)
    st = reopen(st)
    assert (st.first_index(), st.last_index()) == (1, 0)
    st.close()


def test_restart_after_entries_and_hard_state(tmp_path):
    st = DiskStorage.open(str(tmp_path))
    st.save(HardState(term=2, vote=1, commit=3), ents(1, 5, 2))
    assert st.sync() is True
    st = reopen(st)
    assert st.hard_state() == HardState(2, 1, 3)
    assert all_entries(st) == ents(1, 5, 2)
    assert [st.term(i) for i in range(0, 6)] == [0, 2, 2, 2, 2, 2]
    st.save(HardState(term=3, vote=2, commit=5), ())
    st.sync()
    st = reopen(st)
    assert st.hard_state() == HardState(3, 2, 5)
    st.close()


def test_conflicting_suffix_overwrite_is_replayed(tmp_path):
    st = DiskStorage.open(str(tmp_path))
    st.save(HardState(1, 1, 0), ents(1, 10, 1))
    st.sync()
    st.save(HardState(2, 2, 0), ents(6, 7, 2, b"x"))  # truncates 8..10
    st.sync()
    expect = ents(1, 5, 1) + ents(6, 7, 2, b"x")
    assert all_entries(st) == expect
    st = reopen(st)
    assert all_entries(st) == expect and st.last_index() == 7
    with pytest.raises(Unavailable):
        st.entries(5, 9)
    st.close()


def test_entries_size_limit_and_errors(tmp_path):
    st = DiskStorage.open(str(tmp_path))
    st.save(None, ents(1, 6, 1))
    mem = MemoryStorage()
    mem.append(ents(1, 6, 1))
    for max_bytes in (0, 1, 24, 48, 70, 10**6):
        assert st.entries(2, 7, max_bytes) == mem.entries(2, 7, max_bytes)
    with pytest.raises(StorageStateError):
        st.save(None, ents(9, 9, 1))  # gap
    st.create_snapshot(3, CS, b"", keep_entries=2)  # 2..3 stay live but are snapshotted
    with pytest.raises(StorageStateError, match="immutable"):
        st.save(None, ents(3, 4, 2))  # rewriting what the snapshot covers
    st.close()


def test_snapshot_create_compact_release_and_restart(tmp_path):
    opts = DiskStorageOptions(wal=WalOptions(segment_bytes=4096), cache_bytes=2000)
    st = DiskStorage.open(str(tmp_path), opts)
    for i in range(1, 201):
        st.save(HardState(1, 1, i - 1), [Entry(1, i, data=bytes(100))])
        st.sync()
    segs_before = st.wal_segment_paths()
    assert len(segs_before) > 5
    with pytest.raises(StorageStateError):
        st.compact(50)  # no snapshot covers it yet
    snap = st.create_snapshot(150, CS, b"sm@150", keep_entries=20)
    assert st.first_index() == 131 and st.snapshot() == snap
    segs_after = st.wal_segment_paths()
    assert len(segs_after) < len(segs_before) and segs_after[-1] == segs_before[-1]
    st.compact(140)
    st.sync()
    st = reopen(st)
    assert st.first_index() == 141 and st.last_index() == 200
    assert st.term(140) == 1 and st.snapshot() == snap
    assert st.initial_state() == (HardState(1, 1, 199), CS)
    assert all_entries(st) == [Entry(1, i, data=bytes(100)) for i in range(141, 201)]
    with pytest.raises(Compacted):
        st.entries(140, 150)
    with pytest.raises(SnapshotOutOfDate):
        st.create_snapshot(150, None, b"")
    st.close()


def test_hard_state_survives_release_of_the_segment_that_held_it(tmp_path):
    opts = DiskStorageOptions(wal=WalOptions(segment_bytes=4096))
    st = DiskStorage.open(str(tmp_path), opts)
    st.save(HardState(term=7, vote=3, commit=0), ())
    st.sync()
    first_segment = st.wal_segment_paths()[0]
    for i in range(1, 101):
        st.save(None, [Entry(7, i, data=bytes(200))])
        st.sync()
    st.create_snapshot(100, CS, b"sm")
    assert first_segment not in st.wal_segment_paths()  # released
    st = reopen(st)
    # term and vote from the released segment's record survive (the prologue carried them);
    # commit is raised to the snapshot's index, which only committed entries reach.
    assert st.hard_state() == HardState(term=7, vote=3, commit=100)
    assert (st.first_index(), st.last_index(), st.term(100)) == (101, 100, 7)
    st.close()


def test_apply_snapshot_replaces_log_and_survives_restart(tmp_path):
    st = DiskStorage.open(str(tmp_path))
    st.save(HardState(1, 1, 3), ents(1, 5, 1))
    st.sync()
    snap = Snapshot(SnapshotMetadata(index=20, term=4, conf_state=CS), b"leader state")
    st.apply_snapshot(snap)
    st.save(HardState(4, 0, 20), ents(21, 22, 4))
    st.sync()
    st = reopen(st)
    assert (st.first_index(), st.last_index(), st.term(20)) == (21, 22, 4)
    assert st.snapshot() == snap and st.hard_state() == HardState(4, 0, 20)
    with pytest.raises(SnapshotOutOfDate):
        st.apply_snapshot(snap)
    st.close()


def test_snapshot_file_without_its_wal_marker_is_completed_at_open(tmp_path):
    """Crash after apply_snapshot() wrote its file but before the WAL marker was synced."""
    st = DiskStorage.open(str(tmp_path))
    st.save(HardState(1, 1, 2), ents(1, 5, 1))
    st.close()
    snap = Snapshot(SnapshotMetadata(index=9, term=3, conf_state=CS), b"s")
    SnapshotFiles(os.path.join(str(tmp_path), "snap")).save(snap)
    st = DiskStorage.open(str(tmp_path))
    assert (st.first_index(), st.last_index(), st.term(9)) == (10, 9, 3)
    assert st.hard_state().commit == 9 and st.snapshot() == snap
    st = reopen(st)  # the repair itself was made durable
    assert (st.first_index(), st.last_index()) == (10, 9)
    st.close()


def test_missing_snapshot_file_is_a_typed_error(tmp_path):
    st = DiskStorage.open(str(tmp_path))
    st.save(HardState(1, 1, 5), ents(1, 8, 1))
    st.create_snapshot(5, CS, b"x")
    st.close()
    snapdir = os.path.join(str(tmp_path), "snap")
    for name in os.listdir(snapdir):
        os.unlink(os.path.join(snapdir, name))
    with pytest.raises(StorageStateError, match="missing or damaged"):
        DiskStorage.open(str(tmp_path))


def test_torn_tail_loses_only_the_unsynced_batch(tmp_path):
    st = DiskStorage.open(str(tmp_path))
    st.save(HardState(1, 1, 4), ents(1, 4, 1))
    st.sync()
    st.save(None, ents(5, 6, 1))
    st.close()
    seg = st.wal_segment_paths()[-1]
    # The file runs on past the records (zeros written ahead): tear the last record itself.
    seen = []
    Wal.open(os.path.join(str(tmp_path), "wal"), visit=seen.append).close()
    last = seen[-1]  # ents 5..6, the batch synced only by close()
    synced_end = seen[-2].offset + RECORD_HEADER_BYTES + len(seen[-2].payload)  # the batch before
    os.truncate(seg, last.offset + RECORD_HEADER_BYTES + len(last.payload) - 3)
    st = DiskStorage.open(str(tmp_path))
    assert st.last_index() == 4 and os.path.getsize(seg) == synced_end
    st.close()


def test_corrupt_old_record_refuses_open(tmp_path):
    st = DiskStorage.open(str(tmp_path))
    st.save(HardState(1, 1, 1), ents(1, 3, 1, b"AAAA"))
    st.save(None, ents(4, 6, 1))
    st.sync()
    seg = st.wal_segment_paths()[-1]
    st.close()
    raw = bytearray(open(seg, "rb").read())
    raw[raw.index(b"AAAA")] ^= 0x40
    open(seg, "wb").write(bytes(raw))
    with pytest.raises(WalCorruption) as info:
        DiskStorage.open(str(tmp_path))
    assert info.value.path == seg and info.value.offset > 0


def test_cache_miss_rereads_and_verifies(tmp_path):
    st = DiskStorage.open(str(tmp_path), DiskStorageOptions(cache_bytes=0))
    st.save(HardState(1, 1, 0), ents(1, 50, 1, b"payload"))
    st.save(None, ents(51, 60, 1, b"second"))
    st.sync()
    assert all_entries(st) == ents(1, 50, 1, b"payload") + ents(51, 60, 1, b"second")
    seg = st.wal_segment_paths()[-1]
    raw = bytearray(open(seg, "rb").read())
    raw[raw.index(b"payload")] ^= 1  # damaged after open: caught on read, not served
    open(seg, "wb").write(bytes(raw))
    with pytest.raises(WalCorruption):
        st.entries(1, 3)
    st.close()


def test_fsync_never_is_not_durable(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        st = DiskStorage.open(str(tmp_path), DiskStorageOptions(wal=WalOptions(fsync=FsyncPolicy.NEVER)))
    assert st.durable is False and "NOT durable" in caplog.text
    st.save(HardState(1, 1, 0), ents(1, 2, 1))
    assert st.sync() is False
    st.close()


# ---------------------------------------------------------------- model test

ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 6), st.integers(1, 12), st.integers(0, 2)),
    st.tuples(st.just("append"), st.integers(0, 0), st.integers(1, 12), st.integers(0, 0)),
    st.tuples(st.just("hard"), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("snapshot"), st.integers(0, 8), st.integers(0, 3)),
    st.tuples(st.just("compact"), st.integers(0, 8)),
    st.tuples(st.just("install"), st.integers(1, 5), st.integers(0, 2)),
    st.tuples(st.just("restart"),),
    st.tuples(st.just("sync"),),
), min_size=15, max_size=60)


def check_equal(mem, disk):
    assert (disk.first_index(), disk.last_index()) == (mem.first_index(), mem.last_index())
    assert disk.hard_state() == mem.hard_state()
    assert disk.snapshot() == mem.snapshot()
    assert disk.initial_state() == mem.initial_state()
    lo, hi = mem.first_index(), mem.last_index() + 1
    assert disk.entries(lo, hi) == mem.entries(lo, hi)
    for i in range(lo - 1, hi):
        assert disk.term(i) == mem.term(i)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_matches_memory_storage(program):
    d = tempfile.mkdtemp(prefix="xraft-model-")
    opts = DiskStorageOptions(wal=WalOptions(segment_bytes=4096), cache_bytes=300)
    try:
        mem, disk = MemoryStorage(), DiskStorage.open(d, opts)
        term = 1
        for op in program:
            kind = op[0]
            if kind == "append":
                _, back, n, bump = op
                term += bump
                # Raft never rewrites committed entries.
                lo = max(mem.first_index(), mem.last_index() + 1 - back, mem.hard_state().commit + 1,
                         mem.snapshot().metadata.index + 1)
                batch = [Entry(term, i, data=b"%d.%d" % (term, i) * (i % 30 * 6)) for i in range(lo, lo + n)]
                mem.append(batch)
                disk.save(None, batch)
            elif kind == "hard":
                _, t, v = op
                hs = HardState(term=term + t, vote=v, commit=min(mem.last_index(), mem.hard_state().commit + 2))
                mem.set_hard_state(hs)
                disk.save(hs)
            elif kind == "snapshot":
                _, back, keep = op
                # Raft snapshots applied, hence committed, state only.
                idx = min(mem.last_index() - back, mem.hard_state().commit)
                if idx <= mem.snapshot().metadata.index or idx < mem.first_index():
                    continue
                data = b"sm%d" % idx
                mem.create_snapshot(idx, CS, data)
                if idx - keep > mem.first_index() - 1:
                    mem.compact(idx - keep)
                assert disk.create_snapshot(idx, CS, data, keep_entries=keep) == mem.snapshot()
            elif kind == "compact":
                idx = mem.first_index() + op[1]
                if idx > mem.snapshot().metadata.index or idx > mem.last_index():
                    continue
                mem.compact(idx)
                disk.compact(idx)
            elif kind == "install":
                _, ahead, bump = op
                term += bump
                idx = max(mem.last_index(), mem.snapshot().metadata.index) + ahead
                snap = Snapshot(SnapshotMetadata(idx, term, ConfState(voters=(1, 2))), b"inst%d" % idx)
                mem.apply_snapshot(snap)
                disk.apply_snapshot(snap)
                # The core's next hard state commits the installed snapshot (raft restore()).
                hs = mem.hard_state()
                hs = HardState(term=max(hs.term, term), vote=hs.vote, commit=idx)
                mem.set_hard_state(hs)
                disk.save(hs)
            elif kind == "sync":
                assert disk.sync() is True
            else:
                disk = reopen(disk)
            check_equal(mem, disk)
        segs = disk.wal_segment_paths()
        event(f"WAL rotated: {int(os.path.basename(segs[-1])[4:20], 16) > 1}")
        event(f"WAL released segments: {int(os.path.basename(segs[0])[4:20], 16) > 1}")
        event(f"log compacted: {mem.first_index() > 1}")
        disk = reopen(disk)
        check_equal(mem, disk)
        disk.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_memory_held_counts_the_cache_within_its_bound_and_a_kept_snapshot(tmp_path):
    """INFO raft's raft_log_cache_bytes / raft_snapshot_cache_bytes: what the storage holds in memory."""
    opts = DiskStorageOptions(wal=WalOptions(segment_bytes=4096), cache_bytes=2000, snapshot_cache_bytes=100)
    st = DiskStorage.open(str(tmp_path), opts)
    assert st.memory_held() == (0, 0)
    held = []
    for i in range(1, 61):
        st.save(HardState(1, 1, i - 1), [Entry(1, i, data=bytes(100))])
        st.sync()
        held.append(st.memory_held()[0])
    assert 0 < max(held) <= 2000 and held[-1] >= 1800     # filled to its bound, never past it
    st.create_snapshot(50, CS, b"s" * 60, keep_entries=5)
    assert st.memory_held()[1] == 60                       # small enough: kept
    st.create_snapshot(55, CS, b"s" * 101, keep_entries=5)
    assert st.memory_held()[1] == 0                        # too big: re-read from its file
    st.close()
