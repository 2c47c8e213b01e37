"""Consumer groups of a stream: the data model and the operations the group
commands (cmd_groups.py, cmd_xinfo.py) are built from, as redis 7.0 t_stream.c.

    Stream.cgroups: Rax  name -> ConsumerGroup         (None until the first group)

    ConsumerGroup
    +-- last_id:      StreamID   last ID delivered to any consumer of the group
    +-- entries_read: int        logical read counter of last_id, -1 = unknown
    +-- pel:          PelMap     StreamID -> NACK       every delivered, unacked entry
    +-- consumers:    Rax        name -> Consumer
    +-- max_deliveries, dead_letter_key, dead_lettered
                                 the poison-message policy (xraft only: dead_letters.py)

    Consumer
    +-- name:      bytes
    +-- seen_time: int            ms of the consumer's last activity
    +-- pel:       PelMap         StreamID -> NACK  (the SAME object as in group.pel)

    NACK (one record, shared by the group PEL and its owner's PEL)
    +-- delivery_time:  int       ms of the last delivery
    +-- delivery_count: int       deliveries so far
    +-- consumer:       Consumer  the owner

Invariant (check_group): for every group, the consumers' PELs partition the
group PEL: each key of group.pel maps to a NACK whose `consumer` is in
group.consumers and whose PEL holds that same key -> that same NACK object,
and no consumer PEL holds a key the group PEL lacks.

PELs are PelMaps (pel.py), not raxes as in redis: redis reports no PEL tree
shape, and an ordered map keyed by StreamID costs a fraction of a rax walk per
delivery and ack. Keys are the StreamIDs themselves (no 16-byte encoding on the
hot path); the snapshot still writes them as 16-byte IDs (stream_codec.py).

Time: every timestamp here comes from the caller's `now_ms` (the command's
stamped time); nothing reads a clock.
"""
from itertools import islice

from ..invariant import invariant
from .pel import PelMap
from .rax import Rax
from .streamid import MAX_ID, MIN_ID, UINT64_MAX, StreamID

# entries_read when the group's position in the stream's history is unknown
# (redis SCG_INVALID_ENTRIES_READ).
ENTRIES_READ_UNKNOWN = -1


class NACK:
    """A delivered, not yet acknowledged entry (redis streamNACK)."""

    __slots__ = ("delivery_time", "delivery_count", "consumer")

    def __init__(self, delivery_time: int, delivery_count: int, consumer):
        self.delivery_time = delivery_time    # ms; any int64 (XCLAIM TIME may set the past)
        self.delivery_count = delivery_count  # 0 <= count <= UINT64_MAX (XCLAIM RETRYCOUNT may set 0)
        self.consumer = consumer              # the owner; None only inside XCLAIM FORCE, never at rest


class Consumer:
    """A named reader inside a group (redis streamConsumer)."""

    __slots__ = ("name", "seen_time", "pel")

    def __init__(self, name: bytes, seen_time: int):
        self.name = name                      # unique within its group; any bytes
        self.seen_time = seen_time            # ms of the last XREADGROUP/XCLAIM/... by this name
        self.pel = PelMap()                   # StreamID -> NACK; every NACK here has .consumer is self


class ConsumerGroup:
    """redis streamCG."""

    __slots__ = ("last_id", "entries_read", "pel", "consumers",
                 "max_deliveries", "dead_letter_key", "dead_lettered")

    def __init__(self, last_id: StreamID, entries_read: int):
        self.last_id = last_id                # `>` reads serve IDs strictly greater than this
        self.entries_read = entries_read      # -1 (unknown) or >= 0
        self.pel = PelMap()                   # StreamID -> NACK, union of the consumers' PELs
        self.consumers = Rax()                # name -> Consumer
        self.max_deliveries = 0               # 0: no policy; N: dead-letter past N deliveries
        self.dead_letter_key = None           # bytes when max_deliveries > 0
        self.dead_lettered = 0                # entries ever dead-lettered by this group


