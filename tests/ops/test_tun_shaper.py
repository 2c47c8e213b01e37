"""The TUN egress shaper (ops/tun_shaper.py): its packet checks and queue rules in process,
then through ops/faults.py on real namespaces (root and /dev/net/tun only; no nodes: two
namespaces on a bridge, UDP and TCP between them)."""
import json
import os
import random
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from xraft.ops import cli
from xraft.ops import faults as fl
from xraft.ops import netns_hosts as nh
from xraft.ops import tun_shaper as ts

TARGET = socket.inet_aton("10.9.9.12")


def ipv4(dst: bytes = TARGET, payload: bytes = b"x" * 8, version: int = 4, ihl: int = 5, total=None) -> bytes:
    header = struct.pack("!BBHHHBBH4s4s", version << 4 | ihl, 0, total if total is not None else 20 + len(payload),
                         0, 0, 64, 17, 0, socket.inet_aton("10.9.9.11"), dst)
    return header + payload


# -- in process ----------------------------------------------------------------------

def test_validate_packet_accepts_ipv4_to_a_target_only():
    targets = frozenset([TARGET])
    assert ts.validate_packet(ipv4(), targets) == TARGET
    for bad, why in [(ipv4()[:19], "shorter"), (ipv4(version=6), "version 6"), (ipv4(ihl=4), "header length"),
                     (ipv4(total=100), "total length 100"), (ipv4(total=10), "total length 10"),
                     (ipv4(dst=socket.inet_aton("10.9.9.13")), "not a shaped target")]:
        with pytest.raises(ts.BadPacket, match=why):
            ts.validate_packet(bad, targets)


@pytest.mark.parametrize("shape, why", [
    (ts.Shape(delay_ms=5, jitter_ms=6), "jitter <= delay"),
    (ts.Shape(delay_ms=9000, jitter_ms=2000), "<= 10000"),
    (ts.Shape(loss_pct=101), "loss 101"),
    (ts.Shape(duplicate_pct=-1), "duplicate -1"),
    (ts.Shape(reorder_pct=10), "needs a gap"),
    (ts.Shape(reorder_pct=10, gap_ms=10_001), "gap 10001"),
])
def test_shape_limits(shape, why):
    with pytest.raises(ValueError, match=why):
        shape.validate()


def drain(queue: ts.Queue, packets: list, spacing_s: float = 0.001) -> list:
    """Offer the packets spacing_s apart, then release everything; the payloads in release order."""
    for i, p in enumerate(packets):
        queue.offer(p, TARGET, i * spacing_s)
    return [p[20:] for p, _ in queue.due(float("inf"))]


def test_queue_duplicates_reorders_and_loses_by_its_shape():
    packets = [ipv4(payload=b"%04d" % i) for i in range(1000)]
    dup = drain(ts.Queue(ts.Shape(duplicate_pct=30), random.Random(1)), packets)
    assert 1200 < len(dup) < 1400 and set(dup) == {p[20:] for p in packets}
    assert dup == sorted(dup)     # a copy leaves with its original: duplication alone keeps the order
    reordered = drain(ts.Queue(ts.Shape(reorder_pct=20, gap_ms=5), random.Random(2)), packets)
    assert sorted(reordered) == [p[20:] for p in packets] and reordered != sorted(reordered)
    lossy = ts.Queue(ts.Shape(loss_pct=50), random.Random(3))
    kept = drain(lossy, packets)
    assert 400 < len(kept) < 600 and lossy.counts["lost"] == 1000 - len(kept) and kept == sorted(kept)


def test_jitter_spaces_packets_but_keeps_their_order():
    queue = ts.Queue(ts.Shape(delay_ms=50, jitter_ms=50), random.Random(4))
    payloads = drain(queue, [ipv4(payload=b"%04d" % i) for i in range(500)])
    assert payloads == sorted(payloads) and len(payloads) == 500


def test_queue_holds_at_most_its_limits():
    queue = ts.Queue(ts.Shape(delay_ms=1000, duplicate_pct=100), random.Random(5))
    for _ in range(ts.MAX_QUEUED_PACKETS):
        queue.offer(ipv4(), TARGET, 0.0)
    assert len(queue.heap) == ts.MAX_QUEUED_PACKETS and queue.counts["overflow"] == ts.MAX_QUEUED_PACKETS // 2
    assert queue.due(0.5) == [] and len(queue.due(1.0)) == ts.MAX_QUEUED_PACKETS and queue.bytes_held == 0


def test_main_refuses_bad_arguments(capsys):
    assert ts.main(["--address", "10.0.0.1", "--targets", "10.0.0.1"]) == 2
    assert ts.main(["--address", "10.0.0.1", "--targets", "10.0.0.2", "--delay-ms", "20000"]) == 2
    assert ts.main(["--address", "10.0.0.1", "--targets", "not-an-address"]) == 2
    assert "targets" in capsys.readouterr().err


