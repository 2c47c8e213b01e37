"""XREADGROUP BLOCK across a failover: an error, never a silent empty reply.

A client blocked on the leader must learn that the leader is gone, whatever
way it goes, because an empty reply reads as "nothing arrived" and the client
would sit on a node that will never serve it:
  - kill -9: the connection breaks;
  - SIGSTOP past an election timeout, then SIGCONT: the node wakes up as a
    deposed leader, steps down, and the blocked client gets a redirect
    (-MOVED / -NOTLEADER) even though an entry for it arrived meanwhile;
  - SIGTERM: the node shuts down (and hands leadership over): an error or a
    closed connection.
Each time the consumer then recovers the harness way (its own PEL first, ID 0,
since a lost reply may have carried a delivery), blocks again on the new leader
and gets the entries written there; every delivery is in the PEL, owned by it,
delivered once: nothing twice without a claim.

The three tests share one module cluster, each restoring three running nodes.
"""
import signal
import threading
import time

import pytest
import redis

from tests.cluster import harness as h

pytestmark = pytest.mark.timeout(90)

STREAM = "jobs"
ERROR_LIMIT_S = 10.0          # from the leader's fall to the blocked client's error


@pytest.fixture(scope="module")
def group(cluster):
    with h.rclient(cluster.wait_leader()) as r:
        r.xgroup_create(STREAM, h.GROUP, id="$", mkstream=True)
    return {}                    # consumer -> every id it was delivered (across tests)


class Blocked(threading.Thread):
    """One XREADGROUP ... BLOCK 0 on one node, no leader-following: its raw outcome."""

    def __init__(self, node, consumer):
        super().__init__(daemon=True)
        self.client = h.rclient(node, timeout=60)
        self.client.ping()
        self.consumer = consumer
        self.outcome = None
        self.at = None

    def run(self):
        try:
            self.outcome = ("reply", self.client.xreadgroup(h.GROUP, self.consumer, {STREAM: ">"}, block=0))
        except Exception as e:  # noqa: BLE001 - the outcome is what the test inspects
            self.outcome = ("error", e)
        self.at = time.monotonic()
        self.client.close()


def _block_on(node, consumer) -> Blocked:
    before = _blocked_clients(node)
    b = Blocked(node, consumer)
    b.start()
    # Poll the node until it counts the client as blocked: only then is the test's premise true.
    h.wait_for(lambda: _blocked_clients(node) > before, 5, "the client to block on node %d" % node.id)
    return b


def _blocked_clients(node) -> int:
    with h.rclient(node, 1.0) as r:
        return r.info("clients")["blocked_clients"]


def _resume_on_new_leader(cluster, consumer, delivered, n_entries, skip=(), waiting=0):
    """The consumer's recovery: own PEL first, then block on whoever leads; meanwhile
    n_entries are written (`waiting` more are already there). Returns the ids it got."""
    conn = h.LeaderConn(cluster, consumer, timeout=10, skip=skip)
    try:
        hist = h._ids(conn.call("xreadgroup", h.GROUP, consumer, {STREAM: "0"}, write=True))
        # Nothing could have been delivered by the blocked read (every answer was an error).
        assert hist == [], "delivered without a reply: %s" % hist
        want = ["%s-%d" % (consumer, i) for i in range(n_entries)]
        writer = threading.Thread(target=_write_later, args=(cluster, want, skip), daemon=True)
        writer.start()
        got = []
        deadline = time.monotonic() + 15
        while len(got) < n_entries + waiting and time.monotonic() < deadline:
            got += h._ids(conn.call("xreadgroup", h.GROUP, consumer, {STREAM: ">"}, block=2000, write=True))
        writer.join(15)
        assert len(got) == n_entries + waiting, got
        delivered.setdefault(consumer, []).extend(got)
        return got
    finally:
        conn.close()


def _write_later(cluster, uids, skip):
    conn = h.LeaderConn(cluster, "writer", skip=skip)
    try:
        for uid in uids:
            conn.call("xadd", STREAM, {"uid": uid}, write=True)
    finally:
        conn.close()