# -- lookups and life cycle ---------------------------------------------------

def lookup_group(stream, name: bytes):
    """The group called `name`, or None."""
    if stream.cgroups is None:
        return None
    return stream.cgroups.find(name, None)


def create_group(stream, name: bytes, last_id: StreamID, entries_read: int):
    """A new group, or None when the name is taken (redis streamCreateCG)."""
    if stream.cgroups is None:
        stream.cgroups = Rax()
    if stream.cgroups.find(name, None) is not None:
        return None
    group = ConsumerGroup(last_id, entries_read)
    stream.cgroups.insert(name, group)
    return group


def destroy_group(stream, name: bytes) -> bool:
    if stream.cgroups is None:
        return False
    removed, _ = stream.cgroups.remove(name)
    return removed


def lookup_consumer(group, name: bytes, now_ms: int | None):
    """The consumer called `name`, or None. Seen-time is refreshed to now_ms
    unless now_ms is None (redis SLC_NO_REFRESH)."""
    consumer = group.consumers.find(name, None)
    if consumer is not None and now_ms is not None:
        consumer.seen_time = now_ms
    return consumer


def create_consumer(group, name: bytes, now_ms: int):
    """A new consumer seen now, or None when the name is taken."""
    if group.consumers.find(name, None) is not None:
        return None
    consumer = Consumer(name, now_ms)
    group.consumers.insert(name, consumer)
    return consumer


def lookup_or_create_consumer(group, name: bytes, now_ms: int):
    consumer = lookup_consumer(group, name, now_ms)
    if consumer is None:
        consumer = create_consumer(group, name, now_ms)
    return consumer


def delete_consumer(group, consumer) -> int:
    """Drop a consumer and its pending entries; returns how many it had."""
    pending = consumer.pel.numele
    for key, _ in consumer.pel.items():
        removed, _ = group.pel.remove(key)
        invariant(removed, "a consumer's pending entry is in its group's PEL")
    group.consumers.remove(consumer.name)
    return pending


# -- pending entries ----------------------------------------------------------
# PEL keys are StreamIDs (see the module docstring).

def assign_delivery(group, consumer, sid: StreamID, now_ms: int) -> NACK:
    """Record that `sid` was just delivered to `consumer` by a `>` read: a new
    NACK, or the existing one moved to this consumer with its count reset."""
    nack = group.pel.find(sid, None)
    if nack is None:
        nack = NACK(now_ms, 1, consumer)
        group.pel.insert(sid, nack)
        inserted = consumer.pel.insert(sid, nack)
        invariant(inserted, "a new group PEL entry is new in the consumer PEL too")
        return nack
    # SETID moved the group back: the entry is pending already, maybe elsewhere.
    nack.consumer.pel.remove(sid)
    nack.consumer = consumer
    nack.delivery_time = now_ms
    nack.delivery_count = 1
    consumer.pel.insert(sid, nack)
    return nack


def transfer(group, nack: NACK, sid: StreamID, consumer) -> None:
    """Make `consumer` the owner of the pending entry `sid` (XCLAIM, XAUTOCLAIM)."""
    if nack.consumer is consumer:
        return
    if nack.consumer is not None:
        nack.consumer.pel.remove(sid)
    consumer.pel.insert(sid, nack)
    nack.consumer = consumer


def drop_pending(group, sid: StreamID) -> bool:
    """Remove a pending entry from the group and its owner (XACK, or an entry
    deleted from the stream found by XCLAIM/XAUTOCLAIM)."""
    removed, nack = group.pel.remove(sid)
    if not removed:
        return False
    owner_removed, _ = nack.consumer.pel.remove(sid)
    invariant(owner_removed, "a pending entry is in its owner's PEL")
    return True


