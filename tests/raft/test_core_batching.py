"""Proposal batching: RawNode.propose_batch ("many client commands -> one append") and the
per-Ready batching of propose() calls; plus the fast constructors the proposal path relies on.
"""
import dataclasses
import inspect

import pytest

from tests.raft.netutil import Net
from xraft.node.raft.codec import MAX_ENTRIES_PER_MESSAGE
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import (
    Entry,
    EntryType,
    Message,
    MessageType as MT,
    ProposalDropped,
    StateRole,
    StepError,
    message_with,
)

BATCH = [b"cmd-%d" % k for k in range(50)]


def _last_index(n: Net, nid: int) -> int:
    return n.nodes[nid].raft.raft_log.last_index()


def _finish(n: Net, nid: int, rd) -> None:
    """Complete a Ready taken by the test: persist, queue its messages, advance (no apply:
    these Readies carry no committed entries)."""
    assert not rd.committed_entries
    st = n.storage[nid]
    st.append(rd.entries)
    if rd.hard_state is not None:
        st.set_hard_state(rd.hard_state)
    st.sync()
    n.queue.extend(rd.messages)
    n.queue.extend(rd.persisted_messages)
    n.nodes[nid].advance(rd)


def test_batch_is_appended_as_consecutive_entries_in_order():
    n = Net([1, 2, 3])
    n.elect(1)
    before = _last_index(n, 1)
    term = n.term(1)
    n.nodes[1].propose_batch(BATCH)
    rd = n.nodes[1].ready()
    assert [e.data for e in rd.entries] == BATCH
    assert [e.index for e in rd.entries] == list(range(before + 1, before + 1 + len(BATCH)))
    assert {e.term for e in rd.entries} == {term}
    assert {e.type for e in rd.entries} == {EntryType.NORMAL}
    # One MsgApp per follower carrying the whole batch, one self-ack to step at advance.
    apps = [m for m in rd.messages if m.type == MT.APP]
    assert sorted(m.to for m in apps) == [2, 3]
    assert all([e.data for e in m.entries] == BATCH for m in apps)
    _finish(n, 1, rd)
    n.stabilize()
    for nid in (1, 2, 3):
        assert n.applied_data(nid) == BATCH


def test_batch_and_single_proposals_keep_their_relative_order():
    n = Net([1, 2, 3])
    n.elect(1)
    n.nodes[1].propose(b"first")
    n.nodes[1].propose_batch([b"b1", b"b2"])
    n.nodes[1].propose(b"last")
    n.stabilize()
    assert n.applied_data(3) == [b"first", b"b1", b"b2", b"last"]


def test_batch_is_dropped_as_a_whole_without_a_leader():
    n = Net([1, 2, 3])
    last = _last_index(n, 2)
    with pytest.raises(ProposalDropped) as err:
        n.nodes[2].propose_batch(BATCH)
    assert err.value.node_id == 2 and "leader" in err.value.reason
    assert _last_index(n, 2) == last and not n.nodes[2].raft.msgs


def test_batch_is_dropped_as_a_whole_by_a_campaigning_node():
    n = Net([1, 2, 3])
    n.nodes[1].campaign()  # pre-candidate: its pre-votes are still in its Ready
    assert n.role(1) == StateRole.PRE_CANDIDATE
    last = _last_index(n, 1)
    with pytest.raises(ProposalDropped):
        n.nodes[1].propose_batch(BATCH)
    assert _last_index(n, 1) == last


def test_batch_is_dropped_as_a_whole_during_a_transfer():
    n = Net([1, 2, 3])
    n.elect(1)
    n.isolate(3)
    n.nodes[1].transfer_leader(3)
    n.stabilize()
    last = _last_index(n, 1)
    with pytest.raises(ProposalDropped) as err:
        n.nodes[1].propose_batch(BATCH)
    assert "transfer" in err.value.reason
    assert _last_index(n, 1) == last


def test_batch_over_the_uncommitted_limit_is_dropped_as_a_whole():
    n = Net([1, 2, 3], max_uncommitted_entries_size=100)
    n.elect(1)
    n.isolate(1)
    n.nodes[1].propose(b"a" * 60)
    last = _last_index(n, 1)
    uncommitted = n.nodes[1].raft.uncommitted_size
    # Entry by entry, four of these 10-byte commands would still fit (60 + 40 <= 100); the
    # batch of five (50 bytes) does not, and none of it is appended.
    with pytest.raises(ProposalDropped) as err:
        n.nodes[1].propose_batch([b"x" * 10] * 5)
    assert "uncommitted" in err.value.reason
    assert _last_index(n, 1) == last and n.nodes[1].raft.uncommitted_size == uncommitted
    n.nodes[1].propose_batch([b"y" * 10] * 4)  # 60 + 40 = 100: within the limit
    assert _last_index(n, 1) == last + 4
    n.heal()
    n.tick_and_stabilize(3)
    assert n.applied_data(2) == [b"a" * 60] + [b"y" * 10] * 4


def test_an_oversized_batch_is_admitted_when_nothing_is_uncommitted():
    # Same rule as a single proposal: with nothing pending, one batch may exceed the limit
    # (otherwise it could never be proposed at all).
    n = Net([1, 2, 3], max_uncommitted_entries_size=100)
    n.elect(1)
    n.nodes[1].propose_batch([b"z" * 40] * 5)
    n.stabilize()
    assert n.applied_data(3) == [b"z" * 40] * 5


