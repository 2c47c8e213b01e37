"""The reads of a slot move at the source group A (docs/slot-move-steps.md): export a chunk
of the sealed slots' keys, and the manifest digest of them all. Pure functions of the fsm
state; the node runs them on A's leader after a read index (linearizable).

Order: slot, then key bytes. The cursor is (slot, ordinal of the next key in that slot):
stable because A is sealed, so the keys of those slots cannot change between chunks.
"""
from __future__ import annotations

from ..engine.dump import dump_record
from .slot_moves import (END, KEYS_DONE, MAX_CHUNK_BYTES, MAX_SESSIONS_BYTES, MoveId, MoveRefused,
                         Phase, decode_cursor, digest_of, encode_cursor)


def _sealed(sm, m: MoveId) -> None:
    if sm.moves.phase(m) is not Phase.SEALED:
        raise MoveRefused(m, "move %s is not sealed here" % m)


def _slot_keys(sm, slot: int) -> list:
    return sorted(sm.keyspace.slot_keys.get(slot, ()))


def export_chunk(sm, m: MoveId, cursor: bytes, max_bytes: int) -> tuple:
    """(records, next_cursor, done, sessions): records of the keys from `cursor` on, at most
    max_bytes of them (at least one key); after the last key, one chunk with A's session
    table and no records. Raises MoveRefused if the move is not sealed here or the cursor is
    not one of its cursors."""
    _sealed(sm, m)
    max_bytes = max(1, min(int(max_bytes), MAX_CHUNK_BYTES))
    if cursor == END:
        return b"", END, True, b""
    if cursor == KEYS_DONE:
        return b"", END, True, session_table(sm)
    try:
        slot, ordinal, offset = decode_cursor(cursor)
    except ValueError as e:
        raise MoveRefused(m, "bad cursor: %s" % e) from None
    if not m.first <= slot <= m.last:
        raise MoveRefused(m, "cursor slot %d outside move %s" % (slot, m))
    out, size = [], 0
    while slot <= m.last:
        keys = _slot_keys(sm, slot)
        while ordinal < len(keys):
            key = keys[ordinal]
            raw = dump_record(key, sm.keyspace.data[key])
            if offset or len(raw) > max_bytes:
                # A record larger than a chunk travels alone, in pieces of max_bytes; the
                # cursor counts the bytes sent (the record is the same at every call: sealed).
                if out:
                    return b"".join(out), encode_cursor(slot, ordinal), False, b""
                if offset >= len(raw):
                    raise MoveRefused(m, "bad cursor: offset %d in a record of %d bytes" % (offset, len(raw)))
                piece = raw[offset:offset + max_bytes]
                end = offset + len(piece)
                nxt = encode_cursor(slot, ordinal, end) if end < len(raw) else encode_cursor(slot, ordinal + 1)
                return piece, nxt, False, b""
            if out and size + len(raw) > max_bytes:
                return b"".join(out), encode_cursor(slot, ordinal), False, b""
            out.append(raw)
            size += len(raw)
            ordinal += 1
        slot, ordinal = slot + 1, 0
    return b"".join(out), KEYS_DONE, False, b""


def session_table(sm) -> bytes:
    """A's at-most-once table for B to merge; if it is over MAX_SESSIONS_BYTES, the least
    recently active clients are left out until it fits (their retries at B: SESSION_EXPIRED
    if B never saw them, else possibly a second apply; docs/slot-move-steps.md)."""
    raw = sm.sessions.encode()
    if len(raw) <= MAX_SESSIONS_BYTES:
        return raw
    trimmed = sm.sessions.newest(MAX_SESSIONS_BYTES)
    return trimmed.encode()


def manifest(sm, m: MoveId) -> bytes:
    """sha256 over the records of every key of the move's slots, in order (at A, sealed)."""
    _sealed(sm, m)
    return _digest(sm, m)


def live_digest(sm, m: MoveId) -> bytes:
    """The same digest over the live keys of the slots at a group that owns them all (B after
    ACTIVATE: what it serves is exactly what A's manifest covered)."""
    for s in range(m.first, m.last + 1):
        if not sm.owned.owns(s):
            raise MoveRefused(m, "group does not own slot %d" % s)
    return _digest(sm, m)


def _digest(sm, m: MoveId) -> bytes:
    def records():
        for slot in range(m.first, m.last + 1):
            for key in _slot_keys(sm, slot):
                yield dump_record(key, sm.keyspace.data[key])
    return digest_of(records())


def staging_status(sm, m: MoveId) -> tuple:
    """(phase or None, cursor, keys staged, digest of the staging) at B."""
    ph = sm.moves.phase(m)
    st = sm.moves.staging.get(m)
    if st is None:
        return ph, b"", 0, b""
    return ph, st.cursor, len(st.records), st.digest()
