"""The data side of an online slot move at fsm level (fsm/slot_moves.py, slot_move_apply.py,
slot_export.py; docs/slot-move-steps.md): every record's apply, idempotence, refusal of stale
moves, staging invisibility, digest equality, the frozen result, snapshots mid-move, and
determinism. Group A owns slots 0..8191, group B 8192..16383; the move is slots 100..199."""
import hashlib
import random
import struct
import zlib

import pytest

from xraft.node.engine.errors import EngineError
from xraft.node.engine.replies import OK
from xraft.node.engine.slots import SLOT_COUNT, key_slot
from xraft.node.fsm import slot_move_apply
from xraft.node.fsm.entry import Kind, Request, encode_record
from xraft.node.fsm.slot_export import export_chunk, manifest, staging_status
from xraft.node.fsm.slot_move_apply import move_argv
from xraft.node.fsm.slot_moves import (END, KEYS_DONE, MoveId, MoveRefused, Phase, SlotFrozen, encode_cursor,
                                       frozen_slot)
from xraft.node.fsm.slot_owner import OwnedSlots, SlotNotOwned, not_owned_slot
from xraft.node.fsm.state_machine import StateMachine

NOW = 1_700_000_000_000
HALF = SLOT_COUNT // 2
M = MoveId(100, 199, 5)


def argv(s: str):
    return tuple(a.encode() for a in s.split())


def keys_in(lo: int, hi: int, n: int, prefix: str = "k") -> list:
    out, i = [], 0
    while len(out) < n:
        k = "%s%d" % (prefix, i)
        if lo <= key_slot(k.encode()) <= hi:
            out.append(k)
        i += 1
    return out


MOVING = keys_in(100, 199, 6)           # keys of the moving slots
STAYING = keys_in(200, 300, 1)[0]       # a key of A that does not move


def group_a():
    return StateMachine(owned=OwnedSlots.from_ranges([(0, HALF - 1)]))


def group_b():
    return StateMachine(owned=OwnedSlots.from_ranges([(HALF, SLOT_COUNT - 1)]))


def apply(sm, *reqs, now=NOW):
    return sm.apply(sm.applied_index + 1, encode_record(now, reqs))


def cmd(sm, s, cid=0, seq=0, now=NOW):
    return apply(sm, Request.command(cid, seq, argv(s)), now=now)[0]


def step(sm, op, *args, m=M, now=NOW):
    return apply(sm, Request(0, 0, Kind.SLOT_MOVE, (move_argv(op, m, *args),)), now=now)[0]


def fill(a):
    """A stream with a consumer group holding pending entries, two consumers, a list, strings."""
    s = MOVING[0]
    for i in range(1, 6):
        cmd(a, "XADD %s %d-1 f v%d" % (s, i, i), now=NOW + i)
    cmd(a, "XGROUP CREATE %s g 0" % s)
    cmd(a, "XREADGROUP GROUP g alice COUNT 2 STREAMS %s >" % s, now=NOW + 10)
    cmd(a, "XREADGROUP GROUP g bob COUNT 2 STREAMS %s >" % s, now=NOW + 20)
    cmd(a, "XACK %s g 1-1" % s, now=NOW + 30)
    cmd(a, "XCLAIM %s g bob 0 2-1" % s, now=NOW + 40)
    cmd(a, "XGROUP CREATE %s g2 $" % s)
    cmd(a, "XDEL %s 5-1" % s)
    cmd(a, "RPUSH %s a b c" % MOVING[1])
    for k in MOVING[2:]:
        cmd(a, "SET %s %s" % (k, k))
    cmd(a, "SET %s stays" % STAYING)


def views(sm, now):
    s = MOVING[0]
    return [sm.read(argv(q % s), now) for q in (
        "XINFO STREAM %s FULL", "XINFO STREAM %s", "XINFO GROUPS %s", "XINFO CONSUMERS %s g",
        "XPENDING %s g", "XPENDING %s g - + 10", "XRANGE %s - +")] + [
        sm.read(argv("LRANGE %s 0 -1" % MOVING[1]), now)] + [sm.read(argv("GET %s" % k), now) for k in MOVING[2:]]


