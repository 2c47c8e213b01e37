"""Raft paper §7: log compaction, snapshots sent in bounded chunks, restart from a snapshot."""
import pytest

from tests.raft.netutil import Net
from xraft.node.raft.progress import ProgressState
from xraft.node.raft.rawnode import RawNode
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import (
    ConfState,
    Entry,
    HardState,
    MessageType as MT,
    Snapshot,
    SnapshotMetadata,
    StorageStateError,
)


def lagging_follower_net(**kw):
    n = Net([1, 2, 3], **kw)
    n.elect(1)
    n.isolate(3)
    for k in range(10):
        n.propose(1, b"e%d" % k)
    return n


def spy(n, pred):
    seen = []
    n.filters.append(lambda m: pred(m) and seen.append(m) and False)
    return seen


def test_lagging_follower_catches_up_through_a_snapshot():
    n = lagging_follower_net()
    snap = n.compact(1, b"state-image")
    n.heal()
    n.tick_and_stabilize(3)
    st3 = n.storage[3]
    assert st3.snapshot().metadata == snap.metadata
    assert snap.metadata.conf_state == ConfState(voters=(1, 2, 3))
    assert snap.metadata.term == n.term(1)
    assert st3.snapshot().data == b"state-image"
    assert n.log(3) == n.log(1) and n.committed(3) == n.committed(1)
    n.propose(1, b"after")
    assert n.applied_data(3)[-1] == b"after"
    assert n.nodes[1].raft.trk.progress[3].state == ProgressState.REPLICATE


def test_snapshot_is_sent_in_bounded_chunks_and_installed_once():
    n = lagging_follower_net(max_snapshot_chunk_bytes=100)
    data = bytes(range(256)) * 4  # 1024 bytes -> 11 chunks
    n.compact(1, data)
    n.heal()
    chunks = spy(n, lambda m: m.type == MT.SNAP)
    n.tick_and_stabilize(3)
    assert len(chunks) == 11
    assert all(len(m.snapshot.data) <= 100 for m in chunks)
    assert [m.chunk_offset for m in chunks] == list(range(0, 1024, 100))
    assert n.storage[3].snapshot().data == data
    assert n.applied[3].count(n.applied[3][0]) == 1


def test_out_of_order_chunk_is_rejected_and_transfer_restarted():
    n = lagging_follower_net(max_snapshot_chunk_bytes=100)
    data = b"z" * 550
    n.compact(1, data)
    n.heal()
    dropped_once = []

    def drop_third_chunk_once(m):
        if m.type == MT.SNAP and m.chunk_offset == 200 and not dropped_once:
            dropped_once.append(m)
            return True
        return False

    n.filters.append(drop_third_chunk_once)
    rejections = spy(n, lambda m: m.type == MT.SNAP_STATUS and m.reject)
    n.tick_and_stabilize(6)
    assert dropped_once and len(rejections) == 1  # rejected once per broken transfer
    assert n.storage[3].snapshot().data == data
    assert n.log(3) == n.log(1)


def test_failed_snapshot_report_makes_leader_retry():
    n = lagging_follower_net()
    n.compact(1)
    n.heal()
    n.drop_type(MT.SNAP)
    n.tick_and_stabilize(1)
    pr = n.nodes[1].raft.trk.progress[3]
    assert pr.state == ProgressState.SNAPSHOT
    n.nodes[1].report_snapshot(3, ok=False)
    assert pr.state == ProgressState.PROBE and pr.msg_app_flow_paused
    n.heal()
    n.tick_and_stabilize(3)
    assert n.log(3) == n.log(1)


def test_restart_from_snapshot_and_log():
    n = Net([1, 2, 3])
    n.elect(1)
    for k in range(5):
        n.propose(1, b"r%d" % k)
    n.compact(2)
    n.propose(1, b"tail")
    n.crash(2)
    n.restart(2)
    assert n.nodes[2].raft.raft_log.first_index() == n.storage[2].snapshot().metadata.index + 1
    n.stabilize()
    assert n.applied_data(2) == [b"tail"]  # only entries after the snapshot are re-applied
    n.tick_and_stabilize(3)
    n.propose(1, b"more")
    assert n.applied_data(2)[-1] == b"more"


def test_restart_rejects_a_gap_between_snapshot_and_log():
    class Gappy(MemoryStorage):
        def first_index(self):
            return super().first_index() + 2

    st = Gappy()
    st.apply_snapshot(Snapshot(SnapshotMetadata(5, 1, ConfState(voters=(1,)))))
    import random
    from xraft.node.raft.config import Config
    with pytest.raises(StorageStateError):
        RawNode(Config(id=1, rng=random.Random(1)), st)


def test_restart_rejects_commit_beyond_log():
    st = MemoryStorage()
    st.apply_snapshot(Snapshot(SnapshotMetadata(1, 1, ConfState(voters=(1,)))))
    st.append([Entry(1, 2)])
    st.set_hard_state(HardState(1, 1, 7))
    import random
    from xraft.node.raft.config import Config
    with pytest.raises(StorageStateError):
        RawNode(Config(id=1, rng=random.Random(1)), st)
