"""Redis 7.0 listpack, byte for byte: a flat buffer of strings and integers.

Streams keep their entries in listpacks, and the stream layer splits nodes on
`stream-node-max-bytes`, so every element here must take exactly the bytes
redis 7.0 gives it (`src/listpack.c`).  Functions work on a `bytearray` (or,
for reading, `bytes`) and address entries by integer offsets into it.

Whole buffer:

    +--------------+-----------+---------+---------+-----+---------+------+
    | total_bytes  | num_elems | entry 0 | entry 1 | ... | entry N | 0xFF |
    | u32 LE       | u16 LE    |         |         |     |         | EOF  |
    +--------------+-----------+---------+---------+-----+---------+------+
      offset 0       offset 4    offset 6 (LP_HDR_SIZE)          total-1

    total_bytes  Invariant: == len(buffer), 7 <= total_bytes <= 2**32-1.
    num_elems    Invariant: == number of entries, or 65535 ("unknown": count
                 by scanning) once the count has reached 65535.
    0xFF         Invariant: the last byte, and no entry starts with 0xFF.

One entry:

    +------------------------+---------+-------------------------------+
    | encoding (+ length)    | data    | backlen: len(encoding + data) |
    +------------------------+---------+-------------------------------+

    backlen  Invariant: 1..5 bytes, read right to left, 7 bits each; the
             rightmost byte holds the low 7 bits; bit 0x80 set on every byte
             but the leftmost (so a reader walking backwards knows when to
             stop).  Its size follows redis' thresholds exactly: 1 byte for
             L <= 127, 2 for L < 16383, 3 for L < 2097151, 4 for
             L < 268435455, 5 otherwise (note the strict '<': L == 16383
             takes 3 bytes).

Encodings (first byte; data little-endian, integers two's complement):

    0xxxxxxx                        7-bit uint 0..127, no data
    10LLLLLL  + L bytes             string, length 0..63
    110vvvvv  vvvvvvvv              13-bit int -4096..4095
    1110LLLL  LLLLLLLL + L bytes    string, length 64..4095 (12-bit length)
    11110000  L:u32 + L bytes       string, length >= 4096 (32-bit length)
    11110001  i16                   16-bit int
    11110010  i24                   24-bit int
    11110011  i32                   32-bit int
    11110100  i64                   64-bit int
    11110101 .. 11111110            invalid
    11111111                        EOF (terminator, not an entry)

A string that redis' `lpStringToInt64` accepts (no sign but '-', no leading
zeros, no blanks, fits in int64, at most 20 bytes) is stored as an integer,
so b"1234" comes back as the int 1234; b"01", b"+1", b"-0", b" 1" stay
strings.  Readers that want the bytes a client sees call `lp_get_bytes`.

Offsets passed in are trusted (they come from lp_first/lp_next/... on a
buffer that went through `lp_validate` when it came from disk or a peer);
untrusted bytes must go through `lp_validate` first.
"""
import struct

from ..accel import compiled
from ..invariant import invariant

LP_HDR_SIZE = 6
LP_HDR_NUMELE_UNKNOWN = 0xFFFF
LP_EOF = 0xFF
# redis refuses to grow a listpack past 1 GiB (lpSafeToAdd); callers check it.
LISTPACK_MAX_SAFETY_SIZE = 1 << 30

_UINT32_MAX = (1 << 32) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_HDR = struct.Struct("<IH")     # total_bytes, num_elems
_EMPTY = b"\x07\x00\x00\x00\x00\x00\xff"


class CorruptListpack(ValueError):
    """A listpack buffer (from disk or a peer) is not well formed."""


# ---------------------------------------------------------------- back-length

def _backlen_size(length: int) -> int:
    """Bytes redis' lpEncodeBacklen uses for an entry of `length` bytes."""
    if length <= 127:
        return 1
    if length < 16383:
        return 2
    if length < 2097151:
        return 3
    if length < 268435455:
        return 4
    return 5


