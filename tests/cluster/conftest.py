"""Real `xraft-node` processes on free local ports, in a pytest tmp dir.

    cluster = make_cluster(3)            # laid out, nothing running
    cluster.start()                      # every node; waits for each "ready" line
    leader = cluster.wait_leader()       # a Node, by INFO raft on the RESP ports
    cluster.stop()                       # SIGTERM all, returns {id: exit code}

Nodes run `python -m xraft.node.server.node_main` (the `xraft-node` entry
point without needing a re-install) with a faster tick than the default so
elections take about half a second. A node's first start founds the cluster
(`--initial-cluster-state new`); every later start is a restart from disk
(`existing`, the default), as an operator would run them. Every process started is killed at
teardown, whatever the test did; a node's log is attached to the failure
message of any wait that times out.
"""
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

TICK_MS = 50
ELECTION_TICKS = 10
READY_TIMEOUT_S = 20.0
LEADER_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0
SECRET = "cluster-test-secret-0123456789abcdef"


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PORT_PICKER = random.Random()      # seeded from os.urandom: xdist workers pick apart


def free_ports(n: int) -> list:
    """n distinct ports free right now (bound, then released), taken BELOW the
    kernel's ephemeral range: a port from bind(0) is one the kernel also hands to
    outgoing connections, and one of those (another worker's client) took a
    node's --metrics port between the pick and the node's bind in a CI run."""
    low, high = 10000, _ephemeral_low() - 1
    socks, ports = [], []
    try:
        for _ in range(100 * n):
            if len(ports) == n or high <= low:
                break
            port = _PORT_PICKER.randint(low, high)
            if port in ports:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(port)
        while len(ports) < n:                   # no room below the range: any free port
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


class Node:
    def __init__(self, cluster: "Cluster", node_id: int, grpc: str, resp: str):
        self.cluster = cluster
        self.id = node_id
        self.grpc = grpc
        self.resp = resp
        self.data_dir = os.path.join(cluster.root, "n%d" % node_id)
        self.log_path = os.path.join(cluster.root, "n%d.log" % node_id)
        self.proc = None
        self.secret_file = cluster.secret_file
        self.extra_args = []
        self.founded = False             # started once: later starts restart from the data dir

    @property
    def resp_port(self) -> int:
        return int(self.resp.rsplit(":", 1)[1])

    def argv(self) -> list:
        c = self.cluster
        return [sys.executable, "-m", "xraft.node.server.node_main",
                "--id", str(self.id), "--cluster-id", c.cluster_id, "--data-dir", self.data_dir,
                "--grpc", self.grpc, "--resp", self.resp,
                "--peers", ",".join("%d=%s" % (n.id, n.grpc) for n in c.nodes.values()),
                "--resp-peers", ",".join("%d=%s" % (n.id, n.resp) for n in c.nodes.values()),
                "--secret-file", self.secret_file,
                "--tick-ms", str(TICK_MS), "--election-ticks", str(ELECTION_TICKS)] + \
            ([] if self.founded else ["--initial-cluster-state", "new"]) + self.extra_args

    def start(self) -> None:
        assert not self.running(), "node %d already running" % self.id
        self._log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.cluster.env)
        finally:
            log.close()
        self.cluster.started.append(self.proc)
        self.founded = True

    def log_text(self, since_start: bool = True) -> str:
        try:
            with open(self.log_path, "rb") as f:
                if since_start:
                    f.seek(self._log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        line = "xraft-node %d ready " % self.id
        while time.monotonic() < deadline:
            if line in self.log_text():
                return
            if self.proc.poll() is not None:
                raise AssertionError("node %d exited %s before ready:\n%s"
                                     % (self.id, self.proc.returncode, self.log_text()))
            time.sleep(0.05)
        raise AssertionError("node %d not ready in %.0fs:\n%s" % (self.id, timeout, self.log_text()))

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig) -> None:
        if self.running():
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = STOP_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("node %d did not exit within %.0fs:\n%s" % (self.id, timeout, self.log_text()))

    def client(self, **kw) -> redis.Redis:
        host, port = self.resp.rsplit(":", 1)
        kw.setdefault("socket_timeout", 5)
        # No blind retries: redis-py would re-send a write whose outcome is unknown (a
        # duplicate XADD) and spend 10+ s retrying against a paused node.
        kw.setdefault("retry", Retry(NoBackoff(), 0))
        return redis.Redis(host=host, port=int(port), **kw)

    def raft_info(self):
        """INFO raft as a dict, or None if the node does not answer."""
        try:
            # INFO is idempotent: a couple of quick retries ride out a busy moment
            with self.client(socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 2)) as r:
                return r.info("raft")
        except (redis.ConnectionError, redis.TimeoutError):
            return None


