"""RESP pipelining figures (issue 14): redis-benchmark XADD `-c 50 -P 16` against xraft and
against a redis primary with 2 replicas, the same command line, in one run.

    python bench/resp_pipeline.py [--quick] [--json FILE] [--profile DIR] [--groups N]

Keys (also set by bench/cluster.py's full run):
    redis_replicas_pipelined_xadd_per_s   redis primary + 2 `--replicaof` replicas (no fsync)
    resp_pipelined_xadd_per_s             a 3-node xraft cluster, fsync always, on the leader's
                                          RESP port (one group) or with `--cluster` over every
                                          node (--groups > 1: each node leads some groups)
    resp_pipelined_vs_redis_replicas      their ratio (issue 14's target: >= 0.2)
    leader_cpu_us_per_xadd                the leader's CPU time (from /proc) / XADDs it served

--profile DIR starts the nodes with XRAFT_CPROFILE=DIR (node_main.py): each node writes
DIR/node-<id>.prof when it stops; the leader's top functions are printed.
"""
from __future__ import annotations

import argparse
import os
import pstats
import shutil
import subprocess
import sys

COMMAND = ("XADD", "bench", "*", "f", "v")
# redis-benchmark --cluster puts a hash tag of one of each node's slots where a key says {tag},
# so every connection writes to a slot its node serves.
CLUSTER_COMMAND = ("XADD", "bench{tag}", "*", "f", "v")
BENCH_TIMEOUT_S = 180.0


def redis_benchmark(port: int, n: int, cluster: bool = False) -> dict:
    """One redis-benchmark XADD run: {"rps", "p50_ms", "p99_ms"} or {"error"}."""
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(n), "-c", "50", "-P", "16", "--csv"]
    argv += ["--cluster", *CLUSTER_COMMAND] if cluster else list(COMMAND)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"redis-benchmark did not finish {n} requests in {BENCH_TIMEOUT_S:g} s"}
    for line in out.stdout.splitlines():
        cells = [c.strip('"') for c in line.split('","')]
        if cells and cells[0].startswith("XADD"):
            return {"rps": float(cells[1]), "p50_ms": float(cells[4]), "p99_ms": float(cells[6])}
    return {"error": f"redis-benchmark exit {out.returncode}: {(out.stderr or out.stdout).strip()[-300:]}"}


def record(out: dict) -> None:
    """The ratio key, once both figures are in `out`."""
    ref, got = out.get("redis_replicas_pipelined_xadd_per_s"), out.get("resp_pipelined_xadd_per_s")
    if ref and got:
        out["resp_pipelined_vs_redis_replicas"] = got / ref


def print_profile(path: str, top: int = 25) -> None:
    stats = pstats.Stats(path)
    print(f"--- {path}: top {top} by own time")
    stats.sort_stats("tottime").print_stats(top)
    print(f"--- {path}: top {top} by cumulative time")
    stats.sort_stats("cumulative").print_stats(top)


def main() -> int:
    import uvloop                         # noqa: F401 - cluster.py needs it; fail early if missing
    import cluster as cb                  # bench/cluster.py, beside this file
    from xraft.ops import local_cluster as lc

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--groups", type=int, default=1, help="data groups of the xraft cluster (>1: --cluster)")
    ap.add_argument("--profile", metavar="DIR", help="cProfile every node into DIR (XRAFT_CPROFILE)")
    ap.add_argument("--dir", help="work directory (must not exist)")
    args = ap.parse_args()
    n_redis, n_xraft = (20_000, 5_000) if args.quick else (200_000, 50_000)
    tmp = cb.work_dir(args.dir, "xraft-bench-resp-")
    out: dict = {"load_avg_start": cb.load_avg()}
    try:
        with cb.RedisTrio(tmp) as trio:
            with cb.CpuMeter(trio.pids) as m:
                rb = redis_benchmark(trio.ports[0], n_redis)
            out["redis_replicas_pipelined_xadd_per_s"] = rb.get("rps")
            print(f"redis primary + 2 replicas, XADD -c 50 -P 16: {rb}   [{m.line()}]")
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            os.environ["XRAFT_CPROFILE"] = os.path.abspath(args.profile)
        dir_ = os.path.join(tmp, "cluster")
        try:
            cluster = lc.up(dir_, nodes=3, fsync="always", groups=args.groups)
            if args.groups > 1:
                cb.wait_balanced(cluster, cb.layout_of(cluster))
            leader = cb.wait_leader(cluster)
            pids = cb.cluster_pids(cluster)
            with cb.CpuMeter(pids, leader["resp"]) as m:
                xb = redis_benchmark(int(leader["resp"].rsplit(":", 1)[1]), n_xraft, cluster=args.groups > 1)
            out["resp_pipelined_xadd_per_s"] = xb.get("rps")
            lead_pct = [v for k, v in m.pct.items() if k.endswith("(L)")]
            if lead_pct and xb.get("rps"):   # the leader's CPU per XADD: steadier than wall rates under load
                out["leader_cpu_us_per_xadd"] = round(lead_pct[0] / 100 / xb["rps"] * 1e6, 1)
            record(out)
            print(f"xraft 3 nodes fsync always, {args.groups} group(s), XADD -c 50 -P 16: {xb} = "
                  f"{out.get('resp_pipelined_vs_redis_replicas', 0):.3f}x redis+2 replicas, "
                  f"leader {out.get('leader_cpu_us_per_xadd', 0)} us CPU per XADD   [{m.line()}]")
        finally:
            if lc.cluster_file(dir_).exists():
                lc.down(dir_)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_avg_end"] = cb.load_avg()
    if args.profile:
        lead = os.path.join(args.profile, f"node-{leader['id']}.prof")
        if os.path.exists(lead):
            print_profile(lead)
    if args.json:
        import json
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