def _encode_backlen(length: int) -> bytes:
    """The back-length bytes, leftmost first, exactly as lpEncodeBacklen."""
    n = _backlen_size(length)
    out = bytearray(n)
    # The rightmost byte holds the lowest 7 bits; all but the leftmost carry 0x80.
    for i in range(n - 1, -1, -1):
        out[i] = (length & 127) | (0x80 if i else 0)
        length >>= 7
    return bytes(out)


# Entries of at most 4097 bytes (every int, every string shorter than 4096)
# get their back-length from this table instead of computing it.
_BACKLEN_TABLE_MAX = 4097
_BACKLEN = [_encode_backlen(n) for n in range(_BACKLEN_TABLE_MAX + 1)]


def _backlen(length: int) -> bytes:
    if length <= _BACKLEN_TABLE_MAX:
        return _BACKLEN[length]
    return _encode_backlen(length)


def _decode_backlen(lp, i: int) -> int:
    """Read the back-length ending at offset `i`, right to left."""
    b = lp[i]
    value = b & 127
    shift = 7
    while b & 128:
        # A back-length never reaches back to offset 6 (the first entry's
        # encoding byte) or into the header; nor is it longer than 5 bytes.
        if shift > 28 or i <= LP_HDR_SIZE + 1:
            raise CorruptListpack("back-length longer than 5 bytes")
        i -= 1
        b = lp[i]
        value |= (b & 127) << shift
        shift += 7
    return value


# ---------------------------------------------------------------- encoding

def _int_entry(v: int) -> bytes:
    """Complete entry for an int64, in the smallest encoding redis picks."""
    if 0 <= v <= 127:
        return bytes((v, 1))
    if -4096 <= v <= 4095:
        u = v & 0x1FFF
        return bytes((0xC0 | (u >> 8), u & 0xFF, 2))
    if -32768 <= v <= 32767:
        return b"\xf1" + v.to_bytes(2, "little", signed=True) + b"\x03"
    if -8388608 <= v <= 8388607:
        return b"\xf2" + v.to_bytes(3, "little", signed=True) + b"\x04"
    if -2147483648 <= v <= 2147483647:
        return b"\xf3" + v.to_bytes(4, "little", signed=True) + b"\x05"
    invariant(_INT64_MIN <= v <= _INT64_MAX, "listpack integer outside int64: %r" % (v,))
    return b"\xf4" + v.to_bytes(8, "little", signed=True) + b"\x09"


# -4096..4095 covers the stream layer's flags, counts and small ID deltas.
_SMALL_INT = [_int_entry(v) for v in range(-4096, 4096)]
# lp_encode(v) of -4096 <= v <= 4095 is LP_SMALL_INT[v + 4096]: for hot paths that skip the call.
LP_SMALL_INT = _SMALL_INT
_STR6_HEAD = [bytes((0x80 | n,)) for n in range(64)]


def string_to_int64(s: bytes):
    """redis' lpStringToInt64: the int `s` spells canonically, else None."""
    n = len(s)
    if n == 0 or n > 20:                 # LONG_STR_SIZE is 21
        return None
    c = s[0]
    if 49 <= c <= 57:                    # '1'..'9'
        if n == 1:
            return c - 48
        if s.isdigit():                  # ASCII digits only, for bytes
            v = int(s)
            return v if v <= _INT64_MAX else None
        return None
    if c == 48:                          # '0' only alone
        return 0 if n == 1 else None
    if c == 45 and n >= 2 and 49 <= s[1] <= 57:   # '-' then '1'..'9'
        digits = s[1:]
        if digits.isdigit():
            v = -int(digits)
            return v if v >= _INT64_MIN else None
    return None


def _str_entry(s: bytes) -> bytes:
    """Complete entry for a string that is stored as a string."""
    n = len(s)
    if n < 64:
        return _STR6_HEAD[n] + s + _BACKLEN[n + 1]
    if n < 4096:
        return bytes((0xE0 | (n >> 8), n & 0xFF)) + s + _BACKLEN[n + 2]
    invariant(n <= LISTPACK_MAX_SAFETY_SIZE, "listpack string of %d bytes" % n)
    return b"\xf0" + n.to_bytes(4, "little") + s + _encode_backlen(n + 5)


