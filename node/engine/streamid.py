"""Stream IDs: `<ms>-<seq>`, two unsigned 64-bit integers, ordered as a pair.

On disk and as rax keys an ID is 16 bytes, both halves big-endian, so byte order
is ID order:

    +----------------------+----------------------+
    | ms  (u64, big-endian) | seq (u64, big-endian) |
    +----------------------+----------------------+

Parsing follows redis 7.0 `streamParseID()` exactly, quirks included: a part is
accepted if `string2ll` reads it as a non-negative integer, or else if C's
`strtoull` consumes all of it (so leading blanks, a '+' sign and leading zeros
pass, and in the sequence part even " -5" wraps around as strtoull does).
"""
from typing import NamedTuple

from .errors import INVALID_STREAM_ID, CommandError

UINT64_MAX = (1 << 64) - 1
_INT64_MAX = (1 << 63) - 1
_C_SPACE = b" \t\n\v\f\r"
_MAX_ID_TEXT = 127  # redis parses into a 128-byte buffer


class StreamID(NamedTuple):
    ms: int   # Invariant: 0 <= ms <= UINT64_MAX
    seq: int  # Invariant: 0 <= seq <= UINT64_MAX

    def __bytes__(self) -> bytes:
        return b"%d-%d" % (self.ms, self.seq)

    def encode(self) -> bytes:
        """The 16-byte big-endian key form."""
        return self.ms.to_bytes(8, "big") + self.seq.to_bytes(8, "big")

    @staticmethod
    def decode(key: bytes) -> "StreamID":
        return StreamID(int.from_bytes(key[:8], "big"), int.from_bytes(key[8:16], "big"))

    def incr(self):
        """The next ID, or None past the largest (redis streamIncrID fails)."""
        if self.seq < UINT64_MAX:
            return StreamID(self.ms, self.seq + 1)
        if self.ms < UINT64_MAX:
            return StreamID(self.ms + 1, 0)
        return None

    def decr(self):
        """The previous ID, or None before 0-0 (redis streamDecrID fails)."""
        if self.seq > 0:
            return StreamID(self.ms, self.seq - 1)
        if self.ms > 0:
            return StreamID(self.ms - 1, UINT64_MAX)
        return None


MIN_ID = StreamID(0, 0)
MAX_ID = StreamID(UINT64_MAX, UINT64_MAX)


def format_id(sid) -> bytes:
    return b"%d-%d" % (sid[0], sid[1])


def string2ll(s: bytes):
    """redis util.c string2ll: strict decimal int64, no blanks, no '+', no leading zeros."""
    n = len(s)
    if n == 0 or n > 20:
        return None
    if s == b"0":
        return 0
    neg = s[0] == 0x2D  # '-'
    digits = s[1:] if neg else s
    if not digits or not (0x31 <= digits[0] <= 0x39) or not digits.isdigit():
        return None
    v = int(digits)
    if neg:
        return -v if v <= _INT64_MAX + 1 else None
    return v if v <= _INT64_MAX else None


def strtoull_all(s: bytes):
    """C strtoull(s, &end, 10) that must consume the whole string; None on failure."""
    i, n = 0, len(s)
    while i < n and s[i] in _C_SPACE:
        i += 1
    neg = False
    if i < n and s[i] in b"+-":
        neg = s[i] == 0x2D
        i += 1
    j = i
    while j < n and 0x30 <= s[j] <= 0x39:
        j += 1
    if j == i:                 # no digits: EINVAL-like (endptr == s)
        return None
    if j != n:                 # trailing garbage
        return None
    v = int(s[i:j])
    if v > UINT64_MAX:         # ERANGE
        return None
    return ((1 << 64) - v) & UINT64_MAX if neg else v


def string2ull(s: bytes):
    """redis util.c string2ull."""
    ll = string2ll(s)
    if ll is not None:
        return ll if ll >= 0 else None
    return strtoull_all(s)


def parse_id(arg: bytes, missing_seq: int = 0, strict: bool = False, allow_seq_star: bool = False):
    """redis streamParseID. Returns (StreamID, seq_given); raises the Redis error.

    strict: '-' and '+' are not accepted (XADD, XDEL, XACK ...).
    missing_seq: the sequence used when the argument is just `<ms>`.
    allow_seq_star: `<ms>-*` is accepted (XADD); then seq_given is False and
        the returned seq is 0, for the caller to resolve.
    """
    if len(arg) > _MAX_ID_TEXT:
        raise CommandError(INVALID_STREAM_ID)
    dash = arg.find(b"-")
    if dash > 0:
        # Fast path (XACK sends hundreds of these): both parts all ASCII digits.
        # string2ull then yields int(part) when it fits in a uint64 (string2ll
        # or, for leading zeros or values past INT64_MAX, strtoull) and fails
        # otherwise, so int() decides alone.
        ms_part = arg[:dash]
        seq_part = arg[dash + 1:]
        if ms_part.isdigit() and seq_part.isdigit():
            ms = int(ms_part)
            seq = int(seq_part)
            if ms > UINT64_MAX or seq > UINT64_MAX:
                raise CommandError(INVALID_STREAM_ID)
            return StreamID(ms, seq), True
    if not strict and len(arg) == 1:
        if arg == b"-":
            return MIN_ID, True
        if arg == b"+":
            return MAX_ID, True
    dash = arg.find(b"-")
    ms_part = arg if dash < 0 else arg[:dash]
    ms = string2ull(ms_part)
    if ms is None:
        raise CommandError(INVALID_STREAM_ID)
    if dash < 0:
        return StreamID(ms, missing_seq), True
    seq_part = arg[dash + 1:]
    if allow_seq_star and seq_part == b"*":
        return StreamID(ms, 0), False
    seq = string2ull(seq_part)
    if seq is None:
        raise CommandError(INVALID_STREAM_ID)
    return StreamID(ms, seq), True


def parse_strict_id(arg: bytes) -> StreamID:
    """An ID where '-' / '+' are not allowed and `<ms>` alone means `<ms>-0`."""
    return parse_id(arg, 0, strict=True)[0]


def parse_strict_ids(args) -> list:
    """[parse_strict_id(a) for a in args], with parse_id's fast path inlined:
    XACK parses hundreds of IDs per call, and two calls per ID showed up."""
    out = []
    append = out.append
    for arg in args:
        ms_part, dash, seq_part = arg.partition(b"-")
        if dash and ms_part.isdigit() and seq_part.isdigit() and len(arg) <= _MAX_ID_TEXT:
            ms = int(ms_part)
            seq = int(seq_part)
            if ms <= UINT64_MAX and seq <= UINT64_MAX:
                append(StreamID(ms, seq))
                continue
        append(parse_id(arg, 0, strict=True)[0])   # every other form, and the errors
    return out
