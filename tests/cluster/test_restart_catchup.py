"""Durability across restarts, and a follower brought back by snapshot.

1. Stop all three nodes (SIGTERM), start them again from their data dirs: every
   stream, group, PEL, consumer and list reads back identical on every node, and
   stream IDs keep increasing. Nodes run with a small --snapshot-entries, so
   recovery goes through a snapshot file plus the WAL tail, not the WAL alone.
2. A follower stopped while far more entries than the leader keeps behind its
   snapshot are written (snapshot_keep_entries is 1000: more than 1100 records
   here) can only catch up by a snapshot install (INFO raft_snapshots_installed;
   the node logs nothing about it at the default level), and ends identical.
"""
import signal
import time

import pytest

from tests.cluster import harness as h
from tests.cluster.conftest import wait_until

pytestmark = pytest.mark.timeout(150)

KEEP_ENTRIES = 1000           # raft_driver.GroupOptions.snapshot_keep_entries (no CLI flag)


def _snapshotting_cluster(cluster_factory, cluster_id, every):
    c = cluster_factory(3, cluster_id=cluster_id)
    for n in c.nodes.values():
        n.extra_args = ["--snapshot-entries", str(every)]
    c.start()
    c.wait_leader()
    return c


def _fill(r, n_records):
    """n_records separate log records: one write per round trip (concurrent writes
    would be group-committed into fewer records)."""
    for i in range(n_records):
        if i % 10 == 9:
            # Group traffic too, so the snapshot carries groups, PEL and consumers.
            got = r.xreadgroup(h.GROUP, "c%d" % (i % 3), {"s1": ">"}, count=3)
            ids = h._ids(got)
            if ids and i % 20 == 19:
                r.xack("s1", h.GROUP, ids[0])
        else:
            r.xadd("s1" if i % 2 else "s2", {"uid": "w-%d" % i}, maxlen=None if i % 2 else 100,
                   approximate=False)


def _full_state(node, keys):
    state = h.node_state(node, keys)
    with h.rclient(node) as r:
        r.execute_command("READONLY")
        state["list"] = r.lrange("l", 0, -1)
        state["pel"] = [(p["message_id"], p["consumer"], p["times_delivered"])
                        for p in r.xpending_range("s1", h.GROUP, "-", "+", 100_000)]
    return state


def test_stop_all_and_restart_from_disk_reads_everything_back(cluster_factory):
    cluster = _snapshotting_cluster(cluster_factory, "restart-all", 50)
    leader = cluster.wait_leader()
    with h.rclient(leader, 5.0) as r:
        r.xgroup_create("s1", h.GROUP, id="0", mkstream=True)
        r.xgroup_create("s2", "other", id="$", mkstream=True)
        _fill(r, 300)
        r.xdel("s1", r.xrange("s1", count=3)[2][0])       # a deleted entry (and a PEL hole maybe)
        r.rpush("l", "a", "b", "c")
        r.xgroup_createconsumer("s1", h.GROUP, "idle-one")
        last = r.xrange("s1", "-", "+")[-1][0]
    keys = ["s1", "s2"]
    h.wait_caught_up(cluster, list(cluster.nodes))
    before = _full_state(leader, keys)
    assert len(before["pel"]) > 0 and len(before["s2"]["range"]) == 100   # MAXLEN 100 trimmed s2
    infos = cluster.infos()
    assert all(inf["raft_snapshot_index"] > 0 for inf in infos.values()), infos

    t0 = time.monotonic()
    codes = cluster.stop()
    stop_s = time.monotonic() - t0
    assert codes == {1: 0, 2: 0, 3: 0}, cluster.logs()
    t0 = time.monotonic()
    cluster.start()
    leader = cluster.wait_leader()
    up_s = time.monotonic() - t0
    h.wait_caught_up(cluster, list(cluster.nodes))
    print("\nrestart: stopped in %.2fs, back with leader %d in %.2fs" % (stop_s, leader.id, up_s))
    for n in cluster.nodes.values():
        assert _full_state(n, keys) == before, "node %d differs after the restart" % n.id
    with h.rclient(leader) as r:
        assert h.sid(r.xadd("s1", {"uid": "later"})) > h.sid(last)


def test_follower_far_behind_catches_up_by_snapshot(cluster_factory):
    cluster = _snapshotting_cluster(cluster_factory, "catchup", 100)
    leader = cluster.wait_leader()
    with h.rclient(leader, 5.0) as r:
        r.xgroup_create("s1", h.GROUP, id="0", mkstream=True)
        _fill(r, 50)
    lag = cluster.followers(leader)[0]
    h.wait_caught_up(cluster, list(cluster.nodes))
    lag_last = h.raft_info(lag)["raft_last_index"]
    assert cluster.stop([lag.id]) == {lag.id: 0}

    t0 = time.monotonic()
    with h.rclient(leader, 5.0) as r:
        _fill(r, KEEP_ENTRIES + 300)
    # The leader's log now starts past everything the follower has: only a snapshot helps.
    # (Its images are made by forked children while it goes on: the last may still be on its way.)
    inf = wait_until(lambda: (lambda i: i if i["raft_snapshot_index"] - KEEP_ENTRIES > lag_last + 1 else None)(
        h.raft_info(leader)), 30, "the leader's snapshot past the stopped follower's log")
    print("\ncatch-up: %d records in %.2fs; leader snapshot index %d, follower stopped at %d" % (
        KEEP_ENTRIES + 300, time.monotonic() - t0, inf["raft_snapshot_index"], lag_last))
    # Made by children (node_main turns grpc's fork handlers off: with them on, children abort).
    assert inf["raft_snapshots_in_child"] >= 1 and inf["raft_snapshot_child_failures"] == 0, inf

    t0 = time.monotonic()
    lag.start()
    lag.wait_ready()
    index = h.wait_caught_up(cluster, list(cluster.nodes), timeout=30)
    inf = h.raft_info(lag)
    print("catch-up: node %d at index %d in %.2fs, snapshots installed %d" % (
        lag.id, index, time.monotonic() - t0, inf["raft_snapshots_installed"]))
    assert inf["raft_snapshots_installed"] >= 1
    keys = ["s1", "s2"]
    want = _full_state(leader, keys)
    for n in cluster.nodes.values():
        assert _full_state(n, keys) == want, "node %d differs" % n.id


def test_kill_9_of_all_three_under_writes_keeps_every_acknowledged_write(cluster_factory):
    """No clean shutdown at all: SIGKILL every node while a producer writes. Every
    acknowledged XADD comes back after the restart (WAL recovery, torn tails
    repaired), the write of unknown outcome at most once."""
    cluster = _snapshotting_cluster(cluster_factory, "kill-all", 50)
    producer = h.Producer(cluster, "k", "k", interval=0.002)
    producer.start()
    try:
        h.wait_for(lambda: producer.error or len(producer.acked) >= 200, 20, "writes before the crash")
        for n in cluster.nodes.values():
            n.signal(signal.SIGKILL)
        for n in cluster.nodes.values():
            n.wait_exit()
    finally:
        producer.stop.set()
        producer.join(h.FAILOVER_BUDGET_S + 5)
    # Cut off mid-write: at most its last write is of unknown outcome.
    assert producer.error is None, producer.error
    assert len(producer.maybe) <= 1
    cluster.start()
    leader = cluster.wait_leader()
    with h.rclient(leader, 5.0) as r:
        figures = h.check_stream(r.xrange("k"), [producer])
    print("\nkill-all: %s" % figures)
    h.wait_caught_up(cluster, list(cluster.nodes))
    h.assert_identical(cluster, sorted(cluster.nodes), ["k"])
