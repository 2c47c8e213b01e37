"""Clients and bookkeeping for the HA tests (failover, pause, restart, blocking), on top
of conftest's Cluster of real xraft-node processes.

    rclient(node)            redis-py that NEVER retries by itself (redis-py 8 retries a
                             command up to 10 times after a connection error by default:
                             a blind XADD retry would turn one write into two)
    raft_info(node)          INFO raft with short timeouts (None for a dead/paused node)
    wait_leader_among(...)   the leader among some nodes, and how long it took
    LeaderConn               one connection that follows the leader; a write whose fate is
                             unknown raises Unknown instead of being re-sent
    Producer / SdkProducer   XADD entries carrying a unique `uid` field, so a duplicate
                             or a phantom entry is detectable
    Consumer + GroupModel    XREADGROUP + XACK, and what the clients observed: the PEL
                             (owner, delivery count) the group must have
    node_state(node, keys)   one replica's full view of some streams (READONLY reads)
"""
import collections
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AskError, ClusterDownError, TryAgainError
from redis.retry import Retry

from tests.cluster.conftest import wait_until as wait_for

GROUP = "g"
# Replies meaning "nothing was done here, ask the leader" (wire_errors.py's retriable rows).
RETRY_PREFIXES = ("NOTLEADER", "UNAVAILABLE", "TIMEOUT", "LOADING", "BUSY")
FAILOVER_BUDGET_S = 20.0   # how long a client keeps looking for a leader before failing


def rclient(node_or_addr, timeout: float = 2.0, **kw) -> redis.Redis:
    addr = getattr(node_or_addr, "resp", node_or_addr)
    host, port = addr.rsplit(":", 1)
    kw.setdefault("decode_responses", True)
    return redis.Redis(host=host, port=int(port), socket_timeout=timeout,
                       socket_connect_timeout=min(timeout, 1.0), retry=Retry(NoBackoff(), 0),
                       protocol=2, **kw)


def raft_info(node, timeout: float = 0.5):
    """INFO raft, or None if the node is not running or does not answer in time.
    (conftest's Node.raft_info uses redis-py's default retries: ~10 s on a paused node.)"""
    if not node.running():
        return None
    c = rclient(node, timeout)
    try:
        return c.info("raft")
    except (redis.RedisError, OSError):
        return None
    finally:
        c.close()


def wait_leader_among(cluster, ids, timeout: float = 15.0, since: float = None):
    """(node, seconds since `since`) once one of `ids` is a writable leader."""
    since = time.monotonic() if since is None else since
    deadline = time.monotonic() + timeout
    seen = {}
    while time.monotonic() < deadline:
        for i in ids:
            inf = raft_info(cluster.nodes[i], 0.3)
            seen[i] = inf and (inf["raft_role"], inf["raft_term"], inf.get("raft_writable"))
            if inf and inf["raft_role"] == "leader" and inf.get("raft_writable") == 1:
                return cluster.nodes[i], time.monotonic() - since
        time.sleep(0.02)
    raise AssertionError("no leader among %s in %.0fs: %r\n%s" % (ids, timeout, seen, cluster.logs()))


def wait_caught_up(cluster, ids, timeout: float = 15.0) -> int:
    """Wait until every node of `ids` has applied the same index, the leader's commit
    index (the cluster must be quiet: nothing writing). Returns that index."""
    def same():
        infos = [raft_info(cluster.nodes[i]) for i in ids]
        if not all(infos):
            return None
        lead = [x for x in infos if x["raft_role"] == "leader"]
        if len(lead) != 1:
            return None
        target = lead[0]["raft_commit_index"]
        return target if all(x["raft_applied_index"] == target for x in infos) else None
    return wait_for(same, timeout, "nodes %s to apply the same index" % (ids,))


def sid(text) -> tuple:
    ms, _, seq = str(text).partition("-")
    return int(ms), int(seq or 0)


class Unknown(Exception):
    """A write was sent but its outcome is unknown (reply lost, -UNKNOWNOUTCOME)."""


class NoLeader(Exception):
    pass


