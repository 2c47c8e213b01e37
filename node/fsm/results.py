"""A deterministic binary form of command results, for the at-most-once table.

A result is a reply value (replies.py) or an EngineError. Stored results live
in snapshots, so the same result always encodes to the same bytes. All
integers are big-endian.

    value := tag u8 , body
    +-----+---------------------------------+--------------------------------------+
    | tag | body                            | value                                |
    +-----+---------------------------------+--------------------------------------+
    | 'b' | len u32 , bytes                 | bulk string (bytes)                  |
    | 'i' | i64                             | integer                              |
    | 'n' | -                               | None (null bulk)                     |
    | 'N' | -                               | NULL_ARRAY                           |
    | '+' | len u32 , utf-8                 | Status (simple string)               |
    | '*' | n u32 , n x value               | array (list or tuple: decoded list)  |
    | '%' | n u32 , n x (value, value)      | map (dict, insertion order kept)     |
    | 'P' | n u32 , n x (value, value)      | PairMap ([key, value] pairs)         |
    | '-' | len u32 , utf-8                 | EngineError (message; code = 1st wd) |
    +-----+---------------------------------+--------------------------------------+

Invariants: integers fit int64 (redis replies are long long); nesting depth
<= MAX_DEPTH; every count and length fits the bytes left. An error decodes
as a plain EngineError with the same message: errors compare and map to the
wire by their text alone (errors.py, server/wire_errors.py).
"""
import struct

from ..engine.errors import EngineError
from ..engine.replies import NULL_ARRAY, PairMap, Status
from ..invariant import invariant

MAX_DEPTH = 32
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


class CorruptResult(ValueError):
    """The bytes are not a result this module wrote."""


def encode_result(value) -> bytes:
    out = []
    _encode(value, out, 0)
    return b"".join(out)


def _text(out: list, tag: bytes, text: str) -> None:
    raw = text.encode("utf-8", "surrogateescape")
    out += [tag, _U32.pack(len(raw)), raw]


def _encode(v, out: list, depth: int) -> None:
    invariant(depth <= MAX_DEPTH, "result nested too deeply")
    if isinstance(v, EngineError):
        _text(out, b"-", v.message)
    elif isinstance(v, Status):
        _text(out, b"+", str(v))
    elif isinstance(v, (bytes, bytearray, memoryview)):
        raw = bytes(v)
        out += [b"b", _U32.pack(len(raw)), raw]
    elif v is None:
        out.append(b"n")
    elif v is NULL_ARRAY:
        out.append(b"N")
    elif type(v) is int:
        invariant(_I64_MIN <= v <= _I64_MAX, "integer reply out of int64")
        out += [b"i", _I64.pack(v)]
    elif type(v) is PairMap:
        out += [b"P", _U32.pack(len(v))]
        for k, x in v:
            _encode(k, out, depth + 1)
            _encode(x, out, depth + 1)
    elif isinstance(v, (list, tuple)):
        out += [b"*", _U32.pack(len(v))]
        pack = _U32.pack
        for x in v:
            if type(x) is bytes:            # inline: an XADD batch's list of IDs, a MULTI's replies
                out += [b"b", pack(len(x)), x]
            else:
                _encode(x, out, depth + 1)
    elif isinstance(v, dict):
        out += [b"%", _U32.pack(len(v))]
        for k, x in v.items():
            invariant(type(k) is bytes, "map keys are bytes")
            _encode(k, out, depth + 1)
            _encode(x, out, depth + 1)
    else:
        invariant(False, "not a reply value: %s" % type(v).__name__)


def decode_result(buf: bytes):
    """The value `encode_result` wrote; CorruptResult on anything else."""
    value, pos = _decode(bytes(buf), 0, 0)
    if pos != len(buf):
        raise CorruptResult("%d trailing bytes" % (len(buf) - pos))
    return value


def _len(buf: bytes, pos: int):
    if len(buf) - pos < 4:
        raise CorruptResult("length runs past the end")
    return _U32.unpack_from(buf, pos)[0], pos + 4


def _raw(buf: bytes, pos: int):
    n, pos = _len(buf, pos)
    if n > len(buf) - pos:
        raise CorruptResult("string of %d bytes runs past the end" % n)
    return buf[pos:pos + n], pos + n


def _decode(buf: bytes, pos: int, depth: int):
    if depth > MAX_DEPTH:
        raise CorruptResult("nested too deeply")
    if pos >= len(buf):
        raise CorruptResult("value runs past the end")
    tag = buf[pos:pos + 1]
    pos += 1
    if tag == b"b":
        return _raw(buf, pos)
    if tag == b"i":
        if len(buf) - pos < 8:
            raise CorruptResult("integer runs past the end")
        return _I64.unpack_from(buf, pos)[0], pos + 8
    if tag == b"n":
        return None, pos
    if tag == b"N":
        return NULL_ARRAY, pos
    if tag in (b"+", b"-"):
        raw, pos = _raw(buf, pos)
        text = raw.decode("utf-8", "surrogateescape")
        if text.encode("utf-8", "surrogateescape") != raw:
            raise CorruptResult("text does not round-trip")
        return (Status(text) if tag == b"+" else EngineError(text)), pos
    if tag == b"*":
        n, pos = _len(buf, pos)
        if n > len(buf) - pos:                    # every element takes at least one byte
            raise CorruptResult("array of %d runs past the end" % n)
        items = []
        for _ in range(n):
            x, pos = _decode(buf, pos, depth + 1)
            items.append(x)
        return items, pos
    if tag == b"%":
        n, pos = _len(buf, pos)
        if 2 * n > len(buf) - pos:
            raise CorruptResult("map of %d runs past the end" % n)
        out = {}
        for _ in range(n):
            k, pos = _decode(buf, pos, depth + 1)
            x, pos = _decode(buf, pos, depth + 1)
            if not isinstance(k, bytes) or k in out:
                raise CorruptResult("map key not bytes or repeated")
            out[k] = x
        return out, pos
    if tag == b"P":
        n, pos = _len(buf, pos)
        if 2 * n > len(buf) - pos:
            raise CorruptResult("pair map of %d runs past the end" % n)
        pairs = PairMap()
        for _ in range(n):
            k, pos = _decode(buf, pos, depth + 1)
            x, pos = _decode(buf, pos, depth + 1)
            pairs.append([k, x])
        return pairs, pos
    raise CorruptResult("unknown tag %r" % tag)
