"""WATCH: replicated key versions, checked when EXEC applies.

A client's WATCH records, per key, the applied log index W of the node it is
connected to at that moment. EXEC then proposes one WATCHED_MULTI request
carrying (key, W) pairs (entry.py). Apply aborts the transaction with a null
array (redis's CLIENT_DIRTY_CAS reply) if any watched key's version is > W.
Versions are log indices, so the check means the same thing on every replica
and after any failover: a key modified through another leader, by any entry
committed after the WATCH was answered, aborts the EXEC wherever it applies.

    KeyVersions
    +-- changed: dict[bytes, int]   key -> index of the last entry that modified it
    +-- floor:   int                every key absent from `changed` was last
                                    modified at or before `floor`

    version(key) = changed.get(key, floor)
    Invariant: every value in `changed` and `floor` is <= the applied index;
               len(changed) <= number of keys + MAX_TOMBSTONES after each apply.

What counts as a modification is what redis 7.0 signals (signalModifiedKey),
checked command by command against redis-server, and decided from (state
before, argv, reply) only - never from whether the caller wanted the reply,
so every replica decides alike:
  * a write whose reply is an error or null changed nothing (SET NX not set,
    LPOP/LMOVE/XADD NOMKSTREAM with nothing to do, a blocking form inside
    MULTI with nothing to serve);
  * XDEL XTRIM LREM LPUSHX RPUSHX RENAMENX answering 0, LINSERT answering
    0 or -1, RENAME/RENAMENX of a key onto itself: nothing;
  * DEL/UNLINK touch only the keys that existed (redis's delGenericCommand
    signals the keys it deleted), LMPOP (woken too) and BLPOP BRPOP BLMPOP
    inside MULTI only the key they popped from (named in their reply);
  * consumer-group bookkeeping is not a modification in redis either:
    XREADGROUP (woken too) XACK XCLAIM XAUTOCLAIM XSETID XGROUP never touch, except an
    XGROUP CREATE ... MKSTREAM that created the stream;
  * FLUSHALL/FLUSHDB touch every key that existed (a watched absent key
    is not aborted, as in redis 7.0);
  * any other successful write touches all its key arguments (an internal
    woken retry's are its public form's: slot_owner.spec_keys).

Bound: deleted keys leave their version behind (a delete-then-recreate must
abort a watcher). When more than MAX_TOMBSTONES entries name absent keys,
they are all dropped and `floor` is raised to the current index: watchers of
absent keys then abort conservatively. The rule depends only on the state.

Snapshots: the versions are part of the fsm snapshot (state_machine.py,
layout version 3), sorted by key, so restore gives the same versions as
replay. A version-1 snapshot (written before WATCH existed) restores with
no entries and floor = its applied index: conservative for watchers.
"""
import struct

from ..engine.errors import EngineError
from ..engine.replies import NULL_ARRAY, WouldBlock
from ..invariant import invariant
from .slot_owner import spec_keys

MAX_TOMBSTONES = 100_000
MAX_KEY_BYTES = 512 << 20

_HEAD = struct.Struct(">QI")      # floor, count
_KLEN = struct.Struct(">I")
_U64 = struct.Struct(">Q")


_GROUP_BOOKKEEPING = frozenset(("xreadgroup", "xreadgroup-woken", "xack", "xclaim", "xautoclaim",
                                "xsetid", "xgroup"))
_ZERO_IS_NOTHING = frozenset(("xdel", "xtrim", "lrem", "lpushx", "rpushx", "linsert", "renamenx"))
_REMOVES_PRESENT = frozenset(("flushall", "flushdb", "del", "unlink"))
# reply: [the key popped from, element(s)]
_POPS_ONE_OF = frozenset(("lmpop", "lmpop-woken", "blpop", "brpop", "blmpop"))


