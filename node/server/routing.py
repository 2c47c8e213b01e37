"""Which node serves a request: redis 7.0's cluster routing (cluster.c getNodeByQuery).

Every key of a command is hashed (engine/slots.py); the keys come from
engine/command_keys.py, the same extraction COMMAND GETKEYS answers with.

    keys in two slots or more   -CROSSSLOT Keys in request don't hash to the same slot
                                (before any redirect: a replica answers it too)
    one slot served elsewhere   -MOVED <slot> <host:port> from backend.redirect_for(slot),
                                -CLUSTERDOWN when no leader is known
    no keys                     served here (PING, FLUSHALL, XRAFT.REGISTER ...)

MULTI/EXEC (processCommand + getNodeByQuery): each queued command is routed
on its own as it is queued (a CROSSSLOT or MOVED reply flags the transaction,
so EXEC answers EXECABORT); EXEC then routes the keys of all queued commands
together, before it looks at that flag: a queue that spans slots gets
-CROSSSLOT from EXEC (even when flagged) and is discarded.
The keys of WATCH are routed like a command's, but EXEC does not look at
them (a transaction may watch a key of another slot, as in redis).

The decision is per slot, so it stays right when a node hosts many groups:
backend.redirect_for(slot) answers for the group that owns the slot.

READONLY (a replica serves reads of its master's slots, maybe stale) and the
gRPC front end (NOT_LEADER, which the SDK follows, rather than MOVED) treat a
redirect to this node's own group leader differently from one to another
group: `own_group(backend, slot)` tells them apart by backend.hosts_slot(slot)
(this node holds a replica of the slot's group).
"""
from typing import Iterable, Optional

from ..engine.command_keys import command_keys
from ..engine.commands import lookup
from ..engine.errors import CommandError, EngineError
from ..engine.slots import key_slot
from .backend import NotLeader
from .wire_errors import cluster_down_message, cross_slot_message, moved_message


class CrossSlot(CommandError):
    """Keys of one request hash to different slots: nothing was run."""

    def __init__(self):
        super().__init__(cross_slot_message())


def common_slot(keys: Iterable) -> Optional[int]:
    """The one slot every key hashes to; None for no keys; CrossSlot otherwise."""
    slot = None
    for key in keys:
        s = key_slot(bytes(key))
        if slot is None:
            slot = s
        elif s != slot:
            raise CrossSlot()
    return slot


def redirect_slot(backend, slot: Optional[int]) -> Optional[str]:
    """The -MOVED/-CLUSTERDOWN text if this node does not serve `slot`, else None."""
    if slot is None:
        return None
    target = backend.redirect_for(slot)
    if target is None:
        return None
    return moved_message(slot, target) if target else cluster_down_message()


def own_group(backend, slot: int) -> bool:
    """Whether this node is a replica of `slot`'s group, so that a redirect for it
    is a follower's (to its own group's leader), not to a slot of another group."""
    return backend.hosts_slot(slot)


def follower_read_allowed(backend, slot: Optional[int]) -> bool:
    """READONLY: this node may serve a read of `slot` (maybe stale) instead of
    -MOVED, as a redis replica does for its master's slots and only those."""
    return slot is None or own_group(backend, slot)


def redirect(backend, keys) -> Optional[str]:
    """The error text that keeps `keys` from being served here (CROSSSLOT, MOVED,
    CLUSTERDOWN), or None."""
    try:
        return redirect_slot(backend, common_slot(keys))
    except CrossSlot as e:
        return e.message


def transaction_slot(queued) -> Optional[int]:
    """EXEC's routing: the one slot of every key of the queued commands (argv
    tuples, checked when queued), None if they have none; CrossSlot otherwise."""
    keys = []
    for argv in queued:
        try:
            spec = lookup(list(argv))
        except EngineError:
            continue                      # CONFIG SET and the like: no keys
        keys += command_keys(spec, argv)
    return common_slot(keys)


def error_reply_text(exc) -> str:
    """The RESP error text of a backend error. A NotLeader of a keyed request (ShardedBackend
    names its slot) means leadership moved after routing sent the request here, and nothing
    was applied: it is answered as routing would answer now, -MOVED to the leader (or
    -CLUSTERDOWN while none is known), which redis cluster clients follow; a bare
    -NOTLEADER is an error to them."""
    slot = getattr(exc, "slot", None)
    if isinstance(exc, NotLeader) and slot is not None:
        return moved_message(slot, exc.leader_address) if exc.leader_address else cluster_down_message()
    return exc.message