def copy_all(a, b, max_bytes=200, m=M):
    """Export from A into B's staging, chunk by chunk; the number of chunks."""
    cursor, n = encode_cursor(m.first, 0), 0
    while True:
        records, nxt, done, sessions = export_chunk(a, m, cursor, max_bytes)
        assert step(b, "STAGE", cursor, nxt, b"%d" % a.last_now_ms, records, sessions, m=m) >= 0
        n += 1
        cursor = nxt
        if done:
            return n


def test_a_whole_move_carries_streams_groups_pels_consumers_lists_and_strings():
    a, b = group_a(), group_b()
    fill(a)
    before = views(a, NOW + 1000)
    assert step(a, "SEAL") == OK
    chunks = copy_all(a, b)
    assert chunks >= 3                         # small chunks: the cursor resumes inside the keys
    digest = manifest(a, M)
    phase, cursor, staged, staged_digest = staging_status(b, M)
    assert (phase, cursor, staged, staged_digest) == (Phase.STAGING, END, len(MOVING), digest)
    assert step(b, "ACTIVATE", digest) == OK
    assert views(b, NOW + 1000) == before
    assert step(a, "RELEASE") == 0
    assert all(not a.keyspace.exists(k.encode()) for k in MOVING)
    assert a.read(argv("GET %s" % STAYING), NOW) == b"stays"
    # A answers MOVED for the released slots, reads and writes alike (the node adds the address).
    assert not_owned_slot(a.read(argv("XLEN %s" % MOVING[0]), NOW)) == key_slot(MOVING[0].encode())
    assert not_owned_slot(cmd(a, "XADD %s * f v" % MOVING[0])) == key_slot(MOVING[0].encode())
    # B serves them, and writes on: the group's state moved with it.
    assert cmd(b, "XADD %s 6-1 f v6" % MOVING[0]) == b"6-1"
    assert cmd(b, "XREADGROUP GROUP g carol STREAMS %s >" % MOVING[0], now=NOW + 2000) == [
        [MOVING[0].encode(), [[b"6-1", [b"f", b"v6"]]]]]
    assert b.owned.owns(150) and not a.owned.owns(150) and a.owned.owns(99)


def test_sealed_slots_refuse_reads_and_writes_with_slot_frozen_and_wake_blocked_clients():
    a = group_a()
    fill(a)
    assert step(a, "SEAL") == OK
    assert set(a.last_ready_keys) == {k.encode() for k in MOVING}
    w = cmd(a, "XADD %s * f v" % MOVING[0])
    r = a.read(argv("XLEN %s" % MOVING[0]), NOW)
    slot = key_slot(MOVING[0].encode())
    assert isinstance(w, SlotFrozen) and w.slot == slot and frozen_slot(r) == slot
    assert w.message.startswith("TRYAGAIN ") and frozen_slot(EngineError(w.message)) == slot
    assert frozen_slot(EngineError("TRYAGAIN Multiple keys request during rehashing of slot")) is None
    assert cmd(a, "GET %s" % STAYING) == b"stays"          # other slots are served
    assert isinstance(cmd(a, "DEL %s %s" % (STAYING, MOVING[2])), SlotFrozen)


def test_a_frozen_request_is_not_recorded_so_its_retry_runs_after_an_unseal():
    a = group_a()
    fill(a)
    assert apply(a, Request.register(7))[0] == OK
    step(a, "SEAL")
    assert isinstance(cmd(a, "RPUSH %s d" % MOVING[1], cid=7, seq=1), SlotFrozen)
    assert step(a, "UNSEAL") == OK
    assert cmd(a, "RPUSH %s d" % MOVING[1], cid=7, seq=1) == 4
    assert cmd(a, "RPUSH %s d" % MOVING[1], cid=7, seq=1) == 4    # the retry: recorded now
    assert a.read(argv("LLEN %s" % MOVING[1]), NOW) == 4


def test_every_record_applied_twice_changes_nothing_the_second_time():
    a, b = group_a(), group_b()
    fill(a)

    def twice(sm, op, *args):
        first = step(sm, op, *args)
        snap = sm.snapshot()
        again = step(sm, op, *args)
        assert again == first
        # Only the applied index moved (same length, same state restored elsewhere).
        fresh = StateMachine()
        fresh.restore(sm.snapshot())
        assert fresh.moves.encode() == sm.moves.encode() and len(snap) == len(sm.snapshot())
        return first

    twice(a, "SEAL")
    cursor = encode_cursor(M.first, 0)
    while cursor != END:
        records, nxt, _, sessions = export_chunk(a, M, cursor, 300)
        twice(b, "STAGE", cursor, nxt, b"%d" % NOW, records, sessions)
        cursor = nxt
    twice(b, "ACTIVATE", manifest(a, M))
    assert twice(a, "RELEASE") == 0
    assert twice(a, "PURGE") == 0