def present_before(spec, argv, data) -> list | None:
    """For a command that touches exactly the keys it removes (FLUSHALL/FLUSHDB:
    every key; DEL/UNLINK: its arguments), the keys present before it runs, to
    pass to after_command as `removed`; None for any other command."""
    name = spec.name
    if name not in _REMOVES_PRESENT:
        return None
    if name in ("flushall", "flushdb"):
        return list(data)
    return [bytes(key) for key in argv[1:] if key in data]


class CorruptVersions(ValueError):
    pass


class KeyVersions:
    def __init__(self, floor: int = 0, changed: dict | None = None):
        self.floor = floor
        self.changed = changed if changed is not None else {}

    def version(self, key: bytes) -> int:
        return self.changed.get(key, self.floor)

    def any_changed_since(self, watched) -> bool:
        """watched: [(key, W)]; True if a key was modified after index W."""
        get, floor = self.changed.get, self.floor
        return any(get(key, floor) > w for key, w in watched)

    def after_command(self, spec, argv, reply, index: int, removed=None, created=None) -> None:
        """Record what one applied write changed (module doc). `removed`: the
        keys a FLUSHALL/FLUSHDB/DEL/UNLINK found present (present_before);
        `created`: a key the command brought into existence (XGROUP CREATE MKSTREAM)."""
        if isinstance(reply, EngineError) or not spec.is_write:
            return
        name = spec.name
        if removed is not None:
            for key in removed:
                self.changed[key] = index
            return
        if name in _GROUP_BOOKKEEPING:
            if created is not None:
                self.changed[bytes(created)] = index
            return
        if reply is None or reply is NULL_ARRAY or isinstance(reply, WouldBlock):
            return
        if name in _ZERO_IS_NOTHING and (reply == 0 or (name == "linsert" and reply == -1)):
            return
        if name in ("rename", "renamenx") and argv[1] == argv[2]:
            return
        if name in _POPS_ONE_OF:
            self.changed[bytes(reply[0])] = index
            return
        for key in spec_keys(spec, argv):
            self.changed[bytes(key)] = index

    def touch(self, key: bytes, index: int) -> None:
        self.changed[key] = index

    def bound(self, data: dict, index: int) -> None:
        """Drop the versions of absent keys when there are too many (module doc)."""
        if len(self.changed) <= len(data) + MAX_TOMBSTONES:
            return
        self.changed = {k: v for k, v in self.changed.items() if k in data}
        self.floor = index

    # -- snapshot encoding ----------------------------------------------------------
    def encode(self) -> bytes:
        out = [_HEAD.pack(self.floor, len(self.changed))]
        for key in sorted(self.changed):
            out += [_KLEN.pack(len(key)), key, _U64.pack(self.changed[key])]
        return b"".join(out)

    @classmethod
    def decode(cls, buf: bytes, applied: int) -> "KeyVersions":
        """Every field checked: versions never exceed the snapshot's applied index."""
        if len(buf) < _HEAD.size:
            raise CorruptVersions("versions too short")
        floor, n = _HEAD.unpack_from(buf, 0)
        if floor > applied:
            raise CorruptVersions("floor %d beyond applied %d" % (floor, applied))
        pos = _HEAD.size
        changed = {}
        prev = None
        for _ in range(n):
            if len(buf) - pos < _KLEN.size:
                raise CorruptVersions("key length runs past the end")
            klen = _KLEN.unpack_from(buf, pos)[0]
            pos += _KLEN.size
            if klen > MAX_KEY_BYTES or len(buf) - pos < klen + _U64.size:
                raise CorruptVersions("key of %d bytes runs past the end" % klen)
            key = buf[pos:pos + klen]
            pos += klen
            index = _U64.unpack_from(buf, pos)[0]
            pos += _U64.size
            if prev is not None and key <= prev:
                raise CorruptVersions("keys not sorted and unique")
            if index > applied:
                raise CorruptVersions("version %d beyond applied %d" % (index, applied))
            changed[key] = index
            prev = key
        if pos != len(buf):
            raise CorruptVersions("%d trailing bytes" % (len(buf) - pos))
        invariant(len(changed) == n, "decoded count")
        return cls(floor, changed)
