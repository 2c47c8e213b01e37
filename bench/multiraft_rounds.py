"""CPU per Raft round of the node runtime, in one process (issue 14's per-round cost, without the noise).

    python bench/multiraft_rounds.py [--groups 1,6] [--seconds 3] [--in-flight 8] [--entry-bytes 5000]
                                     [--profile FILE] [--json FILE] [--dir DIR]

Three MultiRaft nodes (the real runtime: GroupDriver, DiskStorage with fsync always, the
in-process LocalTransport with the wire codec) in this one process, hosting G groups of 3
replicas; K proposals of --entry-bytes each are kept in flight, each to the next group in
turn (bench/sharded.py's sharded workload without the client, gRPC and the streams engine:
the state machine only counts). With one group the in-flight proposals share rounds; with
6 groups each group has ~K/6 in flight, so nearly every proposal pays a round of its own
(a Ready, a storage job, a MsgApp, an ack, an apply pass on each of the 3 nodes).

Printed per G: proposals/s, rounds (leader Readies that synced) per proposal, and the
process CPU (time.process_time: all three nodes, the executor threads' fsyncs included)
per proposal and per round. On a shared machine the wall rates vary with load; CPU per
proposal does much less. --profile FILE writes a cProfile of the LAST group count's
measurement, in CPU time of the loop thread (every node's Python work runs there; the
executor threads' writes and fsyncs are not in it).
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from xraft.node.runtime.disk_storage import DiskStorageOptions  # noqa: E402
from xraft.node.runtime.multiraft import MultiRaft, MultiRaftOptions  # noqa: E402
from xraft.node.runtime.raft_driver import GroupOptions  # noqa: E402
from xraft.node.runtime.transport import LocalNetwork, LocalTransport  # noqa: E402
from xraft.node.runtime.wal import FsyncPolicy, WalOptions  # noqa: E402

from raft import _CountingMachine as CountingMachine  # noqa: E402 - bench/raft.py, beside this file

NODES = (1, 2, 3)
MAX_GROUPS = 64


async def measure(base: str, groups: int, secs: float, in_flight: int, entry_bytes: int,
                  profile: cProfile.Profile | None, fsync: FsyncPolicy = FsyncPolicy.ALWAYS) -> dict:
    d = tempfile.mkdtemp(prefix=f"rounds-{groups}-", dir=base)
    net = LocalNetwork(codec=True)
    storage = DiskStorageOptions(wal=WalOptions(fsync=fsync), cache_bytes=8 << 20,
                                 snapshot_cache_bytes=8 << 20)
    opts = MultiRaftOptions(tick_interval_s=0.1, group=GroupOptions(
        election_tick=20, heartbeat_tick=2, snapshot_entries=1 << 30, storage=storage))
    nodes: list[MultiRaft] = []
    try:
        for nid in NODES:
            mr = MultiRaft(nid, LocalTransport(net, nid), opts)
            await mr.start()
            for g in range(1, groups + 1):
                await mr.add_group(g, os.path.join(d, f"n{nid}-g{g}"), CountingMachine(), bootstrap_voters=NODES)
            nodes.append(mr)
        # Spread the leaders: group g on node (g - 1) % 3 + 1, as bench/sharded.py waits for.
        for g in range(1, groups + 1):
            await nodes[(g - 1) % len(nodes)].group(g).campaign()
        deadline = time.monotonic() + 30
        while True:
            leaders = [next((mr.group(g) for mr in nodes if mr.group(g).is_leader()), None)
                       for g in range(1, groups + 1)]
            if all(x is not None for x in leaders):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("no leader in some group within 30 s")
            await asyncio.sleep(0.05)
        data = os.urandom(entry_bytes)
        readies0 = sum(mr.group(g).stats.syncs for mr in nodes for g in range(1, groups + 1))
        leader_syncs0 = sum(x.stats.syncs for x in leaders)
        done = [0]
        turn = [0]
        stop_at = time.perf_counter() + secs

        async def proposer():
            while time.perf_counter() < stop_at:
                g = leaders[turn[0] % groups]
                turn[0] += 1
                await g.propose(data, 10)
                done[0] += 1
        c0, t0, times0 = time.process_time(), time.perf_counter(), os.times()
        if profile is not None:
            profile.enable()
        await asyncio.gather(*(proposer() for _ in range(in_flight)))
        if profile is not None:
            profile.disable()
        cpu, wall, times1 = time.process_time() - c0, time.perf_counter() - t0, os.times()
        syncs = sum(mr.group(g).stats.syncs for mr in nodes for g in range(1, groups + 1)) - readies0
        leader_syncs = sum(x.stats.syncs for x in leaders) - leader_syncs0
        n = max(1, done[0])
        return {"groups": groups, "proposals_per_s": round(done[0] / wall, 1),
                "leader_rounds_per_proposal": round(leader_syncs / n, 3),
                "syncs_per_proposal": round(syncs / n, 3),
                "cpu_us_per_proposal": round(cpu / n * 1e6, 1),
                "cpu_us_per_leader_round": round(cpu / max(1, leader_syncs) * 1e6, 1),
                "sys_us_per_proposal": round((times1.system - times0.system) / n * 1e6, 1),
                "cpu_pct": round(100 * cpu / wall)}
    finally:
        for mr in nodes:
            await mr.close()
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", default="1,6", help="comma-separated group counts (1-64)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--entry-bytes", type=int, default=5000)
    ap.add_argument("--fsync", choices=[p.value for p in FsyncPolicy], default="always")
    ap.add_argument("--profile", metavar="FILE")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--dir", help="parent of the work directory (default: the system's temp dir)")
    args = ap.parse_args()
    counts = [int(x) for x in args.groups.split(",")]
    if not all(1 <= c <= MAX_GROUPS for c in counts) or not 0 < args.seconds <= 60 \
            or not 1 <= args.in_flight <= 256 or not 1 <= args.entry_bytes <= 1 << 20:
        ap.error("--groups 1-64 each, --seconds (0, 60], --in-flight 1-256, --entry-bytes 1..1MiB")
    import uvloop
    rows = []
    for i, g in enumerate(counts):
        prof = cProfile.Profile(time.thread_time) if args.profile and i == len(counts) - 1 else None
        row = uvloop.run(measure(args.dir or tempfile.gettempdir(), g, args.seconds, args.in_flight,
                                 args.entry_bytes, prof, FsyncPolicy(args.fsync)))
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        if prof is not None:
            prof.dump_stats(args.profile)
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "load_avg": load}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
