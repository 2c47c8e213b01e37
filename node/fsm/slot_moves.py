"""The data side of an online slot move, as replicated state (docs/slot-move-steps.md).

A move of slots first..last from group A to group B, started at slot-map epoch E, is named
MoveId(first, last, E). Its records (entry.Kind.SLOT_MOVE, one argv
[op, first, last, E, args...]) are applied here, deterministically, from the record and this
state alone:

    at A:  SEAL -> (UNSEAL | RELEASE -> PURGE ... )
    at B:  [PRESTAGE ... (the pre-copy, A unsealed)] STAGE ... -> (DROP_STAGING | ACTIVATE)

    SlotMoves
    +-- epochs   [SLOT_COUNT] int   the highest started_epoch of a move record applied for
    |                               each slot: a record with a lower one is stale (refused)
    +-- moves    OrderedDict MoveId -> Phase, in the order they began here; finished ones
    |                               (tombstones) are kept, at most MAX_TOMBSTONES
    +-- staging  dict MoveId -> Staging  (B, phase STAGING): records as they came, cursor,
    |                               A's time floor, A's session table (last chunk); the
    |                               pre-copy's base records and cursor (DELTA records of the
    |                               sealed copy are rebuilt from the base)
    +-- sealed   bytearray[SLOT_COUNT]   derived: 1 where a SEALED move holds the slot

Idempotence: a record whose effect is in the state already changes nothing and answers as
the first one did. A record that cannot apply (stale, wrong order, a gap, a bad digest) is
refused with MoveRefused, a result: nothing changed.

Encoding (in the fsm snapshot, state_machine.py version >= 5; empty bytes = no move ever):

    | ver u8 = 1 | nruns u32 | nruns x (first u16 | last u16 | epoch u64)     per-slot epochs, runs
    | nmoves u32 | nmoves x (first u16 | last u16 | epoch u64 | phase u8)      in begin order
    | nstag u32  | nstag x (first u16 | last u16 | epoch u64 | cursor 10s | floor_ms u64 |
    |              nrec u32 | nrec x (len u32 | record) | partial_len u32 | partial |
    |              sess_len u32 | sessions
    |              ver 2 only: | pre_len u32 | pre_cursor | ppart_len u32 | pre_partial |
    |                          nbase u32 | nbase x (len u32 | record))
    Version 2 (pre-copy) is written; version 1 (no pre-copy fields) still loads.
"""
from __future__ import annotations

import enum
import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

from ..engine.dump import CorruptDump, load_records
from ..engine.errors import EngineError
from ..engine.slots import SLOT_COUNT, key_slot
from ..engine.stream_delta import DeltaMismatch, split_record
from .sessions import CorruptSessions, Sessions
from .slot_owner import BITMAP_BYTES, OwnedSlots, request_keys

PURGE_BATCH = 1000                 # keys one RELEASE or PURGE record deletes
MAX_TOMBSTONES = 1024              # finished moves remembered by id (epochs refuse older ones)
MAX_CHUNK_BYTES = 4 << 20          # one export chunk (gRPC messages are 16 MiB)
MAX_PARTIAL_BYTES = (1 << 32) - 1  # one key's record staged in pieces (a dump payload is < 4 GiB)
MAX_SESSIONS_BYTES = MAX_CHUNK_BYTES   # A's session table in the last chunk (newest clients kept);
                                       # a STAGE must fit a proposal (8 MiB by default)
DIGEST_BYTES = 32
MAX_EPOCH = (1 << 63) - 1

# slot, ordinal of the next key in that slot (key order), bytes of that key's record already
# sent (a record larger than a chunk travels in pieces, each a chunk of its own)
CURSOR = struct.Struct(">HII")
END = b"\xff" * CURSOR.size                       # the copy is complete (sessions staged too)
KEYS_DONE = b"\xff\xff" + b"\x00" * (CURSOR.size - 2)   # every key exported; the sessions are next
_ID = struct.Struct(">HHQ")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class Phase(enum.IntEnum):
    SEALED = 1       # A: frozen
    UNSEALED = 2     # A: aborted (terminal)
    RELEASED = 3     # A: bits cleared, keys being purged
    PURGED = 4       # A: nothing left (terminal)
    STAGING = 5      # B: chunks arriving
    DROPPED = 6      # B: aborted (terminal)
    ACTIVE = 7       # B: live (terminal)


