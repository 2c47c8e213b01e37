"""xraftctl local: ports, cluster.json, node arguments and process supervision.

Supervision is tested against a stand-in node (STAND_IN below, written to a temp
file): it parses the real xraft-node flags, logs the ready line, answers
INFO raft on its RESP port (the lowest-id live node calls itself leader, so
killing it elects "another"), counts its starts in --data-dir, and exits 0 on
SIGTERM. Flags after the real ones pick misbehaviours (--fake=crash|never-ready|
ignore-term). The last tests run the real node when it exists.
"""
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from xraft.ops import cli
from xraft.ops import local_cluster as lc

STAND_IN = r'''
import argparse, asyncio, os, signal, socket, stat, sys
p = argparse.ArgumentParser()
for f in ("--id", "--cluster-id", "--data-dir", "--grpc", "--resp", "--peers", "--resp-peers", "--secret-file", "--fsync",
          "--initial-cluster-state", "--groups"):
    p.add_argument(f)
p.add_argument("--fake", default="")
a = p.parse_args()
if a.fake == "crash":
    print("boom: cannot open data dir", flush=True); sys.exit(3)
st = os.stat(a.secret_file)
if stat.S_IMODE(st.st_mode) != 0o600 or len(open(a.secret_file).read().strip()) < 32:
    print("bad secret file", flush=True); sys.exit(4)
counter = os.path.join(a.data_dir, "starts")
starts = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(starts))
with open(os.path.join(a.data_dir, "cluster-states"), "a") as f:
    f.write((a.initial_cluster_state or "-") + "\n")
me = int(a.id)
resp_peers = {int(k): v for k, v in (x.split("=") for x in a.resp_peers.split(","))}

def alive(addr):
    h, port = addr.rsplit(":", 1)
    try:
        socket.create_connection((h, int(port)), timeout=0.2).close(); return True
    except OSError:
        return False

async def serve(reader, writer):
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            argv = []
            for _ in range(int(line[1:])):
                n = int((await reader.readline())[1:])
                argv.append((await reader.readexactly(n + 2))[:-2].decode())
            if argv[0].upper() == "INFO":
                lower = [i for i in sorted(resp_peers) if i < me and alive(resp_peers[i])]
                leader = lower[0] if lower else me
                body = ("# Raft\r\nraft_node_id:%d\r\nraft_role:%s\r\nraft_leader_id:%d\r\nraft_term:%d\r\n"
                        "raft_commit_index:%d\r\nraft_applied_index:%d\r\n" % (
                            me, "leader" if leader == me else "follower", leader, 1 + len(resp_peers) - len(lower),
                            starts, starts)).encode()
                writer.write(b"$%d\r\n%s\r\n" % (len(body), body))
            else:
                writer.write(b"-ERR unknown command\r\n")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass

async def main():
    h, port = a.resp.rsplit(":", 1)
    server = await asyncio.start_server(serve, h, int(port), reuse_address=True)
    g = socket.socket(); g.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    gh, gp = a.grpc.rsplit(":", 1); g.bind((gh, int(gp))); g.listen()
    stop = asyncio.Event()
    if a.fake != "ignore-term":
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.fake != "never-ready":
        print("xraft-node %d ready grpc=%s resp=%s" % (me, a.grpc, a.resp), flush=True)
    await stop.wait()
    server.close()
    print("shutting down", flush=True)

asyncio.run(main())
'''


@pytest.fixture
def stand_in(tmp_path):
    path = tmp_path / "stand_in_node.py"
    path.write_text(STAND_IN)
    return [sys.executable, str(path)]


@pytest.fixture
def cluster_dir(tmp_path):
    d = tmp_path / "cluster"
    yield str(d)
    # Whatever a test did, leave no node behind.
    if lc.cluster_file(d).exists():
        cluster = lc.load(str(d))
        for node in cluster.nodes:
            if lc.is_alive(cluster, node):
                os.kill(node.pid, signal.SIGKILL)
                lc._reap(node.pid)


def _free(port):
    return lc.port_is_free(port)


# -- ports ------------------------------------------------------------------------

def test_pick_ports_are_distinct_and_free():
    ports = lc.pick_ports(8)
    assert len(set(ports)) == 8
    assert all(_free(p) for p in ports)


