"""cluster/membership.py: the next Raft conf change toward a group's wanted members, and group 0's
wanted members. Replaying the steps on a model configuration must reach the target without ever
shrinking a voter set before its replacement voted, whatever the start."""

import pytest

from xraft.node.cluster.membership import (ADD_LEARNER, DEMOTE, LEAVE_JOINT, PROMOTE, REMOVE, WAIT, Conf,
                                           meta_members_wanted, next_conf_step)
from xraft.node.cluster.slot_map import NodeSpec, NodeState, SlotMap
from xraft.node.cluster.placement import initial_layout


def _apply(conf: Conf, step) -> Conf:
    """The model of Raft's apply: a joint step enters and (auto) leaves at once."""
    v, l = set(conf.voters), set(conf.learners)
    for kind, n in step.changes:
        if kind == ADD_LEARNER:
            l.add(n)
        elif kind == PROMOTE:
            l.discard(n); v.add(n)
        elif kind == REMOVE:
            v.discard(n); l.discard(n)
        elif kind == DEMOTE:
            v.discard(n); l.add(n)
    return Conf(tuple(sorted(v)), tuple(sorted(l)))


def _drive(conf: Conf, voters, learners, limit=20):
    steps = []
    for _ in range(limit):
        step = next_conf_step(conf, voters, learners, caught_up=frozenset(conf.learners))
        if step is None:
            return conf, steps
        assert step.kind != WAIT
        if step.joint:
            old, new = set(conf.voters), set(_apply(conf, step).voters)
            # every voter the joint step adds was a learner (caught up by snapshot) before
            assert new - old <= set(conf.learners)
        else:
            assert len(step.changes) == 1 and step.changes[0][0] in (ADD_LEARNER, REMOVE)
            assert step.changes[0][0] == ADD_LEARNER or step.changes[0][1] not in conf.voters
        conf = _apply(conf, step)
        steps.append(step)
    raise AssertionError("no fixed point")


def test_add_then_promote_then_remove_donor():
    conf = Conf((1, 2, 3))
    s = next_conf_step(conf, (1, 2, 3), (4,))
    assert s.kind == ADD_LEARNER and s.changes == ((ADD_LEARNER, 4),) and not s.joint
    conf = Conf((1, 2, 3), (4,))
    assert next_conf_step(conf, (1, 2, 3), (4,)) is None
    # the map promoted 4 and removed 1: one joint change, only once 4 is caught up
    s = next_conf_step(conf, (2, 3, 4), (), caught_up=frozenset())
    assert s.kind == WAIT and "4" in s.why
    s = next_conf_step(conf, (2, 3, 4), (), caught_up=frozenset({4}))
    assert s.joint and set(s.changes) == {(PROMOTE, 4), (REMOVE, 1)}


def test_joint_is_left_first():
    conf = Conf((2, 3, 4), (), voters_outgoing=(1, 2, 3), auto_leave=True)
    assert next_conf_step(conf, (2, 3, 4), ()).kind == WAIT
    conf = Conf((2, 3, 4), (), voters_outgoing=(1, 2, 3), auto_leave=False)
    assert next_conf_step(conf, (2, 3, 4), ()).kind == LEAVE_JOINT


def test_extra_learner_leaves_alone_and_demotion_is_joint():
    assert next_conf_step(Conf((1, 2), (5,)), (1, 2), ()).changes == ((REMOVE, 5),)
    s = next_conf_step(Conf((1, 2, 3)), (1, 2), (3,))
    assert s.joint and s.changes == ((DEMOTE, 3),)
    with pytest.raises(ValueError):
        next_conf_step(Conf((1,)), (), (1,))


@pytest.mark.parametrize("start,want", [
    ((1, 2, 3), (2, 3, 4)), ((1, 2, 3), (4, 5, 6)), ((1,), (1, 2, 3)), ((1, 2, 3), (1,)),
    ((1, 2, 3, 4, 5), (3,)), ((2, 3), (1, 2, 3, 4, 5)),
])
def test_every_start_reaches_the_target(start, want):
    for learners in ((), (9,)):
        for want_l in ((), (8,)):
            conf, steps = _drive(Conf(start, learners), want, want_l)
            assert conf.voters == tuple(sorted(want)) and conf.learners == tuple(sorted(want_l))
            assert next_conf_step(conf, want, want_l) is None      # idempotent at the target


