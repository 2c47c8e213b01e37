"""Write-ahead log: CRC-framed batches of records in segment files written ahead into zeros, group commit.

The WAL stores opaque payloads tagged with a record type; what a payload means
(entries, hard state, markers) is disk_storage.py's business. This module owns
framing, verification, group commit, fsync policy, rotation, torn-tail repair
and segment release.

Directory
    <dir>/wal-<seq:016x>-<first_index:016x>.log   segments, seq = 1, 2, 3, ... with no holes
    <dir>/wal.lock                                 flock'ed while a Wal is open
    <dir>/*.tmp                                    half-created segments; deleted at open

Segment file (format version 2)
    +-------------------+-------+-------+-----+-------+---------------------------+
    | header (32 bytes) | batch | batch | ... | batch | zero-filled (0 or more)   |
    +-------------------+-------+-------+-----+-------+---------------------------+
    0                                                 ^ size (logical)            ^ file length
    A batch is what one sync() writes in one pwritev: a batch header and the
    records appended since the previous sync(). Batches end at the segment's
    logical size; from there to the file's length the bytes are zeros written
    ahead (see "Zero-ahead"). Sealed segments are truncated to their logical
    size at rotation, so normally only the active one has a zero tail.

Segment header (32 bytes, big-endian)
    +----------+---------+-------+---------+-------------+------------+
    | magic    | version | flags | seq     | first_index | header_crc |
    | 8 bytes  |  u16    |  u16  |  u64    |    u64      |    u32     |
    +----------+---------+-------+---------+-------------+------------+
    magic = b"XRFTWAL\\0"; version = 2; flags = 0;
    seq, first_index equal the ones in the file name;
    header_crc = crc32c of the 28 bytes before it.

Batch (40-byte header + records, big-endian)
          | gap | batch header                                                    | records...
    +-----+-----+-------+--------+-------+------------+-----+------------+-------------+------------+---------+
    | ... | 0s  | magic | length | count | zero_parts | at  | synced_end | records_crc | header_crc | rec rec |
    |     |     | "XRBT"|  u32   |  u32  |    u32     | u64 |    u64     |     u32     |    u32     |   ...   |
    +-----+-----+-------+--------+-------+------------+-----+------------+-------------+------------+---------+
          ^ end of the previous batch           (a "sector" below is 512 bytes at a file offset k*512)
    gap: zeros, only when the header would otherwise straddle a sector boundary (it then
         starts at the boundary), so a header lies inside one sector;
    length, count: bytes and number of the records that follow (count >= 1);
    zero_parts: how many sector-aligned parts of [at, end of batch) after the header's
         own sector are all zeros as written (records can hold zeros);
    at: this header's own offset in the segment;
    synced_end: the segment was fdatasync'ed up to this offset (a batch end) when this
         batch was written; <= at;
    records_crc = crc32c of the records; header_crc = crc32c of the 36 bytes before it.
    The first batch of a segment holds the prologue records (see "Group commit").

Record (9-byte header + payload, big-endian)
    +------------+------------+--------+---------------------+
    | length     | crc32c     | type   | payload             |
    |   u32      |   u32      |  u8    | `length` bytes      |
    +------------+------------+--------+---------------------+
    length <= MAX_RECORD_PAYLOAD_BYTES; type in RecordType (0 is never valid);
    crc32c covers type + payload. A record is read back alone (a cache miss
    preads it at its RecordPos) and verified by its own CRC.

Why the CRCs are per record and per batch and not chained (etcd chains its
CRC and carries it into each new segment): independent CRCs let recovery tell
*where* damage is and whether what follows proves it was synced; deleting old
segments needs no carried-over state; and a single record is verified with a
single pread. What a chain would add, detecting dropped or reordered whole
batches, is covered by `at`, by consecutive segment sequence numbers and by
DiskStorage checking that entry indexes connect.

What an fsync guarantees, and what it does not. Once fdatasync returns,
every byte written before it is on stable storage. Until it returns, any
subset of the written sectors may have reached the disk, in any order: a
power cut can leave a later sector of the write on disk while an earlier one
still holds what it held before. Before, for the bytes of a batch, means
zeros: the batch is written over zeros written ahead, or past the file's end
(an extension whose blocks never landed reads as zeros, or is not there). The
model assumes a sector lands whole or not at all (a half-written sector
reads back as an I/O error, which refuses to open like any damage).

Recovery. Replay verifies every batch of every segment: header CRC, `at`,
records_crc, then each record and the count. Where a batch fails, at `off`
(the end of the last good batch):
  * every byte from `off` to EOF is zero -> the clean end of the segment, in
    any segment; no warning, no repair (a magic is never zero, so zeros never
    parse). The last segment keeps its zeros (writing continues at `off`); a
    non-last one can have a zero tail only after a crash between a zero-ahead
    write and the truncation at rotation, and is left as it is. Batches that
    zeros replaced cannot go unnoticed: DiskStorage checks that entry indexes
    connect across segments.
  * in any segment but the last -> WalCorruption: a segment is sealed only
    after an fdatasync of all of it.
  * in the last segment, if a later batch header verifies (CRC and `at`) and
    its synced_end > off -> WalCorruption: that header was written after an
    fdatasync covering `off` returned, so the failing batch was complete, and
    its records may have been acknowledged.
  * otherwise the failing batch is the last synced one or was written since
    the last completed fdatasync, and nothing later proves which. It is a torn
    tail if the damage is what an interrupted write leaves: its header is
    zeros, or it runs past EOF, or it has more all-zero sector parts than the
    writer counted (zero_parts). Then the segment is truncated to `off`, with
    every batch after it (those, too, were written after the last completed
    fdatasync: their synced_end says so), and the WAL continues.
  * else every sector of the batch landed, as written, yet it fails: the
    write completed, fdatasync may have returned and the records may have been
    acknowledged, so this is a bit flip or bad media -> WalCorruption.
Why this is safe. A torn batch was never acknowledged: sync() returns, and
the owner reports anything durable, only after fdatasync returned, and after
that no sector of the batch can be missing. So truncating a torn batch loses
nothing anyone was told about. A batch that fully landed and has a flipped
bit may have been acknowledged (a vote, or entries a leader counted toward a
quorum), so it is refused, never silently dropped; the operator restores the
node (e.g. a fresh data directory that catches up from peers). The limits:
  * The last synced batch with nothing after it is protected only by its own
    checksums and zero_parts: a flip that turns a non-zero sector part into
    all zeros (a part that held one set bit) reads as torn and is truncated.
    For the last part of a batch that can be a few bytes; rare squared.
  * Damage that zeroes whole sectors of the last batch after fdatasync (a
    disk that loses an acknowledged write) reads as torn: no format can tell
    that from a torn write without a later write to prove it.
  * A crafted payload that holds a valid-looking batch header at its own
    offset could make recovery refuse a torn tail (never accept damage).
  * Under fsync=batch the unsynced region spans several batches; each names
    the same synced_end, so damage anywhere in it is a torn tail. Under
    fsync=never nothing is ever synced (synced_end stays at the segment
    header), so damage anywhere in the last segment is a torn tail.
  * A disk that can tear inside a 512-byte sector breaks the sector model
    only towards refusing: a part with some new bytes is not all zeros, so
    such a torn last batch reads as "fully landed" and is refused (as
    version 1 refused), never a damaged batch accepted as torn.
  * Reopening fdatasyncs the active segment before the next batch claims
    its bytes as synced: after a crash of the process alone, replay may have
    read bytes that were only in the page cache.

Older formats. Version 1 segments (records back to back, no batch headers,
written by xraft before this format) are still read, with version 1's rule:
damage in the last segment is a torn tail unless a fully verifying record
follows it (then WalCorruption). It cannot tell a torn write whose later
sector landed from damage, so open never writes into a version-1 segment: if
the last segment is version 1 it is sealed (zero tail truncated, synced) and
a version-2 segment is started, as at any rotation. A version newer than this
build's raises WalVersionUnsupported.

Group commit: append() only buffers (and returns each record's future
position); sync() writes the whole buffer as one batch with one os.pwritev
at the active segment's logical size and, per the fsync policy, one
fdatasync. Rotation happens only at the end of a sync(), when the active
segment's logical size has reached segment_bytes; the sealed segment is
truncated to its logical size (and fdatasynced unless fsync=never), then the
new segment is created complete (header + a batch of prologue records
supplied by the owner) under a .tmp name, fsynced, renamed and the directory
fsynced, so a segment file never exists half-made.

Zero-ahead. An fdatasync after an append must also commit the file's new size,
a metadata change that goes through the filesystem journal (ext4: one journal
per filesystem, shared by the three node processes of a local cluster, and a
follower's fsync is on the path of every acknowledged write). Overwriting bytes
the file already has needs no metadata, so fdatasync only flushes data blocks.
Measured with 3 processes each writing 300 bytes + fdatasync in a loop:
appending 0.215 ms p50 per fdatasync, overwriting written zeros 0.125 ms p50.
So the active segment is written with pwritev at its logical end (no O_APPEND),
and a sync() whose write would pass the file's length carries, in the same
single write, zeros up to the next multiple of zero_ahead_bytes (never past
segment_bytes, where the segment rotates anyway): the size changes once per
chunk, not once per sync. The zeros are really written: fallocate'd extents
are "unwritten", and converting them on first overwrite is a metadata change
again.
"""
from __future__ import annotations

