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
def test_add_then_remove_never_puts_a_node_back_into_a_group_it_left(groups):
    """Raft refuses an id back into a group it left (ConfState.removed); RemoveReplica records
    it in the group's `left`, AddLearner refuses it and the planners avoid it."""
    from xraft.node.cluster.changes import AddLearner, apply_change
    from xraft.node.cluster.rebalance import plan_add_node, plan_remove_node
    from xraft.node.cluster.slot_map import SlotMapError
    nodes = {n: NodeSpec(n, "h:%d" % (7000 + n), "h:%d" % (6000 + n)) for n in (1, 2, 3)}
    m = initial_layout(nodes, groups, 3)
    for c in plan_add_node(m, NodeSpec(4, "h:7004", "h:6004")):
        m = apply_change(m, c)
    assert SlotMap.decode(m.encode()) == m
    for c in plan_remove_node(m, 1):
        if c.kind == "add_learner":
            assert c.node_id not in m.groups[c.group_id].left
        m = apply_change(m, c)
    assert m.nodes[1].state is NodeState.REMOVED and not m.groups_of_node(1)
    back = [(g.group_id, n) for g in m.groups.values() for n in g.left if m.nodes[n].state is NodeState.UP]
    assert back or groups == 2       # with 2 groups only node 1 ever left one
    for gid, n in back:
        with pytest.raises(SlotMapError, match="left group"):
            apply_change(m, AddLearner(m.epoch, gid, n))


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
            # never more replicas than before, no learner left behind; fewer only where every
            # candidate node already left that group (Raft takes no id back)
            for g in r.groups.values():
                assert len(g.replicas) <= 3 and not g.learners, (k, j, r.groups)
                if len(g.replicas) < 3:
                    assert not {2, 3, 4} - set(g.replicas) - set(g.left), (k, j, r.groups)
