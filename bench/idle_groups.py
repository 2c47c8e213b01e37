"""Idle cost of many Raft groups: 3 real nodes hosting --groups G data groups, no client traffic.

    python bench/idle_groups.py [--groups 100] [--seconds 20] [--json FILE] [--quick] [--dir DIR]

Issue 10's per-node cost target: 3 nodes x 100 idle groups use at most 5 % of one core
per node (`idle_groups_cpu_pct`). The reference, measured in the same run on the same
machine, is the same cluster with one group (`idle_1group_cpu_pct`): what a node costs
when it does nothing but tick, heartbeat and serve its listeners.

Idle groups quiesce (node/raft/quiesce.py): the same G-group cluster is also measured with
`--no-quiesce` on every node (every group heartbeats every tick, as before quiescence),
`idle_groups_noquiesce_cpu_pct`, so the run shows what quiescence buys beside its reference.

For each cluster: start it (`ops.local_cluster.up`, fsync always), wait until every group
is led by its preferred node (each node's INFO raft raft_groups_led; leader_balance.py
hands each group there after the first elections) and one second more, then read each
node's CPU time from /proc/<pid>/stat over --seconds and print it as % of one core.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from cluster import layout_of, load_avg, proc_cpu, wait_balanced, work_dir      # bench/cluster.py, beside this file
from xraft.ops import local_cluster as lc

SETTLE_S = 1.0             # after the leaders are spread: the last hand-over's catch-up
BALANCE_LIMIT_S = 120.0    # 100 groups elect and hand over on a loaded 2-core machine


def measure(groups: int, seconds: float, root: str, node_args: tuple = ()) -> dict:
    d = os.path.join(root, f"g{groups}" + ("-loud" if "--no-quiesce" in node_args else ""))
    t0 = time.monotonic()
    try:
        cluster = lc.up(d, nodes=3, fsync="always", groups=groups, node_args=node_args)
        rows = wait_balanced(cluster, layout_of(cluster), BALANCE_LIMIT_S)
        ready_s = time.monotonic() - t0
        time.sleep(SETTLE_S)
        pids = {n.id: n.pid for n in cluster.nodes}
        before = {nid: proc_cpu(pid) for nid, pid in pids.items()}
        t0 = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        pct = {nid: round(100 * (proc_cpu(pid) - before[nid]) / wall, 2) for nid, pid in pids.items()}
        return {"groups": groups, "ready_s": round(ready_s, 2), "cpu_pct_per_node": pct,
                "max_cpu_pct": max(pct.values()), "leads": {r["id"]: len(r["leads"]) for r in rows}}
    finally:
        if lc.cluster_file(d).exists():
            lc.down(d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="5 s of measurement")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--skip-noquiesce", action="store_true", help="do not measure the --no-quiesce cluster")
    ap.add_argument("--dir", help="work directory (must not exist; default: a new temporary one). The clusters "
                                  "live in DIR/g1, DIR/gG and DIR/gG-loud (--no-quiesce), so a caller "
                                  "can stop them if we are killed")
    args = ap.parse_args(argv)
    seconds = 5.0 if args.quick else args.seconds
    if not 1 <= args.groups <= lc.MAX_GROUPS:
        ap.error(f"--groups must be in 1..{lc.MAX_GROUPS}")
    if not 0 < seconds <= 600:
        ap.error("--seconds must be in (0, 600]")
    root = work_dir(args.dir, "xraft-idle-")
    try:
        load0 = load_avg()
        ref = measure(1, seconds, root)
        many = measure(args.groups, seconds, root)
        loud = None if args.skip_noquiesce else measure(args.groups, seconds, root, ("--no-quiesce",))
        load1 = load_avg()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {"idle_groups": args.groups, "idle_groups_cpu_pct": many["max_cpu_pct"],
           "idle_1group_cpu_pct": ref["max_cpu_pct"], "per_node": {"1": ref, str(args.groups): many},
           "seconds": seconds, "loadavg_start_end": [load0, load1]}
    if loud is not None:
        out["idle_groups_noquiesce_cpu_pct"] = loud["max_cpu_pct"]
        out["per_node"][f"{args.groups}-noquiesce"] = loud
    print(f"idle CPU, % of one core per node, {seconds:.0f}s, 3 nodes, loadavg {load0:.2f} -> {load1:.2f}")
    print(f"  {args.groups:>4} groups: {many['cpu_pct_per_node']}  (max {many['max_cpu_pct']}; "
          f"leaders spread {many['leads']} after {many['ready_s']}s)   target <= 5")
    if loud is not None:
        print(f"  {args.groups:>4} groups, --no-quiesce: {loud['cpu_pct_per_node']}  (max {loud['max_cpu_pct']})"
              f"   before quiescence, same run")
    print(f"     1 group : {ref['cpu_pct_per_node']}  (max {ref['max_cpu_pct']})   reference, same run")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
