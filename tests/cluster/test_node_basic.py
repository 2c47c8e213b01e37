"""Three real xraft-node processes: election, replication, redirects, clients, restart, auth.

Tests share one module-scoped cluster (conftest.cluster) and run in file
order; each still finds the leader itself, since an earlier test may have
moved it.
"""
import os
import signal
import time

import pytest
import redis
from redis.cluster import RedisCluster

from tests.cluster.conftest import wait_until
from xraft.node.server.gc_policy import THRESHOLDS


def test_a_leader_emerges_and_info_raft_reports_it(cluster):
    leader = cluster.wait_leader()
    # Followers learn the commit of the leader's first entry with the next heartbeat.
    infos = wait_until(lambda: (lambda i: i if all(v and v["raft_applied_index"] >= 2 for v in i.values())
                                else None)(cluster.infos()), 5, "every node to apply the leader's entry")
    assert sorted(infos) == [1, 2, 3]
    for nid, info in infos.items():
        assert info["raft_node_id"] == nid
        assert info["raft_leader_id"] == leader.id
        assert info["raft_role"] == ("leader" if nid == leader.id else "follower")
        assert info["raft_term"] >= 1
        assert info["raft_commit_index"] >= info["raft_applied_index"] >= 2   # bootstrap + the leader's entry
    with leader.client() as r:
        assert r.info("replication")["role"] == "master"
        # The node process runs the collector policy (gc_policy.py): its thresholds, its watch.
        gcinfo = r.info("gc")
        assert tuple(gcinfo["gc_gen%d_threshold" % g] for g in range(3)) == THRESHOLDS
        assert gcinfo["gc_enabled"] == 1 and "gc_gen0_threshold" not in r.info()    # not a default section


def test_xadd_on_leader_is_readable_on_every_node(cluster):
    leader = cluster.wait_leader()
    with leader.client() as r:
        ids = [r.xadd("basic", {"n": i}) for i in range(20)]
        assert r.xlen("basic") == 20                      # linearizable read on the leader
        assert [e[0] for e in r.xrange("basic")] == ids
    applied = cluster.infos()[leader.id]["raft_applied_index"]
    for node in cluster.followers(leader):
        # Follower reads (READONLY: stale reads allowed), once it has applied as far.
        wait_until(lambda: node.raft_info()["raft_applied_index"] >= applied, 10,
                   "node %d to apply index %d" % (node.id, applied))
        with node.client() as r:
            r.execute_command("READONLY")
            assert [e[0] for e in r.xrange("basic")] == ids


def test_follower_redirects_with_moved_and_redis_cluster_follows(cluster):
    leader = cluster.wait_leader()
    follower = cluster.followers(leader)[0]
    with follower.client() as r:
        # redis-py turns "-MOVED <slot> <addr>" into MovedError("<slot> <addr>").
        with pytest.raises(redis.exceptions.MovedError) as ei:
            r.xadd("moved", {"a": 1})
        assert str(ei.value) == "%d %s" % (_slot(b"moved"), leader.resp)
        with pytest.raises(redis.exceptions.MovedError):
            r.xlen("moved")                                # a linearizable read redirects too
    host, port = follower.resp.rsplit(":", 1)
    rc = RedisCluster(host=host, port=int(port), socket_timeout=5)
    try:
        first = rc.xadd("moved", {"a": 1})
        rc.xadd("moved", {"a": 2})
        assert rc.xlen("moved") == 2
        assert rc.xrange("moved")[0][0] == first
    finally:
        rc.close()
    for node in cluster.nodes.values():                   # every node describes the same topology
        with node.client() as r:
            slots = r.execute_command("CLUSTER SLOTS")
        assert len(slots) == 1 and slots[0][:2] == [0, 16383]
        addrs = ["%s:%d" % (n[0].decode(), n[1]) for n in slots[0][2:]]
        assert addrs[0] == leader.resp                     # the master first, then the replicas
        assert sorted(addrs[1:]) == sorted(n.resp for n in cluster.followers(leader))


def test_grpc_sdk_writes_and_reads_through_any_node(cluster):
    sync = pytest.importorskip("xraft.client.sync")
    leader = cluster.wait_leader()
    follower = cluster.followers(leader)[0]
    c = sync.Client([follower.grpc])                      # seeds: a follower; the SDK follows NOTLEADER
    try:
        ids = [c.xadd("sdk", {"i": str(i)}) for i in range(5)]
        assert c.xlen("sdk") == 5
        assert [e.id for e in c.xrange("sdk")] == ids
        assert c.leader == leader.grpc
    finally:
        c.close()
    with leader.client() as r:                             # one log: RESP sees the SDK's writes
        assert r.xlen("sdk") == 5


