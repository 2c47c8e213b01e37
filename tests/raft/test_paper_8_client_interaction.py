"""Raft paper §8 / thesis §6: client interaction — forwarding, ReadIndex and lease reads."""
import random

import pytest

from tests.raft.netutil import Net
from xraft.node.raft.config import Config
from xraft.node.raft.read_only import ReadOnlyOption
from xraft.node.raft.types import ConfigError, MessageType as MT, ProposalDropped, ReadState


def test_follower_forwards_proposals_to_the_leader():
    n = Net([1, 2, 3])
    n.elect(1)
    n.propose(3, b"via-follower")
    assert all(n.applied_data(i) == [b"via-follower"] for i in (1, 2, 3))


def test_forwarding_can_be_disabled():
    n = Net([1, 2, 3], disable_proposal_forwarding=True)
    n.elect(1)
    with pytest.raises(ProposalDropped) as err:
        n.nodes[2].propose(b"x")
    assert err.value.node_id == 2


def test_read_index_on_leader_needs_a_heartbeat_quorum():
    n = Net([1, 2, 3])
    n.elect(1)
    n.propose(1, b"w")
    n.nodes[1].read_index(b"r1")
    assert not n.read_states[1]
    rd_msgs = n.nodes[1].ready()
    hb = [m for m in rd_msgs.messages if m.type == MT.HEARTBEAT]
    assert {m.context for m in hb} == {b"r1"} and len(hb) == 2
    assert rd_msgs.read_states == ()
    n.nodes[1].advance(rd_msgs)
    n.queue.extend(rd_msgs.messages)
    n.stabilize()
    assert n.read_states[1] == [ReadState(n.committed(1), b"r1")]


def test_read_index_from_follower_is_forwarded_and_answered():
    n = Net([1, 2, 3])
    n.elect(1)
    n.propose(1, b"w")
    n.nodes[3].read_index(b"f")
    n.stabilize()
    assert n.read_states[3] == [ReadState(n.committed(1), b"f")]


def test_isolated_leader_cannot_serve_safe_reads():
    n = Net([1, 2, 3])
    n.elect(1)
    n.isolate(1)
    n.nodes[1].read_index(b"stale?")
    n.stabilize()
    assert n.read_states[1] == []


def test_new_leader_defers_reads_until_an_entry_of_its_term_commits():
    n = Net([1, 2, 3])
    n.drop_type(MT.APP)
    n.elect(1)
    n.nodes[1].read_index(b"early")
    n.stabilize()
    assert n.read_states[1] == []  # commit index not known to be current yet
    n.heal()
    n.tick_and_stabilize(2)
    assert [rs.request_ctx for rs in n.read_states[1]] == [b"early"]
    assert n.read_states[1][0].index >= n.log(1)[0].index


def test_later_read_confirms_earlier_pending_reads():
    n = Net([1, 2, 3])
    n.elect(1)
    n.drop_type(MT.HEARTBEAT_RESP)
    n.nodes[1].read_index(b"a")
    n.stabilize()
    n.heal()
    n.nodes[1].read_index(b"b")
    n.stabilize()
    assert [rs.request_ctx for rs in n.read_states[1]] == [b"a", b"b"]


def test_lease_based_reads_answer_without_a_round_trip():
    n = Net([1, 2, 3], read_only_option=ReadOnlyOption.LEASE_BASED)
    n.elect(1)
    n.nodes[1].read_index(b"lease")
    rd = n.nodes[1].ready()
    assert [rs.request_ctx for rs in rd.read_states] == [b"lease"]
    assert not [m for m in rd.messages if m.type == MT.HEARTBEAT]
    n.nodes[1].advance(rd)


def test_lease_based_reads_require_check_quorum():
    with pytest.raises(ConfigError) as err:
        Config(id=1, check_quorum=False, read_only_option=ReadOnlyOption.LEASE_BASED,
               rng=random.Random(1)).validate()
    assert err.value.field_name == "read_only_option"


def test_single_node_read_is_immediate():
    n = Net([1])
    n.elect(1)
    n.nodes[1].read_index(b"solo")
    n.stabilize()
    assert n.read_states[1] == [ReadState(n.committed(1), b"solo")]
