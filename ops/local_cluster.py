"""A local xraft cluster: N `xraft-node` processes on one machine, managed from a directory.

Everything about a local cluster lives in its directory, so any later
`xraftctl local ...` invocation (another shell, a script, the demo) can find it:

    DIR/cluster.json        cluster id, node command, per node: id, pid, grpc, resp, data dir, log
    DIR/secret              the shared cluster secret (mode 0600), passed with --secret-file
    DIR/node-<id>/data      the node's --data-dir (restart from disk reuses it)
    DIR/node-<id>/node.log  the node's stdout and stderr, appended across restarts
    DIR/.lock               flock'ed while up/down/kill change the cluster

A node's first start founds the cluster: it alone gets `--initial-cluster-state
new` (the node bootstraps --peers as voters into its empty data dir). Once it
logged ready, cluster.json marks it `founded`, and every later start is a
restart from disk with the node's default (`existing`): a node whose data dir
was wiped then refuses to start instead of voting with no log, and must rejoin
through a membership change.

Nodes are started detached (their own session, no terminal, stdin from
/dev/null) so they outlive the `xraftctl` process that started them and a ^C
in that shell does not reach them. They are told about each other only by
address; this module never imports the node (import-linter forbids it): it
talks to nodes over the network (INFO raft on the RESP port) and by signals.
"""
import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import redis

from .topology import NodeSpec, Topology
from .topology import join_argv, node_argv as topology_argv

CLUSTER_FILE = "cluster.json"
SECRET_FILE = "secret"
LOCK_FILE = ".lock"
FORMAT_VERSION = 1
HOST = "127.0.0.1"
# Run the node with the interpreter running us, so a venv's xraft is the one
# started even when the venv's bin/ is not on PATH (./dev runs .venv/bin/python).
DEFAULT_NODE_COMMAND = (sys.executable, "-m", "xraft.node.server.node_main")
FSYNC_CHOICES = ("always", "batch", "never")
LOG_TAIL_LINES = 15
MAX_GROUPS = 1024          # the node's limit on --groups (node/server/config.py)
# `xraftctl local up` without --groups founds a sharded cluster: this many data groups per node,
# so placement gives every node leaders (issue 10). up() itself keeps 1 (callers say what they need).
DEFAULT_GROUPS_PER_NODE = 2


def default_groups(nodes: int) -> int:
    return min(MAX_GROUPS, DEFAULT_GROUPS_PER_NODE * nodes)

Progress = Callable[[str], None]


class LocalClusterError(Exception):
    """A local-cluster operation failed; the message says what and what to look at."""


class StartTimeout(LocalClusterError):
    """Nodes started but did not log ready (or no leader was elected) in time. `waiting`:
    the ids still starting; their processes were left running."""

    def __init__(self, message: str, waiting: list):
        super().__init__(message)
        self.waiting = waiting


@dataclass
class NodeInfo:
    id: int
    grpc: str
    resp: str
    data_dir: str
    log: str
    pid: Optional[int] = None
    # False until the node's first start logged ready; until then it is started with
    # --initial-cluster-state new. True for nodes of a cluster.json written before the flag.
    founded: bool = True
    metrics: Optional[str] = None   # --metrics address (Prometheus), if the cluster was made with one
    join: Optional[str] = None      # a node added later (members_local.py): started with --join THIS


@dataclass
class ClusterInfo:
    dir: str
    cluster_id: str
    secret_file: str
    nodes: list
    node_command: list = field(default_factory=lambda: list(DEFAULT_NODE_COMMAND))
    node_args: list = field(default_factory=list)  # extra arguments passed to every node verbatim
    fsync: Optional[str] = None
    groups: int = 1         # data Raft groups (--groups); fixed when the cluster is founded
    state: str = "stopped"  # "running" after up, "stopped" after down: what the operator asked for

    def node(self, node_id: int) -> NodeInfo:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise LocalClusterError(f"no node {node_id} in {self.dir} (nodes: {', '.join(str(n.id) for n in self.nodes)})")

    def to_json(self) -> dict:
        d = asdict(self)
        d["version"] = FORMAT_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict) -> "ClusterInfo":
        if d.get("version") != FORMAT_VERSION:
            raise LocalClusterError(f"cluster.json has version {d.get('version')!r}, expected {FORMAT_VERSION}")
        d = {k: v for k, v in d.items() if k != "version"}
        d["nodes"] = [NodeInfo(**n) for n in d["nodes"]]
        return cls(**d)


