"""`xraft-node --metrics`: three real nodes, each scraped over HTTP as Prometheus would.

The figures are asserted to move with what the test does (writes, reads over both
APIs, a consumer group, a blocked client, snapshots), never against a clock.
"""
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.conftest import free_ports, wait_until

SNAPSHOT_ENTRIES = 40


@pytest.fixture(scope="module")
def mcluster(cluster_factory):
    c = cluster_factory(3)
    ports = free_ports(3)
    for node, port in zip(c.nodes.values(), ports):
        node.metrics = "127.0.0.1:%d" % port
        node.extra_args = ["--metrics", node.metrics, "--snapshot-entries", str(SNAPSHOT_ENTRIES)]
    c.start()
    c.wait_leader()
    return c


def scrape(node) -> dict:
    """{(name, frozenset(labels.items())): value} of one node's /metrics."""
    with urllib.request.urlopen("http://%s/metrics" % node.metrics, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def names(samples: dict) -> set:
    return {name for name, _ in samples}


def test_every_node_serves_the_metric_families(mcluster):
    leader = mcluster.wait_leader()
    for node in mcluster.nodes.values():
        s = scrape(node)
        for family in ("xraft_raft_term", "xraft_raft_role", "xraft_raft_leader_id", "xraft_raft_commit_index",
                       "xraft_raft_applied_index", "xraft_raft_last_index", "xraft_raft_snapshot_index",
                       "xraft_raft_inflight_proposals", "xraft_raft_proposals_total",
                       "xraft_raft_snapshots_total", "xraft_raft_snapshot_last_bytes",
                       "xraft_wal_fsync_seconds_bucket", "xraft_wal_fsync_seconds_count",
                       "xraft_blocked_clients", "xraft_stream_scan_truncated",
                       "process_resident_memory_bytes"):
            assert family in names(s), (node.id, family)
        role = "leader" if node.id == leader.id else "follower"
        assert value(s, "xraft_raft_role", group="1", role=role) == 1
        assert value(s, "xraft_raft_leader_id", group="1") == leader.id
        assert value(s, "xraft_raft_term", group="1") >= 1
    lead = scrape(leader)
    peers = {dict(labels)["peer"] for name, labels in lead if name == "xraft_raft_follower_lag_entries"}
    assert peers == {str(n) for n in mcluster.nodes if n != leader.id}


def test_raft_and_request_figures_move_with_writes(mcluster):
    leader = mcluster.wait_leader()
    before = scrape(leader)
    n = SNAPSHOT_ENTRIES + 10                   # enough entries for a snapshot on every replica
    with leader.client() as r:
        for i in range(n):
            r.xadd("metrics-s", {"i": i})
        assert r.xlen("metrics-s") == n
    after = scrape(leader)
    assert value(after, "xraft_raft_applied_index", group="1") >= value(before, "xraft_raft_applied_index",
                                                                          group="1") + n
    assert value(after, "xraft_raft_commit_index", group="1") >= value(after, "xraft_raft_applied_index", group="1")
    assert (value(after, "xraft_request_duration_seconds_count", api="resp", command="xadd")
            - value(before, "xraft_request_duration_seconds_count", api="resp", command="xadd")) == n
    assert value(after, "xraft_request_duration_seconds_count", api="resp", command="xlen") >= 1
    assert value(after, "xraft_request_duration_seconds_bucket", api="resp", command="xadd", le="+Inf") == \
        value(after, "xraft_request_duration_seconds_count", api="resp", command="xadd")
    assert value(after, "xraft_raft_proposals_total", group="1", outcome="applied") >= \
        value(before, "xraft_raft_proposals_total", group="1", outcome="applied") + 1
    assert value(after, "xraft_raft_proposed_requests_total", group="1") >= \
        value(before, "xraft_raft_proposed_requests_total", group="1") + n
    # fsync=always (the default): the leader fsynced its WAL for those writes.
    assert value(after, "xraft_wal_fsync_seconds_count") > value(before, "xraft_wal_fsync_seconds_count")
    assert value(after, "xraft_stream_length", group="1", key="metrics-s") == n
    # Snapshots: created on each replica once SNAPSHOT_ENTRIES entries were applied.
    for node in mcluster.nodes.values():
        s = wait_until(lambda: (lambda s: s if value(s, "xraft_raft_snapshots_total", group="1", kind="created") >= 1
                                else None)(scrape(node)), 15, "node %d to snapshot" % node.id)
        assert value(s, "xraft_raft_snapshot_last_bytes", group="1") > 0
        assert value(s, "xraft_raft_snapshot_created_bytes_total", group="1") > 0
    # An unknown command is counted as "other", not under its own name (bounded labels).
    with leader.client() as r:
        with pytest.raises(Exception):
            r.execute_command("NOSUCHCOMMAND-metrics")
    s = scrape(leader)
    assert value(s, "xraft_request_duration_seconds_count", api="resp", command="other") >= 1
    assert not any(dict(lb).get("command", "").startswith("nosuch") for _, lb in s)


def test_grpc_requests_and_consumer_group_pel(mcluster):
    sync = pytest.importorskip("xraft.client.sync")
    leader = mcluster.wait_leader()
    c = sync.Client([leader.grpc])
    try:
        for i in range(5):
            c.xadd("metrics-g", {"i": str(i)})
    finally:
        c.close()
    s = scrape(leader)
    assert value(s, "xraft_request_duration_seconds_count", api="grpc", command="XAdd") >= 5   # + any SDK retry
    with leader.client() as r:
        r.xgroup_create("metrics-g", "cg", id="0")
        r.xreadgroup("cg", "alice", {"metrics-g": ">"}, count=3)
        s = scrape(leader)
        assert value(s, "xraft_stream_consumer_groups", group="1", key="metrics-g") == 1
        assert value(s, "xraft_stream_pel_entries", group="1", key="metrics-g", cgroup="cg") == 3
        assert value(s, "xraft_stream_consumers", group="1", key="metrics-g", cgroup="cg") == 1
        ids = [e[0] for e in r.xrange("metrics-g", count=2)]
        r.xack("metrics-g", "cg", *ids)
    s = scrape(leader)
    assert value(s, "xraft_stream_pel_entries", group="1", key="metrics-g", cgroup="cg") == 1
    # Streams are reported by the group's leader only: a cluster-wide sum counts each once.
    for node in mcluster.followers(leader):
        assert ("xraft_stream_length", frozenset({"group": "1", "key": "metrics-g"}.items())) not in scrape(node)


def test_blocked_clients_gauge_counts_a_waiting_blpop(mcluster):
    leader = mcluster.wait_leader()
    assert value(scrape(leader), "xraft_blocked_clients", api="resp") == 0
    result = {}

    def block():
        with leader.client(socket_timeout=30) as r:
            result["popped"] = r.blpop(["metrics-list"], timeout=20)
    t = threading.Thread(target=block)
    t.start()
    try:
        wait_until(lambda: value(scrape(leader), "xraft_blocked_clients", api="resp") == 1, 10,
                   "the BLPOP to show as blocked")
    finally:
        with leader.client() as r:
            r.rpush("metrics-list", "x")
        t.join(30)
    assert result["popped"] == (b"metrics-list", b"x")
    wait_until(lambda: value(scrape(leader), "xraft_blocked_clients", api="resp") == 0, 10, "the gauge to drop")


def test_other_paths_and_methods_are_refused(mcluster):
    node = mcluster.nodes[1]
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen("http://%s/other" % node.metrics, timeout=5)
    assert ei.value.code == 404
    req = urllib.request.Request("http://%s/metrics" % node.metrics, data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=5)
    assert ei.value.code == 405


def test_health_probe_follows_serving_and_a_lost_quorum(mcluster, capsys):
    """xraft-health (the containers' health check): 0 while the node serves, 1 once it
    has no leader (two of three nodes stopped) or does not answer at all."""
    from xraft.ops import health_probe
    mcluster.wait_leader()
    for node in mcluster.nodes.values():
        assert health_probe.main([node.grpc]) == 0
    (dead,) = free_ports(1)
    assert health_probe.main(["127.0.0.1:%d" % dead, "--timeout", "1"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
    survivor = mcluster.nodes[1]
    mcluster.stop(ids=[2, 3])
    wait_until(lambda: health_probe.main([survivor.grpc]) == 1, 30, "node 1 to report NOT_SERVING")
    assert "NOT_SERVING" in capsys.readouterr().err
