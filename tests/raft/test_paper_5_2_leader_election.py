"""Raft paper §5.2: leader election."""
import random
import tracemalloc

import pytest

from tests.raft.netutil import Net
from xraft.node.raft.config import Config
from xraft.node.raft.rawnode import RawNode
from xraft.node.raft.types import ConfigError, Message, MessageType as MT, StateRole


def test_single_node_elects_itself_after_election_timeout():
    n = Net([1], pre_vote=False)
    n.tick_and_stabilize(25)
    assert n.role(1) == StateRole.LEADER and n.term(1) == 2


def test_candidate_counts_its_own_vote_only_after_persisting_it():
    n = Net([1], pre_vote=False)
    node = n.nodes[1]
    node.campaign()
    assert n.role(1) == StateRole.CANDIDATE
    rd = node.ready()
    assert rd.hard_state.vote == 1 and rd.must_sync
    node.advance(rd)  # the vote is durable now: the self-vote is stepped and wins
    assert n.role(1) == StateRole.LEADER


@pytest.mark.parametrize("pre_vote", [False, True])
def test_three_nodes_elect_exactly_one_leader(pre_vote):
    n = Net([1, 2, 3], seed=7, pre_vote=pre_vote)
    n.tick_and_stabilize(40)
    leaders = n.leaders()
    assert len(leaders) == 1
    lead = leaders[0]
    assert all(n.leader_of(i) == lead for i in (1, 2, 3))
    assert len({n.term(i) for i in (1, 2, 3)}) == 1


def test_randomized_election_timeout_in_range():
    seen = set()
    for seed in range(200):
        cfg = Config(id=1, election_tick=10, rng=random.Random(seed))
        from tests.raft.netutil import Net as _N
        node = RawNode(cfg, _N([1]).bootstrap_storage())
        t = node.raft.randomized_election_timeout
        assert 10 <= t < 20
        seen.add(t)
    assert len(seen) == 10  # every value of [et, 2et) occurs


def test_follower_votes_at_most_once_per_term():
    n = Net([1, 2, 3], pre_vote=False)
    f = n.nodes[3]
    f.step(Message(MT.VOTE, to=3, frm=1, term=5, index=1, log_term=1))
    f.step(Message(MT.VOTE, to=3, frm=2, term=5, index=1, log_term=1))
    rd = f.ready()
    resps = [m for m in rd.persisted_messages if m.type == MT.VOTE_RESP]
    assert [(m.to, m.reject) for m in resps] == [(1, False), (2, True)]
    assert rd.hard_state.vote == 1 and rd.hard_state.term == 5
    assert rd.messages == ()  # vote grants wait for persistence


def test_candidate_becomes_follower_on_append_from_leader_of_same_term():
    n = Net([1, 2, 3], pre_vote=False)
    n.nodes[2].campaign()
    assert n.role(2) == StateRole.CANDIDATE
    term = n.term(2)
    n.nodes[2].step(Message(MT.APP, to=2, frm=3, term=term, index=1, log_term=1))
    assert n.role(2) == StateRole.FOLLOWER and n.leader_of(2) == 3


def test_candidate_loses_on_majority_rejection():
    n = Net([1, 2, 3], pre_vote=False)
    n.nodes[1].campaign()
    n.process_ready(1)
    term = n.term(1)
    n.nodes[1].step(Message(MT.VOTE_RESP, to=1, frm=2, term=term, reject=True))
    n.nodes[1].step(Message(MT.VOTE_RESP, to=1, frm=3, term=term, reject=True))
    assert n.role(1) == StateRole.FOLLOWER


def test_split_vote_is_resolved_by_retrying():
    n = Net([1, 2, 3, 4], seed=3, pre_vote=False)
    # Two simultaneous candidates split the 4 votes 2/2 ...
    n.cut(1, 4)
    n.cut(2, 3)
    n.nodes[1].campaign()
    n.nodes[2].campaign()
    n.stabilize()
    assert not n.leaders() and n.role(1) == n.role(2) == StateRole.CANDIDATE
    n.heal()
    # ... and randomized timeouts elect someone later.
    n.tick_and_stabilize(60)
    assert len(n.leaders()) == 1


def test_leader_sends_heartbeats_and_followers_do_not_time_out():
    n = Net([1, 2, 3])
    n.elect(1)
    term = n.term(1)
    n.tick_and_stabilize(100)
    assert n.leaders() == [1] and n.term(2) == term


def test_new_leader_appends_empty_entry_of_its_term():
    n = Net([1, 2, 3])
    n.elect(2)
    last = n.log(2)[-1]
    assert last.term == n.term(2) and last.data == b""
    assert n.committed(1) == last.index  # committed everywhere


def test_follower_tick_is_cheap_and_allocation_free():
    n = Net([1, 2, 3], election_tick=10**9)
    n.elect(1)
    f = n.nodes[2]
    f.tick()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(20_000):
        f.tick()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename")
                if "xraft" in str(s.traceback) or "node/raft" in str(s.traceback))
    assert grown <= 64  # at most the one int object holding the elapsed count
    assert not f.has_ready()


def test_config_validation():
    with pytest.raises(ConfigError):
        Config(id=0, rng=random.Random(1)).validate()
    with pytest.raises(ConfigError):
        Config(id=1, election_tick=1, heartbeat_tick=1, rng=random.Random(1)).validate()
    with pytest.raises(ConfigError):
        Config(id=1).validate()  # no rng
