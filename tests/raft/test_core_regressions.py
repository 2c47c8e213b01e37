"""Focused regressions for core bugs the simulator found (docs/simulator.md tells each story).

Each test builds the smallest situation that broke the core, with the in-test network
of tests/raft/netutil.py or a bare RawNode, and fails on the code before its fix.
"""
from __future__ import annotations

import random

from xraft.node.raft.config import Config
from xraft.node.raft.rawnode import RawNode
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType as CT,
    ConfChangeV2,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType as MT,
    Snapshot,
    SnapshotMetadata,
    StateRole,
)

from tests.raft.netutil import Net


def _node(nid: int, st: MemoryStorage, **kw) -> RawNode:
    return RawNode(Config(id=nid, rng=random.Random(nid), **kw), st)


def test_restart_with_log_kept_below_the_snapshot_index():
    """Bug 2: snapshot at 15 but log compacted only to 12 (a catch-up tail) refused to restart."""
    n = Net([1, 2, 3])
    n.elect(1)
    for k in range(15):
        n.propose(1, b"e%d" % k)
    st = n.storage[1]
    applied = n.nodes[1].raft.raft_log.applied
    st.create_snapshot(applied, n.nodes[1].raft.trk.conf_state(), b"image")
    st.compact(applied - 4)  # keep 4 entries below the snapshot for slow followers
    st.sync()
    n.crash(1)
    node = n.restart(1)  # raised StorageStateError("log does not start right after the snapshot")
    assert node.raft.raft_log.first_index() == applied - 3
    assert node.raft.raft_log.committed == st.hard_state().commit
    n.tick_and_stabilize(30)
    (lead,) = n.leaders()
    n.propose(lead, b"after")
    assert n.committed(1) == n.committed(2) == n.committed(3)
    assert b"after" in n.applied_data(1)


def test_forwarded_proposal_that_returns_to_its_proposer_is_accepted():
    """Bug 4: a PROP forwarded by a follower keeps frm = proposer; when it comes back to the
    proposer (stale leader hints) RawNode.step raised StepError("without a valid sender")."""
    n = Net([1, 2, 3])
    n.elect(1)
    before = len(n.log(1))
    n.nodes[1].step(Message(MT.PROP, to=1, frm=1, entries=(Entry(0, 0, EntryType.NORMAL, b"back"),)))
    n.stabilize()
    assert len(n.log(1)) == before + 1 and b"back" in n.applied_data(2)
    # a read forwarded back to its originator is answered locally
    n.nodes[1].step(Message(MT.READ_INDEX, to=1, frm=1, context=b"ctx"))
    n.stabilize()
    assert [rs.request_ctx for rs in n.read_states[1]] == [b"ctx"]


def _persist(n: Net, nid: int, rd) -> None:
    st = n.storage[nid]
    if rd.snapshot is not None:
        st.apply_snapshot(rd.snapshot)
    st.append(rd.entries)
    if rd.hard_state is not None:
        st.set_hard_state(rd.hard_state)
    st.sync()


def test_snapshot_is_not_installed_under_entries_being_applied():
    """Bug 5: a snapshot installed between ready() and advance() switched the configuration
    under a committed conf change the application was applying ("config is already joint")."""
    n = Net([1, 2, 3])
    n.elect(1)
    n.isolate(3)
    for k in range(4):
        n.propose(1, b"e%d" % k)
    lead, f = n.nodes[1].raft, n.nodes[3]
    prev = f.raft.raft_log.last_index()
    ents = tuple(lead.raft_log.entries(prev + 1, 1 << 20))
    app = dict(to=3, frm=1, term=lead.term)
    # round 1: the entries reach node 3 and become durable; round 2: they are committed
    f.step(Message(MT.APP, index=prev, log_term=lead.raft_log.term(prev), entries=ents[:2], **app))
    rd = f.ready()
    _persist(n, 3, rd)
    f.advance(rd)
    f.step(Message(MT.HEARTBEAT, commit=prev + 2, **app))
    rd = f.ready()
    assert [e.index for e in rd.committed_entries] == [prev + 1, prev + 2]  # handed out, not applied
    snap = n.compact(1)
    assert snap.metadata.index > prev + 2
    chunk = dict(snapshot=snap, chunk_offset=0, chunk_total=len(snap.data), **app)
    f.step(Message(MT.SNAP, **chunk))
    assert f.raft.raft_log.unstable.next_snapshot() is None  # refused while applying
    _persist(n, 3, rd)
    f.advance(rd)
    f.step(Message(MT.SNAP, **chunk))  # the leader's retry, once the application caught up
    assert f.raft.raft_log.unstable.next_snapshot() is not None
    assert f.raft.raft_log.committed == snap.metadata.index


