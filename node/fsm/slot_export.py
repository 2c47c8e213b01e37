"""The reads of a slot move at the source group A (docs/slot-move-steps.md): export a chunk
of the sealed slots' keys, and the manifest digest of them all. Pure functions of the fsm
state; the node runs them on A's leader after a read index (linearizable).

Order: slot, then key bytes. The cursor is (slot, ordinal of the next key in that slot):
stable because A is sealed, so the keys of those slots cannot change between chunks.
"""
from __future__ import annotations

import struct
from typing import Optional

from ..engine.dump import dump_record
from ..engine.stream import Stream
from ..engine.stream_delta import delta_record, last_node
from .slot_moves import (END, KEYS_DONE, MAX_CHUNK_BYTES, MAX_SESSIONS_BYTES, MoveId, MoveRefused,
                         Phase, decode_cursor, digest_of, encode_cursor)


def _sealed(sm, m: MoveId) -> None:
    if sm.moves.phase(m) is not Phase.SEALED:
        raise MoveRefused(m, "move %s is not sealed here" % m)


def _slot_keys(sm, slot: int) -> list:
    return sorted(sm.keyspace.slot_keys.get(slot, ()))


def export_chunk(sm, m: MoveId, cursor: bytes, max_bytes: int, *, live: bool = False,
                 have: Optional[dict] = None, pieces: Optional[dict] = None) -> tuple:
    """(records, next_cursor, done, sessions): records of the keys from `cursor` on, at most
    max_bytes of them (at least one key); after the last key, one chunk with A's session
    table and no records. Raises MoveRefused if the move is not sealed here or the cursor is
    not one of its cursors.

    live: the pre-copy, while A still serves the slots (it must own them all): the same
    chunks, but nothing holds still between them (keys may be skipped or sent twice, a record
    sent in pieces may tear); the sealed copy that follows repairs all of it.
    have: {key: last node id} of the streams B pre-copied (decode_have): such a key, still a
    stream here, is sent as a DELTA record against B's copy (engine/stream_delta.py).
    pieces: the caller's dict (kept between calls) where a live export keeps the record it
    is sending in pieces, so that record is dumped once, not at every piece (a 100k-entry
    stream: ~30 ms a dump); its pieces are then of one state, as if it had not torn. At most
    one record: cleared at every piece."""
    if live:
        _owns_all(sm, m)
    else:
        _sealed(sm, m)
    max_bytes = max(1, min(int(max_bytes), MAX_CHUNK_BYTES))
    if cursor == END:
        return b"", END, True, b""
    if cursor == KEYS_DONE:                  # (the pre-copy needs no session table: PRESTAGE keeps none)
        return b"", END, True, b"" if live else session_table(sm)
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
            at = (m, slot, ordinal, key)
            raw = pieces.get(at) if live and offset and pieces is not None else None
            if raw is None:
                raw = _record(key, sm.keyspace.data[key], have)
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
                if live and pieces is not None:
                    pieces.clear()
                    if end < len(raw):
                        pieces[at] = raw
                return piece, nxt, False, b""
            if out and size + len(raw) > max_bytes:
                return b"".join(out), encode_cursor(slot, ordinal), False, b""
            out.append(raw)
            size += len(raw)
            ordinal += 1
        slot, ordinal = slot + 1, 0
    return b"".join(out), KEYS_DONE, False, b""


def _record(key: bytes, value, have: Optional[dict]) -> bytes:
    raw = dump_record(key, value)
    from_node = have.get(key) if have else None
    if from_node is not None and isinstance(value, Stream):
        return delta_record(raw, from_node)
    return raw


def _owns_all(sm, m: MoveId) -> None:
    for s in range(m.first, m.last + 1):
        if not sm.owned.owns(s):
            raise MoveRefused(m, "group does not own slot %d" % s)


MAX_HAVE_BYTES = 1 << 20        # B's list of pre-copied streams (sent with every sealed EXPORT)
_U32 = struct.Struct(">I")


def staged_have(sm, m: MoveId) -> bytes:
    """At B: the streams its pre-copy holds that are worth a delta, as `key_len u32 | key |
    last node id (16)` each, at most MAX_HAVE_BYTES (streams past that are sent in full)."""
    st = sm.moves.staging.get(m)
    if st is None:
        return b""
    out, size = [], 0
    for key, raw in st.base.items():
        node = last_node(raw)
        if node is None:
            continue
        size += 4 + len(key) + 16
        if size > MAX_HAVE_BYTES:
            break
        out += [_U32.pack(len(key)), key, node]
    return b"".join(out)


def decode_have(raw: bytes) -> dict:
    """The {key: last node id} staged_have wrote; ValueError on anything else."""
    out, pos = {}, 0
    if len(raw) > MAX_HAVE_BYTES:
        raise ValueError("a pre-copy list over %d bytes" % MAX_HAVE_BYTES)
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ValueError("a pre-copy list entry runs past the end")
        (n,) = _U32.unpack_from(raw, pos)
        end = pos + 4 + n + 16
        if end > len(raw):
            raise ValueError("a pre-copy list entry runs past the end")
        out[raw[pos + 4:pos + 4 + n]] = raw[pos + 4 + n:end]
        pos = end
    return out


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
    _owns_all(sm, m)
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


def precopy_status(sm, m: MoveId) -> tuple:
    """(pre-copy cursor or b"" if none began, keys pre-copied) at B."""
    st = sm.moves.staging.get(m)
    if st is None:
        return b"", 0
    return st.pre_cursor, len(st.base)