class LeaderConn:
    """A redis-py connection that follows the Raft leader. Redirects (-MOVED,
    -NOTLEADER, -CLUSTERDOWN, ...) and connection failures before anything was
    sent are retried within FAILOVER_BUDGET_S; a write that may have been applied
    raises Unknown (a read is simply retried). `skip`: node ids never scanned for
    the leader (a paused node would only cost timeouts). `stop`: an Event that ends
    the search for a leader early (NoLeader)."""

    def __init__(self, cluster, name: str, timeout: float = 3.0, skip=(), stop=None):
        self.cluster, self.name, self.timeout, self.skip = cluster, name, timeout, set(skip)
        self.stop = stop
        self.client = None
        self.addr = None
        self.hint = None
        self.stats = collections.Counter()

    def close(self):
        if self.client is not None:
            self.client.close()
        self.client = None

    def _find_leader(self):
        if self.hint:
            hint, self.hint = self.hint, None
            return hint
        best = None
        for n in self.cluster.nodes.values():
            if n.id in self.skip:
                continue
            inf = raft_info(n, 0.3)
            if inf and inf["raft_role"] == "leader" and (best is None or inf["raft_term"] > best[0]):
                best = (inf["raft_term"], n.resp)
        return best and best[1]

    def _connect(self) -> bool:
        addr = self._find_leader()
        if addr is None:
            return False
        c = rclient(addr, self.timeout)
        try:
            c.ping()                      # a separate round trip: a failure here sent no command
        except (redis.RedisError, OSError):
            c.close()
            return False
        if self.addr is not None and addr != self.addr:
            self.stats["switched leader"] += 1
        self.client, self.addr = c, addr
        return True

    def call(self, method: str, *args, write: bool = False, **kw):
        deadline = time.monotonic() + FAILOVER_BUDGET_S
        delay = 0.02
        while True:
            if self.client is not None or self._connect():
                try:
                    return getattr(self.client, method)(*args, **kw)
                except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                    self.close()
                    self.stats["connection errors"] += 1
                    if write:             # sent: it may have been applied
                        raise Unknown("%s: %r" % (method, e)) from e
                except (AskError, TryAgainError, ClusterDownError) as e:
                    parts = str(e).split()   # MOVED: redis-py strips the prefix: "<slot> <addr>"
                    self.hint = parts[1] if isinstance(e, AskError) and len(parts) == 2 else None
                    self.stats["redirects"] += 1
                    self.close()
                except redis.ResponseError as e:
                    word, _, rest = str(e).partition(" ")
                    if word == "UNKNOWNOUTCOME":
                        self.close()
                        self.stats["unknown outcome replies"] += 1
                        raise Unknown("%s: %s" % (method, e)) from e
                    if word not in RETRY_PREFIXES:
                        raise
                    self.hint = rest if word == "NOTLEADER" and ":" in rest else None
                    self.stats["redirects"] += 1
                    self.close()
            if time.monotonic() >= deadline:
                raise NoLeader("%s: no leader reachable for %.0fs" % (self.name, FAILOVER_BUDGET_S))
            if self.stop is not None and self.stop.is_set():
                raise NoLeader("%s: stopped while looking for the leader" % self.name)
            time.sleep(delay)
            delay = min(delay * 2, 0.3)


class Worker(threading.Thread):
    """A daemon thread whose exception is kept for the test to raise."""

    def __init__(self, name):
        super().__init__(name=name, daemon=True)
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            self.work()
        except BaseException as e:   # noqa: BLE001 - reported by the test thread
            self.error = e

    def finish(self, timeout: float = FAILOVER_BUDGET_S + 5, stop: bool = True):
        """Stop (unless `stop` is False: it ends by itself) and re-raise its error."""
        if stop:
            self.stop.set()
        self.join(timeout)
        assert not self.is_alive(), "%s did not stop" % self.name
        if self.error is not None:
            raise AssertionError("%s failed: %r" % (self.name, self.error)) from self.error


