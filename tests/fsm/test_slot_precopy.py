"""The pre-copy of a slot move at the fsm level: PRESTAGE while A serves, then the sealed copy
sends big streams as DELTA records against B's pre-copy (docs/slot-move-steps.md)."""
import pytest

from xraft.node.engine.replies import OK
from xraft.node.engine.dump import dump_record
from xraft.node.engine.stream_delta import (DELTA_TAG, MIN_DELTA_RECORD_BYTES, DeltaMismatch, apply_delta,
                                           delta_record, last_node)
from xraft.node.fsm.slot_export import (decode_have, export_chunk, manifest, precopy_status, staged_have,
                                        staging_status)
from xraft.node.fsm import slot_move_apply
from xraft.node.fsm.entry import Kind, Request, encode_record
from xraft.node.fsm.slot_move_apply import move_argv
from xraft.node.fsm.slot_moves import END, MoveRefused, SlotMoves, decode_cursor, encode_cursor
from xraft.node.fsm.state_machine import StateMachine

from .test_slot_moves import MOVING, M, NOW, argv, cmd, group_a, group_b, step, views

BIG = MOVING[0]


def fill_big(a, n=3000):
    for i in range(1, n + 1):
        cmd(a, "XADD %s %d-1 field value-%06d" % (BIG, i, i))
    cmd(a, "XGROUP CREATE %s g 0" % BIG)
    cmd(a, "XREADGROUP GROUP g alice COUNT 500 STREAMS %s >" % BIG, now=NOW + 10)
    cmd(a, "SET %s small" % MOVING[2])
    assert len(a.keyspace.data[BIG.encode()].dump_entries()) > MIN_DELTA_RECORD_BYTES


def precopy(a, b, max_bytes=1 << 20):
    cursor = encode_cursor(M.first, 0)
    while cursor != END:
        records, nxt, _, _ = export_chunk(a, M, cursor, max_bytes, live=True)
        assert step(b, "PRESTAGE", cursor, nxt, records) >= 0
        cursor = nxt


def sealed_copy(a, b, have, max_bytes=1 << 20):
    """The sealed copy; the bytes staged (so a test can see the delta is small)."""
    cursor, sent = encode_cursor(M.first, 0), 0
    while cursor != END:
        records, nxt, _, sessions = export_chunk(a, M, cursor, max_bytes, have=have)
        r = step(b, "STAGE", cursor, nxt, b"%d" % a.last_now_ms, records, sessions)
        if isinstance(r, MoveRefused):
            return r
        sent += len(records)
        cursor = nxt
    return sent


def test_a_stream_written_after_its_pre_copy_moves_as_a_small_delta_and_b_ends_identical():
    a, b = group_a(), group_b()
    fill_big(a)
    precopy(a, b)
    assert precopy_status(b, M) == (END, 2)
    # A serves on: appends, deliveries, acks, a new group and a small key changed.
    for i in range(3001, 3101):
        cmd(a, "XADD %s %d-1 field value-%06d" % (BIG, i, i))
    cmd(a, "XREADGROUP GROUP g bob COUNT 50 STREAMS %s >" % BIG, now=NOW + 20)
    cmd(a, "XACK %s g 1-1 2-1" % BIG)
    cmd(a, "XGROUP CREATE %s g2 $" % BIG)
    cmd(a, "SET %s changed" % MOVING[2])
    cmd(a, "RPUSH %s x" % MOVING[1])                    # a key the pre-copy never saw
    before = views(a, NOW + 1000)
    assert step(a, "SEAL") == OK
    have = decode_have(staged_have(b, M))
    assert list(have) == [BIG.encode()]
    full = len(export_chunk(a, M, encode_cursor(M.first, 0), 4 << 20)[0])
    sent = sealed_copy(a, b, have)
    assert sent < full // 2                           # the tail nodes and the metadata (PEL) only
    digest = manifest(a, M)
    assert staging_status(b, M)[3] == digest          # byte-identical to A's records
    assert step(b, "ACTIVATE", digest) == OK
    assert views(b, NOW + 1000)[:7] == before[:7]
    assert b.read(argv("GET %s" % MOVING[2]), NOW) == b"changed"