import enum
import errno
import fcntl
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple, Optional

import crc32c

from ..invariant import invariant
from . import unsynced_loss
from .wal_format import (  # noqa: F401  (re-exported: the WAL's public names live here)
    BATCH_HEADER_BYTES,
    MAX_INDEX,
    MAX_PENDING_BYTES,
    MAX_RECORD_PAYLOAD_BYTES,
    MIB,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    SECTOR_BYTES,
    SEGMENT_HEADER,
    SEGMENT_HEADER_BYTES,
    SEGMENT_MAGIC,
    WAL_VERSION,
    READABLE_VERSIONS,
    RecordType,
    WalCorruption,
    WalError,
    WalRecordTooLarge,
    WalVersionUnsupported,
    batch_header_at,
    check_record_at,
    encode_batch,
    encode_record,
    encode_segment_header,
    scan_segment,
    scan_segment_v1,
)

log = logging.getLogger("xraft.wal")

DEFAULT_SEGMENT_BYTES = 64 * MIB
MIN_SEGMENT_BYTES = 4096  # small segments are allowed so tests can rotate often
MAX_SEGMENT_BYTES = 512 * MIB
# Nothing this WAL writes can be larger; a bigger file is not ours.
MAX_SEGMENT_FILE_BYTES = (MAX_SEGMENT_BYTES + MAX_PENDING_BYTES + SEGMENT_HEADER_BYTES
                          + SECTOR_BYTES + BATCH_HEADER_BYTES)