def count_delivery(nack: NACK) -> None:
    """One more delivery; the counter is a uint64 that wraps, as in redis."""
    nack.delivery_count = (nack.delivery_count + 1) & UINT64_MAX


def pel_next(pel, sid: StreamID):
    """The first (StreamID, NACK) of `pel` at or after `sid`, or None."""
    return pel.ceiling(sid)


# -- delivery (redis streamReplyWithRange with a group) -----------------------

def deliver_new(stream, group, consumer, start: StreamID, count: int, noack: bool, now_ms: int,
                served=None) -> list:
    """Serve entries from `start` on (count 0 = all) to `consumer`, moving the
    group's last ID and read counter forward; without NOACK each served entry
    becomes pending for the consumer. Returns [(StreamID, fields), ...].

    `served`, when given, is that list already read from the stream (the
    caller peeked at it). Redis does all of this entry by entry; nothing here
    reads what an earlier entry's step wrote except the counter and last ID,
    so the entries are read first, then the counter walks them, then the
    NACKs are made (in one bulk step when none of the IDs is pending yet)."""
    if served is None:
        served = list(islice(stream.iter_range(start, MAX_ID), count or None))
    if not served:
        return served
    _advance_group(stream, group, served)
    if noack:
        return served
    first_sid = served[0][0]
    last = group.pel.last()
    if last is None or first_sid > last[0]:
        # All new, and past every pending ID (the consumer's PEL is a subset of
        # the group's): append them to both PELs at once.
        keys = [sid for sid, _ in served]
        nacks = [NACK(now_ms, 1, consumer) for _ in keys]
        group.pel.extend_sorted(keys, nacks)
        consumer.pel.extend_sorted(keys, nacks)
    else:
        for sid, _ in served:            # SETID moved the group back over pending IDs
            assign_delivery(group, consumer, sid, now_ms)
    return served


def new_entry_ids(stream, start: StreamID, count: int) -> list:
    """[(StreamID, None), ...] of the live entries from `start` on, the first
    `count` (0 = all): the IDs of list(islice(stream.iter_range(start, MAX_ID),
    count or None)), in order, without decoding any field or value (a `>`
    delivery whose reply nobody wants: deliver_new needs the IDs only)."""
    return [(sid, None) for sid in stream.live_ids(start, count)]


def _advance_group(stream, group, served: list) -> None:
    """redis's per-entry update of last_id and entries_read for the served
    entries (ascending IDs), with an O(1) path for the usual case."""
    last_id = group.last_id
    entries_read = group.entries_read
    first_sid = served[0][0]
    max_deleted = stream.max_deleted_entry_id
    # range_has_tombstones(stream, sid, None) == tombstones and sid <= max_deleted
    tombstones = bool(stream.length) and max_deleted != MIN_ID and not stream.first_id > max_deleted
    if first_sid > last_id and entries_read != ENTRIES_READ_UNKNOWN and not (tombstones and first_sid <= max_deleted):
        # Every served ID is past last_id and past any tombstone: each one
        # would take the "+1" branch below.
        group.entries_read = entries_read + len(served)
        group.last_id = served[-1][0]
        return
    for sid, _ in served:
        if sid > last_id:
            if entries_read != ENTRIES_READ_UNKNOWN and not (tombstones and sid <= max_deleted):
                entries_read += 1      # no gap ahead: the counter stays exact
            elif stream.entries_added:
                entries_read = estimate_distance_from_first_ever_entry(stream, sid)
            last_id = sid
    group.entries_read = entries_read
    group.last_id = last_id


