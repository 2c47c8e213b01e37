"""Sharded vs one-group batch throughput, alone (issue 10's figure without the rest of bench/cluster.py).

    python bench/sharded.py [--quick] [--seconds S] [--rounds R] [--clients N] [--in-flight K]
                            [--profile DIR] [--json FILE] [--dir DIR]

Starts two 3-node clusters (fsync always) side by side: one data group, and
SHARDED_GROUPS (6) groups with every node leading 2 (waited for, as in
bench/cluster.py). Then alternates, R rounds: bench/cluster.py phase 1's workload
(SDK `xadd_batch` of 100 entries, K batches in flight per client) on the one-group
cluster (one key) and phase 7's on the sharded one (each batch to the next group's
key). Both sides always run with the same N client processes x K in flight, so
the comparison stays fair when one Python client is the limit (N > 1 sums the
processes' entries over the same wall-clock window).

Printed per measurement: entries/s, CPU % of a core of each node and of the
clients, node CPU per entry (steadier than wall rates on a shared machine),
the load average, and Raft records per second with the batches packed into each
(INFO raft raft_records / raft_requests, summed over the nodes): the rounds the
clusters pay for the same entries. Keys: `xadd_batch100_entries_per_s` and
`sharded_xadd_batch100_entries_per_s` (medians over the rounds), their ratio
`sharded_vs_one_group` (issue 10's target: >= 1.5).

--profile DIR runs the nodes under cProfile (XRAFT_CPROFILE, node_main.py): each
cluster's nodes write DIR/one/node-<id>.prof and DIR/sharded/node-<id>.prof.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MAX_CLIENTS = 8
MAX_IN_FLIGHT = 64


# ----------------------------------------------------------------------------- a client process

async def _worker(seeds: list, keys: list, start_at: float, seconds: float, in_flight: int) -> int:
    """Entries acknowledged by batches that started and ended inside [start_at, start_at + seconds]
    (wall clock: the processes share one window)."""
    from xraft.client.aio import Client
    from cluster import BATCH, FIELDS

    end_at = start_at + seconds
    done = 0
    turn = 0
    async with Client(seeds) as c:
        batch = [FIELDS] * BATCH

        async def loop():
            nonlocal done, turn
            while True:
                t0 = time.time()
                if t0 >= end_at:
                    return
                key = keys[turn % len(keys)]
                turn += 1
                results = await c.xadd_batch(key, batch)
                if len(results) != BATCH or any(isinstance(r, Exception) for r in results):
                    raise RuntimeError(f"xadd_batch failed: {results[:3]}")
                if start_at <= t0 and time.time() <= end_at:
                    done += BATCH
        await asyncio.gather(*(loop() for _ in range(in_flight)))
    return done


def worker_main(argv: list) -> int:
    import uvloop
    spec = json.loads(argv[0])
    done = uvloop.run(_worker(spec["seeds"], spec["keys"], spec["start_at"], spec["seconds"], spec["in_flight"]))
    print(json.dumps({"entries": done, "cpu_s": time.process_time()}))
    return 0


def run_clients(seeds: list, keys: tuple, seconds: float, clients: int, in_flight: int) -> tuple:
    """(entries/s summed over the clients, their CPU seconds)."""
    from cluster import WARMUP_S
    start_at = time.time() + 1.0 + WARMUP_S           # the processes' imports and connections first
    spec = json.dumps({"seeds": seeds, "keys": list(keys), "start_at": start_at, "seconds": seconds,
                       "in_flight": in_flight})
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", spec], stdout=subprocess.PIPE, text=True)
             for _ in range(clients)]
    total, cpu = 0, 0.0
    try:
        for p in procs:
            out, _ = p.communicate(timeout=seconds + 120)
            if p.returncode != 0:
                raise RuntimeError(f"client process failed (exit {p.returncode})")
            res = json.loads(out.strip().splitlines()[-1])
            total += res["entries"]
            cpu += res["cpu_s"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return total / seconds, cpu


# ----------------------------------------------------------------------------- the run

def leader_counters(cluster) -> tuple:
    """(records proposed, requests packed into them), summed over every node's INFO raft."""
    import redis
    records = requests = 0
    for n in cluster.nodes:
        info = redis.Redis(port=int(n.resp.rsplit(":", 1)[1])).info("raft")
        records += int(info.get("raft_records", 0))
        requests += int(info.get("raft_requests", 0))
    return records, requests


