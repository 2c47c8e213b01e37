"""WAL bytes: record, segment header and batch header encoding, and the recovery scan.

The layout and the torn-tail rule are drawn and argued in wal.py's module
docstring; this module is the code for them. It does no I/O: the scan works on
a segment's bytes and says which records verified, where the records end, and
whether what follows is a torn tail (to be truncated) or corruption (raised).
"""
from __future__ import annotations

import enum
import re
import struct
from typing import NamedTuple

import crc32c

from ..invariant import invariant

SEGMENT_MAGIC = b"XRFTWAL\x00"
WAL_VERSION = 2  # written; 1 (records back to back, no batches) is still read: scan_segment_v1
READABLE_VERSIONS = (1, 2)
SEGMENT_HEADER = struct.Struct(">8sHHQQI")  # magic, version, flags, seq, first_index, crc
SEGMENT_HEADER_BYTES = SEGMENT_HEADER.size  # 32
RECORD_HEADER = struct.Struct(">IIB")  # length, crc32c, type
RECORD_HEADER_BYTES = RECORD_HEADER.size  # 9
BATCH_MAGIC = b"XRBT"
# magic, length, count, zero_parts, at, synced_end, records_crc, header_crc
BATCH_HEADER = struct.Struct(">4sIIIQQII")
BATCH_HEADER_BYTES = BATCH_HEADER.size  # 40
# The unit a disk writes atomically, at least: a batch header never straddles one,
# and a torn write is recognised by whole sectors of a batch that are still zeros.
SECTOR_BYTES = 512
_SECTOR_ZEROS = bytes(SECTOR_BYTES)

MIB = 1 << 20
# One record holds at most one maximal entry (codec: 64 MiB of data) plus framing.
MAX_RECORD_PAYLOAD_BYTES = 80 * MIB
# Bytes append() may buffer before a sync(): one batch's records are at most this.
MAX_PENDING_BYTES = 256 * MIB
MAX_INDEX = (1 << 63) - 1
_ZEROS = bytes(MIB)  # compared against, never written: tails are checked a chunk at a time


class RecordType(enum.IntEnum):
    """The record types a WAL accepts. 0 is reserved: zero-filled bytes never parse."""

    ENTRIES = 1  # a batch of consecutive log entries
    HARD_STATE = 2  # term, vote, commit
    SNAPSHOT = 3  # marker: a snapshot file at (index, term) is durable; maybe a log reset
    COMPACT = 4  # marker: entries <= index are gone; the log's dummy is (index, term)


_VALID_TYPES = frozenset(int(t) for t in RecordType)


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


class WalVersionUnsupported(WalError):
    """A segment in a format this build does not read (a newer xraft's); the WAL refuses to open."""

    def __init__(self, version: int, path: str):
        super().__init__(
            f"WAL segment format version {version} is not readable by this build, which reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))} and writes {WAL_VERSION}: run the "
            f"xraft that wrote it", path, 8)
        self.version = version


class WalRecordTooLarge(WalError):
    def __init__(self, size: int, limit: int):
        super().__init__(f"WAL record payload of {size} bytes over the limit of {limit}")
        self.size = size
        self.limit = limit


# ---------------------------------------------------------------- encoding


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


def batch_header_at(off: int) -> int:
    """Where a batch that follows byte `off` puts its header: at `off`, or at the next
    sector boundary if the header would straddle one (the gap is zeros)."""
    if off % SECTOR_BYTES + BATCH_HEADER_BYTES <= SECTOR_BYTES:
        return off
    return off + SECTOR_BYTES - off % SECTOR_BYTES


def encode_batch(at: int, synced_end: int, framed: list[bytes]) -> tuple[bytes, bytes]:
    """(batch header, records) for records framed by encode_record and a header at byte `at`.

    Two pieces, not one: the caller writes them with one pwritev, without a copy.
    """
    invariant(batch_header_at(at) == at and 0 < synced_end <= at, "batch header placement")
    records = b"".join(framed)
    invariant(len(records) <= MAX_PENDING_BYTES, "batch within the pending limit")
    zero_parts = count_zero_parts(records, at + BATCH_HEADER_BYTES, at,
                                  at + BATCH_HEADER_BYTES + len(records))
    head = BATCH_HEADER.pack(BATCH_MAGIC, len(records), len(framed), zero_parts, at, synced_end,
                             crc32c.crc32c(records), 0)[:-4]
    return head + struct.pack(">I", crc32c.crc32c(head)), records