def test_stale_and_out_of_order_records_are_refused_and_change_nothing():
    a, b = group_a(), group_b()
    fill(a)
    newer = MoveId(150, 160, 8)
    assert step(a, "SEAL", m=newer) == OK and step(a, "UNSEAL", m=newer) == OK
    snap = a.snapshot()[:-4]
    res = step(a, "SEAL")                            # @5 overlaps slots that saw @8
    assert isinstance(res, MoveRefused) and "stale move 100-199@5" in res.message
    assert isinstance(step(a, "SEAL", m=newer), MoveRefused)      # a late SEAL after its abort
    assert a.snapshot()[:4] == snap[:4] and not a.moves.any_sealed
    # UNSEAL before any SEAL leaves a tombstone: the late SEAL is refused.
    other = MoveId(300, 310, 9)
    assert step(a, "UNSEAL", m=other) == OK
    assert "aborted" in step(a, "SEAL", m=other).message
    # RELEASE without a seal, DROP after ACTIVATE, STAGE after DROP, SEAL of slots not owned.
    m = MoveId(400, 410, 10)
    assert "not sealed" in step(a, "RELEASE", m=m).message
    assert "does not own slot" in step(a, "SEAL", m=MoveId(HALF, HALF, 11)).message
    assert step(b, "DROP_STAGING", m=m) == OK
    assert "aborted" in step(b, "STAGE", encode_cursor(400, 0), END, b"0", b"", b"", m=m).message
    assert "owns slot" in step(b, "STAGE", encode_cursor(HALF, 0), END, b"0", b"", b"",
                               m=MoveId(HALF, HALF, 12)).message
    assert "bad SLOT_MOVE" in apply(a, Request(0, 0, Kind.SLOT_MOVE, ((b"SEAL", b"1"),)))[0].message


def test_staging_is_invisible_and_needs_the_whole_copy_and_the_right_digest():
    a, b = group_a(), group_b()
    fill(a)
    step(a, "SEAL")
    records, nxt, done, _ = export_chunk(a, M, encode_cursor(M.first, 0), 1 << 20)
    assert nxt == KEYS_DONE and not done
    assert step(b, "STAGE", encode_cursor(M.first, 0), nxt, b"%d" % NOW, records, b"") == len(MOVING)
    assert isinstance(b.read(argv("XLEN %s" % MOVING[0]), NOW), SlotNotOwned)
    assert b.read(argv("DBSIZE"), NOW) == 0
    assert "not complete" in step(b, "ACTIVATE", manifest(a, M)).message
    # A gap (a chunk from another cursor) is refused; a chunk already staged is a no-op.
    assert "at cursor" in step(b, "STAGE", encode_cursor(150, 0), END, b"0", b"", b"").message
    assert step(b, "STAGE", encode_cursor(M.first, 0), nxt, b"%d" % NOW, records, b"") == len(MOVING)
    _, end, done, sessions = export_chunk(a, M, nxt, 1 << 20)
    assert (end, done) == (END, True)
    step(b, "STAGE", nxt, end, b"%d" % NOW, b"", sessions)
    wrong = step(b, "ACTIVATE", b"\x00" * 32)
    assert isinstance(wrong, MoveRefused) and "digest mismatch" in wrong.message
    assert step(b, "ACTIVATE", manifest(a, M)) == OK and b.read(argv("DBSIZE"), NOW) == len(MOVING)


def test_a_damaged_or_misplaced_chunk_is_refused():
    a, b = group_a(), group_b()
    fill(a)
    step(a, "SEAL")
    start = encode_cursor(M.first, 0)
    records, nxt, _, _ = export_chunk(a, M, start, 1 << 20)
    flipped = records[:20] + bytes([records[20] ^ 1]) + records[21:]
    assert "bad chunk" in step(b, "STAGE", start, nxt, b"0", flipped, b"").message
    assert "outside" in step(b, "STAGE", start, nxt, b"0", records, b"", m=MoveId(100, 120, 5)).message
    assert staging_status(b, M)[0] is None


