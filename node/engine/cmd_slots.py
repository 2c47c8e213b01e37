"""Keys by cluster slot: what CLUSTER COUNTKEYSINSLOT / GETKEYSINSLOT read.

CLUSTER is a server command (node/server/cluster_cmds.py): the server parses
and checks the arguments with redis's texts, routes the slot (-MOVED when
another group owns it), then reads through the backend's read path (ReadIndex,
follower reads) with these INTERNAL forms, so the reply comes from the
applied state of the group that owns the slot. INTERNAL: `lookup` answers
"unknown command" to any client sending them (commands.py).

    xraft-countkeysinslot <slot>           -> integer
    xraft-getkeysinslot <slot> <count>     -> [key, ...] newest first, at most count

Both read Keyspace.slot_keys (keyspace.py): no scan of the keyspace.
"""
from .commands import INTERNAL, READONLY, command
from .errors import CommandError
from .slots import SLOT_COUNT
from .streamid import string2ll

COUNT_KEYS_IN_SLOT = b"xraft-countkeysinslot"
GET_KEYS_IN_SLOT = b"xraft-getkeysinslot"


def _int_arg(raw: bytes, lo: int, hi: int) -> int:
    # The server sends canonical, checked numbers; anything else is a bug upstream.
    n = string2ll(raw)
    if n is None or not lo <= n <= hi:
        raise CommandError("ERR xraft: bad argument %r for a slot read" % raw[:32])
    return n


@command(COUNT_KEYS_IN_SLOT.decode(), 2, (READONLY, INTERNAL), 0, 0, 0)
def cmd_countkeysinslot(db, argv, now_ms):
    return db.count_keys_in_slot(_int_arg(argv[1], 0, SLOT_COUNT - 1))


@command(GET_KEYS_IN_SLOT.decode(), 3, (READONLY, INTERNAL), 0, 0, 0)
def cmd_getkeysinslot(db, argv, now_ms):
    return db.keys_in_slot(_int_arg(argv[1], 0, SLOT_COUNT - 1), _int_arg(argv[2], 0, (1 << 63) - 1))
