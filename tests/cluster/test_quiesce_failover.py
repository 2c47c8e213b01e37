"""Idle groups quiesce (node/raft/quiesce.py) and still fail over: real processes.

3 nodes with --groups 30 (each node prefers the leadership of 10). Once the leaders are
spread and nothing is written, every node reports all 30 of its data groups asleep
(INFO raft raft_groups_quiesced): no ticks, no per-group heartbeats, only one node-liveness
message per peer per tick (node/runtime/liveness.py). Then node 1 is killed with SIGKILL:
the followers of its 10 groups hear nothing more from its node, wake with their lease
expired, and every group elects a leader among nodes 2 and 3. The wait has a generous
deadline (no timed assertion); the time it took is printed beside the election timeout.
Every group then takes a write through redis-py RedisCluster.
"""
import time

import redis
from redis.cluster import RedisCluster

from xraft.node.engine.slots import key_slot

from tests.cluster.conftest import ELECTION_TICKS, TICK_MS, wait_until
from tests.cluster.harness import raft_info
from tests.cluster.test_sharded_cluster import layout
from tests.cluster.test_sharded_failover import every_group_led_among

GROUPS = 30
ELECTION_S = ELECTION_TICKS * TICK_MS / 1000


def leaders_seen(cluster, ids) -> dict:
    return every_group_led_among(cluster, ids, GROUPS)


def quiesced(cluster, ids) -> dict:
    """{node: data groups asleep}, once every node in `ids` has all GROUPS asleep."""
    got = {}
    for i in ids:
        inf = raft_info(cluster.nodes[i])
        got[i] = inf.get("raft_groups_quiesced") if inf else None
    return got if all(v == GROUPS for v in got.values()) else {}


def key_per_group(node) -> dict:
    """{group: a key whose slot the group owns}, from the ClusterLayout RPC."""
    out = {}
    for g in layout(node).groups:
        lo = g.slots[0].first
        for i in range(200_000):
            k = "q%d" % i
            if key_slot(k.encode()) == lo:
                out[g.id] = k
                break
    return out


def test_killing_the_node_that_leads_quiesced_groups_elects_new_leaders(cluster_factory):
    c = cluster_factory(3)
    for node in c.nodes.values():
        node.extra_args = ["--groups", str(GROUPS)]
    c.start()
    spread = wait_until(lambda: (lambda m: m if m and sorted(m.values()).count(1) == GROUPS // 3 else {})(
        leaders_seen(c, [1, 2, 3])), 120, "every group led, node 1 leading its ten")
    led_by_1 = sorted(g for g, n in spread.items() if n == 1)
    asleep = wait_until(lambda: quiesced(c, [1, 2, 3]), 60, "every data group asleep on every node")
    print(f"\nquiesced before the kill: {asleep}; node 1 leads {led_by_1}")

    t0 = time.monotonic()
    c.nodes[1].signal(9)
    c.nodes[1].wait_exit()
    after = wait_until(lambda: leaders_seen(c, [2, 3]), 60, "a leader among nodes 2, 3 for every group")
    took = time.monotonic() - t0
    print(f"all {GROUPS} groups led again {took:.2f}s after kill -9 of node 1 (its {len(led_by_1)} groups "
          f"re-elected; election timeout {ELECTION_S:.2f}s)")
    assert set(after.values()) <= {2, 3}

    keys = key_per_group(c.nodes[2])
    assert sorted(keys) == list(range(1, GROUPS + 1))
    host, port = c.nodes[2].resp.rsplit(":", 1)
    rc = RedisCluster(host=host, port=int(port), socket_timeout=5, decode_responses=True)
    try:
        for g, k in sorted(keys.items()):
            wait_until(lambda: _xadd(rc, k), 30, f"a write to group {g}")
    finally:
        rc.close()
    # Groups whose replicas on the dead node can no longer acknowledge stay awake (quiescable()
    # needs every member caught up); shown for the record, not asserted.
    time.sleep(1.0)
    infos = {i: raft_info(c.nodes[i]) for i in (2, 3)}
    print("asleep after the writes:", {i: inf.get("raft_groups_quiesced") for i, inf in infos.items()})


def _xadd(rc, key) -> bool:
    try:
        rc.xadd(key, {"k": "v"})
        return True
    except (redis.RedisError, OSError):
        return False
