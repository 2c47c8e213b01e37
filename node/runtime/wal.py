"""Write-ahead log: CRC-framed records in segment files written ahead into zeros, group commit.

The WAL stores opaque payloads tagged with a record type; what a payload means
(entries, hard state, markers) is disk_storage.py's business. This module owns
framing, verification, group commit, fsync policy, rotation, torn-tail repair
and segment release.

Directory
    <dir>/wal-<seq:016x>-<first_index:016x>.log   segments, seq = 1, 2, 3, ... with no holes
    <dir>/wal.lock                                 flock'ed while a Wal is open
    <dir>/*.tmp                                    half-created segments; deleted at open

Segment file
    +-------------------+--------+--------+-----+---------------------------+
    | header (32 bytes) | record | record | ... | zero-filled (0 or more)   |
    +-------------------+--------+--------+-----+---------------------------+
    0                                           ^ size (logical)            ^ file length
    Records end at the segment's logical size; from there to the file's length
    the bytes are zeros written ahead (see "Zero-ahead"). Sealed segments are
    truncated to their logical size at rotation, so normally only the active
    one has a zero tail.

Segment header (32 bytes, big-endian)
    +----------+---------+-------+---------+-------------+------------+
    | magic    | version | flags | seq     | first_index | header_crc |
    | 8 bytes  |  u16    |  u16  |  u64    |    u64      |    u32     |
    +----------+---------+-------+---------+-------------+------------+
    magic = b"XRFTWAL\\0"; version = 1; flags = 0;
    seq, first_index equal the ones in the file name;
    header_crc = crc32c of the 28 bytes before it.

Record (9-byte header + payload, big-endian)
    +------------+------------+--------+---------------------+
    | length     | crc32c     | type   | payload             |
    |   u32      |   u32      |  u8    | `length` bytes      |
    +------------+------------+--------+---------------------+
    length <= MAX_RECORD_PAYLOAD_BYTES; type in RecordType (0 is never valid,
    so zero-filled space never parses); crc32c covers type + payload.

Why the CRC is per record and not chained across records (etcd chains its CRC
and carries it into each new segment with a CRC record): an independent CRC
lets recovery tell *where* damage is and whether anything valid follows it,
which is how a torn tail is told apart from mid-log corruption (see below);
deleting old segments needs no carried-over state; and the reader of a single
record (DiskStorage's cache misses) can verify it with a single pread. What a
chain would add, detecting dropped or reordered whole records, is covered one
level up: segment sequence numbers must be consecutive and DiskStorage checks
that entry indexes connect.

Torn tail vs corruption. Replay verifies every record of every segment. A
record that fails (short header, length over the limit or past EOF, unknown
type, CRC mismatch) at offset `off`:
  * if every byte from `off` to EOF is zero -> the clean end of the segment's
    records, in any segment; no warning, no repair. Type 0 never parses, so
    zeros are never taken for a record (and a torn write of which only zero
    bytes landed is zeros like any other). The last segment keeps its zeros
    (writing continues at `off`); a non-last one can have a zero tail only
    after a crash between a zero-ahead write and the truncation at rotation,
    and is left as it is. Records that zeros replaced cannot go unnoticed:
    DiskStorage checks that entry indexes connect across segments.
  * else in any segment but the last -> WalCorruption(file, off); refuse to open.
  * else in the last segment, if some byte offset after `off` starts a record
    that fully verifies -> WalCorruption: bytes after the damage reached the
    disk, so this is not an interrupted write (a flipped bit, or a torn write
    whose later sectors landed; both are refused rather than guessed at).
  * otherwise it is a torn tail: the segment is truncated to `off` and the WAL
    continues. Only the last sync's write can be torn, and its records were
    never reported durable, so nobody was told about them. (A torn write into
    zero-filled space leaves zeros after its landed part; those are dropped
    with it and the next sync writes zeros ahead again.)

Group commit: append() only buffers (and returns each record's future
position); sync() writes the whole buffer with one os.pwrite at the active
segment's logical size and, per the fsync policy, one fdatasync. Rotation
happens only at the end of a sync(), when the active segment's logical size
has reached segment_bytes; the sealed segment is truncated to its logical size
(and fdatasynced unless fsync=never), then the new segment is created complete
(header + prologue records supplied by the owner) under a .tmp name, fsynced,
renamed and the directory fsynced, so a segment file never exists half-made.

Zero-ahead. An fdatasync after an append must also commit the file's new size,
a metadata change that goes through the filesystem journal (ext4: one journal
per filesystem, shared by the three node processes of a local cluster, and a
follower's fsync is on the path of every acknowledged write). Overwriting bytes
the file already has needs no metadata, so fdatasync only flushes data blocks.
Measured with 3 processes each writing 300 bytes + fdatasync in a loop:
appending 0.215 ms p50 per fdatasync, overwriting written zeros 0.125 ms p50.
So the active segment is written with pwrite at its logical end (no O_APPEND),
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
import struct
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Optional

import crc32c

from ..invariant import invariant

log = logging.getLogger("xraft.wal")

SEGMENT_MAGIC = b"XRFTWAL\x00"
WAL_VERSION = 1
SEGMENT_HEADER = struct.Struct(">8sHHQQI")  # magic, version, flags, seq, first_index, crc
SEGMENT_HEADER_BYTES = SEGMENT_HEADER.size  # 32
RECORD_HEADER = struct.Struct(">IIB")  # length, crc32c, type
RECORD_HEADER_BYTES = RECORD_HEADER.size  # 9

MIB = 1 << 20
DEFAULT_SEGMENT_BYTES = 64 * MIB
MIN_SEGMENT_BYTES = 4096  # small segments are allowed so tests can rotate often
MAX_SEGMENT_BYTES = 512 * MIB
# One record holds at most one maximal entry (codec: 64 MiB of data) plus framing.
MAX_RECORD_PAYLOAD_BYTES = 80 * MIB
# Bytes append() may buffer before a sync(); bounds both memory and how far a
# segment can overshoot segment_bytes (rotation happens only after a sync).
MAX_PENDING_BYTES = 256 * MIB
# Nothing this WAL writes can be larger; a bigger file is not ours.
MAX_SEGMENT_FILE_BYTES = MAX_SEGMENT_BYTES + MAX_PENDING_BYTES + SEGMENT_HEADER_BYTES
MAX_SEGMENTS = 1_000_000
# Zero-ahead chunk: the active segment's file grows this much at a time (see the
# module docstring), so its size, a journal commit, changes once per chunk.
ZERO_AHEAD_BYTES = 1 * MIB
# Bounds the zeros one sync() may write on top of its records.
MAX_ZERO_AHEAD_BYTES = 64 * MIB
_ZEROS = bytes(MIB)  # compared against, never written: tails are checked a chunk at a time
MAX_INDEX = (1 << 63) - 1

_SEGMENT_NAME = re.compile(r"^wal-([0-9a-f]{16})-([0-9a-f]{16})\.log$")
LOCK_NAME = "wal.lock"


class RecordType(enum.IntEnum):
    """The record types a WAL accepts. 0 is reserved: zero-filled bytes never parse."""

    ENTRIES = 1  # a batch of consecutive log entries
    HARD_STATE = 2  # term, vote, commit
    SNAPSHOT = 3  # marker: a snapshot file at (index, term) is durable; maybe a log reset
    COMPACT = 4  # marker: entries <= index are gone; the log's dummy is (index, term)


_VALID_TYPES = frozenset(int(t) for t in RecordType)
_TYPE_BYTE = re.compile(b"[" + bytes(sorted(_VALID_TYPES)) + b"]")


class FsyncPolicy(enum.Enum):
    ALWAYS = "always"  # every sync() that wrote something fdatasyncs. The only durable policy.
    BATCH = "batch"  # fdatasync when batch_interval_ms passed or batch_bytes accumulated
    NEVER = "never"  # never fdatasync; for benchmarks and tests only


# ---------------------------------------------------------------- errors


class WalError(Exception):
    """Base of the WAL's typed errors; `path` and `offset` say where (-1: not about a byte)."""

    def __init__(self, message: str, path: str = "", offset: int = -1):
        where = f" ({path} at byte {offset})" if path else ""
        super().__init__(message + where)
        self.path = path
        self.offset = offset


