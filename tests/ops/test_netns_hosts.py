"""The namespace harness (ops/netns_hosts.py) and its faults (ops/faults.py) on real
namespaces and real nodes. Root only: skipped where `ip netns` cannot run."""
import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from xraft.ops import cli
from xraft.ops import faults as fl
from xraft.ops import local_cluster as lc
from xraft.ops import netns_hosts as nh
from xraft.ops import nemesis_run as nr
from xraft.ops import nemesis_workload as wl

WHY_NOT = nh.available()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"namespace harness: {WHY_NOT}")


def netns_names() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def assert_all_removed(hosts: dict) -> None:
    prefix = hosts["prefix"]
    assert prefix not in netns_names()
    assert prefix not in links()
    mounts = open("/proc/mounts").read()
    assert hosts["dir"] not in mounts


def wait_for(fn, what, limit=60.0):
    # A liveness bound, not a timing assertion: the condition is what is checked.
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"never: {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hosts"))
    nh.up(d, nodes=3, disk_mb=32)
    hosts = nh.load_hosts(d)
    yield d
    nh.down(d)
    assert_all_removed(hosts)


def leader_row(d):
    return lc.leader_of(nh.status(d, timeout=0.5))


def test_status_lists_each_node_in_its_namespace(cluster):
    result = CliRunner().invoke(cli.main, ["hosts", "status", "--dir", cluster, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["id"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert {"id", "netns", "address", "pid", "grpc", "resp", "role"} <= set(r)
        assert r["netns"] in netns_names() and r["grpc"] == f"{r['address']}:{nh.GRPC_PORT}"
        # The node's process lives in its namespace, not the root one.
        assert os.readlink(f"/proc/{r['pid']}/ns/net") != os.readlink("/proc/self/ns/net")
    assert len({r["address"] for r in rows}) == 3
    assert wait_for(lambda: leader_row(cluster), "a leader")


def test_isolated_leader_loses_leadership_and_heals(cluster):
    f = fl.Faults(cluster)
    old = wait_for(lambda: leader_row(cluster), "a leader")
    f.partition(f.complete_grudge([{old["id"]}, set(f.ids) - {old["id"]}]))
    try:
        new = wait_for(lambda: (lambda r: r if r and r["id"] != old["id"] and r["term"] > old["term"] else None)(
            leader_row(cluster)), "a new leader on the majority side")
        assert new["id"] != old["id"]
    finally:
        f.heal_network()
    client = wl.Resp([n.resp for n in lc.load(cluster).nodes], __import__("random").Random(1))
    try:
        wait_for(lambda: _try(lambda: client.call("XADD", "healed", "*", "f", "v")), "a write after healing")
    finally:
        client.close()


def _try(fn):
    try:
        return fn() or True
    except (wl.Failed, wl.Unknown):
        return False


def test_skewed_clock_reaches_the_node(cluster):
    """libfaketime is preloaded and its offset file read live: the node's wall clock (INFO
    server_time_usec) moves an hour ahead and back. (Its XADD stamps do not jump with it:
    the node bounds wall-clock jumps by monotonic time and its peers' clocks, by design.)"""
    f = fl.Faults(cluster)
    node = lc.load(cluster).node(1)
    r = lc.resp_client(node.resp, 5.0)
    try:
        f.skew(1, 3600)
        ahead = r.info("server")["server_time_usec"] / 1e6 - time.time()
        f.skew(1, -3600)
        behind = r.info("server")["server_time_usec"] / 1e6 - time.time()
    finally:
        f.heal_clocks()
        r.close()
    assert ahead > 3000 and behind < -3000, (ahead, behind)


def test_full_disk_is_enospc_for_that_node_only(cluster):
    f = fl.Faults(cluster)
    f.fill_disk(1)
    try:
        with pytest.raises(OSError) as e:
            with open(os.path.join(cluster, "node-1", "mnt", "probe"), "wb") as out:
                out.write(b"x" * 1024 * 1024)
                out.flush()
                os.fsync(out.fileno())
        assert e.value.errno == 28   # ENOSPC
        with open(os.path.join(cluster, "node-2", "mnt", "probe"), "wb") as out:
            out.write(b"x")
    finally:
        f.heal_disks()
        f.restart_dead()


def _min_ping_ms(resp_addr: str, pings: int = 5) -> float:
    """The fastest of a few PINGs."""
    r = lc.resp_client(resp_addr, 10.0)
    try:
        best = float("inf")
        for _ in range(pings):
            t0 = time.monotonic()
            assert r.ping()
            best = min(best, (time.monotonic() - t0) * 1000)
        return best
    finally:
        r.close()


def test_delay_raises_the_rtt_to_that_node_and_heal_removes_it(cluster):
    """Delay with jitter on a kernel without netem: the TUN shaper (ops/tun_shaper.py)
    holds the node's replies about the delay (lower bound only), and heal removes it."""
    f = fl.Faults(cluster)
    node = lc.load(cluster).node(2)
    ns = nh.netns_of(cluster, 2)
    delay_ms, jitter_ms = 300, 50
    try:
        detail = f.netem(2, delay_ms=delay_ms, jitter_ms=jitter_ms)
        assert "delay 300ms" in detail
        # Each PING's reply is held at least delay - jitter.
        assert _min_ping_ms(node.resp) >= delay_ms - jitter_ms
    finally:
        f.heal_network()
    assert "xrshape" not in nh.sh("ip", "route", netns=ns)
    assert wait_for(lambda: _try(lambda: _min_ping_ms(node.resp, 1)), "PING after the heal")


def test_nodes_serve_under_duplication_and_reordering(cluster):
    """The netem faults TCP hides from xraft (the kernel drops duplicates and restores the
    order): the victim still serves PING and writes, and its peers still hear it."""
    f = fl.Faults(cluster)
    victim = wait_for(lambda: leader_row(cluster), "a leader")["id"]
    try:
        f.netem(victim, delay_ms=10, duplicate_pct=30, reorder_pct=30)
        _min_ping_ms(lc.load(cluster).node(victim).resp, 3)      # each PING answered (PONG)
        client = wl.Resp([n.resp for n in lc.load(cluster).nodes], __import__("random").Random(2))
        try:
            wait_for(lambda: _try(lambda: client.call("XADD", "shaped", "*", "f", "v")), "a write under dup+reorder")
        finally:
            client.close()
    finally:
        f.heal_network()


def test_kill_and_restart(cluster):
    f = fl.Faults(cluster)
    f.kill(2)
    c = lc.load(cluster)
    assert not lc.is_alive(c, c.node(2))
    assert f.restart_dead() == "restarted [2]"
    c = lc.load(cluster)
    assert lc.is_alive(c, c.node(2))


def test_a_restart_not_ready_in_time_is_killed_again_then_restarted_by_the_next_heal(cluster, tmp_path):
    """A soak at load 33 ended its nemesis on a restart that took more than 60 s. Now the node
    still starting is killed again (one more fault), and the next heal restarts it."""
    f = fl.Faults(cluster)
    history = wl.History(str(tmp_path / "history.jsonl"))
    nemesis = nr.Nemesis(f, history, ["kill"], random.Random(1), threading.Event(), 1.0, 0.0)
    f.kill(2)
    f.restart_timeout_s = 0.0          # no node logs ready in 0 s: the timeout, on purpose
    detail = nemesis.heal_or_kill_slow_start("kill")
    assert detail.startswith("node(s) [2] not ready in time, killed again"), detail
    c = lc.load(cluster)
    assert not lc.is_alive(c, c.node(2)) and nemesis.slow_starts == 1
    f.restart_timeout_s = fl.RESTART_TIMEOUT_S
    assert nemesis.heal_or_kill_slow_start("kill") == "restarted [2]"
    c = lc.load(cluster)
    assert lc.is_alive(c, c.node(2))
    history.close()


def test_down_removes_what_a_crashed_up_left(tmp_path):
    """A harness that died half-way (network made, no nodes, a resource recorded but never
    made) leaves hosts.json; down removes all of it."""
    d = str(tmp_path)
    hosts = {"version": nh.FORMAT_VERSION, "dir": d, "prefix": "xrcrash", "subnet": "10.254.254.0/24",
             "bridge": "xrcrashbr", "bridge_address": "10.254.254.1", "resources": [], "nodes": []}
    nh.save_hosts(d, hosts)
    nh._make_network(d, hosts, 2, lambda _m: None)
    nh._record(d, hosts, {"kind": "netns", "name": "xrcrash-never-made"})
    assert "xrcrash-n1" in netns_names()
    # A process left running in a namespace (a netem shaper or node of the crashed harness) is killed.
    left = subprocess.Popen(["ip", "netns", "exec", "xrcrash-n1", "sleep", "600"])
    result = CliRunner().invoke(cli.main, ["hosts", "down", "--dir", d])
    assert result.exit_code == 0, result.output
    assert_all_removed(hosts)
    assert nh.load_hosts(d)["resources"] == []
    assert left.wait(10) == -9


def crash_during_up(d: str) -> subprocess.Popen:
    """`hosts up` in a process of its own, for the caller to kill -9 once its node started."""
    return subprocess.Popen([sys.executable, "-m", "xraft.ops", "hosts", "up", "--dir", d, "--nodes", "1",
                             "--disk-mb", "16"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_up_sweeps_what_crashed_harnesses_left_and_only_that(tmp_path):
    """Two harnesses killed -9 during `hosts up`: one whose node died too (stale: swept by the
    next `up`), one whose node still runs (in use: kept, `down` still works on it). A namespace
    whose name the harness never makes is left alone."""
    stale, in_use, fresh = (str(tmp_path / n) for n in ("stale", "in-use", "fresh"))
    procs = {d: crash_during_up(d) for d in (stale, in_use)}
    decoy = f"xrdecoy{os.getpid() % 10000}-n1"       # "xr" but not "xr" + 6 hex digits
    subprocess.run(["ip", "netns", "add", decoy], check=True)
    try:
        for d, proc in procs.items():
            wait_for(lambda: lc.cluster_file(d).exists() and lc.load(d).nodes[0].pid, f"node started in {d}")
            proc.kill()
            proc.wait()
        os.kill(lc.load(stale).nodes[0].pid, 9)
        gone, kept = nh.load_hosts(stale), nh.load_hosts(in_use)
        assert gone["prefix"] in netns_names() and gone["dir"] in open("/proc/mounts").read()
        nh.up(fresh, nodes=1, disk_mb=16)
        assert_all_removed(gone)
        assert not (nh.REGISTRY_DIR / f"{gone['prefix']}.json").exists()
        assert kept["prefix"] in netns_names() and kept["bridge"] in links() and decoy in netns_names()
        assert kept["dir"] in open("/proc/mounts").read()
    finally:
        subprocess.run(["ip", "netns", "del", decoy], capture_output=True)
        for d in (fresh, in_use, stale):
            if nh.hosts_file(d).exists():
                nh.down(d)
    assert_all_removed(kept)
    assert not (nh.REGISTRY_DIR / f"{kept['prefix']}.json").exists()
