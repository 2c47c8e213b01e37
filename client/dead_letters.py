"""Poison messages in the SDK: a group's dead-letter policy, and reading its dead letters.

The server side is node/engine/dead_letters.py: past `max_deliveries`
deliveries, XREADGROUP (of a consumer's history), XCLAIM and XAUTOCLAIM move
an entry to the group's dead-letter stream (same slot as the source: use a
hash tag, e.g. `{orders}` and `{orders}:dead`) and acknowledge it. Each dead
letter's fields are `id stream group consumer deliveries` and then the
entry's own fields.
"""
from dataclasses import dataclass

from .types import StreamID, to_bytes

GROUPCFG = b"XRAFT.GROUPCFG"
_META = (b"id", b"stream", b"group", b"consumer", b"deliveries")


@dataclass(frozen=True)
class DeadLetter:
    id: StreamID                # the dead letter's own ID in the dead-letter stream
    source_id: StreamID         # the entry's ID in its source stream
    stream: bytes               # the source stream
    group: bytes
    consumer: bytes             # the consumer that had it last
    deliveries: int             # deliveries before it was dead-lettered (the group's max)
    fields: tuple               # the entry's own (field, value) pairs


class NotADeadLetter(ValueError):
    """A dead-letter stream entry without the fields XRAFT.GROUPCFG's move writes."""


def dead_letter_from_entry(entry) -> DeadLetter:
    """A StreamEntry of a dead-letter stream as a DeadLetter."""
    fields = entry.fields
    if len(fields) < len(_META) or tuple(name for name, _ in fields[:len(_META)]) != _META:
        raise NotADeadLetter(f"entry {entry.id} of a dead-letter stream lacks {_META!r}")
    values = [value for _, value in fields[:len(_META)]]
    return DeadLetter(entry.id, StreamID.parse(values[0]), values[1], values[2], values[3], int(values[4]),
                      tuple(fields[len(_META):]))


class DeadLetterCommands:
    """Mixed into Client (aio.py): needs execute, xrange and subscribe."""

    async def xgroup_cfg(self, key, group, max_deliveries: int, dead_letter_key=None, *, timeout=None) -> None:
        """XRAFT.GROUPCFG key group MAXDELIVERIES n [DEADLETTER dead-letter-key]:
        n > 0 sets the policy (dead_letter_key required, same slot as key);
        0 clears it."""
        argv = [GROUPCFG, to_bytes(key), to_bytes(group), b"MAXDELIVERIES", b"%d" % max_deliveries]
        if dead_letter_key is not None:
            argv += [b"DEADLETTER", to_bytes(dead_letter_key)]
        await self.execute(*argv, timeout=timeout, key=key)

    async def dead_letters(self, dead_letter_key, *, after="-", count: int = 100, follow: bool = False):
        """The dead letters of a dead-letter stream, oldest first, as DeadLetter:
        pages of `count` from after `after` (exclusive, or "-" for the start);
        with follow=True it then tails the stream for new ones (forever)."""
        key = to_bytes(dead_letter_key)
        last = None if after in ("-", b"-") else StreamID.parse(after)
        while True:
            lo = "-" if last is None else "(" + str(last)
            page = await self.xrange(key, lo, "+", count)
            for entry in page:
                yield dead_letter_from_entry(entry)
                last = entry.id
            if len(page) < count:
                break
        if not follow:
            return
        async for _, entries in self.subscribe({key: str(last) if last is not None else "0-0"}):
            for entry in entries:
                yield dead_letter_from_entry(entry)