# -- on namespaces -------------------------------------------------------------------

WHY_NOT = nh.available() or (None if os.path.exists("/dev/net/tun") else "no /dev/net/tun")
namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=f"namespaces with a TUN device: {WHY_NOT}")

UDP_PORT, TCP_PORT = 9911, 9912
# Run inside a namespace: a UDP receiver that prints the sequence numbers it got once the
# sender's datagrams stop for QUIET_S (a liveness bound: nothing asserts on time), a sender,
# and a TCP echo server and client.
PEER_SCRIPT = r"""
import json, socket, sys, time
mode = sys.argv[1]
if mode == "udp-recv":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", int(sys.argv[2])))
    print("bound", flush=True)
    got = []
    s.settimeout(30)                      # the first datagram
    try:
        while True:
            got.append(int(s.recv(64))); s.settimeout(float(sys.argv[3]))
    except socket.timeout:
        pass
    print(json.dumps(got), flush=True)
elif mode == "udp-send":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(int(sys.argv[4])):
        s.sendto(b"%d" % i, (sys.argv[2], int(sys.argv[3]))); time.sleep(0.001)
elif mode == "tcp-echo":
    srv = socket.create_server(("0.0.0.0", int(sys.argv[2]))); print("bound", flush=True)
    c, _ = srv.accept()
    while data := c.recv(65536):
        c.sendall(data)
elif mode == "tcp-client":
    c = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=60)
    blob = bytes(range(256)) * int(sys.argv[4])
    c.sendall(blob); c.shutdown(socket.SHUT_WR)
    back = b""
    while data := c.recv(65536):
        back += data
    print("same" if back == blob else f"differs: {len(back)} of {len(blob)} bytes", flush=True)
"""
QUIET_S = 1.5
DATAGRAMS = 300


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """Two namespaces on a bridge, recorded in hosts.json as `hosts up` records them (no nodes)."""
    if WHY_NOT is not None:
        pytest.skip(WHY_NOT)
    d = str(tmp_path_factory.mktemp("tun"))
    subnet = nh._free_subnet()
    hosts = {"version": nh.FORMAT_VERSION, "dir": d, "prefix": "xrts" + os.urandom(2).hex(),
             "subnet": subnet + ".0/24", "bridge": "", "bridge_address": subnet + ".1", "resources": [], "nodes": []}
    hosts["bridge"] = hosts["prefix"] + "br"
    nh.save_hosts(d, hosts)
    try:
        nh._make_network(d, hosts, 2, lambda _m: None)
        yield d
    finally:
        nh.down(d)
    assert hosts["prefix"] not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def in_ns(ns: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", PEER_SCRIPT, *map(str, args)],
                            stdout=subprocess.PIPE, text=True, **popen)


def udp_from_1_to_2(d: str, count: int = DATAGRAMS) -> list:
    """Datagrams 0..count-1 from namespace 1 to namespace 2: the sequence numbers 2 received, in order."""
    hosts = nh.load_hosts(d)["nodes"]
    recv = in_ns(hosts[1]["netns"], "udp-recv", UDP_PORT, QUIET_S)
    assert recv.stdout.readline().strip() == "bound"
    send = in_ns(hosts[0]["netns"], "udp-send", hosts[1]["address"], UDP_PORT, count)
    assert send.wait(60) == 0
    out, _ = recv.communicate(timeout=60)
    return json.loads(out)


def shaper_pids(d: str) -> list:
    """Shapers running in this cluster's namespaces (not another test's or soak's)."""
    pids = []
    for h in nh.load_hosts(d)["nodes"]:
        pids += [int(p) for p in nh.sh("ip", "netns", "pids", h["netns"], check=False).split()]
    return [p for p in pids if fl._is_shaper(p)]


def assert_unshaped(d: str) -> None:
    """No shaper runs, and namespace 1 has no TUN device and no route through one."""
    ns = nh.load_hosts(d)["nodes"][0]["netns"]
    assert not shaper_pids(d)
    assert ts.TUN_NAME not in nh.sh("ip", "-o", "link", netns=ns)
    assert ts.TUN_NAME not in nh.sh("ip", "route", netns=ns)


@namespaces
def test_duplicated_udp_arrives_more_than_once_then_exactly_once_after_heal(net):
    f = fl.Faults(net)
    try:
        detail = f.netem(1, duplicate_pct=50)
        assert "duplicate 50%" in detail
        got = udp_from_1_to_2(net)
        assert len(got) > DATAGRAMS and set(got) == set(range(DATAGRAMS)), detail
        # Egress only: what namespace 2 sends back to 1 is not duplicated.
        assert sorted(udp_from_2_to_1(net)) == list(range(DATAGRAMS))
    finally:
        f.heal_network()
    assert_unshaped(net)
    assert udp_from_1_to_2(net) == list(range(DATAGRAMS))