def test_pick_ports_from_base_refuses_a_busy_port():
    base = lc.pick_ports(1)[0]
    with socket.socket() as s:
        s.bind((lc.HOST, base))
        s.listen()
        with pytest.raises(lc.LocalClusterError, match=f"ports already in use: {base}"):
            lc.pick_ports(3, base_port=base)
    # free again once the listener is gone (tolerate a neighbour taken by someone else)
    if all(_free(p) for p in range(base, base + 3)):
        assert lc.pick_ports(3, base_port=base) == [base, base + 1, base + 2]


def test_pick_ports_range_checked():
    with pytest.raises(lc.LocalClusterError, match="within 1024..65535"):
        lc.pick_ports(4, base_port=65534)


# -- cluster.json and arguments ---------------------------------------------------

def test_new_cluster_layout_and_round_trip(tmp_path):
    d = tmp_path / "c"
    cluster = lc.new_cluster(str(d), 3, fsync="batch", node_args=["--tick-ms", "50"])
    assert stat.S_IMODE(os.stat(d / "secret").st_mode) == 0o600
    assert len((d / "secret").read_text().strip()) == 64
    assert [n.id for n in cluster.nodes] == [1, 2, 3]
    addrs = [n.grpc for n in cluster.nodes] + [n.resp for n in cluster.nodes]
    assert len(set(addrs)) == 6
    for n in cluster.nodes:
        assert Path(n.data_dir) == d.resolve() / f"node-{n.id}" / "data" and Path(n.data_dir).is_dir()
        assert Path(n.log) == d.resolve() / f"node-{n.id}" / "node.log"
    on_disk = json.loads((d / "cluster.json").read_text())
    assert on_disk["version"] == 1 and on_disk["cluster_id"] == cluster.cluster_id
    assert lc.load(str(d)) == cluster
    with pytest.raises(lc.LocalClusterError, match="already holds a cluster"):
        lc.new_cluster(str(d), 3)


def test_two_clusters_get_different_ids_and_secrets(tmp_path):
    a = lc.new_cluster(str(tmp_path / "a"), 1)
    b = lc.new_cluster(str(tmp_path / "b"), 1)
    assert a.cluster_id != b.cluster_id
    assert Path(a.secret_file).read_text() != Path(b.secret_file).read_text()


def test_new_cluster_refuses_stale_data(tmp_path):
    (tmp_path / "c" / "node-1" / "data").mkdir(parents=True)
    (tmp_path / "c" / "node-1" / "data" / "wal").write_text("x")
    with pytest.raises(lc.LocalClusterError, match="has node data but no cluster.json"):
        lc.new_cluster(str(tmp_path / "c"), 3)


def test_load_errors_are_readable(tmp_path):
    with pytest.raises(lc.LocalClusterError, match="no local cluster in"):
        lc.load(str(tmp_path))
    (tmp_path / "cluster.json").write_text("{not json")
    with pytest.raises(lc.LocalClusterError, match="not a valid cluster file"):
        lc.load(str(tmp_path))


