"""Snapshot catch-up on its own (issue 14's `snapshot_catchup_mb_per_s`, bench/scale.py step 7), in a minute.

    python bench/catchup.py [--state-mb M] [--runs R] [--json FILE] [--dir DIR] [--keep]

One real 3-node cluster (fsync always, --snapshot-entries as scale.py's unless given).
1 KB entries go into `bulk` until a follower's state (newest snapshot + WAL) reaches --state-mb
(default 200 MiB), then scale.catch_up() runs R times: a follower is SIGSTOPped while the leader
snapshots and compacts past it, then continued; MB of the snapshot it installed / seconds from
SIGCONT until it applied the commit index. The image is the whole state each time, so the rate
is per byte of image (a smaller state than scale.py's ~800 MB image, the same path).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import uvloop

from xraft.ops import local_cluster as lc

import cluster as cb  # noqa: E402 - bench/cluster.py, beside this file
import scale  # noqa: E402 - bench/scale.py, beside this file


def run(args, tmp: str, out: dict) -> None:
    target = args.state_mb << 20
    out.update(catchup_state_target_bytes=target, catchup_load_avg_start=cb.load_avg())
    print(f"xraft catch-up benchmark: state {args.state_mb} MiB, {args.runs} run(s); "
          f"load average {out['catchup_load_avg_start']:.1f}", flush=True)
    dir_ = os.path.join(tmp, "cluster")
    try:
        cluster = lc.up(dir_, nodes=3, fsync="always", node_args=["--snapshot-entries", str(args.snapshot_entries)])
        seeds = [n.grpc for n in cluster.nodes]
        cb.wait_leader(cluster)
        victim = scale.follower_of(cluster)
        t = time.perf_counter()
        loaded = uvloop.run(scale.load(seeds, "bulk", 1 << 40, {b"payload": scale.BULK_VALUE}, scale.BULK_BATCH,
                                       "1 KB entries",
                                       stop=lambda: scale.state_bytes(victim.data_dir)[0] >= target))
        scale.wait_applied(cluster)
        print(f"loaded {loaded:,} entries of 1,000-byte values in {time.perf_counter() - t:.1f} s", flush=True)
        rates = []
        for i in range(args.runs):
            one: dict = {}
            load_avg = cb.load_avg()
            scale.catch_up(cluster, seeds, one)
            one["load_avg"] = load_avg
            rates.append(one["snapshot_catchup_mb_per_s"])
            out[f"run_{i + 1}"] = one
            print(f"  run {i + 1}: {one['snapshot_catchup_mb_per_s']:.1f} MB/s "
                  f"({one['snapshot_catchup_bytes'] / 1e6:,.1f} MB in {one['snapshot_catchup_s']:.2f} s, "
                  f"load average {load_avg:.1f})", flush=True)
        out["snapshot_catchup_mb_per_s_runs"] = rates
        out["snapshot_catchup_mb_per_s_best"] = max(rates)
    finally:
        if lc.cluster_file(dir_).exists():
            lc.down(dir_)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state-mb", type=int, default=200, help="state before the catch-ups, MiB (default 200)")
    ap.add_argument("--runs", type=int, default=2, help="catch-ups (default 2)")
    ap.add_argument("--snapshot-entries", type=int, default=scale.SNAPSHOT_ENTRIES,
                    help=f"the nodes' --snapshot-entries (default {scale.SNAPSHOT_ENTRIES}; a smoke run: 100)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (node logs)")
    ap.add_argument("--dir", help="work directory (must not exist; default: a new temporary one)")
    args = ap.parse_args()
    if not 16 <= args.state_mb <= 4096 or not 1 <= args.runs <= 20 or args.snapshot_entries < 1:
        ap.error("--state-mb must be in [16, 4096], --runs in [1, 20], --snapshot-entries >= 1")
    return cb.run_in_work_dir(args, "xraft-bench-catchup-", run)


if __name__ == "__main__":
    sys.exit(main())
