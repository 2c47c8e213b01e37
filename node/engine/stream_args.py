"""Argument parsing and reply helpers shared by the stream command families.

Both `cmd_streams.py` (XADD, XRANGE, XREAD, ...) and the consumer-group
commands (XREADGROUP, XPENDING, XAUTOCLAIM, ...) parse the same kinds of
arguments as redis 7.0's t_stream.c does; the rules live here once so that the
two families reject the same inputs with the same error text.

Everything here is pure parsing: nothing touches the keyspace except
`lookup_stream`, which only reads.
"""
from dataclasses import dataclass, field

from .errors import NOT_INTEGER, CommandError, syntax_error
from .stream import Stream
from .streamid import MAX_ID, format_id, parse_id, string2ll

# An XREAD/XREADGROUP that blocks without COUNT is served at most this many
# entries per stream when it wakes up (redis XREAD_BLOCKED_DEFAULT_COUNT).
XREAD_BLOCKED_DEFAULT_COUNT = 1000


# -- integers -----------------------------------------------------------------

def parse_int(arg: bytes, message: str = NOT_INTEGER) -> int:
    """A signed 64-bit integer as redis getLongLongFromObjectOrReply reads it
    (strict: no blanks, no '+', no leading zeros); else CommandError(message)."""
    value = string2ll(arg)
    if value is None:
        raise CommandError(message)
    return value


def parse_count(arg: bytes) -> int:
    """The COUNT of XRANGE/XREAD/XPENDING: any int64, negatives read as 0.

    What 0 means is the caller's business (XRANGE: empty reply; XREAD: no limit)."""
    return max(parse_int(arg), 0)


def parse_timeout_ms(arg: bytes) -> int:
    """A BLOCK <milliseconds> argument: relative, >= 0, 0 = forever."""
    value = parse_int(arg, "ERR timeout is not an integer or out of range")
    if value < 0:
        raise CommandError("ERR timeout is negative")
    return value


# -- IDs ----------------------------------------------------------------------

def parse_range_id(arg: bytes, missing_seq: int):
    """One end of an XRANGE-style interval: (StreamID, exclusive).

    `-`/`+` are the extreme IDs; `<ms>` alone gets `missing_seq`; a leading
    `(` (with something after it) makes the bound exclusive and then `-`/`+`
    are not accepted (redis streamParseIntervalIDOrReply)."""
    if len(arg) > 1 and arg[:1] == b"(":
        return parse_id(arg[1:], missing_seq, strict=True)[0], True
    return parse_id(arg, missing_seq)[0], False


def parse_interval(start_arg: bytes, end_arg: bytes):
    """The inclusive (start, end) of an interval given by two range IDs.

    An exclusive start is moved one ID up and an exclusive end one ID down;
    when that is impossible (`(18446744073709551615-18446744073709551615` as
    start, `(0-0` as end) redis replies an error. Start is fully checked
    before end is parsed, as redis does."""
    start, start_ex = parse_range_id(start_arg, 0)
    if start_ex:
        start = start.incr()
        if start is None:
            raise CommandError("ERR invalid start ID for the interval")
    end, end_ex = parse_range_id(end_arg, MAX_ID.seq)
    if end_ex:
        end = end.decr()
        if end is None:
            raise CommandError("ERR invalid end ID for the interval")
    return start, end


# -- keyspace and replies -----------------------------------------------------

def lookup_stream(db, key: bytes):
    """The Stream at key, None when absent; WRONGTYPE for any other value."""
    return db.get_typed(key, Stream)


def last_valid_id(stream):
    """The ID of the stream's last entry (not `last_id`, which may be larger
    after XDEL or XSETID), or None when the stream is empty."""
    last = stream.last_entry()
    return None if last is None else last[0]


def entry_reply(sid, fields) -> list:
    """One entry as redis replies it: [b"<ms>-<seq>", [field, value, ...]]."""
    return [format_id(sid), list(fields)]


def entries_reply(entries) -> list:
    """An iterable of (StreamID, fields) as redis's array of entries."""
    return [entry_reply(sid, fields) for sid, fields in entries]


def take(iterable, count: int) -> list:
    """The first `count` items of iterable (all of them when count is 0)."""
    out = []
    for item in iterable:
        out.append(item)
        if count and len(out) >= count:
            break
    return out


# -- XREAD / XREADGROUP options -----------------------------------------------

@dataclass
class XReadArgs:
    """The options of XREAD/XREADGROUP, before IDs are resolved.

    `keys` and `id_args` are the raw arguments after STREAMS, paired by index;
    `streams_pos` is the argv index of the first key (retry_argv rewriting)."""
    timeout_ms: int = -1          # -1: no BLOCK given
    count: int = 0                # 0: no limit
    streams_pos: int = 0
    keys: list = field(default_factory=list)
    id_args: list = field(default_factory=list)
    group: bytes | None = None
    consumer: bytes | None = None
    noack: bool = False


def parse_xread_args(argv, xreadgroup: bool) -> XReadArgs:
    """The option loop of redis xreadCommand, errors in redis's order.

    BLOCK, COUNT, GROUP and NOACK may come in any order and repeat (the last
    one wins); STREAMS ends the options and must split the rest evenly into
    keys and IDs."""
    args = XReadArgs()
    n = len(argv)
    i = 1
    while i < n:
        more = n - i - 1
        opt = argv[i].lower()
        if opt == b"block" and more:
            i += 1
            args.timeout_ms = parse_timeout_ms(argv[i])
        elif opt == b"count" and more:
            i += 1
            args.count = parse_count(argv[i])
        elif opt == b"streams" and more:
            pos = i + 1
            rest = n - pos
            if rest % 2:
                # redis says XREAD here for XREADGROUP too
                raise CommandError("ERR Unbalanced XREAD list of streams: for each stream key "
                                   "an ID or '$' must be specified.")
            half = rest // 2
            args.streams_pos = pos
            args.keys = list(argv[pos:pos + half])
            args.id_args = list(argv[pos + half:])
            break
        elif opt == b"group" and more >= 2:
            if not xreadgroup:
                raise CommandError("ERR The GROUP option is only supported by XREADGROUP. "
                                   "You called XREAD instead.")
            args.group, args.consumer = argv[i + 1], argv[i + 2]
            i += 2
        elif opt == b"noack":
            if not xreadgroup:
                raise CommandError("ERR The NOACK option is only supported by XREADGROUP. "
                                   "You called XREAD instead.")
            args.noack = True
        else:
            raise syntax_error()
        i += 1
    if not args.streams_pos:
        raise syntax_error()
    if xreadgroup and args.group is None:
        raise CommandError("ERR Missing GROUP option for XREADGROUP")
    return args
