"""Idempotent producers across kill -9 of the leader (Redis 8.6 IDMP, node/engine/idmp.py).

On three real xraft-node processes, per front end:
  1. an XADD with IDMP is sent to the leader and its reply is never read;
  2. once a follower has applied the entry (it is committed), the leader gets SIGKILL;
  3. a new leader is elected; the producer, not knowing the outcome, sends the
     same XADD again (RESP: a new connection; gRPC: a new SDK client, as after a
     producer restart, with the same producer id and idempotent id);
  4. the retry answers the ID of the first XADD, the stream holds exactly one
     entry of that message on every node, XINFO STREAM counts one duplicate,
     and a new message still gets a new entry.
A dedup table on one node only (redis's) would add the message twice in 3.
"""
import signal
import time

import pytest

from tests.cluster import harness as h

pytestmark = pytest.mark.timeout(120)


def _followers_have(cluster, ids, key, n) -> bool:
    for i in ids:
        r = h.rclient(cluster.nodes[i], 1.0)
        try:
            r.execute_command("READONLY")
            if r.xlen(key) < n:
                return False
        except Exception:
            return False
        finally:
            r.close()
    return True


def _kill_leader_after_commit(cluster, leader, key):
    """SIGKILL `leader` once a follower applied key's first entry; the new leader."""
    followers = [i for i in cluster.nodes if i != leader.id]
    h.wait_for(lambda: any(_followers_have(cluster, [i], key, 1) for i in followers), 15,
               "a follower to apply the first XADD")
    leader.signal(signal.SIGKILL)
    t_kill = time.monotonic()
    leader.wait_exit()
    new, _ = h.wait_leader_among(cluster, followers, timeout=20, since=t_kill)
    return new, followers


def _info(r, key) -> dict:
    return r.xinfo_stream(key)


def test_resp_idmp_retry_after_leader_kill_adds_once(cluster_factory):
    cluster = cluster_factory(3, cluster_id="idmp-resp")
    cluster.start()
    leader = cluster.wait_leader()
    conn = h.RawConn(leader)
    conn.send("XADD", "orders", "IDMP", "producer-1", "order-42", "*", "amount", "100")
    try:
        new, followers = _kill_leader_after_commit(cluster, leader, "orders")
    finally:
        conn.close()                  # the reply is never read: the outcome is unknown to the producer

    with h.rclient(new, 5.0) as r:
        again = r.execute_command("XADD", "orders", "IDMP", "producer-1", "order-42", "*", "amount", "100")
        assert r.xrange("orders") == [(again, {"amount": "100"})]
        assert r.execute_command("XADD", "orders", "IDMP", "producer-1", "order-42", "*", "amount", "1") == again
        other = r.execute_command("XADD", "orders", "IDMP", "producer-1", "order-43", "*", "amount", "7")
        assert other != again and r.xlen("orders") == 2
        info = _info(r, "orders")
        assert (info["iids-added"], info["iids-duplicates"], info["pids-tracked"]) == (2, 2, 1)
    h.wait_caught_up(cluster, followers)
    h.assert_identical(cluster, followers, ["orders"])

    # The killed node restarts from its disk with the same table.
    cluster.start([leader.id])
    h.wait_caught_up(cluster, list(cluster.nodes))
    h.assert_identical(cluster, list(cluster.nodes), ["orders"])


def test_grpc_idmp_retry_after_leader_kill_adds_once(cluster_factory):
    import grpc

    from xraft.client.sync import Client
    from xraft.proto.v1 import client_pb2 as pb
    from xraft.proto.v1 import client_pb2_grpc as pb_grpc

    cluster = cluster_factory(3, cluster_id="idmp-grpc")
    cluster.start()
    leader = cluster.wait_leader()
    seeds = [n.grpc for n in cluster.nodes.values()]
    # The first attempt: a bare gRPC call whose answer nobody waits for.
    channel = grpc.insecure_channel(leader.grpc)
    req = pb.XAddRequest(key=b"events", producer_id=b"spark-sink-7")
    req.entries.add(fields=[pb.Field(name=b"n", value=b"1")], idempotent_id=b"batch-9:0")
    req.entries.add(fields=[pb.Field(name=b"n", value=b"2")], idempotent_id=b"batch-9:1")
    pending = pb_grpc.XRaftStub(channel).XAdd.future(req, timeout=30)
    try:
        new, followers = _kill_leader_after_commit(cluster, leader, "events")
    finally:
        pending.cancel()
        channel.close()

    # The producer restarts: a new client, the same producer id, the same message ids.
    with Client(seeds, producer_id="spark-sink-7", timeout=30) as c:
        again = c.xadd_batch("events", [{"n": "1"}, {"n": "2"}], idempotent_ids=["batch-9:0", "batch-9:1"],
                             raise_errors=True)
        assert [e.id for e in c.xrange("events")] == again
        assert len(again) == 2
        # An SDK producer's own messages get fresh ids: a new entry each.
        more = c.xadd("events", {"n": "3"})
        assert more not in again and c.xlen("events") == 3
    with h.rclient(new, 5.0) as r:
        info = _info(r, "events")
        assert (info["iids-added"], info["iids-duplicates"]) == (3, 2)
    h.wait_caught_up(cluster, followers)
    h.assert_identical(cluster, followers, ["events"])
