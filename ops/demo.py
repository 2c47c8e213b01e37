"""The xraft demo: a leader crash costs no acknowledged write and no consumer-group state.

    python -m xraft.ops.demo [--dir DIR] [--keep]          (what `./dev demo` runs)

1. brings up a local 3-node cluster (xraft.ops.local_cluster: real xraft-node processes);
2. a producer XADDs sensor readings and a consumer group of two consumers
   (XREADGROUP + XACK) processes them, all through redis-py on the leader's RESP port;
3. consumer c2 crashes holding unacknowledged entries, then the leader is killed
   with SIGKILL; a new leader is elected and everyone follows it;
4. c1 takes over c2's pending entries with XAUTOCLAIM; the producer carries on;
5. the killed node restarts from its data directory and catches up;
6. checks: every acknowledged XADD is in the stream and was processed by the
   group, the PEL is empty; duplicates (a write re-sent after its reply was
   lost) are counted and reported. Exit status 0 only if every check passed.
7. part 2 (ops/demo_move.py; --no-slot-move skips it): a sharded cluster (6 groups) moves
   the slot of a stream to another group with `xraftctl slots move` while a producer and a
   consumer group keep going through redis-py RedisCluster.

Following the leader: every client re-resolves the leader on a connection error,
-MOVED, -NOTLEADER or another "nothing happened, try elsewhere" error. A write
whose fate is unknown (the connection broke after sending it, -UNKNOWNOUTCOME)
is never re-sent blindly: each reading carries a unique `seq` field, and the
producer first reads the stream back to see whether it landed.
"""
import argparse
import collections
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Optional

import redis
from redis.exceptions import AskError, ClusterDownError, TryAgainError

from . import demo_move
from . import local_cluster as lc

GROUP = "readers"
SENSORS = ("greenhouse", "cellar", "attic", "garage")
# Replies that mean "nothing was done here; ask the leader" (wire_errors.py's retriable rows).
REDIRECT_PREFIXES = ("NOTLEADER", "UNAVAILABLE", "TIMEOUT", "LOADING", "BUSY")
CLIENT_TIMEOUT = 2.0  # socket timeout; above the consumers' BLOCK so a quiet stream is not an error
FAILOVER_BUDGET = 20.0  # how long a client keeps looking for a leader before giving up
ELECTION_LIMIT = 10.0  # "within a few seconds": slower than this fails the demo


class OutcomeUnknown(Exception):
    """A write was sent, but whether it was applied is unknown (reply lost or -UNKNOWNOUTCOME)."""


class NoLeader(Exception):
    """No leader could be reached within FAILOVER_BUDGET."""


