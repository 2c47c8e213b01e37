"""The demo's second part: a sharded cluster moves a slot while clients keep going.

1. brings up a local 3-node cluster with 6 data groups (2 led by each node);
2. a producer XADDs readings and a consumer group processes them (XREADGROUP + XACK), both
   through redis-py's RedisCluster, which follows -MOVED and retries -TRYAGAIN itself;
3. `xraftctl slots move` moves the stream's slot to another group (the metadata group's
   leader seals it, copies its keys and consumer group, verifies, decides, activates, releases);
4. the clients carry on against the new owner; then checks: every acknowledged reading is in
   the stream exactly once and was processed, nothing is left pending, the new owner serves it.

Writes the producer could not be sure of (a reply lost) are not re-sent: each reading has a
unique `seq`, and they are counted apart (at most once in the stream).
"""
from __future__ import annotations

import collections
import random
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from xraft.client import errors

from . import local_cluster as lc
from .cluster_status import Connection
from .slots_cli import move, move_text

GROUPS = 6
GROUP = "readers"


def _rc(cluster) -> RedisCluster:
    n = next(n for n in cluster.nodes if n.pid)
    host, port = n.resp.rsplit(":", 1)
    return RedisCluster(host=host, port=int(port), decode_responses=True, socket_timeout=5,
                        retry=Retry(NoBackoff(), 0))


class Producer(threading.Thread):
    def __init__(self, cluster, stream):
        super().__init__(daemon=True)
        self.cluster, self.stream = cluster, stream
        self.stop = threading.Event()
        self.acked, self.unsure, self.longest = {}, set(), 0.0

    def run(self):
        rc, seq = _rc(self.cluster), 0
        try:
            while not self.stop.is_set():
                seq += 1
                t = time.monotonic()
                try:
                    self.acked[seq] = rc.xadd(self.stream, {"seq": seq, "celsius": random.randint(10, 30)})
                except (redis.ConnectionError, redis.TimeoutError):
                    self.unsure.add(seq)              # maybe applied: never re-sent
                except redis.RedisError:
                    seq -= 1                          # refused (nothing done): the same reading again
                    time.sleep(0.05)
                    continue
                self.longest = max(self.longest, time.monotonic() - t)
                self.stop.wait(0.01)
        finally:
            rc.close()


class Consumer(threading.Thread):
    def __init__(self, cluster, stream):
        super().__init__(daemon=True)
        self.cluster, self.stream = cluster, stream
        self.stop = threading.Event()
        self.processed = collections.Counter()

    def run(self):
        rc = _rc(self.cluster)
        try:
            while not self.stop.is_set():
                try:
                    reply = rc.xreadgroup(GROUP, "c1", {self.stream: "0"}, count=100) or [[None, []]]
                    if not reply[0][1]:
                        reply = rc.xreadgroup(GROUP, "c1", {self.stream: ">"}, count=100, block=200)
                    entries = reply[0][1] if reply else []
                    for _eid, fields in entries:
                        self.processed[int(fields["seq"])] += 1
                    if entries:
                        rc.xack(self.stream, GROUP, *[e[0] for e in entries])
                except redis.RedisError:
                    time.sleep(0.05)                  # a moving slot, a redirect: read again
        finally:
            rc.close()


def _wait_every_group_led(conn: Connection, limit: float = 60.0):
    """The layout once every data group has a leader (`local up` waits for one leader only)."""
    deadline = time.monotonic() + limit
    with conn.client() as c:
        while True:
            try:
                layout = c.cluster_layout()
                if all(g.leader for g in layout.groups):
                    return layout
            except errors.XRaftError:
                pass
            if time.monotonic() > deadline:
                raise lc.LocalClusterError(f"not every data group had a leader within {limit:g}s")
            time.sleep(0.1)


def run(dir_: str, say, seconds: float = 2.0) -> list:
    """The scenario; the failed checks (empty: all passed)."""
    failures = []
    say(f"part 2: a sharded cluster ({GROUPS} data groups over 3 nodes) in {dir_}")
    cluster = lc.up(dir_, 3, timeout=60, groups=GROUPS, progress=lambda m: say("  " + m))
    try:
        stream = "{sensors-%06x}readings" % random.randrange(16 ** 6)
        conn = Connection(cluster.nodes[0].grpc, timeout=10)
        layout = _wait_every_group_led(conn)
        rc = _rc(cluster)
        rc.xgroup_create(stream, GROUP, id="$", mkstream=True)
        slot = rc.keyslot(stream)
        rc.close()
        owner = next(g.id for g in layout.groups if any(a <= slot <= b for a, b in g.slots))
        target = next(g.id for g in layout.groups if g.id != owner)
        producer, consumer = Producer(cluster, stream), Consumer(cluster, stream)
        producer.start()
        consumer.start()
        time.sleep(seconds)
        say(f"stream {stream} (slot {slot}, group {owner}): {len(producer.acked)} readings acknowledged; "
            f"moving slot {slot} to group {target} under load (xraftctl slots move)")
        result = move(conn, f"{slot}-{slot}", target, wait_s=120, show_progress=True)
        say(move_text(result))
        if result["result"] != "moved":
            failures.append(f"the slot move ended {result['result']}")
        time.sleep(seconds)
        producer.stop.set()
        producer.join(30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not set(producer.acked) <= set(consumer.processed):
            time.sleep(0.1)
        consumer.stop.set()
        consumer.join(30)
        rc = _rc(cluster)
        try:
            seqs = collections.Counter(int(f["seq"]) for _, f in rc.xrange(stream))
            pending = rc.xpending(stream, GROUP)["pending"]
        finally:
            rc.close()
        acked = set(producer.acked)
        missing = sorted(acked - set(seqs))
        doubled = sorted(s for s, n in seqs.items() if n > 1)
        unprocessed = sorted(acked - set(consumer.processed))
        say(f"check: {len(acked) - len(missing)}/{len(acked)} acknowledged readings in the stream, "
            f"{len(acked) - len(unprocessed)}/{len(acked)} processed, {pending} pending, "
            f"{len(producer.unsure)} of unknown outcome; the longest write took {producer.longest * 1000:.0f} ms")
        for what, bad in (("acknowledged readings missing", missing), ("readings twice in the stream", doubled),
                          ("readings never processed", unprocessed)):
            if bad:
                failures.append(f"{what}: {bad[:10]}")
        if pending:
            failures.append(f"{pending} entries still pending")
        return failures
    finally:
        say("stopping the sharded cluster")
        lc.down(dir_, timeout=10)
