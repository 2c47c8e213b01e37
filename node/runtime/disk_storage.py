"""DiskStorage: the Raft core's Storage over a WAL, snapshot files and a bounded entry cache.

Directory
    <dir>/wal/    the write-ahead log (wal.py)
    <dir>/snap/   snapshot files (snapfile.py)

WAL payloads (big-endian; every record is CRC-checked by the WAL first)
    ENTRIES     | count u32 | count x ( len u32 | codec.encode_entry(e), len bytes ) |
                count >= 1; indexes consecutive; terms >= 1 and non-decreasing
    HARD_STATE  | codec.encode_hard_state(hs) |                       (26 bytes)
    SNAPSHOT    | index u64 | term u64 | flags u8 |                    (17 bytes)
                a snapshot file at (index, term) is durable; flags bit0 = reset:
                the log was replaced by the snapshot (apply_snapshot); other bits 0
    COMPACT     | index u64 | term u64 |                               (16 bytes)
                entries <= index are gone; (index, term) is the log's dummy entry

Replay rules (in WAL order): ENTRIES whose first surviving index f lies in
[start, last+1] overwrite from f and truncate everything after (Raft's
conflicting-suffix rule); an ENTRIES record that does not connect is legal
only where older segments were released, and must be covered by a later
COMPACT (checked at the end). COMPACT with index <= the current compaction
point is a stale segment prologue and ignored.

Each new WAL segment starts with a prologue (hard state + COMPACT at the
current log start), so releasing older segments never loses the hard state
or the dummy entry.

Memory: terms and record positions of live entries in three array('Q')s
(24 bytes per entry); entry bodies in an LRU cache of decoded ENTRIES records
bounded by cache_bytes, refilled from the WAL (with a fresh CRC check) on miss.

Durability contract: save() / apply_snapshot() / compact() only buffer
(snapshot files are written at once); nothing is durable until sync() returns
True. The caller sends vote / append responses (Ready.persisted_messages)
only after that. A snapshot file may thus be durable before the WAL's commit
index reaches it: open() raises commit to the newest valid snapshot's index
(see _raise_commit_to_snapshot for why that is safe).
"""
from __future__ import annotations

import logging
import os
import struct
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from ..invariant import invariant
from ..raft.codec import CodecError, decode_entry, decode_hard_state, encode_entry, \
    encode_hard_state, entry_encoded_size
from ..raft.storage import NO_LIMIT
from ..raft.types import Compacted, ConfState, Entry, HardState, Snapshot, SnapshotMetadata, \
    SnapshotOutOfDate, StorageStateError, Unavailable
from .snapfile import DEFAULT_KEEP, SnapshotFiles, open_snapshot_file, read_snapshot_file, snapshot_name
from .wal import MAX_RECORD_PAYLOAD_BYTES, FsyncPolicy, RecordPos, RecordType, Wal, \
    WalCorruption, WalOptions, WalRecord, make_dir_durable

log = logging.getLogger("xraft.disk_storage")

_U32 = struct.Struct(">I")
_MARK = struct.Struct(">QQ")  # COMPACT: index, term
_SNAP_MARK = struct.Struct(">QQB")  # SNAPSHOT: index, term, flags
SNAP_MARK_RESET = 1
MIN_ENTRY_BYTES = 4 + 2 + 21  # len prefix + codec header + entry head: bounds `count`


@dataclass(frozen=True)
class DiskStorageOptions:
    wal: WalOptions = field(default_factory=WalOptions)
    cache_bytes: int = 64 << 20  # decoded entry bodies kept in memory (LRU); >= 0
    snapshot_cache_bytes: int = 64 << 20  # newest snapshot's data kept in memory if this small
    keep_snapshots: int = DEFAULT_KEEP


def encode_entries_payload(entries: Sequence[Entry]) -> bytes:
    out = [_U32.pack(len(entries))]
    for e in entries:
        b = encode_entry(e)
        out.append(_U32.pack(len(b)))
        out.append(b)
    return b"".join(out)


