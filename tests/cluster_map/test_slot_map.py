"""The slot map and the initial placement (pure values)."""
import json

import pytest
from hypothesis import given, settings, strategies as st

from xraft.node.cluster.placement import even_slot_runs, initial_layout
from xraft.node.cluster.slot_map import (GroupSpec, NodeSpec, NodeState, SlotMap, SlotMapError, format_ranges,
                                         parse_ranges)
from xraft.node.engine.slots import SLOT_COUNT


def nodes(n):
    return {i: NodeSpec(i, "127.0.0.1:%d" % (7000 + i), "127.0.0.1:%d" % (6000 + i)) for i in range(1, n + 1)}


def test_three_groups_split_like_redis_cli():
    assert even_slot_runs(3) == [(0, 5460), (5461, 10922), (10923, 16383)]


def test_six_groups_on_three_nodes_spread_replicas_and_leaders():
    m = initial_layout(nodes(3), 6)
    assert m.epoch == 1
    assert [m.groups[g].preferred_leader for g in range(1, 7)] == [1, 2, 3, 1, 2, 3]
    assert all(m.groups[g].voters == (1, 2, 3) for g in m.groups)
    counts = m.slot_counts()
    assert sum(counts.values()) == SLOT_COUNT and max(counts.values()) - min(counts.values()) <= 1
    assert m.owner(0) == 1 and m.owner(SLOT_COUNT - 1) == 6


def test_five_nodes_three_replicas_each_node_holds_the_same_number():
    m = initial_layout(nodes(5), 10)
    held = {n: len(m.groups_of_node(n)) for n in range(1, 6)}
    assert set(held.values()) == {6}
    led = [m.groups[g].preferred_leader for g in m.groups]
    assert sorted(led) == sorted([1, 2, 3, 4, 5] * 2)


def test_ranges_and_text_round_trip():
    m = initial_layout(nodes(3), 3)
    assert m.ranges(2) == [(5461, 10922)]
    m2 = m.with_owner(range(100, 200), 3)
    assert m2.epoch == 2
    assert format_ranges(m2.ranges(1)) == "0-99,200-5460"
    assert parse_ranges("0-99,200-5460,7") == [(0, 99), (200, 5460), (7, 7)]
    with pytest.raises(SlotMapError):
        parse_ranges("5-3")
    with pytest.raises(SlotMapError):
        parse_ranges("16384")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(1, 40), st.lists(st.tuples(st.integers(0, SLOT_COUNT - 1),
                                                                  st.integers(0, 300), st.integers(0, 39)),
                                                        max_size=5))
def test_encode_decode_is_identity(n, g, moves):
    m = initial_layout(nodes(n), g)
    for first, length, target in moves:
        m = m.with_owner(range(first, min(SLOT_COUNT, first + length + 1)), 1 + target % g)
    back = SlotMap.decode(m.encode())
    assert back == m and back.encode() == m.encode()


@pytest.mark.parametrize("mutate", [
    lambda o: o.update(epoch=0),
    lambda o: o["slots"].pop(),
    lambda o: o["slots"][0].__setitem__(2, 99),
    lambda o: o["groups"][0].__setitem__("preferred_leader", 42),
    lambda o: o["groups"][0].__setitem__("voters", [3, 1]),
    lambda o: o["groups"][0].__setitem__("learners", [1]),
    lambda o: o["nodes"].pop(),
    lambda o: o["nodes"][0].__setitem__("state", "gone"),
    lambda o: o["nodes"][0].__setitem__("id", "1"),
    lambda o: o.update(groups=[]),
])
def test_decode_refuses_broken_maps(mutate):
    obj = json.loads(initial_layout(nodes(3), 3).encode())
    mutate(obj)
    with pytest.raises(SlotMapError):
        SlotMap.decode(json.dumps(obj).encode())


def test_decode_refuses_garbage():
    for data in (b"", b"{", b"[]", b"null", b'{"epoch": 1}', b"x" * (5 << 20)):
        with pytest.raises(SlotMapError):
            SlotMap.decode(data)


def test_changes_keep_invariants():
    m = initial_layout(nodes(3), 3)
    with pytest.raises(SlotMapError):
        m.with_owner([1], 9)
    with pytest.raises(SlotMapError):
        m.with_group(GroupSpec(2, (1, 2, 7), 1))
    m2 = m.with_node(NodeSpec(2, "h:1", "h:2", NodeState.DRAINING))
    assert m2.nodes[2].state is NodeState.DRAINING and m2.epoch == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, SLOT_COUNT - 1), st.integers(1, 5)), max_size=40))
def test_ranges_are_each_groups_maximal_runs_slot_by_slot(assignments):
    """ranges(g) (one groupby over the owners, cached per owners value) against the
    definition: every slot owned by g, joined into maximal runs, ascending."""
    owners = [1] * SLOT_COUNT
    for slot, gid in assignments:  # a slot and a few after it change owner
        for s in range(slot, min(SLOT_COUNT, slot + 1 + slot % 97)):
            owners[s] = gid
    m = initial_layout(nodes(3), 5).with_owner(range(SLOT_COUNT), 1)
    for gid in range(2, 6):
        m = m.with_owner([s for s in range(SLOT_COUNT) if owners[s] == gid], gid)
    for gid in range(0, 7):
        expected, start = [], None
        for s in range(SLOT_COUNT + 1):
            mine = s < SLOT_COUNT and owners[s] == gid
            if mine and start is None:
                start = s
            elif not mine and start is not None:
                expected.append((start, s - 1))
                start = None
        assert m.ranges(gid) == expected
