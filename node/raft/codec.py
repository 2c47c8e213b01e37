"""Binary encoding of the Raft core's values (struct, big-endian, versioned).

Every top-level record starts with a 2-byte header; inner records (an entry
inside a message, a conf state inside a snapshot) are written without it.
All integers are unsigned big-endian. Terms, indexes and IDs must be < 2**63.

Header (every top-level record)
    +---------+---------+
    | version | kind    |   version = 1; kind = RecordKind
    |   u8    |   u8    |
    +---------+---------+

Entry (inner, 21 bytes + data)
    +------+---------+---------+----------+------------------+
    | type | term    | index   | data_len | data             |
    |  u8  |  u64    |  u64    |   u32    | data_len bytes   |
    +------+---------+---------+----------+------------------+
    type in EntryType; data_len <= MAX_ENTRY_DATA_BYTES

HardState (inner, 24 bytes)
    +---------+---------+---------+
    | term    | vote    | commit  |
    |  u64    |  u64    |  u64    |
    +---------+---------+---------+

ConfState (inner)
    +-------+------------------+------------------+-----+------------------+
    | flags | voters           | learners         | ... | removed          |
    |  u8   | u16 n, n x u64   | u16 n, n x u64   |     | u32 n, n x u64   |
    +-------+------------------+------------------+-----+------------------+
    flags bit0 = auto_leave (other bits must be 0); the ID lists, in order:
    voters, learners, voters_outgoing, learners_next (u16 counts, <= MAX_NODES)
    then removed (u32 count, <= MAX_REMOVED). Every list strictly increasing,
    every ID > 0.

SnapshotMetadata (inner) = index u64 | term u64 | ConfState
Snapshot (inner)         = SnapshotMetadata | data_len u64 | data
    data_len <= MAX_SNAPSHOT_DATA_BYTES

Message (inner)
    +------+-------+-----+-----+------+----------+-------+--------+-------------+
    | type | flags | to  | frm | term | log_term | index | commit | reject_hint |
    |  u8  |  u8   | u64 | u64 | u64  |   u64    |  u64  |  u64   |    u64      |
    +------+-------+-----+-----+------+----------+-------+--------+-------------+
    +--------------+-------------+---------+-----+-----------+---------+------------+
    | chunk_offset | chunk_total | ctx_len | ctx | n_entries | entries | [snapshot] |
    |     u64      |     u64     |   u32   |     |    u32    | Entry*n | Snapshot   |
    +--------------+-------------+---------+-----+-----------+---------+------------+
    flags bit0 = reject, bit1 = snapshot present (other bits must be 0);
    ctx_len <= MAX_CONTEXT_BYTES; n_entries <= MAX_ENTRIES_PER_MESSAGE;
    chunk_offset + len(snapshot.data) <= chunk_total <= MAX_SNAPSHOT_DATA_BYTES.

ConfChange (inner)   = type u8 | node_id u64 | ctx_len u32 | ctx
ConfChangeV2 (inner) = transition u8 | n u16 | n x (type u8 | node_id u64) | ctx_len u32 | ctx
    n <= MAX_CHANGES; node_id > 0.

Decoding a top-level record must consume every byte; any malformed input
raises CodecError (a ValueError) and nothing else.
"""
from __future__ import annotations

import enum
import struct
from typing import Callable, TypeVar, Union

from .types import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfChangeV2,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)

VERSION = 1
MAX_U63 = (1 << 63) - 1
MAX_ENTRY_DATA_BYTES = 64 << 20
MAX_SNAPSHOT_DATA_BYTES = 1 << 30
MAX_CONTEXT_BYTES = 64 << 10
MAX_ENTRIES_PER_MESSAGE = 100_000
MAX_NODES = 4096  # per ID list of a ConfState
MAX_REMOVED = 65536
MAX_CHANGES = 4096
ENTRY_OVERHEAD = 21  # encoded size of an Entry minus its data


class RecordKind(enum.IntEnum):
    ENTRY = 1
    HARD_STATE = 2
    CONF_STATE = 3
    SNAPSHOT_METADATA = 4
    SNAPSHOT = 5
    MESSAGE = 6
    CONF_CHANGE = 7
    CONF_CHANGE_V2 = 8


