"""Thesis §9.6 / §6.2: PreVote, CheckQuorum and the follower's leader lease."""
from tests.raft.netutil import Net
from xraft.node.raft.types import Message, MessageType as MT, StateRole


def test_partitioned_node_with_prevote_does_not_inflate_its_term():
    n = Net([1, 2, 3], pre_vote=True)
    n.elect(1)
    term = n.term(1)
    n.isolate(3)
    n.tick_and_stabilize(60)
    assert n.term(3) == term and n.role(3) == StateRole.PRE_CANDIDATE
    n.heal()
    n.tick_and_stabilize(5)
    assert n.leaders() == [1] and n.term(1) == term  # rejoining disrupted nothing


def test_without_prevote_a_partitioned_node_inflates_its_term():
    n = Net([1, 2, 3], pre_vote=False, check_quorum=False)
    n.elect(1)
    term = n.term(1)
    n.isolate(3)
    n.tick_and_stabilize(60)
    assert n.term(3) > term + 1


def test_check_quorum_makes_an_isolated_leader_step_down():
    n = Net([1, 2, 3], check_quorum=True)
    n.elect(1)
    n.isolate(1)
    # The quorum check runs every election timeout; the first one still sees the acks of the
    # election itself, so the leader stops serving within two election timeouts.
    n.tick_and_stabilize(10, nids=[1])
    assert n.role(1) == StateRole.LEADER
    n.tick_and_stabilize(10, nids=[1])
    assert n.role(1) == StateRole.FOLLOWER


def test_without_check_quorum_an_isolated_leader_stays():
    n = Net([1, 2, 3], check_quorum=False)
    n.elect(1)
    n.isolate(1)
    n.tick_and_stabilize(30, nids=[1])
    assert n.role(1) == StateRole.LEADER


def test_followers_ignore_votes_while_the_leader_is_live():
    n = Net([1, 2, 3], pre_vote=False, check_quorum=True)
    n.elect(1)
    term = n.term(1)
    # A disruptive candidate with a higher term (e.g. a removed server, thesis §4.2.3).
    n.nodes[2].step(Message(MT.VOTE, to=2, frm=3, term=term + 5, index=99, log_term=term))
    assert n.term(2) == term and n.leader_of(2) == 1
    assert not n.nodes[2].raft.msgs_after_append  # not even answered


def test_vote_lease_expires_after_an_election_timeout():
    n = Net([1, 2, 3], pre_vote=False, check_quorum=True)
    n.elect(1)
    term = n.term(1)
    n.isolate(1)
    n.tick(nids=[2], n=10)
    n.nodes[2].step(Message(MT.VOTE, to=2, frm=3, term=term + 1, index=99, log_term=term))
    rd = n.nodes[2].ready()
    assert [(m.to, m.reject) for m in rd.persisted_messages if m.type == MT.VOTE_RESP] == [(3, False)]


def test_stale_leader_learns_the_new_term_from_an_append_response():
    n = Net([1, 2, 3], pre_vote=True, check_quorum=True)
    n.elect(1)
    n.isolate(1)
    n.tick_and_stabilize(30, nids=[2, 3])
    new = [i for i in (2, 3) if n.role(i) == StateRole.LEADER]
    assert new
    n.heal()
    assert n.role(1) == StateRole.LEADER  # still believes it leads (it was never ticked)
    n.nodes[1].propose(b"stale")
    n.stabilize()  # its MsgApp is answered with the higher term
    assert n.role(1) == StateRole.FOLLOWER and n.term(1) == n.term(new[0])
    n.tick_and_stabilize(1)
    assert n.leader_of(1) == new[0]
    assert b"stale" not in n.applied_data(2) and b"stale" not in n.applied_data(1)


def test_prevote_grant_does_not_change_voter_state():
    n = Net([1, 2, 3], pre_vote=True)
    f = n.nodes[2]
    term = n.term(2)
    f.step(Message(MT.PRE_VOTE, to=2, frm=3, term=term + 1, index=50, log_term=term))
    rd = f.ready()
    resp = [m for m in rd.persisted_messages if m.type == MT.PRE_VOTE_RESP]
    assert [(m.reject, m.term) for m in resp] == [(False, term + 1)]
    assert n.term(2) == term and f.raft.vote == 0