def count_zero_parts(buf: bytes, base: int, at: int, end: int) -> int:
    """How many sector-aligned parts of a batch [at, end) are all zeros.

    `buf[i]` is the segment's byte `base + i`; it must hold at least the bytes
    of [max(base, next sector boundary after at), end). The part holding the
    batch header is never zero (the magic is not), so counting starts at the
    first sector boundary after `at`. Only full sectors whose first byte is
    zero are compared in full; those are picked out by one C-level strided
    slice, so a batch without zero runs costs no Python loop over its sectors.
    """
    first = (at // SECTOR_BYTES + 1) * SECTOR_BYTES
    if first >= end:
        return 0
    last = (end - 1) // SECTOR_BYTES * SECTOR_BYTES  # start of the (maybe partial) last part
    count = 0
    lo, hi = first - base, last - base  # full sectors: buf[lo:hi]
    leads = buf[lo:hi:SECTOR_BYTES]
    k = leads.find(0)
    while k >= 0:
        s = lo + k * SECTOR_BYTES
        if buf[s:s + SECTOR_BYTES] == _SECTOR_ZEROS:
            count += 1
        k = leads.find(0, k + 1)
    tail = buf[last - base:end - base]
    if tail == _SECTOR_ZEROS[:len(tail)]:
        count += 1
    return count


# ---------------------------------------------------------------- verification


def all_zero(buf: bytes, off: int, end: int = -1) -> bool:
    """True if every byte of buf[off:end] is zero (memcmp a chunk at a time, not a Python loop)."""
    n = len(buf) if end < 0 else end
    while off < n:
        chunk = buf[off:min(n, off + len(_ZEROS))]
        if chunk != _ZEROS[:len(chunk)]:
            return False
        off += len(chunk)
    return True


def check_record_at(buf: bytes, off: int, end: int = -1) -> tuple[int, int, bytes, str]:
    """Verify the record at `off` (ending by `end`, default len(buf)):
    (type, end offset, payload, "") or (0, 0, b"", why not)."""
    n = len(buf) if end < 0 else end
    if n - off < RECORD_HEADER_BYTES:
        return 0, 0, b"", f"truncated record header ({n - off} of {RECORD_HEADER_BYTES} bytes)"
    length, crc, rtype = RECORD_HEADER.unpack_from(buf, off)
    if rtype not in _VALID_TYPES:
        return 0, 0, b"", f"unknown record type {rtype}"
    if length > MAX_RECORD_PAYLOAD_BYTES:
        return 0, 0, b"", f"record length {length} over limit {MAX_RECORD_PAYLOAD_BYTES}"
    rend = off + RECORD_HEADER_BYTES + length
    if rend > n:
        return 0, 0, b"", f"record of {length} bytes runs {rend - n} bytes past its end"
    payload = buf[off + RECORD_HEADER_BYTES:rend]
    if crc32c.crc32c(payload, value=crc32c.crc32c(bytes((rtype,)))) != crc:
        return 0, 0, b"", "record CRC mismatch"
    return rtype, rend, payload, ""


class BatchHeader(NamedTuple):
    length: int  # bytes of records after the header
    count: int  # records in the batch
    zero_parts: int  # sector parts of [at, end) that are all zeros as written
    at: int  # this header's own offset in its segment
    synced_end: int  # the segment was fdatasync'ed up to here when this batch was written
    records_crc: int


def parse_batch_header(buf: bytes, at: int) -> tuple[BatchHeader | None, str]:
    """The verified batch header at `at`, or (None, why not)."""
    if len(buf) - at < BATCH_HEADER_BYTES:
        return None, f"truncated batch header ({len(buf) - at} of {BATCH_HEADER_BYTES} bytes)"
    magic, length, count, zero_parts, hat, synced_end, rcrc, hcrc = BATCH_HEADER.unpack_from(buf, at)
    if magic != BATCH_MAGIC:
        return None, f"bad batch magic {bytes(magic)!r}"
    if crc32c.crc32c(buf[at:at + BATCH_HEADER_BYTES - 4]) != hcrc:
        return None, "batch header CRC mismatch"
    if hat != at or not SEGMENT_HEADER_BYTES <= synced_end <= at:
        return None, f"batch header placed at {hat} synced to {synced_end}, found at {at}"
    if length > MAX_PENDING_BYTES or count < 1 or count * RECORD_HEADER_BYTES > length:
        return None, f"batch of {count} records in {length} bytes out of range"
    return BatchHeader(length, count, zero_parts, hat, synced_end, rcrc), ""


class ScannedRecord(NamedTuple):
    type: int
    payload: bytes
    offset: int


class SegmentScan(NamedTuple):
    records: list[ScannedRecord]
    end: int  # logical size: end of the last verified batch (the file may be longer)
    torn_at: int  # -1, or where a torn tail starts (to be truncated)
    torn_why: str


class _Damage(NamedTuple):
    why: str
    at: int  # offset to report
    torn: bool  # explained by a write that did not fully land


def scan_segment(buf: bytes, path: str, is_last: bool) -> SegmentScan:
    """Verify the batches after the segment header; the rule is wal.py's "Recovery".

    Raises WalCorruption for damage that is not a torn tail of the last segment.
    """
    records: list[ScannedRecord] = []
    off = SEGMENT_HEADER_BYTES
    size = len(buf)
    while off < size:
        if all_zero(buf, off):
            break  # zero-filled space: the clean end of the batches
        got = _check_batch(buf, off)
        if isinstance(got, list):
            records.extend(got)
            off = got[-1].offset + RECORD_HEADER_BYTES + len(got[-1].payload)
            continue
        if not is_last:
            raise WalCorruption(got.why, path, got.at)
        later = synced_batch_after(buf, off)
        if later >= 0:
            raise WalCorruption(f"{got.why}; the batch at byte {later} was written after an "
                                f"fdatasync that covered this one, so it was acknowledged", path, got.at)
        if not got.torn:
            raise WalCorruption(f"{got.why}; every sector of this last batch landed, so the write "
                                f"completed and may have been acknowledged: damage, not a torn "
                                f"write", path, got.at)
        return SegmentScan(records, off, off, got.why)
    return SegmentScan(records, off, -1, "")


def _check_batch(buf: bytes, off: int) -> list[ScannedRecord] | _Damage:
    """The records of the batch following byte `off`, or what is wrong with it."""
    size = len(buf)
    at = batch_header_at(off)
    if not all_zero(buf, off, min(at, size)):
        return _Damage("non-zero bytes in the gap before a batch header", off, False)
    if at + BATCH_HEADER_BYTES > size:
        return _Damage("batch header runs past the end of the file", at, True)
    if all_zero(buf, at, at + BATCH_HEADER_BYTES):
        # Data after it (else the caller saw a zero tail): the header's sector never landed.
        return _Damage("batch header missing (zeros) with data after it", at, True)
    head, why = parse_batch_header(buf, at)
    if head is None:
        # A header sits inside one sector, which lands whole or not at all: a header
        # with some non-zero bytes that does not verify was damaged after it was written.
        return _Damage(why, at, False)
    start = at + BATCH_HEADER_BYTES
    end = start + head.length
    if end > size:
        return _Damage(f"batch of {head.length} bytes runs {end - size} bytes past the end of "
                       f"the file", at, True)
    if crc32c.crc32c(buf[start:end]) != head.records_crc:
        # A torn write leaves some sector part that should hold data as zeros, so more
        # zero parts than the writer counted; a flipped bit leaves the count as written.
        why, bad = _first_bad_record(buf, start, end, at)
        if count_zero_parts(buf, 0, at, end) > head.zero_parts:
            return _Damage(f"{why}; whole sectors of the batch are zeros", at, True)
        return _Damage(why, bad, False)
    out: list[ScannedRecord] = []
    rec = start
    while rec < end:
        rtype, rend, payload, why = check_record_at(buf, rec, end)
        if not rtype:
            return _Damage(f"batch CRC matches but {why}", rec, False)
        out.append(ScannedRecord(rtype, payload, rec))
        rec = rend
    if len(out) != head.count:
        return _Damage(f"batch header says {head.count} records, found {len(out)}", at, False)
    return out


def _first_bad_record(buf: bytes, start: int, end: int, at: int) -> tuple[str, int]:
    """(why, offset) naming the first record of a batch that fails, else the batch header."""
    rec = start
    while rec < end:
        rtype, rend, _, why = check_record_at(buf, rec, end)
        if not rtype:
            return f"batch CRC mismatch: {why}", rec
        rec = rend
    return "batch CRC mismatch", at


def synced_batch_after(buf: bytes, off: int) -> int:
    """Offset of a verified batch header after `off` whose synced_end passes `off`, or -1.

    Such a header was written only after an fdatasync that covered byte `off`
    returned: proof that what is at `off` was complete and acknowledged.
    Candidates are found by the magic (a C-speed search); only the failure path
    runs this.
    """
    p = buf.find(BATCH_MAGIC, off + 1)
    while p >= 0:
        head, _ = parse_batch_header(buf, p)
        if head is not None and head.synced_end > off:
            return p
        p = buf.find(BATCH_MAGIC, p + 1)
    return -1


# ---------------------------------------------------------------- version 1


def scan_segment_v1(buf: bytes, path: str, is_last: bool) -> SegmentScan:
    """Verify a version-1 segment (records back to back) with version 1's rule.

    Version 1 cannot tell a torn last write from damage (no batches): damage in
    the last segment with a fully verifying record anywhere after it is refused,
    without one it is a torn tail. The WAL never writes into a version-1
    segment again (open starts a version-2 one), so this rule fades out.
    """
    records: list[ScannedRecord] = []
    off = SEGMENT_HEADER_BYTES
    while off < len(buf):
        rtype, end, payload, why = check_record_at(buf, off)
        if rtype:
            records.append(ScannedRecord(rtype, payload, off))
            off = end
            continue
        if all_zero(buf, off):
            break
        if not is_last:
            raise WalCorruption(why, path, off)
        later = _valid_record_after(buf, off)
        if later >= 0:
            raise WalCorruption(f"{why}; a valid record follows at byte {later}", path, off)
        return SegmentScan(records, off, off, why)
    return SegmentScan(records, off, -1, "")


_TYPE_BYTE = re.compile(b"[" + bytes(sorted(_VALID_TYPES)) + b"]")


def _valid_record_after(buf: bytes, off: int) -> int:
    """Offset of the first fully verifying record starting after `off`, or -1.

    Candidates are found by their type byte (a C-speed regex scan); this only
    runs on the failure path of a version-1 segment.
    """
    for m in _TYPE_BYTE.finditer(buf, off + 1 + 8):
        start = m.start() - 8
        if check_record_at(buf, start)[0]:
            return start
    return -1