class CodecError(ValueError):
    """Malformed bytes. Carries the record kind being decoded and the byte offset."""

    def __init__(self, reason: str, kind: str = "", offset: int = -1):
        super().__init__(f"cannot decode {kind or 'record'} at byte {offset}: {reason}")
        self.reason = reason
        self.kind = kind
        self.offset = offset


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ENTRY_HEAD = struct.Struct(">BQQI")
_HARD = struct.Struct(">QQQ")
_MSG_HEAD = struct.Struct(">BBQQQQQQQQQ")
_CHANGE = struct.Struct(">BQ")


def entry_encoded_size(e: Entry) -> int:
    """Bytes this entry takes on the wire; the unit of all size limits in the core."""
    return ENTRY_OVERHEAD + len(e.data)


# ---------------------------------------------------------------- reader


class _Reader:
    """A bounds-checked cursor over bytes; every read failure is a CodecError."""

    __slots__ = ("buf", "pos", "kind")

    def __init__(self, buf: bytes, kind: str):
        if not isinstance(buf, (bytes, bytearray, memoryview)):
            raise CodecError("input is not bytes", kind, 0)
        self.buf = bytes(buf)
        self.pos = 0
        self.kind = kind

    def fail(self, reason: str) -> CodecError:
        return CodecError(reason, self.kind, self.pos)

    def _take(self, s: struct.Struct) -> tuple:
        end = self.pos + s.size
        if end > len(self.buf):
            raise self.fail(f"truncated: need {s.size} bytes, have {len(self.buf) - self.pos}")
        vals = s.unpack_from(self.buf, self.pos)
        self.pos = end
        return vals

    def u8(self) -> int:
        return self._take(_U8)[0]

    def u16(self) -> int:
        return self._take(_U16)[0]

    def u32(self) -> int:
        return self._take(_U32)[0]

    def u64(self) -> int:
        return self._take(_U64)[0]

    def u63(self, what: str) -> int:
        v = self.u64()
        if v > MAX_U63:
            raise self.fail(f"{what} {v} exceeds 2**63-1")
        return v

    def raw(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise self.fail(f"truncated: need {n} bytes, have {len(self.buf) - self.pos}")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def enum(self, cls: type, what: str):
        v = self.u8()
        try:
            return cls(v)
        except ValueError:
            raise self.fail(f"unknown {what} {v}") from None

    def header(self, kind: RecordKind) -> None:
        version, got = self._take(struct.Struct(">BB"))
        if version != VERSION:
            raise self.fail(f"unsupported version {version}")
        if got != kind:
            raise self.fail(f"record kind {got}, expected {int(kind)}")

    def finish(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail(f"{len(self.buf) - self.pos} trailing bytes")


def _check_u63(v: int, what: str) -> None:
    if not isinstance(v, int) or v < 0 or v > MAX_U63:
        raise CodecError(f"{what} {v!r} not in [0, 2**63)", "encode")


# ---------------------------------------------------------------- inner writers/readers


def _w_entry(out: list, e: Entry) -> None:
    _check_u63(e.term, "entry term")
    _check_u63(e.index, "entry index")
    if len(e.data) > MAX_ENTRY_DATA_BYTES:
        raise CodecError(f"entry data {len(e.data)} bytes over limit", "encode")
    out.append(_ENTRY_HEAD.pack(int(e.type), e.term, e.index, len(e.data)))
    out.append(bytes(e.data))


def _r_entry(r: _Reader) -> Entry:
    t, term, index, n = r._take(_ENTRY_HEAD)
    try:
        et = EntryType(t)
    except ValueError:
        raise r.fail(f"unknown entry type {t}") from None
    if term > MAX_U63 or index > MAX_U63:
        raise r.fail("entry term/index exceeds 2**63-1")
    if n > MAX_ENTRY_DATA_BYTES:
        raise r.fail(f"entry data length {n} over limit")
    return Entry(term=term, index=index, type=et, data=r.raw(n))


def _w_ids(out: list, ids: tuple, wide: bool, limit: int) -> None:
    if len(ids) > limit:
        raise CodecError(f"{len(ids)} IDs over limit {limit}", "encode")
    prev = 0
    for i in ids:
        _check_u63(i, "node id")
        if i <= prev:
            raise CodecError("ID list not strictly increasing or contains 0", "encode")
        prev = i
    out.append((_U32 if wide else _U16).pack(len(ids)))
    out.append(b"".join(_U64.pack(i) for i in ids))


def _r_ids(r: _Reader, wide: bool, limit: int) -> tuple[int, ...]:
    n = r.u32() if wide else r.u16()
    if n > limit:
        raise r.fail(f"{n} IDs over limit {limit}")
    ids = []
    prev = 0
    for _ in range(n):
        i = r.u63("node id")
        if i <= prev:
            raise r.fail("ID list not strictly increasing or contains 0")
        ids.append(i)
        prev = i
    return tuple(ids)


def _w_conf_state(out: list, cs: ConfState) -> None:
    out.append(_U8.pack(1 if cs.auto_leave else 0))
    for ids in (cs.voters, cs.learners, cs.voters_outgoing, cs.learners_next):
        _w_ids(out, tuple(ids), False, MAX_NODES)
    _w_ids(out, tuple(cs.removed), True, MAX_REMOVED)


def _r_conf_state(r: _Reader) -> ConfState:
    flags = r.u8()
    if flags & ~1:
        raise r.fail(f"unknown conf state flags {flags:#x}")
    voters = _r_ids(r, False, MAX_NODES)
    learners = _r_ids(r, False, MAX_NODES)
    outgoing = _r_ids(r, False, MAX_NODES)
    lnext = _r_ids(r, False, MAX_NODES)
    removed = _r_ids(r, True, MAX_REMOVED)
    if set(voters) & set(learners):
        raise r.fail("voters and learners overlap")
    if not set(lnext) <= set(outgoing):
        raise r.fail("learners_next not a subset of voters_outgoing")
    if set(removed) & (set(voters) | set(learners) | set(outgoing)):
        raise r.fail("a removed ID is still a member")
    return ConfState(voters, learners, outgoing, lnext, bool(flags & 1), removed)


def _w_meta(out: list, m: SnapshotMetadata) -> None:
    _check_u63(m.index, "snapshot index")
    _check_u63(m.term, "snapshot term")
    out.append(_U64.pack(m.index))
    out.append(_U64.pack(m.term))
    _w_conf_state(out, m.conf_state)


def _r_meta(r: _Reader) -> SnapshotMetadata:
    index = r.u63("snapshot index")
    term = r.u63("snapshot term")
    return SnapshotMetadata(index=index, term=term, conf_state=_r_conf_state(r))


def _w_snapshot(out: list, s: Snapshot) -> None:
    if len(s.data) > MAX_SNAPSHOT_DATA_BYTES:
        raise CodecError(f"snapshot data {len(s.data)} bytes over limit", "encode")
    _w_meta(out, s.metadata)
    out.append(_U64.pack(len(s.data)))
    out.append(bytes(s.data))


def _r_snapshot(r: _Reader) -> Snapshot:
    meta = _r_meta(r)
    n = r.u64()
    if n > MAX_SNAPSHOT_DATA_BYTES:
        raise r.fail(f"snapshot data length {n} over limit")
    return Snapshot(metadata=meta, data=r.raw(n))


def _w_ctx(out: list, ctx: bytes) -> None:
    if len(ctx) > MAX_CONTEXT_BYTES:
        raise CodecError(f"context {len(ctx)} bytes over limit", "encode")
    out.append(_U32.pack(len(ctx)))
    out.append(bytes(ctx))


def _r_ctx(r: _Reader) -> bytes:
    n = r.u32()
    if n > MAX_CONTEXT_BYTES:
        raise r.fail(f"context length {n} over limit")
    return r.raw(n)


def _w_message(out: list, m: Message) -> None:
    for name in ("to", "frm", "term", "log_term", "index", "commit", "reject_hint",
                 "chunk_offset", "chunk_total"):
        _check_u63(getattr(m, name), "message " + name)
    if len(m.entries) > MAX_ENTRIES_PER_MESSAGE:
        raise CodecError(f"{len(m.entries)} entries over limit", "encode")
    flags = (1 if m.reject else 0) | (2 if m.snapshot is not None else 0)
    out.append(_MSG_HEAD.pack(int(m.type), flags, m.to, m.frm, m.term, m.log_term, m.index,
                              m.commit, m.reject_hint, m.chunk_offset, m.chunk_total))
    _w_ctx(out, m.context)
    out.append(_U32.pack(len(m.entries)))
    for e in m.entries:
        _w_entry(out, e)
    if m.snapshot is not None:
        _w_snapshot(out, m.snapshot)


def _r_message(r: _Reader) -> Message:
    (t, flags, to, frm, term, log_term, index, commit, hint, c_off, c_total) = r._take(_MSG_HEAD)
    try:
        mt = MessageType(t)
    except ValueError:
        raise r.fail(f"unknown message type {t}") from None
    if flags & ~3:
        raise r.fail(f"unknown message flags {flags:#x}")
    for v in (to, frm, term, log_term, index, commit, hint, c_off, c_total):
        if v > MAX_U63:
            raise r.fail("message field exceeds 2**63-1")
    ctx = _r_ctx(r)
    n = r.u32()
    if n > MAX_ENTRIES_PER_MESSAGE:
        raise r.fail(f"{n} entries over limit")
    if n * ENTRY_OVERHEAD > len(r.buf) - r.pos:
        raise r.fail(f"{n} entries cannot fit in the remaining bytes")
    entries = tuple(_r_entry(r) for _ in range(n))
    snap = _r_snapshot(r) if flags & 2 else None
    if c_total > MAX_SNAPSHOT_DATA_BYTES:
        raise r.fail(f"chunk_total {c_total} over limit")
    if snap is not None and c_off + len(snap.data) > c_total:
        raise r.fail("snapshot chunk extends past chunk_total")
    if c_off > c_total:
        raise r.fail("chunk_offset past chunk_total")
    return Message(type=mt, to=to, frm=frm, term=term, log_term=log_term, index=index,
                   entries=entries, commit=commit, snapshot=snap, reject=bool(flags & 1),
                   reject_hint=hint, context=ctx, chunk_offset=c_off, chunk_total=c_total)


def _w_change(out: list, ctype: ConfChangeType, node_id: int) -> None:
    if not isinstance(node_id, int) or node_id <= 0 or node_id > MAX_U63:
        raise CodecError(f"conf change node id {node_id!r} invalid", "encode")
    out.append(_CHANGE.pack(int(ctype), node_id))


def _r_change(r: _Reader) -> ConfChangeSingle:
    t, node = r._take(_CHANGE)
    try:
        ct = ConfChangeType(t)
    except ValueError:
        raise r.fail(f"unknown conf change type {t}") from None
    if node == 0 or node > MAX_U63:
        raise r.fail(f"conf change node id {node} invalid")
    return ConfChangeSingle(ct, node)


def _w_cc(out: list, cc: ConfChange) -> None:
    _w_change(out, cc.type, cc.node_id)
    _w_ctx(out, cc.context)


def _r_cc(r: _Reader) -> ConfChange:
    ch = _r_change(r)
    return ConfChange(ch.type, ch.node_id, _r_ctx(r))


def _w_cc2(out: list, cc: ConfChangeV2) -> None:
    if len(cc.changes) > MAX_CHANGES:
        raise CodecError(f"{len(cc.changes)} changes over limit", "encode")
    out.append(_U8.pack(int(cc.transition)))
    out.append(_U16.pack(len(cc.changes)))
    for ch in cc.changes:
        _w_change(out, ch.type, ch.node_id)
    _w_ctx(out, cc.context)


def _r_cc2(r: _Reader) -> ConfChangeV2:
    tr = r.enum(ConfChangeTransition, "conf change transition")
    n = r.u16()
    if n > MAX_CHANGES:
        raise r.fail(f"{n} changes over limit")
    changes = tuple(_r_change(r) for _ in range(n))
    return ConfChangeV2(transition=tr, changes=changes, context=_r_ctx(r))


# ---------------------------------------------------------------- top level

T = TypeVar("T")


def _encode(kind: RecordKind, writer: Callable[[list, T], None], value: T) -> bytes:
    out: list = [bytes((VERSION, int(kind)))]
    writer(out, value)
    return b"".join(out)


def _decode(kind: RecordKind, reader: Callable[[_Reader], T], buf: bytes) -> T:
    r = _Reader(buf, kind.name)
    r.header(kind)
    try:
        value = reader(r)
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError, struct.error) as exc:  # defensive: never leak
        raise r.fail(f"malformed: {exc}") from None
    r.finish()
    return value


def encode_entry(e: Entry) -> bytes:
    return _encode(RecordKind.ENTRY, _w_entry, e)


def decode_entry(buf: bytes) -> Entry:
    return _decode(RecordKind.ENTRY, _r_entry, buf)


def encode_hard_state(hs: HardState) -> bytes:
    for name in ("term", "vote", "commit"):
        _check_u63(getattr(hs, name), "hard state " + name)
    return bytes((VERSION, int(RecordKind.HARD_STATE))) + _HARD.pack(hs.term, hs.vote, hs.commit)


def decode_hard_state(buf: bytes) -> HardState:
    def rd(r: _Reader) -> HardState:
        return HardState(term=r.u63("term"), vote=r.u63("vote"), commit=r.u63("commit"))

    return _decode(RecordKind.HARD_STATE, rd, buf)


def encode_conf_state(cs: ConfState) -> bytes:
    return _encode(RecordKind.CONF_STATE, _w_conf_state, cs)


def decode_conf_state(buf: bytes) -> ConfState:
    return _decode(RecordKind.CONF_STATE, _r_conf_state, buf)


def encode_snapshot_metadata(m: SnapshotMetadata) -> bytes:
    return _encode(RecordKind.SNAPSHOT_METADATA, _w_meta, m)


def decode_snapshot_metadata(buf: bytes) -> SnapshotMetadata:
    return _decode(RecordKind.SNAPSHOT_METADATA, _r_meta, buf)


def encode_snapshot(s: Snapshot) -> bytes:
    return _encode(RecordKind.SNAPSHOT, _w_snapshot, s)


def decode_snapshot(buf: bytes) -> Snapshot:
    return _decode(RecordKind.SNAPSHOT, _r_snapshot, buf)


def encode_message(m: Message) -> bytes:
    return _encode(RecordKind.MESSAGE, _w_message, m)


def decode_message(buf: bytes) -> Message:
    return _decode(RecordKind.MESSAGE, _r_message, buf)


def encode_conf_change(cc: ConfChange) -> bytes:
    return _encode(RecordKind.CONF_CHANGE, _w_cc, cc)


def decode_conf_change(buf: bytes) -> ConfChange:
    return _decode(RecordKind.CONF_CHANGE, _r_cc, buf)


def encode_conf_change_v2(cc: ConfChangeV2) -> bytes:
    return _encode(RecordKind.CONF_CHANGE_V2, _w_cc2, cc)


def decode_conf_change_v2(buf: bytes) -> ConfChangeV2:
    return _decode(RecordKind.CONF_CHANGE_V2, _r_cc2, buf)


def conf_change_entry_data(cc: Union[ConfChange, ConfChangeV2]) -> tuple[EntryType, bytes]:
    """The (entry type, payload) to propose for a conf change."""
    if isinstance(cc, ConfChange):
        return EntryType.CONF_CHANGE, encode_conf_change(cc)
    return EntryType.CONF_CHANGE_V2, encode_conf_change_v2(cc)


def decode_conf_change_entry(e: Entry) -> Union[ConfChange, ConfChangeV2]:
    """Decode the payload of a CONF_CHANGE / CONF_CHANGE_V2 entry (CodecError if malformed)."""
    if e.type == EntryType.CONF_CHANGE:
        return decode_conf_change(e.data)
    if e.type == EntryType.CONF_CHANGE_V2:
        return decode_conf_change_v2(e.data)
    raise CodecError(f"entry type {e.type!r} is not a conf change", "entry")
