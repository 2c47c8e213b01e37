"""Snapshot encoding of one stream: its entries, then its consumer groups.

All integers are big-endian. The whole record:

    +---------+---------+------------------+----------------------+-------------+
    | "XSTR"  | version |  entries_len u32 | entries (entries_len)| groups ...  |
    | 4 bytes | u8 = 5  |                  | Stream.dump_entries()|             |
    +---------+---------+------------------+----------------------+-------------+
    ... | idmp (version >= 2) | retention u8 (version >= 3) | crc32 u32 |  zlib.crc32 of all before it

    Version 1 (before IDMP) has neither and version 2 no retention byte; both
    still load (idmp None, retention None). retention: 0 none, 1 ACKED (refs.py).

    groups:
    +----------------+-------------------------------------------------------+
    | ngroups  u32   | ngroups x group                                       |
    +----------------+-------------------------------------------------------+
    (ngroups == 0xFFFFFFFF: the stream never had a group, stream.cgroups is None)

    group:
    +-----------+-----------+--------------+------------------+
    | name_len  | name      | last_id      | entries_read i64 |
    | u32       | name_len  | 16 bytes ID  | -1 or >= 0       |
    +-----------+-----------+--------------+------------------+
    | npel u32  | npel x nack: ID (16) | delivery_time i64 | delivery_count u64 |
    +-----------+----------------------------------------------------------------+
    | nconsumers u32 | nconsumers x consumer                                     |
    +----------------+-----------------------------------------------------------+

    Version 4 (dead-letter policies, dead_letters.py) appends to each group, after
    its consumers:
    +--------------------+-----------------------+-------------------------+
    | max_deliveries u64 | dead_lettered u64     | dlq_len u32 | dlq key   |
    +--------------------+-----------------------+-------------------------+
    (dlq_len 0 and no key bytes when max_deliveries is 0). Records of versions
    1-3 (no such fields: no policy, nothing dead-lettered) still load.

    consumer:
    +-----------+-----------+----------------+-----------+------------------+
    | name_len  | name      | seen_time i64  | npel u32  | npel x ID (16)   |
    +-----------+-----------+----------------+-----------+------------------+

    idmp (idmp.py; has u8 == 0: stream.idmp is None, nothing follows):
    +--------+-------------+------------+----------------+---------------------+---------+
    | has u8 | duration u32| maxsize u32| iids_added u64 | iids_duplicates u64 | n u32   |
    +--------+-------------+------------+----------------+---------------------+---------+
    then n pairs, oldest first (each producer's pairs in its own oldest-first order):
    +-----------+-----+-------------+-----------+---------------+
    | pid_len u32 | pid | iid key (16) | ID (16) | added_ms i64 |
    +-----------+-----+-------------+-----------+---------------+
    The loader checks the ranges, the time order, no pair twice, maxsize per
    producer and MAX_TRACKED_IIDS. Version 5 appends `legacy_until_ms i64`
    (idmp.py: until when short ids may be stored as digests; 0 none). Versions
    2-4 kept every IDMP id as its digest, so their pairs load with
    legacy_until_ms = the newest pair's added_ms.

A 16-byte ID is StreamID.encode(): ms u64 then seq u64, so byte order is ID
order. (In memory PEL keys are StreamIDs, pel.py; the bytes are the same as when
they were 16-byte rax keys, so the format did not change.) Group names, group PEL IDs, consumer names and each consumer's PEL IDs
are written in strictly ascending byte order (rax order); the loader insists
on it, which also rules out duplicates.

Sharing: a NACK is written once, in its group's PEL, without its owner; each
consumer lists the IDs it owns. The loader gives every consumer the very NACK
object of the group PEL and requires that every NACK end up with exactly one
owner: the consumer PELs partition the group PEL, as at run time.

Nothing read is trusted: every length is checked against the bytes that are
left and against the limits below before anything is allocated, and the CRC
is checked before any of it is parsed.
"""
import struct
import zlib
from operator import lt

from . import groups as g
from . import idmp as im
from .crc_trailer import checked_body
from .dead_letters import MAX_DELIVERIES_LIMIT
from .rax import Rax
from .stream import Stream
from .streamid import StreamID

MAGIC = b"XSTR"
VERSION = 5                     # 2: the idmp section; 3: the retention byte; 4: group policies;
                                # 5: idmp legacy_until_ms (short ids kept padded)
