"""kill -9 of the leader while two producers and a two-consumer group are running.

One scenario, in steps, on three real xraft-node processes:
  1. producer "r" (redis-py, no blind retries) and producer "s" (the gRPC SDK, which
     re-sends with request ids) XADD entries with a unique `uid`; consumers c1 and c2
     XREADGROUP + XACK; everything the clients see is recorded (harness.GroupModel);
  2. c2 dies holding unacknowledged deliveries; the leader gets SIGKILL;
  3. a new leader is elected (bound: ELECTION_LIMIT_S) and takes writes;
  4. with the clients stopped: no acknowledged XADD lost, none duplicated, no entry
     nobody wrote; the group (last-delivered-id, entries-read, PEL owners and counts,
     consumers) equals what the clients observed;
  5. XCLAIM and XAUTOCLAIM move c2's entries to c1 on the new leader;
  6. the killed node restarts from its data dir and holds identical streams
     (XRANGE, XINFO STREAM FULL, XINFO GROUPS) as every other node.
"""
import signal
import time

import pytest

from tests.cluster import harness as h

pytestmark = pytest.mark.timeout(120)

STREAM = "orders"
ELECTION_LIMIT_S = 10.0
WARMUP_ENTRIES = 150         # acknowledged before the kill
AFTER_ENTRIES = 40           # per producer, acknowledged by the new leader


def test_kill_leader_under_load_keeps_writes_and_group_state(cluster_factory):
    cluster = cluster_factory(3, cluster_id="failover")
    cluster.start()
    old = cluster.wait_leader()
    with h.rclient(old) as r:
        r.xgroup_create(STREAM, h.GROUP, id="0", mkstream=True)

    model = h.GroupModel()
    producers = [h.Producer(cluster, STREAM, "r"), h.SdkProducer(cluster, STREAM, "s")]
    c1 = h.Consumer(cluster, STREAM, "c1", model)
    c2 = h.Consumer(cluster, STREAM, "c2", model)
    workers = producers + [c1, c2]
    for w in workers:
        w.start()
    try:
        # 1. Load before the crash: both producers and both consumers active.
        h.wait_for(lambda: _failed(workers) or (sum(len(p.acked) for p in producers) >= WARMUP_ENTRIES
                                                 and c1.acks and c2.acks),
                   20, "traffic before the kill")
        _raise(workers)
        # 2. c2 dies holding deliveries it never acknowledges.
        c2.hold.set()
        c2.finish(stop=False)         # it ends by itself once it holds a delivery
        assert c2.holding, "c2 should hold unacknowledged deliveries"

        # Kill -9 the leader of *now* (it may have moved since the start).
        old = h.wait_leader_among(cluster, list(cluster.nodes))[0]
        survivors = [i for i in cluster.nodes if i != old.id]
        old.signal(signal.SIGKILL)
        t_kill = time.monotonic()
        old.wait_exit()
        new, elected_s = h.wait_leader_among(cluster, survivors, timeout=ELECTION_LIMIT_S + 5, since=t_kill)
        print("\nfailover: node %d killed, node %d leader after %.2fs" % (old.id, new.id, elected_s))
        assert elected_s < ELECTION_LIMIT_S

        # 3. The new leader takes writes from both producers; c1 keeps consuming.
        t_new = time.monotonic()
        h.wait_for(lambda: _failed(workers) or all(p.acked_since(t_new) >= AFTER_ENTRIES for p in producers),
                   20, "writes acknowledged by the new leader")
        _raise(workers)
        acks_then = c1.acks
        h.wait_for(lambda: _failed(workers) or c1.acks > acks_then, 10, "c1 to consume after the failover")
        _raise(workers)
        for w in (*producers, c1):
            w.finish()
        gap = max(_longest_gap(p.ack_times, t_kill) for p in producers)
        stats = {w.name: dict(w.conn.stats) for w in (producers[0], c1, c2)}
        print("failover: longest producer pause %.2fs; client stats %s" % (gap, stats))
    finally:
        for w in workers:             # on failure too: no thread outlives the test for long
            w.stop.set()
        for w in workers:
            w.join(5)

    # 4. The log and the group, read on the new leader (linearizable reads).
    with h.rclient(new, 5.0) as r:
        entries = r.xrange(STREAM)
        figures = h.check_stream(entries, producers)
        group = h.check_group(r, STREAM, model, ["c1", "c2"])
        print("failover: %s, group %s" % (figures, group))
        assert figures["acked"] >= WARMUP_ENTRIES + 2 * AFTER_ENTRIES

        # 5. c2 is gone: c1 takes its entries over on the new leader, first one by
        # XCLAIM (min-idle 100 ms: c2's delivery times, stamped by the dead leader,
        # must read as past on the new one), then the rest by XAUTOCLAIM.
        expected = model.expected()
        c2_ids = sorted((i for i, (owner, _, _) in expected.items() if owner == "c2"), key=h.sid)
        assert c2_ids == sorted(set(c2_ids) & set(c2.holding), key=h.sid) and c2_ids
        claimed = r.xclaim(STREAM, h.GROUP, "c1", 100, [c2_ids[0]])
        assert [e[0] for e in claimed] == [c2_ids[0]]
        model.claimed("c1", [c2_ids[0]])
        nxt, got, deleted = r.xautoclaim(STREAM, h.GROUP, "c1", 100, start_id="0-0", count=10_000)
        got_ids = [e[0] for e in got]
        assert nxt == "0-0" and deleted == []
        # XAUTOCLAIM takes every idle entry, c1's own included (none: c1 acked all).
        assert set(c2_ids[1:]) <= set(got_ids) and set(got_ids) <= set(expected)
        model.claimed("c1", got_ids)
        after = h.check_group(r, STREAM, model, ["c1", "c2"])
        assert after["pending"] == group["pending"]
        assert {c["name"]: c["pending"] for c in r.xinfo_consumers(STREAM, h.GROUP)}["c2"] == 0
        assert r.xack(STREAM, h.GROUP, *got_ids, c2_ids[0]) == len(set(got_ids) | {c2_ids[0]})
        assert r.xpending(STREAM, h.GROUP)["pending"] == 0
        r.xadd(STREAM, {"uid": "marker"})          # a last write the restarted node must get too

    # 6. The killed node restarts from disk and catches up to identical state.
    old.start()
    old.wait_ready()
    t_up = time.monotonic()
    index = h.wait_caught_up(cluster, list(cluster.nodes), timeout=20)
    print("failover: node %d caught up to index %d in %.2fs" % (old.id, index, time.monotonic() - t_up))
    state = h.assert_identical(cluster, sorted(cluster.nodes), [STREAM])
    assert state[STREAM]["range"][-1][1] == {"uid": "marker"}
    assert len(state[STREAM]["range"]) == len(entries) + 1