class WalCorruption(WalError):
    """Damaged bytes that are not a torn tail. Never used; the WAL refuses to open."""

    def __init__(self, reason: str, path: str, offset: int):
        super().__init__(f"WAL corruption: {reason}", path, offset)
        self.reason = reason


class WalRecordTooLarge(WalError):
    def __init__(self, size: int, limit: int):
        super().__init__(f"WAL record payload of {size} bytes over the limit of {limit}")
        self.size = size
        self.limit = limit


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


def encode_record(rtype: int, payload: bytes) -> bytes:
    """Frame one record (header + payload)."""
    if int(rtype) not in _VALID_TYPES:
        raise ValueError(f"unknown WAL record type {rtype!r}")
    if len(payload) > MAX_RECORD_PAYLOAD_BYTES:
        raise WalRecordTooLarge(len(payload), MAX_RECORD_PAYLOAD_BYTES)
    tb = bytes((int(rtype),))
    crc = crc32c.crc32c(payload, value=crc32c.crc32c(tb))
    return RECORD_HEADER.pack(len(payload), crc, int(rtype)) + payload


def encode_segment_header(seq: int, first_index: int) -> bytes:
    invariant(1 <= seq <= MAX_INDEX and 0 <= first_index <= MAX_INDEX, "segment header fields in range")
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, WAL_VERSION, 0, seq, first_index, 0)[:-4]
    return head + struct.pack(">I", crc32c.crc32c(head))


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


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _all_zero(buf: bytes, off: int) -> bool:
    """True if every byte of buf[off:] is zero (memcmp a chunk at a time, not a Python loop)."""
    n = len(buf)
    while off < n:
        chunk = buf[off:off + len(_ZEROS)]
        if chunk != _ZEROS[:len(chunk)]:
            return False
        off += len(chunk)
    return True