_TERMINAL = frozenset((Phase.UNSEALED, Phase.PURGED, Phase.DROPPED, Phase.ACTIVE))
PHASE_WORDS = {Phase.SEALED: "sealed", Phase.UNSEALED: "aborted", Phase.RELEASED: "released",
                Phase.PURGED: "released", Phase.STAGING: "staging", Phase.DROPPED: "aborted",
                Phase.ACTIVE: "active"}


@dataclass(frozen=True, order=True)
class MoveId:
    first: int
    last: int
    started_epoch: int

    def __str__(self):
        return "%d-%d@%d" % (self.first, self.last, self.started_epoch)


class CorruptMoves(ValueError):
    """Bytes that are not an encoded SlotMoves."""


class MoveRefused(EngineError):
    """A move record that cannot apply: nothing changed. `.move` names the move."""

    def __init__(self, move, why: str):
        super().__init__("ERR xraft: %s" % why)
        self.move = move


class SlotFrozen(EngineError):
    """A keyed request for a slot sealed by a move: nothing changed, and the request is not
    recorded in the at-most-once table (a retry after an UNSEAL runs). The node parks it,
    then answers -TRYAGAIN; `.slot` is the first frozen slot of its keys."""

    def __init__(self, slot: int):
        super().__init__("TRYAGAIN slot %d is being moved" % slot)
        self.slot = slot


def frozen_slot(result) -> Optional[int]:
    """The slot of a SlotFrozen result (also one rebuilt from its text), else None."""
    if isinstance(result, SlotFrozen):
        return result.slot
    if not isinstance(result, EngineError):
        return None
    parts = result.message.split(" ")
    if len(parts) == 6 and parts[0] == "TRYAGAIN" and parts[1] == "slot" and parts[2].isdigit() \
            and parts[3:] == ["is", "being", "moved"]:
        return int(parts[2])
    return None


def encode_cursor(slot: int, ordinal: int, offset: int = 0) -> bytes:
    return CURSOR.pack(slot, ordinal, offset)


def decode_cursor(raw: bytes) -> tuple:
    if len(raw) != CURSOR.size:
        raise ValueError("a cursor is %d bytes" % CURSOR.size)
    return CURSOR.unpack(raw)


@dataclass
class Staging:
    cursor: bytes                                  # where the next chunk starts
    records: dict = field(default_factory=dict)    # key -> record bytes, in (slot, key) order
    partial: bytes = b""                           # the pieces so far of a record larger than a chunk
    floor_ms: int = 0                              # A's applied time at export (largest seen)
    sessions: bytes = b""                          # A's encoded session table (from the last chunk)
    # The pre-copy (PRESTAGE, A still serving): key -> full record as A had it then, in any
    # order; only a source of bytes for the DELTA records of the sealed copy (never made live).
    base: dict = field(default_factory=dict)
    pre_cursor: bytes = b""                        # where the next pre-copy chunk starts ("": none yet)
    pre_partial: bytes = b""                       # pieces so far of a pre-copied record larger than a chunk
    # key -> the value STAGE decoded from records[key] (checking it), so ACTIVATE need not
    # decode it again: the same value either way. Not in the snapshot (restored: decoded again).
    loaded: dict = field(default_factory=dict, compare=False, repr=False)
    # Bumped whenever `base` changes: a STAGE chunk decoded ahead of its apply (prepare_move)
    # against an older base is decoded again. Not in the snapshot (nothing prepared survives one).
    base_version: int = field(default=0, compare=False, repr=False)

    def digest(self) -> bytes:
        return digest_of(self.records.values())


def digest_of(records) -> bytes:
    """sha256 over records in order: A's manifest and B's staging digest alike."""
    h = hashlib.sha256()
    for raw in records:
        h.update(raw)
    return h.digest()


def key_position(key: bytes) -> tuple:
    return key_slot(key), key


