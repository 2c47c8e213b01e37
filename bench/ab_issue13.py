"""A/B runs of issue 13's two bench targets on ONE cluster each, the order alternating
per round, so a loaded machine's swings hit both sides alike (bench/README.md,
"Session 7: IDMP and cross-shard consume, A/B"):

  idmp:       3 nodes, 1 group, fsync=always: xadd_batch(100) x 8 in flight, plain
              (idempotent_producer=False) against the SDK's IDMP producer, `--seconds` each.
  crossshard: 3 nodes, 6 groups, fsync=always: `--entries` entries read and acked by ONE
              consume() over six streams in six groups, against the same number read from
              one stream (one group) by one Consume session; fresh streams every round.

    python bench/ab_issue13.py idmp [--rounds 4] [--seconds 4] [--per-entry-ids]
    python bench/ab_issue13.py crossshard [--rounds 3] [--entries 30000]
    (both: [--dir DIR], a work directory that must not exist; default a temporary one)

Prints one line per round (both figures side by side, the ratio) and the summed ratio.
"""
import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time

import uvloop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as bc  # noqa: E402  (bench/cluster.py: the phases measured here)

from xraft.ops import local_cluster as lc  # noqa: E402


def _measured(pids: dict, run, split: list | None = None) -> tuple:
    """(run()'s entries/s, the CPU microseconds per entry of the nodes and this client
    together). On a loaded 2-core machine the CPU per entry moves less than the
    wall-clock rate: other processes take wall time, not this work's CPU. `split`
    gets {process: CPU us per entry} appended."""
    t0 = time.perf_counter()
    with bc.CpuMeter(pids) as m:
        rate = run()
    wall = time.perf_counter() - t0
    entries = max(1.0, rate * wall)
    if split is not None:
        split.append({name: 1e4 * pct * wall / entries for name, pct in m.pct.items()})
    return rate, 1e4 * sum(m.pct.values()) * wall / entries


def _log_entries(cluster) -> int:
    """Raft log entries committed so far, summed over every group (each group's highest
    commit index among the nodes): the records a phase cost, as a difference."""
    top: dict = {}
    for node in cluster.nodes:
        info = lc.raft_info(node.resp, timeout=5.0) or {}
        for name, row in info.items():
            if name.startswith("raft_group") and name[10:].isdigit():
                if isinstance(row, str):      # "role=leader,...,commit_index=N,..."
                    row = dict(kv.split("=", 1) for kv in row.split(","))
                top[name] = max(top.get(name, 0), int(row["commit_index"]))
    return sum(top.values())


def idmp(args, dir_: str) -> None:
    cluster = lc.up(dir_, nodes=3, fsync="always")
    # Sides: plain batches, the IDMP producer as the SDK sends it (ids as first + count), and
    # with --per-entry-ids also the IDMP producer sending one id per entry (the form before
    # XAddRequest.idempotent_id_first), each on its own stream.
    sides = ["plain", "IDMP"] + (["IDMP per-entry"] if args.per_entry_ids else [])
    try:
        bc.wait_leader(cluster)
        seeds = [n.grpc for n in cluster.nodes]
        pids = bc.cluster_pids(cluster)
        sums = {side: 0.0 for side in sides}
        cpu = {side: [] for side in sides}
        split = {side: [] for side in sides}
        for r in range(args.rounds):
            got = {}
            for side in sides[r % len(sides):] + sides[:r % len(sides)]:     # the order rotates
                key = ("batch", "idmp", "idmp-per-entry")[sides.index(side)]
                got[side], us = _measured(pids, lambda: uvloop.run(bc.sdk_batch(
                    seeds, args.seconds, (key,), idempotent=side != "plain",
                    idmp_per_entry=side == "IDMP per-entry")), split[side])
                sums[side] += got[side]
                cpu[side].append(us)
            print(f"round {r + 1}: plain {got['plain']:,.0f}/s  IDMP {got['IDMP']:,.0f}/s  "
                  f"ratio {got['IDMP'] / got['plain']:.2f}  | CPU us/entry plain {cpu['plain'][-1]:.0f} "
                  f"IDMP {cpu['IDMP'][-1]:.0f}" + "".join(
                      f"  | {side} {got[side]:,.0f}/s ratio {got[side] / got['plain']:.2f} CPU us/entry "
                      f"{cpu[side][-1]:.0f}" for side in sides[2:]) + f"  (load {bc.load_avg():.1f})", flush=True)
        print(f"CPU per entry, median of rounds: plain {statistics.median(cpu['plain']):.0f} us, "
              f"IDMP {statistics.median(cpu['IDMP']):.0f} us: plain/IDMP "
              f"{statistics.median(cpu['plain']) / statistics.median(cpu['IDMP']):.2f}" + "".join(
                  f", {side} {statistics.median(cpu[side]):.0f} us" for side in sides[2:]))
        for side in sides:
            print(f"{side} CPU us/entry per process (median): " + ", ".join(
                f"{name} {statistics.median(s[name] for s in split[side]):.1f}" for name in split[side][0]))
        for side in sides[2:]:
            print(f"summed {side}: {sums[side]:,.0f}  ratio to plain {sums[side] / sums['plain']:.2f}")
        print(f"summed: plain {sums['plain']:,.0f}  IDMP {sums['IDMP']:,.0f}  ratio {sums['IDMP'] / sums['plain']:.2f}")
    finally:
        lc.down(dir_)


