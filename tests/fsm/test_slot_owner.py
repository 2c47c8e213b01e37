"""Slot ownership at apply time (fsm/slot_owner.py): a data group refuses, deterministically
and changing nothing, a keyed request for a slot it does not own; the bitmap is in the
snapshot (version 4) and older snapshots restore as owning every slot."""
import struct
import zlib

import pytest

from xraft.node.engine.errors import EngineError
from xraft.node.engine.replies import OK
from xraft.node.engine.slots import SLOT_COUNT, key_slot
from xraft.node.fsm.entry import Request, XAddBatch, encode_record
from xraft.node.fsm.errors import CorruptSnapshot
from xraft.node.fsm.slot_owner import BITMAP_BYTES, OwnedSlots, SlotNotOwned, not_owned_slot, request_keys
from xraft.node.fsm.state_machine import StateMachine

NOW = 1_700_000_000_000


def argv(s: str):
    return tuple(a.encode() for a in s.split())


def key_in(lo: int, hi: int, prefix: str = "k") -> str:
    """A key whose slot is in [lo, hi]."""
    for i in range(100_000):
        k = "%s%d" % (prefix, i)
        if lo <= key_slot(k.encode()) <= hi:
            return k
    raise AssertionError("no key found")


HALF = SLOT_COUNT // 2
MINE, OTHER = key_in(0, HALF - 1), key_in(HALF, SLOT_COUNT - 1)


def first_half_sm() -> StateMachine:
    return StateMachine(owned=OwnedSlots.from_ranges([(0, HALF - 1)]))


def apply(sm, *reqs, now=NOW):
    return sm.apply(sm.applied_index + 1, encode_record(now, reqs))


def test_a_key_of_a_slot_not_owned_is_refused_and_changes_nothing():
    sm = first_half_sm()
    assert apply(sm, Request.command(0, 0, argv("XADD %s 1-1 f v" % MINE)))[0] == b"1-1"
    before = sm.snapshot()
    [res] = apply(sm, Request.command(0, 0, argv("XADD %s 1-1 f v" % OTHER)))
    assert isinstance(res, SlotNotOwned) and res.message == "MOVED %d :0" % key_slot(OTHER.encode())
    assert not_owned_slot(res) == key_slot(OTHER.encode())
    assert not_owned_slot(EngineError("MOVED 12 127.0.0.1:7000")) is None
    assert not sm.keyspace.exists(OTHER.encode())
    # Only the applied index and the time moved: the refusal is a result like any other.
    after = StateMachine()
    after.restore(sm.snapshot())
    assert after.keyspace.data.keys() == {MINE.encode()}
    assert len(sm.snapshot()) == len(before)


def test_every_request_kind_is_checked_and_keyless_ones_pass():
    sm = first_half_sm()
    batch = XAddBatch.build(OTHER.encode(), [(0, 0, 0, (b"f", b"v"))])
    results = apply(
        sm,
        Request.xadd_batch(0, 0, batch),
        Request.multi(0, 0, [argv("RPUSH %s a" % MINE), argv("RPUSH %s b" % OTHER)]),
        Request.watched_multi(0, 0, [(OTHER.encode(), 0)], [argv("RPUSH %s a" % MINE)]),
        Request.command(0, 0, argv("FLUSHALL")),
        Request.config(0, 0, argv("CONFIG SET stream-node-max-entries 7")),
        Request.command(0, 0, argv("RPUSH %s c" % MINE)),
    )
    assert [not_owned_slot(r) for r in results[:3]] == [key_slot(OTHER.encode())] * 3
    assert results[3:] == [OK, OK, 1]
    assert sm.keyspace.config.stream_node_max_entries == 7
    assert sm.read(argv("LRANGE %s 0 -1" % MINE), NOW) == [b"c"]   # the MULTI ran no command