class LeaderConn:
    """One redis-py connection that follows the Raft leader of a local cluster."""

    def __init__(self, cluster: lc.ClusterInfo, name: str, stats: "Stats"):
        self.cluster, self.name, self.stats = cluster, name, stats
        self.client: Optional[redis.Redis] = None
        self.addr: Optional[str] = None
        self.hint: Optional[str] = None  # leader address named by the last MOVED/NOTLEADER

    def close(self):
        if self.client is not None:
            self.client.close()
        self.client = None

    def _leader_addr(self) -> Optional[str]:
        if self.hint:
            hint, self.hint = self.hint, None
            return hint
        leader = lc.find_leader(self.cluster, timeout=0.5)  # re-read `local status`
        return leader["resp"] if leader else None

    def call(self, method: str, *args, write: bool = False, **kwargs):
        """Run redis-py's `method` on the leader. Redirects and refused requests are
        retried; for a write (`write=True`) whose fate is unknown OutcomeUnknown is raised."""
        deadline = time.monotonic() + FAILOVER_BUDGET
        delay = 0.05
        while True:
            if self.client is None:
                addr = self._leader_addr()
                if addr is not None:
                    if addr != self.addr and self.addr is not None:
                        self.stats.bump(f"{self.name}: switched leader")
                    self.addr = addr
                    self.client = lc.resp_client(addr, CLIENT_TIMEOUT, decode_responses=True)
            if self.client is not None:
                try:
                    return getattr(self.client, method)(*args, **kwargs)
                except (redis.ConnectionError, redis.TimeoutError) as e:
                    self.close()
                    # A refused connect sent nothing; a break after connecting may have lost a reply.
                    if write and "Error connecting" not in str(e) and "Connection refused" not in str(e):
                        raise OutcomeUnknown(f"{method}: {e}") from e
                except (AskError, TryAgainError, ClusterDownError) as e:
                    # redis-py strips MOVED/ASK's prefix: str(e) is "<slot> <host:port>".
                    parts = str(e).split()
                    self.hint = parts[1] if isinstance(e, AskError) and len(parts) == 2 else None
                    self.close()
                except redis.ResponseError as e:
                    word, _, rest = str(e).partition(" ")
                    if word == "UNKNOWNOUTCOME":
                        self.close()
                        raise OutcomeUnknown(f"{method}: {e}") from e
                    if word not in REDIRECT_PREFIXES:
                        raise
                    self.hint = rest if word == "NOTLEADER" and ":" in rest else None
                    self.close()
            if time.monotonic() >= deadline:
                raise NoLeader(f"{self.name}: no leader reachable for {FAILOVER_BUDGET:g}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


class Stats:
    """Counters shared by the demo's threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()

    def bump(self, what: str, n: int = 1):
        with self.lock:
            self.counts[what] += n


class Producer(threading.Thread):
    """XADDs one reading every `interval` seconds until stopped; keeps seq -> entry id
    for every acknowledged write, and resolves unknown outcomes by reading back."""

    def __init__(self, cluster, stream, stats, interval=0.01):
        super().__init__(name="producer", daemon=True)
        self.conn = LeaderConn(cluster, "producer", stats)
        self.stream, self.stats, self.interval = stream, stats, interval
        self.stop = threading.Event()
        self.acked = {}  # seq -> id
        self.ack_times = []  # monotonic time of each acknowledgement: shows the failover pause
        self.last_id = "0-0"
        self.error: Optional[BaseException] = None

    def run(self):
        try:
            seq = 0
            while not self.stop.is_set():
                seq += 1
                fields = {"sensor": SENSORS[seq % len(SENSORS)], "celsius": f"{random.uniform(4, 30):.1f}",
                          "seq": seq}
                self._add(seq, fields)
                self.stop.wait(self.interval)
        except BaseException as e:  # reported by the main thread
            self.error = e
        finally:
            self.conn.close()

    def _add(self, seq, fields):
        while True:
            try:
                entry_id = self.conn.call("xadd", self.stream, fields, write=True)
                break
            except OutcomeUnknown:
                self.stats.bump("producer: writes with unknown outcome")
                entry_id = self._find(seq)
                if entry_id is not None:
                    self.stats.bump("producer: ...found applied on read-back")
                    break
                self.stats.bump("producer: ...not applied, sent again")
        with self.stats.lock:
            self.acked[seq] = entry_id
            self.ack_times.append(time.monotonic())
            self.last_id = entry_id

    def _find(self, seq) -> Optional[str]:
        """The id of the entry with this seq written after the last acknowledged one, if any.
        A read on the leader is linearizable: a write it does not show was not committed."""
        start = self.last_id
        while True:
            batch = self.conn.call("xrange", self.stream, min=start, max="+", count=500)
            for entry_id, fields in batch:
                if fields.get("seq") == str(seq):
                    return entry_id
            if len(batch) < 500:
                return None
            start = "(" + batch[-1][0]


class Consumer(threading.Thread):
    """One member of the group: XREADGROUP, process, XACK. After a broken connection it
    first re-reads its own pending entries (ID 0): a delivery whose reply was lost is
    still in its PEL. `crash` makes it read one more batch and vanish without acking."""

    def __init__(self, cluster, stream, name, stats, processed):
        super().__init__(name=name, daemon=True)
        self.conn = LeaderConn(cluster, name, stats)
        self.stream, self.cname, self.stats, self.processed = stream, name, stats, processed
        self.stop = threading.Event()
        self.crash = threading.Event()
        self.crashed_holding = []  # entry ids left pending by the crash
        self.claim = threading.Event()  # take over idle entries of other consumers with XAUTOCLAIM
        self.claimed = 0
        self.error: Optional[BaseException] = None

    def run(self):
        try:
            self._loop()
        except BaseException as e:
            self.error = e
        finally:
            self.conn.close()

    def _loop(self):
        recover = True
        last_claim = 0.0
        while not self.stop.is_set():
            if self.crash.is_set():
                self._crash()
                return
            if self.claim.is_set() and time.monotonic() - last_claim > 0.5:
                last_claim = time.monotonic()
                self._autoclaim()
            try:
                if recover:
                    reply = self.conn.call("xreadgroup", GROUP, self.cname, {self.stream: "0"}, count=100, write=True)
                else:
                    reply = self.conn.call("xreadgroup", GROUP, self.cname, {self.stream: ">"}, count=50,
                                           block=300, write=True)
            except OutcomeUnknown:
                self.stats.bump(f"{self.cname}: reads with unknown outcome (recovered from its PEL)")
                recover = True
                continue
            entries = reply[0][1] if reply else []
            if recover and not entries:
                recover = False  # own PEL drained: back to new entries
            self._process(entries)

    def _process(self, entries):
        if not entries:
            return
        ids = []
        with self.stats.lock:
            for entry_id, fields in entries:
                ids.append(entry_id)
                if fields:  # None for an entry deleted while pending
                    self.processed[int(fields["seq"])].append(self.cname)
        # XACK is idempotent: retried on an unknown outcome.
        while True:
            try:
                self.conn.call("xack", self.stream, GROUP, *ids, write=True)
                return
            except OutcomeUnknown:
                self.stats.bump(f"{self.cname}: XACKs re-sent")

    def _autoclaim(self):
        start = "0-0"
        for _ in range(100):  # bounded: 100 x COUNT 100 entries per claim round
            next_start, entries, _deleted = self.conn.call("xautoclaim", self.stream, GROUP, self.cname,
                                                           min_idle_time=1000, start_id=start, count=100)
            if entries:
                self.claimed += len(entries)
                self.stats.bump(f"{self.cname}: entries claimed with XAUTOCLAIM", len(entries))
                self._process(entries)
            if next_start == "0-0":
                return
            start = next_start

    def _crash(self):
        """Keep taking deliveries for a while without acknowledging them (processing hangs), then vanish."""
        hang_until = time.monotonic() + 0.5
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (time.monotonic() < hang_until or not self.crashed_holding):
            reply = self.conn.call("xreadgroup", GROUP, self.cname, {self.stream: ">"}, count=25, block=100,
                                   write=True)
            self.crashed_holding += [entry_id for entry_id, _ in (reply[0][1] if reply else [])]


def say(t0, msg):
    print(f"[{time.monotonic() - t0:5.1f}s] {msg}", flush=True)


def wait_for_new_leader(cluster, old_id, t0, limit) -> tuple:
    """(new leader row, seconds) once a node other than old_id leads; (None, limit) if none did."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        leader = lc.find_leader(cluster, timeout=0.3)
        if leader is not None and leader["id"] != old_id:
            return leader, time.monotonic() - start
        time.sleep(0.05)
    return None, limit


def run(dir_: str, phase_seconds: float = 3.0, slot_move: bool = True) -> int:
    t0 = time.monotonic()
    failures = []
    say(t0, f"starting a 3-node xraft cluster in {dir_}")
    cluster = lc.up(dir_, 3, timeout=60, progress=lambda m: say(t0, "  " + m))
    try:
        code = _scenario(cluster, dir_, t0, phase_seconds, failures)
    finally:
        say(t0, "stopping the cluster (xraftctl local down)")
        killed = lc.down(dir_, timeout=10, progress=lambda m: say(t0, "  " + m))
        if killed:
            say(t0, f"  node(s) {killed} needed SIGKILL")
    if code != 0 or not slot_move:
        return code
    failures = demo_move.run(os.path.join(dir_, "sharded"), lambda m: say(t0, m), phase_seconds)
    if failures:
        print("== FAILED (part 2, slot move):")
        for f in failures:
            print("   - " + f)
        return 1
    print("== OK (part 2): a slot moved to another group under load, nothing lost, the group carried on")
    return 0


def _scenario(cluster, dir_, t0, phase_seconds, failures) -> int:
    stats = Stats()
    processed = collections.defaultdict(list)  # seq -> consumers that processed it
    stream = f"sensors:{random.randrange(16 ** 6):06x}"
    leader = lc.find_leader(cluster)
    say(t0, f"leader is node {leader['id']} (term {leader['term']}); redis-cli -p {leader['resp'].rsplit(':', 1)[1]}")

    setup = LeaderConn(cluster, "setup", stats)
    try:
        setup.call("xgroup_create", stream, GROUP, id="$", mkstream=True, write=True)
    except redis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise
    say(t0, f"stream {stream}, group {GROUP!r}: producer XADDs readings, consumers c1 and c2 XREADGROUP + XACK")
    producer = Producer(cluster, stream, stats)
    c1 = Consumer(cluster, stream, "c1", stats, processed)
    c2 = Consumer(cluster, stream, "c2", stats, processed)
    threads = [producer, c1, c2]
    for th in threads:
        th.start()
    try:
        time.sleep(phase_seconds)
        before = len(producer.acked)
        say(t0, f"{before} readings acknowledged, {len(processed)} processed by the group")

        c2.crash.set()
        c2.join(10)
        say(t0, f"consumer c2 crashes holding {len(c2.crashed_holding)} unacknowledged entries")
        if not c2.crashed_holding:
            failures.append("c2 read nothing before crashing")

        old = lc.find_leader(cluster)
        victim = cluster.node(old["id"])
        lc.kill(dir_, victim.id, "KILL")
        kill_time = time.monotonic()
        say(t0, f"kill -9 the leader, node {victim.id} (pid {victim.pid})")
        new, took = wait_for_new_leader(cluster, victim.id, t0, ELECTION_LIMIT)
        if new is None:
            failures.append(f"no new leader within {ELECTION_LIMIT:g}s")
            say(t0, f"NO new leader within {ELECTION_LIMIT:g}s")
            return _finish(producer, [c1], stats, processed, None, failures, t0, c2, None)
        say(t0, f"node {new['id']} elected leader in {took:.1f}s (term {old['term']} -> {new['term']})")

        c1.claim.set()  # c1 takes c2's entries once they have been idle 1s
        time.sleep(phase_seconds)
        producer.stop.set()
        producer.join(FAILOVER_BUDGET + 5)
        after = len(producer.acked) - before
        say(t0, f"producer stopped: {after} more readings acknowledged since the crash")

        restart = _restart_victim(dir_, cluster, victim, t0, failures)
        drained = _drain(producer, c1, stats, processed, t0)
        if not drained:
            failures.append("the group did not finish processing within 20s")
        return _finish(producer, [c1], stats, processed, _stream_seqs(cluster, stream, stats), failures, t0, c2,
                       (kill_time, took, restart), stream=stream, cluster=cluster)
    finally:
        for th in threads:
            th.stop.set()
        for th in threads:
            th.join(5)  # daemon threads: one stuck looking for a leader does not hold up `down`
        setup.close()


def _restart_victim(dir_, cluster, victim, t0, failures):
    """Restart the killed node from its data directory and wait until it has applied
    everything the leader had committed when it came back."""
    lc.up(dir_, 3, timeout=30, progress=lambda m: None)
    leader = lc.find_leader(cluster)
    target = leader["commit_index"] if leader else None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        info = lc.raft_info(victim.resp, 0.5)
        if info and target is not None and info.get("raft_applied_index", 0) >= target:
            say(t0, f"node {victim.id} restarted from disk, caught up to index {info['raft_applied_index']} "
                    f"as {info.get('raft_role')}")
            return info
        time.sleep(0.1)
    failures.append(f"restarted node {victim.id} did not catch up to index {target} within 15s")
    return None


def _drain(producer, consumer, stats, processed, t0) -> bool:
    """Wait until the group has processed every acknowledged reading."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with stats.lock:
            missing = [s for s in producer.acked if s not in processed]
        if not missing or consumer.error is not None:
            return not missing
        time.sleep(0.1)
    return False


def _stream_seqs(cluster, stream, stats) -> list:
    conn = LeaderConn(cluster, "checker", stats)
    seqs, start = [], "-"
    try:
        while True:
            batch = conn.call("xrange", stream, min=start, max="+", count=1000)
            seqs += [int(f["seq"]) for _, f in batch]
            if len(batch) < 1000:
                return seqs
            start = "(" + batch[-1][0]
    finally:
        conn.close()


def _finish(producer, consumers, stats, processed, stream_seqs, failures, t0, c2, failover, stream=None,
            cluster=None) -> int:
    for th in [producer, *consumers, c2]:
        th.stop.set()
        if th.error is not None:
            failures.append(f"{th.name} failed: {th.error!r}")
    pending = None
    if cluster is not None:
        conn = LeaderConn(cluster, "checker", stats)
        try:
            pending = conn.call("xpending", stream, GROUP)["pending"]
        finally:
            conn.close()
    acked = set(producer.acked)
    checked = stream_seqs is not None  # None: the run stopped before the stream could be checked
    in_stream = collections.Counter(stream_seqs or ())
    lost = sorted(acked - set(in_stream))
    unprocessed = sorted(acked - set(processed))
    dups = sorted(s for s, n in in_stream.items() if n > 1)
    redelivered = sum(1 for s, who in processed.items() if len(who) > 1)
    by = collections.Counter(who[0] for who in processed.values())
    if lost and checked:
        failures.append(f"{len(lost)} acknowledged readings missing from the stream (seq {lost[:10]})")
    if unprocessed and checked:
        failures.append(f"{len(unprocessed)} acknowledged readings never processed (seq {unprocessed[:10]})")
    if pending:
        failures.append(f"{pending} entries still pending in the group")
    if c2.crashed_holding and not any(c.claimed for c in consumers):
        failures.append("c2's pending entries were not claimed")

    print()
    print("== summary")
    if failover:
        kill_time, took, restart = failover
        gap = _longest_gap(producer.ack_times, kill_time)
        print(f"  failover: new leader elected {took:.1f}s after kill -9; producer's longest pause {gap:.1f}s")
        if restart:
            print(f"  restarted node recovered from disk and caught up (applied index {restart['raft_applied_index']})")
    print(f"  producer: {len(acked)} readings acknowledged; {len(dups)} duplicates in the stream"
          + (f" (seq {dups[:10]}: re-sent after a lost reply)" if dups else ""))
    print(f"  group: processed by c1 {by.get('c1', 0)}, c2 {by.get('c2', 0)}; c2 crashed holding "
          f"{len(c2.crashed_holding)}, claimed by c1 with XAUTOCLAIM: {consumers[0].claimed}; "
          f"redelivered {redelivered}; still pending {pending}")
    for what, n in sorted(stats.counts.items()):
        print(f"  {what}: {n}")
    if checked:
        print(f"  check: all {len(acked) - len(lost)}/{len(acked)} acknowledged readings are in the stream, "
              f"{len(acked) - len(unprocessed)}/{len(acked)} processed by the group")
    if failures:
        print("== FAILED")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("== OK: no acknowledged reading lost, the group carried on across the leader crash")
    return 0


def _longest_gap(times, since) -> float:
    after = [t for t in times if t >= since]
    points = [since] + after
    return max((b - a for a, b in zip(points, points[1:])), default=0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xraft.ops.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", help="cluster directory (default: a new temporary one, removed after a successful run)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    p.add_argument("--seconds", type=float, default=3.0, help="length of each phase (before and after the crash)")
    p.add_argument("--no-slot-move", action="store_true", help="skip part 2 (a sharded cluster moving a slot)")
    args = p.parse_args(argv)
    dir_ = args.dir or tempfile.mkdtemp(prefix="xraft-demo-")
    try:
        code = run(dir_, args.seconds, slot_move=not args.no_slot_move)
    except lc.LocalClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except (NoLeader, redis.RedisError) as e:
        print(f"error: {e!r}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    if args.dir is None and code == 0 and not args.keep:
        shutil.rmtree(dir_, ignore_errors=True)
    else:
        print(f"cluster files and node logs: {dir_}")
    return code


if __name__ == "__main__":
    sys.exit(main())
