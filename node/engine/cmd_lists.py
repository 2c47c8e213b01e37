"""List commands with redis-server 7.0 semantics (src/t_list.c), blocking forms included.

Argument checks run in the order redis runs them, so the same bad command gets
the same error (e.g. LRANGE parses its indexes before looking the key up,
LINDEX looks the key up first). A blocking form with nothing to serve returns
`replies.WouldBlock` instead of blocking; the server parks the client and
re-runs the command when a key is signalled ready.
"""
from fractions import Fraction

from . import replies
from .cmd_keys import c_string, is_option
from .commands import BLOCKING, INTERNAL, READONLY, WRITE, command
from .errors import NO_SUCH_KEY, CommandError, not_integer, syntax_error, wrong_arity
from .lists import ListValue
from .streamid import string2ll

_LONG_MAX = (1 << 63) - 1
OUT_OF_RANGE = "ERR index out of range"
RANK_ZERO = ("ERR RANK can't be zero: use 1 to start from the first match, 2 from the "
             "second ... or use negative to start from the end of the list")

HEAD, TAIL = "left", "right"


# -- argument parsing (redis object.c getLongFromObjectOrReply & co) ----------

def long_arg(arg: bytes) -> int:
    v = string2ll(arg)
    if v is None:
        raise not_integer()
    return v


def range_long_arg(arg: bytes, lo: int, hi: int, msg: str) -> int:
    """getRangeLongFromObjectOrReply with a message: that message for both a
    non-number and a number out of range."""
    v = string2ll(arg)
    if v is None or v < lo or v > hi:
        raise CommandError("ERR " + msg)
    return v


def positive_long_arg(arg: bytes, msg: str = "value is out of range, must be positive") -> int:
    return range_long_arg(arg, 0, _LONG_MAX, msg)


def where_arg(arg: bytes) -> str:
    """LEFT or RIGHT (getListPositionFromObjectOrReply)."""
    if is_option(arg, b"left"):
        return HEAD
    if is_option(arg, b"right"):
        return TAIL
    raise syntax_error()


# -- blocking timeouts (redis timeout.c getTimeoutFromObjectOrReply, seconds) --
#
# redis reads the timeout with strtold into an x87 80-bit long double (64-bit
# significand), computes ceill(t * 1000.0) in long double and casts it to long
# long; an out-of-range cast yields LLONG_MIN on x86, hence "timeout is
# negative" for huge or infinite values. We redo that arithmetic exactly with
# Fractions so that replicas agree with redis and with each other.

TIMEOUT_NOT_FLOAT = "ERR timeout is not a float or out of range"
TIMEOUT_NEGATIVE = "ERR timeout is negative"
_MAX_LONG_DOUBLE_CHARS = 5 * 1024
_LD_MANT = 64                     # significand bits
_LD_MIN_EXP = -16382              # smallest normal exponent
_LD_MAX_EXP = 16384               # values >= 2**16384 overflow
_LD_TINY = Fraction(1, 1 << (-_LD_MIN_EXP + _LD_MANT - 1))   # denormal step 2**-16445


def _round_long_double(x: Fraction):
    """x rounded to the nearest long double (ties to even); None on overflow."""
    if x == 0:
        return x
    sign = -1 if x < 0 else 1
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1                    # now 2**e <= a < 2**(e+1)
    step = Fraction(2) ** (e - _LD_MANT + 1) if e >= _LD_MIN_EXP else _LD_TINY
    q = a / step
    n = q.numerator // q.denominator
    rem = q - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    r = n * step
    if r >= Fraction(2) ** _LD_MAX_EXP:
        return None
    return sign * r