class SlotMoves:
    def __init__(self):
        self.epochs = [0] * SLOT_COUNT
        self.moves: OrderedDict = OrderedDict()
        self.staging: dict = {}
        self.sealed = bytearray(SLOT_COUNT)
        self.any_sealed = False

    # -- what requests see ---------------------------------------------------------------
    def frozen_refusal(self, req) -> Optional[SlotFrozen]:
        if not self.any_sealed:
            return None
        for key in request_keys(req):
            slot = key_slot(bytes(key))
            if self.sealed[slot]:
                return SlotFrozen(slot)
        return None

    def frozen_keys(self, keys) -> Optional[SlotFrozen]:
        if not self.any_sealed:
            return None
        for key in keys:
            slot = key_slot(bytes(key))
            if self.sealed[slot]:
                return SlotFrozen(slot)
        return None

    def phase(self, move: MoveId) -> Optional[Phase]:
        return self.moves.get(move)

    def reseal(self) -> None:
        self.sealed = bytearray(SLOT_COUNT)
        for m, ph in self.moves.items():
            if ph is Phase.SEALED:
                self.sealed[m.first:m.last + 1] = b"\x01" * (m.last - m.first + 1)
        self.any_sealed = any(ph is Phase.SEALED for ph in self.moves.values())

    # -- bookkeeping ------------------------------------------------------------------------
    def stale(self, m: MoveId) -> Optional[MoveRefused]:
        """Refusal of a record for move m that is older than what its slots saw, or of a
        finished move forgotten by id (its tombstone pruned)."""
        for s in range(m.first, m.last + 1):
            e = self.epochs[s]
            if e > m.started_epoch or (e == m.started_epoch and m not in self.moves):
                return MoveRefused(m, "stale move %s (slot %d is in move @%d)" % (m, s, e))
        return None

    def begin(self, m: MoveId, phase: Phase) -> None:
        for s in range(m.first, m.last + 1):
            self.epochs[s] = m.started_epoch
        self.moves[m] = phase
        terminal = [k for k, ph in self.moves.items() if ph in _TERMINAL]
        for k in terminal[:max(0, len(terminal) - MAX_TOMBSTONES)]:
            del self.moves[k]

    def set_phase(self, m: MoveId, phase: Phase) -> None:
        self.moves[m] = phase            # keeps its begin order

    # -- encoding ---------------------------------------------------------------------------
    def encode(self) -> bytes:
        if not self.moves and not any(self.epochs):
            return b""
        runs = []
        s = 0
        while s < SLOT_COUNT:
            e = self.epochs[s]
            t = s
            while t + 1 < SLOT_COUNT and self.epochs[t + 1] == e:
                t += 1
            if e:
                runs.append((s, t, e))
            s = t + 1
        out = [b"\x02", _U32.pack(len(runs))]
        out += [_ID.pack(*r) for r in runs]
        out.append(_U32.pack(len(self.moves)))
        for m, ph in self.moves.items():
            out += [_ID.pack(m.first, m.last, m.started_epoch), bytes((ph,))]
        out.append(_U32.pack(len(self.staging)))
        for m, st in sorted(self.staging.items()):
            out += [_ID.pack(m.first, m.last, m.started_epoch), st.cursor, _U64.pack(st.floor_ms),
                    _U32.pack(len(st.records))]
            for raw in st.records.values():
                out += [_U32.pack(len(raw)), raw]
            out += [_U32.pack(len(st.partial)), st.partial, _U32.pack(len(st.sessions)), st.sessions]
            out += [_U32.pack(len(st.pre_cursor)), st.pre_cursor, _U32.pack(len(st.pre_partial)), st.pre_partial,
                    _U32.pack(len(st.base))]
            for raw in st.base.values():
                out += [_U32.pack(len(raw)), raw]
        return b"".join(out)

    @classmethod
    def decode(cls, raw: bytes, now_ms: int) -> "SlotMoves":
        out = cls()
        raw = bytes(raw)
        if not raw:
            return out
        r = _Reader(raw)
        version = r.take(1)[0]
        if version not in (1, 2):
            raise CorruptMoves("unknown slot-moves version")
        prev = -1
        for _ in range(r.count(_ID.size)):
            first, last, e = r.unpack(_ID)
            if not prev < first <= last < SLOT_COUNT or not 0 < e <= MAX_EPOCH:
                raise CorruptMoves("bad epoch run %d-%d@%d" % (first, last, e))
            out.epochs[first:last + 1] = [e] * (last - first + 1)
            prev = last
        for _ in range(r.count(_ID.size + 1)):
            m = _move_id(*r.unpack(_ID))
            try:
                ph = Phase(r.take(1)[0])
            except ValueError:
                raise CorruptMoves("unknown phase for move %s" % m) from None
            if m in out.moves or any(out.epochs[s] < m.started_epoch for s in range(m.first, m.last + 1)):
                raise CorruptMoves("move %s repeated or above its slots' epochs" % m)
            out.moves[m] = ph
        for _ in range(r.count(_ID.size + CURSOR.size + 8 + 4 + 4 + 4)):
            m = _move_id(*r.unpack(_ID))
            if out.moves.get(m) is not Phase.STAGING or m in out.staging:
                raise CorruptMoves("staging of move %s that is not staging" % m)
            st = Staging(r.take(CURSOR.size), floor_ms=r.unpack(_U64)[0])
            for _ in range(r.count(4)):
                rec = r.take(r.unpack(_U32)[0])
                try:
                    (key, _, _), = load_records(rec)
                except (CorruptDump, ValueError) as e:
                    raise CorruptMoves("staging of move %s: %s" % (m, e)) from None
                if key in st.records:
                    raise CorruptMoves("staging of move %s repeats a key" % m)
                st.records[key] = rec
            st.partial = r.take(r.unpack(_U32)[0])
            if len(st.partial) != (0 if st.cursor == END else CURSOR.unpack(st.cursor)[2]):
                raise CorruptMoves("staging of move %s: a partial record of %d bytes at cursor %s"
                                   % (m, len(st.partial), st.cursor.hex()))
            st.sessions = r.take(r.unpack(_U32)[0])
            if st.sessions:
                try:
                    Sessions.decode(st.sessions, now_ms)
                except CorruptSessions as e:
                    raise CorruptMoves("staged sessions of move %s: %s" % (m, e)) from None
            if version >= 2:
                _decode_precopy(r, m, st)
            out.staging[m] = st
        if r.pos != len(raw):
            raise CorruptMoves("%d trailing bytes" % (len(raw) - r.pos))
        if any(ph is Phase.STAGING and m not in out.staging for m, ph in out.moves.items()):
            raise CorruptMoves("a staging move without its staging")
        out.reseal()
        return out


