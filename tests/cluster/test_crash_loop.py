"""kill -9 a random node again and again under write load; every node must always restart and
no acknowledged write may be lost (ISSUE9 B1).

Three real xraft-node processes with a small --snapshot-entries, so every node writes a local
snapshot every few dozen records and a SIGKILL often lands inside one (the B1 crash: snapshot
file durable, WAL commit index not yet, and the node never started again). Writers: redis-py
producers (no blind retries: an unknown outcome is recorded, never re-sent) and an SDK producer
(request ids: retries are deduplicated). Loop: SIGKILL a random node, restart it from its data
dir at once, wait for its "ready" line (a node that exits instead fails the test with its log),
wait a random few hundred ms, repeat. Two kills in three are aimed at the B1 window: the victim is
killed the moment a new snapshot file appears in its snap directory (polled every 0.5 ms; the
WAL write that follows the rename comes after one or two directory fsyncs), or after the pause
if none appears. At the end: one leader, every node caught up, every
acknowledged XADD in the stream exactly once with its acknowledged ID (harness.check_stream), and
all three replicas identical.

The CI run lasts CI_SECONDS; the soak (-m soak) XRAFT_CRASH_LOOP_S seconds (default 90), with
the nodes' --fsync from XRAFT_CRASH_LOOP_FSYNC (default always; under batch a process crash
must not lose acknowledged writes either: they are written before they are acknowledged).
"""
import glob
import os
import random
import signal
import time

import pytest

from tests.cluster import harness as h

STREAM = "events"
SNAPSHOT_ENTRIES = 50
CI_SECONDS = 20.0
PAUSE_S = (0.2, 0.5)          # between a node's restart ("ready") and the next kill


def crash_loop(cluster_factory, seconds: float, seed: int, fsync: str = "always") -> dict:
    rng = random.Random(seed)
    cluster = cluster_factory(3, cluster_id="crash-loop-%d" % seed)
    for n in cluster.nodes.values():
        n.extra_args = ["--snapshot-entries", str(SNAPSHOT_ENTRIES), "--fsync", fsync]
    cluster.start()
    cluster.wait_leader()
    producers = [h.Producer(cluster, STREAM, "r1", interval=0.002),
                 h.Producer(cluster, STREAM, "r2", interval=0.002),
                 h.SdkProducer(cluster, STREAM, "s", interval=0.002)]
    for p in producers:
        p.start()
    kills, at_new_snapshot, victims = kill_loop(cluster, rng, seconds, producers)
    restarts = kills                   # kill_loop restarts every victim and waits for its "ready"
    assert all(n.running() for n in cluster.nodes.values()), cluster.logs()
    leader = cluster.wait_leader()
    h.wait_caught_up(cluster, list(cluster.nodes), timeout=60)
    with h.rclient(leader, 10.0) as r:
        entries = r.xrange(STREAM)
    figures = h.check_stream(entries, producers)
    h.assert_identical(cluster, list(cluster.nodes), [STREAM])
    infos = cluster.infos()
    figures.update(fsync=fsync, kills=kills, kills_at_new_snapshot=at_new_snapshot, restarts=restarts, entries=len(entries), seed=seed,
                   victims={i: victims.count(i) for i in sorted(cluster.nodes)},
                   snapshot_index={i: inf["raft_snapshot_index"] for i, inf in infos.items()})
    assert figures["acked"] > 0 and kills > 0, figures
    assert all(i > 0 for i in figures["snapshot_index"].values()), figures
    print("\ncrash loop: %r" % figures)
    return figures


def kill_loop(cluster, rng, seconds: float, workers) -> tuple:
    """For `seconds`: SIGKILL a random node (two kills in three the moment a new snapshot file
    appears), restart it from disk, wait for its "ready" line (raises with its log if it exits),
    pause PAUSE_S; then finish the workers. (kills, kills at a new snapshot, victims' ids)."""
    kills = at_new_snapshot = 0
    victims = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            _raise_failed(workers)
            node = cluster.nodes[rng.choice(sorted(cluster.nodes))]
            if kills % 3 and _wait_new_snapshot_file(node, PAUSE_S[1]):
                at_new_snapshot += 1
            node.signal(signal.SIGKILL)
            assert node.wait_exit() == -signal.SIGKILL
            kills += 1
            victims.append(node.id)
            node.start()
            node.wait_ready()
            time.sleep(rng.uniform(*PAUSE_S))
        for w in workers:
            w.finish()
    finally:
        for w in workers:
            w.stop.set()
    return kills, at_new_snapshot, victims


def _snapshot_files(node) -> set:
    return {os.path.basename(p) for p in glob.glob(os.path.join(node.data_dir, "*", "snap", "*.snap"))}


def _wait_new_snapshot_file(node, timeout: float) -> bool:
    """Return as soon as a snapshot file appears (renamed into place) on `node`."""
    before = _snapshot_files(node)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _snapshot_files(node) - before:
            return True
        time.sleep(0.0005)
    return False


def _raise_failed(workers):
    for w in workers:
        if w.error is not None:
            raise AssertionError("%s failed: %r" % (w.name, w.error)) from w.error


@pytest.mark.timeout(180)
def test_crash_loop_short(cluster_factory):
    crash_loop(cluster_factory, CI_SECONDS, seed=int(os.environ.get("XRAFT_CRASH_LOOP_SEED", "1")))


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_crash_loop_soak(cluster_factory):
    seconds = float(os.environ.get("XRAFT_CRASH_LOOP_S", "90"))
    seed = int(os.environ.get("XRAFT_CRASH_LOOP_SEED", str(random.SystemRandom().randrange(1 << 30))))
    crash_loop(cluster_factory, seconds, seed, os.environ.get("XRAFT_CRASH_LOOP_FSYNC", "always"))