def _strtold_prefix(s: bytes):
    """C strtold on `s` (no leading blank): (value, chars consumed, range_error).
    value is a Fraction, float('inf') / float('nan') for those spellings."""
    i, n = 0, len(s)
    sign = 1
    if i < n and s[i] in b"+-":
        sign = -1 if s[i] == 0x2D else 1
        i += 1
    low = s[i:].lower()
    if low.startswith(b"inf"):
        return sign * float("inf"), i + (8 if low.startswith(b"infinity") else 3), False
    if low.startswith(b"nan"):
        return float("nan"), i + 3, False
    hexa = low.startswith(b"0x") and len(low) > 2 and (chr(low[2]) in "0123456789abcdef"
                                                      or (low[2:3] == b"." and low[3:4] and
                                                          chr(low[3]) in "0123456789abcdef"))
    digits = "0123456789abcdef" if hexa else "0123456789"
    j = i + 2 if hexa else i
    mant, frac_digits, seen = 0, 0, False
    while j < n and chr(s[j]).lower() in digits:
        mant = mant * len(digits) + int(chr(s[j]), 16)
        j, seen = j + 1, True
    if j < n and s[j] == 0x2E:  # '.'
        j += 1
        while j < n and chr(s[j]).lower() in digits:
            mant = mant * len(digits) + int(chr(s[j]), 16)
            j, seen, frac_digits = j + 1, True, frac_digits + 1
    if not seen:
        return None, 0, False
    exp = 0
    marker = b"p" if hexa else b"e"
    if j < n and s[j:j + 1].lower() == marker:
        k = j + 1
        esign = 1
        if k < n and s[k] in b"+-":
            esign = -1 if s[k] == 0x2D else 1
            k += 1
        if k < n and 0x30 <= s[k] <= 0x39:
            m = k
            while m < n and 0x30 <= s[m] <= 0x39:
                m += 1
            edigits = s[k:m].lstrip(b"0") or b"0"
            exp = esign * (int(edigits) if len(edigits) <= 12 else 10 ** 12)  # saturates
            j = m
    if mant == 0:
        return Fraction(0), j, False
    if hexa:
        base, power = 2, exp - 4 * frac_digits
        top = mant.bit_length() + power              # log2 of the value is in [top-1, top)
        too_big, too_small = top - 1 >= _LD_MAX_EXP, top < _LD_MIN_EXP - _LD_MANT - 1
    else:
        base, power = 10, exp - frac_digits
        top = len(str(mant)) + power                 # log10 of the value is in [top-1, top)
        too_big, too_small = top - 1 >= 4933, top < -4952   # 2**16384 ~ 1.19e4932
    if too_big:
        return None, j, True                                    # overflow
    if too_small:
        return Fraction(0), j, True                             # underflow to 0
    exact = Fraction(mant) * Fraction(base) ** power
    value = _round_long_double(exact)
    if value is None:
        return None, j, True
    return sign * value, j, value == 0