def _decode_precopy(r: "_Reader", m: MoveId, st: Staging) -> None:
    st.pre_cursor = r.take(r.unpack(_U32)[0])
    if st.pre_cursor and len(st.pre_cursor) != CURSOR.size:
        raise CorruptMoves("staging of move %s: a pre-copy cursor of %d bytes" % (m, len(st.pre_cursor)))
    st.pre_partial = r.take(r.unpack(_U32)[0])
    for _ in range(r.count(4)):
        rec = r.take(r.unpack(_U32)[0])
        try:
            _, key, _ = split_record(rec)
        except DeltaMismatch as e:
            raise CorruptMoves("pre-copy of move %s: %s" % (m, e)) from None
        if key in st.base:
            raise CorruptMoves("pre-copy of move %s repeats a key" % m)
        st.base[key] = rec


def _move_id(first: int, last: int, epoch: int) -> MoveId:
    if not 0 <= first <= last < SLOT_COUNT or not 0 < epoch <= MAX_EPOCH:
        raise CorruptMoves("bad move %d-%d@%d" % (first, last, epoch))
    return MoveId(first, last, epoch)


class _Reader:
    def __init__(self, buf: bytes):
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        if n > len(self.buf) - self.pos:
            raise CorruptMoves("%d bytes run past the end" % n)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, s: struct.Struct):
        return s.unpack(self.take(s.size))

    def count(self, min_size: int) -> int:
        n = self.unpack(_U32)[0]
        if n * min_size > len(self.buf) - self.pos:
            raise CorruptMoves("count %d runs past the end" % n)
        return n


# -- owned-slot bitmaps -----------------------------------------------------------------------

def with_slots(owned: OwnedSlots, first: int, last: int, own: bool) -> OwnedSlots:
    """`owned` with slots first..last set (own) or cleared."""
    bits = bytearray(owned.bitmap if owned.bitmap is not None else b"\xff" * BITMAP_BYTES)
    for s in range(first, last + 1):
        if own:
            bits[s >> 3] |= 1 << (s & 7)
        else:
            bits[s >> 3] &= ~(1 << (s & 7)) & 0xFF
    return OwnedSlots(bytes(bits))