def lp_encode(ele) -> bytes:
    """One complete entry (encoding + data + backlen) as redis would write it."""
    if ele.__class__ is bytes:                # the stream hot path first
        n = len(ele)
        if 0 < n <= 20:
            c = ele[0]
            if 49 <= c <= 57:                 # '1'..'9': an integer iff all digits and in range
                if ele.isdigit():             # (string_to_int64's first case, inlined)
                    v = int(ele)
                    if v <= 4095:
                        return _SMALL_INT[v + 4096]
                    if v <= _INT64_MAX:
                        return _int_entry(v)
            elif c == 48 or c == 45:          # "0" or "-...": may spell an integer, check exactly
                v = string_to_int64(ele)
                if v is not None:
                    if -4096 <= v <= 4095:
                        return _SMALL_INT[v + 4096]
                    return _int_entry(v)
            return _STR6_HEAD[n] + ele + _BACKLEN[n + 1]
        return _str_entry(ele)
    if ele.__class__ is int:
        if -4096 <= ele <= 4095:
            return _SMALL_INT[ele + 4096]
        return _int_entry(ele)
    invariant(isinstance(ele, (bytes, bytearray, memoryview, int)) and not isinstance(ele, bool),
              "listpack element must be bytes or int, not %s" % type(ele).__name__)
    return lp_encode(int(ele) if isinstance(ele, int) else bytes(ele))


_lp_encode_py = lp_encode   # the reference, for lp_append_entries even once compiled twins replace both


# ---------------------------------------------------------------- decoding

def _entry_size(lp, p: int) -> int:
    """Total bytes of the entry at `p`, back-length included."""
    b = lp[p]
    if b < 0x80:
        return 2
    if b < 0xC0:
        return (b & 0x3F) + 2
    if b < 0xE0:
        return 3
    if b < 0xF0:
        length = (((b & 0x0F) << 8) | lp[p + 1]) + 2
        return length + (1 if length <= 127 else 2)
    if b == 0xF0:
        length = int.from_bytes(lp[p + 1:p + 5], "little") + 5
        return length + _backlen_size(length)
    if b <= 0xF4:
        return _INT_ENTRY_SIZE[b]
    raise CorruptListpack("bad encoding byte 0x%02x at offset %d" % (b, p))


_INT_WIDTH = {0xF1: 2, 0xF2: 3, 0xF3: 4, 0xF4: 8}
_INT_ENTRY_SIZE = {b: w + 2 for b, w in _INT_WIDTH.items()}


def _get(lp, p: int):
    """(value, entry size) of the entry at `p`; `lp` is bytes or bytearray."""
    b = lp[p]
    if b < 0x80:
        return b, 2
    if b < 0xC0:
        n = b & 0x3F
        return bytes(lp[p + 1:p + 1 + n]), n + 2
    if b < 0xE0:
        v = ((b & 0x1F) << 8) | lp[p + 1]
        return (v - 8192 if v >= 4096 else v), 3
    if b < 0xF0:
        n = ((b & 0x0F) << 8) | lp[p + 1]
        length = n + 2
        return bytes(lp[p + 2:p + 2 + n]), length + (1 if length <= 127 else 2)
    if b == 0xF0:
        n = int.from_bytes(lp[p + 1:p + 5], "little")
        length = n + 5
        return bytes(lp[p + 5:p + 5 + n]), length + _backlen_size(length)
    w = _INT_WIDTH.get(b)
    if w is None:
        raise CorruptListpack("bad encoding byte 0x%02x at offset %d" % (b, p))
    return int.from_bytes(lp[p + 1:p + 1 + w], "little", signed=True), w + 2


# ---------------------------------------------------------------- header

def lp_new() -> bytearray:
    """An empty listpack: header (7 bytes, 0 elements) and the terminator."""
    return bytearray(_EMPTY)


