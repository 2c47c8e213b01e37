"""The online slot move as a pure state machine over the Migration the map holds.

A move of slots first..last from group A (source) to group B (target):

    begin_move ──> PRECOPYING ──Precopied──> SEALING ──Sealed──> COPYING ──Copied(cursor, n)──┐
                     │                         │                  │  ^                        │
                     │                         │                  │  └────────────────────────┘
                     │                         │                  └──Verified(digest)──> VERIFIED ──Decide──> DECIDED
                     │                         │                  │                        │                    │
                     └──Abort──> ABORTED <─────┴──Abort───────────┴──Abort──────Abort──────┘                Released
                                   │                                                                            v
                                 Finish ──> (removed from the map)  <──Finish──────────────────────────── RELEASED

Events are facts the driver (CLI or reconciler) observed and proposes through the metadata
group, each inside a compare-and-set change (changes.AdvanceMove):

    Precopied   B pre-copied A's keys of the slots while A still served them (best effort:
                the sealed copy sends every key again, big streams as deltas against it;
                docs/slot-move-steps.md "Pre-copy"). A driver that does no pre-copy
                proposes it at once
    Sealed      A applied the seal: no read or write of the slots runs at A any more
    Copied      B replicated the chunks up to `cursor` into staging; `replicated` counts them
                and only grows (a re-delivered older chunk report is a duplicate)
    Verified    B checked its staging against the source's manifest (digest recorded, so B
                makes live exactly what was verified)
    Decide      the metadata group decides: B owns the slots from this map on. The only point
                of no return, and the only transition that changes an owner
    Released    A applied its release: parked clients get -MOVED, the keys go in the background
    Finish      nothing is left to do: after RELEASED, B serves (it applied its activation);
                after ABORTED, A unsealed and B dropped its staging
    Abort       give up (a timeout, an operator): refused from DECIDED on

advance() takes the transitions drawn above and raises MoveError for everything else,
including a duplicate; MoveError.already_applied says whether the event's effect is
already in the migration (a re-delivery), so a resuming driver can tell done from conflict.

Routing (`who_serves`): while PRECOPYING A serves as usual; from SEALING to the decision
the slots are frozen (A parks them, then -TRYAGAIN); from DECIDED on B serves; after an
abort A serves again. So one group, or none
while frozen, serves each slot at every map epoch, and the owner flips once, at DECIDED.
Each data group also enforces this at apply time (a record proposed before a change can
commit after it); that part lives in the data groups, not here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..engine.slots import SLOT_COUNT
from ..invariant import invariant
from .slot_map import (AFTER_DECISION, BEFORE_DECISION, DIGEST_BYTES, FROZEN, MAX_CURSOR_BYTES, MAX_MIGRATIONS,
                       MAX_REASON_CHARS, Migration, MovePhase, SlotMap, SlotMapError, _hex, _int, _str)


class MoveError(SlotMapError):
    """An event that is not an allowed transition from the migration's phase."""

    def __init__(self, message: str, *, phase: Optional[MovePhase] = None, event: object = None,
                 already_applied: bool = False):
        super().__init__(message)
        self.phase = phase                      # the migration's phase (None: no such migration)
        self.event = event                      # the refused event
        self.already_applied = already_applied  # its effect is already there (a duplicate)


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Precopied:
    kind = "precopied"


@dataclass(frozen=True)
class Sealed:
    kind = "sealed"


@dataclass(frozen=True)
class Copied:
    cursor: bytes        # where the copy resumes; at most MAX_CURSOR_BYTES
    replicated: int      # chunks replicated into staging so far; > the migration's to advance
    kind = "copied"


@dataclass(frozen=True)
class Verified:
    digest: bytes        # DIGEST_BYTES: the manifest B verified its staging against
    kind = "verified"


@dataclass(frozen=True)
class Decide:
    kind = "decide"


@dataclass(frozen=True)
class Released:
    kind = "released"


@dataclass(frozen=True)
class Finish:
    kind = "finish"


@dataclass(frozen=True)
class Abort:
    reason: str          # 1..MAX_REASON_CHARS characters: why (shown by the CLI)
    kind = "abort"


