"""Which slots a data group owns, enforced where it counts: at apply.

A group's fsm holds the set of slots it owns (OwnedSlots). Routing sends a
keyed request to the group the slot map names, but a record proposed before
a layout change can commit after it, so the fsm checks again as it applies:
a request with a key in a slot the group does not own changes nothing and
gets SlotNotOwned as its result, the same on every replica (the check reads
only the record and the replicated bitmap).

    OwnedSlots
      bitmap   bytes | None   SLOT_COUNT bits, bit s (byte s >> 3, bit s & 7) set iff the
                              group owns slot s. None: every slot (one group per cluster,
                              and every snapshot written before ownership existed)

Encoding (in the fsm snapshot, state_machine.py version >= 4): empty = every
slot; else exactly BITMAP_BYTES bytes (all zero: a group that moved every slot
away). Anything else is corrupt.

Keyless requests (CONFIG SET, REGISTER, NOOP, FLUSHALL, DBSIZE ...) are never
refused: they act on this group's own keys only.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

from ..engine.command_keys import command_keys
from ..engine.commands import lookup
from ..engine.errors import EngineError
from ..engine.slots import SLOT_COUNT, key_slot
from .entry import Kind, Request

BITMAP_BYTES = SLOT_COUNT // 8


class CorruptOwnedSlots(ValueError):
    """Bytes that are not an encoded OwnedSlots."""


class SlotNotOwned(EngineError):
    """A keyed request for a slot this group does not own: nothing changed. The
    fsm knows no addresses, so the text is a MOVED without a target (":0");
    the node replaces it with the slot owner's leader before a client sees it
    (sharded_backend.py), and a cluster client that still gets it refreshes its
    slot map, as on any MOVED."""

    def __init__(self, slot: int):
        super().__init__("MOVED %d :0" % slot)
        self.slot = slot


def not_owned_slot(result) -> Optional[int]:
    """The slot of a SlotNotOwned result (also after a session stored and decoded it
    as a plain EngineError with the same text), else None."""
    if not isinstance(result, EngineError):
        return None
    parts = result.message.split(" ")
    if len(parts) == 3 and parts[0] == "MOVED" and parts[2] == ":0" and parts[1].isdigit():
        return int(parts[1])
    return None


class OwnedSlots:
    __slots__ = ("bitmap",)

    def __init__(self, bitmap: Optional[bytes] = None):
        if bitmap is not None and (not isinstance(bitmap, bytes) or len(bitmap) != BITMAP_BYTES):
            raise CorruptOwnedSlots("an owned-slot bitmap is %d bytes" % BITMAP_BYTES)
        self.bitmap = None if bitmap is not None and bitmap == _ALL else bitmap

    @classmethod
    def from_ranges(cls, ranges: Iterable) -> "OwnedSlots":
        """From inclusive (first, last) runs."""
        bits = bytearray(BITMAP_BYTES)
        for first, last in ranges:
            if not 0 <= first <= last < SLOT_COUNT:
                raise CorruptOwnedSlots("slot run %r outside 0-%d" % ((first, last), SLOT_COUNT - 1))
            for s in range(first, last + 1):
                bits[s >> 3] |= 1 << (s & 7)
        return cls(bytes(bits))

    def owns(self, slot: int) -> bool:
        b = self.bitmap
        return b is None or bool(b[slot >> 3] >> (slot & 7) & 1)

    @property
    def owns_all(self) -> bool:
        return self.bitmap is None

    def count(self) -> int:
        b = self.bitmap
        return SLOT_COUNT if b is None else sum(bin(x).count("1") for x in b)

    def encode(self) -> bytes:
        return b"" if self.bitmap is None else self.bitmap

    @classmethod
    def decode(cls, raw: bytes) -> "OwnedSlots":
        raw = bytes(raw)
        if not raw:
            return cls(None)
        if len(raw) != BITMAP_BYTES:
            raise CorruptOwnedSlots("owned-slot bitmap of %d bytes (want 0 or %d)" % (len(raw), BITMAP_BYTES))
        return cls(raw)

    def refusal(self, req: Request) -> Optional[SlotNotOwned]:
        """SlotNotOwned for the first key of `req` in a slot not owned, else None."""
        if self.bitmap is None:
            return None
        for key in request_keys(req):
            slot = key_slot(bytes(key))
            if not self.owns(slot):
                return SlotNotOwned(slot)
        return None


_ALL = b"\xff" * BITMAP_BYTES


# Internal woken forms whose keys sit where their public form's do (fsm/blocking.py builds
# them as the public argv renamed), but whose specs declare no key positions.
_WOKEN_FORMS = {"lmpop-woken": b"lmpop", "xreadgroup-woken": b"xreadgroup"}


def spec_keys(spec, argv) -> list:
    """The keys of argv, whose spec is `spec` (an internal woken form's are its public
    form's). Also the keys a write modified, for WATCH (watch.py)."""
    public = _WOKEN_FORMS.get(spec.name)
    if public is not None:
        argv = [public] + list(argv[1:])
        try:
            spec = lookup(argv)
        except EngineError:
            return []             # the command fails by itself
    return command_keys(spec, argv)


def _argv_keys(argv) -> list:
    argv = list(argv)
    try:
        spec = lookup(argv, internal=True)
    except EngineError:
        return []                 # the command fails by itself (or is CONFIG: keyless)
    return spec_keys(spec, argv)


def request_keys(req: Request) -> Iterator[bytes]:
    """Every key a request names (watched keys included), in order."""
    if req.kind == Kind.XADD_BATCH:
        yield req.xadd.key
    elif req.kind == Kind.COMMAND:
        yield from _argv_keys(req.argv)
    elif req.kind in (Kind.MULTI, Kind.WATCHED_MULTI):
        if req.kind == Kind.WATCHED_MULTI:
            for key, _ in req.watched:
                yield key
        for argv in req.transaction:
            yield from _argv_keys(argv)