def decode_entries_payload(payload: bytes) -> list[Entry]:
    """Decode and validate an ENTRIES payload (ValueError / CodecError if malformed)."""
    if len(payload) < 4:
        raise ValueError("ENTRIES payload shorter than its count")
    (count,) = _U32.unpack_from(payload, 0)
    if count == 0 or count * MIN_ENTRY_BYTES > len(payload) - 4:
        raise ValueError(f"entry count {count} impossible for {len(payload)} bytes")
    out = []
    pos = 4
    for _ in range(count):
        if pos + 4 > len(payload):
            raise ValueError("ENTRIES payload truncated in a length prefix")
        (n,) = _U32.unpack_from(payload, pos)
        pos += 4
        if n > len(payload) - pos:
            raise ValueError(f"entry length {n} runs past the payload")
        out.append(decode_entry(payload[pos:pos + n]))
        pos += n
    if pos != len(payload):
        raise ValueError(f"{len(payload) - pos} trailing bytes after {count} entries")
    _check_batch(out)
    return out


def _check_batch(entries: Sequence[Entry]) -> None:
    """Indexes consecutive, terms >= 1 and non-decreasing (ValueError otherwise)."""
    prev = None
    for e in entries:
        if e.term < 1 or e.index < 1:
            raise ValueError(f"entry ({e.term}, {e.index}) with term or index 0")
        if prev is not None and (e.index != prev.index + 1 or e.term < prev.term):
            raise ValueError(f"entry ({e.term}, {e.index}) does not follow ({prev.term}, {prev.index})")
        prev = e


def _split_for_records(entries: Sequence[Entry]) -> list[Sequence[Entry]]:
    """Consecutive chunks whose ENTRIES payload fits in one WAL record."""
    chunks, start, size = [], 0, 4
    for k, e in enumerate(entries):
        n = 4 + 2 + entry_encoded_size(e)
        if size + n > MAX_RECORD_PAYLOAD_BYTES and k > start:
            chunks.append(entries[start:k])
            start, size = k, 4
        size += n
    chunks.append(entries[start:])
    return chunks


@dataclass(frozen=True)
class SnapshotPlan:
    """A snapshot being made (DiskStorage.plan_snapshot): its metadata and its directory.
    write() is plain file I/O on the plan alone, so a forked child may run it."""
    meta: SnapshotMetadata
    files: SnapshotFiles

    def write(self, data: bytes) -> str:
        """The snapshot file with `data` written to its .tmp and fsynced: the .tmp path."""
        return self.files.write_tmp(Snapshot(self.meta, data))