EVENT_TYPES = (Precopied, Sealed, Copied, Verified, Decide, Released, Finish, Abort)
_EVENT_BY_KIND = {t.kind: t for t in EVENT_TYPES}
# The phase each event leads to (Finish leads out of the map: None).
_PHASE_AFTER = {Precopied: MovePhase.SEALING, Sealed: MovePhase.COPYING, Copied: MovePhase.COPYING, Verified: MovePhase.VERIFIED,
                Decide: MovePhase.DECIDED, Released: MovePhase.RELEASED, Abort: MovePhase.ABORTED}
_MAIN_LINE = (MovePhase.PRECOPYING, MovePhase.SEALING, MovePhase.COPYING, MovePhase.VERIFIED, MovePhase.DECIDED, MovePhase.RELEASED)


def check_event(event) -> None:
    """SlotMapError unless `event` is one of EVENT_TYPES with valid fields."""
    if type(event) not in EVENT_TYPES:
        raise SlotMapError("not a move event: %r" % (event,))
    if isinstance(event, Copied):
        if not isinstance(event.cursor, bytes) or len(event.cursor) > MAX_CURSOR_BYTES:
            raise SlotMapError("a copy cursor is bytes of at most %d" % MAX_CURSOR_BYTES)
        if type(event.replicated) is not int or event.replicated < 1:
            raise SlotMapError("replicated must be an integer >= 1")
    elif isinstance(event, Verified):
        if not isinstance(event.digest, bytes) or len(event.digest) != DIGEST_BYTES:
            raise SlotMapError("a manifest digest is %d bytes" % DIGEST_BYTES)
    elif isinstance(event, Abort):
        if not isinstance(event.reason, str) or not 1 <= len(event.reason) <= MAX_REASON_CHARS:
            raise SlotMapError("an abort reason is 1-%d characters" % MAX_REASON_CHARS)


def event_to_json_obj(event) -> dict:
    obj = {"kind": event.kind}
    if isinstance(event, Copied):
        obj.update(cursor=event.cursor.hex(), replicated=event.replicated)
    elif isinstance(event, Verified):
        obj.update(digest=event.digest.hex())
    elif isinstance(event, Abort):
        obj.update(reason=event.reason)
    return obj


def event_from_json_obj(obj) -> object:
    """The event event_to_json_obj wrote; SlotMapError (or KeyError/ValueError/TypeError)."""
    kind = _str(obj["kind"])
    cls = _EVENT_BY_KIND.get(kind)
    if cls is None:
        raise SlotMapError("unknown move event %r" % kind)
    if cls is Copied:
        fields, event = {"kind", "cursor", "replicated"}, Copied(_hex(obj["cursor"]), _int(obj["replicated"]))
    elif cls is Verified:
        fields, event = {"kind", "digest"}, Verified(_hex(obj["digest"]))
    elif cls is Abort:
        fields, event = {"kind", "reason"}, Abort(_str(obj["reason"]))
    else:
        fields, event = {"kind"}, cls()
    if set(obj) != fields:
        raise SlotMapError("move event %r: fields must be %s" % (kind, sorted(fields)))
    check_event(event)
    return event


# -- the state machine ----------------------------------------------------------------------
def begin_move(slot_map: SlotMap, first: int, last: int, target: int) -> Migration:
    """The PRECOPYING migration that moves first..last to group `target`, started in the map
    that follows `slot_map`. SlotMapError if the slots are not all owned by one other
    group, if any is already moving, or if there are too many moves."""
    if not (type(first) is int and type(last) is int and 0 <= first <= last < SLOT_COUNT):
        raise SlotMapError("slots %r-%r outside 0-%d" % (first, last, SLOT_COUNT - 1))
    if target not in slot_map.groups:
        raise SlotMapError("no group %r" % (target,))
    owner_ids = slot_map.owner_ids()
    source = owner_ids[first]
    if any(owner_ids[s] != source for s in range(first, last + 1)):
        raise SlotMapError("slots %d-%d are not all owned by group %d" % (first, last, source))
    if source == target:
        raise SlotMapError("slots %d-%d are already owned by group %d" % (first, last, target))
    for m in slot_map.migrations.values():
        if m.first <= last and first <= m.last:
            raise SlotMapError("slots %d-%d overlap the move of %d-%d" % (first, last, m.first, m.last))
    if len(slot_map.migrations) >= MAX_MIGRATIONS:
        raise SlotMapError("already %d moves in progress" % MAX_MIGRATIONS)
    return Migration(first, last, source, target, MovePhase.PRECOPYING, started_epoch=slot_map.epoch + 1)