def test_a_stream_changed_before_its_last_pre_copied_node_is_refused_then_sent_in_full():
    a, b = group_a(), group_b()
    fill_big(a)
    precopy(a, b)
    cmd(a, "XDEL %s 2-1" % BIG)                        # an early node changed in place
    step(a, "SEAL")
    have = decode_have(staged_have(b, M))
    refused = sealed_copy(a, b, have)
    assert isinstance(refused, MoveRefused) and "does not fit the pre-copy" in refused.message
    assert sealed_copy(a, b, {}) > 0                  # the fallback: every key in full
    digest = manifest(a, M)
    assert step(b, "ACTIVATE", digest) == OK


def test_a_delta_rebuilds_the_exact_record_and_refuses_another_prefix_or_no_copy():
    a = group_a()
    fill_big(a)
    key = BIG.encode()
    old = dump_record(key, a.keyspace.data[key])
    for i in range(3001, 3011):
        cmd(a, "XADD %s %d-1 field value-%06d" % (BIG, i, i))
    new = dump_record(key, a.keyspace.data[key])
    delta = delta_record(new, last_node(old))
    assert delta[0] == DELTA_TAG and len(delta) < len(new) // 2
    assert apply_delta(delta, old) == (key, new)
    with pytest.raises(DeltaMismatch):
        apply_delta(delta, None)
    cmd(a, "XDEL %s 1-1" % BIG)
    with pytest.raises(DeltaMismatch):                 # B's copy is not A's prefix any more
        apply_delta(delta_record(dump_record(key, a.keyspace.data[key]), last_node(old)), old)
    with pytest.raises(DeltaMismatch):                 # damaged bytes
        apply_delta(delta[:-1] + bytes([delta[-1] ^ 1]), old)


def test_a_record_torn_between_pieces_of_the_pre_copy_is_dropped_and_later_prestage_refused():
    a, b = group_a(), group_b()
    fill_big(a)
    cursor = encode_cursor(M.first, 0)
    while not decode_cursor(cursor)[2]:                 # up to the first piece of BIG
        records, nxt, _, _ = export_chunk(a, M, cursor, 4096, live=True)
        assert step(b, "PRESTAGE", cursor, nxt, records) >= 0
        cursor = nxt
    cmd(a, "XADD %s 9999-1 field torn" % BIG)           # A changes it between pieces
    while cursor != END:
        records, nxt, _, _ = export_chunk(a, M, cursor, 4096, live=True)
        assert step(b, "PRESTAGE", cursor, nxt, records) >= 0
        assert step(b, "PRESTAGE", cursor, nxt, records) >= 0      # a re-delivery: no-op
        cursor = nxt
    assert BIG.encode() not in b.moves.staging[M].base and precopy_status(b, M)[1] == 1
    step(a, "SEAL")
    assert sealed_copy(a, b, decode_have(staged_have(b, M))) > 0
    late = step(b, "PRESTAGE", encode_cursor(M.first, 0), encode_cursor(M.first, 1), b"")
    assert isinstance(late, MoveRefused) and "past its pre-copy" in late.message
    assert step(b, "ACTIVATE", manifest(a, M)) == OK


def test_the_live_export_needs_the_slots_and_the_pre_copy_survives_a_snapshot():
    a, b = group_a(), group_b()
    fill_big(a)
    with pytest.raises(MoveRefused):
        export_chunk(b, M, encode_cursor(M.first, 0), 4096, live=True)
    cursor = encode_cursor(M.first, 0)
    records, nxt, _, _ = export_chunk(a, M, cursor, 1 << 20, live=True)
    step(b, "PRESTAGE", cursor, nxt, records)
    b2 = StateMachine()
    b2.restore(b.snapshot())
    assert b2.snapshot() == b.snapshot() and b2.moves.staging[M].base == b.moves.staging[M].base
    # A version-1 encoding (before the pre-copy) still decodes.
    moves = SlotMoves.decode(b.moves.encode(), NOW)
    moves.staging[M].base.clear()
    moves.staging[M].pre_cursor = b""
    v2 = moves.encode()
    v1 = b"\x01" + v2[1:-12]
    assert SlotMoves.decode(v1, NOW).staging[M].records == moves.staging[M].records


