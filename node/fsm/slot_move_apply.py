"""Applying the SLOT_MOVE records (slot_moves.py has the state and the rules; the contract is
docs/slot-move-steps.md). `apply_move(sm, argv, index, now)` -> the record's result: OK, an
integer, or MoveRefused (nothing changed). Deterministic: reads only the fsm state and argv.
"""
from __future__ import annotations

from ..engine.dump import CorruptDump, check_records, load_records
from ..engine.stream_delta import DELTA_TAG, DeltaMismatch, apply_delta, split_record
from ..engine.replies import OK
from ..engine.slots import SLOT_COUNT
from .gc_pause import gc_paused
from .sessions import CorruptSessions, Sessions
from .slot_moves import (CURSOR, DIGEST_BYTES, END, KEYS_DONE, MAX_EPOCH, MAX_PARTIAL_BYTES, PURGE_BATCH, MoveId,
                         MoveRefused,
                         Phase, Staging, PHASE_WORDS, key_position, decode_cursor, encode_cursor, with_slots)

OPS = (b"SEAL", b"UNSEAL", b"STAGE", b"DROP_STAGING", b"ACTIVATE", b"RELEASE", b"PURGE", b"PRESTAGE")
_ARGC = {b"STAGE": 9, b"ACTIVATE": 5, b"PRESTAGE": 7}   # every other op: 4 (op first last epoch)
MAX_NOW = (1 << 63) - 1


def _int(raw: bytes, hi: int):
    raw = bytes(raw)
    if not (raw.isdigit() and raw.isascii() and len(raw) <= 19 and (raw == b"0" or raw[:1] != b"0")):
        return None
    v = int(raw)
    return v if v <= hi else None


def parse_move(argv):
    """(op, MoveId) of a SLOT_MOVE argv, or a MoveRefused saying what is malformed."""
    op = bytes(argv[0]).upper() if argv else b""
    if op not in OPS or len(argv) != _ARGC.get(op, 4):
        return MoveRefused(None, "bad SLOT_MOVE record (%r, %d arguments)" % (op[:16], len(argv)))
    first, last, epoch = _int(argv[1], SLOT_COUNT - 1), _int(argv[2], SLOT_COUNT - 1), _int(argv[3], MAX_EPOCH)
    if first is None or last is None or epoch is None or first > last or epoch == 0:
        return MoveRefused(None, "bad SLOT_MOVE record: slots or epoch out of range")
    return op, MoveId(first, last, epoch)


def move_argv(op, m: MoveId, *args) -> tuple:
    """The SLOT_MOVE argv of `op` (str or bytes) for move m."""
    op = op.encode() if isinstance(op, str) else bytes(op)
    return (op, b"%d" % m.first, b"%d" % m.last, b"%d" % m.started_epoch) + tuple(args)


def apply_move(sm, argv, index: int, now: int):
    parsed = parse_move(argv)
    if isinstance(parsed, MoveRefused):
        return parsed
    op, m = parsed
    moves = sm.moves
    phase = moves.phase(m)
    if phase is None:
        stale = moves.stale(m)
        if stale is not None:
            return stale
    return _OPS[op](sm, m, phase, argv, index, now)


# A chunk smaller than this is decoded inside its apply: a thread hop costs more than it saves.
PREPARE_MIN_BYTES = 64 << 10