def _check_record_at(buf: bytes, off: int, path: str) -> tuple[int, int, bytes, str]:
    """Verify the record at `off`: (type, end offset, payload, "") or (0, 0, b"", why not)."""
    n = len(buf)
    if n - off < RECORD_HEADER_BYTES:
        return 0, 0, b"", f"truncated record header ({n - off} of {RECORD_HEADER_BYTES} bytes)"
    length, crc, rtype = RECORD_HEADER.unpack_from(buf, off)
    if rtype not in _VALID_TYPES:
        return 0, 0, b"", f"unknown record type {rtype}"
    if length > MAX_RECORD_PAYLOAD_BYTES:
        return 0, 0, b"", f"record length {length} over limit {MAX_RECORD_PAYLOAD_BYTES}"
    end = off + RECORD_HEADER_BYTES + length
    if end > n:
        return 0, 0, b"", f"record of {length} bytes runs {end - n} bytes past end of file"
    payload = buf[off + RECORD_HEADER_BYTES:end]
    if crc32c.crc32c(payload, value=crc32c.crc32c(bytes((rtype,)))) != crc:
        return 0, 0, b"", "record CRC mismatch"
    return rtype, end, payload, ""


def _valid_record_after(buf: bytes, off: int, path: str) -> int:
    """Offset of the first fully verifying record starting after `off`, or -1.

    Candidates are found by their type byte (a C-speed regex scan), so this is
    cheap except on adversarial data; it only runs on the failure path.
    """
    for m in _TYPE_BYTE.finditer(buf, off + 1 + 8):
        start = m.start() - 8
        if _check_record_at(buf, start, path)[0]:
            return start
    return -1