class Producer(Worker):
    """XADD {uid: <prefix>-<n>} through a LeaderConn. An unknown outcome is NOT
    re-sent: its uid goes to `maybe` (it may be in the stream, at most once)."""

    def __init__(self, cluster, stream: str, prefix: str, interval: float = 0.005, skip=()):
        super().__init__("producer-" + prefix)
        # A producer may give up its search for a leader when told to stop: its
        # pending write was never sent, so nothing is left uncertain.
        self.conn = LeaderConn(cluster, self.name, skip=skip, stop=self.stop)
        self.stream, self.prefix, self.interval = stream, prefix, interval
        self.acked = {}          # uid -> id
        self.ack_times = []
        self.maybe = set()

    def work(self):
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                uid = "%s-%d" % (self.prefix, n)
                try:
                    self.acked[uid] = self.conn.call("xadd", self.stream, {"uid": uid}, write=True)
                    self.ack_times.append(time.monotonic())
                except Unknown:
                    self.maybe.add(uid)
                except NoLeader:
                    if self.stop.is_set():
                        return
                    raise
                self.stop.wait(self.interval)
        finally:
            self.conn.close()

    def acked_since(self, t: float) -> int:
        return sum(1 for x in self.ack_times if x >= t)


class SdkProducer(Worker):
    """The same through the gRPC SDK, whose request ids let it re-send a write of
    unknown outcome safely (the server's session table deduplicates it): its
    acknowledged writes must appear exactly once even across the failover."""

    def __init__(self, cluster, stream: str, prefix: str, interval: float = 0.005):
        super().__init__("sdk-producer-" + prefix)
        self.seeds = [n.grpc for n in cluster.nodes.values()]
        self.stream, self.prefix, self.interval = stream, prefix, interval
        self.acked, self.ack_times, self.maybe = {}, [], set()

    def work(self):
        from xraft.client.errors import UnknownOutcomeError
        from xraft.client.sync import Client
        c = Client(self.seeds, timeout=FAILOVER_BUDGET_S)
        try:
            n = 0
            while not self.stop.is_set():
                n += 1
                uid = "%s-%d" % (self.prefix, n)
                try:
                    self.acked[uid] = str(c.xadd(self.stream, {"uid": uid}))
                    self.ack_times.append(time.monotonic())
                except UnknownOutcomeError:
                    self.maybe.add(uid)
                self.stop.wait(self.interval)
        finally:
            c.close()

    acked_since = Producer.acked_since


def check_stream(entries, producers) -> dict:
    """Every acknowledged uid exactly once with its acknowledged ID, every unknown one
    at most once, nothing else. `entries`: XRANGE - + of the stream. Returns figures."""
    by_uid = collections.defaultdict(list)
    for eid, fields in entries:
        by_uid[fields.get("uid")].append(eid)
    acked, maybe = {}, set()
    for p in producers:
        acked.update(p.acked)
        maybe |= p.maybe
    lost = sorted(u for u in acked if u not in by_uid)
    dups = sorted(u for u, ids in by_uid.items() if len(ids) > 1)
    moved = sorted(u for u in acked if u in by_uid and by_uid[u] != [acked[u]])
    phantom = sorted(u for u in by_uid if u not in acked and u not in maybe)
    assert not lost, "acknowledged writes lost: %s" % lost[:20]
    assert not dups, "entries duplicated: %s" % [(u, by_uid[u]) for u in dups[:20]]
    assert not moved, "acknowledged with another ID: %s" % [(u, acked[u], by_uid[u]) for u in moved[:20]]
    assert not phantom, "entries nobody wrote: %s" % phantom[:20]
    assert [e[0] for e in entries] == sorted((e[0] for e in entries), key=sid)
    return {"acked": len(acked), "unknown": len(maybe), "unknown_applied": len(maybe & set(by_uid))}