def test_node_argv(tmp_path):
    cluster = lc.new_cluster(str(tmp_path / "c"), 3, fsync="always", node_args=["--tick-ms", "50"])
    n2 = cluster.node(2)
    argv = lc.node_argv(cluster, n2)
    assert argv[:3] == [sys.executable, "-m", "xraft.node.server.node_main"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--id"] == "2"
    assert flags["--cluster-id"] == cluster.cluster_id
    assert flags["--data-dir"] == n2.data_dir
    assert flags["--grpc"] == n2.grpc and flags["--resp"] == n2.resp
    assert flags["--peers"] == ",".join(f"{n.id}={n.grpc}" for n in cluster.nodes)
    assert flags["--resp-peers"] == ",".join(f"{n.id}={n.resp}" for n in cluster.nodes)
    assert flags["--secret-file"] == cluster.secret_file
    assert flags["--fsync"] == "always" and flags["--tick-ms"] == "50"
    assert flags["--initial-cluster-state"] == "new"  # a new cluster: its first start founds it
    n2.founded = True
    assert "--initial-cluster-state" not in lc.node_argv(cluster, n2)  # restarts are from disk
    with pytest.raises(lc.LocalClusterError, match="no node 7"):
        cluster.node(7)


def test_leader_of_prefers_highest_term():
    rows = [{"id": 1, "role": "leader", "term": 3}, {"id": 2, "role": "leader", "term": 5},
            {"id": 3, "role": "down", "term": None}]
    assert lc.leader_of(rows)["id"] == 2
    assert lc.leader_of([{"id": 1, "role": "follower", "term": 1}]) is None


# -- supervision with the stand-in ------------------------------------------------

def test_up_status_kill_down_restart(stand_in, cluster_dir):
    msgs = []
    cluster = lc.up(cluster_dir, 3, node_command=stand_in, timeout=20, progress=msgs.append)
    assert any("node 1 is leader" in m for m in msgs), msgs
    on_disk = lc.load(cluster_dir)
    assert on_disk.state == "running" and all(n.pid for n in on_disk.nodes)
    ports = [(n.grpc, n.resp) for n in on_disk.nodes]
    for n in on_disk.nodes:
        # detached: each node leads its own session, so ^C in the operator's shell misses it
        assert os.getsid(n.pid) == n.pid

    with pytest.raises(lc.LocalClusterError, match="already running"):
        lc.up(cluster_dir, 3, node_command=stand_in)

    result = CliRunner().invoke(cli.main, ["local", "status", "--dir", cluster_dir, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["id"], r["role"], r["alive"]) for r in rows] == [
        (1, "leader", True), (2, "follower", True), (3, "follower", True)]
    assert {"id", "pid", "grpc", "resp", "role"} <= set(rows[0])

    result = CliRunner().invoke(cli.main, ["local", "kill", "--dir", cluster_dir, "--node", "1"])
    assert result.exit_code == 0 and "SIGKILL" in result.output, result.output
    rows = lc.status(lc.load(cluster_dir))
    assert [(r["id"], r["role"], r["alive"]) for r in rows] == [
        (1, "down", False), (2, "leader", True), (3, "follower", True)]
    text = CliRunner().invoke(cli.main, ["local", "status", "--dir", cluster_dir]).output
    assert "leader: node 2" in text

    # up with one node dead restarts only that node, from its data
    lc.up(cluster_dir, 3, node_command=stand_in, timeout=20)
    assert [r["role"] for r in lc.status(lc.load(cluster_dir))] == ["leader", "follower", "follower"]
    assert (Path(cluster.node(1).data_dir) / "starts").read_text() == "2"
    assert (Path(cluster.node(2).data_dir) / "starts").read_text() == "1"

    pids = [n.pid for n in lc.load(cluster_dir).nodes]
    assert lc.down(cluster_dir, timeout=5) == []
    after = lc.load(cluster_dir)
    assert after.state == "stopped" and all(n.pid is None for n in after.nodes)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert all(r["role"] == "down" for r in lc.status(after))
    assert "shutting down" in Path(cluster.node(3).log).read_text()  # SIGTERM handled: a clean stop

    # restart from disk: same ports, same data
    lc.up(cluster_dir, 3, node_command=stand_in, timeout=20)
    again = lc.load(cluster_dir)
    assert [(n.grpc, n.resp) for n in again.nodes] == ports
    assert all((Path(n.data_dir) / "starts").read_text() == ("3" if n.id == 1 else "2") for n in again.nodes)
    # Only the first start of each node founded the cluster; every restart is from disk.
    assert (Path(cluster.node(1).data_dir) / "cluster-states").read_text().split() == ["new", "-", "-"]
    assert (Path(cluster.node(2).data_dir) / "cluster-states").read_text().split() == ["new", "-"]
    assert all(n.founded for n in again.nodes)
    result = CliRunner().invoke(cli.main, ["local", "down", "--dir", cluster_dir])
    assert result.exit_code == 0 and "stopped" in result.output


def test_down_kills_a_node_that_ignores_sigterm(stand_in, cluster_dir):
    lc.up(cluster_dir, 2, node_command=stand_in, node_args=["--fake", "ignore-term"], timeout=20)
    pids = [n.pid for n in lc.load(cluster_dir).nodes]
    msgs = []
    t0 = time.monotonic()
    assert lc.down(cluster_dir, timeout=0.5, progress=msgs.append) == [1, 2]
    assert time.monotonic() - t0 < 5
    assert any("sending SIGKILL" in m for m in msgs)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_down_stops_a_paused_node(stand_in, cluster_dir):
    lc.up(cluster_dir, 1, node_command=stand_in, timeout=20)
    lc.kill(cluster_dir, 1, "STOP")
    assert lc.down(cluster_dir, timeout=5) == []  # SIGCONT after SIGTERM: a clean stop, no SIGKILL


def test_up_reports_a_node_that_exits(stand_in, cluster_dir):
    with pytest.raises(lc.LocalClusterError, match=r"(?s)exited with status 3.*boom: cannot open data dir"):
        lc.up(cluster_dir, 3, node_command=stand_in, node_args=["--fake", "crash"], timeout=20)
    cluster = lc.load(cluster_dir)
    assert cluster.state == "stopped"
    assert not any(lc.is_alive(cluster, n) for n in cluster.nodes)


def test_up_times_out_and_stops_what_it_started(stand_in, cluster_dir):
    result = CliRunner().invoke(cli.main, ["local", "up", "--dir", cluster_dir, "--nodes", "2", "--timeout", "1",
                                           "--node-command", " ".join(stand_in), "--node-arg=--fake",
                                           "--node-arg=never-ready"])
    assert result.exit_code == 1
    assert "timed out after 1s: node(s) 1, 2 did not log ready" in result.output
    cluster = lc.load(cluster_dir)
    assert not any(lc.is_alive(cluster, n) for n in cluster.nodes)


def test_up_refuses_a_port_taken_since(stand_in, cluster_dir):
    lc.up(cluster_dir, 1, node_command=stand_in, timeout=20)
    lc.down(cluster_dir)
    port = int(lc.load(cluster_dir).node(1).resp.rsplit(":", 1)[1])
    with socket.socket() as s:
        s.bind((lc.HOST, port))
        s.listen()
        with pytest.raises(lc.LocalClusterError, match=f"port {port} .* is in use"):
            lc.up(cluster_dir, 1, node_command=stand_in, timeout=20)


def test_is_alive_ignores_a_recycled_pid(tmp_path):
    cluster = lc.new_cluster(str(tmp_path / "c"), 1)
    cluster.nodes[0].pid = os.getpid()  # alive, but not this cluster's node
    assert not lc.is_alive(cluster, cluster.nodes[0])


def test_cli_errors_are_readable(tmp_path):
    result = CliRunner().invoke(cli.main, ["local", "status", "--dir", str(tmp_path)])
    assert result.exit_code == 1 and "no local cluster in" in result.output
    result = CliRunner().invoke(cli.main, ["local", "kill", "--dir", str(tmp_path), "--node", "1", "--signal", "HUP"])
    assert result.exit_code == 2


# -- the real node (select with -k e2e) -------------------------------------------

def _ctl(*args, timeout=60):
    """xraftctl as an operator runs it: a separate process (python -m xraft.ops)."""
    return subprocess.run([sys.executable, "-m", "xraft.ops", *args], capture_output=True, text=True,
                          timeout=timeout)


def _leader(rows):
    leaders = [r for r in rows if r["role"] == "leader"]
    return leaders[0] if len(leaders) == 1 else None


def test_e2e_real_nodes_failover_and_restart(cluster_dir):
    """up -> status --json -> kill -9 the leader -> a new leader -> down -> up from disk keeps the data."""
    r = _ctl("local", "up", "--dir", cluster_dir, "--nodes", "3", "--groups", "1", "--timeout", "40")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "redis-cli -h 127.0.0.1 -p" in r.stdout and "is leader" in r.stderr
    rows = json.loads(_ctl("local", "status", "--dir", cluster_dir, "--json").stdout)
    old = _leader(rows)
    assert old is not None, rows
    assert sorted(r["role"] for r in rows) == ["follower", "follower", "leader"]

    client = lc.resp_client(old["resp"], 2.0, decode_responses=True)
    ids = [client.xadd("s", {"n": i}) for i in range(20)]
    client.close()

    r = _ctl("local", "kill", "--dir", cluster_dir, "--node", str(old["id"]))
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 15
    new = None
    while time.monotonic() < deadline and new is None:
        rows = json.loads(_ctl("local", "status", "--dir", cluster_dir, "--json").stdout)
        new = _leader(rows)
        time.sleep(0.2)
    assert new is not None and new["id"] != old["id"], rows
    assert [r["role"] for r in rows if r["id"] == old["id"]] == ["down"]

    r = _ctl("local", "down", "--dir", cluster_dir)
    assert r.returncode == 0 and "stopped" in r.stdout, r.stderr
    assert all(r["role"] == "down" and not r["alive"] for r in lc.status(lc.load(cluster_dir)))

    r = _ctl("local", "up", "--dir", cluster_dir, "--timeout", "40")
    assert r.returncode == 0 and "restarting cluster" in r.stderr, r.stdout + r.stderr
    leader = _leader(lc.status(lc.load(cluster_dir)))
    client = lc.resp_client(leader["resp"], 2.0, decode_responses=True)
    assert [e[0] for e in client.xrange("s")] == ids  # acknowledged before the crash, kept across restarts
    client.close()
    assert _ctl("local", "down", "--dir", cluster_dir).returncode == 0


def test_node_argv_passes_groups_only_when_not_one(tmp_path):
    one = lc.new_cluster(str(tmp_path / "a"), 3)
    assert "--groups" not in lc.node_argv(one, one.node(1))     # the default: the node's own
    six = lc.new_cluster(str(tmp_path / "b"), 3, groups=6)
    argv = lc.node_argv(six, six.node(1))
    assert argv[argv.index("--groups") + 1] == "6"
    assert lc.load(six.dir).groups == 6                         # kept for restarts
    with pytest.raises(lc.LocalClusterError, match="--groups 0"):
        lc.new_cluster(str(tmp_path / "c"), 3, groups=0)


def test_local_up_founds_two_groups_per_node_unless_told(stand_in, tmp_path):
    """Issue 10: `local up` is sharded by default (2 data groups per node); --groups 1 keeps the
    one-group cluster; a restart keeps what the cluster was founded with."""
    runner = CliRunner()
    cases = {"default": ([], 6), "one": (["--groups", "1"], 1), "five": (["--groups", "5"], 5)}
    for name, (extra, want) in cases.items():
        d = str(tmp_path / name)
        r = runner.invoke(cli.main, ["local", "up", "--dir", d, "--nodes", "3", "--timeout", "20",
                                     "--node-command", " ".join(stand_in)] + extra)
        try:
            assert r.exit_code == 0, r.output
            cluster = lc.load(d)
            assert cluster.groups == want, name
            argv = lc.node_argv(cluster, cluster.node(1))
            assert (argv[argv.index("--groups") + 1] if "--groups" in argv else "1") == str(want)
        finally:
            lc.down(d)
    r = runner.invoke(cli.main, ["local", "up", "--dir", str(tmp_path / "one"), "--timeout", "20"])
    try:
        assert r.exit_code == 0, r.output
        assert lc.load(str(tmp_path / "one")).groups == 1  # restarted as founded, not re-defaulted
    finally:
        lc.down(str(tmp_path / "one"))
    assert lc.default_groups(9) == 18


def test_groups_led_from_info():
    assert lc.groups_led({"raft_role": "leader"}) == [1]        # a one-group node
    assert lc.groups_led({"raft_role": "follower"}) == []
    assert lc.groups_led({"raft_role": "leader", "raft_groups_led": [4, 1]}) == [1, 4]
    assert lc.groups_led({"raft_role": "leader", "raft_groups_led": 3}) == [3]
    assert lc.groups_led({"raft_role": "follower", "raft_groups_led": ""}) == []


def test_e2e_sharded_local_cluster_spreads_leaders(cluster_dir):
    """up --groups 6 -> status --json: each of the 3 nodes ends up leading two groups."""
    r = _ctl("local", "up", "--dir", cluster_dir, "--nodes", "3", "--groups", "6", "--timeout", "40")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        deadline = time.monotonic() + 40
        leads = None
        while time.monotonic() < deadline:
            rows = json.loads(_ctl("local", "status", "--dir", cluster_dir, "--json").stdout)
            leads = {r["id"]: r["leads"] for r in rows}
            if leads == {1: [1, 4], 2: [2, 5], 3: [3, 6]}:
                break
            time.sleep(0.3)
        assert leads == {1: [1, 4], 2: [2, 5], 3: [3, 6]}
        table = _ctl("local", "status", "--dir", cluster_dir).stdout
        assert "LEADS" in table and " 1,4" in table
        # no single "leader:" line for a sharded cluster: each node leads some groups
        assert "leader: node" not in table and "6 groups; redis-cli -c" in table
    finally:
        assert _ctl("local", "down", "--dir", cluster_dir).returncode == 0
