"""ACKED retention (XCFGSET key RETENTION ACKED, node/engine/refs.py) across kill -9 of the leader.

On three real xraft-node processes: a stream with a fast and a slow consumer group,
retention on. The fast group acknowledges everything; the slow one holds some
entries pending and has not read the tail. An XACK of the slow group is sent to the
leader and, once a follower applied it, the leader gets SIGKILL (the reply is never
read). On the new leader, and on every replica:
  - every entry some group still needs (pending anywhere, or not yet delivered to
    the slow group) is in the stream, with its fields;
  - the acknowledged head is gone: the stream starts at the first needed entry;
  - the XACK's retry is harmless, and acknowledging the rest empties the stream;
  - the killed node restarts with the same stream.
"""
import signal
import time

import pytest

from tests.cluster import harness as h

pytestmark = pytest.mark.timeout(120)

KEY = "jobs"
N = 120


def _ids(reply):
    return [e[0] for e in reply[0][1]] if reply else []


def _needed(r) -> set:
    """IDs some group still needs: pending in any group, or past a group's last-delivered-id."""
    out = set()
    for group in r.xinfo_groups(KEY):
        out |= {p["message_id"] for p in r.xpending_range(KEY, group["name"], "-", "+", 10_000)}
        out |= {sid for sid, _ in r.xrange(KEY, "(" + group["last-delivered-id"], "+")}
    return out


def _check(r, all_ids):
    present = [sid for sid, fields in r.xrange(KEY)]
    needed = _needed(r)
    assert needed <= set(present), "retention dropped needed entries: %s" % sorted(needed - set(present))
    first_needed = min(needed, key=h.sid) if needed else None
    assert present[:1] == ([first_needed] if first_needed else []), (present[:3], first_needed)
    assert set(present) <= set(all_ids)
    return present


def test_retention_never_drops_an_unacknowledged_entry_across_leader_kill(cluster_factory):
    cluster = cluster_factory(3, cluster_id="retention")
    cluster.start()
    leader = cluster.wait_leader()
    with h.rclient(leader, 5.0) as r:
        all_ids = [r.xadd(KEY, {"n": str(i)}) for i in range(N)]
        r.xgroup_create(KEY, "fast", id="0")
        r.xgroup_create(KEY, "slow", id="0")
        assert r.execute_command("XCFGSET", KEY, "RETENTION", "ACKED") == "OK"
        fast = _ids(r.xreadgroup("fast", "f1", {KEY: ">"}, count=N))
        assert r.xack(KEY, "fast", *fast) == N
        assert r.xlen(KEY) == N                        # the slow group has read nothing
        slow = _ids(r.xreadgroup("slow", "s1", {KEY: ">"}, count=90))
        held = {slow[10], slow[40]}                    # s1 keeps these two pending for now
        r.xack(KEY, "slow", *[sid for sid in slow[:60] if sid not in held])
        assert _check(r, all_ids)[0] == slow[10]

    # The slow group acknowledges slow[10]: the head up to slow[40] may go. Send it and
    # kill the leader once a follower applied it, before the reply is read.
    conn = h.RawConn(leader)
    conn.send("XACK", KEY, "slow", slow[10])
    followers = [i for i in cluster.nodes if i != leader.id]

    def applied():
        for i in followers:
            f = h.rclient(cluster.nodes[i], 1.0)
            try:
                f.execute_command("READONLY")
                if f.xrange(KEY, count=1)[0][0] == slow[40]:
                    return True
            except Exception:
                pass
            finally:
                f.close()
        return False
    try:
        h.wait_for(applied, 15, "a follower to apply the XACK and its retention")
        leader.signal(signal.SIGKILL)
        t_kill = time.monotonic()
        leader.wait_exit()
    finally:
        conn.close()
    new, _ = h.wait_leader_among(cluster, followers, timeout=20, since=t_kill)

    with h.rclient(new, 5.0) as r:
        assert r.xack(KEY, "slow", slow[10]) == 0       # the retry: already acknowledged
        assert _check(r, all_ids)[0] == slow[40]
        r.xack(KEY, "slow", *slow[60:])                 # slow[40] still pending: the head stays
        assert _check(r, all_ids)[0] == slow[40]
        r.xack(KEY, "slow", slow[40])
        assert _check(r, all_ids)[0] == all_ids[90]     # not delivered to the slow group yet
        rest = _ids(r.xreadgroup("slow", "s1", {KEY: ">"}, count=N))
        assert rest == all_ids[90:]
        r.xack(KEY, "slow", *rest)
        assert r.xlen(KEY) == 0
    h.wait_caught_up(cluster, followers)
    h.assert_identical(cluster, followers, [KEY])
    cluster.start([leader.id])
    h.wait_caught_up(cluster, list(cluster.nodes))
    h.assert_identical(cluster, list(cluster.nodes), [KEY])