class GroupModel:
    """What the consumers observed, hence what the group must hold.

    Each delivery the clients saw counts one. An XREADGROUP whose outcome is
    unknown may have delivered or re-delivered without anyone seeing it, so the
    model keeps a range [min, max] per entry: a `>` read of unknown outcome makes the
    consumer re-read its own PEL (ID 0), where such an entry shows up having been
    delivered once unseen; each history read of unknown outcome may have bumped the
    count of everything the consumer held by one.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.pel = {}                          # id -> [owner, seen, extra_min, unknown_base]
        self.unknown_hist = collections.Counter()   # consumer -> history reads of unknown outcome
        self.last_delivered = "0-0"
        self.ever = set()                      # every entry ever delivered by `>`
        self.violations = []

    def new(self, consumer, ids):
        with self.lock:
            for i in ids:
                if i in self.ever:
                    # `>` hands out only entries past last-delivered-id: twice is a double delivery.
                    self.violations.append("%s delivered again to %s by '>'" % (i, consumer))
                    continue
                self._deliver(i)
                self.pel[i] = [consumer, 1, 0, self.unknown_hist[consumer]]

    def history(self, consumer, ids):
        with self.lock:
            for i in ids:
                rec = self.pel.get(i)
                if rec is None and i not in self.ever:
                    # Delivered by a `>` read whose reply was lost: once unseen, now seen.
                    self._deliver(i)
                    self.pel[i] = [consumer, 1, 1, 0]
                elif rec is None:
                    self.violations.append("%s acked, yet in %s's PEL" % (i, consumer))
                elif rec[0] != consumer:
                    self.violations.append("%s in %s's PEL, owned by %s" % (i, consumer, rec[0]))
                else:
                    rec[1] += 1

    def _deliver(self, i):
        self.ever.add(i)
        if sid(i) > sid(self.last_delivered):
            self.last_delivered = i

    def unknown_history_read(self, consumer):
        with self.lock:
            self.unknown_hist[consumer] += 1

    def acked(self, ids):
        with self.lock:
            for i in ids:
                self.pel.pop(i, None)

    def claimed(self, consumer, ids):
        with self.lock:
            for i in ids:
                rec = self.pel[i]
                lo, hi = self._range(rec)
                # The claim's own delivery is seen (+1); the width of the range moves
                # with the entry (expressed against the new owner's unknown count).
                self.pel[i] = [consumer, lo + 1, 0, self.unknown_hist[consumer] - (hi - lo)]

    def _range(self, rec):
        owner, seen, extra, base = rec
        lo = seen + extra
        return lo, lo + self.unknown_hist[owner] - base

    def expected(self) -> dict:
        """id -> (owner, min count, max count)."""
        with self.lock:
            return {i: (rec[0],) + self._range(rec) for i, rec in self.pel.items()}


class Consumer(Worker):
    """XREADGROUP `>` BLOCK + XACK through a LeaderConn, recording into a GroupModel.
    After an unknown outcome it re-reads its own PEL (ID 0) before anything else.
    `hold` set: keep taking deliveries without acking until holding some, then
    vanish (a consumer that dies holding entries)."""

    def __init__(self, cluster, stream, name, model: GroupModel, skip=()):
        super().__init__(name)
        self.conn = LeaderConn(cluster, name, skip=skip)
        self.stream, self.cname, self.model = stream, name, model
        self.hold = threading.Event()
        self.holding = []
        self.acks = 0

    def work(self):
        recover = True
        try:
            while True:
                if recover:
                    try:
                        reply = self.conn.call("xreadgroup", GROUP, self.cname, {self.stream: "0"},
                                               count=10_000, write=True)
                    except Unknown:
                        self.model.unknown_history_read(self.cname)
                        continue
                    ids = _ids(reply)
                    self.model.history(self.cname, ids)
                    recover = False
                else:
                    if self.stop.is_set() or (self.hold.is_set() and self.holding):
                        return            # stops only with its own PEL accounted for
                    try:
                        reply = self.conn.call("xreadgroup", GROUP, self.cname, {self.stream: ">"},
                                               count=20, block=200, write=True)
                    except Unknown:
                        recover = True
                        continue
                    ids = _ids(reply)
                    self.model.new(self.cname, ids)
                if self.hold.is_set():
                    self.holding += ids
                elif ids:
                    self._ack(ids)
        finally:
            self.conn.close()

    def _ack(self, ids):
        while True:
            try:
                self.conn.call("xack", self.stream, GROUP, *ids, write=True)
                break
            except Unknown:               # XACK is idempotent: re-sending is safe
                continue
        self.model.acked(ids)
        self.acks += len(ids)


def _ids(reply) -> list:
    return [e[0] for e in reply[0][1]] if reply else []


def check_group(r, stream: str, model: GroupModel, consumers) -> dict:
    """The group on the node behind `r` equals what the clients observed."""
    expected = model.expected()
    [g] = [g for g in r.xinfo_groups(stream) if g["name"] == GROUP]
    assert g["last-delivered-id"] == model.last_delivered, ("last-delivered-id", g, model.last_delivered)
    assert g["pending"] == len(expected), ("group pending %d, the clients' deliveries - acks %d"
                                           % (g["pending"], len(expected)))
    assert g["consumers"] == len(consumers), g
    ids = [e[0] for e in r.xrange(stream)]
    # No deletions: entries-read is the last delivered entry's position in the stream.
    assert g["entries-read"] == ids.index(model.last_delivered) + 1 == len(model.ever), (
        g, ids.index(model.last_delivered) + 1, len(model.ever))
    assert g["lag"] == len(ids) - g["entries-read"]
    pel = r.xpending_range(stream, GROUP, min="-", max="+", count=100_000)
    got = {p["message_id"]: (p["consumer"], p["times_delivered"]) for p in pel}
    assert sorted(got) == sorted(expected), "PEL ids differ: extra %s missing %s" % (
        sorted(set(got) - set(expected))[:10], sorted(set(expected) - set(got))[:10])
    bad = {i: (got[i], expected[i]) for i in got
           if got[i][0] != expected[i][0] or not expected[i][1] <= got[i][1] <= expected[i][2]}
    assert not bad, "PEL entries differ (got (owner, count), expected (owner, min, max)): %s" % bad
    per = collections.Counter(o for o, _, _ in expected.values())
    infos = {c["name"]: c["pending"] for c in r.xinfo_consumers(stream, GROUP)}
    assert infos == {c: per.get(c, 0) for c in consumers}, (infos, per)
    assert not model.violations, model.violations
    return {"pending": len(expected), "uncertain": sum(1 for _, lo, hi in expected.values() if hi > lo)}


def node_state(node, keys) -> dict:
    """One replica's view of some streams, by READONLY (possibly stale) reads, so a
    follower answers from what it has applied."""
    r = rclient(node, 5.0)
    try:
        r.execute_command("READONLY")
        # A follower that knows no leader for a moment (an election after a restart) refuses
        # even a stale read with NOTLEADER: asked again, within a liveness bound.
        deadline = time.monotonic() + 30.0
        while True:
            try:
                out = {}
                for k in keys:
                    out[k] = {"range": r.xrange(k),
                              "full": r.execute_command("XINFO", "STREAM", k, "FULL", "COUNT", "0"),
                              "groups": r.execute_command("XINFO", "GROUPS", k)}
                return out
            except redis.exceptions.ResponseError as e:
                if not str(e).startswith("NOTLEADER") or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        r.close()


def assert_identical(cluster, ids, keys):
    """Every node of `ids` holds the same streams (after wait_caught_up)."""
    states = {i: node_state(cluster.nodes[i], keys) for i in ids}
    first = states[ids[0]]
    for i in ids[1:]:
        for k in keys:
            assert states[i][k] == first[k], "node %d differs from node %d on %r:\n%r\n%r" % (
                i, ids[0], k, states[i][k], first[k])
    return first


class RawConn:
    """A bare RESP2 socket. sendall() returns once the command is in the kernel's
    buffers, so commands can be queued at a SIGSTOPped node without threads, and
    their replies read after SIGCONT."""

    def __init__(self, node, timeout: float = 20.0):
        import socket
        host, port = node.resp.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=2.0)
        self.sock.settimeout(timeout)
        self.buf = b""

    def send(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))

    def reply(self):
        """("ok", value) or ("err", message); raises OSError if the connection failed."""
        line = self._line()
        kind, rest = line[:1], line[1:].decode()
        if kind == b"-":
            return "err", rest
        if kind == b"+":
            return "ok", rest
        if kind == b":":
            return "ok", int(rest)
        if kind == b"$":
            n = int(rest)
            return "ok", None if n < 0 else self._exact(n + 2)[:-2].decode()
        if kind == b"*":
            n = int(rest)
            return "ok", None if n < 0 else [self.reply()[1] for _ in range(n)]
        raise AssertionError("bad RESP line %r" % line)

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _more(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by the node")
        self.buf += chunk

    def close(self):
        self.sock.close()
