"""kill -9 a random node again and again in a SHARDED cluster under writes to every group; every
node must always restart and no acknowledged write may be lost (soak only: -m soak).

test_crash_loop.py's loop on 3 real xraft-node processes with --groups 6 (each node hosts all six
groups and leads two), --snapshot-entries 50 and --fsync always, so each group snapshots every few
dozen records on every node and a SIGKILL often lands inside one. Writers, one stream key per
group: a redis-py RedisCluster producer with its retries off (an unknown outcome is recorded, never
re-sent: sharded_util.ClusterProducer) and one SDK producer per stream (request ids: its re-sends
are deduplicated). Loop: SIGKILL a random node, restart it from its data dir at once, wait for its
"ready" line (a node that exits instead fails the test with its log), wait a random few hundred
ms, repeat; two kills in three are aimed at the moment a new snapshot file appears in any group's
snap directory of the victim. At the end: every node running, every group led (a leader every node
names), every node caught up in every group, every acknowledged XADD in its stream exactly once
with its acknowledged ID (harness.check_stream per stream), and every group's replicas identical.

XRAFT_SHARDED_CRASH_LOOP_S seconds (default 90), seed XRAFT_SHARDED_CRASH_LOOP_SEED (random).
"""
import glob
import os
import random
import time

import redis

import pytest

from tests.cluster import harness as h
from tests.cluster.sharded_util import ClusterProducer, wait_groups_caught_up
from tests.cluster.test_crash_loop import SNAPSHOT_ENTRIES, kill_loop
from tests.cluster.test_sharded_cluster import GROUPS, key_of_group
from tests.cluster.test_sharded_failover import every_group_led_among


def sharded_crash_loop(cluster_factory, seconds: float, seed: int, fsync: str = "always") -> dict:
    rng = random.Random(seed)
    cluster = cluster_factory(3, cluster_id="sharded-crash-loop-%d" % seed)
    for n in cluster.nodes.values():
        n.extra_args = ["--groups", str(GROUPS), "--snapshot-entries", str(SNAPSHOT_ENTRIES), "--fsync", fsync]
    cluster.start()
    h.wait_for(lambda: every_group_led_among(cluster, list(cluster.nodes)), 30, "a leader for every group")
    keys = {g: key_of_group(g, "crash") for g in range(1, GROUPS + 1)}
    rc_producer = ClusterProducer(cluster, keys.values())
    sdk_producers = {g: h.SdkProducer(cluster, k, "s%d" % g, interval=0.01) for g, k in keys.items()}
    workers = [rc_producer] + list(sdk_producers.values())
    for w in workers:
        w.start()
    kills, at_new_snapshot, victims = kill_loop(cluster, rng, seconds, workers)
    assert all(n.running() for n in cluster.nodes.values()), cluster.logs()
    leaders = h.wait_for(lambda: every_group_led_among(cluster, list(cluster.nodes)), 60,
                         "a leader for every group after the loop")
    applied = wait_groups_caught_up(cluster, range(1, GROUPS + 1))
    figures = {"seed": seed, "fsync": fsync, "kills": kills, "kills_at_new_snapshot": at_new_snapshot,
               "victims": {i: victims.count(i) for i in sorted(cluster.nodes)}, "acked": 0, "unknown": 0,
               "unknown_applied": 0, "entries": 0, "rc_acked": rc_producer.count(), "rc_retried": rc_producer.retried, "applied": applied}
    for g, key in keys.items():
        entries = _read_at_leader(cluster, g, key, leaders[g])
        got = h.check_stream(entries, [rc_producer.view(key), sdk_producers[g]])
        assert got["acked"] > 0, (g, key, got)
        for f in ("acked", "unknown", "unknown_applied"):
            figures[f] += got[f]
        figures["entries"] += len(entries)
    h.assert_identical(cluster, list(cluster.nodes), list(keys.values()))
    snaps = {i: {g: len(glob.glob(os.path.join(n.data_dir, "group-%d" % g, "snap", "*.snap")))
                 for g in keys} for i, n in cluster.nodes.items()}
    # Every group snapshotted on every node: the kills could land in a snapshot of each.
    assert all(c > 0 for per in snaps.values() for c in per.values()), snaps
    assert kills > 0, figures
    print("\nsharded crash loop: %r" % figures)
    return figures


def _read_at_leader(cluster, group: int, key: str, leader: int) -> list:
    """XRANGE at the group's leader, again at the new one if leadership moved since (-MOVED:
    the elections that follow the last kill can still be settling on a loaded machine)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with h.rclient(cluster.nodes[leader], 10.0) as r:
                return r.xrange(key)
        except redis.exceptions.MovedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            leader = h.wait_for(lambda: every_group_led_among(cluster, list(cluster.nodes)), 60,
                                "a leader for every group")[group]


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_sharded_crash_loop_soak(cluster_factory):
    seconds = float(os.environ.get("XRAFT_SHARDED_CRASH_LOOP_S", "90"))
    seed = int(os.environ.get("XRAFT_SHARDED_CRASH_LOOP_SEED", str(random.SystemRandom().randrange(1 << 30))))
    sharded_crash_loop(cluster_factory, seconds, seed)
