"""The slot-move phase of bench/cluster.py (on its sharded cluster, before it goes down).

One slot holds a stream of ENTRIES entries with a consumer group of PENDING delivered, not
acknowledged entries. While a probe writes to that stream (and another to a key of another
group) one XADD at a time, the slot moves to another group (`xraftctl slots move`'s code:
BeginMove in the metadata group, the metadata leader drives the move). Figures:

    slot_move_s                     BeginMove proposed -> the move left the map (CLI's move_s)
    slot_move_write_wait_ms         the longest single XADD of the probe on the moving slot
                                    (parked while frozen, then -TRYAGAIN retried by the SDK)
    slot_move_frozen_ms             the CLI's write_wait_ms: frozen -> target active, from the map
    slot_move_other_write_max_ms    the longest XADD of the probe on another group's key

Targets (issue 10): move <= 5 s, writes to the slot wait <= 1000 ms, others never wait.

Alone, on its own sharded cluster (3 nodes, --groups 6, fsync always, leaders spread first):

    python bench/slot_move.py [--quick] [--json FILE] [--dir DIR]
"""
from __future__ import annotations

import threading
import time

from xraft.client import sync
from xraft.client.slots import key_slot
from xraft.ops.cluster_status import Connection
from xraft.ops.slots_cli import move

ENTRIES, PENDING = 100_000, 10_000
QUICK_ENTRIES, QUICK_PENDING = 5_000, 1_000
BATCH = 1000
KEY = "{slotmove}big"


class Probe(threading.Thread):
    """XADD to `key` one at a time until stopped; the longest one, in ms."""

    def __init__(self, seeds, key):
        super().__init__(daemon=True)
        self.seeds, self.key = seeds, key
        self.stop = threading.Event()
        self.longest_ms, self.writes, self.error = 0.0, 0, None

    def run(self):
        try:
            with sync.Client(self.seeds, timeout=30) as c:
                while not self.stop.is_set():
                    t = time.perf_counter()
                    c.xadd(self.key, {"probe": "1"})
                    self.longest_ms = max(self.longest_ms, (time.perf_counter() - t) * 1e3)
                    self.writes += 1
                    self.stop.wait(0.005)
        except Exception as e:  # noqa: BLE001 - reported by the phase
            self.error = e


def other_key(layout, group: int) -> str:
    n = 0
    while True:
        k = f"other-{n}"
        s = key_slot(k.encode())
        if not any(a <= s <= b for g in layout.groups if g.id == group for a, b in g.slots):
            return k
        n += 1


def run_phase(seeds: list, quick: bool, out: dict) -> None:
    entries, pending = (QUICK_ENTRIES, QUICK_PENDING) if quick else (ENTRIES, PENDING)
    slot = key_slot(KEY.encode())
    with sync.Client(seeds, timeout=60) as c:
        layout = c.cluster_layout()
        source = next(g.id for g in layout.groups if any(a <= slot <= b for a, b in g.slots))
        target = next(g.id for g in layout.groups if g.id != source)
        for _ in range(entries // BATCH):
            c.xadd_batch(KEY, [{"f": "v" * 16}] * BATCH)
        c.xgroup_create(KEY, "g", id="0")
        c.xreadgroup("g", "c1", {KEY: ">"}, count=pending)
        other = other_key(layout, source)
    probes = [Probe(seeds, KEY), Probe(seeds, other)]
    for p in probes:
        p.start()
    try:
        result = move(Connection(seeds[0], timeout=10), f"{slot}-{slot}", target, wait_s=300, show_progress=False)
    finally:
        for p in probes:
            p.stop.set()
            p.join(60)
    for p in probes:
        if p.error is not None:
            raise RuntimeError(f"probe writes to {p.key} failed: {p.error!r}")
    if result["result"] != "moved":
        raise RuntimeError(f"the slot move did not finish: {result}")
    out["slot_move_s"] = result["move_s"]
    out["slot_move_write_wait_ms"] = round(probes[0].longest_ms, 1)
    out["slot_move_frozen_ms"] = result["write_wait_ms"]
    out["slot_move_other_write_max_ms"] = round(probes[1].longest_ms, 1)
    print(f"slot move ({entries:,} entries, {pending:,} pending) group {source} -> {target}: "
          f"{result['move_s']:.2f} s (target <= 5 s); writes to the slot waited at most "
          f"{out['slot_move_write_wait_ms']:.0f} ms (target <= 1000; frozen {result['write_wait_ms']} ms in the map), "
          f"to another group at most {out['slot_move_other_write_max_ms']:.0f} ms")


def main(argv=None) -> int:
    import argparse
    import json
    import os
    import shutil

    from cluster import layout_of, load_avg, wait_balanced, work_dir  # bench/cluster.py, beside this file
    from xraft.ops import local_cluster as lc

    ap = argparse.ArgumentParser(description="the slot-move phase of bench/cluster.py, alone")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES:,} entries, {QUICK_PENDING:,} pending")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--dir", help="work directory (must not exist; default: a new temporary one); "
                                  "the cluster lives in DIR/sharded")
    args = ap.parse_args(argv)
    root = work_dir(args.dir, "xraft-slotmove-")
    d = os.path.join(root, "sharded")
    out: dict = {"loadavg_start": load_avg()}
    try:
        cluster = lc.up(d, nodes=3, fsync="always", groups=6)
        wait_balanced(cluster, layout_of(cluster))
        run_phase([n.grpc for n in cluster.nodes], args.quick, out)
    finally:
        if lc.cluster_file(d).exists():
            lc.down(d)
        shutil.rmtree(root, ignore_errors=True)
    out["loadavg_end"] = load_avg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