class DiskStorage:
    """Durable Raft storage. Read side = the core's Storage protocol; write side below."""

    def __init__(self, dirpath: str, options: DiskStorageOptions):
        # Use DiskStorage.open().
        self.dir = dirpath
        self.options = options
        self._hs = HardState()  # latest hard state given to save()
        self._hs_logged = HardState()  # latest hard state appended to the WAL
        # Invariant: True while a (term, vote) change is appended but not yet fsynced; sync()
        # then fsyncs at once even under fsync=batch (see sync()).
        self._vote_unsynced = False
        self._off = 0  # compaction point: index of the dummy entry. Invariant: <= snapshot index
        self._off_term = 0  # term of the dummy entry
        # Live entries start .. start+len-1. Invariant (outside replay): start == _off + 1.
        self._start = 1
        self._terms = array("Q")  # term of each live entry
        self._seqs = array("Q")  # WAL segment holding it
        self._offs = array("Q")  # byte offset of its ENTRIES record in that segment
        self._cache: OrderedDict[tuple[int, int], tuple[Entry, ...]] = OrderedDict()
        self._cache_bytes = 0  # Invariant: == sum of entry sizes in _cache, <= cache_bytes after put
        self._snap_meta = SnapshotMetadata()  # newest durable snapshot
        self._snap_data: Optional[bytes] = None  # its data if small enough to keep, else re-read
        self._max_snap_marker = 0  # replay: highest snapshot index the WAL refers to
        self._release_to: Optional[int] = None  # release WAL segments up to here after next fsync
        # fsync=batch: the last sync() wrote records but deferred their fsync. Invariant: False
        # under always (every sync fsyncs) and never (nothing is ever fsynced, so nothing waits).
        self._fsync_deferred = False
        self._snapfiles = SnapshotFiles(os.path.join(dirpath, "snap"), options.keep_snapshots,
                                        durable=options.wal.fsync is not FsyncPolicy.NEVER)
        self._wal: Optional[Wal] = None
        self.closed = False

    # ------------------------------------------------ open / recovery

    @classmethod
    def open(cls, dirpath: str, options: DiskStorageOptions = DiskStorageOptions()) -> "DiskStorage":
        """Recover everything under `dirpath` (created if missing).

        Raises WalCorruption for damaged log bytes, StorageStateError when the
        snapshot and log do not connect.
        """
        if options.cache_bytes < 0 or options.snapshot_cache_bytes < 0:
            raise ValueError("cache sizes must be >= 0")
        make_dir_durable(dirpath, options.wal.fsync is not FsyncPolicy.NEVER)
        st = cls(dirpath, options)
        st._wal = Wal.open(os.path.join(dirpath, "wal"), options.wal, visit=st._replay,
                           segment_start=st._segment_prologue)
        try:
            st._reconcile()
        except BaseException:
            st._wal.close()
            raise
        return st

    def _corrupt(self, reason: str, seq: int, offset: int) -> WalCorruption:
        return WalCorruption(reason, self._wal_segment_path(seq), offset)

    def _wal_segment_path(self, seq: int) -> str:
        wal_dir = os.path.join(self.dir, "wal")
        for p in os.listdir(wal_dir):
            if p.startswith(f"wal-{seq:016x}-"):
                return os.path.join(wal_dir, p)
        return os.path.join(wal_dir, f"wal-{seq:016x}-?")

    def _replay(self, rec: WalRecord) -> None:
        try:
            if rec.type is RecordType.ENTRIES:
                self._apply_entries(decode_entries_payload(rec.payload), RecordPos(rec.seq, rec.offset),
                                    replaying=True)
            elif rec.type is RecordType.HARD_STATE:
                self._hs = self._hs_logged = decode_hard_state(rec.payload)
            elif rec.type is RecordType.COMPACT:
                if len(rec.payload) != _MARK.size:
                    raise ValueError(f"COMPACT payload of {len(rec.payload)} bytes")
                index, term = _MARK.unpack(rec.payload)
                self._apply_compact(index, term, replaying=True)
            else:
                if len(rec.payload) != _SNAP_MARK.size:
                    raise ValueError(f"SNAPSHOT payload of {len(rec.payload)} bytes")
                index, term, flags = _SNAP_MARK.unpack(rec.payload)
                if flags & ~SNAP_MARK_RESET or index == 0:
                    raise ValueError(f"SNAPSHOT marker index {index} flags {flags:#x}")
                self._max_snap_marker = max(self._max_snap_marker, index)
                if flags & SNAP_MARK_RESET:
                    self._apply_reset(index, term)
        except (ValueError, CodecError) as exc:  # CRC-valid but not what we write: never use it
            raise self._corrupt(f"{rec.type.name} record: {exc}", rec.seq, rec.offset) from None

    def _reconcile(self) -> None:
        """After replay: check the log connects to the newest snapshot file; finish a reset."""
        if self._start != self._off + 1:
            raise StorageStateError("log entries start after a gap", start=self._start,
                                    compacted_to=self._off)
        snap = self._snapfiles.load_newest()
        s = snap.metadata.index
        if self._max_snap_marker > s:
            raise StorageStateError("the WAL refers to a snapshot that is missing or damaged",
                                    marker_index=self._max_snap_marker, newest_valid_snapshot=s)
        if self._off > s:
            raise StorageStateError("log compacted beyond the newest valid snapshot",
                                    compacted_to=self._off, snapshot_index=s)
        self._set_snapshot(snap)
        if s == 0:
            invariant(self._off == 0, "no snapshot, so nothing compacted")
        elif s == self._off:
            if self._off_term != snap.metadata.term:
                raise StorageStateError("snapshot term differs from the log's at its index",
                                        index=s, snapshot_term=snap.metadata.term, log_term=self._off_term)
        elif s > self.last_index() or self.term(s) != snap.metadata.term:
            # The snapshot file of an apply_snapshot() is durable but its WAL marker
            # is not: finish the reset now (the snapshot holds committed state).
            log.warning("%s: snapshot (%d, %d) newer than the log: completing its installation",
                        self.dir, s, snap.metadata.term)
            self._apply_reset(s, snap.metadata.term)
            if self._hs.commit < s:
                self._hs = HardState(self._hs.term, self._hs.vote, s)
            self._log_marks(reset=True)
            self.sync()
        if self._hs.commit < s:
            self._raise_commit_to_snapshot(s)
        if self._hs.commit > self.last_index():
            raise StorageStateError("hard state commit beyond the last durable entry",
                                    commit=self._hs.commit, last_index=self.last_index())

    def _raise_commit_to_snapshot(self, s: int) -> None:
        """The newest valid snapshot file is ahead of the durable commit index: raise commit to it.

        Why at recovery and not by ordering the writes: a snapshot only ever holds
        committed entries (create_snapshot() takes the applied state, apply_snapshot()
        the leader's, and Raft applies only committed entries), so a verified snapshot
        file at s PROVES that s is a valid commit index; commit is not part of the
        vote-safety state (term, vote), so raising it can never break Raft's safety.
        create_snapshot() writes the file before the WAL holds commit >= s (the
        driver buffers commit-only hard states), and under fsync=batch/never the WAL
        may lag the file further; syncing the WAL first would cost one more fsync per
        snapshot, would not help under fsync=batch after a power cut, and would leave
        the data directories that this ordering already bricked (applied > commit at
        every start) unopenable. Repairing here covers every interleaving and those
        directories; the raised hard state is written and synced at once.
        """
        log.warning("%s: snapshot at %d is ahead of the durable commit index %d: "
                    "raising commit to it (a snapshot holds only committed entries)",
                    self.dir, s, self._hs.commit)
        self.save(HardState(self._hs.term, self._hs.vote, s))
        self.sync()

    def _segment_prologue(self) -> tuple[int, list[tuple[int, bytes]]]:
        return self.last_index() + 1, [
            (RecordType.HARD_STATE, encode_hard_state(self._hs_logged)),
            (RecordType.COMPACT, _MARK.pack(self._off, self._off_term)),
        ]

    # ------------------------------------------------ state transitions (write and replay)

    def _apply_entries(self, entries: list[Entry], pos: RecordPos, replaying: bool) -> None:
        if not entries or entries[-1].index <= self._off:
            return  # everything already compacted away
        if entries[0].index <= self._off:
            entries = entries[self._off + 1 - entries[0].index:]
        f = entries[0].index
        last = self._start + len(self._terms) - 1
        if self._start <= f <= last + 1:
            k = f - self._start
            del self._terms[k:], self._seqs[k:], self._offs[k:]
        elif replaying:
            # Entries past a released stretch of log; a later COMPACT must cover the gap.
            del self._terms[:], self._seqs[:], self._offs[:]
            self._start = f
        else:
            raise StorageStateError("appended entries leave a gap", first=f, last_index=last)
        self._terms.extend(e.term for e in entries)
        self._seqs.extend([pos.seq] * len(entries))
        self._offs.extend([pos.offset] * len(entries))

    def _apply_compact(self, index: int, term: int, replaying: bool) -> None:
        if index <= self._off:
            invariant(replaying, "compaction only moves forward")
            return  # a stale segment prologue
        last = self._start + len(self._terms) - 1
        if self._start <= index <= last:
            k = index - self._start
            if self._terms[k] != term:
                raise ValueError(f"COMPACT at {index} term {term}, log has term {self._terms[k]}")
            del self._terms[:k + 1], self._seqs[:k + 1], self._offs[:k + 1]
            self._start = index + 1
        elif index > last:
            del self._terms[:], self._seqs[:], self._offs[:]
            self._start = index + 1
        # else index < start - 1: a replay gap stays until a later COMPACT covers it
        self._off, self._off_term = index, term

    def _apply_reset(self, index: int, term: int) -> None:
        del self._terms[:], self._seqs[:], self._offs[:]
        self._off, self._off_term, self._start = index, term, index + 1

    def _set_snapshot(self, snap: Snapshot) -> None:
        self._snap_meta = snap.metadata
        keep = len(snap.data) <= self.options.snapshot_cache_bytes
        self._snap_data = bytes(snap.data) if keep else None

    def _log_marks(self, reset: bool) -> None:
        """Append the snapshot marker (and the hard state if it changed) for the current snapshot."""
        m = self._snap_meta
        recs = [(RecordType.SNAPSHOT, _SNAP_MARK.pack(m.index, m.term, SNAP_MARK_RESET if reset else 0))]
        if self._hs != self._hs_logged:
            recs.append((RecordType.HARD_STATE, encode_hard_state(self._hs)))
            self._hs_logged = self._hs
        self._wal.append(recs)

    # ------------------------------------------------ read side (Storage protocol)

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._hs, self._snap_meta.conf_state

    def hard_state(self) -> HardState:
        return self._hs

    def memory_held(self) -> tuple[int, int]:
        """(log entry bytes held decoded in the cache, snapshot data bytes kept in memory): the
        storage's share of the node's memory (INFO raft), bounded by cache_bytes and
        snapshot_cache_bytes. Entries count at their encoded size."""
        return self._cache_bytes, len(self._snap_data) if self._snap_data is not None else 0

    def first_index(self) -> int:
        return self._off + 1

    def last_index(self) -> int:
        return self._start + len(self._terms) - 1

    def term(self, i: int) -> int:
        if i < self._off:
            raise Compacted(i, self._off + 1)
        if i > self.last_index():
            raise Unavailable(i, self.last_index())
        if i == self._off:
            return self._off_term
        return self._terms[i - self._start]

    def entries(self, lo: int, hi: int, max_bytes: int = NO_LIMIT) -> list[Entry]:
        if lo <= self._off:
            raise Compacted(lo, self._off + 1)
        if hi > self.last_index() + 1:
            raise Unavailable(hi - 1, self.last_index())
        invariant(lo <= hi, f"entries range inverted [{lo}, {hi})")
        out: list[Entry] = []
        size = 0
        i = lo
        while i < hi:
            k = i - self._start
            key = (self._seqs[k], self._offs[k])
            batch = self._batch(key)
            first = batch[0].index
            # Take the run of indexes that live in this same record.
            j = i + 1
            while j < hi and self._seqs[j - self._start] == key[0] and self._offs[j - self._start] == key[1]:
                j += 1
            invariant(first <= i and j - 1 <= batch[-1].index, f"entries {i}..{j - 1} inside their record")
            for e in batch[i - first:j - first]:
                size += entry_encoded_size(e)
                if out and size > max_bytes:
                    return out
                out.append(e)
            i = j
        for e in out[:1] + out[-1:]:
            invariant(e.term == self._terms[e.index - self._start], f"cached entry {e.index} term")
        return out

    def _batch(self, key: tuple[int, int]) -> tuple[Entry, ...]:
        batch = self._cache.get(key)
        if batch is not None:
            self._cache.move_to_end(key)
            return batch
        rtype, payload = self._wal.read_record(RecordPos(*key))
        if rtype is not RecordType.ENTRIES:
            raise self._corrupt(f"expected an ENTRIES record, found {rtype.name}", *key)
        try:
            batch = tuple(decode_entries_payload(payload))
        except (ValueError, CodecError) as exc:
            raise self._corrupt(f"ENTRIES record: {exc}", *key) from None
        self._cache_put(key, batch)
        return batch

    def _cache_put(self, key: tuple[int, int], batch: tuple[Entry, ...]) -> None:
        size = sum(entry_encoded_size(e) for e in batch)
        if size > self.options.cache_bytes:
            return
        old = self._cache.pop(key, None)
        if old is not None:
            self._cache_bytes -= sum(entry_encoded_size(e) for e in old)
        self._cache[key] = batch
        self._cache_bytes += size
        while self._cache_bytes > self.options.cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cache_bytes -= sum(entry_encoded_size(e) for e in evicted)
        invariant(self._cache_bytes >= 0, "cache accounting")

    def snapshot(self) -> Snapshot:
        if self._snap_meta.index == 0:
            return Snapshot()
        if self._snap_data is not None:
            return Snapshot(self._snap_meta, self._snap_data)
        path = os.path.join(self._snapfiles.dir, snapshot_name(self._snap_meta.index, self._snap_meta.term))
        # Read when sliced (snapfile.FileSnapshotData): a leader sends an image a chunk at a
        # time, and a whole read of up to 1 GiB would stop the loop. snapfile.snapshot_bytes()
        # reads it all.
        snap = open_snapshot_file(path)
        invariant(snap.metadata == self._snap_meta, "the snapshot file is the storage's snapshot")
        return snap

    # ------------------------------------------------ write side

    def save(self, hard_state: Optional[HardState], entries: Iterable[Entry] = ()) -> None:
        """Buffer entries (overwriting a conflicting suffix) then the hard state; see sync().

        Entries go first so that a torn write can never leave a hard state whose
        commit index points past the surviving entries.
        """
        self._check_open()
        entries = list(entries)
        if entries:
            try:
                _check_batch(entries)
            except ValueError as exc:
                raise StorageStateError(f"invalid entries: {exc}") from None
            if entries[-1].index > self._off:
                live = entries[max(0, self._off + 1 - entries[0].index):]
                if live[0].index <= self._snap_meta.index:
                    # Snapshotted entries are applied, hence committed: Raft never rewrites them.
                    raise StorageStateError("entries covered by the snapshot are immutable",
                                            first=live[0].index, snapshot_index=self._snap_meta.index)
                if live[0].index > self.last_index() + 1:
                    raise StorageStateError("appended entries leave a gap", first=live[0].index,
                                            last_index=self.last_index())
                chunks = _split_for_records(live)
                positions = self._wal.append(
                    (RecordType.ENTRIES, encode_entries_payload(c)) for c in chunks)
                for chunk, pos in zip(chunks, positions):
                    self._apply_entries(list(chunk), pos, replaying=False)
                    self._cache_put((pos.seq, pos.offset), tuple(chunk))
        if hard_state is not None and hard_state != self._hs_logged:
            if (hard_state.term, hard_state.vote) != (self._hs_logged.term, self._hs_logged.vote):
                self._vote_unsynced = True
            self._wal.append([(RecordType.HARD_STATE, encode_hard_state(hard_state))])
            self._hs_logged = hard_state
        if hard_state is not None:
            self._hs = hard_state

    def append(self, entries: Iterable[Entry]) -> None:
        """MemoryStorage-compatible spelling of save(None, entries)."""
        self.save(None, entries)

    def set_hard_state(self, hs: HardState) -> None:
        """MemoryStorage-compatible spelling of save(hs, ())."""
        self.save(hs, ())

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Install a snapshot from the leader: the log is replaced by it.

        The snapshot file is durable when this returns; the WAL marker is
        buffered like any other write (a crash before sync() is completed at open).
        """
        self._check_open()
        if snap.metadata.index <= self._snap_meta.index:
            raise SnapshotOutOfDate(snap.metadata.index, self._snap_meta.index)
        self._snapfiles.save(snap)
        self._set_snapshot(snap)
        self._apply_reset(snap.metadata.index, snap.metadata.term)
        self._log_marks(reset=True)
        self._release_to = snap.metadata.index

    def create_snapshot(self, index: int, conf_state: Optional[ConfState], data: bytes,
                        keep_entries: int = 0) -> Snapshot:
        """Write a snapshot of the state machine at `index`, compact the log to
        `index - keep_entries` (entries kept for slow followers), sync, and
        release WAL segments the snapshot covers."""
        plan = self.plan_snapshot(index, conf_state)
        snap = Snapshot(plan.meta, bytes(data))
        self.adopt_snapshot(plan, plan.write(snap.data), len(snap.data), keep_entries, snap)
        return snap

    def plan_snapshot(self, index: int, conf_state: Optional[ConfState]) -> "SnapshotPlan":
        """The first step of a snapshot at `index` (create_snapshot, or the driver's snapshot
        made by a forked child, runtime/snapshot_child.py): its metadata, checked against the
        log now, and how to write its file. Call it while no storage job runs."""
        self._check_open()
        if index <= self._snap_meta.index:
            raise SnapshotOutOfDate(index, self._snap_meta.index)
        if index > self.last_index():
            raise Unavailable(index, self.last_index())
        term = self.term(index)  # Compacted if below the compaction point
        conf = conf_state if conf_state is not None else self._snap_meta.conf_state
        return SnapshotPlan(SnapshotMetadata(index=index, term=term, conf_state=conf), self._snapfiles)

    def adopt_snapshot(self, plan: "SnapshotPlan", tmp: str, data_len: int, keep_entries: int = 0,
                       snap: Optional[Snapshot] = None) -> None:
        """The last step: the plan's file, written and fsynced to `tmp` (plan.write), becomes the
        snapshot (rename, directory fsync, WAL marker), the log is compacted to
        `index - keep_entries`, and everything is synced. `snap`: its data, if in memory (else
        the data is read back when small enough to cache). SnapshotOutOfDate (the .tmp deleted)
        if a newer snapshot got in since the plan (one installed from the leader)."""
        self._check_open()
        if keep_entries < 0:
            raise ValueError(f"keep_entries {keep_entries} < 0")
        index = plan.meta.index
        if index <= self._snap_meta.index:
            os.unlink(tmp)
            raise SnapshotOutOfDate(index, self._snap_meta.index)
        path = self._snapfiles.publish(tmp)
        if snap is None:
            snap = read_snapshot_file(path) if data_len <= self.options.snapshot_cache_bytes \
                else Snapshot(plan.meta, b"")
        invariant(snap.metadata == plan.meta, "the adopted snapshot file is the planned one")
        self._snap_meta = plan.meta
        self._snap_data = bytes(snap.data) if snap.data and len(snap.data) <= self.options.snapshot_cache_bytes \
            else None
        self._log_marks(reset=False)
        if index - keep_entries > self._off:
            self.compact(index - keep_entries)
        self.sync()

    def compact(self, index: int) -> None:
        """Drop entries <= index (kept as the dummy). Only what a snapshot covers may go."""
        self._check_open()
        if index <= self._off:
            raise Compacted(index, self._off + 1)
        if index > self.last_index():
            raise Unavailable(index, self.last_index())
        if index > self._snap_meta.index:
            raise StorageStateError("compaction beyond the snapshot would lose entries",
                                    index=index, snapshot_index=self._snap_meta.index)
        term = self.term(index)
        self._wal.append([(RecordType.COMPACT, _MARK.pack(index, term))])
        self._apply_compact(index, term, replaying=False)
        self._release_to = index

    def sync(self, now_ms: Optional[int] = None) -> bool:
        """Write buffered records; fsync per policy. True: everything so far is on stable storage.

        `now_ms` (a monotonic clock) lets fsync=batch defer the fsync until
        batch_interval_ms passed since the last one or batch_bytes are unsynced
        (then fsync_deferred is True); without it every policy but never fsyncs now.

        WAL segments are released only once the marker that compacted them is
        on stable storage (or at once under fsync=never, which promises nothing).
        """
        self._check_open()
        # A vote (or term) change is fsynced at once, even under fsync=batch: it must be on
        # stable storage before the message granting or claiming it leaves, or a power cut that
        # forgot a granted vote could let one term elect two leaders. Votes are rare, so batch
        # mode loses nothing measurable. (fsync=never still never syncs: it promises nothing.)
        synced = self._wal.sync(now_ms, force=self._vote_unsynced)
        if synced or self.options.wal.fsync is FsyncPolicy.NEVER:
            self._vote_unsynced = False
        self._fsync_deferred = not synced and self.options.wal.fsync is FsyncPolicy.BATCH
        if self._release_to is not None and (synced or self.options.wal.fsync is FsyncPolicy.NEVER):
            self._wal.release_to(self._release_to)
            self._release_to = None
        return synced

    @property
    def fsync_deferred(self) -> bool:
        """fsync=batch only: written records wait for an fsync. The owner must call
        sync(now_ms) again once batch_interval_ms has passed, even if nothing new comes."""
        return self._fsync_deferred

    @property
    def batch_interval_ms(self) -> int:
        return self.options.wal.batch_interval_ms

    @property
    def durable(self) -> bool:
        """True only under fsync=always: a True sync() then survives power loss."""
        return self._wal is not None and self._wal.durable

    def wal_segment_paths(self) -> list[str]:
        return self._wal.segment_paths()

    def _check_open(self) -> None:
        if self.closed:
            raise StorageStateError("storage is closed")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._cache.clear()
        if self._wal is not None:
            self._wal.close()