def parse_timeout_seconds(arg: bytes) -> int:
    """A B*POP/BLMOVE timeout in seconds -> milliseconds (0 = forever)."""
    if not arg or len(arg) >= _MAX_LONG_DOUBLE_CHARS:
        raise CommandError(TIMEOUT_NOT_FLOAT)
    s = c_string(arg)
    if s[:1] in (b" ", b"\t", b"\n", b"\v", b"\f", b"\r") and s:
        raise CommandError(TIMEOUT_NOT_FLOAT)
    value, used, range_error = _strtold_prefix(s) if s else (Fraction(0), 0, False)
    if used != len(s) or range_error or value is None:
        raise CommandError(TIMEOUT_NOT_FLOAT)
    if isinstance(value, float):
        if value != value:                                      # nan
            raise CommandError(TIMEOUT_NOT_FLOAT)
        raise CommandError(TIMEOUT_NEGATIVE)                    # inf*1000 cast: LLONG_MIN
    scaled = _round_long_double(value * 1000)
    if scaled is None:
        raise CommandError(TIMEOUT_NEGATIVE)
    ms = -((-scaled.numerator) // scaled.denominator)           # ceill
    if ms < 0 or ms > _LONG_MAX:                                # (long long) overflow: LLONG_MIN
        raise CommandError(TIMEOUT_NEGATIVE)
    return ms


# -- keyspace helpers ---------------------------------------------------------

def _list_at(db, key: bytes):
    """The list at key, None if absent, WRONGTYPE if another type."""
    return db.get_typed(key, ListValue)


def _new_list(db, key: bytes) -> ListValue:
    value = ListValue(db.config.list_max_listpack_size)
    db.set(key, value)
    return value


def _push(db, key: bytes, lst: ListValue, elements, where: str) -> None:
    push = lst.push_head if where == HEAD else lst.push_tail
    for ele in elements:
        push(ele)
    if elements:
        db.signal_ready(key)


def _drop_if_empty(db, key: bytes, lst: ListValue) -> None:
    if len(lst) == 0:
        db.delete(key)


def _pop_many(lst: ListValue, where: str, count: int) -> list:
    """Up to `count` elements from one end, in pop order."""
    n = min(count, len(lst))
    if where == HEAD:
        out = lst.range(0, n - 1)
        lst.delete_range(0, n)
    else:
        out = lst.range(len(lst) - n, len(lst) - 1, reverse=True)
        lst.delete_range(len(lst) - n, n)
    return out


def _pop_one(lst: ListValue, where: str) -> bytes:
    return lst.pop_head() if where == HEAD else lst.pop_tail()


# -- pushes -------------------------------------------------------------------

def _push_command(db, argv, where: str, only_existing: bool):
    key = argv[1]
    lst = _list_at(db, key)
    if lst is None:
        if only_existing:
            return 0
        lst = _new_list(db, key)
    _push(db, key, lst, argv[2:], where)
    return len(lst)


@command("lpush", -3, (WRITE,))
def cmd_lpush(db, argv, now_ms):
    return _push_command(db, argv, HEAD, False)


@command("rpush", -3, (WRITE,))
def cmd_rpush(db, argv, now_ms):
    return _push_command(db, argv, TAIL, False)


@command("lpushx", -3, (WRITE,))
def cmd_lpushx(db, argv, now_ms):
    return _push_command(db, argv, HEAD, True)


@command("rpushx", -3, (WRITE,))
def cmd_rpushx(db, argv, now_ms):
    return _push_command(db, argv, TAIL, True)


@command("linsert", 5, (WRITE,))
def cmd_linsert(db, argv, now_ms):
    if is_option(argv[2], b"after"):
        after = True
    elif is_option(argv[2], b"before"):
        after = False
    else:
        raise syntax_error()
    lst = _list_at(db, argv[1])
    if lst is None:
        return 0
    pivot = argv[3]
    for index, ele in enumerate(lst):
        if ele == pivot:
            lst.insert(index, argv[4], after)
            return len(lst)
    return -1


# -- reads --------------------------------------------------------------------

@command("llen", 2, (READONLY,))
def cmd_llen(db, argv, now_ms):
    lst = _list_at(db, argv[1])
    return 0 if lst is None else len(lst)


@command("lindex", 3, (READONLY,))
def cmd_lindex(db, argv, now_ms):
    lst = _list_at(db, argv[1])
    if lst is None:
        return None
    return lst.get(long_arg(argv[2]))


def _clip_range(start: int, end: int, llen: int):
    """redis addListRangeReply index rules: (start, end) inclusive, or None if empty."""
    if start < 0:
        start += llen
    if end < 0:
        end += llen
    if start < 0:
        start = 0
    if start > end or start >= llen:
        return None
    return start, min(end, llen - 1)


@command("lrange", 4, (READONLY,))
def cmd_lrange(db, argv, now_ms):
    start, end = long_arg(argv[2]), long_arg(argv[3])
    lst = _list_at(db, argv[1])
    if lst is None:
        return []
    clipped = _clip_range(start, end, len(lst))
    return [] if clipped is None else lst.range(*clipped)


@command("lpos", -3, (READONLY,))
def cmd_lpos(db, argv, now_ms):
    rank, count, maxlen = 1, -1, 0          # count -1: option not given
    j = 3
    while j < len(argv):
        more = len(argv) - 1 - j
        if is_option(argv[j], b"rank") and more:
            j += 1
            rank = long_arg(argv[j])
            if rank == 0:
                raise CommandError(RANK_ZERO)
        elif is_option(argv[j], b"count") and more:
            j += 1
            count = positive_long_arg(argv[j], "COUNT can't be negative")
        elif is_option(argv[j], b"maxlen") and more:
            j += 1
            maxlen = positive_long_arg(argv[j], "MAXLEN can't be negative")
        else:
            raise syntax_error()
        j += 1
    from_tail = rank < 0
    if from_tail:
        # C's `rank = -rank` on a long: LONG_MIN stays LONG_MIN (still < 1, so
        # every match qualifies), which redis 7.0 does too.
        rank = -rank if rank > -(1 << 63) else rank
    lst = _list_at(db, argv[1])
    if lst is None:
        return [] if count != -1 else None
    llen = len(lst)
    found = []
    matches = 0
    it = lst.iter_from(llen - 1, reverse=True) if from_tail else iter(lst)
    for scanned, ele in enumerate(it):
        if maxlen and scanned >= maxlen:
            break
        if ele != argv[2]:
            continue
        matches += 1
        if matches < rank:
            continue
        found.append(llen - scanned - 1 if from_tail else scanned)
        if count == -1 or (count and matches - rank + 1 >= count):
            break
    if count != -1:
        return found
    return found[0] if found else None


# -- edits --------------------------------------------------------------------

@command("lset", 4, (WRITE,))
def cmd_lset(db, argv, now_ms):
    lst = _list_at(db, argv[1])
    if lst is None:
        raise CommandError(NO_SUCH_KEY)
    if not lst.replace(long_arg(argv[2]), argv[3]):
        raise CommandError(OUT_OF_RANGE)
    return replies.OK


@command("lrem", 4, (WRITE,))
def cmd_lrem(db, argv, now_ms):
    toremove = long_arg(argv[2])
    lst = _list_at(db, argv[1])
    if lst is None:
        return 0
    limit = -toremove if toremove < 0 else toremove
    removed = lst.remove(argv[3], limit, from_tail=toremove < 0)
    _drop_if_empty(db, argv[1], lst)
    return removed


@command("ltrim", 4, (WRITE,))
def cmd_ltrim(db, argv, now_ms):
    start, end = long_arg(argv[2]), long_arg(argv[3])
    lst = _list_at(db, argv[1])
    if lst is None:
        return replies.OK
    llen = len(lst)
    clipped = _clip_range(start, end, llen)
    if clipped is None:
        db.delete(argv[1])
        return replies.OK
    start, end = clipped
    lst.delete_range(end + 1, llen - end - 1)
    lst.delete_range(0, start)
    _drop_if_empty(db, argv[1], lst)
    return replies.OK


# -- pops ---------------------------------------------------------------------

def _pop_command(db, argv, where: str):
    if len(argv) > 3:
        raise wrong_arity("lpop" if where == HEAD else "rpop")
    has_count = len(argv) == 3
    count = positive_long_arg(argv[2]) if has_count else 0
    lst = _list_at(db, argv[1])
    if lst is None:
        return replies.NULL_ARRAY if has_count else None
    if has_count and count == 0:
        return []
    if not has_count:
        ele = _pop_one(lst, where)
        _drop_if_empty(db, argv[1], lst)
        return ele
    out = _pop_many(lst, where, count)
    _drop_if_empty(db, argv[1], lst)
    return out


@command("lpop", -2, (WRITE,))
def cmd_lpop(db, argv, now_ms):
    return _pop_command(db, argv, HEAD)


@command("rpop", -2, (WRITE,))
def cmd_rpop(db, argv, now_ms):
    return _pop_command(db, argv, TAIL)


def _move(db, src: bytes, dst: bytes, wherefrom: str, whereto: str):
    """lmoveGenericCommand: None if src is absent."""
    slist = _list_at(db, src)
    if slist is None:
        return None
    dlist = _list_at(db, dst)
    ele = _pop_one(slist, wherefrom)
    if dlist is None:
        dlist = _new_list(db, dst)
    _push(db, dst, dlist, [ele], whereto)
    _drop_if_empty(db, src, slist)
    return ele


@command("lmove", 5, (WRITE,), 1, 2, 1)
def cmd_lmove(db, argv, now_ms):
    wherefrom, whereto = where_arg(argv[3]), where_arg(argv[4])
    return _move(db, argv[1], argv[2], wherefrom, whereto)


@command("rpoplpush", 3, (WRITE,), 1, 2, 1)
def cmd_rpoplpush(db, argv, now_ms):
    return _move(db, argv[1], argv[2], TAIL, HEAD)


def _parse_mpop(argv, numkeys_idx: int):
    """LMPOP/BLMPOP: numkeys, keys, LEFT|RIGHT, [COUNT n] -> (keys, where, count)."""
    numkeys = range_long_arg(argv[numkeys_idx], 1, _LONG_MAX, "numkeys should be greater than 0")
    where_idx = numkeys_idx + numkeys + 1
    if where_idx >= len(argv):
        raise syntax_error()
    where = where_arg(argv[where_idx])
    count = -1
    j = where_idx + 1
    while j < len(argv):
        more = len(argv) - 1 - j
        if count == -1 and is_option(argv[j], b"count") and more:
            j += 1
            count = range_long_arg(argv[j], 1, _LONG_MAX, "count should be greater than 0")
        else:
            raise syntax_error()
        j += 1
    return argv[numkeys_idx + 1:where_idx], where, (1 if count == -1 else count)


def _mpop_serve(db, keys, where: str, count: int):
    """[key, [elements]] from the first non-empty list, None if every list is empty."""
    for key in keys:
        lst = _list_at(db, key)
        if lst is None:
            continue
        out = _pop_many(lst, where, count)
        _drop_if_empty(db, key, lst)
        return [key, out]
    return None


@command("lmpop", -4, (WRITE,), 0, 0, 0)
def cmd_lmpop(db, argv, now_ms):
    keys, where, count = _parse_mpop(argv, 1)
    served = _mpop_serve(db, keys, where, count)
    return replies.NULL_ARRAY if served is None else served


# -- blocking forms -----------------------------------------------------------

def _blocking_pop(db, argv, where: str):
    timeout_ms = parse_timeout_seconds(argv[-1])
    for key in argv[1:-1]:
        lst = _list_at(db, key)
        if lst is None:
            continue
        ele = _pop_one(lst, where)
        _drop_if_empty(db, key, lst)
        return [key, ele]
    return replies.WouldBlock(argv[1:-1], timeout_ms, argv, replies.NULL_ARRAY)


@command("blpop", -3, (WRITE, BLOCKING), 1, -2, 1)
def cmd_blpop(db, argv, now_ms):
    return _blocking_pop(db, argv, HEAD)


@command("brpop", -3, (WRITE, BLOCKING), 1, -2, 1)
def cmd_brpop(db, argv, now_ms):
    return _blocking_pop(db, argv, TAIL)


def _blocking_move(db, argv, wherefrom: str, whereto: str, timeout_arg: bytes):
    timeout_ms = parse_timeout_seconds(timeout_arg)
    if _list_at(db, argv[1]) is None:
        # On timeout redis replies a null array here too (replyToBlockedClientTimedOut).
        return replies.WouldBlock([argv[1]], timeout_ms, argv, replies.NULL_ARRAY)
    return _move(db, argv[1], argv[2], wherefrom, whereto)


@command("blmove", 6, (WRITE, BLOCKING), 1, 2, 1)
def cmd_blmove(db, argv, now_ms):
    wherefrom, whereto = where_arg(argv[3]), where_arg(argv[4])
    return _blocking_move(db, argv, wherefrom, whereto, argv[5])


@command("brpoplpush", 4, (WRITE, BLOCKING), 1, 2, 1)
def cmd_brpoplpush(db, argv, now_ms):
    return _blocking_move(db, argv, TAIL, HEAD, argv[3])


@command("blmpop", -5, (WRITE, BLOCKING), 0, 0, 0)
def cmd_blmpop(db, argv, now_ms):
    keys, where, count = _parse_mpop(argv, 2)
    timeout_ms = parse_timeout_seconds(argv[1])
    served = _mpop_serve(db, keys, where, count)
    if served is None:
        return replies.WouldBlock(keys, timeout_ms, argv, replies.NULL_ARRAY)
    return served


# -- a blocked client, woken --------------------------------------------------
#
# The server's retries of a blocked pop or move (fsm/blocking.py proposes them;
# no client can send them: commands.INTERNAL). redis serves a woken list
# waiter only from keys that hold a list at that moment (handleClientsBlockedOnKeys
# calls serveClientsBlockedOnListKey for OBJ_LIST only), so a key that became
# another type while the client waited is skipped, where the plain command
# would fail with WRONGTYPE. A destination of another type still fails the
# move, as in redis (serveClientBlockedOnList's checkType).

def _lists_only(db, keys) -> list:
    return [key for key in keys if type(db.get(key)) is ListValue]


@command("lpop-woken", 2, (WRITE, INTERNAL))
def lpop_woken(db, argv, now_ms):
    return _pop_command(db, argv, HEAD) if _lists_only(db, argv[1:]) else None


@command("rpop-woken", 2, (WRITE, INTERNAL))
def rpop_woken(db, argv, now_ms):
    return _pop_command(db, argv, TAIL) if _lists_only(db, argv[1:]) else None


@command("lmpop-woken", -4, (WRITE, INTERNAL), 0, 0, 0)
def lmpop_woken(db, argv, now_ms):
    keys, where, count = _parse_mpop(argv, 1)
    served = _mpop_serve(db, _lists_only(db, keys), where, count)
    return replies.NULL_ARRAY if served is None else served


@command("lmove-woken", 5, (WRITE, INTERNAL), 1, 2, 1)
def lmove_woken(db, argv, now_ms):
    wherefrom, whereto = where_arg(argv[3]), where_arg(argv[4])
    if not _lists_only(db, argv[1:2]):
        return None
    return _move(db, argv[1], argv[2], wherefrom, whereto)
