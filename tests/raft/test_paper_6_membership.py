"""Raft paper §6 / thesis §4: membership changes (single-server, learners, joint consensus)."""
import pytest

from tests.raft.netutil import Net
from xraft.node.raft.types import (
    ConfChange,
    ConfChangeError,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType as CT,
    ConfChangeV2,
    EntryType,
    MessageType as MT,
    StateRole,
)


def cc(t, nid):
    return ConfChange(t, nid)


def v2(*changes, transition=ConfChangeTransition.AUTO):
    return ConfChangeV2(transition=transition, changes=tuple(ConfChangeSingle(t, i) for t, i in changes))


def conf(n, nid):
    return n.nodes[nid].raft.trk.conf_state()


def joined(n: Net, nid: int) -> None:
    """Start a new, empty-config node that will learn membership from the leader's log."""
    n.add_node(nid, n.bootstrap_storage())


def test_add_voter_catches_up_and_changes_the_quorum():
    n = Net([1, 2, 3])
    n.elect(1)
    n.propose(1, b"before")
    joined(n, 4)
    n.nodes[1].propose_conf_change(cc(CT.ADD_NODE, 4))
    n.stabilize()
    assert all(conf(n, i).voters == (1, 2, 3, 4) for i in (1, 2, 3, 4))
    assert n.applied_data(4) == [b"before"]
    # 4 voters: a quorum is 3, so the leader plus one follower no longer commits.
    n.isolate(3)
    n.isolate(4)
    n.propose(1, b"stuck")
    assert n.applied_data(1) == [b"before"]


def test_removed_id_is_never_reused():
    n = Net([1, 2, 3])
    n.elect(1)
    n.nodes[1].propose_conf_change(cc(CT.REMOVE_NODE, 3))
    n.stabilize()
    assert conf(n, 1).voters == (1, 2) and conf(n, 1).removed == (3,)
    last = n.log(1)[-1].index
    n.nodes[1].propose_conf_change(cc(CT.ADD_NODE, 3))
    n.stabilize()
    e = n.log(1)[-1]  # the refused change became an empty normal entry
    assert e.index == last + 1 and e.type == EntryType.NORMAL and e.data == b""
    assert conf(n, 1).voters == (1, 2)
    with pytest.raises(ConfChangeError) as err:
        n.nodes[2].apply_conf_change(cc(CT.ADD_LEARNER_NODE, 3))
    assert err.value.node_id == 3
    # and two voters still commit
    n.propose(1, b"ok")
    assert n.applied_data(2) == [b"ok"]


def test_removed_leader_steps_down_and_the_rest_elect_a_new_one():
    n = Net([1, 2, 3])
    n.elect(1)
    n.nodes[1].propose_conf_change(cc(CT.REMOVE_NODE, 1))
    n.stabilize()
    assert n.role(1) == StateRole.FOLLOWER and conf(n, 2).voters == (2, 3)
    n.tick_and_stabilize(40, nids=[2, 3])
    assert len([i for i in (2, 3) if n.role(i) == StateRole.LEADER]) == 1


def test_learner_replicates_but_never_votes_or_counts():
    n = Net([1, 2, 3], learners=[4])
    n.elect(1)
    n.propose(1, b"a")
    assert n.applied_data(4) == [b"a"]
    n.isolate(2)
    n.isolate(3)
    n.propose(1, b"b")
    assert n.applied_data(1) == [b"a"]  # leader + learner is not a quorum
    term = n.term(4)
    n.tick(nids=[4], n=100)
    n.stabilize()
    assert n.role(4) == StateRole.FOLLOWER and n.term(4) == term  # learners never campaign
    assert not [m for m in n.dropped + n.queue if m.frm == 4 and m.type in (MT.VOTE, MT.PRE_VOTE)]


def test_promote_learner_to_voter():
    n = Net([1, 2, 3], learners=[4])
    n.elect(1)
    n.nodes[1].propose_conf_change(cc(CT.ADD_NODE, 4))
    n.stabilize()
    assert conf(n, 4).voters == (1, 2, 3, 4) and conf(n, 4).learners == ()
    assert not n.nodes[4].raft.is_learner