def _failed(workers) -> bool:
    """A worker died: stop waiting (the wait then raises its error)."""
    return any(w.error is not None for w in workers)


def _raise(workers):
    for w in workers:
        if w.error is not None:
            raise AssertionError("%s failed: %r" % (w.name, w.error)) from w.error


def _longest_gap(times, since) -> float:
    points = [since] + [t for t in times if t >= since]
    return max((b - a for a, b in zip(points, points[1:])), default=0.0)


def test_three_successive_leader_kills_lose_nothing(cluster_factory):
    """Kill -9 whoever leads, restart it, again, three times, under two producers: each
    new leader inherits its predecessors' log, time stamps and the SDK's dedup table."""
    cluster = cluster_factory(3, cluster_id="failover-x3")
    cluster.start()
    cluster.wait_leader()
    producers = [h.Producer(cluster, "x3", "r"), h.SdkProducer(cluster, "x3", "s")]
    for p in producers:
        p.start()
    took = []
    try:
        for _ in range(3):
            t = time.monotonic()
            h.wait_for(lambda: _failed(producers) or all(p.acked_since(t) >= 30 for p in producers),
                       20, "writes before a kill")
            _raise(producers)
            victim = h.wait_leader_among(cluster, list(cluster.nodes))[0]
            victim.signal(signal.SIGKILL)
            t_kill = time.monotonic()
            victim.wait_exit()
            took.append(h.wait_leader_among(cluster, [i for i in cluster.nodes if i != victim.id],
                                            timeout=ELECTION_LIMIT_S + 5, since=t_kill)[1])
            victim.start()                # back before the next kill: a quorum must remain
            victim.wait_ready()
        t = time.monotonic()
        h.wait_for(lambda: _failed(producers) or all(p.acked_since(t) >= 30 for p in producers),
                   20, "writes after the last kill")
        for p in producers:
            p.finish()
    finally:
        for p in producers:
            p.stop.set()
        for p in producers:
            p.join(5)
    print("\nfailover x3: elections took %s" % ["%.2fs" % x for x in took])
    assert max(took) < ELECTION_LIMIT_S
    leader = h.wait_leader_among(cluster, list(cluster.nodes))[0]
    with h.rclient(leader, 5.0) as r:
        print("failover x3: %s" % (h.check_stream(r.xrange("x3"), producers),))
    h.wait_caught_up(cluster, list(cluster.nodes), timeout=20)
    h.assert_identical(cluster, sorted(cluster.nodes), ["x3"])
