"""Keyspace and string commands: DEL UNLINK EXISTS TYPE RENAME RENAMENX KEYS SCAN
FLUSHALL FLUSHDB DBSIZE SET GET PING ECHO, with redis-server 7.0 semantics.

xraft keeps no key expiry: SET's EX/PX/EXAT/PXAT are validated exactly as redis
does (same errors for bad numbers) and then refused with EXPIRY_UNSUPPORTED, so a
client never believes a key will vanish when it will not. KEEPTTL is accepted:
with no TTLs anywhere, "keep the TTL" is exactly a plain SET.

SCAN cursor scheme (ours, not redis's reverse-binary bucket cursor): every key
has a deterministic 32-bit position `zlib.crc32(key)`. A cursor c > 0 means
"continue with the keys whose position is >= c - 1"; 0 starts and ends an
iteration. A call takes the keys with the smallest positions at or after the
cursor, COUNT of them (always finishing every key that shares the last
position, so equal positions never straddle two calls), and returns
1 + (last position + 1) as the next cursor, or 0 when no key is left. Because
the order depends only on the key bytes, a full iteration over an unchanged
keyspace returns every key exactly once, and a key present for the whole
iteration is returned at least once even if others come and go - redis's
guarantee. The cursor is the same on every replica (no per-process hashing).
"""
import heapq
import zlib

from . import replies
from .commands import READONLY, WRITE, command
from .errors import NO_SUCH_KEY, CommandError, WrongTypeError, not_integer, syntax_error
from .streamid import string2ll

EXPIRY_UNSUPPORTED = "ERR xraft keeps no key expiry: SET EX/PX/EXAT/PXAT are not supported"
INVALID_CURSOR = "ERR invalid cursor"
INVALID_EXPIRE_SET = "ERR invalid expire time in 'set' command"

_LLONG_MAX = (1 << 63) - 1
_ULONG_MAX = (1 << 64) - 1
_C_SPACE = b" \t\n\v\f\r"
SCAN_POSITION_SPACE = 1 << 32      # crc32 values: 0 .. 2**32-1


def c_string(arg: bytes) -> bytes:
    """What C string functions (strcasecmp ...) see of an argument: up to its first NUL."""
    nul = arg.find(b"\0")
    return arg if nul < 0 else arg[:nul]


def is_option(arg: bytes, name: bytes) -> bool:
    """redis `!strcasecmp(arg, name)`: ASCII case-insensitive, stops at NUL."""
    return c_string(arg).lower() == name


# -- glob matching (redis util.c stringmatchlen, nocase = 0) -------------------

def _signed_char(b: int) -> int:
    """x86 `char` is signed: bytes >= 0x80 compare as negative in bracket ranges."""
    return b - 256 if b >= 128 else b


def _match_from(pat: bytes, p: int, s: bytes, i: int):
    """One activation of redis's matcher, starting at pattern index p and string
    index i. Returns True/False, or ("*", p) when it reaches a star (with i
    unchanged there): the driver handles stars without recursion.
    Bytes past the end of the pattern read as NUL, as C's terminator does."""
    plen, slen = len(pat), len(s)

    def at(k):
        return pat[k] if k < plen else 0

    while p < plen and i < slen:
        c = pat[p]
        if c == 0x2A:                                   # '*'
            return ("*", p, i)
        if c == 0x3F:                                   # '?'
            i += 1
        elif c == 0x5B:                                 # '['
            p += 1
            negate = at(p) == 0x5E                      # '^'
            if negate:
                p += 1
            match = False
            while True:
                left = plen - p
                if at(p) == 0x5C and left >= 2:         # '\\' escapes one byte
                    p += 1
                    if pat[p] == s[i]:
                        match = True
                elif at(p) == 0x5D:                     # ']' closes the class
                    break
                elif left == 0:                         # unterminated: stop at the end
                    p -= 1
                    break
                elif left >= 3 and pat[p + 1] == 0x2D:  # 'a-z' (either order)
                    lo, hi = _signed_char(pat[p]), _signed_char(pat[p + 2])
                    if lo > hi:
                        lo, hi = hi, lo
                    p += 2
                    if lo <= _signed_char(s[i]) <= hi:
                        match = True
                elif pat[p] == s[i]:
                    match = True
                p += 1
            if negate:
                match = not match
            if not match:
                return False
            i += 1
        else:
            if c == 0x5C and plen - p >= 2:             # '\\x' is a literal x
                p += 1
            if pat[p] != s[i]:
                return False
            i += 1
        p += 1
        if i == slen:
            while at(p) == 0x2A:
                p += 1
            break
    return p >= plen and i == slen