def test_joint_consensus_replaces_two_voters_with_auto_leave():
    n = Net([1, 2, 3])
    n.elect(1)
    joined(n, 4)
    joined(n, 5)
    n.nodes[1].propose_conf_change(v2((CT.ADD_NODE, 4), (CT.ADD_NODE, 5),
                                      (CT.REMOVE_NODE, 2), (CT.REMOVE_NODE, 3)))
    n.stabilize()
    cs = conf(n, 1)
    assert cs.voters == (1, 4, 5) and cs.voters_outgoing == () and not cs.auto_leave
    assert cs.removed == (2, 3)
    kinds = [e.type for e in n.log(1) if e.type == EntryType.CONF_CHANGE_V2]
    assert len(kinds) == 2  # enter joint, then the automatic leave


def test_joint_config_needs_both_majorities():
    n = Net([1, 2, 3])
    n.elect(1)
    joined(n, 4)
    joined(n, 5)
    n.nodes[1].propose_conf_change(v2((CT.ADD_NODE, 4), (CT.ADD_NODE, 5), (CT.REMOVE_NODE, 3),
                                      (CT.REMOVE_NODE, 2), transition=ConfChangeTransition.JOINT_EXPLICIT))
    n.stabilize()
    cs = conf(n, 1)
    assert cs.voters == (1, 4, 5) and cs.voters_outgoing == (1, 2, 3)
    # old majority {1,2,3} present, new majority {1,4,5} absent -> no commit
    n.isolate(4)
    n.isolate(5)
    n.propose(1, b"x")
    assert n.applied_data(1) == []
    n.heal()
    n.tick_and_stabilize(2)
    assert n.applied_data(1) == [b"x"]
    # explicit leave
    n.nodes[1].propose_conf_change(ConfChangeV2())
    n.stabilize()
    assert conf(n, 1).voters_outgoing == () and conf(n, 5).voters == (1, 4, 5)


def test_only_one_uncommitted_change_at_a_time():
    n = Net([1, 2, 3])
    n.elect(1)
    joined(n, 4)
    joined(n, 5)
    n.nodes[1].propose_conf_change(cc(CT.ADD_NODE, 4))
    n.nodes[1].propose_conf_change(cc(CT.ADD_NODE, 5))  # refused: the first is not applied yet
    n.stabilize()
    assert conf(n, 1).voters == (1, 2, 3, 4)
    types = [e.type for e in n.log(1)[-2:]]
    assert types == [EntryType.CONF_CHANGE, EntryType.NORMAL]


def test_new_leader_commits_own_term_entry_before_a_conf_change():
    n = Net([1, 2, 3])
    n.drop_type(MT.APP)
    n.elect(1)  # the empty entry of the new term is not committed yet
    n.nodes[1].propose_conf_change(cc(CT.REMOVE_NODE, 3))
    n.heal()
    n.tick_and_stabilize(2)
    assert conf(n, 1).voters == (1, 2, 3)  # the change was replaced by an empty entry
    n.nodes[1].propose_conf_change(cc(CT.REMOVE_NODE, 3))
    n.stabilize()
    assert conf(n, 1).voters == (1, 2)


def test_simple_change_of_two_voters_is_refused():
    n = Net([1, 2, 3])
    with pytest.raises(ConfChangeError, match="non-joint"):
        n.nodes[1].apply_conf_change(ConfChangeV2())  # leaving a joint config we are not in
    raft = n.nodes[1].raft
    from xraft.node.raft.confchange import Changer
    with pytest.raises(ConfChangeError, match="more than one voter"):
        Changer(raft.trk, 1).simple([ConfChangeSingle(CT.ADD_NODE, 4), ConfChangeSingle(CT.ADD_NODE, 5)])
    with pytest.raises(ConfChangeError, match="removed all voters"):
        Changer(raft.trk, 1).enter_joint(False, [ConfChangeSingle(CT.REMOVE_NODE, i) for i in (1, 2, 3)])
