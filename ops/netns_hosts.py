"""A multi-host xraft cluster on one machine: each node in its own network namespace (root only).

    DIR/hosts.json          the namespaces, links, loop mounts this harness made (written
                            BEFORE each is made, so `down` removes them even after a crash)
                            and each node's namespace and address
    DIR/cluster.json        the nodes, as ops/local_cluster.py keeps them (same node command
                            lines: node_argv), addresses on the bridge instead of loopback
    DIR/node-<id>/disk.img  the node's own small ext4 filesystem, loop-mounted on
    DIR/node-<id>/mnt       (its --data-dir is mnt/data): a full disk is ENOSPC for it alone
    DIR/node-<id>/faketime  libfaketime's offset for the node ("+0", "-5s", ...), read live

The network: a bridge in the root namespace holding 10.<a>.<b>.1/24 (clients run in the
root namespace and reach every node through it), and per node a veth pair, one end on
the bridge and the other, eth0, in namespace <prefix>-n<id> with 10.<a>.<b>.<10+id>.
Network faults (ops/faults.py) are nft rules, qdiscs and TUN shapers inside the node
namespaces, so they die with the namespaces too (`down` kills what still runs in one).

`up` first sweeps what crashed harnesses left (sweep): their names, creators and dirs are
recorded in /run/xraft-hosts/<prefix>.json (REGISTRY_DIR).

Nodes run under `ip netns exec`, which execs the node in place: the pid recorded in
cluster.json is the node itself, and `xraftctl local status/kill --dir DIR` work too.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

from . import local_cluster as lc

HOSTS_FILE = "hosts.json"
FORMAT_VERSION = 1
GRPC_PORT = 7000
RESP_PORT = 6379
FAKETIME_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime",
                     "/usr/lib/faketime")
DEFAULT_DISK_MB = 64
MAX_NODES = 9
# Who made each harness prefix (its dir and process), so `up` can tell a crashed harness's
# leftovers from a live one's (sweep). Under /run: gone at a reboot, as the namespaces are.
REGISTRY_DIR = Path("/run/xraft-hosts")
# Exactly the names up() makes (prefix "xr" + 6 hex digits): namespaces, bridge, veths.
HARNESS_NAME = re.compile(r"^(xr[0-9a-f]{6})(-n\d+|br|v\d+)$")
# A prefix no registry entry explains (a harness older than the registry) is stale only when
# nothing runs in its namespaces and the newest is this old (an old-style `up` in progress
# has no processes yet either).
UNKNOWN_STALE_S = 1800.0
# node/runtime/unsynced_loss.ENV (ops may not import node/; tests/ops compares the two)
UNSYNCED_LOSS_ENV = "XRAFT_UNSYNCED_LOSS"


class HostsError(lc.LocalClusterError):
    """A namespace-harness operation failed; the message says which command and why."""


def available() -> Optional[str]:
    """None when this machine can run the harness, else why not (tests skip with it)."""
    if os.geteuid() != 0:
        return "the namespace harness needs root (ip netns, veth, mount)"
    for tool in ("ip", "nft", "mount", "losetup", "mkfs.ext4"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"xraftprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*argv: str, netns: Optional[str] = None, check: bool = True, input_: Optional[str] = None) -> str:
    """Run a command (inside `netns` when given); HostsError with its stderr when it fails."""
    full = (["ip", "netns", "exec", netns] if netns else []) + list(argv)
    r = subprocess.run(full, capture_output=True, text=True, input=input_, timeout=30)
    if check and r.returncode != 0:
        raise HostsError(f"`{' '.join(full)}` failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


# -- hosts.json: the resources, recorded before they exist -------------------------

def hosts_file(dir_: str) -> Path:
    return Path(dir_) / HOSTS_FILE


def load_hosts(dir_: str) -> dict:
    try:
        d = json.loads(hosts_file(dir_).read_text())
    except FileNotFoundError:
        raise HostsError(f"no namespace cluster in {dir_} ({HOSTS_FILE} not found; `xraftctl hosts up` makes one)")
    except ValueError as e:
        raise HostsError(f"{hosts_file(dir_)} is not valid JSON: {e}")
    if d.get("version") != FORMAT_VERSION:
        raise HostsError(f"{hosts_file(dir_)} has version {d.get('version')!r}, expected {FORMAT_VERSION}")
    return d


def save_hosts(dir_: str, hosts: dict) -> None:
    path = hosts_file(dir_)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(hosts, indent=2) + "\n")
    os.replace(tmp, path)


def _record(dir_: str, hosts: dict, resource: dict) -> None:
    """Note a resource in hosts.json before making it: a crash between the two leaves a
    record of something that may not exist, which `down` tolerates; never the reverse."""
    hosts["resources"].append(resource)
    save_hosts(dir_, hosts)


def _free_subnet() -> tuple:
    used = sh("ip", "-4", "-o", "addr")
    for _ in range(200):
        a, b = 10, random.randint(100, 250)
        c = random.randint(0, 255)
        if f" 10.{b}.{c}." not in used:
            return f"{a}.{b}.{c}"
    raise HostsError("no free 10.x.y.0/24 subnet found for the bridge")


# -- up ------------------------------------------------------------------------------

def up(dir_: str, nodes: int = 5, groups: int = 1, disk_mb: int = DEFAULT_DISK_MB, fsync: Optional[str] = None,
       node_args: tuple = (), timeout: float = 60.0, progress: lc.Progress = lambda _m: None,
       spares: int = 0) -> lc.ClusterInfo:
    """Make the namespaces, bridge, veths and filesystems, then start and wait for the nodes.
    `spares`: that many more namespaces and disks (ids nodes+1...), "spare" in hosts.json and
    not in cluster.json: for nodes that join later (the nemesis' member kind, spare_node).
    On failure everything made so far is removed again."""
    why = available()
    if why:
        raise HostsError(why)
    if not 1 <= nodes <= MAX_NODES or not 0 <= spares <= MAX_NODES - nodes:
        raise HostsError(f"--nodes {nodes} with {spares} spare(s): expected 1 to {MAX_NODES} in all")
    if not 8 <= disk_mb <= 4096:
        raise HostsError(f"--disk-mb {disk_mb}: expected 8 to 4096")
    root = Path(dir_).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if hosts_file(root).exists() or lc.cluster_file(root).exists():
        raise HostsError(f"{root} already holds a cluster; `xraftctl hosts down --dir {root}` first, or use another")
    prefix = "xr" + secrets.token_hex(3)            # interface names must stay within 15 bytes
    subnet = _free_subnet()
    hosts = {"version": FORMAT_VERSION, "dir": str(root), "prefix": prefix, "subnet": subnet + ".0/24",
             "bridge": prefix + "br", "bridge_address": subnet + ".1", "resources": [], "nodes": []}
    save_hosts(str(root), hosts)
    try:
        _register(prefix, str(root))
        sweep(progress)
        _make_network(str(root), hosts, nodes + spares, progress)
        for h in hosts["nodes"][nodes:]:
            h["spare"] = True
        save_hosts(str(root), hosts)
        cluster = _make_cluster(str(root), hosts, nodes, groups, fsync, node_args)
        for node in cluster.nodes + [spare_node(str(root), h["id"]) for h in hosts["nodes"][nodes:]]:
            _make_disk(str(root), hosts, node, disk_mb)
        lc.save(cluster)
        started: list = []
        lc.start_and_wait(cluster, list(cluster.nodes), started, timeout, progress, True, start=start_node)
        cluster.state = "running"
        lc.save(cluster)
        return cluster
    except BaseException:
        progress("start failed: removing what was made")
        with contextlib.suppress(Exception):
            down(str(root), progress=progress)
        raise


def _make_network(dir_: str, hosts: dict, nodes: int, progress) -> None:
    bridge, subnet = hosts["bridge"], hosts["subnet"].rsplit(".", 1)[0]
    _record(dir_, hosts, {"kind": "link", "name": bridge})
    sh("ip", "link", "add", bridge, "type", "bridge")
    sh("ip", "addr", "add", hosts["bridge_address"] + "/24", "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    for i in range(1, nodes + 1):
        ns, host_end, ns_end = f"{hosts['prefix']}-n{i}", f"{hosts['prefix']}v{i}", f"{hosts['prefix']}p{i}"
        address = f"{subnet}.{10 + i}"
        _record(dir_, hosts, {"kind": "netns", "name": ns})
        sh("ip", "netns", "add", ns)
        _record(dir_, hosts, {"kind": "link", "name": host_end})
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        sh("ip", "link", "set", host_end, "master", bridge)
        sh("ip", "link", "set", host_end, "up")
        sh("ip", "link", "set", ns_end, "netns", ns)
        sh("ip", "link", "set", ns_end, "name", "eth0", netns=ns)
        sh("ip", "addr", "add", address + "/24", "dev", "eth0", netns=ns)
        sh("ip", "link", "set", "eth0", "up", netns=ns)
        sh("ip", "link", "set", "lo", "up", netns=ns)
        hosts["nodes"].append({"id": i, "netns": ns, "address": address, "veth": host_end})
        save_hosts(dir_, hosts)
        progress(f"namespace {ns}: {address} on {bridge}")


def _make_cluster(dir_: str, hosts: dict, nodes: int, groups: int, fsync, node_args) -> lc.ClusterInfo:
    root = Path(dir_)
    secret_path = root / lc.SECRET_FILE
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    infos = []
    for h in hosts["nodes"][:nodes]:
        node_dir = root / f"node-{h['id']}"
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "faketime").write_text("+0\n")
        infos.append(lc.NodeInfo(id=h["id"], grpc=f"{h['address']}:{GRPC_PORT}", resp=f"{h['address']}:{RESP_PORT}",
                                 data_dir=str(node_dir / "mnt" / "data"), log=str(node_dir / "node.log"),
                                 founded=False))
    return lc.ClusterInfo(dir=str(root), cluster_id="netns-" + secrets.token_hex(6), secret_file=str(secret_path),
                          nodes=infos, node_args=list(node_args), fsync=fsync, groups=groups)


def spare_node(dir_: str, node_id: int, join: Optional[str] = None) -> lc.NodeInfo:
    """The NodeInfo of spare namespace `node_id` (its address, ports and disk as a founding node's)."""
    h = next((h for h in load_hosts(dir_)["nodes"] if h["id"] == node_id), None)
    if h is None:
        raise HostsError(f"no namespace for node {node_id} in {dir_}")
    node_dir = Path(dir_) / f"node-{node_id}"
    node_dir.mkdir(parents=True, exist_ok=True)
    if not (node_dir / "faketime").exists():
        (node_dir / "faketime").write_text("+0\n")
    return lc.NodeInfo(id=node_id, grpc=f"{h['address']}:{GRPC_PORT}", resp=f"{h['address']}:{RESP_PORT}",
                       data_dir=str(node_dir / "mnt" / "data"), log=str(node_dir / "node.log"), join=join)


def _make_disk(dir_: str, hosts: dict, node: lc.NodeInfo, disk_mb: int) -> None:
    node_dir = Path(node.data_dir).parent.parent
    image, mnt = node_dir / "disk.img", node_dir / "mnt"
    with open(image, "wb") as f:
        f.truncate(disk_mb * 1024 * 1024)
    sh("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
    mnt.mkdir(exist_ok=True)
    _record(dir_, hosts, {"kind": "mount", "path": str(mnt)})
    sh("mount", "-o", "loop", str(image), str(mnt))
    Path(node.data_dir).mkdir(exist_ok=True)


def faketime_env(dir_: str, node_id: int) -> dict:
    """The node's environment: libfaketime preloaded and reading its offset from a file that
    the clock nemesis rewrites (FAKETIME_NO_CACHE: read on every call, so a change lands at
    once). Only the wall clock is faked (FAKETIME_DONT_FAKE_MONOTONIC): Raft's timers, asyncio
    and gRPC's deadlines run on the monotonic clock, and a skewed wall clock is what real
    machines have. Without libfaketime the node runs unfaked (clock faults then refuse)."""
    env = dict(os.environ)
    lib = faketime_lib()
    if lib:
        env.update(LD_PRELOAD=lib, FAKETIME_TIMESTAMP_FILE=str(Path(dir_) / f"node-{node_id}" / "faketime"),
                   FAKETIME_NO_CACHE="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
    return env


def faketime_lib() -> Optional[str]:
    for d in FAKETIME_LIB_DIRS:
        p = Path(d) / "libfaketime.so.1"
        if p.exists():
            return str(p)
    return None


def netns_of(dir_: str, node_id: int) -> str:
    for h in load_hosts(dir_)["nodes"]:
        if h["id"] == node_id:
            return h["netns"]
    raise HostsError(f"no node {node_id} in {dir_}")


def power_cut_marker(dir_: str, node_id: int) -> Path:
    """The file whose presence makes the node's next start lose every WAL write it never
    fsynced (node/runtime/unsynced_loss.py, a TEST-ONLY fault layer; ops/faults.py
    power_cut writes it before the SIGKILL, restart_dead removes it)."""
    return Path(dir_) / f"node-{node_id}" / "power-cut"


def start_node(cluster: lc.ClusterInfo, node: lc.NodeInfo):
    """Start one node inside its namespace (lc.start_node with `ip netns exec`), with the
    unsynced-loss layer armed (it journals; it loses data only after a power_cut)."""
    env = faketime_env(cluster.dir, node.id)
    env[UNSYNCED_LOSS_ENV] = str(power_cut_marker(cluster.dir, node.id))
    return lc.start_node(cluster, node, argv_prefix=["ip", "netns", "exec", netns_of(cluster.dir, node.id)],
                         env=env)


LOCK_POLL_S = 0.1


@contextlib.contextmanager
def locked_waiting(dir_: str, wait_s: float):
    """lc.locked, waiting up to wait_s for it instead of failing at once: the nemesis' threads
    (a heal's restarts, a member change's start) take turns on one cluster.json."""
    deadline = time.monotonic() + wait_s
    with contextlib.ExitStack() as stack:
        while True:
            try:
                stack.enter_context(lc.locked(dir_))
                break
            except lc.LocalClusterError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(LOCK_POLL_S)
        yield


def restart(dir_: str, node_ids: list, timeout: float = 60.0, progress: lc.Progress = lambda _m: None) -> None:
    """Start the given nodes again from their data (after a kill) and wait until they are ready
    (the lock: waited for as long, a member change may be starting a node)."""
    with locked_waiting(dir_, timeout):
        cluster = lc.load(dir_)
        todo = [n for n in cluster.nodes if n.id in node_ids and not lc.is_alive(cluster, n)]
        lc.start_and_wait(cluster, todo, [], timeout, progress, False, start=start_node)
        lc.save(cluster)


# -- status --------------------------------------------------------------------------

def status(dir_: str, timeout: float = 1.0) -> list:
    """lc.status rows with each node's netns and address added."""
    hosts = load_hosts(dir_)
    cluster = lc.load(dir_)
    by_id = {h["id"]: h for h in hosts["nodes"]}
    rows = lc.status(cluster, timeout)
    for r in rows:
        r["netns"] = by_id[r["id"]]["netns"]
        r["address"] = by_id[r["id"]]["address"]
    return rows


# -- down ------------------------------------------------------------------------------

def down(dir_: str, progress: lc.Progress = lambda _m: None) -> list:
    """Stop the nodes, then remove every recorded resource, newest first. Resources that
    are already gone are fine (a crash may have come before they were made). Returns
    what could not be removed (empty when all went)."""
    hosts = load_hosts(dir_)
    with contextlib.suppress(lc.LocalClusterError):
        cluster = lc.load(dir_)
        lc.stop_nodes(cluster, cluster.nodes, 5.0, progress)
        for n in cluster.nodes:
            n.pid = None
        cluster.state = "stopped"
        lc.save(cluster)
    left = []
    for res in reversed(hosts["resources"]):
        if not _remove(res):
            left.append(res)
        else:
            progress(f"removed {res['kind']} {res.get('name') or res.get('path')}")
    hosts["resources"] = list(reversed(left))
    save_hosts(dir_, hosts)
    if not left:
        (REGISTRY_DIR / f"{hosts['prefix']}.json").unlink(missing_ok=True)
    return left


# -- sweep: what crashed harnesses left ---------------------------------------------------

def _process_start(pid: int) -> Optional[str]:
    """The process' start time (clock ticks since boot): a pid reused later has another."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _register(prefix: str, dir_: str) -> None:
    REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    entry = {"dir": dir_, "pid": os.getpid(), "started": _process_start(os.getpid())}
    (REGISTRY_DIR / f"{prefix}.json").write_text(json.dumps(entry) + "\n")


def _registered(prefix: str) -> Optional[dict]:
    try:
        entry = json.loads((REGISTRY_DIR / f"{prefix}.json").read_text())
        return entry if isinstance(entry, dict) and {"dir", "pid", "started"} <= set(entry) else None
    except (OSError, ValueError):
        return None


def _owns(dir_: str, prefix: str) -> bool:
    """Whether dir_ still holds the harness that made `prefix` (its hosts.json names it)."""
    try:
        return json.loads(hosts_file(dir_).read_text()).get("prefix") == prefix
    except (OSError, ValueError, AttributeError):
        return False


def _stale(prefix: str, namespaces: list) -> bool:
    entry = _registered(prefix)
    if entry is not None and not _owns(entry["dir"], prefix):
        return True          # its directory is gone (or reused): nothing could ever `down` it
    if any(sh("ip", "netns", "pids", ns, check=False).split() for ns in namespaces):
        return False         # nodes or relays still run there: a cluster in use
    if entry is not None:
        return _process_start(entry["pid"]) != entry["started"]
    ages = [time.time() - os.stat(f"/run/netns/{ns}").st_mtime for ns in namespaces
            if os.path.exists(f"/run/netns/{ns}")]
    return bool(ages) and min(ages) > UNKNOWN_STALE_S


def _loop_mounts(prefix: str, dirs: set) -> list:
    """Mount points DIR/node-<id>/mnt of a loop device, for DIR in dirs or holding prefix's hosts.json."""
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[0].startswith("/dev/loop"):
            continue
        mnt = Path(fields[1])
        if mnt.name != "mnt" or not re.fullmatch(r"node-\d+", mnt.parent.name):
            continue
        if str(mnt.parent.parent) in dirs or _owns(str(mnt.parent.parent), prefix):
            out.append(str(mnt))
    return out


def sweep(progress: lc.Progress = lambda _m: None) -> list:
    """Remove the namespaces, links and loop mounts of harnesses that crashed (names up()
    makes, and only those): a prefix whose creating process is gone and in whose namespaces
    nothing runs, or whose directory is gone. Returns the prefixes swept."""
    found: dict = {}         # prefix -> {"netns": [...], "link": [...]}
    for line in sh("ip", "netns", "list").splitlines():
        m = HARNESS_NAME.match(line.split()[0]) if line.strip() else None
        if m and m.group(2).startswith("-n"):
            found.setdefault(m.group(1), {"netns": [], "link": []})["netns"].append(m.group(0))
    for line in sh("ip", "-o", "link", "show").splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        m = HARNESS_NAME.match(name)
        if m and not m.group(2).startswith("-n"):
            found.setdefault(m.group(1), {"netns": [], "link": []})["link"].append(name)
    # Registered harnesses with nothing left in the kernel: another sweep (a parallel `up`)
    # removed their namespaces but not all the rest (the two raced), so the registry entry
    # and maybe a mount are all that is left.
    if REGISTRY_DIR.is_dir():
        for entry_file in REGISTRY_DIR.glob("xr*.json"):
            if re.fullmatch(r"xr[0-9a-f]{6}", entry_file.stem):
                found.setdefault(entry_file.stem, {"netns": [], "link": []})
    swept = []
    for prefix, names in sorted(found.items()):
        if not _stale(prefix, names["netns"]):
            continue
        entry = _registered(prefix)
        dirs = {entry["dir"]} if entry else set()
        # netns first (kills what runs there, which may hold the mounts), then mounts, then
        # the links (veths die with their namespace; the bridge goes last).
        resources = [{"kind": "netns", "name": n} for n in names["netns"]] + \
            [{"kind": "mount", "path": p} for p in _loop_mounts(prefix, dirs)] + \
            [{"kind": "link", "name": n} for n in sorted(names["link"], key=lambda n: n.endswith("br"))]
        left = [r for r in resources if not _remove(r)]
        progress(f"swept stale harness {prefix}: {len(resources) - len(left)} namespace(s), link(s), mount(s)")
        if not left:
            (REGISTRY_DIR / f"{prefix}.json").unlink(missing_ok=True)
            swept.append(prefix)
    return swept


def _remove(res: dict) -> bool:
    kind = res["kind"]
    if kind == "mount":
        if not os.path.ismount(res["path"]):
            return True
        for _ in range(50):
            if subprocess.run(["umount", res["path"]], capture_output=True).returncode == 0:
                return True
            time.sleep(0.1)   # a node that was just killed may still hold files open
        return subprocess.run(["umount", "-l", res["path"]], capture_output=True).returncode == 0 \
            or not os.path.ismount(res["path"])
    if kind == "netns":
        if res["name"] not in sh("ip", "netns", "list"):
            return True
        # Whatever still runs in it (a netem shaper of ops/faults.py a crashed harness left,
        # a node it never stopped) would keep the namespace alive after `ip netns del`.
        for pid in sh("ip", "netns", "pids", res["name"], check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        # A failed del counts as done when the namespace is gone anyway: a parallel sweep (another
        # `up`) removing the same stale harness won the race.
        return subprocess.run(["ip", "netns", "del", res["name"]], capture_output=True).returncode == 0 \
            or res["name"] not in sh("ip", "netns", "list")
    if kind == "link":
        def gone() -> bool:
            return subprocess.run(["ip", "link", "show", res["name"]], capture_output=True).returncode != 0
        if gone():
            return True
        return subprocess.run(["ip", "link", "del", res["name"]], capture_output=True).returncode == 0 or gone()
    raise HostsError(f"unknown resource kind {kind!r} in {HOSTS_FILE}")