def test_abort_leaves_a_serving_and_b_empty():
    a, b = group_a(), group_b()
    fill(a)
    before = views(a, NOW + 1000)
    step(a, "SEAL")
    records, nxt, _, _ = export_chunk(a, M, encode_cursor(M.first, 0), 100)
    step(b, "STAGE", encode_cursor(M.first, 0), nxt, b"%d" % NOW, records, b"")
    assert step(a, "UNSEAL") == OK and step(b, "DROP_STAGING") == OK
    assert views(a, NOW + 1000) == before and b.keyspace.data == {} and not b.moves.staging
    assert "aborted" in step(a, "RELEASE").message
    assert "aborted" in step(b, "ACTIVATE", b"\x00" * 32).message


def test_release_purges_in_bounded_steps(monkeypatch):
    monkeypatch.setattr(slot_move_apply, "PURGE_BATCH", 2)
    a = group_a()
    fill(a)
    step(a, "SEAL")
    assert step(a, "RELEASE") == len(MOVING) - 2
    assert step(a, "PURGE") == len(MOVING) - 4
    assert step(a, "PURGE") == 0 and a.moves.phase(M) is Phase.PURGED
    assert step(a, "PURGE") == 0 and step(a, "RELEASE") == 0
    assert a.read(argv("GET %s" % STAYING), NOW) == b"stays"


def test_b_time_is_raised_to_a_time_so_idle_times_never_go_backwards():
    a, b = group_a(), group_b()
    fill(a)
    cmd(a, "SET %s x" % STAYING, now=NOW + 50_000)
    at_a = a.read(argv("XINFO CONSUMERS %s g" % MOVING[0]), 0)          # a clock behind A's
    step(a, "SEAL")
    copy_all(a, b)
    assert b.last_now_ms == a.last_now_ms == NOW + 50_000
    step(b, "ACTIVATE", manifest(a, M))
    at_b = b.read(argv("XINFO CONSUMERS %s g" % MOVING[0]), 0)
    assert at_b == at_a and all(c[b"idle"] >= 50_000 - 40 for c in at_b)


def test_a_retry_of_a_request_applied_at_a_gets_a_result_at_b_not_a_second_apply():
    a, b = group_a(), group_b()
    fill(a)
    for sm in (a, b):
        assert apply(sm, Request.register(7))[0] == OK
    assert cmd(a, "RPUSH %s d" % MOVING[1], cid=7, seq=1) == 4
    assert cmd(b, "SET %s x" % keys_in(HALF, SLOT_COUNT - 1, 1)[0], cid=7, seq=2) == OK
    assert apply(a, Request.register(8))[0] == OK
    assert cmd(a, "SET %s y" % MOVING[2], cid=8, seq=1) == OK
    step(a, "SEAL")
    copy_all(a, b)
    step(b, "ACTIVATE", manifest(a, M))
    assert cmd(b, "RPUSH %s d" % MOVING[1], cid=7, seq=1) == 4      # A's result, not a 5th element
    assert cmd(b, "SET %s z" % MOVING[2], cid=8, seq=1) == OK       # a client B had not seen
    assert b.read(argv("LLEN %s" % MOVING[1]), NOW) == 4 and b.read(argv("GET %s" % MOVING[2]), NOW) == b"y"
    assert cmd(b, "RPUSH %s e" % MOVING[1], cid=7, seq=3) == 5


def _records_for(a, b_copies):
    """The STAGE records of a whole copy, for replay on several replicas."""
    out, cursor = [], encode_cursor(M.first, 0)
    while cursor != END:
        records, nxt, _, sessions = export_chunk(a, M, cursor, 150)
        out.append(("STAGE", cursor, nxt, b"%d" % a.last_now_ms, records, sessions))
        cursor = nxt
    return out


def test_snapshots_mid_move_round_trip_and_replicas_end_byte_identical():
    a = group_a()
    fill(a)
    step(a, "SEAL")
    stages = _records_for(a, None)
    digest = manifest(a, M)
    b1, b2 = group_b(), group_b()
    for args in stages[:2]:
        step(b1, *args)
        step(b2, *args)
    # A snapshot in the middle: staging, cursor, epochs and the seal survive it.
    b3, a2 = StateMachine(), StateMachine()
    b3.restore(b1.snapshot())
    a2.restore(a.snapshot())
    assert b3.snapshot() == b1.snapshot() and a2.snapshot() == a.snapshot()
    assert a2.moves.any_sealed and isinstance(a2.read(argv("XLEN %s" % MOVING[0]), NOW), SlotFrozen)
    assert staging_status(b3, M) == staging_status(b1, M)
    for sm in (b1, b2, b3):
        for args in stages[2:]:
            step(sm, *args)
        assert step(sm, "ACTIVATE", digest) == OK
    assert b1.snapshot() == b2.snapshot() == b3.snapshot()