def test_new_node_accepts_a_snapshot_taken_before_it_was_added():
    """Bug 1: the leader's only snapshot predates the conf change adding node 4; node 4 refused
    it (not in its ConfState), the leader re-sent it forever and node 4 never caught up."""
    n = Net([1, 2, 3])
    n.elect(1)
    for k in range(5):
        n.propose(1, b"e%d" % k)
    n.compact(1)  # snapshot with voters (1, 2, 3) only
    n.nodes[1].propose_conf_change(ConfChange(CT.ADD_LEARNER_NODE, 4))
    n.stabilize()
    n.add_node(4, MemoryStorage())  # brand new: empty log, empty configuration
    n.tick_and_stabilize(5)
    assert n.committed(4) == n.committed(1)
    assert n.nodes[4].raft.is_learner
    assert n.nodes[4].raft.trk.conf_state().learners == (4,)


def _snap(index: int, **conf) -> Snapshot:
    return Snapshot(SnapshotMetadata(index=index, term=1, conf_state=ConfState(**conf)), b"image")


def _outsider(nid: int, **conf) -> RawNode:
    """A node whose storage holds a snapshot at index 4 with the given configuration."""
    st = MemoryStorage()
    st.apply_snapshot(_snap(4, **conf))
    st.sync()
    return _node(nid, st, applied=4)


def test_a_joining_node_takes_another_snapshot_that_predates_its_add():
    """Bug 10: a new node that installed a snapshot older than the change adding it (bug 1's
    exception) has a configuration without itself and a log. When the entries after that
    snapshot were lost and the leader could only send another snapshot that still predates the
    change, the node refused it (it was no longer brand-new) and was left behind for good."""
    joining = _outsider(4, voters=(1, 2, 3))
    assert joining.raft.restore(_snap(6, voters=(1, 2, 3)))  # was refused: False
    assert joining.raft.raft_log.committed == 6
    assert joining.raft.trk.conf_state().voters == (1, 2, 3) and not joining.raft.promotable()


def test_a_member_or_removed_node_still_refuses_a_snapshot_without_it():
    """The exception of bugs 1 and 10 is narrow: only a node outside its own configuration that
    was never removed takes a snapshot whose configuration lacks it."""
    without_7 = _snap(6, voters=(1, 2, 3))
    assert _outsider(7, voters=(1, 2, 3), removed=(7,)).raft.restore(without_7) is False  # removed
    assert _outsider(7, voters=(1, 2, 3, 7)).raft.restore(without_7) is False  # a member: stale
    assert _outsider(7, voters=(1, 2, 3)).raft.restore(_snap(6, voters=(1, 2, 3), removed=(7,))) is False


def test_reordered_snapshot_chunks_are_assembled():
    """Bug 3: chunks had to arrive in order; the simulator's reordering network re-sent them
    forever. Now they are kept by offset and assembled once every byte arrived."""
    n = Net([1, 2, 3], max_snapshot_chunk_bytes=100)
    n.elect(1)
    n.isolate(3)
    for k in range(10):
        n.propose(1, b"e%d" % k)
    data = bytes(range(256)) * 2  # 512 bytes -> 6 chunks
    n.compact(1, data)
    n.heal()
    # collect the snapshot chunks instead of delivering them, then deliver them backwards
    chunks = []
    n.filters.append(lambda m: m.type == MT.SNAP and not chunks.append(m) and True)
    n.tick_and_stabilize(2)
    n.filters.clear()
    assert len({m.chunk_offset for m in chunks}) == 6
    for m in reversed(chunks):
        n.nodes[3].step(m)
    n.stabilize()
    assert n.storage[3].snapshot().data == data
    n.tick_and_stabilize(3)
    assert n.log(3) == n.log(1) and n.role(3) == StateRole.FOLLOWER


def test_snapshot_ack_ends_snapshot_state_when_the_log_moved_past_it():
    """Issue 9 A: a follower acked the snapshot it was sent (match >= pending snapshot), but the
    leader had compacted past it meanwhile and report_snapshot never came (a paused leader in
    the simulator, seeds 500490 and others). The leader left SNAPSHOT only on the report or
    when its log could take over (etcd's rule), so it heartbeat the follower for ever and never
    sent anything else. The ack alone must end the state (and bring a newer snapshot)."""
    n = Net([1, 2, 3])
    n.elect(1)
    n.isolate(3)
    for k in range(5):
        n.propose(1, b"e%d" % k)
    n.compact(1, b"first")
    n.heal()
    held = []  # the snapshot for 3, held in flight: this harness never calls report_snapshot
    n.filters.append(lambda m: m.type == MT.SNAP and not held.append(m) and True)
    n.tick_and_stabilize(2)
    assert held and n.nodes[1].raft.trk.progress[3].state.name == "SNAPSHOT"
    for k in range(5):
        n.propose(1, b"f%d" % k)
    n.compact(1, b"second")  # the leader's log now starts past the snapshot in flight
    n.filters.clear()
    for m in held:
        n.nodes[3].step(m)
    n.stabilize()  # 3 installs it and acks its index; the leader must send the newer snapshot
    n.tick_and_stabilize(3)
    assert n.storage[3].snapshot().data == b"second"
    assert n.committed(3) == n.committed(1)
    assert n.nodes[1].raft.trk.progress[3].state.name == "REPLICATE"
