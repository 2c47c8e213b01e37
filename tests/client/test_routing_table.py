"""The routing table (client/routing.py) on real ClusterLayoutResponse protobufs:
validation of what a node sends, slot -> group -> address, the leader hints errors
bring, and which later layout replaces it."""
import pytest

from xraft.client.routing import Layout, LayoutError, RouteTable, format_ranges
from xraft.client.slots import SLOT_COUNT
from xraft.proto.v1 import client_pb2 as pb

ADDR = {1: "10.0.0.1:7100", 2: "10.0.0.2:7100", 3: "10.0.0.3:7100"}


def layout_pb(epoch=5, groups=None, nodes=(1, 2, 3)):
    """Three nodes; by default three groups of 5461/5461/5462 slots led by nodes 1, 2, 3."""
    groups = groups if groups is not None else [
        (1, 1, 7, [(0, 5460)]), (2, 2, 7, [(5461, 10922)]), (3, 3, 7, [(10923, SLOT_COUNT - 1)])]
    m = pb.ClusterLayoutResponse(epoch=epoch, node_id=2)
    for n in nodes:
        m.nodes.add(id=n, grpc=ADDR[n], resp=ADDR[n].replace("7100", "6379"), state="up")
    for gid, leader, term, ranges in groups:
        g = m.groups.add(id=gid, leader=leader, term=term, voters=[1, 2, 3])
        for first, last in ranges:
            g.slots.add(first=first, last=last)
    return m


def table(**kw):
    return RouteTable(Layout.from_pb(layout_pb(**kw)))


def test_every_slot_routes_to_its_groups_leader():
    t = table()
    assert [t.group_of(s) for s in (0, 5460, 5461, 10922, 10923, SLOT_COUNT - 1)] == [1, 1, 2, 2, 3, 3]
    assert t.address_for(0) == ADDR[1] and t.address_for(6000) == ADDR[2] and t.address_for(16000) == ADDR[3]
    assert t.addresses == (ADDR[1], ADDR[2], ADDR[3])


def test_a_group_without_a_known_leader_is_tried_at_its_voters_in_turn():
    t = table(groups=[(1, 0, 0, [(0, SLOT_COUNT - 1)])])
    assert [t.address_for(9, rotation) for rotation in range(4)] == [ADDR[1], ADDR[2], ADDR[3], ADDR[1]]


def test_not_leader_names_the_groups_new_leader_for_all_its_slots():
    t = table()
    t.note_leader(100, ADDR[3])
    assert t.address_for(100) == t.address_for(5460) == ADDR[3]
    assert t.address_for(6000) == ADDR[2]                       # other groups untouched


def test_not_leader_from_another_group_means_the_slot_moved():
    t = table()
    t.note_leader(100, ADDR[2], group_id=2)                     # the error's group is not the table's
    assert t.address_for(100) == ADDR[2]
    assert t.address_for(101) == ADDR[1]                        # the rest of group 1 stays


def test_moved_is_per_slot_and_forget_drops_a_failed_address():
    t = table()
    t.note_moved(7, ADDR[3])
    assert t.address_for(7) == ADDR[3] and t.address_for(8) == ADDR[1]
    t.forget(7, ADDR[3])
    assert t.address_for(7) == ADDR[1]
    t.forget(7, ADDR[1])                                        # the leader is unreachable: try voters
    assert t.leader_of(1) is None and t.address_for(7, 1) == ADDR[2]


def test_a_larger_epoch_replaces_hints_and_map():
    t = table(epoch=5)
    t.note_leader(0, ADDR[3])
    new = t.updated(Layout.from_pb(layout_pb(epoch=6, groups=[(1, 1, 7, [(0, 99)]), (4, 2, 1, [(100, 16383)])])))
    assert new.epoch == 6 and new.address_for(0) == ADDR[1] and new.group_of(200) == 4


def test_the_same_epoch_keeps_error_hints_unless_the_term_is_later():
    t = table(epoch=5)
    t.note_leader(0, ADDR[3])
    t.note_moved(6000, ADDR[1])
    same = t.updated(Layout.from_pb(layout_pb(epoch=5)))
    assert same.address_for(0) == ADDR[3] and same.address_for(6000) == ADDR[1]
    later = t.updated(Layout.from_pb(layout_pb(epoch=5, groups=[
        (1, 2, 8, [(0, 5460)]), (2, 2, 7, [(5461, 10922)]), (3, 3, 7, [(10923, 16383)])])))
    assert later.address_for(0) == ADDR[2]                      # seen in term 8, after the hint


def test_a_smaller_epoch_is_ignored():
    assert table(epoch=5).updated(Layout.from_pb(layout_pb(epoch=4))) is None


@pytest.mark.parametrize("groups, problem", [
    ([(1, 1, 1, [(0, 100)])], "slot 101 belongs to no group"),
    ([(1, 1, 1, [(0, 100)]), (2, 1, 1, [(100, 16383)])], "slot 100 is in groups 1 and 2"),
    ([(1, 1, 1, [(200, 16383), (0, 199)])], "out of order"),
    ([(1, 1, 1, [(0, 16384)])], "out of order or bounds"),
    ([(0, 1, 1, [(0, 16383)])], "group id 0"),
    ([(1, 1, 1, [(0, 99)]), (1, 1, 1, [(100, 16383)])], "repeated"),
])
def test_invalid_layouts_are_refused(groups, problem):
    with pytest.raises(LayoutError, match=problem):
        Layout.from_pb(layout_pb(groups=groups))


def test_nodes_are_validated():
    m = layout_pb()
    m.nodes.add(id=1, grpc="10.0.0.9:1")
    with pytest.raises(LayoutError, match="distinct"):
        Layout.from_pb(m)
    m = layout_pb()
    m.nodes[0].grpc = ""
    with pytest.raises(LayoutError, match="no valid gRPC address"):
        Layout.from_pb(m)


def test_json_shape_and_slot_text():
    m = layout_pb(groups=[(1, 1, 7, [(0, 5460), (7000, 7000)]), (2, 0, 0, [(5461, 6999), (7001, 16383)])])
    m.groups[1].learners.append(3)
    assert Layout.from_pb(m).to_json() == {
        "epoch": 5,
        "nodes": [{"id": n, "grpc": ADDR[n], "resp": ADDR[n].replace("7100", "6379"), "state": "up"}
                  for n in (1, 2, 3)],
        "groups": [{"id": 1, "leader": 1, "voters": [1, 2, 3], "learners": [], "slots": "0-5460,7000"},
                   {"id": 2, "leader": None, "voters": [1, 2, 3], "learners": [3], "slots": "5461-6999,7001-16383"}]}
    assert format_ranges([]) == ""


def test_a_removed_node_is_never_a_target():
    m = layout_pb(groups=[(1, 3, 7, [(0, SLOT_COUNT - 1)])])
    m.nodes[2].state = "removed"
    t = RouteTable(Layout.from_pb(m))
    assert t.addresses == (ADDR[1], ADDR[2])
    assert {t.address_for(0, rotation) for rotation in range(3)} == {ADDR[1], ADDR[2]}