MAX_SEGMENTS = 1_000_000
# Zero-ahead chunk: the active segment's file grows this much at a time (see the
# module docstring), so its size, a journal commit, changes once per chunk.
ZERO_AHEAD_BYTES = 1 * MIB
# Bounds the zeros one sync() may write on top of its records.
MAX_ZERO_AHEAD_BYTES = 64 * MIB

_SEGMENT_NAME = re.compile(r"^wal-([0-9a-f]{16})-([0-9a-f]{16})\.log$")
LOCK_NAME = "wal.lock"


class FsyncPolicy(enum.Enum):
    ALWAYS = "always"  # every sync() that wrote something fdatasyncs. The only durable policy.
    BATCH = "batch"  # fdatasync when batch_interval_ms passed or batch_bytes accumulated
    NEVER = "never"  # never fdatasync; for benchmarks and tests only


# ---------------------------------------------------------------- errors


class WalBufferFull(WalError):
    """append() would buffer more than MAX_PENDING_BYTES: call sync() first."""

    def __init__(self, pending: int, adding: int, limit: int):
        super().__init__(f"WAL buffer full: {pending} pending + {adding} > {limit} bytes")
        self.pending = pending
        self.adding = adding
        self.limit = limit


class WalLocked(WalError):
    """Another open Wal (this process or another) holds the directory."""


class WalClosed(WalError):
    pass


# ---------------------------------------------------------------- values


class RecordPos(NamedTuple):
    """Where a record lives: segment sequence number and byte offset of its header."""

    seq: int
    offset: int


class WalRecord(NamedTuple):
    type: RecordType
    payload: bytes
    seq: int  # segment sequence number
    offset: int  # byte offset of the record header in that segment


