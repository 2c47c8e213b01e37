"""Raft paper §5.3: log replication (commit, conflicts, backtracking, flow control, batching)."""
from tests.raft.netutil import Net
from xraft.node.raft.progress import ProgressState
from xraft.node.raft.types import Message, MessageType as MT, StateRole


def test_entry_committed_once_on_a_majority_and_applied_everywhere():
    n = Net([1, 2, 3])
    n.elect(1)
    n.propose(1, b"x")
    for i in (1, 2, 3):
        assert n.applied_data(i) == [b"x"]
        assert n.committed(i) == n.log(1)[-1].index


def test_commit_with_one_follower_down_but_not_with_two():
    n = Net([1, 2, 3])
    n.elect(1)
    n.isolate(3)
    n.propose(1, b"a")
    assert n.applied_data(1) == [b"a"] and n.applied_data(3) == []
    n.isolate(2)
    n.propose(1, b"b")
    assert n.applied_data(1) == [b"a"]
    assert n.log(1)[-1].data == b"b"
    n.heal()
    n.tick_and_stabilize(2)  # heartbeats re-open the paused probes
    assert all(n.applied_data(i) == [b"a", b"b"] for i in (1, 2, 3))


def test_followers_learn_commit_through_heartbeats_only_up_to_their_match():
    n = Net([1, 2, 3])
    n.elect(1)
    n.drop_type(MT.APP, to=3)
    n.propose(1, b"a")
    assert n.committed(3) < n.committed(1)
    n.tick_and_stabilize(1)  # heartbeat commit = min(match, committed) keeps 3 consistent
    assert n.committed(3) <= n.log(3)[-1].index


def test_conflicting_uncommitted_suffix_is_overwritten():
    n = Net([1, 2, 3])
    n.elect(1)
    n.propose(1, b"base")
    n.isolate(1)
    for k in range(3):  # uncommitted entries on the old leader only
        n.nodes[1].propose(b"lost%d" % k)
    n.stabilize()
    n.tick_and_stabilize(30, nids=[2, 3])
    assert n.role(2) == StateRole.LEADER or n.role(3) == StateRole.LEADER
    new = 2 if n.role(2) == StateRole.LEADER else 3
    n.propose(new, b"kept")
    n.heal()
    n.tick_and_stabilize(5)
    assert n.role(1) == StateRole.FOLLOWER
    logs = [[(e.index, e.term, e.data) for e in n.log(i)] for i in (1, 2, 3)]
    assert logs[0] == logs[1] == logs[2]  # Log Matching
    assert n.applied_data(1) == [b"base", b"kept"]


def test_fast_backtracking_needs_few_round_trips():
    n = Net([1, 2, 3], max_inflight_msgs=1000)
    n.elect(1)
    n.isolate(1)
    for k in range(50):
        n.nodes[1].propose(b"old%d" % k)  # 50 divergent entries in one term
    n.stabilize()
    n.tick_and_stabilize(30, nids=[2, 3])
    new = n.leaders()[-1]
    assert new != 1
    for k in range(30):
        n.propose(new, b"new%d" % k)
    # Re-elect elsewhere so the new leader's probe for 1 starts above 1's divergent run.
    other = 5 - new
    n.nodes[new].transfer_leader(other)
    n.stabilize()
    assert n.role(other) == StateRole.LEADER
    new = other
    n.heal()
    n.queue.clear()
    rejects = []
    n.filters.append(lambda m: m.type == MT.APP_RESP and m.reject and rejects.append(m) and False)
    n.tick_and_stabilize(3)
    assert n.log(1) == n.log(new)
    assert 1 <= len(rejects) <= 3  # one term skipped per rejection, not one entry


def test_leader_pipelines_within_inflight_limit():
    n = Net([1, 2], max_inflight_msgs=3, max_size_per_msg=1)
    n.elect(1)
    n.drop_type(MT.APP_RESP)
    for k in range(10):
        n.nodes[1].propose(b"p%d" % k)
        n.stabilize()
    apps = [m for m in n.dropped if m.type == MT.APP_RESP]
    assert apps  # the follower received and acked, but acks were lost
    pr = n.nodes[1].raft.trk.progress[2]
    assert pr.state == ProgressState.REPLICATE and pr.inflights.full()
    sent = n.nodes[1].raft.trk.progress[2].inflights.count()
    assert sent == 3
    n.heal()
    n.tick_and_stabilize(3)
    assert n.applied_data(2) == [b"p%d" % k for k in range(10)]


def test_inflight_bytes_limit_pauses_replication():
    n = Net([1, 2], max_inflight_bytes=100, max_size_per_msg=1)
    n.elect(1)
    n.drop_type(MT.APP_RESP)
    for k in range(5):
        n.nodes[1].propose(b"x" * 60)
        n.stabilize()
    pr = n.nodes[1].raft.trk.progress[2]
    assert pr.inflights.full() and pr.inflights.count() == 2