def measure(cb, name: str, cluster, keys: tuple, args) -> dict:
    pids = {f"node{n.id}": n.pid for n in cluster.nodes}
    load0 = cb.load_avg()
    records0, requests0 = leader_counters(cluster)
    t0 = time.perf_counter()
    with cb.CpuMeter(pids) as m:
        rate, client_cpu = run_clients([n.grpc for n in cluster.nodes], keys, args.seconds, args.clients,
                                       args.in_flight)
    wall = time.perf_counter() - t0
    records1, requests1 = leader_counters(cluster)
    # Batches per Raft record: what one round of the group (its fsyncs, peer messages, Readies)
    # is shared by. One group gathers the batches in flight into few records; six groups get
    # ~1/6 of them each and mostly one per record, so they pay a round per batch.
    per_record = (requests1 - requests0) / max(1, records1 - records0)
    nodes_pct = {k: v for k, v in m.pct.items() if k != "client"}
    # The meter's window also covers the clients' start-up and warm-up, whose node CPU is
    # charged to the measured window's entries: an upper bound of node CPU per entry, the
    # same bias on both sides (the clusters idle meanwhile, quiesced or not).
    node_cpu_s = sum(nodes_pct.values()) / 100 * wall
    row = {"name": name, "entries_per_s": rate, "load_avg": load0,
           "node_cpu_pct": {k: round(v) for k, v in nodes_pct.items()},
           "client_cpu_pct": round(100 * client_cpu / wall),
           "node_cpu_us_per_entry_upper": round(node_cpu_s / max(1, rate * args.seconds) * 1e6, 1),
           "raft_records_per_s": round((records1 - records0) / wall), "batches_per_record": round(per_record, 2)}
    print(f"{name:>8}: {rate:>9,.0f} entries/s  load {load0:.1f}  nodes CPU % "
          + " ".join(f"{v:.0f}" for v in nodes_pct.values())
          + f"  clients CPU % {row['client_cpu_pct']}  node CPU/entry <= {row['node_cpu_us_per_entry_upper']} us"
          + f"  Raft records {row['raft_records_per_s']}/s, {per_record:.2f} batches each",
          flush=True)
    return row


def run(args, tmp: str, out: dict) -> None:
    import cluster as cb
    from xraft.ops import local_cluster as lc

    out["load_avg_start"] = cb.load_avg()
    print(f"sharded vs one group: {os.cpu_count()} cores, load average {out['load_avg_start']:.1f}, "
          f"{args.clients} client process(es) x {args.in_flight} batches of {cb.BATCH} in flight, "
          f"{args.seconds:g} s per measurement, {args.rounds} round(s)", flush=True)
    dirs = {"one": os.path.join(tmp, "one"), "sharded": os.path.join(tmp, "sharded")}
    try:
        clusters, keys = {}, {}
        for name, groups in (("one", None), ("sharded", cb.SHARDED_GROUPS)):
            if args.profile:
                os.makedirs(os.path.join(args.profile, name), exist_ok=True)
                os.environ["XRAFT_CPROFILE"] = os.path.abspath(os.path.join(args.profile, name))
            t = time.perf_counter()
            clusters[name] = lc.up(dirs[name], nodes=3, fsync="always", groups=groups)
            layout = cb.layout_of(clusters[name])
            rows = cb.wait_balanced(clusters[name], layout)
            keys[name] = cb.keys_per_group(layout) if groups else ("batch",)
            print(f"{name}: up and balanced in {time.perf_counter() - t:.1f} s: "
                  + ", ".join(f"node{r['id']} leads {r['leads']}" for r in rows), flush=True)
        rows = []
        for _ in range(args.rounds):
            for name in ("one", "sharded"):
                rows.append(measure(cb, name, clusters[name], keys[name], args))
    finally:
        for d in dirs.values():
            if lc.cluster_file(d).exists():
                lc.down(d)
    one = statistics.median(r["entries_per_s"] for r in rows if r["name"] == "one")
    sharded = statistics.median(r["entries_per_s"] for r in rows if r["name"] == "sharded")
    out.update(xadd_batch100_entries_per_s=one, sharded_xadd_batch100_entries_per_s=sharded,
               sharded_vs_one_group=sharded / one if one else 0.0, rows=rows,
               clients=args.clients, in_flight_per_client=args.in_flight, load_avg_end=cb.load_avg())
    print(f"median: one group {one:,.0f} entries/s, {cb.SHARDED_GROUPS} groups {sharded:,.0f} entries/s = "
          f"{out['sharded_vs_one_group']:.2f}x (target >= 1.5x); load average at the end "
          f"{out['load_avg_end']:.1f}", flush=True)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        return worker_main(sys.argv[2:])
    import cluster as cb
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 s measurements, 1 round (./dev bench --quick)")
    ap.add_argument("--seconds", type=float, help="seconds per measurement (default 5; --quick 1)")
    ap.add_argument("--rounds", type=int, help="one-group/sharded pairs, alternated (default 2; --quick 1)")
    ap.add_argument("--clients", type=int, default=1, help=f"client processes (1-{MAX_CLIENTS}, default 1)")
    ap.add_argument("--in-flight", type=int, default=cb.BATCH_CONCURRENCY,
                    help=f"batches in flight per client (default {cb.BATCH_CONCURRENCY})")
    ap.add_argument("--profile", metavar="DIR", help="cProfile every node into DIR/one and DIR/sharded")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--dir", help="work directory (must not exist)")
    args = ap.parse_args()
    args.seconds = args.seconds or (1.0 if args.quick else 5.0)
    args.rounds = args.rounds or (1 if args.quick else 2)
    if not 0 < args.seconds <= 120 or not 1 <= args.rounds <= 10 or not 1 <= args.clients <= MAX_CLIENTS \
            or not 1 <= args.in_flight <= MAX_IN_FLIGHT:
        ap.error(f"--seconds in (0, 120], --rounds 1-10, --clients 1-{MAX_CLIENTS}, --in-flight 1-{MAX_IN_FLIGHT}")
    tmp = cb.work_dir(args.dir, "xraft-bench-sharded-")
    out: dict = {}
    try:
        run(args, tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