def udp_from_2_to_1(d: str) -> list:
    hosts = nh.load_hosts(d)["nodes"]
    recv = in_ns(hosts[0]["netns"], "udp-recv", UDP_PORT, QUIET_S)
    assert recv.stdout.readline().strip() == "bound"
    assert in_ns(hosts[1]["netns"], "udp-send", hosts[0]["address"], UDP_PORT, DATAGRAMS).wait(60) == 0
    return json.loads(recv.communicate(timeout=60)[0])


@namespaces
def test_reordered_udp_arrives_out_of_order_then_in_order_after_heal(net):
    f = fl.Faults(net)
    try:
        # By hand, as an operator would: the CLI's shaper outlives the command (its pid file
        # lets the heal below stop it).
        result = CliRunner().invoke(cli.main, ["hosts", "fault", "--dir", net, "reorder", "--node", "1",
                                               "--seconds", "20"])
        assert result.exit_code == 0 and "reorder 20%" in result.output, result.output
        got = udp_from_1_to_2(net)
        assert sorted(got) == list(range(DATAGRAMS)) and got != sorted(got)
    finally:
        f.heal_network()
    assert_unshaped(net)
    assert udp_from_1_to_2(net) == list(range(DATAGRAMS))


@namespaces
def test_lost_udp_arrives_in_part(net):
    f = fl.Faults(net)
    try:
        f.netem(1, loss_pct=50)
        got = udp_from_1_to_2(net)
        assert 0 < len(got) < DATAGRAMS and got == sorted(set(got))
    finally:
        f.heal_network()


@namespaces
def test_tcp_is_intact_under_delay_loss_duplication_and_reordering(net):
    """The receiving kernel puts TCP back together: bytes through the shaper come back equal."""
    hosts = nh.load_hosts(net)["nodes"]
    f = fl.Faults(net)
    echo = in_ns(hosts[1]["netns"], "tcp-echo", TCP_PORT)
    try:
        assert echo.stdout.readline().strip() == "bound"
        f.netem(1, delay_ms=20, jitter_ms=10, loss_pct=5, duplicate_pct=20, reorder_pct=20)
        client = in_ns(hosts[0]["netns"], "tcp-client", hosts[1]["address"], TCP_PORT, 1024)  # 256 KiB
        out, _ = client.communicate(timeout=120)
        assert out.strip() == "same"
    finally:
        f.heal_network()
        echo.kill()
        echo.wait()
    # The segments did go through all four (the shaper logs its counters when heal stops it).
    log = (Path(net) / f"netem-shaper-{hosts[0]['netns']}.log").read_text().splitlines()
    counters = dict(kv.split("=") for kv in log[-1].split()[1:])
    assert all(int(counters[k]) > 0 for k in ("lost", "duplicated", "reordered", "sent")), counters


@namespaces
def test_heal_after_a_harness_crash_leaves_no_process_device_or_route(net):
    """A harness that started a shaper and died: a fresh Faults (a later run, `hosts fault
    heal-network`) finds it by its pid file and stops it; its device and routes go with it."""
    crashed = subprocess.run([sys.executable, "-c", (
        "import sys; from xraft.ops import faults as fl; print(fl.Faults(sys.argv[1]).netem(1, duplicate_pct=10))"),
        net], capture_output=True, text=True, timeout=60)
    assert "duplicate 10%" in crashed.stdout, crashed.stderr
    assert shaper_pids(net)
    assert ts.TUN_NAME in nh.sh("ip", "route", netns=nh.load_hosts(net)["nodes"][0]["netns"])
    fl.Faults(net).heal_network()
    assert_unshaped(net)
    assert udp_from_1_to_2(net) == list(range(DATAGRAMS))


@namespaces
def test_hosts_down_after_a_harness_crash_removes_the_shaper(tmp_path):
    d = str(tmp_path)
    subnet = nh._free_subnet()
    prefix = "xrtd" + os.urandom(2).hex()
    hosts = {"version": nh.FORMAT_VERSION, "dir": d, "prefix": prefix, "subnet": subnet + ".0/24",
             "bridge": prefix + "br", "bridge_address": subnet + ".1", "resources": [], "nodes": []}
    nh.save_hosts(d, hosts)
    try:
        nh._make_network(d, hosts, 2, lambda _m: None)
        subprocess.run([sys.executable, "-c", "import sys; from xraft.ops import faults as fl; "
                        "fl.Faults(sys.argv[1]).netem(2, reorder_pct=10)", d], check=True, timeout=60)
        left = shaper_pids(d)
        assert left
    finally:
        result = CliRunner().invoke(cli.main, ["hosts", "down", "--dir", d])
    assert result.exit_code == 0, result.output
    assert not any(fl._is_shaper(p) for p in left)
    assert prefix not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