PADDED_IID_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
POLICY_VERSION = 4              # groups carry their dead-letter policy from this version on
_RETENTIONS = (None, "acked")   # the retention byte's values (refs.RETENTION_ACKED)
NO_GROUPS = 0xFFFFFFFF          # ngroups value: cgroups is None

# Limits on what a snapshot may hold (a bigger count is corruption, not data).
MAX_NAME_LEN = 512 * 1024 * 1024    # redis proto-max-bulk-len default
MAX_GROUPS = 1 << 24
MAX_CONSUMERS = 1 << 24
MAX_PEL = 1 << 30

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1
_ID_LEN = 16
_HEADER = struct.Struct(">4sBI")    # magic, version, entries_len
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_POLICY = struct.Struct(">QQ")      # max_deliveries, dead_lettered (version 2)
_ID = struct.Struct(">QQ")          # a 16-byte ID: ms, seq
_NACK_REC = struct.Struct(">QQqQ")  # a group PEL record: ID, delivery_time, delivery_count
_IDMP_HEAD = struct.Struct(">IIQQI")  # duration, maxsize, iids_added, iids_duplicates, npairs
_IDMP_PAIR_TAIL = struct.Struct(">16sQQq")  # iid key, ID, added_ms


class CorruptStreamState(ValueError):
    """The bytes are not a stream snapshot this code wrote."""


# -- dump ------------------------------------------------------------------------

def dump_stream(stream) -> bytes:
    """The snapshot record of `stream` (entries, groups, consumers, PELs)."""
    entries = stream.dump_entries()
    out = [_HEADER.pack(MAGIC, VERSION, len(entries)), entries]
    if stream.cgroups is None:
        out.append(_U32.pack(NO_GROUPS))
    else:
        out.append(_U32.pack(stream.cgroups.numele))
        for name, group in stream.cgroups.items():
            _dump_group(out, name, group)
    _dump_idmp(out, stream.idmp)
    out.append(bytes((_RETENTIONS.index(stream.retention),)))
    body = b"".join(out)
    return body + _U32.pack(zlib.crc32(body))


def _dump_idmp(out: list, state) -> None:
    if state is None:
        out.append(b"\x00")
        return
    out.append(b"\x01")
    out.append(_IDMP_HEAD.pack(state.duration_s, state.maxsize, state.iids_added, state.iids_duplicates,
                               state.tracked))
    pack = _IDMP_PAIR_TAIL.pack
    for pid, iid, sid, added_ms in state.pairs():
        out.append(_U32.pack(len(pid)))
        out.append(pid)
        out.append(pack(iid, sid[0], sid[1], added_ms))
    out.append(_I64.pack(state.legacy_until_ms))


def _dump_group(out: list, name: bytes, group) -> None:
    g.check_group(group)
    out.append(_U32.pack(len(name)))
    out.append(name)
    out.append(group.last_id.encode())
    out.append(_I64.pack(group.entries_read))
    out.append(_U32.pack(group.pel.numele))
    pack = _NACK_REC.pack
    for sid, nack in group.pel.items():
        out.append(pack(sid[0], sid[1], nack.delivery_time, nack.delivery_count))
    out.append(_U32.pack(group.consumers.numele))
    for cname, consumer in group.consumers.items():
        out.append(_U32.pack(len(cname)))
        out.append(cname)
        out.append(_I64.pack(consumer.seen_time))
        out.append(_U32.pack(consumer.pel.numele))
        pack = _ID.pack
        for sid, _ in consumer.pel.items():
            out.append(pack(sid[0], sid[1]))
    out.append(_POLICY.pack(group.max_deliveries, group.dead_lettered))
    dead_letter_key = group.dead_letter_key if group.max_deliveries else b""
    out.append(_U32.pack(len(dead_letter_key)))
    out.append(dead_letter_key)


# -- load ------------------------------------------------------------------------