async def _fresh_streams(seeds, layout, round_no: int) -> tuple:
    """Six keys, one per group, new this round (no entries, no group yet)."""
    keys = []
    for group in sorted(layout.groups, key=lambda g: g.id):
        first, last = group.slots[0]
        n = 0
        while not first <= bc.key_slot(b"r%d-%d" % (round_no, n)) <= last:
            n += 1
        keys.append(f"r{round_no}-{n}")
    return tuple(keys)


def crossshard(args, dir_: str) -> None:
    cluster = lc.up(dir_, nodes=3, fsync="always", groups=bc.SHARDED_GROUPS)
    try:
        layout = bc.layout_of(cluster)
        bc.wait_balanced(cluster, layout)
        seeds = [n.grpc for n in cluster.nodes]
        pids = bc.cluster_pids(cluster)
        sums = {"single": 0.0, "cross": 0.0}
        split = {"single": [], "cross": []}
        records = {"single": [], "cross": []}     # log entries committed per 1,000 entries consumed
        for r in range(args.rounds):
            keys = uvloop.run(_fresh_streams(seeds, layout, r))
            per_key = args.entries // len(keys)
            single_key = f"single-{r}"
            uvloop.run(bc._preload_all(seeds, keys, per_key))
            uvloop.run(bc.sdk_preload(seeds, single_key, per_key * len(keys)))
            got, us = {}, {}
            for side in (("single", "cross") if r % 2 == 0 else ("cross", "single")):
                logged = _log_entries(cluster)
                if side == "single":
                    got[side], us[side] = _measured(pids, lambda: uvloop.run(
                        bc.sdk_consume(seeds, single_key, per_key * len(keys)))["rate"], split[side])
                else:
                    got[side], us[side] = _measured(pids, lambda: uvloop.run(
                        asyncio.wait_for(bc.crossshard_consume(seeds, keys, per_key), bc.CROSSSHARD_LIMIT_S)),
                        split[side])
                sums[side] += got[side]
                records[side].append(1000 * (_log_entries(cluster) - logged) / (per_key * len(keys)))
            print(f"round {r + 1}: single-stream Consume {got['single']:,.0f}/s  cross-shard consume() "
                  f"{got['cross']:,.0f}/s  ratio {got['cross'] / got['single']:.2f}  | CPU us/entry single "
                  f"{us['single']:.0f} cross {us['cross']:.0f}  | Raft records per 1,000 entries single "
                  f"{records['single'][-1]:.0f} cross {records['cross'][-1]:.0f}  (load {bc.load_avg():.1f})",
                  flush=True)
        for side in ("single", "cross"):
            print(f"{side} CPU us/entry per process (median): " + ", ".join(
                f"{name} {statistics.median(s[name] for s in split[side]):.1f}" for name in split[side][0]))
        print(f"summed: single {sums['single']:,.0f}  cross {sums['cross']:,.0f}  "
              f"ratio {sums['cross'] / sums['single']:.2f}")
    finally:
        lc.down(dir_)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("which", choices=("idmp", "crossshard"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--entries", type=int, default=30_000)
    ap.add_argument("--per-entry-ids", action="store_true",
                    help="idmp: a third side, the IDMP producer sending one id per entry (the older form)")
    ap.add_argument("--dir", help="work directory (must not exist; default: a new temporary one); "
                                  "the cluster lives in DIR/cluster")
    args = ap.parse_args()
    if not (1 <= args.rounds <= 20 and 0 < args.seconds <= 60 and 600 <= args.entries <= 1_000_000):
        ap.error("--rounds 1..20, --seconds (0, 60], --entries 600..1,000,000")
    tmp = bc.work_dir(args.dir, "xraft-ab-")
    try:
        t = time.perf_counter()
        (idmp if args.which == "idmp" else crossshard)(args, os.path.join(tmp, "cluster"))
        print(f"({time.perf_counter() - t:.0f} s)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