def lp_bytes(lp) -> int:
    """Total bytes, as recorded in the header."""
    return _HDR.unpack_from(lp, 0)[0]


def lp_length(lp) -> int:
    """Element count; scans when the header says 65535 ("unknown").

    Like redis' lpLength, a scan that finds fewer than 65535 elements writes
    the count back into the header (only possible for a bytearray)."""
    count = lp[4] | (lp[5] << 8)
    if count != LP_HDR_NUMELE_UNKNOWN:
        return count
    count = 0
    p = lp_first(lp)
    while p != -1:
        count += 1
        p = lp_next(lp, p)
    if count < LP_HDR_NUMELE_UNKNOWN and isinstance(lp, bytearray):
        lp[4] = count & 0xFF
        lp[5] = count >> 8
    return count


def lp_safe_to_add(lp, add: int) -> bool:
    """redis' lpSafeToAdd: would `add` more bytes keep the listpack <= 1 GiB?"""
    size = lp_bytes(lp) if lp is not None else 0
    return size + add <= LISTPACK_MAX_SAFETY_SIZE


def _grow_header(lp: bytearray, delta_bytes: int, delta_count: int) -> None:
    """Adjust both header fields after an edit; the buffer is already edited."""
    total, count = _HDR.unpack_from(lp, 0)
    total += delta_bytes
    invariant(total == len(lp), "listpack header total %d != buffer %d" % (total, len(lp)))
    invariant(total <= _UINT32_MAX, "listpack larger than 4 GiB")
    if count != LP_HDR_NUMELE_UNKNOWN:
        count += delta_count
        invariant(count >= 0, "listpack element count below zero")
        if count > LP_HDR_NUMELE_UNKNOWN:
            count = LP_HDR_NUMELE_UNKNOWN
    _HDR.pack_into(lp, 0, total, count)


# ---------------------------------------------------------------- appending

def lp_append(lp: bytearray, ele) -> None:
    """Append one element (redis lpAppend / lpAppendInteger)."""
    enc = lp_encode(ele)
    total, count = _HDR.unpack_from(lp, 0)
    if total != len(lp):
        invariant(False, "listpack header total %d != buffer %d" % (total, len(lp)))
    total += len(enc)
    if total > _UINT32_MAX:
        invariant(False, "listpack larger than 4 GiB")
    lp[-1:] = enc
    lp.append(LP_EOF)
    if count < 0xFFFE:
        count += 1
    else:
        count = LP_HDR_NUMELE_UNKNOWN  # 65534 + 1 becomes "unknown", as in redis
    _HDR.pack_into(lp, 0, total, count)


def lp_append_many(lp: bytearray, eles) -> None:
    """Append several elements with one buffer extend and one header update."""
    encs = [lp_encode(e) for e in eles]
    if not encs:
        return
    blob = b"".join(encs)
    invariant(lp[-1] == LP_EOF, "listpack without terminator")
    lp[-1:] = blob
    lp.append(LP_EOF)
    _grow_header(lp, len(blob), len(encs))


def lp_append_entries(lp: bytearray, head: bytes, eles, start: int, step: int, tail: bytes,
                      added: int) -> None:
    """Append `head`, then lp_encode(e) for e in eles[start::step], then `tail`
    before the terminator, and count `added` elements in the header (`head`
    and `tail` are already-encoded entries). One stream entry in one buffer
    edit: XADD's hot path. The count saturates at 65535 ("unknown"), as in
    redis. Has a compiled twin (_listpack_c); this is the reference."""
    blob = b"".join([head, *map(_lp_encode_py, eles[start::step]), tail])
    count = _HDR.unpack_from(lp, 0)[1]
    if len(lp) + len(blob) > _UINT32_MAX:
        invariant(False, "listpack over 4 GiB")
    lp[-1:] = blob
    lp.append(LP_EOF)
    if count != LP_HDR_NUMELE_UNKNOWN:
        count = min(count + added, LP_HDR_NUMELE_UNKNOWN)
    _HDR.pack_into(lp, 0, len(lp), count)