def prepare_move(sm, argv, index: int):
    """The costly, pure part of applying this SLOT_MOVE record at log index `index` (decoding
    and checking the records of a STAGE / PRESTAGE chunk of at least PREPARE_MIN_BYTES: tens
    of ms for a stream with a big PEL) as a callable that leaves its result in sm.prepared for
    that apply; None when there is no such part. The node runs it in a thread after entry
    index-1 is applied and before this one is (GroupDriver, "Costly applies off the loop"),
    so its event loop serves the other groups meanwhile. The apply takes the result only if
    it was made from the very inputs the apply has (the bytes, and for STAGE the pre-copy
    base as it is then), else decodes again: the state never depends on whether, or when,
    the callable ran."""
    parsed = parse_move(argv)
    if isinstance(parsed, MoveRefused):
        return None
    op, m = parsed
    if op not in (b"STAGE", b"PRESTAGE"):
        return None
    phase = sm.moves.phase(m)
    if phase not in (None, Phase.STAGING):
        return None
    st = sm.moves.staging.get(m) if phase is Phase.STAGING else None
    try:
        after = bytes(argv[5])
        if after not in (END, KEYS_DONE) and decode_cursor(after)[2]:
            return None                              # a piece of a big record: nothing to decode yet
    except ValueError:
        return None
    if op == b"PRESTAGE":
        data = (st.pre_partial if st is not None else b"") + bytes(argv[6])
        base, version = None, 0
    else:
        data = (st.partial if st is not None else b"") + bytes(argv[7])
        base = st.base if st is not None and st.base else None
        version = st.base_version if st is not None else 0
    if len(data) < PREPARE_MIN_BYTES:
        return None

    def run() -> None:
        result = _load_prestage(data) if op == b"PRESTAGE" else _decode_chunk(base, data)
        sm.prepared.setdefault(index, []).append((base, version, data, result))
    return run


def _take_prepared(sm, index: int, base, version: int, data: bytes):
    """The decode prepare_move made for this apply from exactly these inputs, or None."""
    made = sm.prepared.get(index)
    for i, (b, v, d, result) in enumerate(made or ()):
        if b is base and v == version and d == data:
            del made[i]
            return result
    return None


def _wrong(m: MoveId, phase) -> MoveRefused:
    if phase is None:
        return MoveRefused(m, "move %s is not sealed here" % m)
    return MoveRefused(m, "move %s was %s here" % (m, PHASE_WORDS[phase]) if phase in (
        Phase.UNSEALED, Phase.DROPPED, Phase.RELEASED, Phase.PURGED) else
        "move %s is %s here" % (m, PHASE_WORDS[phase]))


def _wake(sm, m: MoveId) -> None:
    """Blocked clients on keys of the slots re-run (and meet the seal, or MOVED)."""
    ks = sm.keyspace
    for s in range(m.first, m.last + 1):
        keys = ks.slot_keys.get(s)
        if keys:
            ks.ready.update(keys)


def _seal(sm, m, phase, argv, index, now):
    if phase is Phase.SEALED:
        return OK
    if phase is not None:
        return _wrong(m, phase)
    for s in range(m.first, m.last + 1):
        if not sm.owned.owns(s):
            return MoveRefused(m, "group does not own slot %d" % s)
        if sm.moves.sealed[s]:
            return MoveRefused(m, "slot %d is sealed by another move" % s)
    sm.moves.begin(m, Phase.SEALED)
    sm.moves.reseal()
    _wake(sm, m)
    return OK


def _abort_here(sm, m, phase, aborted: Phase) -> bool:
    """UNSEAL / DROP_STAGING of a move live here (SEALED / STAGING) or never seen: True if it
    was live and is now `aborted` (the caller undoes its effect); False when there is nothing
    to undo. A move never seen here gets a tombstone, so a late SEAL / STAGE of it is refused."""
    if phase is None:
        sm.moves.begin(m, aborted)
        return False
    sm.moves.set_phase(m, aborted)
    return True


def _unseal(sm, m, phase, argv, index, now):
    if phase not in (None, Phase.SEALED, Phase.UNSEALED):
        return _wrong(m, phase)
    if phase is not Phase.UNSEALED and _abort_here(sm, m, phase, Phase.UNSEALED):
        sm.moves.reseal()
        _wake(sm, m)
    return OK


