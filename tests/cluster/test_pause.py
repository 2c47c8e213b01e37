"""SIGSTOP the leader past an election timeout, elect another, SIGCONT it: no split brain.

While the old leader is frozen its sockets still accept bytes (the kernel queues
them), so the test queues XADDs and a linearizable XLEN at it with raw sockets
*after* the new leader has acknowledged writes. On SIGCONT the old leader wakes
up believing it leads, with those requests waiting. It must:
  - step down (INFO raft: follower of the new leader), within a bound;
  - never answer OK to a write that is not in the final log; an answer meaning
    "nothing happened" (NOTLEADER, MOVED, UNAVAILABLE, ...) must leave no entry;
    UNKNOWNOUTCOME leaves at most one;
  - never answer the XLEN with a count missing the writes the new leader had
    acknowledged before it was sent (a stale read is split brain too);
and no acknowledged write anywhere is lost; all nodes end identical.
"""
import signal
import time
from types import SimpleNamespace

import pytest

from tests.cluster import harness as h

pytestmark = pytest.mark.timeout(120)

STREAM = "p"
ELECTION_LIMIT_S = 10.0
STEP_DOWN_LIMIT_S = 10.0
NOTHING_HAPPENED = ("NOTLEADER", "MOVED", "UNAVAILABLE", "CLUSTERDOWN", "TIMEOUT", "TRYAGAIN", "LOADING")


def test_paused_leader_steps_down_and_never_splits_the_brain(cluster_factory):
    cluster = cluster_factory(3, cluster_id="pause")
    cluster.start()
    old = cluster.wait_leader()
    others = [i for i in cluster.nodes if i != old.id]
    acked = {}
    with h.rclient(old) as r:
        for i in range(20):
            acked["before-%d" % i] = r.xadd(STREAM, {"uid": "before-%d" % i})

    stale = [h.RawConn(old) for _ in range(3)]         # connected before the pause
    reader = h.RawConn(old)
    try:
        old.signal(signal.SIGSTOP)
        t_stop = time.monotonic()
        try:
            new, elected_s = h.wait_leader_among(cluster, others, timeout=ELECTION_LIMIT_S + 5, since=t_stop)
            print("\npause: node %d stopped, node %d leader after %.2fs" % (old.id, new.id, elected_s))
            assert elected_s < ELECTION_LIMIT_S
            with h.rclient(new) as r:
                for i in range(20):
                    acked["new-%d" % i] = r.xadd(STREAM, {"uid": "new-%d" % i})
            # Queued at the frozen old leader, after the new one acknowledged 40 entries.
            for k, c in enumerate(stale):
                c.send("XADD", STREAM, "*", "uid", "old-%d" % k)
            reader.send("XLEN", STREAM)
        finally:
            old.signal(signal.SIGCONT)
        t_cont = time.monotonic()
        old_replies = {"old-%d" % k: _reply(c) for k, c in enumerate(stale)}
        xlen = _reply(reader)
        print("pause: old leader answered %s; XLEN %s (%.2fs after SIGCONT)" % (
            old_replies, xlen, time.monotonic() - t_cont))
    finally:
        for c in stale + [reader]:
            c.close()

    # It steps down and follows the new leader.
    inf = h.wait_for(lambda: _following(old), STEP_DOWN_LIMIT_S, "node %d to step down" % old.id)
    print("pause: node %d is %s of node %d in term %d, %.2fs after SIGCONT" % (
        old.id, inf["raft_role"], inf["raft_leader_id"], inf["raft_term"], time.monotonic() - t_cont))

    # The cluster goes on (through whoever leads now) and loses nothing.
    conn = h.LeaderConn(cluster, "after")
    try:
        for i in range(10):
            acked["after-%d" % i] = conn.call("xadd", STREAM, {"uid": "after-%d" % i}, write=True)
        entries = conn.call("xrange", STREAM)
    finally:
        conn.close()

    maybe = set()
    for uid, (kind, val) in old_replies.items():
        if kind == "ok":
            acked[uid] = val                  # acknowledged by the old leader: must be in the log
        elif kind == "err" and val.split(" ", 1)[0] in NOTHING_HAPPENED:
            pass                              # "nothing happened": must NOT be in the log
        else:
            maybe.add(uid)                    # unknown outcome or a broken connection
    figures = h.check_stream(entries, [SimpleNamespace(acked=acked, maybe=maybe)])
    print("pause: %s" % (figures,))
    if xlen[0] == "ok":
        # Linearizable: sent after 40 writes were acknowledged, so it counts them all.
        assert xlen[1] >= 40, "stale read from the deposed leader: XLEN %d < 40" % xlen[1]
    h.wait_caught_up(cluster, list(cluster.nodes))
    h.assert_identical(cluster, sorted(cluster.nodes), [STREAM])


def _reply(conn):
    try:
        return conn.reply()
    except OSError as e:
        return ("conn", repr(e))


def _following(node):
    inf = h.raft_info(node)
    if inf and inf["raft_role"] == "follower" and inf["raft_leader_id"] not in (0, node.id):
        return inf
    return None