def glob_match(pattern: bytes, string: bytes) -> bool:
    """redis 7.0 stringmatchlen(pattern, string, nocase=0), quirks included
    (e.g. "**" does not match the empty string; "[a-]" is the range a..']').

    redis recurses at every '*' but, once the rest of the pattern fails from
    every position after a star, gives up entirely (skipLongerMatches); so only
    the innermost star ever backtracks. We keep that one star's state and
    loop, which gives the same answers with no recursion depth limit."""
    result = _match_from(pattern, 0, string, 0)
    star_p = star_i = -1
    while True:
        if result is True:
            return True
        if result is False:
            if star_p < 0:
                return False
            star_i += 1                       # let the star eat one more byte
            if star_i == len(string):
                return False
            result = _match_from(pattern, star_p + 1, string, star_i)
            continue
        _, p, i = result
        while p + 1 < len(pattern) and pattern[p + 1] == 0x2A:
            p += 1
        if p == len(pattern) - 1:             # trailing star matches the rest
            return True
        star_p, star_i = p, i                 # i < len(string) here
        result = _match_from(pattern, star_p + 1, string, star_i)


# -- generic key commands -----------------------------------------------------

@command("del", -2, (WRITE,), 1, -1, 1)
def cmd_del(db, argv, now_ms):
    return sum(1 for key in argv[1:] if db.delete(key))


@command("unlink", -2, (WRITE,), 1, -1, 1)
def cmd_unlink(db, argv, now_ms):
    return sum(1 for key in argv[1:] if db.delete(key))


@command("exists", -2, (READONLY,), 1, -1, 1)
def cmd_exists(db, argv, now_ms):
    # A key named twice counts twice, as in redis.
    return sum(1 for key in argv[1:] if db.exists(key))


@command("type", 2, (READONLY,))
def cmd_type(db, argv, now_ms):
    return replies.Status(db.type_name(argv[1]))


def _rename(db, argv, nx: bool):
    src, dst = argv[1], argv[2]
    value = db.get(src)
    if value is None:
        raise CommandError(NO_SUCH_KEY)
    if src == dst:
        return 0 if nx else replies.OK
    if db.exists(dst):
        if nx:
            return 0
        db.delete(dst)
    db.delete(src)
    db.set(dst, value)
    if db.type_name(dst) in ("list", "stream"):
        # redis dbAdd signals a key that may unblock clients.
        db.signal_ready(dst)
    return 1 if nx else replies.OK


@command("rename", 3, (WRITE,), 1, 2, 1)
def cmd_rename(db, argv, now_ms):
    return _rename(db, argv, nx=False)


@command("renamenx", 3, (WRITE,), 1, 2, 1)
def cmd_renamenx(db, argv, now_ms):
    return _rename(db, argv, nx=True)


@command("keys", 2, (READONLY,), 0, 0, 0)
def cmd_keys(db, argv, now_ms):
    # redis answers in hash-table order; we sort, so that every replica (whether
    # it replayed the log or installed a snapshot) gives the same reply.
    pattern = argv[1]
    if pattern == b"*":
        return sorted(db.data)
    return sorted(key for key in db.data if glob_match(pattern, key))


def _parse_cursor(arg: bytes) -> int:
    """redis parseScanCursorOrReply: C strtoul(arg, &end, 10) must stop at the
    string's end (its first NUL), no leading blank, no ERANGE. So "+5", "007",
    "-1" (wraps to 2**64-1) and even "" (reads as 0) are valid cursors."""
    s = c_string(arg)
    if not s:
        return 0
    if s[0] in _C_SPACE:
        raise CommandError(INVALID_CURSOR)
    neg = s[0] == 0x2D
    digits = s[1:] if s[0] in b"+-" else s
    if not digits or not digits.isdigit():
        raise CommandError(INVALID_CURSOR)
    v = int(digits)
    if v > _ULONG_MAX:
        raise CommandError(INVALID_CURSOR)
    return (-v) & _ULONG_MAX if neg else v


def _scan_position(key: bytes) -> int:
    return zlib.crc32(key)


@command("scan", -2, (READONLY,), 0, 0, 0)
def cmd_scan(db, argv, now_ms):
    cursor = _parse_cursor(argv[1])
    count, pattern, type_filter = 10, None, None
    i = 2
    while i < len(argv):
        more = len(argv) - i
        if is_option(argv[i], b"count") and more >= 2:
            count = string2ll(argv[i + 1])
            if count is None:
                raise not_integer()
            if count < 1:
                raise syntax_error()
            i += 2
        elif is_option(argv[i], b"match") and more >= 2:
            pattern = None if argv[i + 1] == b"*" else argv[i + 1]
            i += 2
        elif is_option(argv[i], b"type") and more >= 2:
            type_filter = c_string(argv[i + 1]).lower()
            i += 2
        else:
            raise syntax_error()
    start = cursor - 1 if cursor > 0 else 0
    if start >= SCAN_POSITION_SPACE:
        return [b"0", []]
    candidates = [(pos, key) for key in db.data if (pos := _scan_position(key)) >= start]
    batch = heapq.nsmallest(count, candidates)
    if len(batch) < len(candidates) and batch:
        last = batch[-1][0]
        # Finish the keys sharing the last position so none is split across calls.
        batch += sorted(c for c in candidates if c[0] == last and c not in batch)
        next_cursor = last + 2
    else:
        next_cursor = 0
    keys = []
    for _, key in batch:
        if pattern is not None and not glob_match(pattern, key):
            continue
        if type_filter is not None and db.type_name(key).encode() != type_filter:
            continue
        keys.append(key)
    return [b"%d" % next_cursor, keys]