def _stage(sm, m, phase, argv, index, now):
    before, after, floor, chunk, sessions = (bytes(a) for a in argv[4:9])
    floor = _int(floor, MAX_NOW)
    if len(before) != CURSOR.size or len(after) != CURSOR.size or floor is None or not before < after:
        return MoveRefused(m, "bad STAGE record for move %s (cursors or time)" % m)
    st = _staging_for(sm, m, phase)
    if isinstance(st, MoveRefused):
        return st
    if after <= st.cursor:
        return len(st.records)                       # this chunk is staged already
    if before != st.cursor:
        return MoveRefused(m, "staging of move %s is at cursor %s, chunk starts at %s"
                           % (m, st.cursor.hex(), before.hex()))
    partial = decode_cursor(after)[2] if after not in (END, KEYS_DONE) else 0
    if partial:                                      # a piece of a record larger than a chunk
        if len(st.partial) + len(chunk) != partial or partial > MAX_PARTIAL_BYTES or sessions:
            return MoveRefused(m, "bad chunk for move %s: a piece that does not end at its cursor" % m)
        recs = []
    else:
        data = st.partial + chunk
        recs = _check_chunk(m, st, before, after, data, sessions, now,
                            _take_prepared(sm, index, st.base if st.base else None, st.base_version, data))
        if isinstance(recs, str):
            return MoveRefused(m, "bad chunk for move %s: %s" % (m, recs))
    if phase is None:
        sm.moves.begin(m, Phase.STAGING)
        sm.moves.staging[m] = st
    st.partial = st.partial + chunk if partial else b""
    for key, value, raw in recs:
        st.records[key] = raw
        st.loaded[key] = value
    if sessions:
        st.sessions = sessions
    st.cursor = after
    st.floor_ms = max(st.floor_ms, floor)
    # Idle times never go backwards at B: its replicated time is at least A's at export.
    sm.last_now_ms = max(sm.last_now_ms, floor)
    return len(st.records)


def _staging_for(sm, m, phase):
    """The move's staging at B (a new one if the move is new here), or a refusal."""
    if phase is Phase.STAGING:
        return sm.moves.staging[m]
    if phase is not None:
        return _wrong(m, phase)
    for s in range(m.first, m.last + 1):
        if sm.owned.owns(s):
            return MoveRefused(m, "group owns slot %d" % s)
    return Staging(encode_cursor(m.first, 0))


def _prestage(sm, m, phase, argv, index, now):
    """One pre-copy chunk (exported while A still serves) into the staging's base: records by
    key, in any order, replacing older copies, each checked by its loader. Best effort by
    design: a record torn between pieces (A changed it meanwhile) is dropped, since the sealed copy sends every key again
    (in full, or as a DELTA checked against this base). Refused once the sealed copy began."""
    before, after, chunk = (bytes(a) for a in argv[4:7])
    if len(before) != CURSOR.size or len(after) != CURSOR.size or not before < after:
        return MoveRefused(m, "bad PRESTAGE record for move %s (cursors)" % m)
    st = _staging_for(sm, m, phase)
    if isinstance(st, MoveRefused):
        return st
    if st.cursor != encode_cursor(m.first, 0) or st.partial:
        return MoveRefused(m, "staging of move %s is past its pre-copy" % m)
    at = st.pre_cursor or encode_cursor(m.first, 0)
    if after <= at:
        return len(st.base)                          # this chunk is pre-copied already
    if before != at:
        return MoveRefused(m, "pre-copy of move %s is at cursor %s, chunk starts at %s" % (m, at.hex(), before.hex()))
    piece = decode_cursor(after)[2] if after not in (END, KEYS_DONE) else 0
    recs = []
    if piece:
        if len(st.pre_partial) + len(chunk) != piece:
            return MoveRefused(m, "bad pre-copy chunk for move %s: a piece that does not end at its cursor" % m)
    else:
        # Checked as STAGE checks records, but for a stream's groups and PELs (_load_prestage;
        # it also warms the engine's cache of checked stream nodes, so the sealed copy and
        # ACTIVATE meet these nodes again for free).
        data = st.pre_partial + chunk
        recs = _take_prepared(sm, index, None, 0, data)
        if recs is None:
            recs = _load_prestage(data)
        if isinstance(recs, CorruptDump):
            if not st.pre_partial:
                return MoveRefused(m, "bad pre-copy chunk for move %s: %s" % (m, recs))
            recs = []                                # a record A changed between its pieces
        if any(not m.first <= key_position(key)[0] <= m.last for key, _ in recs):
            return MoveRefused(m, "bad pre-copy chunk for move %s: a key outside its slots" % m)
    if phase is None:
        sm.moves.begin(m, Phase.STAGING)
        sm.moves.staging[m] = st
    st.pre_partial = st.pre_partial + chunk if piece else b""
    for key, raw in recs:
        st.base[key] = raw
    if recs:
        st.base_version += 1
    st.pre_cursor = after
    return len(st.base)


