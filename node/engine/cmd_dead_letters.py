"""XRAFT.GROUPCFG: a consumer group's poison-message policy (dead_letters.py).

    XRAFT.GROUPCFG key group MAXDELIVERIES n DEADLETTER dead-letter-key
    XRAFT.GROUPCFG key group MAXDELIVERIES 0          (clears the policy)

An xraft command (redis has no such policy; the dotted name can never clash
with a redis command). Reply +OK. Errors, in this order, before any change:
  ERR syntax error                            unknown option, missing value, n > 0 without DEADLETTER
  ERR value is not an integer or out of range n is not an integer >= 0
  WRONGTYPE ...                               key holds another type
  NOGROUP No such key 'k' or consumer group 'g'
  CROSSSLOT Keys in request don't hash to the same slot
  ERR the dead-letter key must not be the stream itself
  WRONGTYPE ...                               the dead-letter key holds another type
"""
from .cmd_groups import lookup_stream_group
from .commands import WRITE, command
from .dead_letters import MAX_DELIVERIES_LIMIT
from .errors import CommandError, WrongTypeError, not_integer, syntax_error
from .replies import OK
from .slots import key_slot
from .stream import Stream
from .stream_args import parse_int

GROUPCFG = "xraft.groupcfg"
ERR_CROSSSLOT = "CROSSSLOT Keys in request don't hash to the same slot"
ERR_SELF = "ERR the dead-letter key must not be the stream itself"


def parse_groupcfg(argv):
    """(max_deliveries, dead-letter key or None) of an XRAFT.GROUPCFG argv."""
    max_deliveries = None
    dead_letter_key = None
    i = 3
    n = len(argv)
    while i < n:
        opt = argv[i].lower()
        if i + 1 >= n:
            raise syntax_error()
        if opt == b"maxdeliveries":
            max_deliveries = parse_int(argv[i + 1])
            if not 0 <= max_deliveries <= MAX_DELIVERIES_LIMIT:
                raise not_integer()
        elif opt == b"deadletter":
            dead_letter_key = argv[i + 1]
        else:
            raise syntax_error()
        i += 2
    if max_deliveries is None or (max_deliveries > 0 and dead_letter_key is None):
        raise syntax_error()
    return max_deliveries, dead_letter_key


@command(GROUPCFG, -5, (WRITE,), 1, 1, 1)
def xraft_groupcfg(db, argv, now_ms):
    max_deliveries, dead_letter_key = parse_groupcfg(argv)
    _, group = lookup_stream_group(db, argv[1], argv[2])
    if max_deliveries == 0:
        group.max_deliveries = 0
        group.dead_letter_key = None
        return OK
    if key_slot(dead_letter_key) != key_slot(argv[1]):
        raise CommandError(ERR_CROSSSLOT)
    if dead_letter_key == argv[1]:
        raise CommandError(ERR_SELF)
    value = db.data.get(dead_letter_key)
    if value is not None and type(value) is not Stream:
        raise WrongTypeError()
    group.max_deliveries = max_deliveries
    group.dead_letter_key = bytes(dead_letter_key)
    return OK