def _map(states: dict) -> SlotMap:
    nodes = {n: NodeSpec(n, "127.0.0.1:%d" % (7000 + n), "") for n in (1, 2, 3)}
    m = initial_layout(nodes, 3, 3)
    for n, st in states.items():
        if n not in m.nodes:
            m = m.with_node(NodeSpec(n, "127.0.0.1:%d" % (7000 + n), ""))
        m = m.with_node(NodeSpec(n, m.nodes[n].grpc, "", st))
    return m


def test_meta_members_wanted():
    m = _map({4: NodeState.UP})
    assert meta_members_wanted(m, (1, 2, 3), ()) == ((1, 2, 3), (4,))
    # node 1 removed: a learner (4, caught up) takes its vote; REMOVED nodes leave
    m = _map({4: NodeState.UP, 1: NodeState.REMOVED})
    assert meta_members_wanted(m, (1, 2, 3), (4,)) == ((2, 3, 4), ())
    # a DRAINING voter becomes a learner
    m = _map({4: NodeState.UP, 5: NodeState.UP, 2: NodeState.DRAINING})
    assert meta_members_wanted(m, (1, 2, 3), (5, 4)) == ((1, 3, 4), (2, 5))
    # nobody UP: change nothing
    m = _map({1: NodeState.DRAINING, 2: NodeState.DRAINING, 3: NodeState.DRAINING})
    assert meta_members_wanted(m, (1, 2, 3), ()) == ((1, 2, 3), ())


def test_meta_then_steps_reach_it():
    m = _map({4: NodeState.UP, 5: NodeState.UP, 1: NodeState.REMOVED})
    conf = Conf((1, 2, 3))
    for _ in range(10):
        v, l = meta_members_wanted(m, conf.voters, conf.learners)
        step = next_conf_step(conf, v, l, frozenset(conf.learners))
        if step is None:
            break
        conf = _apply(conf, step)
    assert conf == Conf((2, 3, 4), (5,))


@pytest.mark.parametrize("groups", [2, 3, 4, 6])
def test_add_then_remove_rejoins_a_node_as_a_new_replica(groups):
    """Raft refuses an id back into a group it left (ConfState.removed): a node that left a group
    and is planned back into it rejoins as its next generation, a replica id the group never had,
    so add-then-remove on 4 nodes ends with 3 replicas in every group."""
    from xraft.node.cluster.changes import apply_change
    from xraft.node.cluster.rebalance import plan_add_node, plan_remove_node
    from xraft.node.cluster.slot_map import node_of_replica
    nodes = {n: NodeSpec(n, "h:%d" % (7000 + n), "h:%d" % (6000 + n)) for n in (1, 2, 3)}
    m = initial_layout(nodes, groups, 3)
    ever = {gid: {g.replica_id(n) for n in g.replicas} for gid, g in m.groups.items()}
    for c in plan_add_node(m, NodeSpec(4, "h:7004", "h:6004")):
        m = apply_change(m, c)
        for gid, g in m.groups.items():
            ever[gid] |= {g.replica_id(n) for n in g.replicas}
    assert SlotMap.decode(m.encode()) == m
    rejoined = []
    for c in plan_remove_node(m, 1):
        before = m.groups.get(getattr(c, "group_id", None))
        m = apply_change(m, c)
        if c.kind == "add_learner":
            rid = m.groups[c.group_id].replica_id(c.node_id)
            assert node_of_replica(rid) == c.node_id
            if c.node_id in before.left:
                rejoined.append((c.group_id, c.node_id))
                assert rid not in ever[c.group_id] and rid != c.node_id        # a new replica id
                assert c.node_id not in m.groups[c.group_id].left
            ever[c.group_id].add(rid)
    assert m.nodes[1].state is NodeState.REMOVED and not m.groups_of_node(1)
    assert all(len(g.replicas) == 3 and not g.learners for g in m.groups.values()), m.groups
    assert rejoined or groups == 2       # with 2 groups only node 1 ever left one
    again = SlotMap.decode(m.encode())
    assert again == m and all(again.groups[gid].replica_id(n) == g.replica_id(n)
                              for gid, g in m.groups.items() for n in g.replicas)


