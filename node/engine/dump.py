"""Keyspace snapshots for Raft: `dump_keyspace(db) -> bytes`, `load_keyspace(buf) -> Keyspace`.

All integers are big-endian.

    +--------+-------------+-------------+------------------------------+
    | "XRKS" | version u16 | nfields u16 | nfields x config field       |
    +--------+-------------+-------------+------------------------------+
    | nkeys u32 | nkeys x record (keys in strictly ascending byte order) |
    +-----------+--------------------------------------------------------+
    | crc32 u32 |  zlib.crc32 of every byte before it                    |
    +-----------+--------------------------------------------------------+

    config field:                       one EngineConfig attribute
    +--------------+------+----------+
    | name_len u8  | name | value i64|  Invariant: names are EngineConfig fields,
    +--------------+------+----------+  each at most once, in declaration order

    record:                             one key
    +--------+-------------+-----+-----------------+---------+-----------+
    | tag u8 | key_len u32 | key | payload_len u32 | payload | crc32 u32 |
    +--------+-------------+-----+-----------------+---------+-----------+
      tag: registered codec (1 string, 2 list, 3 stream); crc32 covers
      tag .. payload of this record, so a damaged record is named by key.

    string payload: the value's bytes, as they are.

    list payload (a quicklist, lists.py):
    +----------+------------+---------------------------------------------+
    | fill i32 | nnodes u32 | nnodes x ( lp_len u32 | listpack (lp_len) ) |
    +----------+------------+---------------------------------------------+
      Invariant: -5 <= fill <= 2**15; nnodes >= 1; every listpack passes
      lp_validate(deep=True), holds >= 1 element and obeys the fill rule
      (or holds exactly one element). Listpacks are written as they are.

    stream payload: stream_codec.dump_stream() (it checks its own CRC).

Deterministic: the same keyspace always dumps to the same bytes. Loading trusts
nothing: the whole CRC is checked first, then every length against the bytes
left and the limits below, every record's CRC, and every payload by its codec;
any failure raises CorruptDump and yields no keyspace.
"""
import dataclasses
import struct
import zlib

from ..invariant import invariant
from .crc_trailer import checked_body
from .keyspace import EngineConfig, Keyspace
from .listpack import CorruptListpack, lp_bytes, lp_length, lp_validate
from .lists import FILL_MAX, ListValue, node_fits

MAGIC = b"XRKS"
VERSION = 1
TAG_STRING, TAG_LIST, TAG_STREAM = 1, 2, 3

MAX_KEY_LEN = 512 * 1024 * 1024        # redis proto-max-bulk-len default
MAX_PAYLOAD_LEN = (1 << 32) - 1        # fits the u32 length field
MAX_KEYS = (1 << 32) - 1
MAX_CONFIG_FIELDS = 64

_HEAD = struct.Struct(">4sHH")         # magic, version, nfields
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class CorruptDump(ValueError):
    """The bytes are not a keyspace dump this code wrote."""


@dataclasses.dataclass(frozen=True)
class _Codec:
    cls: type
    tag: int
    dump: object          # value -> bytes
    load: object          # bytes -> value; raises ValueError (or subclass) on bad bytes


_BY_CLASS: dict = {}
_BY_TAG: dict = {}
_CHECKS: dict = {}      # tag -> a lighter check for check_records (raises as the tag's load does)


def register_codec(cls: type, tag: int, dump_fn, load_fn) -> None:
    """Teach the dump a value type. `tag` (1..255) is written on disk: never reuse one."""
    invariant(1 <= tag <= 255, "codec tag out of range")
    old = _BY_TAG.get(tag)
    invariant(old is None or old.cls is cls, "codec tag %d registered twice" % tag)
    codec = _Codec(cls, tag, dump_fn, load_fn)
    _BY_CLASS[cls] = codec
    _BY_TAG[tag] = codec


def _ensure_stream_codec() -> None:
    """Streams come from stream_codec.py (another module); register it on first use."""
    if TAG_STREAM in _BY_TAG:
        return
    try:
        from . import stream_codec
    except ImportError:
        return
    register_codec(stream_codec.Stream, TAG_STREAM, stream_codec.dump_stream, stream_codec.load_stream)
    _CHECKS[TAG_STREAM] = stream_codec.check_stream_entries


# -- strings and lists -----------------------------------------------------------

def _dump_string(value: bytes) -> bytes:
    return bytes(value)


def _load_string(payload: bytes) -> bytes:
    return payload


