"""Slot map changes: compare-and-set on the epoch, each kind's rules, already_applied, the encoding."""
import json

import pytest
from hypothesis import event, given, settings, strategies as st

from xraft.node.cluster.changes import (AddLearner, AddNode, AdvanceMove, AssignSlots, BeginMove, PromoteLearner,
                                        RemoveReplica, SetNodeState, SetPreferredLeader, StaleEpoch, already_applied,
                                        apply_change, decode_change, encode_change, MAX_CHANGE_BYTES)
from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import NodeSpec, NodeState, SlotMap, SlotMapError
from xraft.node.cluster.slot_move import Abort, Copied, Decide, Finish, MoveError, Precopied, Released, Sealed, Verified
from xraft.node.engine.slots import SLOT_COUNT

from .maps import digest, next_event, nodes


def three():
    return initial_layout(nodes(3), 3)


def four_with_learner():
    m = initial_layout(nodes(3), 3)
    return apply_change(m, AddNode(m.epoch, NodeSpec(4, "10.0.0.4:7000", "10.0.0.4:6379")))


def test_a_change_applies_only_to_the_epoch_it_names():
    m = three()
    c = AssignSlots(m.epoch, 0, 99, 2)
    m2 = apply_change(m, c)
    assert m2.epoch == m.epoch + 1 and m2.owner(0) == 2 and m2.owner(100) == 1
    with pytest.raises(StaleEpoch) as e:
        apply_change(m2, c)
    assert (e.value.expected, e.value.actual, e.value.change) == (m.epoch, m2.epoch, c)
    with pytest.raises(StaleEpoch):
        apply_change(m, AssignSlots(m.epoch + 1, 0, 99, 2))


def test_already_applied_tells_done_from_conflict():
    m = three()
    mine = AssignSlots(m.epoch, 0, 99, 2)
    theirs = AssignSlots(m.epoch, 0, 99, 3)
    done = apply_change(m, mine)
    assert already_applied(done, mine)          # my change committed; I lost the reply
    conflicted = apply_change(m, theirs)
    assert not already_applied(conflicted, mine)  # someone else's change won: plan again
    assert not already_applied(m, mine)           # not yet applied


def test_node_lifecycle_up_draining_removed_and_never_back():
    m = four_with_learner()
    assert m.nodes[4].state is NodeState.UP
    with pytest.raises(SlotMapError, match="not allowed"):
        apply_change(m, SetNodeState(m.epoch, 4, NodeState.REMOVED))     # drain first
    m = apply_change(m, SetNodeState(m.epoch, 4, NodeState.DRAINING))
    m = apply_change(m, SetNodeState(m.epoch, 4, NodeState.UP))          # a drain can be cancelled
    m = apply_change(m, SetNodeState(m.epoch, 4, NodeState.DRAINING))
    m = apply_change(m, SetNodeState(m.epoch, 4, NodeState.REMOVED))
    for state in NodeState:
        with pytest.raises(SlotMapError):
            apply_change(m, SetNodeState(m.epoch, 4, state))
    with pytest.raises(SlotMapError, match="new id"):
        apply_change(m, AddNode(m.epoch, NodeSpec(4, "10.0.0.4:7000", "10.0.0.4:6379")))
    # The same machine comes back under a new id (its old id is REMOVED, so the address is free).
    m = apply_change(m, AddNode(m.epoch, NodeSpec(5, "10.0.0.4:7000", "10.0.0.4:6379")))
    assert m.nodes[5].state is NodeState.UP and m.nodes[4].state is NodeState.REMOVED


def test_add_node_refusals():
    m = three()
    for spec in (NodeSpec(4, "127.0.0.1:7001"),                       # node 1's address
                 NodeSpec(4, "nohost"), NodeSpec(4, "h:0"), NodeSpec(4, "h:99999"),
                 NodeSpec(4, "h:1", "bad"), NodeSpec(4, "h:1", state=NodeState.DRAINING),
                 NodeSpec(2, "h:1"), NodeSpec(0, "h:1")):
        with pytest.raises(SlotMapError):
            apply_change(m, AddNode(m.epoch, spec))


def test_removed_needs_no_replicas():
    m = three()
    m = apply_change(m, SetNodeState(m.epoch, 3, NodeState.DRAINING))
    with pytest.raises(SlotMapError, match="drain it first"):
        apply_change(m, SetNodeState(m.epoch, 3, NodeState.REMOVED))


def test_replica_changes_bump_conf_version():
    m = four_with_learner()
    g = m.groups[1]
    m = apply_change(m, AddLearner(m.epoch, 1, 4))
    assert m.groups[1].learners == (4,) and m.groups[1].conf_version == g.conf_version + 1
    m = apply_change(m, PromoteLearner(m.epoch, 1, 4))
    assert m.groups[1].voters == (1, 2, 3, 4) and m.groups[1].learners == ()
    assert m.groups[1].conf_version == g.conf_version + 2
    m = apply_change(m, RemoveReplica(m.epoch, 1, 2))
    assert m.groups[1].voters == (1, 3, 4) and m.groups[1].conf_version == g.conf_version + 3
    m = apply_change(m, SetPreferredLeader(m.epoch, 1, 4))
    assert m.groups[1].preferred_leader == 4 and m.groups[1].conf_version == g.conf_version + 3