def test_replica_ids_and_generations_encode_compatibly():
    """A map without generations encodes as before (replica id == node id); a rejoin records
    the generation, and a node that left and rejoins twice gets a third distinct id."""
    from xraft.node.cluster.changes import AddLearner, PromoteLearner, RemoveReplica, apply_change
    from xraft.node.cluster.slot_map import MAX_NODE_ID, SlotMapError, generation_of_replica, node_of_replica
    nodes = {n: NodeSpec(n, "h:%d" % (7000 + n), "h:%d" % (6000 + n)) for n in (1, 2, 3, 4)}
    m = initial_layout({n: nodes[n] for n in (1, 2, 3)}, 1, 3).with_node(nodes[4])
    assert b"generations" not in m.encode() and m.groups[1].replica_id(2) == 2
    ids = set()
    for _ in range(3):
        g = m.groups[1]
        if 2 not in g.replicas:
            m = apply_change(m, AddLearner(m.epoch, 1, 2))
            m = apply_change(m, PromoteLearner(m.epoch, 1, 2))
        ids.add(m.groups[1].replica_id(2))
        assert node_of_replica(m.groups[1].replica_id(2)) == 2
        pref = m.groups[1].preferred_leader
        if pref == 2:
            from xraft.node.cluster.changes import SetPreferredLeader
            m = apply_change(m, SetPreferredLeader(m.epoch, 1, 1))
        m = apply_change(m, RemoveReplica(m.epoch, 1, 2))
        assert m.groups[1].left == (2,)
    assert len(ids) == 3 and {generation_of_replica(r) for r in ids} == {0, 1, 2}
    assert b'"generations":[[2,2]]' in m.encode() and SlotMap.decode(m.encode()) == m
    bad = m.encode().replace(b'"generations":[[2,2]]', b'"generations":[[3,0]]')
    with pytest.raises(SlotMapError, match="generations"):
        SlotMap.decode(bad)
    bad = m.encode().replace(b'"generations":[[2,2]]', b'"generations":[[9,1]]')
    with pytest.raises(SlotMapError, match="generations"):
        SlotMap.decode(bad)
    with pytest.raises(SlotMapError, match="NodeSpec"):
        m.with_node(NodeSpec(MAX_NODE_ID + 1, "h:1", ""))


@pytest.mark.parametrize("groups", [2, 3, 6])
def test_a_plan_made_again_after_any_prefix_finishes_the_same_way(groups):
    """A CLI that crashed after any change of an add or a remove plans again from the map:
    it ends with every group at the replication factor, no learner left, node 1 REMOVED."""
    from xraft.node.cluster.changes import apply_change
    from xraft.node.cluster.rebalance import plan_add_node, plan_remove_node
    nodes = {n: NodeSpec(n, "h:%d" % (7000 + n), "h:%d" % (6000 + n)) for n in (1, 2, 3)}
    start = initial_layout(nodes, groups, 3)
    new = NodeSpec(4, "h:7004", "h:6004")

    def run(m, plan_fn):
        for _ in range(100):
            changes = plan_fn(m)
            if not changes:
                return m
            m = apply_change(m, changes[0])         # one at a time, planning again each time
        raise AssertionError("no end")

    full = plan_add_node(start, new)
    for k in range(len(full) + 1):
        m = start
        for c in full[:k]:
            m = apply_change(m, c)
        m = run(m, lambda mm: plan_add_node(mm, new))
        assert all(len(g.replicas) == 3 and not g.learners for g in m.groups.values()), (k, m.groups)
        assert 4 in {n for g in m.groups.values() for n in g.voters}
        removal = plan_remove_node(m, 1)
        for j in range(len(removal) + 1):
            r = m
            for c in removal[:j]:
                r = apply_change(r, c)
            r = run(r, lambda mm: plan_remove_node(mm, 1)
                    if mm.nodes[1].state is not NodeState.REMOVED else [])
            assert r.nodes[1].state is NodeState.REMOVED
            # the replication factor everywhere (a node that left a group rejoins it as a new
            # replica), no learner left behind
            for g in r.groups.values():
                assert len(g.replicas) == 3 and not g.learners, (k, j, r.groups)