def _check_pel(cluster, delivered):
    """Every delivery is pending exactly once, with its consumer, delivered once."""
    conn = h.LeaderConn(cluster, "checker")
    try:
        pel = conn.call("xpending_range", STREAM, h.GROUP, "-", "+", 10_000)
    finally:
        conn.close()
    got = sorted((p["message_id"], p["consumer"], p["times_delivered"]) for p in pel)
    want = sorted((i, c, 1) for c, ids in delivered.items() for i in ids)
    assert got == want


def _restore(cluster, node):
    node.start()
    node.wait_ready()
    cluster.wait_leader()


def _assert_error(b: Blocked, t0: float, what: str):
    b.join(ERROR_LIMIT_S)
    assert not b.is_alive(), "the blocked client got nothing %.0fs after %s" % (ERROR_LIMIT_S, what)
    kind, val = b.outcome
    assert kind == "error", "%s: the blocked client got a reply %r, not an error" % (what, val)
    print("\n%s: blocked client got %s: %s after %.2fs" % (what, type(val).__name__, val, b.at - t0))
    return val


def test_kill_9_breaks_the_blocked_client_which_resumes_on_the_new_leader(cluster, group):
    leader = cluster.wait_leader()
    b = _block_on(leader, "ca")
    leader.signal(signal.SIGKILL)
    t0 = time.monotonic()
    err = _assert_error(b, t0, "kill -9")
    assert isinstance(err, redis.ConnectionError)
    leader.wait_exit()
    _resume_on_new_leader(cluster, "ca", group, 5, skip=[leader.id])
    _check_pel(cluster, group)
    _restore(cluster, leader)


def test_deposed_leader_answers_its_blocked_client_with_a_redirect(cluster, group):
    old = cluster.wait_leader()
    others = [i for i in cluster.nodes if i != old.id]
    b = _block_on(old, "cb")
    old.signal(signal.SIGSTOP)
    try:
        new, _ = h.wait_leader_among(cluster, others)
        # An entry for the blocked client arrives while its node is frozen: on waking,
        # the node applies it as a follower and must not serve it (nor stay silent).
        with h.rclient(new) as r:
            r.xadd(STREAM, {"uid": "while-paused"})
    finally:
        old.signal(signal.SIGCONT)
    t0 = time.monotonic()
    err = _assert_error(b, t0, "SIGSTOP/SIGCONT")
    # A redirect: -MOVED to the new leader (redis-py: MovedError("<slot> <addr>")) or
    # -NOTLEADER; or, if it stepped down by CheckQuorum before hearing from the new
    # leader, -CLUSTERDOWN / "NOTLEADER no leader known": the client looks elsewhere.
    if isinstance(err, redis.exceptions.MovedError):
        assert str(err).split()[1] == new.resp, repr(err)
    else:
        assert isinstance(err, redis.exceptions.ClusterDownError) or str(err).startswith("NOTLEADER"), repr(err)
    # The entry written while paused is still undelivered: the consumer gets it first.
    got = _resume_on_new_leader(cluster, "cb", group, 3, skip=[old.id], waiting=1)
    with h.rclient(new) as r:
        assert r.xrange(STREAM, got[0], got[0])[0][1] == {"uid": "while-paused"}
    _check_pel(cluster, group)


def test_sigterm_of_the_leader_errors_the_blocked_client(cluster, group):
    leader = cluster.wait_leader()
    b = _block_on(leader, "cc")
    leader.signal(signal.SIGTERM)
    t0 = time.monotonic()
    err = _assert_error(b, t0, "SIGTERM")
    assert isinstance(err, (redis.ConnectionError, redis.ResponseError)), repr(err)
    assert leader.wait_exit() == 0
    _resume_on_new_leader(cluster, "cc", group, 3, skip=[leader.id])
    _check_pel(cluster, group)
    _restore(cluster, leader)
