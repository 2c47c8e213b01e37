"""ISSUE9 C6 end to end: real xraft-node processes, one of which STARTS with its wall clock an
hour ahead (its process's time.time/time.time_ns shifted before xraft is imported; monotonic
time untouched). The peer handshake reads its peers' clocks, the node's replicated time is held
to the group's, and once it leads, XADD * IDs and PEL idle times stay near real time."""
import signal
import sys
import time

from tests.cluster.conftest import wait_until

HOUR_MS = 3_600_000
SLACK_MS = 60_000          # far below the hour the skewed node would add on main

# Shifts this process's wall clock, then runs xraft-node with the remaining arguments.
SKEWED_NODE = (
    "import sys, time, runpy\n"
    "_ns = time.time_ns\n"
    "time.time_ns = lambda: _ns() + %d * 1_000_000\n"
    "time.time = lambda: time.time_ns() / 1e9\n"
    "runpy.run_module('xraft.node.server.node_main', run_name='__main__')\n" % HOUR_MS)


def _real_ms():
    return time.time_ns() // 1_000_000


def test_a_node_started_an_hour_ahead_leads_without_moving_time_ahead(cluster_factory):
    c = cluster_factory(3)
    skewed = c.nodes[3]
    plain_argv = skewed.argv
    skewed.argv = lambda: [sys.executable, "-c", SKEWED_NODE] + plain_argv()[3:]
    c.start()
    leader = c.wait_leader()
    # Both peers' handshakes outvote node 3's clock (main: no such figure, no cap).
    wait_until(lambda: int((skewed.raft_info() or {}).get("raft_time_capped", 0)) >= 1, 15,
               "node 3 to hold its time to its peers' clocks")
    before = _real_ms()
    with leader.client() as r:
        r.execute_command("XADD", "s", "*", "f", "v")
        r.execute_command("XGROUP", "CREATE", "s", "g", "0")
        r.execute_command("XREADGROUP", "GROUP", "g", "worker", "STREAMS", "s", ">")
    for _ in range(10):                 # restart leaders until node 3 leads (each hands over)
        if leader is skewed:
            break
        leader.signal(signal.SIGTERM)
        leader.wait_exit()
        leader.start()
        leader.wait_ready()
        leader = c.wait_leader()
    assert leader is skewed, "node 3 never became leader"
    with skewed.client() as r:
        later = r.execute_command("XADD", "s", "*", "f", "w")
        [pending] = r.xpending_range("s", "g", "-", "+", 10)
        claimed = r.xautoclaim("s", "g", "thief", 1_800_000, "0")      # min idle: 30 minutes
    after = _real_ms()
    ms = int(later.split(b"-")[0])
    assert before - SLACK_MS <= ms <= after + SLACK_MS, (ms - after)     # main: an hour ahead
    assert pending["consumer"] == b"worker"
    assert pending["time_since_delivered"] <= after - before + SLACK_MS   # main: idle ~ an hour
    assert claimed[1] == []                                                # main: the entry is stolen
    assert int(skewed.raft_info()["raft_time_capped"]) >= 1