@dataclass(frozen=True)
class WalOptions:
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    segment_bytes: int = DEFAULT_SEGMENT_BYTES  # rotate once the active segment reaches this
    batch_interval_ms: int = 10  # BATCH: fdatasync at least this often (by the caller's clock)
    batch_bytes: int = 1 * MIB  # BATCH: ... or once this many bytes are unsynced
    # The active segment's file is extended with zeros to a multiple of this (0: no zero-ahead,
    # every sync extends the file). Only speed depends on it; any value reads any WAL.
    zero_ahead_bytes: int = ZERO_AHEAD_BYTES
    # Called with the seconds each commit fdatasync took (server/metrics.py's histogram),
    # from whatever thread syncs (the executor). None: nothing is timed.
    fsync_observer: Optional[Callable[[float], None]] = field(default=None, compare=False)

    def validate(self) -> None:
        if not isinstance(self.fsync, FsyncPolicy):
            raise ValueError(f"fsync policy {self.fsync!r} is not an FsyncPolicy")
        if not MIN_SEGMENT_BYTES <= self.segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes {self.segment_bytes} not in "
                             f"[{MIN_SEGMENT_BYTES}, {MAX_SEGMENT_BYTES}]")
        if self.batch_interval_ms < 0 or self.batch_bytes < 0:
            raise ValueError("batch_interval_ms and batch_bytes must be >= 0")
        if not 0 <= self.zero_ahead_bytes <= MAX_ZERO_AHEAD_BYTES:
            raise ValueError(f"zero_ahead_bytes {self.zero_ahead_bytes} not in [0, {MAX_ZERO_AHEAD_BYTES}]")


@dataclass
class _Segment:
    seq: int  # Invariant: consecutive across the directory's segments
    first_index: int  # log index expected next when the segment was created (release hint)
    path: str
    # Logical size: end of the last verified or written record; for the active
    # segment, where the next write goes. The file may be longer (zeros), never shorter.
    size: int
    version: int = WAL_VERSION  # of the segment's format; only WAL_VERSION is written to


@dataclass(frozen=True)
class TornTailRepair:
    path: str
    offset: int  # the segment was truncated to this length
    dropped_bytes: int
    reason: str


# Called when a new segment is created: returns (first_index, prologue records).
# The prologue is written at the head of the segment so each segment carries the
# state (hard state, log start) that releasing older segments would otherwise lose.
SegmentStart = Callable[[], tuple[int, list[tuple[int, bytes]]]]


def segment_name(seq: int, first_index: int) -> str:
    return f"wal-{seq:016x}-{first_index:016x}.log"


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creates, renames, unlinks) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir_durable(path: str, durable: bool = True) -> None:
    """mkdir -p `path`; if it had to be created, fsync its parent so the entry survives a crash."""
    if os.path.isdir(path):
        return
    os.makedirs(path, exist_ok=True)
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fdatasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def _pwrite_all(fd: int, parts: list[bytes], offset: int) -> None:
    """Write `parts` back to back at `offset`: one pwritev, more only after a short write."""
    views = [memoryview(p) for p in parts if p]
    while views:
        n = os.pwritev(fd, views, offset)
        offset += n
        while n:
            if n >= len(views[0]):
                n -= len(views.pop(0))
            else:
                views[0] = views[0][n:]
                n = 0