def _record_size(buf: bytes, pos: int) -> int:
    """Bytes of the framed record starting at buf[pos] (dump.py's framing)."""
    if len(buf) - pos < 13:
        raise DeltaMismatch("a record runs past the chunk")
    key_len = int.from_bytes(buf[pos + 1:pos + 5], "big")
    at = pos + 5 + key_len
    if at + 4 > len(buf):
        raise DeltaMismatch("a record runs past the chunk")
    size = 5 + key_len + 4 + int.from_bytes(buf[at:at + 4], "big") + 4
    if pos + size > len(buf):
        raise DeltaMismatch("a record runs past the chunk")
    return size


def _resolve_deltas(base, chunk: bytes) -> bytes:
    """The chunk with each DELTA record rebuilt into the full record, from the pre-copy."""
    if not base:
        return chunk
    out, pos = [], 0
    while pos < len(chunk):
        size = _record_size(chunk, pos)
        raw = chunk[pos:pos + size]
        if raw[0] == DELTA_TAG:
            key = split_record(raw)[1]
            raw = apply_delta(raw, base.get(key))[1]
        out.append(raw)
        pos += size
    return b"".join(out)


def _load_prestage(data: bytes):
    """PRESTAGE's check of a chunk: [(key, record)], or the CorruptDump (returned, so a
    check run ahead of the apply hands it over as a value). A stream's groups and PELs are
    not loaded (check_records): nothing serves the pre-copy's base; the sealed copy's
    records are loaded in full (and a DELTA's rebuilt record with them). Every replica of
    B checks the same chunk at once on a 3-node machine: the PEL's load was most of it."""
    try:
        return check_records(data)
    except CorruptDump as e:
        return e


def _decode_chunk(base, chunk: bytes):
    """STAGE's decode of a chunk (DELTA records rebuilt from `base`, the pre-copy):
    [(key, value, record)], or what is wrong with it (a str). The collector is paused over
    the load and its objects made old (gc_pause.py): a big PEL's load on all three replicas
    of B at once triggered young collections that stopped each node's loop, the prepare
    thread's included (the collector holds the GIL)."""
    try:
        data = _resolve_deltas(base, chunk)
        with gc_paused():
            return load_records(data)
    except DeltaMismatch as e:
        return "delta does not fit the pre-copy: %s" % e
    except CorruptDump as e:
        return str(e)


def _check_chunk(m, st, before, after, chunk, sessions, now, recs=None):
    """The chunk's [(key, value, record)], or what is wrong with it (a str). `recs`: the
    chunk's decode made ahead of the apply (prepare_move), None: decoded here."""
    if recs is None:
        recs = _decode_chunk(st.base, chunk)
    if isinstance(recs, str):
        return recs
    last = next(reversed(st.records)) if st.records else None
    prev = key_position(last) if last is not None else None
    lo_slot = decode_cursor(before)[0]
    hi_slot = m.last if after in (END, KEYS_DONE) else decode_cursor(after)[0]
    for key, _, _ in recs:
        pos = key_position(key)
        if not (m.first <= pos[0] <= m.last and lo_slot <= pos[0] <= hi_slot):
            return "key of slot %d outside the chunk's slots" % pos[0]
        if prev is not None and pos <= prev:
            return "keys out of order"
        prev = pos
    if sessions:
        if after != END:
            return "a session table before the last chunk"
        try:
            Sessions.decode(sessions, now)
        except CorruptSessions as e:
            return "session table: %s" % e
    return recs


