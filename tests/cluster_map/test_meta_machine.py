"""The metadata group's state machine: changes applied in log order, refusals as no-ops,
snapshot = the map's canonical bytes, restore, listeners."""
import pytest

from xraft.node.cluster.changes import AdvanceMove, BeginMove, StaleEpoch, encode_change
from xraft.node.cluster.meta_machine import MetaApplied, MetaMachine, MetaRefused, meta_members
from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import MovePhase, SlotMap, SlotMapError
from xraft.node.cluster.slot_move import Abort, Finish, MoveError, Precopied, Sealed, who_serves

from .maps import nodes


def founding():
    return initial_layout(nodes(3), 3, 3)


def test_members_three_voters_rest_learners():
    assert meta_members(initial_layout(nodes(5), 5, 3)) == ((1, 2, 3), (4, 5))
    assert meta_members(initial_layout(nodes(2), 2, 2)) == ((1, 2), ())


def test_apply_change_then_refusals_change_nothing():
    m0 = founding()
    sm = MetaMachine(m0)
    seen = []
    sm.add_listener(seen.append)
    r = sm.apply(2, encode_change(BeginMove(1, 100, 199, 3)))
    assert isinstance(r, MetaApplied) and r.slot_map.epoch == 2
    assert r.slot_map.migrations[(100, 199)].phase == MovePhase.PRECOPYING
    assert who_serves(r.slot_map, 150) == (1, False)          # pre-copying: the source serves on
    # the same change again: stale, nothing changes, the listener hears nothing
    r2 = sm.apply(3, encode_change(BeginMove(1, 100, 199, 3)))
    assert isinstance(r2, MetaRefused) and isinstance(r2.error, StaleEpoch) and r2.epoch == 2
    # an event the state machine refuses
    r3 = sm.apply(4, encode_change(AdvanceMove(2, 100, 199, 2, 3, Finish())))
    assert isinstance(r3, MetaRefused) and isinstance(r3.error, MoveError)
    # bytes that are not a change
    r4 = sm.apply(5, b"{not json")
    assert isinstance(r4, MetaRefused) and isinstance(r4.error, SlotMapError)
    assert sm.applied_index == 5 and sm.slot_map == r.slot_map and seen == [r.slot_map]


def test_snapshot_restore_round_trip_and_listener():
    sm = MetaMachine(founding())
    sm.apply(2, encode_change(BeginMove(1, 0, 9, 2)))
    sm.apply(3, encode_change(AdvanceMove(2, 0, 9, 2, 2, Precopied())))
    snap = sm.snapshot()
    assert snap == sm.slot_map.encode()
    other = MetaMachine(founding())
    seen = []
    other.add_listener(seen.append)
    other.restore(snap, 3)
    assert other.applied_index == 3 and other.slot_map == sm.slot_map and seen == [sm.slot_map]
    r = other.apply(4, encode_change(AdvanceMove(3, 0, 9, 2, 2, Abort("timeout"))))
    assert isinstance(r, MetaApplied) and r.slot_map.migrations[(0, 9)].phase == MovePhase.ABORTED


def test_restore_refuses_corrupt_bytes():
    sm = MetaMachine(founding())
    with pytest.raises(SlotMapError):
        sm.restore(b'{"epoch":1}', 7)
    assert sm.applied_index == 0 and sm.slot_map == founding()


def test_listener_failure_does_not_stop_apply():
    sm = MetaMachine(founding())
    sm.add_listener(lambda m: 1 / 0)
    r = sm.apply(2, encode_change(BeginMove(1, 0, 9, 2)))
    assert isinstance(r, MetaApplied) and sm.slot_map.epoch == 2
    assert SlotMap.decode(sm.snapshot()) == sm.slot_map