# ---------------------------------------------------------------- navigation

def lp_first(lp) -> int:
    """Offset of the first entry, -1 if the listpack is empty."""
    return -1 if lp[LP_HDR_SIZE] == LP_EOF else LP_HDR_SIZE


def lp_last(lp) -> int:
    """Offset of the last entry, -1 if the listpack is empty."""
    return lp_prev(lp, len(lp) - 1)


def lp_next(lp, p: int) -> int:
    """Offset of the entry after `p`, -1 if `p` is the last one."""
    q = p + _entry_size(lp, p)
    return -1 if lp[q] == LP_EOF else q


def lp_prev(lp, p: int) -> int:
    """Offset of the entry before `p` (an entry or the terminator), -1 at the head."""
    if p <= LP_HDR_SIZE:
        return -1
    b = lp[p - 1]
    if b < 128:                      # 1-byte back-length: entry of <= 127 bytes
        return p - b - 1
    length = _decode_backlen(lp, p - 1)
    q = p - length - _backlen_size(length)
    if q < LP_HDR_SIZE:
        raise CorruptListpack("back-length points before the header")
    return q


def lp_seek(lp, index: int) -> int:
    """Offset of element `index` (negative counts from the tail), -1 if out of range.

    Walks from whichever end is nearer, as redis' lpSeek does."""
    count = lp[4] | (lp[5] << 8)
    forward = True
    if count != LP_HDR_NUMELE_UNKNOWN:
        if index < 0:
            index += count
        if index < 0 or index >= count:
            return -1
        if index > count // 2:
            forward = False
            index -= count
    elif index < 0:
        forward = False
    if forward:
        p = lp_first(lp)
        while index > 0 and p != -1:
            p = lp_next(lp, p)
            index -= 1
        return p
    p = lp_last(lp)
    while index < -1 and p != -1:
        p = lp_prev(lp, p)
        index += 1
    return p


# ---------------------------------------------------------------- reading

def lp_get(lp, p: int):
    """The element at `p`: int for integer encodings, bytes for strings."""
    return _get(lp, p)[0]


def lp_get_bytes(lp, p: int) -> bytes:
    """The element at `p` as a client sees it: integers as decimal bytes."""
    v = _get(lp, p)[0]
    return b"%d" % v if v.__class__ is int else v


def lp_get_int(lp, p: int) -> int:
    """The element at `p` as an integer (redis' lpGetInteger).

    A string element must spell an int64 canonically; anything else means the
    buffer does not hold what its writer put there, so CorruptListpack."""
    v = _get(lp, p)[0]
    if v.__class__ is int:
        return v
    iv = string_to_int64(v)
    if iv is None:
        raise CorruptListpack("listpack element at offset %d is not an integer" % p)
    return iv


def lp_compare(lp, p: int, s: bytes) -> bool:
    """redis' lpCompare: does the element at `p` read as exactly `s`?"""
    return lp_get_bytes(lp, p) == s


def lp_get_with_next(lp, p: int):
    """(element at `p`, offset of the next entry or -1): one decode per step."""
    b = lp[p]
    if b < 0x80:
        q = p + 2
        v = b
    elif b < 0xC0:
        n = b & 0x3F
        q = p + 1 + n
        v = bytes(lp[p + 1:q])
        q += 1
    else:
        v, size = _get(lp, p)
        q = p + size
    return v, (-1 if lp[q] == LP_EOF else q)


def lp_iter(lp, p: int = None, reverse: bool = False):
    """Yield the elements from `p` (default: the first, or last if reverse).

    Forward iteration reads a snapshot taken when it starts."""
    if p is None:
        p = lp_last(lp) if reverse else lp_first(lp)
    if reverse:
        while p != -1:
            yield _get(lp, p)[0]
            p = lp_prev(lp, p)
        return
    if p == -1:
        return
    buf = bytes(lp) if lp.__class__ is not bytes else lp
    while buf[p] != LP_EOF:
        v, size = _get(buf, p)
        yield v
        p += size