def event_reached(m: Migration, event) -> bool:
    """True if the effect of `event` is already in `m` (it, or a later step, was applied)."""
    if isinstance(event, Finish):
        return False                       # a finished migration is no longer in the map
    after = _PHASE_AFTER[type(event)]
    if m.phase is MovePhase.ABORTED or after is MovePhase.ABORTED:
        return m.phase is after
    reached = _MAIN_LINE.index(m.phase) - _MAIN_LINE.index(after)
    if isinstance(event, Copied):
        return reached > 0 or (reached == 0 and m.replicated >= event.replicated)
    if isinstance(event, Verified):
        return reached >= 0 and m.digest == event.digest
    return reached >= 0


def advance(m: Migration, event) -> Optional[Migration]:
    """The migration after `event`, or None when the move is over (Finish).
    MoveError for every event the module diagram does not draw from m.phase."""
    check_event(event)
    phase = m.phase
    nxt: Optional[Migration] = None
    if isinstance(event, Precopied) and phase is MovePhase.PRECOPYING:
        nxt = replace(m, phase=MovePhase.SEALING)
    elif isinstance(event, Sealed) and phase is MovePhase.SEALING:
        nxt = replace(m, phase=MovePhase.COPYING)
    elif isinstance(event, Copied) and phase is MovePhase.COPYING and event.replicated > m.replicated:
        nxt = replace(m, cursor=event.cursor, replicated=event.replicated)
    elif isinstance(event, Verified) and phase is MovePhase.COPYING:
        nxt = replace(m, phase=MovePhase.VERIFIED, digest=event.digest)
    elif isinstance(event, Decide) and phase is MovePhase.VERIFIED:
        nxt = replace(m, phase=MovePhase.DECIDED)
    elif isinstance(event, Released) and phase is MovePhase.DECIDED:
        nxt = replace(m, phase=MovePhase.RELEASED)
    elif isinstance(event, Abort) and phase in BEFORE_DECISION:
        nxt = replace(m, phase=MovePhase.ABORTED, reason=event.reason)
    elif isinstance(event, Finish) and phase in (MovePhase.RELEASED, MovePhase.ABORTED):
        return None
    else:
        if isinstance(event, Abort) and phase in AFTER_DECISION:
            why = "the move of %d-%d was decided: it can no longer be aborted" % m.key
        else:
            why = "move of %d-%d is %s: %s is not a step from there" % (m.first, m.last, phase.value, event.kind)
        raise MoveError(why, phase=phase, event=event, already_applied=event_reached(m, event))
    invariant(nxt.problem() is None, "advance keeps a migration consistent")
    return nxt


def with_advanced(slot_map: SlotMap, old: Migration, new: Optional[Migration]) -> SlotMap:
    """The next map (epoch + 1) with `old` replaced by `new` (None: removed); the slots'
    owner becomes `new.owner`, which changes only at the decision."""
    migrations = dict(slot_map.migrations)
    invariant(migrations.get(old.key) == old, "the migration being advanced is in the map")
    owners = slot_map.owners
    if new is None:
        del migrations[old.key]
    else:
        invariant(new.key == old.key, "a migration keeps its slots")
        migrations[new.key] = new
        if new.owner != old.owner:
            gid = new.owner
            run = bytes((gid & 0xFF, gid >> 8)) * (new.last - new.first + 1)
            owners = owners[:2 * new.first] + run + owners[2 * new.last + 2:]
    return SlotMap(slot_map.epoch + 1, owners, slot_map.groups, slot_map.nodes, migrations)


def who_serves(slot_map: SlotMap, slot: int) -> tuple:
    """(group, frozen) for `slot`: the group requests go to, and whether it is frozen by a
    move (routing parks the request, then answers -TRYAGAIN). A frozen slot is served by
    no group; an unfrozen one by exactly `group`."""
    m = slot_map.migration_of(slot)
    if m is None:
        return slot_map.owner(slot), False
    if m.phase in FROZEN:
        return m.source, True
    if m.phase in BEFORE_DECISION:
        return m.source, False
    return m.owner, False