# -- cluster.json ---------------------------------------------------------------

def cluster_file(dir_: str) -> Path:
    return Path(dir_) / CLUSTER_FILE


def load(dir_: str) -> ClusterInfo:
    path = cluster_file(dir_)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise LocalClusterError(f"no local cluster in {dir_} ({path} not found; create one with `xraftctl local up`)")
    try:
        return ClusterInfo.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError) as e:
        raise LocalClusterError(f"{path} is not a valid cluster file: {e}")


def save(cluster: ClusterInfo) -> None:
    """Write cluster.json atomically: a reader (status in another shell) never sees half a file."""
    path = cluster_file(cluster.dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cluster.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(dir_: str):
    """Serialize up/down/kill on one directory (two concurrent `up`s would start every node twice)."""
    fd = os.open(Path(dir_) / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalClusterError(f"another xraftctl is changing the cluster in {dir_}; try again when it is done")
        yield
    finally:
        os.close(fd)


# -- ports ----------------------------------------------------------------------

def port_is_free(port: int, host: str = HOST) -> bool:
    # SO_REUSEADDR like the servers: a port in TIME_WAIT from the last run is free to
    # listen on again; only a live listener makes bind() fail.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(count: int, base_port: Optional[int] = None, host: str = HOST) -> list:
    """`count` distinct free TCP ports: base_port, base_port+1, ... (all must be free),
    or ports the kernel chooses. The kernel's ports are held open until all are
    chosen so it cannot hand out one twice; a process could still take one before
    the node binds it, which the node's start then reports (its log says so)."""
    if count <= 0:
        raise ValueError("count must be positive")
    if base_port is not None:
        if not 1024 <= base_port <= 65535 - count + 1:
            raise LocalClusterError(f"--base-port {base_port}: need {count} ports within 1024..65535")
        ports = list(range(base_port, base_port + count))
        busy = [p for p in ports if not port_is_free(p, host)]
        if busy:
            raise LocalClusterError(f"ports already in use: {', '.join(map(str, busy))} "
                                    f"(choose another --base-port, or omit it to pick free ports)")
        return ports
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# -- creating a cluster and node arguments --------------------------------------

def new_cluster(dir_: str, nodes: int, base_port: Optional[int] = None, fsync: Optional[str] = None,
                node_command: Optional[Iterable[str]] = None, node_args: Iterable[str] = (),
                groups: int = 1, metrics_base_port: Optional[int] = None) -> ClusterInfo:
    """Lay out a new cluster in dir_ (ports, cluster id, secret) and write cluster.json; starts nothing.
    metrics_base_port: node i serves Prometheus metrics on metrics_base_port + i - 1."""
    if not 1 <= groups <= MAX_GROUPS:
        raise LocalClusterError(f"--groups {groups}: expected 1 to {MAX_GROUPS}")
    if not 1 <= nodes <= 9:
        # Node ids are single digits in --peers examples; more than 9 local voters is never what you want.
        raise LocalClusterError(f"--nodes {nodes}: a local cluster has 1 to 9 nodes")
    if fsync is not None and fsync not in FSYNC_CHOICES:
        raise LocalClusterError(f"--fsync {fsync!r}: expected one of {', '.join(FSYNC_CHOICES)}")
    root = Path(dir_).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if cluster_file(root).exists():
        raise LocalClusterError(f"{root} already holds a cluster (cluster.json exists)")
    stale = [p for p in root.glob("node-*/data") if any(p.iterdir())]
    if stale:
        # Data without cluster.json belongs to some earlier cluster: a node would refuse it
        # (other cluster id) or, worse, resume it as if it were this cluster's.
        raise LocalClusterError(f"{root} has node data but no cluster.json ({stale[0]}); use an empty directory")
    ports = pick_ports(2 * nodes, base_port)
    metrics_ports = pick_ports(nodes, metrics_base_port) if metrics_base_port is not None else None
    secret_path = root / SECRET_FILE
    # Mode 0600 at creation: the secret is never readable by others, not even briefly.
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(secret_path, 0o600)  # O_CREAT's mode does not apply to an existing file
    infos = []
    for i in range(nodes):
        node_dir = root / f"node-{i + 1}"
        (node_dir / "data").mkdir(parents=True, exist_ok=True)
        infos.append(NodeInfo(id=i + 1, grpc=f"{HOST}:{ports[2 * i]}", resp=f"{HOST}:{ports[2 * i + 1]}",
                              data_dir=str(node_dir / "data"), log=str(node_dir / "node.log"), founded=False,
                              metrics=f"{HOST}:{metrics_ports[i]}" if metrics_ports else None))
    cluster = ClusterInfo(dir=str(root), cluster_id="local-" + secrets.token_hex(6), secret_file=str(secret_path),
                          nodes=infos, node_command=list(node_command or DEFAULT_NODE_COMMAND),
                          node_args=list(node_args), fsync=fsync, groups=groups)
    save(cluster)
    return cluster


def topology(cluster: ClusterInfo) -> Topology:
    """The cluster as topology.py describes every cluster xraftctl starts (compose too)."""
    return Topology(cluster_id=cluster.cluster_id, secret_file=cluster.secret_file, groups=cluster.groups,
                    fsync=cluster.fsync, extra_args=tuple(cluster.node_args),
                    nodes=tuple(NodeSpec(id=n.id, grpc=n.grpc, resp=n.resp, data_dir=n.data_dir,
                                         metrics=n.metrics) for n in cluster.nodes))


def node_argv(cluster: ClusterInfo, node: NodeInfo) -> list:
    """The full command line that starts `node` (the xraft-node CLI)."""
    topo = topology(cluster)
    if node.join:
        return list(cluster.node_command) + join_argv(topo, topo.node(node.id), node.join)
    return list(cluster.node_command) + topology_argv(topo, topo.node(node.id), founding=not node.founded)


# -- processes ------------------------------------------------------------------

def _reap(pid: int) -> None:
    # When the caller started the node itself (the demo, tests), a dead node stays a
    # zombie until reaped, and a zombie still answers kill(pid, 0).
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _state(pid: int) -> Optional[str]:
    """The /proc state letter of pid (R, S, Z, ...), or None if it has no /proc entry."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2]
    except (OSError, ValueError, IndexError):
        return None


def _await_exit(pid: int, limit: float = 1.0) -> None:
    """Wait (briefly) for a process seen exiting to be gone, reaping it if it is our child:
    callers that were told "not alive" may rebind its ports or expect the pid to be free."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        _reap(pid)
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if _state(pid) in ("Z", "X") and not _is_our_child(pid):
            return  # a zombie of another parent: dead, and only that parent can reap it
        time.sleep(0.01)


def _is_our_child(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def is_alive(cluster: ClusterInfo, node: NodeInfo) -> bool:
    """Whether node.pid is still this node: alive, not a zombie, and (where /proc
    exists) running with this cluster's id, so a recycled pid is not mistaken for it."""
    pid = node.pid
    if not pid:
        return False
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # some other user's process got the pid
    if not Path("/proc/self").exists():
        return True  # no /proc (not Linux): kill(pid, 0) is all we can tell
    state = _state(pid)
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        args = []
    if state is None or state in ("Z", "X") or args == [b""] or not args:
        # Dead or dying (an exiting process's cmdline is already empty).
        _await_exit(pid)
        return False
    pairs = set(zip(args, args[1:]))
    return (b"--cluster-id", cluster.cluster_id.encode()) in pairs and (b"--id", str(node.id).encode()) in pairs


def _log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:]) or "    (log is empty)"


def start_node(cluster: ClusterInfo, node: NodeInfo, argv_prefix: Iterable[str] = (),
               env: Optional[dict] = None) -> subprocess.Popen:
    """Start one node detached; its output is appended to node.log. Updates node.pid (not the file).
    argv_prefix wraps the node's command line (`ip netns exec NS`: the namespace harness,
    whose nodes listen in their own namespaces, so the loopback port check does not apply);
    env replaces the environment (libfaketime's variables)."""
    argv_prefix = list(argv_prefix)
    for addr in (node.grpc, node.resp) if not argv_prefix else ():
        port = int(addr.rsplit(":", 1)[1])
        if not port_is_free(port):
            raise LocalClusterError(f"node {node.id}: port {port} ({addr}) is in use by another process; "
                                    f"stop it, or remove {cluster.dir} and start a new cluster")
    Path(node.data_dir).mkdir(parents=True, exist_ok=True)
    argv = argv_prefix + node_argv(cluster, node)
    with open(node.log, "ab") as log:
        log.write(f"\n=== xraftctl {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=str(Path(node.data_dir).parent), start_new_session=True, close_fds=True,
                                    env=env)
        except OSError as e:
            raise LocalClusterError(f"node {node.id}: cannot run {argv[0]}: {e}")
    node.pid = proc.pid
    return proc


def ready_line(node_id: int) -> bytes:
    return f"xraft-node {node_id} ready ".encode()


def logged_ready(node: NodeInfo, since: int) -> bool:
    """Whether the node logged its ready line after byte offset `since` (anywhere in a
    line: the node's log format puts a timestamp and level before the message)."""
    try:
        with open(node.log, "rb") as f:
            f.seek(since)
            return any(ready_line(node.id) in line for line in f)
    except FileNotFoundError:
        return False


# -- talking to nodes -----------------------------------------------------------

def resp_client(addr: str, timeout: float = 1.0, **kwargs) -> redis.Redis:
    """A redis-py client for one node that never retries by itself: a blind retry of a
    write whose reply was lost could apply it twice (redis-py retries 3 times by default).
    RESP2, so no HELLO handshake: redis-py 8 would otherwise open every connection with HELLO 3."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    host, port = addr.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), socket_timeout=timeout, socket_connect_timeout=timeout,
                       retry=Retry(NoBackoff(), 0), protocol=2, **kwargs)


def raft_info(addr: str, timeout: float = 1.0) -> Optional[dict]:
    """INFO raft of the node at `addr`, or None if it does not answer."""
    client = resp_client(addr, timeout)
    try:
        return client.info("raft")
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()


def status(cluster: ClusterInfo, timeout: float = 1.0) -> list:
    """One dict per node: id, pid, alive, grpc, resp, role ("down" if it does not answer), leader_id, term, commit."""
    rows = []
    for node in cluster.nodes:
        alive = is_alive(cluster, node)
        info = raft_info(node.resp, timeout) if alive else None
        rows.append({
            "id": node.id, "pid": node.pid if alive else None, "alive": alive,
            "grpc": node.grpc, "resp": node.resp,
            "role": str(info.get("raft_role", "unknown")) if info else "down",
            "leader_id": info.get("raft_leader_id") if info else None,
            "term": info.get("raft_term") if info else None,
            "commit_index": info.get("raft_commit_index") if info else None,
            "applied_index": info.get("raft_applied_index") if info else None,
            "leads": groups_led(info) if info else None,
            "data_dir": node.data_dir, "log": node.log,
        })
    return rows


def groups_led(info: dict) -> list:
    """The data groups a node leads, from its INFO raft: a sharded node lists them
    (raft_groups_led "1,4", which redis-py parses to a list, an int or ""); a one-group
    node leads group 1 when its role is leader."""
    if "raft_groups_led" not in info:
        return [1] if info.get("raft_role") == "leader" else []
    led = info["raft_groups_led"]
    if isinstance(led, int):
        return [led]
    if isinstance(led, (list, tuple)):
        return sorted(int(g) for g in led)
    return sorted(int(g) for g in str(led).split(",") if g.strip())


def leader_of(rows: list) -> Optional[dict]:
    """The leader among status rows: the node saying it leads, in the highest term
    (a deposed leader that has not heard of the new term yet may still say so)."""
    leaders = [r for r in rows if r["role"] == "leader"]
    return max(leaders, key=lambda r: r["term"] or 0) if leaders else None


def find_leader(cluster: ClusterInfo, timeout: float = 1.0) -> Optional[dict]:
    return leader_of(status(cluster, timeout))


# -- up / down / kill -----------------------------------------------------------

def stop_nodes(cluster: ClusterInfo, nodes: list, timeout: float, progress: Progress) -> list:
    """SIGTERM `nodes`, wait up to `timeout` for all of them, SIGKILL the rest. Returns the ids killed."""
    pending = []
    for node in nodes:
        if is_alive(cluster, node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, signal.SIGTERM)
                # A node paused with `local kill --signal STOP` handles SIGTERM only once resumed.
                os.kill(node.pid, signal.SIGCONT)
            pending.append(node)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [n for n in pending if is_alive(cluster, n)]
    killed = []
    for node in pending:
        progress(f"node {node.id} (pid {node.pid}) did not exit within {timeout:g}s of SIGTERM: sending SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, signal.SIGKILL)
        killed.append(node.id)
    kill_deadline = time.monotonic() + 5.0
    while any(is_alive(cluster, n) for n in pending) and time.monotonic() < kill_deadline:
        time.sleep(0.05)
    return killed


def up(dir_: str, nodes: int = 3, base_port: Optional[int] = None, fsync: Optional[str] = None,
       timeout: float = 30.0, progress: Progress = lambda _msg: None,
       node_command: Optional[Iterable[str]] = None, node_args: Iterable[str] = (),
       wait_leader: bool = True, groups: Optional[int] = None,
       metrics_base_port: Optional[int] = None) -> ClusterInfo:
    """Start the cluster in dir_: a new one if dir_ holds none; else restart its nodes that
    are not running, on the same ports and data (refused if all are running). Waits until
    every started node logged ready and (wait_leader) a leader is known; on failure stops
    what it started and raises LocalClusterError with the failing node's log tail."""
    Path(dir_).mkdir(parents=True, exist_ok=True)
    with locked(dir_):
        if cluster_file(dir_).exists():
            cluster = load(dir_)
            if fsync is not None and fsync != cluster.fsync:
                cluster.fsync = fsync  # an operator may restart with another fsync policy
            if len(cluster.nodes) != nodes:
                progress(f"{dir_} holds a {len(cluster.nodes)}-node cluster; restarting it as it is")
            if node_command or node_args:
                progress("--node-command/--node-arg apply to new clusters only; using those in cluster.json")
            if groups is not None and groups != cluster.groups:
                progress(f"--groups {groups}: the cluster was founded with {cluster.groups} group(s); keeping them")
            to_start = [n for n in cluster.nodes if not is_alive(cluster, n)]
            if not to_start:
                raise LocalClusterError(f"the cluster in {cluster.dir} is already running "
                                        f"(pids {', '.join(str(n.pid) for n in cluster.nodes)}); "
                                        f"`xraftctl local down --dir {dir_}` first")
            if len(to_start) < len(cluster.nodes):
                progress(f"nodes {', '.join(str(n.id) for n in cluster.nodes if n not in to_start)} are running; "
                         f"restarting node(s) {', '.join(str(n.id) for n in to_start)} from disk")
            else:
                progress(f"restarting cluster {cluster.cluster_id} from disk in {cluster.dir}")
        else:
            cluster = new_cluster(dir_, nodes, base_port, fsync, node_command, node_args, groups or 1,
                                  metrics_base_port)
            to_start = list(cluster.nodes)
            progress(f"new cluster {cluster.cluster_id} in {cluster.dir}")
        started = []
        try:
            start_and_wait(cluster, to_start, started, timeout, progress, wait_leader)
        except BaseException:
            # Leave nothing half-started behind (also on ^C): the operator retries from a clean state.
            stop_nodes(cluster, started, 5.0, progress)
            if len(started) == len(cluster.nodes):
                cluster.state = "stopped"
            save(cluster)
            raise
        cluster.state = "running"
        save(cluster)
        return cluster


def start_and_wait(cluster, to_start, started, timeout, progress, wait_leader, start=start_node):
    offsets = {}
    procs = {}
    for node in to_start:
        offsets[node.id] = _log_size(node.log)
        procs[node.id] = start(cluster, node)
        started.append(node)
        progress(f"started node {node.id} (pid {node.pid}) grpc={node.grpc} resp={node.resp}")
    save(cluster)  # pids on disk now: a `down` from another shell can find them even while we wait
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    ready = set()
    last = None
    while True:
        for node in to_start:
            code = procs[node.id].poll()
            if code is not None:
                raise LocalClusterError(f"node {node.id} exited with status {code} while starting; "
                                        f"last lines of {node.log}:\n{log_tail(node.log)}")
            if node.id not in ready and logged_ready(node, offsets[node.id]):
                ready.add(node.id)
                if not node.founded:
                    node.founded = True  # its bootstrap is durable: restarts are from disk
                    save(cluster)
        leader = None
        if len(ready) == len(to_start):
            if not wait_leader:
                return
            leader = find_leader(cluster, timeout=0.5)
            if leader is not None:
                term = f"term {leader['term']}" if leader["term"] is not None else "one of the groups"
                progress(f"node {leader['id']} is leader ({term}) after {time.monotonic() - t0:.1f}s")
                return
        msg = f"waiting: {len(ready)}/{len(to_start)} nodes ready" + (", electing a leader" if len(ready) == len(to_start) else "")
        if msg != last:
            progress(msg)
            last = msg
        if time.monotonic() >= deadline:
            waiting = [n for n in to_start if n.id not in ready]
            what = (f"node(s) {', '.join(str(n.id) for n in waiting)} did not log ready" if waiting
                    else "no leader was elected")
            tails = "\n".join(f"  {n.log}:\n{log_tail(n.log)}" for n in (waiting or to_start))
            raise StartTimeout(f"timed out after {timeout:g}s: {what}; last log lines:\n{tails}",
                               [n.id for n in waiting])
        time.sleep(0.1)


def down(dir_: str, timeout: float = 10.0, progress: Progress = lambda _msg: None) -> list:
    """Stop every node (SIGTERM, then SIGKILL after `timeout`); returns the ids that needed SIGKILL."""
    load(dir_)  # a readable error when dir_ holds no cluster, before creating the lock file there
    with locked(dir_):
        cluster = load(dir_)
        running = [n for n in cluster.nodes if is_alive(cluster, n)]
        if running:
            progress(f"stopping node(s) {', '.join(str(n.id) for n in running)}")
        killed = stop_nodes(cluster, running, timeout, progress)
        for node in cluster.nodes:
            node.pid = None
        cluster.state = "stopped"
        save(cluster)
        return killed


SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "STOP": signal.SIGSTOP, "CONT": signal.SIGCONT}