def _flush_flags(argv):
    """FLUSHALL/FLUSHDB [ASYNC|SYNC]: both just empty the keyspace here."""
    if len(argv) > 2:
        raise syntax_error()
    if len(argv) == 2 and not (is_option(argv[1], b"sync") or is_option(argv[1], b"async")):
        raise syntax_error()


@command("flushall", -1, (WRITE,), 0, 0, 0)
def cmd_flushall(db, argv, now_ms):
    _flush_flags(argv)
    db.clear()
    return replies.OK


@command("flushdb", -1, (WRITE,), 0, 0, 0)
def cmd_flushdb(db, argv, now_ms):
    _flush_flags(argv)
    db.clear()
    return replies.OK


@command("dbsize", 1, (READONLY,), 0, 0, 0)
def cmd_dbsize(db, argv, now_ms):
    return len(db.data)


@command("ping", -1, (), 0, 0, 0)
def cmd_ping(db, argv, now_ms):
    if len(argv) > 2:
        raise CommandError("ERR wrong number of arguments for 'ping' command")
    return replies.Status("PONG") if len(argv) == 1 else argv[1]


@command("echo", 2, (), 0, 0, 0)
def cmd_echo(db, argv, now_ms):
    return argv[1]


# -- strings ------------------------------------------------------------------

def _string_at(db, key: bytes):
    value = db.get(key)
    if value is not None and type(value) is not bytes:
        raise WrongTypeError()
    return value


@command("get", 2, (READONLY,))
def cmd_get(db, argv, now_ms):
    return _string_at(db, argv[1])


_NX, _XX, _GET, _KEEPTTL, _EX, _PX, _EXAT, _PXAT = (1 << n for n in range(8))
_EXPIRY_FLAGS = _EX | _PX | _EXAT | _PXAT


def _parse_set_options(argv):
    """redis parseExtendedStringArgumentsOrReply for SET: returns (flags, expire_arg)."""
    flags, expire = 0, None
    j = 3
    while j < len(argv):
        opt = c_string(argv[j]).lower()
        has_next = j < len(argv) - 1
        if opt == b"nx" and not flags & _XX:
            flags |= _NX
        elif opt == b"xx" and not flags & _NX:
            flags |= _XX
        elif opt == b"get":
            flags |= _GET
        elif opt == b"keepttl" and not flags & _EXPIRY_FLAGS:
            flags |= _KEEPTTL
        elif opt in (b"ex", b"px", b"exat", b"pxat") and has_next \
                and not flags & (_KEEPTTL | _EXPIRY_FLAGS & ~_flag_of(opt)):
            flags |= _flag_of(opt)
            expire = (opt, argv[j + 1])
            j += 1
        else:
            raise syntax_error()
        j += 1
    return flags, expire


def _flag_of(opt: bytes) -> int:
    return {b"ex": _EX, b"px": _PX, b"exat": _EXAT, b"pxat": _PXAT}[opt]


def _check_expire(opt: bytes, arg: bytes, now_ms: int) -> None:
    """redis getExpireMillisecondsOrReply's checks, so bad input gets redis's error
    before we refuse expiry itself."""
    n = string2ll(arg)
    if n is None:
        raise not_integer()
    seconds = opt in (b"ex", b"exat")
    if n <= 0 or (seconds and n > _LLONG_MAX // 1000):
        raise CommandError(INVALID_EXPIRE_SET)
    ms = n * 1000 if seconds else n
    if opt in (b"ex", b"px") and ms + now_ms > _LLONG_MAX:
        raise CommandError(INVALID_EXPIRE_SET)


@command("set", -3, (WRITE,))
def cmd_set(db, argv, now_ms):
    key, value = argv[1], argv[2]
    flags, expire = _parse_set_options(argv)
    if expire is not None:
        _check_expire(expire[0], expire[1], now_ms)
        raise CommandError(EXPIRY_UNSUPPORTED)
    old = _string_at(db, key) if flags & _GET else None
    found = db.exists(key)
    if (flags & _NX and found) or (flags & _XX and not found):
        return old if flags & _GET else None
    db.set(key, value)
    return old if flags & _GET else replies.OK