def test_the_woken_forms_of_blocked_clients_are_checked_by_their_keys():
    for argv_text, key in (("xreadgroup-woken GROUP g c COUNT 1 STREAMS %s >" % OTHER, OTHER),
                           ("lmpop-woken 1 %s LEFT" % OTHER, OTHER),
                           ("lpop-woken %s" % OTHER, OTHER), ("lmove-woken %s %s RIGHT LEFT" % (OTHER, OTHER), OTHER)):
        req = Request.command(0, 0, argv(argv_text))
        assert list(request_keys(req))[0] == key.encode(), argv_text
        sm = first_half_sm()
        assert not_owned_slot(apply(sm, req)[0]) == key_slot(OTHER.encode()), argv_text


def test_a_refusal_is_deterministic_and_its_retry_is_refused_again():
    logs = [first_half_sm(), first_half_sm()]
    for sm in logs:
        apply(sm, Request.register(5))
        [r1] = apply(sm, Request.command(5, 1, argv("RPUSH %s x" % OTHER)))
        [r2] = apply(sm, Request.command(5, 1, argv("RPUSH %s x" % OTHER)))   # a retry
        assert not_owned_slot(r1) == not_owned_slot(r2) == key_slot(OTHER.encode())
    assert logs[0].snapshot() == logs[1].snapshot()


def test_the_bitmap_is_in_the_snapshot():
    sm = first_half_sm()
    apply(sm, Request.command(0, 0, argv("RPUSH %s a" % MINE)))
    copy = StateMachine()                        # owns every slot until it restores
    copy.restore(sm.snapshot())
    assert copy.owned.count() == HALF and not copy.owned.owns(HALF) and copy.owned.owns(0)
    assert not_owned_slot(apply(copy, Request.command(0, 0, argv("RPUSH %s a" % OTHER)))[0]) is not None
    assert copy.snapshot() == (lambda s: (s.restore(copy.snapshot()), s.snapshot())[1])(StateMachine())


def test_an_owner_of_every_slot_checks_nothing_and_encodes_as_empty():
    full = OwnedSlots.from_ranges([(0, SLOT_COUNT - 1)])
    assert full.owns_all and full.encode() == b"" and OwnedSlots.decode(b"").owns_all
    sm = StateMachine(owned=full)
    assert apply(sm, Request.command(0, 0, argv("RPUSH %s a" % OTHER)))[0] == 1


def _v3_from_v5(snap: bytes) -> bytes:
    """The same state as a version 3 snapshot (no owned-slots section) would hold it."""
    body = snap[:-4]
    sess_len = struct.unpack_from(">I", body, 22)[0]
    pos = 26 + sess_len
    ver_len = struct.unpack_from(">I", body, pos)[0]
    pos += 4 + ver_len
    own_len = struct.unpack_from(">I", body, pos)[0]
    moves_at = pos + 4 + own_len                 # version 5: the slot moves follow the owned slots
    moves_len = struct.unpack_from(">I", body, moves_at)[0]
    v3 = body[:4] + struct.pack(">H", 3) + body[6:pos] + body[moves_at + 4 + moves_len:]
    return v3 + struct.pack(">I", zlib.crc32(v3))


def test_a_version_3_snapshot_restores_as_owning_every_slot():
    sm = first_half_sm()
    apply(sm, Request.command(0, 0, argv("RPUSH %s a" % MINE)))
    old = StateMachine()
    old.restore(_v3_from_v5(sm.snapshot()))
    assert old.owned.owns_all and old.read(argv("LLEN %s" % MINE), NOW) == 1


@pytest.mark.parametrize("owned", [b"\xff" * 7, b"\x01" * (BITMAP_BYTES + 1)])
def test_a_bad_bitmap_in_a_snapshot_is_corrupt(owned):
    sm = first_half_sm()
    body = sm.snapshot()[:-4]
    sess_len = struct.unpack_from(">I", body, 22)[0]
    pos = 26 + sess_len
    pos += 4 + struct.unpack_from(">I", body, pos)[0]
    own_len = struct.unpack_from(">I", body, pos)[0]
    bad = body[:pos] + struct.pack(">I", len(owned)) + owned + body[pos + 4 + own_len:]
    with pytest.raises(CorruptSnapshot, match="owned slots"):
        StateMachine().restore(bad + struct.pack(">I", zlib.crc32(bad)))