def _dump_list(value: ListValue) -> bytes:
    invariant(value.length > 0 and value.nodes, "dumping an empty list")
    out = [_I32.pack(value.fill), _U32.pack(len(value.nodes))]
    for lp in value.nodes:
        out.append(_U32.pack(len(lp)))
        out.append(bytes(lp))
    return b"".join(out)


def _load_list(payload: bytes) -> ListValue:
    r = _Reader(payload, 0, len(payload), "list")
    fill = r.i32()
    if not -5 <= fill <= FILL_MAX:
        raise CorruptDump("list: fill %d out of range" % fill)
    nnodes = r.u32()
    if nnodes == 0 or nnodes * (4 + 7) > r.left():
        raise CorruptDump("list: bad node count %d" % nnodes)
    nodes = []
    for i in range(nnodes):
        lp = r.take(r.u32())
        try:
            lp_validate(lp, deep=True)
        except CorruptListpack as e:
            raise CorruptDump("list node %d: %s" % (i, e)) from None
        count = lp_length(lp)
        if count == 0:
            raise CorruptDump("list node %d is empty" % i)
        if count > 1 and not node_fits(fill, lp_bytes(lp), count):
            raise CorruptDump("list node %d breaks the fill rule" % i)
        nodes.append(lp)
    r.done()
    return ListValue.from_nodes(fill, nodes)


register_codec(bytes, TAG_STRING, _dump_string, _load_string)
register_codec(ListValue, TAG_LIST, _dump_list, _load_list)


# -- reading untrusted bytes -----------------------------------------------------

