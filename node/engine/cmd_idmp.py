"""XCFGSET key [IDMP-DURATION seconds] [IDMP-MAXSIZE count] (Redis 8.6).

Pages followed: https://redis.io/docs/latest/commands/xcfgset/ and
https://redis.io/docs/latest/develop/data-types/streams/idempotency/ ; error
texts and edge cases from redis 8.6's tests/unit/type/stream.tcl ("XCFGSET
invalid syntax", "... clears all iids history", "setting same ... does not
clear"). The table itself is idmp.py's.
"""
from .commands import WRITE, command
from .errors import NO_SUCH_KEY, CommandError, syntax_error
from .idmp import ERR_CFG_EMPTY, ERR_DURATION_RANGE, ERR_MAXSIZE_RANGE, MAX_DURATION_S, MAX_MAXSIZE, idmp_of
from .replies import OK
from .stream_args import lookup_stream, parse_int


def parse_xcfgset(args) -> tuple:
    """(duration_s or None, maxsize or None) from XCFGSET's options; the
    last of a repeated option wins; each value is checked where it stands."""
    duration = maxsize = None
    n = len(args)
    i = 0
    while i < n:
        opt = args[i].lower()
        if opt not in (b"idmp-duration", b"idmp-maxsize") or i + 1 >= n:
            raise syntax_error()
        value = parse_int(args[i + 1])
        if opt == b"idmp-duration":
            if not 1 <= value <= MAX_DURATION_S:
                raise CommandError(ERR_DURATION_RANGE)
            duration = value
        else:
            if not 1 <= value <= MAX_MAXSIZE:
                raise CommandError(ERR_MAXSIZE_RANGE)
            maxsize = value
        i += 2
    if duration is None and maxsize is None:
        raise CommandError(ERR_CFG_EMPTY)
    return duration, maxsize


@command("xcfgset", -2, (WRITE,), 1, 1, 1)
def xcfgset(db, argv, now_ms):
    """XCFGSET key [IDMP-DURATION s] [IDMP-MAXSIZE n]: OK. A changed value
    clears the stream's IDMP history (the lifetime counters stay)."""
    duration, maxsize = parse_xcfgset(argv[2:])
    stream = lookup_stream(db, argv[1])
    if stream is None:
        raise CommandError(NO_SUCH_KEY)
    idmp_of(stream, True).configure(duration, maxsize)
    return OK