def test_blocked_clients_on_the_leader_wake_on_writes(cluster):
    import threading
    leader = cluster.wait_leader()
    got = {}

    def block(name, fn):
        with leader.client(socket_timeout=10) as r:
            got[name] = fn(r)
    threads = [threading.Thread(target=block, args=("blpop", lambda r: r.blpop("bq", timeout=8))),
               threading.Thread(target=block, args=("xread", lambda r: r.xread({"bs": "$"}, block=8000)))]
    for t in threads:
        t.start()
    with leader.client() as r:
        wait_until(lambda: r.info("clients")["blocked_clients"] == 2, 5, "two blocked clients")
        r.rpush("bq", "x")
        entry = r.xadd("bs", {"k": "v"})
    for t in threads:
        t.join(10)
    assert tuple(got["blpop"]) == (b"bq", b"x")
    assert got["xread"] == [[b"bs", [(entry, {b"k": b"v"})]]]


def test_sigterm_of_the_leader_hands_over_and_redirects_its_blocked_clients(cluster):
    import threading
    leader = cluster.wait_leader()
    got = {}

    def block():
        try:
            with leader.client(socket_timeout=10) as r:
                got["reply"] = r.blpop("never", timeout=8)
        except Exception as exc:  # noqa: BLE001 - the error is what the test looks at
            got["error"] = exc
    t = threading.Thread(target=block)
    t.start()
    with leader.client() as r:
        wait_until(lambda: r.info("clients")["blocked_clients"] == 1, 5, "a blocked client")
    t0 = time.monotonic()
    leader.signal(signal.SIGTERM)
    assert leader.wait_exit() == 0
    stop_s = time.monotonic() - t0
    t.join(10)
    survivors = [n.id for n in cluster.followers(leader)]
    new = cluster.wait_leader(ids=survivors, timeout=5)
    assert isinstance(got.get("error"), redis.exceptions.MovedError), got
    # The old leader named its successor before it exited: leadership was handed over.
    assert str(got["error"]).endswith(new.resp)
    assert stop_s < 5, stop_s
    leader.start()
    leader.wait_ready()
    cluster.wait_leader()


def test_sigkill_of_the_leader_loses_no_acknowledged_write(cluster):
    leader = cluster.wait_leader()
    with leader.client() as r:
        acked = [r.xadd("durable", {"i": i}) for i in range(30)]
    leader.signal(signal.SIGKILL)
    leader.wait_exit()
    survivors = [n.id for n in cluster.followers(leader)]
    new = cluster.wait_leader(ids=survivors)
    assert new.id != leader.id
    with new.client() as r:
        assert [e[0] for e in r.xrange("durable")] == acked
        acked.append(r.xadd("durable", {"i": "after"}))
    leader.start()                                          # recovers from its WAL and catches up
    leader.wait_ready()
    cluster.wait_leader()
    wait_until(lambda: _readonly_ids(leader, "durable") == acked, 10, "the restarted node to catch up")


def test_sigterm_all_then_restart_from_disk_keeps_everything(cluster):
    leader = cluster.wait_leader()
    with leader.client() as r:
        r.xgroup_create("restart", "g", id="0", mkstream=True)
        ids = [r.xadd("restart", {"i": i}) for i in range(10)]
        got = r.xreadgroup("g", "alice", {"restart": ">"}, count=4)
        assert [e[0] for e in got[0][1]] == ids[:4]
        r.xack("restart", "g", ids[0])
        r.rpush("list", "a", "b", "c")
        before = {"basic": r.xlen("basic"), "durable": r.xlen("durable"), "sdk": r.xlen("sdk")}
        pending = r.xpending("restart", "g")
    t0 = time.monotonic()
    codes = cluster.stop()
    assert codes == {1: 0, 2: 0, 3: 0}, cluster.logs()
    assert time.monotonic() - t0 < 10
    cluster.start()
    leader = cluster.wait_leader()
    with leader.client() as r:
        assert [e[0] for e in r.xrange("restart")] == ids
        assert r.xpending("restart", "g") == pending            # the PEL survived: 3 pending for alice
        assert pending["pending"] == 3
        assert [e[0] for e in r.xreadgroup("g", "bob", {"restart": ">"})[0][1]] == ids[4:]
        assert r.lrange("list", 0, -1) == [b"a", b"b", b"c"]
        assert {k: r.xlen(k) for k in before} == before
        later = r.xadd("restart", {"i": "later"})
        assert later > ids[-1]                                 # IDs keep increasing across restarts


