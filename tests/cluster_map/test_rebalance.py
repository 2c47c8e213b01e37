"""Plans: rebalance (slots and leaders), drain, remove, add a node. Every plan applies in order,
planning again after it gives nothing, and nothing lands on a DRAINING or REMOVED node."""
import itertools

import pytest
from hypothesis import given, settings, strategies as st

from xraft.node.cluster.changes import (AddLearner, BeginMove, PromoteLearner, SetNodeState, SetPreferredLeader,
                                        apply_change)
from xraft.node.cluster import rebalance
from xraft.node.cluster.placement import even_slot_runs, initial_layout
from xraft.node.cluster.rebalance import (PlanError, effective_owners, leader_counts, plan_add_node, plan_drain,
                                          plan_rebalance, plan_remove_node, replica_counts, slot_quotas)
from xraft.node.cluster.slot_map import GroupSpec, NodeSpec, NodeState, SlotMap, owners_from_ranges
from xraft.node.engine.slots import SLOT_COUNT

from .maps import apply_all, cluster_maps, finish_moves, nodes


def up(m):
    return {n for n, spec in m.nodes.items() if spec.state is NodeState.UP}


def check_nothing_on_down_nodes(before: SlotMap, plan: list) -> None:
    live = up(before)
    for c in plan:
        if isinstance(c, (AddLearner, PromoteLearner, SetPreferredLeader)):
            assert c.node_id in live, c


def fewest_moves(m: SlotMap) -> int:
    counts = m.slot_counts()
    quotas = slot_quotas(counts)
    return sum(max(0, counts[g] - quotas[g]) for g in counts)


# -- slots -------------------------------------------------------------------------------------------
def test_a_skewed_map_moves_the_fewest_slots_in_runs():
    m = initial_layout(nodes(3), 4)
    m = m.with_owner(range(0, 3000), 2)        # group 1 keeps 1096, group 2 holds 7096
    plan = plan_rebalance(m)
    moves = [c for c in plan if isinstance(c, BeginMove)]
    assert sum(c.last - c.first + 1 for c in moves) == fewest_moves(m) == 7096 - 4096
    assert len(moves) == 1 and (moves[0].first, moves[0].last, moves[0].target) == (5192, 8191, 1)
    done = finish_moves(apply_all(m, plan))
    assert set(done.slot_counts().values()) == {4096}
    assert plan_rebalance(done) == []


def test_uneven_split_gives_the_extra_slots_to_the_largest_groups():
    m = initial_layout(nodes(3), 3)            # 5461, 5462, 5461: already even
    assert plan_rebalance(m) == []
    counts = {1: 10000, 2: 6000, 3: 384}
    assert slot_quotas(counts) == {1: 5462, 2: 5461, 3: 5461}
    assert slot_quotas({1: 5461, 2: 5461, 3: 5462}) == {1: 5461, 2: 5461, 3: 5462}


def test_slots_already_moving_count_for_their_target():
    m = initial_layout(nodes(3), 2)
    m = m.with_owner(range(0, 16384), 1)
    m = apply_change(m, BeginMove(m.epoch, 0, 8191, 2))
    assert effective_owners(m)[0] == 2
    assert plan_rebalance(m) == []             # the move in progress already evens it


@settings(max_examples=60, deadline=None)
@given(cluster_maps())
def test_rebalance_evens_slots_and_leaders_and_is_idempotent(m):
    plan = plan_rebalance(m)
    check_nothing_on_down_nodes(m, plan)
    moved = sum(c.last - c.first + 1 for c in plan if isinstance(c, BeginMove))
    assert moved == fewest_moves(m)
    after = apply_all(m, plan)                 # every change applies in order (CAS epochs chain)
    assert [c.expect_epoch for c in plan] == list(range(m.epoch, m.epoch + len(plan)))
    assert plan_rebalance(after) == []
    done = finish_moves(after)
    counts = done.slot_counts()
    assert max(counts.values()) - min(counts.values()) <= 1
    assert plan_rebalance(done) == []
    live = up(done)
    for g in done.groups.values():
        assert g.preferred_leader in live or not live & set(g.voters)
    if all(live <= set(g.voters) for g in done.groups.values()):
        loads = leader_counts(done).values()
        assert max(loads) - min(loads) <= 1


