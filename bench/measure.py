"""What the benches measure with: load average, a process's CPU (and its children's), INFO raft
counters, the CPU meter around a phase, percentiles, free ports, and the timed loop of a
throughput phase. bench/cluster.py re-exports all of it for the other benches."""
from __future__ import annotations

import asyncio
import os
import socket
import time

from xraft.ops import local_cluster as lc

CLK_TCK = os.sysconf("SC_CLK_TCK")
WARMUP_S = 0.5                 # timed(): what runs before the measured window


def load_avg() -> float:
    return os.getloadavg()[0]


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by pid; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def children_cpu(pid: int) -> float:
    """CPU seconds used so far by pid's children: the reaped ones (cutime + cstime) plus the
    ones alive now (a node's snapshot child, forked to image its state, runs beside the node
    and takes a core of its own while it lasts). 0 if pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total = (int(fields[13]) + int(fields[14])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


RAFT_COUNTERS = ("raft_records", "raft_requests", "raft_syncs")


def raft_counters(resp_addr: str | None) -> dict | None:
    info = lc.raft_info(resp_addr) if resp_addr else None
    return {k: int(info.get(k, 0)) for k in RAFT_COUNTERS + ("raft_term",)} if info else None


class CpuMeter:
    """CPU % of one core per named process over a `with` block (the bench
    process itself is "client"), to say which process a figure is bound by;
    with `leader_resp`, also the leader's group commit over the block (from
    INFO raft): requests per log record and records per WAL sync."""

    def __init__(self, pids: dict, leader_resp: str | None = None):
        self.pids = pids
        self.leader_resp = leader_resp

    def __enter__(self):
        self.raft0 = raft_counters(self.leader_resp)
        self.t0 = time.perf_counter()
        self.c0 = {name: proc_cpu(pid) for name, pid in self.pids.items()}
        self.k0 = {name: children_cpu(pid) for name, pid in self.pids.items()}
        self.self0 = time.process_time()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t0
        self.pct = {name: 100 * (proc_cpu(pid) - self.c0[name]) / wall for name, pid in self.pids.items()}
        self.pct["client"] = 100 * (time.process_time() - self.self0) / wall
        # A child reaped inside the block moves from "alive" to cutime with all its CPU, so the
        # difference is still what it used inside the block.
        self.children_pct = {name: 100 * (children_cpu(pid) - self.k0[name]) / wall for name, pid in self.pids.items()}
        self.raft = None
        raft1 = raft_counters(self.leader_resp)
        if self.raft0 and raft1:
            d = {k: raft1[k] - self.raft0[k] for k in RAFT_COUNTERS}
            self.raft = (d["raft_requests"] / max(1, d["raft_records"]), d["raft_records"] / max(1, d["raft_syncs"]),
                         d["raft_syncs"] / wall)
            self.terms = (self.raft0["raft_term"], raft1["raft_term"])  # a change: an election in the phase

    def line(self) -> str:
        text = "CPU % of a core: " + ", ".join(f"{k} {v:.0f}" for k, v in self.pct.items())
        busy = {k: v for k, v in self.children_pct.items() if v >= 0.5}
        if busy:
            text += " (+ their children, i.e. snapshot images: " + \
                ", ".join(f"{k} {v:.0f}" for k, v in busy.items()) + ")"
        if self.raft:
            text += "; leader: {:.1f} requests/record, {:.1f} records/sync, {:.0f} syncs/s".format(*self.raft)
            text += "; term %d" % self.terms[1] if self.terms[0] == self.terms[1] else \
                "; term %d -> %d (ELECTIONS)" % self.terms
        return text


def pct(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_ports(n: int) -> list:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


async def timed(op, concurrency: int, seconds: float, latencies: list | None = None) -> float:
    """Run `concurrency` loops of `await op()` (returns units done) for a
    warm-up and then `seconds`; units per wall-second completed in the window."""
    clock = time.perf_counter
    start = clock() + WARMUP_S
    end = start + seconds
    done = 0

    async def loop():
        nonlocal done
        while True:
            t0 = clock()
            if t0 >= end:
                return
            units = await op()
            t1 = clock()
            if start <= t0 and t1 <= end:
                done += units
                if latencies is not None:
                    latencies.append(t1 - t0)

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done / seconds