class Wal:
    """An open write-ahead log. Not thread-safe: one owner drives it."""

    def __init__(self, dirpath: str, options: WalOptions, segment_start: SegmentStart):
        # Use Wal.open(); this only sets fields.
        self.dir = dirpath
        self.options = options
        self._segment_start = segment_start
        self._segments: list[_Segment] = []  # Invariant: sorted by seq, consecutive; last is active
        self._fd = -1  # write fd of the active segment; written with pwrite at its logical size
        # Invariant: the active segment file's length: >= its logical size, and every byte
        # between the two is zero. Writes below it overwrite zeros (no size change).
        self._zeroed_end = 0
        self._lock_fd = -1
        self._read_fds: dict[int, int] = {}  # seq -> read-only fd, opened on demand
        self._pending: list[bytes] = []  # framed records not yet written
        self._pending_bytes = 0  # Invariant: == sum(len(p) for p in _pending) <= MAX_PENDING_BYTES
        self._pending_at: dict[int, tuple[int, bytes]] = {}  # offset -> (type, payload), active seg
        self._unsynced_bytes = 0  # written but not fdatasync'ed
        self._last_fsync_ms: Optional[int] = None
        self.repaired: Optional[TornTailRepair] = None  # set when open() truncated a torn tail
        self.closed = False

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
        if version != WAL_VERSION or flags != 0:
            raise WalCorruption(f"unsupported segment version {version} / flags {flags:#x}", seg.path, 8)
        if seq != seg.seq or first != seg.first_index:
            raise WalCorruption(f"header says seq {seq} first {first}, name says {seg.seq} "
                                f"{seg.first_index}", seg.path, 12)
        records: list[WalRecord] = []
        off = SEGMENT_HEADER_BYTES
        while off < size:
            rtype, end, payload, why = _check_record_at(buf, off, seg.path)
            if not rtype:
                if _all_zero(buf, off):
                    size = off  # zero-filled space: the clean end of the records
                    break
                if not is_last:
                    raise WalCorruption(why, seg.path, off)
                later = _valid_record_after(buf, off, seg.path)
                if later >= 0:
                    raise WalCorruption(f"{why}; a valid record follows at byte {later}", seg.path, off)
                self._truncate_torn_tail(seg, off, size, why)
                size = off
                break
            records.append(WalRecord(RecordType(rtype), payload, seg.seq, off))
            off = end
        seg.size = size
        return records

    def _truncate_torn_tail(self, seg: _Segment, off: int, size: int, why: str) -> None:
        log.warning("WAL: torn tail in %s at byte %d (%s): truncating %d bytes",
                    seg.path, off, why, size - off)
        fd = os.open(seg.path, os.O_WRONLY)
        try:
            os.ftruncate(fd, off)
            if self.options.fsync is not FsyncPolicy.NEVER:
                _fdatasync(fd)
        finally:
            os.close(fd)
        self.repaired = TornTailRepair(seg.path, off, size - off, why)

    # ------------------------------------------------ segments

    def _create_segment(self, seq: int) -> None:
        """Create segment `seq` complete with its prologue, atomically, and make it active."""
        first_index, prologue = self._segment_start()
        invariant(0 <= first_index <= MAX_INDEX, f"segment first index {first_index} in range")
        data = encode_segment_header(seq, first_index) + b"".join(
            encode_record(t, p) for t, p in prologue)
        path = os.path.join(self.dir, segment_name(seq, first_index))
        tmp = path + ".tmp"
        durable = self.options.fsync is not FsyncPolicy.NEVER
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _pwrite_all(fd, data, 0)      # a new, empty file
            if durable:
                _fdatasync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        if durable:
            fsync_dir(self.dir)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(path, os.O_WRONLY)
        self._zeroed_end = len(data)  # no zeros yet: the first sync() writes them ahead
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
            os.ftruncate(self._fd, sealed.size)
            self._zeroed_end = sealed.size
        if self.options.fsync is not FsyncPolicy.NEVER and (self._unsynced_bytes or truncated):
            _fdatasync(self._fd)
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
        pos = []
        off = active.size + self._pending_bytes
        for f, (t, p) in zip(framed, records):
            self._pending_at[off] = (t, p)
            pos.append(RecordPos(active.seq, off))
            off += len(f)
        self._pending.extend(framed)
        self._pending_bytes += adding
        return pos

    def sync(self, now_ms: Optional[int] = None) -> bool:
        """Write everything buffered (one write) and fdatasync per policy (at most one).

        Returns True if everything appended so far is now on stable storage.
        `now_ms` is the caller's clock, used by FsyncPolicy.BATCH (None: fsync now).
        """
        self._check_open()
        if self._pending:
            active = self._segments[-1]
            end = active.size + self._pending_bytes
            parts = self._pending
            if end > self._zeroed_end:
                # Past the file's length: the size changes anyway, so change it once for a
                # whole chunk. Zeros ride in the same write (one write per sync).
                parts = [*parts, bytes(self._zero_ahead_end(end) - end)]
            data = b"".join(parts)
            _pwrite_all(self._fd, data, active.size)
            self._zeroed_end = max(self._zeroed_end, active.size + len(data))
            active.size = end
            self._unsynced_bytes += self._pending_bytes
            self._pending.clear()
            self._pending_at.clear()
            self._pending_bytes = 0
        policy = self.options.fsync
        if self._unsynced_bytes and policy is not FsyncPolicy.NEVER:
            due = (policy is FsyncPolicy.ALWAYS or now_ms is None
                   or self._unsynced_bytes >= self.options.batch_bytes
                   or self._last_fsync_ms is None
                   or now_ms - self._last_fsync_ms >= self.options.batch_interval_ms)
            if due:
                _fdatasync(self._fd)
                self._unsynced_bytes = 0
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
        rtype, _, payload, why = _check_record_at(buf, 0, seg.path)
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
                _fdatasync(self._fd)
                self._unsynced_bytes = 0
        finally:
            self.closed = True
            self._release_fds()

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