def _best_spread(m: SlotMap) -> int:
    live = sorted(up(m))
    options = [[n for n in g.voters if n in live] or [g.preferred_leader] for _, g in sorted(m.groups.items())]
    best = None
    for choice in itertools.product(*options):
        loads = [choice.count(n) for n in live]
        best = min(best, max(loads) - min(loads)) if best is not None else max(loads) - min(loads)
    return best


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_leaders_are_as_even_as_the_voters_allow(data):
    """Against brute force on small clusters whose groups sit on different node subsets."""
    n = data.draw(st.integers(2, 5))
    gcount = data.draw(st.integers(1, 5))
    specs = {}
    for gid in range(1, gcount + 1):
        voters = tuple(sorted(data.draw(st.sets(st.integers(1, n), min_size=1, max_size=n))))
        specs[gid] = GroupSpec(gid, voters, data.draw(st.sampled_from(voters)))
    node_specs = nodes(n)
    for nid in data.draw(st.sets(st.integers(1, n), max_size=n - 1)):
        node_specs[nid] = NodeSpec(nid, node_specs[nid].grpc, node_specs[nid].resp, NodeState.DRAINING)
    runs = [(first, last, gid) for gid, (first, last) in enumerate(even_slot_runs(gcount), start=1)]
    m = SlotMap(1, owners_from_ranges(runs), specs, node_specs)
    plan = plan_rebalance(m)
    assert all(isinstance(c, SetPreferredLeader) for c in plan)
    after = apply_all(m, plan)
    loads = leader_counts(after).values()
    assert max(loads) - min(loads) == _best_spread(m)
    assert plan_rebalance(after) == []


def test_leaders_spread_after_a_skew():
    m = initial_layout(nodes(3), 6)
    for gid in m.groups:
        m = m.with_group(GroupSpec(gid, m.groups[gid].voters, 1))
    after = apply_all(m, plan_rebalance(m))
    assert leader_counts(after) == {1: 2, 2: 2, 3: 2}


# -- drain / remove ---------------------------------------------------------------------------------
def test_drain_moves_leaders_then_replaces_replicas():
    m = initial_layout(nodes(4), 4)            # group i on nodes i, i+1, i+2 (mod 4)
    plan = plan_drain(m, 1)
    assert plan[0] == SetNodeState(m.epoch, 1, NodeState.DRAINING)
    first_replica_step = next(i for i, c in enumerate(plan) if isinstance(c, AddLearner))
    assert all(isinstance(c, SetPreferredLeader) for c in plan[1:first_replica_step])
    after = apply_all(m, plan)
    assert after.nodes[1].state is NodeState.DRAINING and after.groups_of_node(1) == []
    assert all(len(g.voters) == 3 and 1 not in g.voters for g in after.groups.values())
    assert set(replica_counts(after).values()) == {4}      # 12 replicas over nodes 2, 3, 4
    assert plan_drain(after, 1) == []
    removed = apply_all(m, plan_remove_node(m, 1))
    assert removed.nodes[1].state is NodeState.REMOVED


def test_drain_without_spare_nodes_shrinks_groups_and_refuses_the_last_voter():
    m = initial_layout(nodes(3), 3)
    after = apply_all(m, plan_drain(m, 3))
    assert all(g.voters == (1, 2) for g in after.groups.values())
    single = initial_layout(nodes(2), 2, replicas=1)      # a one-replica group moves whole
    after = apply_all(single, plan_drain(single, 1))
    assert after.groups[1].voters == (2,) and after.groups[1].preferred_leader == 2
    alone = initial_layout(nodes(1), 1)
    with pytest.raises(PlanError) as e:
        plan_drain(alone, 1)
    assert (e.value.node_id, e.value.group_id) == (1, 1)
    with pytest.raises(PlanError):
        plan_drain(m, 9)