def test_replica_change_refusals():
    m = four_with_learner()
    m = apply_change(m, AddLearner(m.epoch, 2, 4))
    bad = [AddLearner(m.epoch, 1, 1),                  # already a voter
           AddLearner(m.epoch, 2, 4),                  # already a learner
           AddLearner(m.epoch, 9, 4),                  # no such group
           AddLearner(m.epoch, 1, 9),                  # no such node
           PromoteLearner(m.epoch, 1, 4),              # not a learner there
           RemoveReplica(m.epoch, 1, 4),               # not a replica
           RemoveReplica(m.epoch, 1, m.groups[1].preferred_leader),
           SetPreferredLeader(m.epoch, 2, 4),          # a learner cannot be preferred
           SetPreferredLeader(m.epoch, 1, m.groups[1].preferred_leader)]   # changes nothing
    for c in bad:
        with pytest.raises(SlotMapError):
            apply_change(m, c)
    drained = apply_change(m, SetNodeState(m.epoch, 4, NodeState.DRAINING))
    for c in (AddLearner(drained.epoch, 1, 4), PromoteLearner(drained.epoch, 2, 4)):
        with pytest.raises(SlotMapError, match="not up"):
            apply_change(drained, c)
    one = initial_layout(nodes(1), 1)
    one = apply_change(one, AddNode(one.epoch, NodeSpec(2, "h:2")))
    with pytest.raises(SlotMapError):
        apply_change(one, RemoveReplica(one.epoch, 1, 1))   # the only voter (and preferred)


def test_assign_refuses_no_ops_and_moving_slots():
    m = three()
    with pytest.raises(SlotMapError, match="already owned"):
        apply_change(m, AssignSlots(m.epoch, 0, 10, 1))
    with pytest.raises(SlotMapError):
        apply_change(m, AssignSlots(m.epoch, 10, 5, 2))
    with pytest.raises(SlotMapError):
        apply_change(m, AssignSlots(m.epoch, 0, SLOT_COUNT, 2))
    m = apply_change(m, BeginMove(m.epoch, 100, 199, 2))
    with pytest.raises(SlotMapError, match="moving"):
        apply_change(m, AssignSlots(m.epoch, 150, 300, 3))


# -- the encoding -----------------------------------------------------------------------------
small = st.integers(0, 40)
positive = st.integers(1, 10 ** 6)
events = st.one_of(st.just(Precopied()), st.just(Sealed()), st.builds(Copied, st.binary(max_size=64), positive),
                   st.builds(Verified, st.binary(min_size=32, max_size=32)), st.just(Decide()),
                   st.just(Released()), st.just(Finish()), st.builds(Abort, st.text(min_size=1, max_size=50)))
node_specs = st.builds(NodeSpec, positive, st.just("h:1"), st.sampled_from(["", "h:2"]), st.sampled_from(NodeState))
changes = st.one_of(
    st.builds(AssignSlots, positive, small, small, small),
    st.builds(AddNode, positive, node_specs),
    st.builds(SetNodeState, positive, small, st.sampled_from(NodeState)),
    st.builds(AddLearner, positive, small, small), st.builds(PromoteLearner, positive, small, small),
    st.builds(RemoveReplica, positive, small, small), st.builds(SetPreferredLeader, positive, small, small),
    st.builds(BeginMove, positive, small, small, small),
    st.builds(AdvanceMove, positive, small, small, positive, small, events))


@settings(max_examples=300, deadline=None)
@given(changes)
def test_change_encoding_round_trips_canonically(change):
    data = encode_change(change)
    assert decode_change(data) == change
    assert json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode() == data


@pytest.mark.parametrize("mutate", [
    lambda o: o.update(v=2),
    lambda o: o.update(kind="drop_table"),
    lambda o: o.update(extra=1),
    lambda o: o.pop("group_id"),
    lambda o: o.update(group_id="1"),
    lambda o: o.update(group_id=-1),
    lambda o: o.update(expect_epoch=0),
    lambda o: o.update(group_id=True),
])
def test_decode_change_refuses_broken_changes(mutate):
    obj = json.loads(encode_change(AddLearner(3, 1, 4)))
    mutate(obj)
    with pytest.raises(SlotMapError):
        decode_change(json.dumps(obj).encode())