class _Reader:
    def __init__(self, buf: bytes, pos: int, end: int, what: str):
        self.buf, self.pos, self.end, self.what = buf, pos, end, what

    def left(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> bytes:
        if n < 0 or n > self.left():
            raise CorruptDump("%s: length %d runs past the end" % (self.what, n))
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def _unpack(self, s: struct.Struct):
        return s.unpack(self.take(s.size))[0]

    def u8(self) -> int:
        return self._unpack(_U8)

    def u32(self) -> int:
        return self._unpack(_U32)

    def i32(self) -> int:
        return self._unpack(_I32)

    def i64(self) -> int:
        return self._unpack(_I64)

    def done(self) -> None:
        if self.pos != self.end:
            raise CorruptDump("%s: %d trailing bytes" % (self.what, self.left()))


# -- the keyspace ----------------------------------------------------------------

def _config_fields():
    return [f.name for f in dataclasses.fields(EngineConfig)]


def dump_keyspace(db: Keyspace) -> bytes:
    """The snapshot bytes of `db` (its data and config; not the ready set)."""
    _ensure_stream_codec()
    names = _config_fields()
    out = [_HEAD.pack(MAGIC, VERSION, len(names))]
    for name in names:
        value = getattr(db.config, name)
        invariant(type(value) is int and _INT64_MIN <= value <= _INT64_MAX,
                  "config %s is not an int64" % name)
        raw = name.encode()
        out += [_U8.pack(len(raw)), raw, _I64.pack(value)]
    invariant(len(db.data) <= MAX_KEYS, "too many keys to dump")
    out.append(_U32.pack(len(db.data)))
    for key in sorted(db.data):
        out.append(dump_record(key, db.data[key]))
    body = b"".join(out)
    return body + _U32.pack(zlib.crc32(body))


def dump_record(key: bytes, value) -> bytes:
    """One key's record (the layout's "record", its CRC included): the unit of a
    snapshot and of a slot move's chunks (fsm/slot_moves.py)."""
    _ensure_stream_codec()
    codec = _BY_CLASS.get(type(value))
    invariant(codec is not None, "no dump codec for %s" % type(value).__name__)
    payload = codec.dump(value)
    invariant(len(key) <= MAX_KEY_LEN and len(payload) <= MAX_PAYLOAD_LEN, "record too large")
    record = b"".join((_U8.pack(codec.tag), _U32.pack(len(key)), key, _U32.pack(len(payload)), payload))
    return record + _U32.pack(zlib.crc32(record))


def load_records(buf) -> list:
    """[(key, value, record bytes)] of concatenated `dump_record`s (a move's chunk);
    CorruptDump, and nothing, on any damage. Keys must be distinct; order is the caller's."""
    return _records(buf, False)


def check_records(buf) -> list:
    """[(key, record bytes)] of concatenated `dump_record`s, checked as load_records checks
    them, except that a stream's groups, PELs and idmp state are not loaded (its checksums
    and entries are checked): a slot move's pre-copy, which every replica of the target
    checks at once, and whose records are loaded in full later, from the sealed copy (the
    groups' load is most of a big stream's: its PEL). CorruptDump on any damage found."""
    return [(key, raw) for key, _, raw in _records(buf, True)]


def _records(buf, light: bool) -> list:
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise CorruptDump("records are not bytes")
    buf = bytes(buf)
    _ensure_stream_codec()
    r = _Reader(buf, 0, len(buf), "records")
    out = []
    while r.left():
        start = r.pos
        key, value = _load_record(r, light)
        out.append((key, value, buf[start:r.pos]))
    return out


def load_keyspace(buf) -> Keyspace:
    """The keyspace `dump_keyspace` wrote; CorruptDump on anything else."""
    buf, body_end = checked_body(buf, _HEAD.size, CorruptDump, "dump")
    magic, version, nfields = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptDump("not a keyspace dump (magic)")
    if version != VERSION:
        raise CorruptDump("unsupported dump version %d" % version)
    _ensure_stream_codec()
    r = _Reader(buf, _HEAD.size, body_end, "dump")
    db = Keyspace()
    _load_config(r, nfields, db.config)
    nkeys = r.u32()
    if nkeys * 14 > r.left():          # smallest record: 1+4+0+4+1 (string "")+4 crc
        raise CorruptDump("dump: bad key count %d" % nkeys)
    prev = None
    for _ in range(nkeys):
        key, value = _load_record(r)
        if prev is not None and key <= prev:
            raise CorruptDump("dump: keys out of order or repeated")
        prev = key
        db.data[key] = value
    r.done()
    db.rebuild_slot_index()            # derived, never in the dump
    return db


# The ranges redis's CONFIG SET accepts for the settings we know; a field added
# to EngineConfig later gets the int64 range until it is listed here.
_CONFIG_RANGES = {
    "stream_node_max_bytes": (0, _INT64_MAX),
    "stream_node_max_entries": (0, _INT64_MAX),
    "list_max_listpack_size": (-(1 << 31), (1 << 31) - 1),
    "list_compress_depth": (0, (1 << 31) - 1),
}


def _load_config(r: _Reader, nfields: int, config: EngineConfig) -> None:
    known = _config_fields()
    if nfields > MAX_CONFIG_FIELDS:
        raise CorruptDump("dump: %d config fields" % nfields)
    seen = set()
    for _ in range(nfields):
        name = r.take(r.u8())
        value = r.i64()
        try:
            text = name.decode("ascii")
        except UnicodeDecodeError:
            raise CorruptDump("dump: config name is not ASCII") from None
        if text not in known or text in seen:
            raise CorruptDump("dump: unknown or repeated config field %r" % text)
        seen.add(text)
        lo, hi = _CONFIG_RANGES.get(text, (_INT64_MIN, _INT64_MAX))
        if not lo <= value <= hi:
            raise CorruptDump("dump: config %s = %d out of range" % (text, value))
        setattr(config, text, value)


def _load_record(r: _Reader, light: bool = False):
    """(key, value) of the record at r; with `light`, (key, None) if the record's tag has a
    lighter check (_CHECKS) and it passes."""
    start = r.pos
    tag = r.u8()
    key_len = r.u32()
    if key_len > MAX_KEY_LEN:
        raise CorruptDump("dump: key of %d bytes" % key_len)
    key = r.take(key_len)
    payload = r.take(r.u32())
    # Over a view: a slice copied the whole record (a state-sized stream) once more.
    if zlib.crc32(memoryview(r.buf)[start:r.pos]) != r.u32():
        raise CorruptDump("dump: record checksum mismatch for key %r" % key[:64])
    codec = _BY_TAG.get(tag)
    if codec is None:
        raise CorruptDump("dump: unknown type tag %d for key %r" % (tag, key[:64]))
    check = _CHECKS.get(tag) if light else None
    try:
        if check is not None:
            check(payload)
            return key, None
        value = codec.load(payload)
    except CorruptDump:
        raise
    except (ValueError, IndexError, KeyError, struct.error, OverflowError) as e:
        raise CorruptDump("dump: bad %s value for key %r: %s" % (codec.cls.__name__, key[:64], e)) from e
    if type(value) is not codec.cls:
        raise CorruptDump("dump: codec %d returned a %s" % (tag, type(value).__name__))
    if isinstance(value, ListValue):
        value.check()
    return key, value
