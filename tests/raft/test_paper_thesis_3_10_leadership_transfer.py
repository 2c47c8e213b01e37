"""Thesis §3.10: leadership transfer (catch up the target, TimeoutNow, abort on timeout)."""
import pytest

from tests.raft.netutil import Net
from xraft.node.raft.types import MessageType as MT, ProposalDropped, StateRole


def test_transfer_to_up_to_date_follower():
    n = Net([1, 2, 3])
    n.elect(1)
    term = n.term(1)
    n.nodes[1].transfer_leader(2)
    n.stabilize()
    assert n.role(2) == StateRole.LEADER and n.role(1) == StateRole.FOLLOWER
    assert n.term(2) == term + 1  # TimeoutNow skips the pre-vote and overrides the lease


def test_transfer_catches_up_a_lagging_target_first():
    n = Net([1, 2, 3])
    n.elect(1)
    n.isolate(3)
    for k in range(5):
        n.propose(1, b"x%d" % k)
    n.heal()
    timeouts = []
    n.filters.append(lambda m: m.type == MT.TIMEOUT_NOW and timeouts.append(m) and False)
    n.nodes[1].transfer_leader(3)
    n.stabilize()
    assert n.role(3) == StateRole.LEADER
    assert len(timeouts) == 1
    assert n.applied_data(3)[:5] == [b"x%d" % k for k in range(5)]


def test_proposals_are_dropped_during_a_transfer():
    n = Net([1, 2, 3])
    n.elect(1)
    n.isolate(3)
    n.nodes[1].transfer_leader(3)
    n.stabilize()
    with pytest.raises(ProposalDropped) as err:
        n.nodes[1].propose(b"nope")
    assert "transfer" in err.value.reason


def test_transfer_aborted_after_an_election_timeout():
    n = Net([1, 2, 3], check_quorum=False)
    n.elect(1)
    n.isolate(3)
    n.nodes[1].transfer_leader(3)
    n.stabilize()
    assert n.nodes[1].raft.lead_transferee == 3
    n.tick_and_stabilize(10, nids=[1])
    assert n.nodes[1].raft.lead_transferee == 0 and n.role(1) == StateRole.LEADER
    n.propose(1, b"accepted-again")
    assert n.applied_data(2) == [b"accepted-again"]


def test_transfer_to_learner_or_self_is_ignored():
    n = Net([1, 2, 3], learners=[4])
    n.elect(1)
    n.nodes[1].transfer_leader(4)
    n.nodes[1].transfer_leader(1)
    n.stabilize()
    assert n.role(1) == StateRole.LEADER and n.nodes[1].raft.lead_transferee == 0


def test_transfer_requested_on_a_follower_is_forwarded():
    n = Net([1, 2, 3])
    n.elect(1)
    n.nodes[3].transfer_leader(3)
    n.stabilize()
    assert n.role(3) == StateRole.LEADER