@pytest.mark.parametrize("event_obj", [
    {"kind": "copied", "cursor": "zz", "replicated": 1},
    {"kind": "copied", "cursor": "00", "replicated": 0},
    {"kind": "copied", "cursor": "00" * 2000, "replicated": 1},
    {"kind": "verified", "digest": "00"},
    {"kind": "abort", "reason": ""},
    {"kind": "abort", "reason": "x" * 201},
    {"kind": "sealed", "extra": 1},
    {"kind": "explode"},
    [],
])
def test_decode_change_refuses_broken_events(event_obj):
    obj = json.loads(encode_change(AdvanceMove(3, 0, 9, 2, 2, Sealed())))
    obj["event"] = event_obj
    with pytest.raises(SlotMapError):
        decode_change(json.dumps(obj).encode())


def test_decode_change_refuses_garbage():
    for data in (b"", b"{", b"[]", b"null", b"1", b'{"v": 1}', b"x" * (MAX_CHANGE_BYTES + 1)):
        with pytest.raises(SlotMapError):
            decode_change(data)


# -- random change sequences -------------------------------------------------------------------
def _candidate(draw, m: SlotMap):
    gids = sorted(m.groups)
    nids = sorted(m.nodes) + [max(m.nodes) + 1]
    kind = draw(st.integers(0, 10))      # 8, 9, 10: a step of a move in progress
    g = draw(st.sampled_from(gids))
    n = draw(st.sampled_from(nids))
    if kind == 0:
        first = draw(st.integers(0, SLOT_COUNT - 1))
        return AssignSlots(m.epoch, first, min(SLOT_COUNT - 1, first + draw(st.integers(0, 3000))), g)
    if kind == 1:
        return AddNode(m.epoch, NodeSpec(n, "10.1.0.%d:7000" % n, "10.1.0.%d:6379" % n))
    if kind == 2:
        return SetNodeState(m.epoch, n, draw(st.sampled_from(NodeState)))
    if kind == 3:
        return AddLearner(m.epoch, g, n)
    if kind == 4:
        learners = m.groups[g].learners
        return PromoteLearner(m.epoch, g, draw(st.sampled_from(learners)) if learners else n)
    if kind == 5:
        return RemoveReplica(m.epoch, g, n)
    if kind == 6:
        return SetPreferredLeader(m.epoch, g, n)
    if kind == 7:
        first = draw(st.integers(0, SLOT_COUNT - 1))
        return BeginMove(m.epoch, first, min(SLOT_COUNT - 1, first + draw(st.integers(0, 500))), g)
    if not m.migrations:
        return Finish()    # not a change: refused
    mig = m.migrations[draw(st.sampled_from(sorted(m.migrations)))]
    event = draw(st.sampled_from([next_event(mig.phase, mig.replicated), Sealed(), Copied(b"c", mig.replicated + 1),
                                  Verified(digest()), Decide(), Released(), Finish(), Abort("operator")]))
    return AdvanceMove(m.epoch, mig.first, mig.last, mig.started_epoch, mig.target, event)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_random_changes_keep_every_invariant(data):
    m = initial_layout(nodes(data.draw(st.integers(1, 5))), data.draw(st.integers(1, 6)))
    applied = []
    for _ in range(data.draw(st.integers(1, 40))):
        change = _candidate(data.draw, m)
        try:
            new = apply_change(m, change)
        except SlotMapError:
            event("refused")
            continue
        event("applied " + change.kind)
        assert new.epoch == m.epoch + 1 and new != m
        assert SlotMap.decode(new.encode()) == new
        assert already_applied(new, change), change
        with pytest.raises(StaleEpoch):
            apply_change(new, change)
        applied.append(change)
        m = new
    # Every committed change, re-delivered from its bytes later, is refused by the epoch.
    for change in applied:
        with pytest.raises(StaleEpoch):
            apply_change(m, decode_change(encode_change(change)))


def test_move_steps_refused_and_reported():
    m = three()
    m = apply_change(m, BeginMove(m.epoch, 0, 9, 2))
    mig = m.migrations[(0, 9)]
    assert mig.started_epoch == m.epoch and mig.source == 1
    with pytest.raises(MoveError) as e:
        apply_change(m, AdvanceMove(m.epoch, 0, 9, mig.started_epoch, 2, Decide()))
    assert e.value.phase.value == "precopying" and not e.value.already_applied
    with pytest.raises(MoveError, match="no move"):
        apply_change(m, AdvanceMove(m.epoch, 0, 9, mig.started_epoch + 1, 2, Sealed()))
    with pytest.raises(MoveError, match="no move"):
        apply_change(m, AdvanceMove(m.epoch, 0, 9, mig.started_epoch, 3, Sealed()))
    with pytest.raises(SlotMapError):
        apply_change(m, BeginMove(m.epoch, 5, 20, 3))      # overlaps the move in progress
    with pytest.raises(SlotMapError):
        apply_change(m, BeginMove(m.epoch, 5000, 6000, 2))  # two owners
    with pytest.raises(SlotMapError):
        apply_change(m, BeginMove(m.epoch, 20, 30, 1))     # already there