def _drop(sm, m, phase, argv, index, now):
    if phase not in (None, Phase.STAGING, Phase.DROPPED):
        return _wrong(m, phase)  # (DROP_STAGING drops the pre-copy's base with the staging)
    if phase is not Phase.DROPPED and _abort_here(sm, m, phase, Phase.DROPPED):
        del sm.moves.staging[m]
    return OK


def _activate(sm, m, phase, argv, index, now):
    digest = bytes(argv[4])
    if len(digest) != DIGEST_BYTES:
        return MoveRefused(m, "a digest is %d bytes" % DIGEST_BYTES)
    if phase is Phase.ACTIVE:
        return OK
    if phase is not Phase.STAGING:
        return MoveRefused(m, "move %s has no staging here" % m) if phase is None else _wrong(m, phase)
    st = sm.moves.staging[m]
    if st.cursor != END:
        return MoveRefused(m, "staging of move %s is not complete" % m)
    staged = st.digest()
    if staged != digest:
        return MoveRefused(m, "digest mismatch for move %s (staged %s, asked %s)" % (m, staged.hex(), digest.hex()))
    ks = sm.keyspace
    for s in range(m.first, m.last + 1):             # leftovers of an earlier move away, not yet purged
        for key in list(ks.slot_keys.get(s, ())):
            ks.delete(key)
    for key, raw in st.records.items():
        value = st.loaded.pop(key, None)
        if value is None:                            # staged before a restart: decode again
            with gc_paused():
                (key, value, _), = load_records(raw)
        ks.set(key, value)
        sm.versions.touch(key, index)
    if st.sessions:
        sm.sessions.merge(Sessions.decode(st.sessions, sm.last_now_ms), now)
    sm.last_now_ms = max(sm.last_now_ms, st.floor_ms)
    sm.owned = with_slots(sm.owned, m.first, m.last, True)
    del sm.moves.staging[m]
    sm.moves.set_phase(m, Phase.ACTIVE)
    return OK


def _purge_some(sm, m) -> int:
    """Delete up to PURGE_BATCH keys of the slots no longer owned; how many are left."""
    ks, budget, left = sm.keyspace, PURGE_BATCH, 0
    for s in range(m.first, m.last + 1):
        if sm.owned.owns(s):
            continue
        keys = ks.slot_keys.get(s)
        if not keys:
            continue
        if budget:
            doomed = list(keys)[:budget]
            budget -= len(doomed)
            for key in doomed:
                ks.delete(key)
        left += ks.count_keys_in_slot(s)
    return left


def _release(sm, m, phase, argv, index, now):
    if phase is Phase.PURGED:
        return 0
    if phase is Phase.RELEASED:
        return _purge(sm, m, phase, argv, index, now)
    if phase is not Phase.SEALED:
        return _wrong(m, phase)
    _wake(sm, m)                                     # blocked clients: now MOVED
    sm.owned = with_slots(sm.owned, m.first, m.last, False)
    sm.moves.set_phase(m, Phase.RELEASED)
    sm.moves.reseal()
    return _purge(sm, m, Phase.RELEASED, argv, index, now)


def _purge(sm, m, phase, argv, index, now):
    if phase is Phase.PURGED:
        return 0
    if phase is not Phase.RELEASED:
        return _wrong(m, phase)
    left = _purge_some(sm, m)
    if not left:
        sm.moves.set_phase(m, Phase.PURGED)
    return left


_OPS = {b"SEAL": _seal, b"UNSEAL": _unseal, b"STAGE": _stage, b"DROP_STAGING": _drop,
        b"ACTIVATE": _activate, b"RELEASE": _release, b"PURGE": _purge, b"PRESTAGE": _prestage}
