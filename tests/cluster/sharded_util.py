"""Helpers for crash tests of a sharded cluster (many Raft groups per node).

    ClusterProducer            XADD {uid} round-robin over one stream per group through redis-py
                               RedisCluster with its own retries OFF: a write whose outcome is
                               unknown is recorded in `maybe`, never re-sent (RedisCluster's
                               default re-sends after a connection error: a possible duplicate)
    ClusterProducer.view(key)  the .acked / .maybe of one stream, for harness.check_stream
    ClusterConn                harness.LeaderConn's call() over RedisCluster (harness.Consumer's conn)
    wait_settled(cluster)      the layout once every group is led by its preferred node
    group_lines(node)          INFO raft's per-group lines, {group: {...}}, or None
    wait_groups_caught_up(...) every node applied its group leader's commit index, per group
"""
import time
import types

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, ClusterError, RedisClusterException, TryAgainError
from redis.retry import Retry

from tests.cluster.conftest import wait_until
from tests.cluster.harness import FAILOVER_BUDGET_S, RETRY_PREFIXES, Worker, raft_info


def cluster_client(cluster, socket_timeout: float):
    """A RedisCluster (its own retries off) seeded by the first running node that answers, or None."""
    for n in cluster.nodes.values():
        if not n.running():
            continue
        host, port = n.resp.rsplit(":", 1)
        try:
            return RedisCluster(host=host, port=int(port), socket_timeout=socket_timeout, socket_connect_timeout=1,
                                retry=Retry(NoBackoff(), 0), decode_responses=True)
        except (RedisClusterException, redis.RedisError, OSError):
            continue              # this seed is restarting: the next one
    return None


class ClusterProducer(Worker):
    """A write that got a reply meaning "nothing was done" (CLUSTERDOWN, TRYAGAIN, NOTLEADER,
    ...; MOVED is followed inside RedisCluster) is re-sent within FAILOVER_BUDGET_S; one that
    may have been applied (connection lost or timed out after sending, -UNKNOWNOUTCOME, a
    topology refresh failing mid-command) goes to `maybe` and the next write gets a new uid."""

    def __init__(self, cluster, keys, prefix: str = "rc", interval: float = 0.002):
        super().__init__("cluster-producer-" + prefix)
        self.cluster, self.keys, self.prefix, self.interval = cluster, list(keys), prefix, interval
        self.acked = {k: {} for k in self.keys}      # key -> {uid: id}
        self.maybe = {k: set() for k in self.keys}
        self.retried = 0                             # "nothing was done" replies re-sent
        self.rc = None

    def view(self, key):
        return types.SimpleNamespace(acked=self.acked[key], maybe=self.maybe[key])

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def _client(self) -> RedisCluster:
        if self.rc is None:
            self.rc = cluster_client(self.cluster, 3)
        return self.rc

    def _drop(self):
        if self.rc is not None:
            self.rc.close()
        self.rc = None

    def write(self, key, uid) -> None:
        deadline = time.monotonic() + FAILOVER_BUDGET_S
        while True:
            rc = self._client()
            if rc is not None:
                try:
                    self.acked[key][uid] = rc.xadd(key, {"uid": uid})
                    return
                except (TryAgainError, ClusterDownError):
                    self._drop()          # a group without a leader: refresh the slot map
                except redis.ResponseError as e:
                    word = str(e).split(" ", 1)[0]
                    if word not in RETRY_PREFIXES:
                        if word == "UNKNOWNOUTCOME":
                            self.maybe[key].add(uid)
                            return
                        raise
                    self._drop()
                except (redis.RedisError, RedisClusterException, OSError):
                    # Sent (or maybe sent) and no reply: it may have been applied. Not re-sent.
                    self._drop()
                    self.maybe[key].add(uid)
                    return
                self.retried += 1
            if time.monotonic() >= deadline:
                raise AssertionError("%s: %s not written in %.0fs" % (self.name, uid, FAILOVER_BUDGET_S))
            if self.stop.is_set() and rc is None:
                return                    # never sent: nothing uncertain is left
            time.sleep(0.05)

    def work(self):
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                for k in self.keys:
                    self.write(k, "%s-%s-%d" % (self.prefix, k, n))
                self.stop.wait(self.interval)
        finally:
            self._drop()


def group_lines(node):
    """{group: INFO raft's raft_group<g> line as a dict} of a running node, or None."""
    inf = raft_info(node)
    if not inf:
        return None
    return {int(k[len("raft_group"):]): v for k, v in inf.items()
            if k.startswith("raft_group") and k[len("raft_group"):].isdigit()}


def wait_groups_caught_up(cluster, groups, timeout: float = 60.0) -> dict:
    """{group: index} once, in every group, one node is leader and every node has applied its
    commit index (nothing may be writing)."""
    def same():
        lines = {i: group_lines(n) for i, n in cluster.nodes.items()}
        if not all(lines.values()):
            return None
        out = {}
        for g in groups:
            per = [ln[g] for ln in lines.values()]
            leads = [x for x in per if x.get("role") == "leader"]
            if len(leads) != 1 or not all(x.get("applied_index") == leads[0]["commit_index"] for x in per):
                return None
            out[g] = leads[0]["commit_index"]
        return out
    return wait_until(same, timeout, "every node to apply each group's commit index")


class ClusterConn:
    """harness.LeaderConn's call() over redis-py RedisCluster (its own retries off), for
    harness.Consumer on a sharded cluster: "nothing was done" replies (TRYAGAIN of a moving
    slot, CLUSTERDOWN, NOTLEADER, ...) are re-sent within FAILOVER_BUDGET_S; a write whose
    reply was lost raises harness.Unknown."""

    def __init__(self, cluster, name: str):
        self.cluster, self.name = cluster, name
        self.rc = None
        self.retried = 0

    def _client(self):
        if self.rc is None:
            self.rc = cluster_client(self.cluster, 5)
        return self.rc

    def close(self):
        if self.rc is not None:
            self.rc.close()
        self.rc = None

    def call(self, method: str, *args, write: bool = False, **kw):
        from tests.cluster.harness import NoLeader, Unknown
        deadline = time.monotonic() + FAILOVER_BUDGET_S
        while True:
            rc = self._client()
            if rc is not None:
                try:
                    return getattr(rc, method)(*args, **kw)
                except (TryAgainError, ClusterDownError, ClusterError):
                    self.close()          # ClusterError: "TTL exhausted", only after redirects
                except redis.ResponseError as e:
                    word = str(e).split(" ", 1)[0]
                    if word == "UNKNOWNOUTCOME":
                        self.close()
                        raise Unknown("%s: %s" % (method, e)) from e
                    if word not in RETRY_PREFIXES:
                        raise
                    self.close()
                except (redis.RedisError, RedisClusterException, OSError) as e:
                    self.close()
                    if write:
                        raise Unknown("%s: %r" % (method, e)) from e
                self.retried += 1
            if time.monotonic() >= deadline:
                raise NoLeader("%s: no answer for %.0fs" % (self.name, FAILOVER_BUDGET_S))
            time.sleep(0.05)


def wait_settled(cluster, timeout: float = 60.0):
    """The layout once every group is led by its preferred node: the leader balancers' first
    hand-overs are over (a write during one is refused UNAVAILABLE)."""
    from xraft.client import errors, sync

    def settled():
        try:
            layout = c.cluster_layout()
        except errors.XRaftError:
            return None
        return layout if all(g.leader and g.leader == g.preferred_leader for g in layout.groups) else None
    with sync.Client([n.grpc for n in cluster.nodes.values()], timeout=20) as c:
        return wait_until(settled, timeout, "every group led by its preferred node")