def test_follower_forwards_a_batch_as_one_message():
    n = Net([1, 2, 3])
    n.elect(1)
    n.nodes[3].propose_batch(BATCH)
    rd = n.nodes[3].ready()
    props = [m for m in rd.messages if m.type == MT.PROP]
    assert len(props) == 1 and len(rd.messages) == 1
    assert props[0].to == 1 and props[0].frm == 3 and props[0].term == 0
    assert [e.data for e in props[0].entries] == BATCH
    _finish(n, 3, rd)
    n.stabilize()
    assert all(n.applied_data(nid) == BATCH for nid in (1, 2, 3))


def test_forwarding_disabled_drops_the_batch():
    n = Net([1, 2, 3], disable_proposal_forwarding=True)
    n.elect(1)
    with pytest.raises(ProposalDropped):
        n.nodes[2].propose_batch(BATCH)
    assert not n.nodes[2].has_ready()


def test_empty_or_unencodable_batch_is_refused():
    n = Net([1, 2, 3])
    n.elect(1)
    with pytest.raises(StepError):
        n.nodes[1].propose_batch([])
    with pytest.raises(StepError):
        n.nodes[1].propose_batch([b""] * (MAX_ENTRIES_PER_MESSAGE + 1))
    assert not n.nodes[1].has_ready()


def test_many_propose_calls_between_readies_make_one_msgapp_per_follower():
    n = Net([1, 2, 3])
    n.elect(1)
    for k in range(100):
        n.nodes[1].propose(b"p%d" % k)
    rd = n.nodes[1].ready()
    apps = [m for m in rd.messages if m.type == MT.APP]
    assert sorted(m.to for m in apps) == [2, 3]
    assert all([e.data for e in m.entries] == [b"p%d" % k for k in range(100)] for m in apps)
    assert len(rd.entries) == 100
    # The leader's 100 appends share one self-acknowledgement, stepped at advance().
    assert n.nodes[1]._steps_on_advance == [
        Message(MT.APP_RESP, to=1, frm=1, term=n.term(1), index=rd.entries[-1].index)]
    _finish(n, 1, rd)
    assert n.nodes[1].raft.trk.progress[1].match == rd.entries[-1].index
    n.stabilize()
    assert n.applied_data(2) == [b"p%d" % k for k in range(100)]


def test_single_node_commits_a_batch_on_its_own_ack():
    n = Net([1])
    n.elect(1)
    n.nodes[1].propose_batch(BATCH)
    n.nodes[1].propose(b"tail")
    n.stabilize()
    assert n.applied_data(1) == BATCH + [b"tail"]


def test_self_acks_of_different_terms_are_not_merged():
    # A stale self-ack (earlier term) must stay as it is: it is ignored when stepped, and the
    # new term's ack must not be folded into it.
    n = Net([1, 2, 3])
    n.elect(1)
    r = n.nodes[1].raft
    n.nodes[1].propose(b"a")
    old = r.msgs_after_append[-1]
    assert old.type == MT.APP_RESP and old.to == 1
    r.term += 1  # as if re-elected in a later term before the Ready was taken
    n.nodes[1].propose(b"b")
    assert r.msgs_after_append[-2] is old
    assert r.msgs_after_append[-1].term == r.term


# ---------------------------------------------------------------- fast constructors


def _signature_matches_fields(cls) -> bool:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fs = dataclasses.fields(cls)
    return [(p.name, p.default) for p in params] == [
        (f.name, inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default) for f in fs]


def test_hand_written_constructors_match_the_dataclass_fields():
    assert _signature_matches_fields(Entry)
    assert _signature_matches_fields(Message)
    e = Entry(3, 7, EntryType.CONF_CHANGE, b"d")
    assert (e.term, e.index, e.type, e.data) == (3, 7, EntryType.CONF_CHANGE, b"d")
    assert e == Entry(term=3, index=7, type=EntryType.CONF_CHANGE, data=b"d") and hash(e) == hash(
        Entry(3, 7, EntryType.CONF_CHANGE, b"d"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.term = 4
    vals = dict(type=MT.APP, to=2, frm=1, term=5, log_term=4, index=9, entries=(e,), commit=3,
                snapshot=None, reject=True, reject_hint=6, context=b"c", chunk_offset=1, chunk_total=2)
    m = Message(**vals)
    assert {f.name: getattr(m, f.name) for f in dataclasses.fields(Message)} == vals
    assert message_with(m, 3, 4, 8) == dataclasses.replace(m, to=3, frm=4, term=8)


def test_memory_storage_append_overwrites_a_suffix_in_place():
    st = MemoryStorage()
    st.append([Entry(1, i) for i in range(1, 6)])
    st.append([Entry(2, i) for i in range(3, 5)])  # conflicting suffix from 3: 5 goes away
    assert st.last_index() == 4 and [st.term(i) for i in range(1, 5)] == [1, 1, 2, 2]
    st.sync()
    assert st.crash().last_index() == 4
    st.compact(2)
    assert st.first_index() == 3 and st.entries(3, 5) == [Entry(2, 3), Entry(2, 4)]