def lp_decode_all(lp) -> list:
    """Every element, first to last (the XRANGE hot path)."""
    buf = lp if lp.__class__ is bytes else bytes(lp)
    out = []
    append = out.append
    p = LP_HDR_SIZE
    int_width = _INT_WIDTH
    from_bytes = int.from_bytes
    while True:
        b = buf[p]
        if b < 0x80:                           # 7-bit uint
            append(b)
            p += 2
        elif b < 0xC0:                         # 6-bit string
            q = p + 1 + (b & 0x3F)
            append(buf[p + 1:q])
            p = q + 1
        elif b < 0xE0:                         # 13-bit int
            v = ((b & 0x1F) << 8) | buf[p + 1]
            append(v - 8192 if v >= 4096 else v)
            p += 3
        elif b == LP_EOF:
            return out
        elif b < 0xF0:                         # 12-bit string
            n = ((b & 0x0F) << 8) | buf[p + 1]
            append(buf[p + 2:p + 2 + n])
            p += n + (3 if n <= 125 else 4)
        elif b == 0xF0:                        # 32-bit string
            n = from_bytes(buf[p + 1:p + 5], "little")
            append(buf[p + 5:p + 5 + n])
            p += n + 5 + _backlen_size(n + 5)
        else:                                  # 16/24/32/64-bit int
            w = int_width.get(b)
            if w is None:
                raise CorruptListpack("bad encoding byte 0x%02x at offset %d" % (b, p))
            append(from_bytes(buf[p + 1:p + 1 + w], "little", signed=True))
            p += w + 2


# ---------------------------------------------------------------- editing

def _check_entry(lp, p: int) -> None:
    invariant(LP_HDR_SIZE <= p < len(lp) - 1 and lp[p] != LP_EOF,
              "offset %r is not a listpack entry" % (p,))


def lp_replace(lp: bytearray, p: int, ele) -> None:
    """Replace the element at `p` (the entry may change size)."""
    _check_entry(lp, p)
    old = _entry_size(lp, p)
    enc = lp_encode(ele)
    lp[p:p + old] = enc
    _grow_header(lp, len(enc) - old, 0)


def lp_replace_int(lp: bytearray, p: int, v: int) -> None:
    """Replace the element at `p` with the integer `v`."""
    invariant(v.__class__ is int, "lp_replace_int needs an int")
    lp_replace(lp, p, v)


def lp_insert(lp: bytearray, p: int, ele, after: bool) -> int:
    """Insert before or after the entry at `p`; returns the new entry's offset.

    With after=False, `p` may also be the terminator's offset (append)."""
    if after:
        _check_entry(lp, p)
        p += _entry_size(lp, p)
    else:
        invariant(LP_HDR_SIZE <= p < len(lp), "offset %r outside the listpack" % (p,))
    enc = lp_encode(ele)
    lp[p:p] = enc
    _grow_header(lp, len(enc), 1)
    return p


def lp_delete(lp: bytearray, p: int) -> int:
    """Delete the entry at `p`; returns the offset of the following entry or -1."""
    _check_entry(lp, p)
    size = _entry_size(lp, p)
    del lp[p:p + size]
    _grow_header(lp, -size, -1)
    return -1 if lp[p] == LP_EOF else p


def lp_delete_range(lp: bytearray, index: int, count: int) -> None:
    """Delete up to `count` elements starting at element `index` (lpDeleteRange)."""
    invariant(count >= 0, "negative delete count")
    if count == 0:
        return
    p = lp_seek(lp, index)
    if p == -1:
        return
    numele = lp[4] | (lp[5] << 8)
    if numele != LP_HDR_NUMELE_UNKNOWN:
        if index < 0:
            index += numele
        if numele - index <= count:          # everything from p on goes
            del lp[p:]
            lp.append(LP_EOF)
            _HDR.pack_into(lp, 0, len(lp), index)
            return
    q = p
    deleted = 0
    while deleted < count and lp[q] != LP_EOF:
        q += _entry_size(lp, q)
        deleted += 1
    del lp[p:q]
    _grow_header(lp, p - q, -deleted)