class Cluster:
    def __init__(self, root: str, n: int, cluster_id: str = "test-cluster"):
        self.root = root
        self.cluster_id = cluster_id
        self.secret_file = os.path.join(root, "secret")
        with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(SECRET + "\n")
        self.env = dict(os.environ)
        self.env.pop("XRAFT_CLUSTER_SECRET", None)
        self.started = []                # every Popen ever made, for teardown
        ports = free_ports(2 * n)
        self.nodes = {i: Node(self, i, "127.0.0.1:%d" % ports[2 * i - 2], "127.0.0.1:%d" % ports[2 * i - 1])
                      for i in range(1, n + 1)}

    def start(self, ids=None, wait: bool = True) -> None:
        ids = list(ids or self.nodes)
        for i in ids:
            self.nodes[i].start()
        if wait:
            for i in ids:
                self.nodes[i].wait_ready()

    def infos(self, ids=None) -> dict:
        return {i: self.nodes[i].raft_info() for i in (ids or self.nodes) if self.nodes[i].running()}

    def wait_leader(self, ids=None, timeout: float = LEADER_TIMEOUT_S) -> Node:
        """The node every running node (of `ids`) names as leader, once it says so itself."""
        deadline = time.monotonic() + timeout
        infos = {}
        while time.monotonic() < deadline:
            infos = self.infos(ids)
            leads = {i for i, inf in infos.items() if inf and inf.get("raft_role") == "leader"}
            named = {inf.get("raft_leader_id") for inf in infos.values() if inf}
            if len(leads) == 1 and named == leads and infos[next(iter(leads))].get("raft_writable") == 1:
                return self.nodes[leads.pop()]
            time.sleep(0.05)
        raise AssertionError("no agreed leader in %.0fs: %r\n%s" % (timeout, infos, self.logs()))

    def followers(self, leader: Node) -> list:
        return [n for n in self.nodes.values() if n is not leader and n.running()]

    def stop(self, ids=None, sig=signal.SIGTERM) -> dict:
        ids = [i for i in (ids or self.nodes) if self.nodes[i].running()]
        for i in ids:
            self.nodes[i].signal(sig)
        return {i: self.nodes[i].wait_exit() for i in ids}

    def logs(self) -> str:
        return "\n".join("--- node %d ---\n%s" % (n.id, n.log_text(since_start=False)[-4000:])
                         for n in self.nodes.values())

    def kill_all(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
        for p in self.started:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def wait_until(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError("timed out after %.0fs waiting for %s (last: %r)" % (timeout, what, last))


@pytest.fixture(scope="module")
def cluster_factory(tmp_path_factory):
    """make(n) -> a laid-out Cluster; every process is killed at module end."""
    made = []

    def make(n: int = 3, **kw) -> Cluster:
        c = Cluster(str(tmp_path_factory.mktemp("cluster")), n, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.kill_all()


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    """Three nodes, started, with an agreed leader; shared by a module's tests."""
    c = cluster_factory(3)
    c.start()
    c.wait_leader()
    return c
