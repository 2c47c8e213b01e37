"""Poison messages: a consumer group's max-deliveries policy and its dead-letter stream.

An xraft extension (not in any redis). A group may carry a policy

    ConsumerGroup.max_deliveries   int     0 = no policy; else N >= 1
    ConsumerGroup.dead_letter_key  bytes   the stream dead letters go to (None without a policy)
    ConsumerGroup.dead_lettered    int     entries this group ever dead-lettered (kept when
                                           the policy is cleared; XINFO GROUPS shows it)

set by XRAFT.GROUPCFG (cmd_dead_letters.py). Every delivery path that counts a
delivery again (XREADGROUP of the consumer's history, XCLAIM and XAUTOCLAIM
without JUSTID or RETRYCOUNT) asks `over_limit(group, nack)` first: when that
delivery would make the count exceed N, the entry is not delivered; in the same
command (so in the same log entry, on every replica alike) it is appended to the
dead-letter stream and dropped from the group's PEL (acknowledged). A `>` read
never dead-letters: it is the first delivery (count 1 <= N).

A dead letter is a stream entry with `*` ID (the command's stamped time) and the fields

    id <source entry ID> stream <source key> group <group> consumer <last owner>
    deliveries <delivery count so far (N)>   then the source entry's own field/value pairs

(the payload is left out when the whole would pass the entry size limit). The
dead-letter key hashes to the source key's slot (XRAFT.GROUPCFG requires it):
one log entry applies to one Raft group.

Errors come before any change: a command that may dead-letter checks the
dead-letter key's type first (`dead_letter_target`), and fails with WRONGTYPE
when another type took it. The dead-letter stream is created on first use.

A move acknowledges the entry in the source group like XACK does, so it also
runs the source stream's ACKED retention (refs.py, XCFGSET RETENTION ACKED):
each command calls `apply_source_retention()` once after its moves (not during
them: the command may still be walking the stream or the PEL).
"""
from .refs import apply_retention
from .errors import WrongTypeError
from .stream import Stream
from .streamid import format_id

# Field names of a dead letter, in order (the SDK's dead_letters() reads them).
DEAD_LETTER_FIELDS = (b"id", b"stream", b"group", b"consumer", b"deliveries")
# Largest dead letter (redis's XADD entry limit, cmd_streams.ENTRY_MAX_BYTES).
_ENTRY_MAX_BYTES = 1 << 30
# MAXDELIVERIES upper bound: delivery counts are uint64, a policy a signed long.
MAX_DELIVERIES_LIMIT = (1 << 63) - 1


def has_policy(group) -> bool:
    return group.max_deliveries > 0


def over_limit(group, nack) -> bool:
    """Whether one more delivery of `nack` would pass the group's limit."""
    return 0 < group.max_deliveries <= nack.delivery_count


class DeadLetterTarget:
    """Where one command's dead letters of one group go (resolved before any change)."""

    __slots__ = ("db", "key", "source_key", "group_name", "group", "moved")

    def __init__(self, db, key: bytes, source_key: bytes, group_name: bytes, group):
        self.db = db
        self.key = key                  # holds a Stream or nothing (checked when made)
        self.source_key = source_key
        self.group_name = group_name
        self.group = group
        self.moved = 0                  # dead letters this command moved (acks in the source group)

    def move(self, sid, nack, fields: list, now_ms: int, fallback_consumer: bytes) -> bool:
        """Append the dead letter of pending entry `sid` and acknowledge it in
        the group. False (nothing changed: deliver it as usual) only when the
        dead-letter stream has no `*` ID left (its last ID is the largest)."""
        stream = self.db.data.get(self.key)     # looked up again: an earlier move may have made it
        target = stream if stream is not None else Stream()
        dead_id = target.next_auto_id(now_ms)
        if dead_id is None:
            return False
        owner = nack.consumer.name if nack.consumer is not None else fallback_consumer
        letter = [b"id", format_id(sid), b"stream", self.source_key, b"group", self.group_name,
                  b"consumer", owner, b"deliveries", b"%d" % nack.delivery_count]
        if sum(map(len, letter)) + sum(map(len, fields)) <= _ENTRY_MAX_BYTES:
            letter.extend(fields)
        if stream is None:
            self.db.set(self.key, target)
        config = self.db.config
        target.append(dead_id, letter, config.stream_node_max_bytes, config.stream_node_max_entries)
        self.db.signal_ready(self.key)      # XREAD BLOCK readers of the dead-letter stream
        self.db.note_side_write(self.key)   # WATCH: a write to a key the command does not name
        _ack(self.group, sid, nack)
        self.group.dead_lettered += 1
        self.moved += 1
        return True

    def apply_source_retention(self) -> int:
        """After the command's moves: the source stream's ACKED retention, as
        after an XACK (nothing without a move or without the policy). Entries
        deleted from the source stream."""
        if not self.moved:
            return 0
        source = self.db.data.get(self.source_key)
        return 0 if source is None else apply_retention(source)


def _ack(group, sid, nack) -> None:
    group.pel.remove(sid)
    if nack.consumer is not None:
        nack.consumer.pel.remove(sid)


def dead_letter_target(db, source_key: bytes, group_name: bytes, group):
    """The DeadLetterTarget of `group`, or None without a policy. WRONGTYPE
    when the dead-letter key holds something else than a stream."""
    if not has_policy(group):
        return None
    value = db.data.get(group.dead_letter_key)
    if value is not None and type(value) is not Stream:
        raise WrongTypeError()
    return DeadLetterTarget(db, group.dead_letter_key, source_key, group_name, group)
