"""What `xraft-node --metrics` costs on the write path: two 3-node clusters (fsync always),
one without metrics and one with them (scraped every second, as Prometheus would), measured
in turns on the same machine.

    python bench/metrics_cost.py [--seconds S] [--rounds R]

Workloads (each --seconds, default 5, per round and cluster; rounds alternate off/on so
load from elsewhere on the shared machine falls on both alike):
  * SDK batch: bench/cluster.py's phase 1 (xadd_batch of 100, 8 batches in flight, gRPC);
  * RESP pipeline: redis.asyncio pipelines of 100 XADD, 8 in flight, to the leader (one
    request-stats observation per command: the per-request cost shows most here).
Prints entries/s per round and the CPU the three node processes used per entry (µs; the
window includes the 0.5 s warm-up, alike for both), then the medians off and on and their
ratio. On a shared machine entries/s swings with other load; CPU per entry much less.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import urllib.request

import redis.asyncio
import uvloop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import BATCH, BATCH_CONCURRENCY, FIELDS, proc_cpu, sdk_batch, timed  # noqa: E402

from xraft.ops import local_cluster as lc  # noqa: E402


async def resp_pipeline(addr: str, seconds: float) -> float:
    host, port = addr.rsplit(":", 1)
    r = redis.asyncio.Redis(host=host, port=int(port), protocol=2)
    try:
        async def op():
            p = r.pipeline(transaction=False)
            for _ in range(BATCH):
                p.xadd("pipe", FIELDS)
            await p.execute()
            return BATCH
        return await timed(op, BATCH_CONCURRENCY, seconds)
    finally:
        await r.aclose()


def scraper(addresses: list, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        for a in addresses:
            with urllib.request.urlopen(f"http://{a}/metrics", timeout=5) as resp:
                resp.read()


def free_base(count: int) -> int:
    for base in range(21000, 60000, 97):
        try:
            lc.pick_ports(count, base)
            return base
        except lc.LocalClusterError:
            continue
    raise RuntimeError("no free port range for the metrics endpoints")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="xraft-bench-metrics-")
    dirs = {"off": os.path.join(tmp, "off"), "on": os.path.join(tmp, "on")}
    figures = {(w, m): [] for w in ("sdk batch", "resp pipeline") for m in dirs}
    try:
        clusters = {"off": lc.up(dirs["off"], fsync="always"),
                    "on": lc.up(dirs["on"], fsync="always", metrics_base_port=free_base(3))}
        for r in range(args.rounds):
            for mode in ("off", "on"):
                cluster = clusters[mode]
                leader = lc.find_leader(cluster)
                stop = threading.Event()
                t = None
                if mode == "on":
                    t = threading.Thread(target=scraper, args=([n.metrics for n in cluster.nodes], stop))
                    t.start()
                try:
                    seeds = [n.grpc for n in cluster.nodes]
                    pids = [n.pid for n in cluster.nodes]
                    c0 = sum(map(proc_cpu, pids))
                    b = uvloop.run(sdk_batch(seeds, args.seconds))
                    c1 = sum(map(proc_cpu, pids))
                    p = uvloop.run(resp_pipeline(leader["resp"], args.seconds))
                    c2 = sum(map(proc_cpu, pids))
                finally:
                    stop.set()
                    if t:
                        t.join()
                bcpu = (c1 - c0) / (b * args.seconds) * 1e6
                pcpu = (c2 - c1) / (p * args.seconds) * 1e6
                figures[("sdk batch", mode)].append((b, bcpu))
                figures[("resp pipeline", mode)].append((p, pcpu))
                print(f"round {r + 1} metrics {mode:3}: sdk batch {b:9.0f} entries/s {bcpu:6.0f} us cpu/entry   "
                      f"resp pipeline {p:9.0f} entries/s {pcpu:6.0f} us cpu/entry", flush=True)
    finally:
        for d in dirs.values():
            if os.path.exists(os.path.join(d, lc.CLUSTER_FILE)):
                lc.down(d)
        shutil.rmtree(tmp, ignore_errors=True)
    for w in ("sdk batch", "resp pipeline"):
        for i, what in ((0, "entries/s"), (1, "us cpu/entry")):
            off = statistics.median(f[i] for f in figures[(w, "off")])
            on = statistics.median(f[i] for f in figures[(w, "on")])
            print(f"{w:14} {what:12}: median off {off:9.0f}  on {on:9.0f}  on/off {on / off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
