"""Raft paper §5.4: election restriction, commitment rule, and randomized safety checks."""
import random

import pytest

from tests.raft.netutil import Net
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import (
    ConfState,
    Entry,
    HardState,
    Message,
    MessageType as MT,
    ProposalDropped,
    Snapshot,
    SnapshotMetadata,
    StateRole,
)


def storage_with(terms, voters=(1, 2, 3), hs=None):
    st = MemoryStorage()
    st.apply_snapshot(Snapshot(SnapshotMetadata(1, 1, ConfState(voters=voters))))
    st.append([Entry(term=t, index=i + 2) for i, t in enumerate(terms)])
    if hs is not None:
        st.set_hard_state(hs)
    st.sync()
    return st


def test_voter_rejects_candidate_with_less_up_to_date_log():
    n = Net([1, 2, 3], pre_vote=False, storages={1: storage_with([1, 2], hs=HardState(2, 0, 1)),
                                                 2: storage_with([1], hs=HardState(2, 0, 1)),
                                                 3: storage_with([1, 2], hs=HardState(2, 0, 1))})
    n.nodes[2].campaign()
    n.stabilize()
    assert n.role(2) != StateRole.LEADER  # 1 and 3 hold a newer last term: both refuse
    n.elect(1)
    assert n.log(2)[1].term == 2  # the more complete log won and replicated


def test_leader_does_not_commit_previous_term_entries_by_counting_replicas():
    # Figure 8: node 1 leads term 3 with an uncommitted term-2 entry at index 3.
    hs = HardState(2, 0, 2)
    n = Net([1, 2, 3], pre_vote=False, storages={1: storage_with([1, 2], hs=hs),
                                                 2: storage_with([1], hs=hs),
                                                 3: storage_with([1], hs=hs)})
    n.drop_type(MT.APP)  # elect 1 but stop it from replicating
    n.elect(1)
    leader = n.nodes[1]
    term = n.term(1)
    assert term == 3 and n.log(1)[-1].index == 4
    # Both followers acknowledge index 3 (the term-2 entry) ...
    leader.step(Message(MT.APP_RESP, to=1, frm=2, term=term, index=3))
    leader.step(Message(MT.APP_RESP, to=1, frm=3, term=term, index=3))
    assert n.committed(1) == 2  # ... yet it is not committed by counting (§5.4.2)
    leader.step(Message(MT.APP_RESP, to=1, frm=2, term=term, index=4))
    assert n.committed(1) == 4  # committing the term-3 entry commits index 3 indirectly


def test_leader_counts_itself_only_for_persisted_entries():
    n = Net([1, 2, 3])
    n.elect(1)
    leader = n.nodes[1]
    leader.propose(b"x")
    rd = leader.ready()  # not yet persisted/advanced
    idx = rd.entries[-1].index
    leader.step(Message(MT.APP_RESP, to=1, frm=2, term=n.term(1), index=idx))
    # A majority is {1, 2}; 2 acked, 1 has not persisted: with one ack (2) + leader unpersisted,
    # commit needs a second durable copy.
    assert n.committed(1) < idx
    st = n.storage[1]
    st.append(rd.entries)
    st.sync()
    leader.advance(rd)
    assert n.committed(1) == idx


def test_stale_append_cannot_truncate_committed_entries():
    n = Net([1, 2, 3])
    n.elect(1)
    for k in range(3):
        n.propose(1, b"c%d" % k)
    f = n.nodes[2]
    before = n.log(2)
    committed = n.committed(2)
    # A delayed MsgApp from an old leader at a lower index with different entries.
    f.step(Message(MT.APP, to=2, frm=1, term=n.term(1), index=2, log_term=1,
                   entries=(Entry(n.term(1), 3, data=b"other"),), commit=2))
    assert n.log(2) == before and n.committed(2) == committed


def test_proposal_without_leader_is_dropped():
    n = Net([1, 2, 3])
    with pytest.raises(ProposalDropped):
        n.nodes[1].propose(b"x")


def _check_safety(n: Net, history: dict) -> None:
    """State Machine Safety: every node's applied sequence is a prefix of one global sequence."""
    for nid, applied in n.applied.items():
        for e in applied:
            prev = history.setdefault(e.index, (e.term, e.data))
            assert prev == (e.term, e.data), f"node {nid} applied a different entry at {e.index}"
    leaders_by_term = {}
    for nid in n.nodes:
        if nid not in n.down and n.role(nid) == StateRole.LEADER:
            t = n.term(nid)
            assert leaders_by_term.setdefault(t, nid) == nid, f"two leaders in term {t}"


@pytest.mark.parametrize("seed", range(12))
def test_randomized_partitions_and_crashes_preserve_safety(seed):
    rng = random.Random(seed)
    ids = [1, 2, 3, 4, 5]
    n = Net(ids, seed=seed, pre_vote=bool(seed % 2), check_quorum=bool(seed % 3))
    history: dict = {}
    acked: dict = {}
    for step in range(250):
        r = rng.random()
        if r < 0.05:
            n.heal()
            for a, b in rng.sample([(a, b) for a in ids for b in ids if a < b], 3):
                n.cut(a, b)
        elif r < 0.08:
            n.heal()
        elif r < 0.10:
            victim = rng.choice(ids)
            if victim not in n.down:
                n.crash(victim)
            else:
                n.restart(victim)
        elif r < 0.45:
            lead = [x for x in n.leaders()]
            if lead:
                try:
                    n.nodes[lead[0]].propose(b"s%d-%d" % (seed, step))
                except ProposalDropped:
                    pass
        n.tick()
        for _ in range(3):
            for nid in ids:
                n.process_ready(nid)
            for _ in range(len(n.queue)):
                if rng.random() < 0.9:
                    n.deliver_one()
                else:  # reorder
                    n.queue.append(n.queue.pop(0))
        _check_safety(n, history)
        for nid in ids:
            if nid not in n.down:
                acked[nid] = max(acked.get(nid, 0), n.committed(nid))
    # liveness after healing: everyone converges
    n.heal()
    for nid in ids:
        if nid in n.down:
            n.restart(nid)
    n.tick_and_stabilize(80)
    _check_safety(n, history)
    assert len(n.leaders()) == 1
    final = {n.committed(i) for i in ids}
    assert len(final) == 1
    # Leader Completeness: nothing ever committed was lost
    assert final.pop() >= max(acked.values())