def test_node_with_the_wrong_secret_cannot_join(cluster_factory):
    c = cluster_factory(3, cluster_id="secret-test")
    bad = c.nodes[3]
    bad.secret_file = os.path.join(c.root, "wrong-secret")
    with open(bad.secret_file, "w") as f:
        f.write("not-the-cluster-secret-at-all-000\n")
    os.chmod(bad.secret_file, 0o600)
    c.start()
    leader = c.wait_leader(ids=[1, 2])
    with leader.client() as r:
        ids = [r.xadd("s", {"i": i}) for i in range(5)]
    # The intruder stays leaderless for several election timeouts: nobody hears it,
    # it hears nobody; the others keep working.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        info = bad.raft_info()
        assert info is not None and info["raft_role"] != "leader"
        assert info["raft_leader_id"] == 0 and info["raft_applied_index"] <= 1
        for n in (c.nodes[1], c.nodes[2]):
            assert n.raft_info()["raft_leader_id"] == leader.id
        time.sleep(0.1)
    with leader.client() as r:
        assert [e[0] for e in r.xrange("s")] == ids
    # Both good nodes refused the intruder's streams, and it refused theirs.
    for n in (c.nodes[1], c.nodes[2]):
        assert "bad proof from node 3" in n.log_text()
    assert "UNAUTHENTICATED" in bad.log_text()
    codes = c.stop()
    assert codes == {1: 0, 2: 0, 3: 0}


def test_bad_configuration_exits_2_without_touching_the_data_dir(tmp_path):
    import subprocess
    import sys
    data = tmp_path / "d"
    base = [sys.executable, "-m", "xraft.node.server.node_main", "--id", "1", "--cluster-id", "x",
            "--data-dir", str(data), "--grpc", "127.0.0.1:1", "--resp", "127.0.0.1:2",
            "--peers", "1=127.0.0.1:1"]
    env = {k: v for k, v in os.environ.items() if k != "XRAFT_CLUSTER_SECRET"}
    p = subprocess.run(base, env=env, capture_output=True, timeout=30)
    assert p.returncode == 2 and b"secret" in p.stderr
    p = subprocess.run(base[:-1] + ["2=127.0.0.1:1"], env=dict(env, XRAFT_CLUSTER_SECRET="s" * 32),
                       capture_output=True, timeout=30)
    assert p.returncode == 2 and b"--peers must include this node" in p.stderr
    assert not data.exists()


def _readonly_ids(node, key):
    with node.client() as r:
        r.execute_command("READONLY")
        return [e[0] for e in r.xrange(key)]


def _slot(key: bytes) -> int:
    from redis.crc import key_slot
    return key_slot(key)



def test_data_dir_is_locked_and_bound_to_its_cluster_and_node(cluster_factory):
    import subprocess
    import sys
    c = cluster_factory(1, cluster_id="solo")              # a one-voter group elects itself
    c.start()
    node = c.wait_leader()
    with node.client() as r:
        first = r.xadd("solo", {"a": 1})
    argv = node.argv()
    from tests.cluster.conftest import free_ports
    g, p = free_ports(2)

    def other(**swap):
        out = list(argv)
        for flag, value in swap.items():
            out[out.index("--" + flag.replace("_", "-")) + 1] = value
        return subprocess.run(out, capture_output=True, timeout=30)

    # A second process on the same directory would corrupt the WAL: it must not start.
    proc = other(grpc="127.0.0.1:%d" % g, resp="127.0.0.1:%d" % p, peers="1=127.0.0.1:%d" % g)
    assert proc.returncode == 1 and b"in use by another process" in proc.stdout + proc.stderr
    assert c.stop() == {1: 0}
    # The directory belongs to node 1 of "solo": another identity is refused.
    proc = other(id="2", peers="2=%s" % node.grpc, resp_peers="2=%s" % node.resp)
    assert proc.returncode == 1 and b"belongs to" in proc.stdout + proc.stderr
    proc = other(cluster_id="another")
    assert proc.returncode == 1 and b"belongs to" in proc.stdout + proc.stderr
    c.start()
    node = c.wait_leader()
    with node.client() as r:
        assert [e[0] for e in r.xrange("solo")] == [first]