def test_a_version_4_snapshot_restores_with_no_moves():
    a = group_a()
    fill(a)
    body = a.snapshot()[:-4]
    sess_len = struct.unpack_from(">I", body, 22)[0]
    pos = 26 + sess_len
    pos += 4 + struct.unpack_from(">I", body, pos)[0]          # versions
    pos += 4 + struct.unpack_from(">I", body, pos)[0]          # owned slots
    assert body[pos:pos + 4] == b"\x00\x00\x00\x00"              # no move: an empty section
    v4 = body[:4] + struct.pack(">H", 4) + body[6:pos] + body[pos + 4:]
    old = StateMachine()
    old.restore(v4 + struct.pack(">I", zlib.crc32(v4)))
    assert old.snapshot() == a.snapshot() and not old.moves.moves


@pytest.mark.parametrize("cut", [1, 5, 13, 40])
def test_a_damaged_moves_section_is_corrupt(cut):
    from xraft.node.fsm.errors import CorruptSnapshot
    a, b = group_a(), group_b()
    fill(a)
    step(a, "SEAL")
    copy_all(a, b)
    body = b.snapshot()[:-4]
    sess_len = struct.unpack_from(">I", body, 22)[0]
    pos = 26 + sess_len
    pos += 4 + struct.unpack_from(">I", body, pos)[0]
    pos += 4 + struct.unpack_from(">I", body, pos)[0]
    mv_len = struct.unpack_from(">I", body, pos)[0]
    moves = body[pos + 4:pos + 4 + mv_len]
    bad_moves = moves[:-cut]
    bad = body[:pos] + struct.pack(">I", len(bad_moves)) + bad_moves + body[pos + 4 + mv_len:]
    with pytest.raises(CorruptSnapshot, match="slot moves"):
        StateMachine().restore(bad + struct.pack(">I", zlib.crc32(bad)))


def test_a_key_larger_than_a_chunk_travels_in_pieces_and_survives_a_snapshot_mid_key():
    a, b = group_a(), group_b()
    fill(a)
    big = MOVING[3]
    cmd(a, "DEL %s" % big)
    for i in range(1, 2001):
        cmd(a, "XADD %s %d-0 field value-%d" % (big, i, i))
    before = [a.read(argv("XINFO STREAM %s FULL" % big), NOW), a.read(argv("XRANGE %s - +" % big), NOW)]
    step(a, "SEAL")
    cursor, pieces, restored = encode_cursor(M.first, 0), 0, False
    while cursor != END:
        records, nxt, _, sessions = export_chunk(a, M, cursor, 1000)
        assert len(records) <= 1000
        if nxt[6:] != b"\x00\x00\x00\x00" and nxt != END:
            pieces += 1                                # a piece of the big key
            if pieces == 3:
                assert "at cursor" in step(b, "STAGE", nxt, nxt[:6] + b"\x00\x00\x10\x00", b"0", b"x", b"").message
        assert step(b, "STAGE", cursor, nxt, b"%d" % NOW, records, sessions) >= 0
        assert step(b, "STAGE", cursor, nxt, b"%d" % NOW, records, sessions) >= 0    # replayed: no-op
        if pieces == 5 and not restored:              # a snapshot with half a record staged
            assert b.moves.staging[M].partial
            copy = StateMachine()
            copy.restore(b.snapshot())
            assert copy.snapshot() == b.snapshot()
            b, restored = copy, True
        cursor = nxt
    assert pieces > 5 and restored
    assert step(b, "ACTIVATE", manifest(a, M)) == OK
    assert [b.read(argv("XINFO STREAM %s FULL" % big), NOW), b.read(argv("XRANGE %s - +" % big), NOW)] == before