def test_many_proposals_between_readies_become_one_append_and_one_msgapp():
    n = Net([1, 2, 3])
    n.elect(1)
    leader = n.nodes[1]
    for k in range(20):
        leader.propose(b"b%d" % k)
    rd = leader.ready()
    assert len(rd.entries) == 20
    apps = [m for m in rd.messages if m.type == MT.APP]
    assert sorted(m.to for m in apps) == [2, 3] and all(len(m.entries) == 20 for m in apps)
    leader.advance(rd)


def test_max_size_per_msg_splits_appends():
    n = Net([1, 2], max_size_per_msg=100)
    n.elect(1)
    n.isolate(2)
    for k in range(10):
        n.nodes[1].propose(b"y" * 50)
    n.stabilize()
    n.heal()
    n.queue.clear()
    sizes = []
    n.filters.append(lambda m: m.type == MT.APP and m.to == 2 and sizes.append(len(m.entries)) and False)
    n.tick_and_stabilize(3)
    assert len(n.applied_data(2)) == 10
    assert max(sizes) <= 2  # 100 bytes per message (at least one entry)


def test_stale_append_responses_are_ignored():
    n = Net([1, 2, 3])
    n.elect(1)
    n.propose(1, b"a")
    pr = n.nodes[1].raft.trk.progress[2]
    match = pr.match
    n.nodes[1].step(Message(MT.APP_RESP, to=1, frm=2, term=n.term(1), index=1))
    n.nodes[1].step(Message(MT.APP_RESP, to=1, frm=2, term=n.term(1), index=999))  # bogus
    assert pr.match == match and pr.state == ProgressState.REPLICATE


def test_ready_contract_separates_messages_by_durability():
    n = Net([1, 2, 3])
    n.elect(1)
    n.nodes[1].propose(b"d")
    rd = n.nodes[1].ready()
    assert rd.entries and rd.must_sync
    assert {m.type for m in rd.messages} == {MT.APP}  # may go out before the leader's fsync
    assert rd.persisted_messages == ()  # the self-ack is stepped at advance, never sent
    n.nodes[1].advance(rd)
    f = n.nodes[2]
    f.step(rd.messages[0] if rd.messages[0].to == 2 else rd.messages[1])
    frd = f.ready()
    assert [m.type for m in frd.persisted_messages] == [MT.APP_RESP] and frd.messages == ()
    assert [e.data for e in frd.entries] == [b"d"]
    f.advance(frd)


def test_ready_misuse_and_bad_peer_messages_are_refused():
    import pytest

    from xraft.node.invariant import InvariantViolation
    from xraft.node.raft.types import Entry, StepError

    n = Net([1, 2, 3])
    n.elect(1)
    node = n.nodes[2]
    n.nodes[1].propose(b"q")
    n.process_ready(1)
    app = next(m for m in n.queue if m.to == 2 and m.type == MT.APP)
    node.step(app)
    rd = node.ready()
    with pytest.raises(InvariantViolation):
        node.ready()  # must advance first
    node.advance(rd)
    with pytest.raises(InvariantViolation):
        node.advance(rd)  # twice
    term = n.term(1)
    with pytest.raises(StepError):  # local message type from the network
        node.step(Message(MT.HUP, to=2, frm=1))
    with pytest.raises(StepError):  # not consecutive
        node.step(Message(MT.APP, to=2, frm=1, term=term, index=2, log_term=term,
                          entries=(Entry(term, 3), Entry(term, 5))))
    with pytest.raises(StepError):  # entry from the future term
        node.step(Message(MT.APP, to=2, frm=1, term=term, index=2, log_term=term,
                          entries=(Entry(term + 1, 3),)))
    with pytest.raises(StepError):  # no sender
        node.step(Message(MT.VOTE, to=2, frm=0, term=term + 1))


def test_uncommitted_bytes_are_limited_on_the_leader():
    import pytest

    from xraft.node.raft.types import ProposalDropped

    n = Net([1, 2, 3], max_uncommitted_entries_size=100)
    n.elect(1)
    n.isolate(1)
    n.nodes[1].propose(b"a" * 60)
    n.nodes[1].propose(b"b" * 30)
    with pytest.raises(ProposalDropped) as err:
        n.nodes[1].propose(b"c" * 20)
    assert "uncommitted" in err.value.reason
    n.heal()
    n.tick_and_stabilize(3)
    n.propose(1, b"c" * 20)  # committing frees the budget
    assert n.applied_data(2)[-1] == b"c" * 20


def test_unreachable_report_moves_replicating_follower_back_to_probe():
    n = Net([1, 2, 3])
    n.elect(1)
    pr = n.nodes[1].raft.trk.progress[2]
    assert pr.state == ProgressState.REPLICATE
    n.nodes[1].report_unreachable(2)
    assert pr.state == ProgressState.PROBE
    n.tick_and_stabilize(2)
    assert pr.state == ProgressState.REPLICATE