@settings(max_examples=50, deadline=None)
@given(cluster_maps(), st.data())
def test_drain_any_node(m, data):
    victim = data.draw(st.sampled_from(sorted(m.nodes)))
    try:
        plan = plan_drain(m, victim)
    except PlanError as e:
        assert m.groups[e.group_id].voters == (victim,) or not (up(m) - {victim}) & set(m.groups[e.group_id].voters)
        return
    check_nothing_on_down_nodes(apply_change(m, plan[0]) if plan and isinstance(plan[0], SetNodeState) else m,
                                plan[1:] if plan and isinstance(plan[0], SetNodeState) else plan)
    after = apply_all(m, plan)
    assert after.groups_of_node(victim) == [] and after.nodes[victim].state is NodeState.DRAINING
    spares = up(m) - {victim}
    for gid, g in after.groups.items():
        before = m.groups[gid]
        if victim in before.voters and spares - set(before.replicas):
            assert len(g.voters) == len(before.voters)       # replaced, not just removed
    assert plan_drain(after, victim) == []
    apply_all(m, plan_remove_node(m, victim))


# -- add a node --------------------------------------------------------------------------------------
def test_add_a_fourth_node_to_three():
    m = initial_layout(nodes(3), 6)            # 18 replicas, 6 per node, leaders 2 each
    plan = plan_add_node(m, NodeSpec(4, "10.0.0.4:7000", "10.0.0.4:6379"))
    after = apply_all(m, plan)
    assert sorted(replica_counts(after).values()) == [4, 4, 5, 5] and replica_counts(after)[4] == 4
    assert all(len(g.voters) == 3 and not g.learners for g in after.groups.values())
    loads = leader_counts(after)
    assert loads[4] >= 1 and max(loads.values()) - min(loads.values()) <= 1
    assert plan_add_node(after, after.nodes[4]) == []
    assert plan_rebalance(after) == []
    with pytest.raises(PlanError):
        plan_add_node(after, NodeSpec(4, "10.9.9.9:7000"))


@settings(max_examples=50, deadline=None)
@given(cluster_maps())
def test_add_node_evens_replicas(m):
    new = NodeSpec(max(m.nodes) + 1, "10.2.0.1:7000", "10.2.0.1:6379")
    plan = plan_add_node(m, new)
    after = apply_all(m, plan)
    check_nothing_on_down_nodes(after, plan)
    counts = replica_counts(after)
    for nid, count in counts.items():
        if count >= counts[new.node_id] + 2:     # only where every group it votes in already has the new node
            assert all(new.node_id in g.replicas for g in after.groups.values() if nid in g.voters)
    for gid, g in after.groups.items():
        assert len(g.replicas) == len(m.groups[gid].replicas)   # the replication factor is kept
    assert plan_add_node(after, new) == []


def test_a_fragmented_map_plans_at_most_the_moves_a_map_can_hold(monkeypatch):
    monkeypatch.setattr(rebalance, "MAX_MIGRATIONS", 4)    # the map's real limit is 256
    m = initial_layout(nodes(3), 2)                         # 0-8191 group 1, 8192-16383 group 2
    m = m.with_owner(range(SLOT_COUNT - 1, SLOT_COUNT - 21, -2), 1)   # 10 single slots among group 2's
    plan = plan_rebalance(m)                   # group 1 gives back its 10 highest: 10 runs of one slot
    assert [c.last - c.first for c in plan] == [0, 0, 0, 0] and all(isinstance(c, BeginMove) for c in plan)
    rounds = 1
    while plan:
        m = finish_moves(apply_all(m, plan))
        plan = plan_rebalance(m)
        rounds += bool(plan)
    assert rounds == 3 and set(m.slot_counts().values()) == {8192}
