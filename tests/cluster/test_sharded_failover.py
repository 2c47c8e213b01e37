"""kill -9 in a sharded cluster (3 nodes, --groups 6) under writes to every group, then a
restart from disk.

A producer writes through redis-py RedisCluster to one stream per group, each entry with a
unique uid. Node 1 (the leader of groups 1 and 4) is killed with SIGKILL mid-stream: every
group elects a leader among the survivors, writes to every group go on, and no
acknowledged entry is lost (RedisCluster re-sends a write after a connection error, so an
entry may appear twice: duplicates are allowed here, losses are not). Node 1 restarts from
its data dir: it keeps the same slot map, catches up, and takes its two groups back.
"""
import threading
import time

import redis
from redis.cluster import RedisCluster

from tests.cluster.conftest import wait_until
from tests.cluster.test_sharded_cluster import GROUPS, key_of_group, layout, start_sharded, wait_spread
from tests.cluster.harness import raft_info

WRITE_BUDGET_S = 20.0          # how long one write may keep failing over before it counts as failed


class ClusterProducer(threading.Thread):
    def __init__(self, cluster, keys):
        super().__init__(daemon=True)
        seed = next(n for n in cluster.nodes.values() if n.running())
        host, port = seed.resp.rsplit(":", 1)
        self.rc = RedisCluster(host=host, port=int(port), socket_timeout=3, socket_connect_timeout=1,
                               decode_responses=True)
        self.keys = keys
        self.acked = {k: [] for k in keys}          # uids whose XADD returned an ID
        self.failed = 0
        self.stop = threading.Event()
        self.error = None

    def write(self, key, uid) -> bool:
        deadline = time.monotonic() + WRITE_BUDGET_S
        while time.monotonic() < deadline:
            try:
                self.rc.xadd(key, {"uid": uid})
                return True
            except (redis.RedisError, OSError):
                time.sleep(0.1)                      # the cluster is electing; RedisCluster refreshes
        return False

    def run(self):
        try:
            i = 0
            while not self.stop.is_set():
                for k in self.keys:
                    uid = "%s-%d" % (k, i)
                    if self.write(k, uid):
                        self.acked[k].append(uid)
                    else:
                        self.failed += 1
                i += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.rc.close()

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())


def every_group_led_among(cluster, ids, groups: int = GROUPS) -> dict:
    """{group: leader} when every group has a writable leader among `ids` that all of them name."""
    infos = {i: raft_info(cluster.nodes[i]) for i in ids}
    if not all(infos.values()):
        return {}
    out = {}
    for g in range(1, groups + 1):
        lines = {i: inf.get("raft_group%d" % g) for i, inf in infos.items()}
        leaders = {i for i, ln in lines.items() if ln and ln.get("role") == "leader" and ln.get("writable") == 1}
        named = {ln.get("leader_id") for ln in lines.values() if ln}
        if len(leaders) != 1 or named != leaders:
            return {}
        out[g] = leaders.pop()
    return out


def test_kill_9_of_a_node_loses_no_acked_write_and_a_restart_keeps_the_layout(cluster_factory):
    c = start_sharded(cluster_factory)
    wait_spread(c)
    map_before = open("%s/slot-map.json" % c.nodes[1].data_dir, "rb").read()
    keys = [key_of_group(g, "fo") for g in range(1, GROUPS + 1)]
    p = ClusterProducer(c, keys)
    p.start()
    try:
        wait_until(lambda: p.count() >= 60, 30, "writes to every group before the kill")
        c.nodes[1].signal(9)
        c.nodes[1].wait_exit()
        before_kill = p.count()
        leaders = wait_until(lambda: every_group_led_among(c, [2, 3]), 30, "a leader for every group")
        assert set(leaders.values()) <= {2, 3}
        # Writes to every group go on after the kill.
        wait_until(lambda: all(len(v) >= before_kill // GROUPS + 10 for v in p.acked.values()), 60,
                   "writes to every group after the kill")
    finally:
        p.stop.set()
        p.join(WRITE_BUDGET_S * GROUPS + 10)
    assert p.error is None and not p.is_alive()
    assert p.failed == 0

    def check_all(seed):
        host, port = seed.resp.rsplit(":", 1)
        rc = RedisCluster(host=host, port=int(port), socket_timeout=5, decode_responses=True)
        try:
            for k in keys:
                stored = [e[1]["uid"] for e in rc.xrange(k)]
                missing = set(p.acked[k]) - set(stored)
                assert not missing, (k, sorted(missing)[:5])
                # Order kept: the stream holds the acked uids in the order they were acked.
                firsts = [u for i, u in enumerate(stored) if u not in stored[:i]]
                assert [u for u in firsts if u in set(p.acked[k])] == p.acked[k]
        finally:
            rc.close()
    check_all(c.nodes[2])

    # Restart from disk: the same map, the node catches up and leads its groups again.
    c.nodes[1].start()
    c.nodes[1].wait_ready()
    assert open("%s/slot-map.json" % c.nodes[1].data_dir, "rb").read() == map_before
    assert [(g.id, [(r.first, r.last) for r in g.slots]) for g in layout(c.nodes[1]).groups] == \
        [(g.id, [(r.first, r.last) for r in g.slots]) for g in layout(c.nodes[2]).groups]
    wait_spread(c, timeout=60)
    check_all(c.nodes[1])