class Wal:
    """An open write-ahead log. Not thread-safe: one owner drives it."""

    def __init__(self, dirpath: str, options: WalOptions, segment_start: SegmentStart):
        # Use Wal.open(); this only sets fields.
        self.dir = dirpath
        self.options = options
        self._segment_start = segment_start
        self._segments: list[_Segment] = []  # Invariant: sorted by seq, consecutive; last is active
        self._fd = -1  # write fd of the active segment; written with pwritev at its logical size
        # Invariant: the active segment file's length: >= its logical size, and every byte
        # between the two is zero. Writes below it overwrite zeros (no size change).
        self._zeroed_end = 0
        self._lock_fd = -1
        self._read_fds: dict[int, int] = {}  # seq -> read-only fd, opened on demand
        self._pending: list[bytes] = []  # framed records not yet written
        self._pending_bytes = 0  # Invariant: == sum(len(p) for p in _pending) <= MAX_PENDING_BYTES
        # Where the next batch's header goes (batch_header_at(active size)); valid while _pending.
        self._batch_at = 0
        # Invariant: the active segment was fdatasync'ed up to here (<= its logical size);
        # every batch header carries it, the proof recovery needs (see "Recovery").
        self._synced_end = SEGMENT_HEADER_BYTES
        self._pending_at: dict[int, tuple[int, bytes]] = {}  # offset -> (type, payload), active seg
        self._unsynced_bytes = 0  # written but not fdatasync'ed
        self._last_fsync_ms: Optional[int] = None
        self.repaired: Optional[TornTailRepair] = None  # set when open() truncated a torn tail
        self.closed = False
        self._loss: Optional[unsynced_loss.UnsyncedLoss] = None  # TEST-ONLY fault (unsynced_loss.py)

    # ------------------------------------------------ open / replay

    @classmethod
    def open(cls, dirpath: str, options: WalOptions = WalOptions(),
             visit: Optional[Callable[[WalRecord], None]] = None,
             segment_start: Optional[SegmentStart] = None) -> "Wal":
        """Open (creating if needed) the WAL in `dirpath`, verifying every record.

        Each valid record is passed to `visit` in log order, one segment at a
        time after that segment verified. If a later segment turns out corrupt,
        open raises WalCorruption and the caller must discard what it built.
        """
        options.validate()
        make_dir_durable(dirpath, options.fsync is not FsyncPolicy.NEVER)
        wal = cls(dirpath, options, segment_start or (lambda: (0, [])))
        wal._lock()
        try:
            wal._loss = unsynced_loss.from_env()
            if wal._loss is not None:
                wal._loss.recover(dirpath)       # a "power cut" loses what was never fsynced
            wal._recover(visit)
        except BaseException:
            wal._release_fds()
            raise
        if options.fsync is FsyncPolicy.NEVER:
            log.warning("WAL %s opened with fsync=never: NOT durable, a crash can lose "
                        "acknowledged writes; for benchmarks and tests only", dirpath)
        elif options.fsync is FsyncPolicy.BATCH:
            log.warning("WAL %s opened with fsync=batch: writes of the last %d ms / %d bytes "
                        "can be lost on power failure; not durable", dirpath,
                        options.batch_interval_ms, options.batch_bytes)
        return wal

    def _lock(self) -> None:
        fd = os.open(os.path.join(self.dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise WalLocked("WAL directory is in use by another Wal", self.dir) from None
            raise
        self._lock_fd = fd

    def _list_segments(self) -> list[_Segment]:
        segs = []
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name.endswith(".tmp"):
                # A segment whose creation never finished its rename: it was never part of the log.
                os.unlink(path)
                continue
            m = _SEGMENT_NAME.match(name)
            if m:
                segs.append(_Segment(int(m.group(1), 16), int(m.group(2), 16), path, 0))
        if len(segs) > MAX_SEGMENTS:
            raise WalCorruption(f"{len(segs)} segments over the limit {MAX_SEGMENTS}", self.dir, -1)
        segs.sort(key=lambda s: s.seq)
        for a, b in zip(segs, segs[1:]):
            if b.seq != a.seq + 1:
                raise WalCorruption(f"segment sequence jumps from {a.seq} to {b.seq}", b.path, 0)
        for s in segs:
            if s.seq == 0 or s.seq > MAX_INDEX or s.first_index > MAX_INDEX:
                raise WalCorruption("segment name out of range", s.path, 0)
        return segs

    def _recover(self, visit: Optional[Callable[[WalRecord], None]]) -> None:
        segs = self._list_segments()
        # A last segment without a complete header can only come from a crash in the
        # middle of creating it under fsync=never (creation is atomic otherwise); it
        # never held records.
        if segs:
            last = segs[-1]
            size = os.path.getsize(last.path)
            with open(last.path, "rb") as f:
                head = f.read(SEGMENT_HEADER_BYTES)
            if size < SEGMENT_HEADER_BYTES or head == bytes(len(head)):
                log.warning("WAL: removing segment %s with a torn header (%d bytes)", last.path, size)
                os.unlink(last.path)
                fsync_dir(self.dir)
                segs.pop()
        for k, seg in enumerate(segs):
            is_last = k == len(segs) - 1
            records = self._verify_segment(seg, is_last)
            if visit is not None:
                for rec in records:
                    visit(rec)
        self._segments = segs
        if not segs:
            self._create_segment(1)
        else:
            self._fd = os.open(segs[-1].path, os.O_WRONLY)
            # The zeros after the last record stay: the next writes overwrite them.
            self._zeroed_end = os.fstat(self._fd).st_size
            invariant(self._zeroed_end >= segs[-1].size, "active segment file covers its records")
            # What replay read may be only in the page cache (a crash of the process, not
            # of the machine): sync it before the next batch header claims it is synced.
            if self.options.fsync is not FsyncPolicy.NEVER:
                self._datasync(self._fd)
                self._synced_end = segs[-1].size
            if segs[-1].version != WAL_VERSION:
                # Written by an older xraft: seal it, and write on in the current format.
                log.warning("WAL: %s is in format version %d; continuing in a new version %d "
                            "segment", segs[-1].path, segs[-1].version, WAL_VERSION)
                self._rotate()

    def _verify_segment(self, seg: _Segment, is_last: bool) -> list[WalRecord]:
        size = os.path.getsize(seg.path)
        if size > MAX_SEGMENT_FILE_BYTES:
            raise WalCorruption(f"segment of {size} bytes over the limit {MAX_SEGMENT_FILE_BYTES}",
                                seg.path, 0)
        with open(seg.path, "rb") as f:
            buf = f.read(size + 1)
        if len(buf) != size:
            raise WalCorruption(f"segment changed size while read ({len(buf)} != {size})", seg.path, 0)
        if size < SEGMENT_HEADER_BYTES:
            raise WalCorruption(f"segment of {size} bytes has no complete header", seg.path, 0)
        magic, version, flags, seq, first, crc = SEGMENT_HEADER.unpack_from(buf, 0)
        if magic != SEGMENT_MAGIC:
            raise WalCorruption(f"bad segment magic {magic!r}", seg.path, 0)
        if crc32c.crc32c(buf[:SEGMENT_HEADER_BYTES - 4]) != crc:
            raise WalCorruption("segment header CRC mismatch", seg.path, 0)
        if version not in READABLE_VERSIONS:
            raise WalVersionUnsupported(version, seg.path)
        if flags != 0:
            raise WalCorruption(f"unknown segment flags {flags:#x}", seg.path, 10)
        if seq != seg.seq or first != seg.first_index:
            raise WalCorruption(f"header says seq {seq} first {first}, name says {seg.seq} "
                                f"{seg.first_index}", seg.path, 12)
        seg.version = version
        scan = (scan_segment if version == WAL_VERSION else scan_segment_v1)(buf, seg.path, is_last)
        if scan.torn_at >= 0:
            self._truncate_torn_tail(seg, scan.torn_at, size, scan.torn_why)
        seg.size = scan.end
        return [WalRecord(RecordType(r.type), r.payload, seg.seq, r.offset) for r in scan.records]

    def _truncate_torn_tail(self, seg: _Segment, off: int, size: int, why: str) -> None:
        log.warning("WAL: torn tail in %s at byte %d (%s): truncating %d bytes",
                    seg.path, off, why, size - off)
        fd = os.open(seg.path, os.O_WRONLY)
        try:
            if self._loss is not None:
                self._loss.before_truncate(fd, off)
            os.ftruncate(fd, off)
            if self.options.fsync is not FsyncPolicy.NEVER:
                self._datasync(fd)
        finally:
            os.close(fd)
        self.repaired = TornTailRepair(seg.path, off, size - off, why)

    # ------------------------------------------------ segments

    def _create_segment(self, seq: int) -> None:
        """Create segment `seq` complete with its prologue, atomically, and make it active."""
        first_index, prologue = self._segment_start()
        invariant(0 <= first_index <= MAX_INDEX, f"segment first index {first_index} in range")
        data = encode_segment_header(seq, first_index)
        if prologue:  # one batch; nothing before it was synced in this segment
            framed = [encode_record(t, p) for t, p in prologue]
            data += b"".join(encode_batch(len(data), len(data), framed))
        path = os.path.join(self.dir, segment_name(seq, first_index))
        tmp = path + ".tmp"
        durable = self.options.fsync is not FsyncPolicy.NEVER
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if self._loss is not None:
                self._loss.before_write(fd, 0, len(data))
            _pwrite_all(fd, [data], 0)      # a new, empty file
            if durable:
                self._datasync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        if self._loss is not None:
            self._loss.renamed(tmp, path)
        if durable:
            fsync_dir(self.dir)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(path, os.O_WRONLY)
        self._zeroed_end = len(data)  # no zeros yet: the first sync() writes them ahead
        self._synced_end = len(data) if durable else SEGMENT_HEADER_BYTES
        self._segments.append(_Segment(seq, first_index, path, len(data)))
        self._last_fsync_ms = None

    def _rotate(self) -> None:
        invariant(not self._pending and self._unsynced_bytes == 0 or
                  self.options.fsync is not FsyncPolicy.ALWAYS, "rotation only after a full sync")
        sealed = self._segments[-1]
        invariant(self._zeroed_end >= sealed.size, "active segment file covers its records")
        # Sealed segments keep no zero tail. If a crash leaves one anyway, replay reads
        # it as the clean end of the records, so the order against the new segment's
        # creation does not matter for correctness, only for tidiness.
        truncated = self._zeroed_end > sealed.size
        if truncated:
            if self._loss is not None:
                self._loss.before_truncate(self._fd, sealed.size)
            os.ftruncate(self._fd, sealed.size)
            self._zeroed_end = sealed.size
        if self.options.fsync is not FsyncPolicy.NEVER and (self._unsynced_bytes or truncated):
            self._datasync(self._fd)
            self._unsynced_bytes = 0
        self._create_segment(sealed.seq + 1)

    def _zero_ahead_end(self, end: int) -> int:
        """Where the file should end after a write of records ending at `end` past its length."""
        chunk = self.options.zero_ahead_bytes
        limit = self.options.segment_bytes
        if chunk == 0 or end >= limit:
            return end  # off, or this sync rotates: zeros would be truncated right away
        return min(-(-end // chunk) * chunk, limit)

    # ------------------------------------------------ write side

    def append(self, records: Iterable[tuple[int, bytes]]) -> list[RecordPos]:
        """Buffer records (type, payload); returns where each will be once synced."""
        self._check_open()
        records = [(int(t), bytes(p)) for t, p in records]
        framed = [encode_record(t, p) for t, p in records]
        adding = sum(len(f) for f in framed)
        if self._pending_bytes + adding > MAX_PENDING_BYTES:
            raise WalBufferFull(self._pending_bytes, adding, MAX_PENDING_BYTES)
        active = self._segments[-1]
        if not self._pending:
            self._batch_at = batch_header_at(active.size)
        pos = []
        off = self._batch_at + BATCH_HEADER_BYTES + self._pending_bytes
        for f, (t, p) in zip(framed, records):
            self._pending_at[off] = (t, p)
            pos.append(RecordPos(active.seq, off))
            off += len(f)
        self._pending.extend(framed)
        self._pending_bytes += adding
        return pos

    def sync(self, now_ms: Optional[int] = None, force: bool = False) -> bool:
        """Write everything buffered (one write) and fdatasync per policy (at most one).

        Returns True if everything appended so far is now on stable storage.
        `now_ms` is the caller's clock, used by FsyncPolicy.BATCH (None: fsync now);
        `force` fsyncs now under BATCH too, still starting the interval at now_ms.
        """
        self._check_open()
        if self._pending:
            active = self._segments[-1]
            at = self._batch_at
            end = at + BATCH_HEADER_BYTES + self._pending_bytes
            header, records = encode_batch(at, self._synced_end, self._pending)
            # The gap before a header that would straddle a sector is zeros (rewritten as
            # zeros: past the file's length, skipping it would leave a hole).
            parts = [bytes(at - active.size) + header, records]
            if end > self._zeroed_end:
                # Past the file's length: the size changes anyway, so change it once for a
                # whole chunk. Zeros ride in the same write (one write per sync).
                parts.append(bytes(self._zero_ahead_end(end) - end))
            if self._loss is not None:
                self._loss.before_write(self._fd, active.size, sum(map(len, parts)))
            _pwrite_all(self._fd, parts, active.size)
            self._zeroed_end = max(self._zeroed_end, active.size + sum(map(len, parts)))
            self._unsynced_bytes += end - active.size
            active.size = end
            self._pending.clear()
            self._pending_at.clear()
            self._pending_bytes = 0
        policy = self.options.fsync
        if self._unsynced_bytes and policy is not FsyncPolicy.NEVER:
            due = (policy is FsyncPolicy.ALWAYS or now_ms is None or force
                   or self._unsynced_bytes >= self.options.batch_bytes
                   or self._last_fsync_ms is None
                   or now_ms - self._last_fsync_ms >= self.options.batch_interval_ms)
            if due:
                observer = self.options.fsync_observer
                if observer is None:
                    self._datasync(self._fd)
                else:
                    t0 = time.perf_counter()
                    self._datasync(self._fd)
                    observer(time.perf_counter() - t0)
                self._unsynced_bytes = 0
                self._synced_end = self._segments[-1].size
                if now_ms is not None:
                    self._last_fsync_ms = now_ms
        if self._segments[-1].size >= self.options.segment_bytes:
            self._rotate()
        return policy is not FsyncPolicy.NEVER and self._unsynced_bytes == 0

    @property
    def durable(self) -> bool:
        """True only when a returned sync() means power-loss safe for every write."""
        return self.options.fsync is FsyncPolicy.ALWAYS

    def release_to(self, index: int) -> list[str]:
        """Delete old segments holding only entries <= index; returns deleted paths.

        Call only once a durable snapshot covers `index` and the marker that
        compacts the log to `index` is synced. Segment k is deletable when the
        next one's first_index - 1 <= index: every entry live when segment k+1
        was created had index <= that, and later entries go to later segments.
        The active segment is never deleted.
        """
        self._check_open()
        deleted = []
        while len(self._segments) > 1 and self._segments[1].first_index - 1 <= index:
            seg = self._segments.pop(0)
            fd = self._read_fds.pop(seg.seq, -1)
            if fd >= 0:
                os.close(fd)
            os.unlink(seg.path)
            if self._loss is not None:
                self._loss.removed(seg.path)
            deleted.append(seg.path)
        if deleted and self.options.fsync is not FsyncPolicy.NEVER:
            fsync_dir(self.dir)
        return deleted

    # ------------------------------------------------ read side

    def read_record(self, pos: RecordPos) -> tuple[RecordType, bytes]:
        """The record at `pos`, verified again (it may be read long after it was written)."""
        self._check_open()
        active = self._segments[-1]
        if pos.seq == active.seq and pos.offset in self._pending_at:
            t, p = self._pending_at[pos.offset]
            return RecordType(t), p
        seg = self._segment(pos.seq)
        if seg is None:
            raise WalError(f"no segment {pos.seq} (released?)", self.dir, pos.offset)
        if not SEGMENT_HEADER_BYTES <= pos.offset <= seg.size - RECORD_HEADER_BYTES:
            raise WalCorruption("record position outside the segment", seg.path, pos.offset)
        fd = self._read_fds.get(seg.seq)
        if fd is None:
            fd = self._read_fds[seg.seq] = os.open(seg.path, os.O_RDONLY)
        head = os.pread(fd, RECORD_HEADER_BYTES, pos.offset)
        length, _, _ = RECORD_HEADER.unpack(head)
        if length > MAX_RECORD_PAYLOAD_BYTES or pos.offset + RECORD_HEADER_BYTES + length > seg.size:
            raise WalCorruption(f"record length {length} invalid", seg.path, pos.offset)
        buf = head + os.pread(fd, length, pos.offset + RECORD_HEADER_BYTES)
        rtype, _, payload, why = check_record_at(buf, 0)
        if not rtype:
            raise WalCorruption(why, seg.path, pos.offset)
        return RecordType(rtype), payload

    def _segment(self, seq: int) -> Optional[_Segment]:
        k = seq - self._segments[0].seq
        if 0 <= k < len(self._segments):
            invariant(self._segments[k].seq == seq, "segments consecutive")
            return self._segments[k]
        return None

    def segment_paths(self) -> list[str]:
        return [s.path for s in self._segments]

    def active_segment_size(self) -> int:
        return self._segments[-1].size

    # ------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self.closed:
            raise WalClosed("WAL is closed", self.dir)

    def close(self) -> None:
        """Sync what is buffered, then release files and the directory lock."""
        if self.closed:
            return
        try:
            self.sync()
            if self._unsynced_bytes and self.options.fsync is not FsyncPolicy.NEVER:
                self._datasync(self._fd)
                self._unsynced_bytes = 0
                self._synced_end = self._segments[-1].size
        finally:
            self.closed = True
            self._release_fds()

    def _datasync(self, fd: int) -> None:
        _fdatasync(fd)
        if self._loss is not None:
            self._loss.synced(fd)

    def _release_fds(self) -> None:
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the fd drops the flock
            self._lock_fd = -1