def deliver_history(stream, consumer, start: StreamID, count: int, now_ms: int,
                    dead_letters=None) -> list:
    """The consumer's own pending entries from `start` on (count 0 = all):
    [(StreamID, fields or None when the entry was deleted), ...]. Entries still
    in the stream count as delivered again; with `dead_letters` (the group's
    dead_letters.DeadLetterTarget), one that would pass the group's max
    deliveries is dead-lettered instead and left out of the reply (it counts
    against `count`, so one command's work stays bounded)."""
    served = []
    last_node = [None, None]             # stream.get's node cache: the dead-letter stream is another key
    moved = []
    for sid, nack in consumer.pel.items(start):
        if count and len(served) + len(moved) >= count:
            break
        fields = stream.get(sid, last_node)
        if fields is not None:
            if dead_letters is not None and 0 < dead_letters.group.max_deliveries <= nack.delivery_count:
                moved.append((sid, nack, fields))   # not while walking the PEL it leaves
                continue
            nack.delivery_time = now_ms
            count_delivery(nack)
        served.append((sid, fields))
    for sid, nack, fields in moved:
        if not dead_letters.move(sid, nack, fields, now_ms, consumer.name):
            # No `*` ID left in the dead-letter stream: delivered as usual after all.
            nack.delivery_time = now_ms
            count_delivery(nack)
            served.append((sid, fields))
    if moved:
        served.sort(key=lambda item: item[0])
    return served


# -- read counters and lag (redis 7.0) ----------------------------------------

def range_has_tombstones(stream, start, end) -> bool:
    """Whether [start, end] (None = open) may contain a deleted entry
    (redis streamRangeHasTombstones)."""
    if not stream.length or stream.max_deleted_entry_id == MIN_ID:
        return False
    if stream.first_id > stream.max_deleted_entry_id:
        return False                          # the latest deletion is behind the first entry
    lo = MIN_ID if start is None else start
    hi = MAX_ID if end is None else end
    return lo <= stream.max_deleted_entry_id <= hi


def estimate_distance_from_first_ever_entry(stream, sid: StreamID) -> int:
    """The logical read counter of `sid`, or -1 when it cannot be known
    (redis streamEstimateDistanceFromFirstEverEntry)."""
    if not stream.entries_added:
        return 0
    if not stream.length and sid <= stream.last_id:
        return stream.entries_added
    if sid == stream.last_id:
        return stream.entries_added
    if sid > stream.last_id:
        return ENTRIES_READ_UNKNOWN           # the future
    if stream.max_deleted_entry_id == MIN_ID or stream.max_deleted_entry_id < stream.first_id:
        if sid < stream.first_id:
            return stream.entries_added - stream.length
        if sid == stream.first_id:
            return stream.entries_added - stream.length + 1
    return ENTRIES_READ_UNKNOWN


def group_lag(stream, group):
    """Entries not yet delivered to the group, or None when unknown
    (redis streamReplyWithCGLag)."""
    if not stream.entries_added:
        return 0
    if group.entries_read != ENTRIES_READ_UNKNOWN and not range_has_tombstones(stream, group.last_id, None):
        return stream.entries_added - group.entries_read
    entries_read = estimate_distance_from_first_ever_entry(stream, group.last_id)
    if entries_read == ENTRIES_READ_UNKNOWN:
        return None
    return stream.entries_added - entries_read


# -- invariants ---------------------------------------------------------------

def check_group(group) -> None:
    """Invariant: the consumer PELs partition the group PEL with shared NACKs,
    and every PEL is a well-formed PelMap."""
    group.pel.check()
    owned = 0
    for name, consumer in group.consumers.items():
        invariant(consumer.name == name, "a consumer is filed under its own name")
        consumer.pel.check()
        for key, nack in consumer.pel.items():
            invariant(nack.consumer is consumer, "every NACK in a consumer PEL is owned by it")
            invariant(group.pel.find(key, None) is nack, "every consumer NACK is the group's NACK")
            owned += 1
    invariant(owned == group.pel.numele, "every group NACK is in exactly one consumer PEL")
    invariant(group.entries_read >= ENTRIES_READ_UNKNOWN, "entries_read is -1 or a count")


def check_groups(stream) -> None:
    if stream.cgroups is None:
        return
    for _, group in stream.cgroups.items():
        check_group(group)