def kill(dir_: str, node_id: int, sig: str = "KILL") -> NodeInfo:
    """Send a signal to one node (HA testing). The pid stays in cluster.json: status
    shows the node dead, and `up` restarts it from disk."""
    if sig.upper() not in SIGNALS:
        raise LocalClusterError(f"signal {sig!r}: expected one of {', '.join(SIGNALS)}")
    load(dir_)
    with locked(dir_):
        cluster = load(dir_)
        node = cluster.node(node_id)
        if not is_alive(cluster, node):
            raise LocalClusterError(f"node {node_id} is not running")
        os.kill(node.pid, SIGNALS[sig.upper()])
        if sig.upper() == "KILL":
            deadline = time.monotonic() + 5.0
            while is_alive(cluster, node) and time.monotonic() < deadline:
                time.sleep(0.02)
        return node


def connection_help(cluster: ClusterInfo, leader: Optional[dict]) -> str:
    """How to reach the cluster, printed after `up`."""
    first = leader["resp"] if leader else cluster.nodes[0].resp
    host, port = first.rsplit(":", 1)
    seeds = ",".join(n.grpc for n in cluster.nodes)
    lines = [
        f"cluster {cluster.cluster_id}: {len(cluster.nodes)} nodes, files in {cluster.dir}",
        (f"  redis-cli -c -h {host} -p {port}      ({cluster.groups} groups: -c follows -MOVED to each key's leader)"
         if cluster.groups > 1 else
         f"  redis-cli -h {host} -p {port}" + ("      (the leader)" if leader else "")),
        f"  RESP ports: {', '.join(n.resp for n in cluster.nodes)}",
        f"  SDK seeds (gRPC): {seeds}",
        f"    xraft.client.sync.Client(seeds={[n.grpc for n in cluster.nodes]!r})",
        f"  secret file: {cluster.secret_file}",
        f"  status: xraftctl local status --dir {cluster.dir}    stop: xraftctl local down --dir {cluster.dir}",
    ]
    return "\n".join(lines)