class _Reader:
    """Bounds-checked reads over the record body."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes, pos: int, end: int):
        self.buf, self.pos, self.end = buf, pos, end

    def take(self, n: int) -> bytes:
        if n < 0 or self.end - self.pos < n:
            raise CorruptStreamState("stream snapshot truncated")
        chunk = self.buf[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def i64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def count(self, limit: int, record_len: int, what: str) -> int:
        """A u32 element count, within `limit` and the bytes left."""
        n = self.u32()
        if n > limit or n * record_len > self.end - self.pos:
            raise CorruptStreamState(f"stream snapshot: bad {what} count {n}")
        return n

    def name(self, what: str) -> bytes:
        n = self.u32()
        if n > MAX_NAME_LEN:
            raise CorruptStreamState(f"stream snapshot: {what} name too long")
        return self.take(n)


def load_stream(buf) -> Stream:
    """The stream `dump_stream` wrote; CorruptStreamState on anything else."""
    stream, reader, version = _load_entries(buf)
    ngroups = reader.u32()
    if ngroups != NO_GROUPS:
        if ngroups > MAX_GROUPS or ngroups * 36 > reader.end - reader.pos:
            raise CorruptStreamState(f"stream snapshot: bad group count {ngroups}")
        stream.cgroups = Rax()
        prev = None
        for _ in range(ngroups):
            name = reader.name("group")
            if prev is not None and name <= prev:
                raise CorruptStreamState("stream snapshot: groups out of order")
            prev = name
            stream.cgroups.insert(name, _load_group(reader, stream, version))
    if version >= 2:
        stream.idmp = _load_idmp(reader, version)
    if version >= 3:
        code = reader.take(1)[0]
        if code >= len(_RETENTIONS):
            raise CorruptStreamState("stream snapshot: unknown retention %d" % code)
        stream.retention = _RETENTIONS[code]
    if reader.pos != reader.end:
        raise CorruptStreamState("stream snapshot: trailing bytes")
    g.check_groups(stream)
    return stream


def check_stream_entries(buf) -> None:
    """The checks of load_stream up to its entries (both checksums, the header, every node,
    which also fills stream.py's cache of checked nodes), not its groups, PELs or idmp
    state: for a slot move's pre-copy, whose records are loaded in full only from the
    sealed copy (fsm/slot_move_apply.py "_prestage"). CorruptStreamState if they fail."""
    _load_entries(buf)


def _load_entries(buf) -> tuple:
    """(the stream of buf's entries, a reader at the section after them, the version)."""
    buf, body_end = checked_body(buf, _HEADER.size, CorruptStreamState, "stream snapshot")
    magic, version, entries_len = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC or version not in READABLE_VERSIONS:
        raise CorruptStreamState("not a stream snapshot (magic/version)")
    reader = _Reader(buf, _HEADER.size, body_end)
    entries = reader.take(entries_len)
    try:
        stream = Stream.load_entries(entries)
    except CorruptStreamState:
        raise
    except (ValueError, IndexError, KeyError, struct.error) as e:
        raise CorruptStreamState(f"stream snapshot: bad entries: {e}") from e
    return stream, reader, version


def _load_idmp(reader: _Reader, version: int):
    has = reader.take(1)[0]
    if has == 0:
        return None
    if has != 1:
        raise CorruptStreamState("stream snapshot: bad idmp flag")
    duration, maxsize, added, dups, n = _IDMP_HEAD.unpack(reader.take(_IDMP_HEAD.size))
    if not (1 <= duration <= im.MAX_DURATION_S and 1 <= maxsize <= im.MAX_MAXSIZE):
        raise CorruptStreamState("stream snapshot: idmp settings out of range")
    if n > im.MAX_TRACKED_IIDS or n > added or n * (4 + _IDMP_PAIR_TAIL.size) > reader.end - reader.pos:
        raise CorruptStreamState(f"stream snapshot: bad idmp pair count {n}")
    state = im.IdmpState(duration, maxsize)
    state.iids_added, state.iids_duplicates = added, dups
    prev_ms = None
    for _ in range(n):
        pid = reader.name("idmp producer")
        if not pid:
            raise CorruptStreamState("stream snapshot: empty idmp producer")
        iid, ms, seq, added_ms = _IDMP_PAIR_TAIL.unpack(reader.take(_IDMP_PAIR_TAIL.size))
        if prev_ms is not None and added_ms < prev_ms:
            raise CorruptStreamState("stream snapshot: idmp pairs out of time order")
        prev_ms = added_ms
        if len(state.producers.get(pid, ())) >= maxsize:
            raise CorruptStreamState("stream snapshot: idmp producer over maxsize")
        if not state.load_pair(pid, iid, StreamID(ms, seq), added_ms):
            raise CorruptStreamState("stream snapshot: idmp pair twice")
    if version >= PADDED_IID_VERSION:
        legacy = reader.i64()
        if legacy < 0:
            raise CorruptStreamState("stream snapshot: negative idmp legacy_until_ms")
        state.legacy_until_ms = legacy
    elif prev_ms is not None:
        state.legacy_until_ms = prev_ms
    return state


def _read_id(reader: _Reader) -> StreamID:
    return StreamID._make(_ID.unpack(reader.take(_ID_LEN)))


def _ascending(ids: list) -> bool:
    """Strictly ascending (StreamIDs compare as (ms, seq) tuples)."""
    return len(ids) < 2 or all(map(lt, ids, ids[1:]))


def _load_group(reader: _Reader, stream, version: int):
    last_id = _read_id(reader)
    entries_read = reader.i64()
    if entries_read < g.ENTRIES_READ_UNKNOWN:
        raise CorruptStreamState("stream snapshot: negative entries_read")
    group = g.ConsumerGroup(last_id, entries_read)

    # PELs load in bulk: one unpack pass per PEL and one PelMap.extend_sorted, not a Python
    # insert per entry (a restart or snapshot install of a million-entry PEL was dominated by
    # per-entry inserts). The checks are the same: strictly ascending IDs, every owned ID in the
    # group PEL exactly once, every group PEL entry owned.
    npel = reader.count(MAX_PEL, _NACK_REC.size, "group PEL")
    records = _NACK_REC.iter_unpack(reader.take(npel * _NACK_REC.size)) if npel else ()
    new_id, nack_cls = StreamID._make, g.NACK
    pel_ids, nacks = [], []
    for ms, seq, delivery_time, delivery_count in records:
        pel_ids.append(new_id((ms, seq)))
        nacks.append(nack_cls(delivery_time, delivery_count, None))
    if not _ascending(pel_ids):                   # (ms, seq) order is the 16 bytes' order
        raise CorruptStreamState("stream snapshot: group PEL out of order")
    group.pel.extend_sorted(pel_ids, nacks)
    find = group.pel.find
    # A consumer's PEL is keyed by the group PEL's own StreamID objects, as after the
    # deliveries that built it (groups.py inserts one key into both PELs): one long-lived,
    # GC-tracked key per pending entry instead of two.
    key_of = dict(zip(pel_ids, pel_ids)).__getitem__

    nconsumers = reader.count(MAX_CONSUMERS, 16, "consumer")
    prev = None
    owned = 0
    for _ in range(nconsumers):
        name = reader.name("consumer")
        if prev is not None and name <= prev:
            raise CorruptStreamState("stream snapshot: consumers out of order")
        prev = name
        consumer = g.Consumer(name, reader.i64())
        n = reader.count(MAX_PEL, _ID_LEN, "consumer PEL")
        raw = list(_ID.iter_unpack(reader.take(n * _ID_LEN))) if n else []   # (ms, seq) tuples
        if not _ascending(raw):
            raise CorruptStreamState("stream snapshot: consumer PEL out of order")
        owned_nacks = list(map(find, raw))        # a tuple finds its StreamID: same hash, equal
        for nack in owned_nacks:
            if nack is None:
                raise CorruptStreamState("stream snapshot: consumer owns an ID the group PEL lacks")
            if nack.consumer is not None:
                raise CorruptStreamState("stream snapshot: pending entry owned twice")
            nack.consumer = consumer
        consumer.pel.extend_sorted(list(map(key_of, raw)), owned_nacks)
        owned += n
        group.consumers.insert(name, consumer)
    if owned != group.pel.numele:
        raise CorruptStreamState("stream snapshot: pending entry without an owner")
    if version >= POLICY_VERSION:
        _load_policy(reader, group)
    return group


def _load_policy(reader: _Reader, group) -> None:
    """A version-2 group's dead-letter policy and count (dead_letters.py)."""
    max_deliveries, dead_lettered = _POLICY.unpack(reader.take(_POLICY.size))
    if max_deliveries > MAX_DELIVERIES_LIMIT or dead_lettered > _INT64_MAX:
        raise CorruptStreamState("stream snapshot: bad dead-letter policy")
    dead_letter_key = reader.name("dead-letter key")
    if bool(max_deliveries) != bool(dead_letter_key):
        raise CorruptStreamState("stream snapshot: dead-letter key and policy disagree")
    group.max_deliveries = max_deliveries
    group.dead_lettered = dead_lettered
    group.dead_letter_key = dead_letter_key if max_deliveries else None