# ---------------------------------------------------------------- validation

def lp_validate(buf, deep: bool = True, max_bytes: int = LISTPACK_MAX_SAFETY_SIZE) -> None:
    """Raise CorruptListpack unless `buf` is a well-formed listpack.

    Checks what redis' lpValidateIntegrity + lpValidateNext check: header
    total == len(buf), terminator last, and (deep) every entry's encoding and
    lengths inside the buffer, its back-length matching its forward length,
    the entries ending exactly at the terminator, and the header count (unless
    65535) equal to the number of entries.  Stricter than redis in one way:
    the back-length bytes must be exactly the ones redis writes (redis only
    compares the decoded value), and len(buf) must not exceed `max_bytes`.
    Never raises anything but CorruptListpack.
    """
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise CorruptListpack("listpack must be bytes, not %s" % type(buf).__name__)
    try:
        data = bytes(buf)
    except (TypeError, ValueError, BufferError) as exc:
        raise CorruptListpack("unreadable listpack buffer: %s" % exc) from None
    size = len(data)
    if size < LP_HDR_SIZE + 1:
        raise CorruptListpack("listpack of %d bytes is shorter than its header" % size)
    if size > max_bytes:
        raise CorruptListpack("listpack of %d bytes exceeds the %d limit" % (size, max_bytes))
    total, numele = _HDR.unpack_from(data, 0)
    if total != size:
        raise CorruptListpack("header says %d bytes, buffer has %d" % (total, size))
    end = size - 1
    if data[end] != LP_EOF:
        raise CorruptListpack("listpack does not end with 0xFF")
    if not deep:
        return
    p = LP_HDR_SIZE
    count = 0
    while p < end:
        b = data[p]
        # Forward length: encoding byte(s) + data; `head` = encoding bytes
        # that must be readable before the length is known.
        if b < 0x80:
            head, length = 1, 1
        elif b < 0xC0:
            head, length = 1, 1 + (b & 0x3F)
        elif b < 0xE0:
            head, length = 1, 2
        elif b < 0xF0:
            head = 2
            if p + head > end:
                raise CorruptListpack("entry length at %d runs past the end" % p)
            length = 2 + (((b & 0x0F) << 8) | data[p + 1])
        elif b == 0xF0:
            head = 5
            if p + head > end:
                raise CorruptListpack("entry length at %d runs past the end" % p)
            length = 5 + int.from_bytes(data[p + 1:p + 5], "little")
        elif b <= 0xF4:
            head, length = 1, _INT_ENTRY_SIZE[b] - 1
        elif b == LP_EOF:
            raise CorruptListpack("terminator at offset %d before the end" % p)
        else:
            raise CorruptListpack("bad encoding byte 0x%02x at offset %d" % (b, p))
        if p + head > end:
            raise CorruptListpack("entry at %d runs past the end" % p)
        bl = _backlen_size(length)
        q = p + length + bl
        if q > end:
            raise CorruptListpack("entry at %d runs past the end" % p)
        if data[q - bl:q] != _backlen(length):
            raise CorruptListpack("back-length of entry at %d does not match" % p)
        p = q
        count += 1
    if numele != LP_HDR_NUMELE_UNKNOWN and numele != count:
        raise CorruptListpack("header says %d elements, found %d" % (numele, count))


# ---------------------------------------------------------------- compiled kernels
# The pure functions above are the reference; the compiled twins (Cython,
# node/engine/_listpack_c.pyx, built by `pip install`) replace them here unless
# XRAFT_PURE=1 or the build had no C compiler. tests/kernels prove them equal.
PURE_KERNELS = {"lp_encode": lp_encode, "lp_append_entries": lp_append_entries}
_compiled = compiled("xraft.node.engine._listpack_c")
if _compiled is not None:
    lp_encode = _compiled.lp_encode
    lp_append_entries = _compiled.lp_append_entries