def test_a_slot_move_request_is_anonymous_with_one_argv():
    from xraft.node.fsm.entry import CorruptEntry, decode_record
    from xraft.node.invariant import InvariantViolation
    with pytest.raises(InvariantViolation):
        encode_record(NOW, [Request(7, 1, Kind.SLOT_MOVE, (move_argv("SEAL", M),))])
    good = encode_record(NOW, [Request(0, 0, Kind.SLOT_MOVE, (move_argv("SEAL", M),))])
    assert decode_record(good).requests[0].kind == Kind.SLOT_MOVE
    # The same bytes with a client id and seq patched in: refused by the decoder.
    bad = bytearray(good[:-4])
    bad[16:32] = (7).to_bytes(8, "big") + (1).to_bytes(8, "big")
    bad = bytes(bad) + zlib.crc32(bytes(bad)).to_bytes(4, "big")
    with pytest.raises(CorruptEntry, match="SLOT_MOVE must be anonymous"):
        decode_record(bad)


@pytest.mark.parametrize("seed", range(8))
def test_random_interleavings_of_move_records_stay_deterministic_and_consistent(seed, monkeypatch):
    monkeypatch.setattr(slot_move_apply, "PURGE_BATCH", 2)
    _random_run(seed)


def test_the_random_interleavings_reach_every_phase(monkeypatch):
    monkeypatch.setattr(slot_move_apply, "PURGE_BATCH", 2)
    reached = set()
    for seed in range(8):
        reached |= _random_run(seed)
    assert reached == set(Phase)


def _random_run(seed) -> set:
    """Records of three overlapping moves (both roles: slots A owns and slots it does not),
    duplicated, stale and out of order, applied by two replicas, one of which restarts from a
    snapshot halfway: byte-identical ends; the seal bitmap matches the SEALED moves; staging
    exists exactly for STAGING moves; refusals change nothing."""
    rnd = random.Random(seed)
    a = group_a()
    fill(a)
    moves = [MoveId(100, 199, 5), MoveId(150, 160, 3), MoveId(HALF, HALF + 10, 6)]
    ops = ["SEAL", "UNSEAL", "STAGE", "DROP_STAGING", "ACTIVATE", "RELEASE", "PURGE"]
    r1, r2 = group_a(), group_a()
    for sm in (r1, r2):
        sm.restore(a.snapshot())
    records, reached = [], set()
    for _ in range(60):
        m, op = rnd.choice(moves), rnd.choice(ops)
        if op == "STAGE":
            args = (encode_cursor(m.first, 0), KEYS_DONE if rnd.random() < 0.5 else END, b"%d" % NOW, b"", b"")
        elif op == "ACTIVATE":
            args = (hashlib.sha256().digest() if rnd.random() < 0.8 else b"\x01" * 32,)   # staged: no key
        else:
            args = ()
        records.append(encode_record(NOW, [Request(0, 0, Kind.SLOT_MOVE, (move_argv(op, m, *args),))]))
    for i, rec in enumerate(records):
        for sm in (r1, r2):
            before = sm.snapshot()
            [res] = sm.apply(sm.applied_index + 1, rec)
            if isinstance(res, MoveRefused):            # nothing changed but the index
                assert len(sm.snapshot()) == len(before)
        if i == len(records) // 2:
            fresh = StateMachine()
            fresh.restore(r2.snapshot())
            r2 = fresh
        sealed = {s for m, ph in r1.moves.moves.items() if ph is Phase.SEALED for s in range(m.first, m.last + 1)}
        assert {s for s in range(SLOT_COUNT) if r1.moves.sealed[s]} == sealed
        assert set(r1.moves.staging) == {m for m, ph in r1.moves.moves.items() if ph is Phase.STAGING}
        reached |= set(r1.moves.moves.values())
    assert r1.snapshot() == r2.snapshot()
    return reached


def test_a_request_refused_as_not_owned_runs_under_the_same_id_once_a_move_brought_the_slot():
    a, b = group_a(), group_b()
    fill(a)
    assert apply(b, Request.register(9))[0] == OK
    # Routed to B before its ACTIVATE applied (the map flipped first): MOVED, not remembered.
    assert not_owned_slot(cmd(b, "RPUSH %s z" % MOVING[1], cid=9, seq=1)) == key_slot(MOVING[1].encode())
    step(a, "SEAL")
    copy_all(a, b)
    step(b, "ACTIVATE", manifest(a, M))
    assert cmd(b, "RPUSH %s z" % MOVING[1], cid=9, seq=1) == 4
    assert cmd(b, "RPUSH %s z" % MOVING[1], cid=9, seq=1) == 4       # now remembered