class _CountingLoads:
    """slot_move_apply.load_records, counting the calls made during applies."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = slot_move_apply.load_records

        def counted(buf):
            self.calls += 1
            return real(buf)
        monkeypatch.setattr(slot_move_apply, "load_records", counted)


def _step_both(plain, ahead, loads, op, *args, fresh=True, stale=False):
    """Apply one SLOT_MOVE record to `plain` as is and to `ahead` after running its prepare()
    (as the node's prepare thread would); how many decodes the apply at `ahead` made."""
    data = encode_record(NOW, [Request(0, 0, Kind.SLOT_MOVE, (move_argv(op, M, *args),))])
    r1 = plain.apply(plain.applied_index + 1, data)
    index = ahead.applied_index + 1
    fn = ahead.prepare(index, data)
    assert (fn is not None) == fresh
    if fn is not None:
        fn()
        if stale:   # as if the pre-copy had changed between the prepare and the apply
            ahead.prepared[index] = [(b, v - 1, d, r) for b, v, d, r in ahead.prepared[index]]
    before = loads.calls
    r2 = ahead.apply(index, data)
    assert r1 == r2 and not ahead.prepared
    return loads.calls - before


def test_chunks_decoded_ahead_of_their_apply_are_not_decoded_again_and_the_state_is_the_same(monkeypatch):
    """StateMachine.prepare (the node runs it in a thread, runtime/apply_ahead.py): a big
    PRESTAGE / STAGE chunk's decode made ahead is taken by the apply, which then decodes
    nothing; a decode made from other inputs is not taken; either way the replicas' state is
    byte for byte the same as a replica that never prepared."""
    a, plain, ahead = group_a(), group_b(), group_b()
    fill_big(a, n=6000)
    loads = _CountingLoads(monkeypatch)
    cursor, decodes = encode_cursor(M.first, 0), []
    while cursor != END:
        records, nxt, _, _ = export_chunk(a, M, cursor, 1 << 20, live=True)
        big = len(records) >= slot_move_apply.PREPARE_MIN_BYTES
        decodes.append(_step_both(plain, ahead, loads, "PRESTAGE", cursor, nxt, records, fresh=big))
        cursor = nxt
    assert decodes[0] == 0                       # the big stream's chunk: decoded ahead
    for i in range(6001, 6101):
        cmd(a, "XADD %s %d-1 field value-%06d" % (BIG, i, i))
    at_a = views(a, NOW + 1000)
    assert step(a, "SEAL") == OK
    have = decode_have(staged_have(ahead, M))
    cursor, stage_decodes = encode_cursor(M.first, 0), []
    while cursor != END:
        records, nxt, _, sessions = export_chunk(a, M, cursor, 1 << 20, have=have)
        big = len(records) >= slot_move_apply.PREPARE_MIN_BYTES
        stage_decodes.append(_step_both(plain, ahead, loads, "STAGE", cursor, nxt, b"%d" % a.last_now_ms,
                                        records, sessions, fresh=big, stale=big))
        cursor = nxt
    assert stage_decodes[0] == 1                 # made against another base: decoded again
    assert plain.snapshot() == ahead.snapshot()
    digest = manifest(a, M)
    assert staging_status(ahead, M)[3] == staging_status(plain, M)[3] == digest
    assert step(plain, "ACTIVATE", digest) == OK and step(ahead, "ACTIVATE", digest) == OK
    assert views(plain, NOW + 1000) == views(ahead, NOW + 1000) == at_a


def test_a_record_in_pieces_is_dumped_once_so_a_write_between_pieces_does_not_tear_it():
    """With the caller's `pieces` dict, the live export sends every piece of a big record from
    the dump of its first piece: a write between pieces reaches B with the sealed copy's delta."""
    a, b = group_a(), group_b()
    fill_big(a)
    first_dump = dump_record(BIG.encode(), a.keyspace.data[BIG.encode()])
    cursor, pieces, held = encode_cursor(M.first, 0), {}, []
    while cursor != END:
        records, nxt, _, _ = export_chunk(a, M, cursor, 4096, live=True, pieces=pieces)
        assert step(b, "PRESTAGE", cursor, nxt, records) >= 0
        held.append(len(pieces))
        if decode_cursor(nxt)[2]:
            cmd(a, "XADD %s %d-1 field between" % (BIG, 9000 + len(held)))   # A changes it between pieces
        cursor = nxt
    assert max(held) == 1 and not pieces                 # one record at most, none once it was sent
    assert b.moves.staging[M].base[BIG.encode()] == first_dump and precopy_status(b, M)[1] == 2
    step(a, "SEAL")
    have = decode_have(staged_have(b, M))
    assert BIG.encode() in have
    sent = sealed_copy(a, b, have)
    assert 0 < sent < len(first_dump) // 2             # the writes between pieces came as a delta
    assert step(b, "ACTIVATE", manifest(a, M)) == OK
