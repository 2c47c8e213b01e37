"""The slot-move phase of bench/cluster.py (on its sharded cluster, before it goes down).

One slot holds a stream of ENTRIES entries with a consumer group of PENDING delivered, not
acknowledged entries. While a probe writes to that stream (and another to a key of another
group) one XADD at a time, the slot moves to another group (`xraftctl slots move`'s code:
BeginMove in the metadata group, the metadata leader drives the move). Figures:

    slot_move_s                     BeginMove proposed -> the move left the map (CLI's move_s)
    slot_move_write_wait_ms         the longest single XADD of the probe on the moving slot
                                    (parked while frozen, then -TRYAGAIN retried by the SDK)
    slot_move_frozen_ms             the CLI's write_wait_ms: frozen -> target active, from the map
    slot_move_other_write_max_ms    the longest XADD of the probe on another group's key (the
                                    whole run: the no-move window below included)
    slot_move_other_group_wait_ms   the same, counting only XADDs that started during the move
    no_move_other_group_wait_ms     the same probe's longest XADD over an equally long window
                                    with NO move: the last move_s seconds of the NO_MOVE_S
                                    seconds the probes run before the move starts (same run,
                                    same writers, same cluster)

Targets (issue 10): move <= 5 s, writes to the slot wait <= 1000 ms, others never wait: the
last two figures side by side say whether the move makes another group's writes wait at all
(an XADD's commit latency on a loaded 2-core machine is not zero either). If the move lasts
longer than the no-move window, that window is shorter and `no_move_window_s` says so.

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
NO_MOVE_S = 5.0  # the probes' window before the move (the move's target is <= 5 s)
QUICK_ENTRIES, QUICK_PENDING = 5_000, 1_000
BATCH = 1000
KEY = "{slotmove}big"


MAX_PROBE_SAMPLES = 1_000_000  # (start, ms) pairs kept per probe: hours of one XADD per 5 ms


class Probe(threading.Thread):
    """XADD to `key` one at a time until stopped; the longest one, in ms, and each write's
    (start on the perf_counter clock, ms) for the windows (longest_in)."""

    def __init__(self, seeds, key):
        super().__init__(daemon=True)
        self.seeds, self.key = seeds, key
        self.stop = threading.Event()
        self.longest_ms, self.writes, self.error = 0.0, 0, None
        self.samples: list[tuple[float, float]] = []

    def longest_in(self, start: float, end: float) -> float:
        """The longest XADD that started in [start, end) (perf_counter seconds), in ms."""
        return max((ms for t, ms in self.samples if start <= t < end), default=0.0)

    def run(self):
        try:
            with sync.Client(self.seeds, timeout=30) as c:
                while not self.stop.is_set():
                    t = time.perf_counter()
                    c.xadd(self.key, {"probe": "1"})
                    ms = (time.perf_counter() - t) * 1e3
                    self.longest_ms = max(self.longest_ms, ms)
                    if len(self.samples) < MAX_PROBE_SAMPLES:
                        self.samples.append((t, ms))
                    self.writes += 1
                    self.stop.wait(0.005)
        except Exception as e:  # noqa: BLE001 - reported by the phase
            self.error = e


def other_key(layout, groups: tuple) -> str:
    """A key of a group that is none of `groups` (neither the move's source nor its target:
    a write to the target waits behind the copy's entries in its own log, which says
    nothing about the node-wide cost of a move)."""
    n = 0
    while True:
        k = f"other-{n}"
        s = key_slot(k.encode())
        if not any(a <= s <= b for g in layout.groups if g.id in groups for a, b in g.slots):
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
        other = other_key(layout, (source, target))
    probes = [Probe(seeds, KEY), Probe(seeds, other)]
    for p in probes:
        p.start()
    try:
        # Same writers, same cluster, no move: the reference window for another group's writes.
        time.sleep(NO_MOVE_S)
        move_t0 = time.perf_counter()
        result = move(Connection(seeds[0], timeout=10), f"{slot}-{slot}", target, wait_s=300, show_progress=False)
        move_t1 = time.perf_counter()
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
    # The no-move window: the move's length, ending where the move starts (no longer than
    # the probes ran before it; the first write pays the connection's set-up and the
    # routing table's fetch, so the window starts at the second).
    first = probes[1].samples[1][0] if len(probes[1].samples) > 1 else move_t0
    window_s = min(move_t1 - move_t0, move_t0 - first)
    out["slot_move_other_group_wait_ms"] = round(probes[1].longest_in(move_t0, move_t1), 1)
    out["no_move_other_group_wait_ms"] = round(probes[1].longest_in(move_t0 - window_s, move_t0), 1)
    out["no_move_window_s"] = round(window_s, 2)
    # perf_counter is CLOCK_MONOTONIC on Linux, the clock of XRAFT_STALL_TRACE's reports
    # (node/server/loop_stalls.py): which stalls fell inside the move.
    out["move_window_monotonic_s"] = [round(move_t0, 3), round(move_t1, 3)]
    print(f"slot move ({entries:,} entries, {pending:,} pending) group {source} -> {target}: "
          f"{result['move_s']:.2f} s (target <= 5 s); writes to the slot waited at most "
          f"{out['slot_move_write_wait_ms']:.0f} ms (target <= 1000; frozen {result['write_wait_ms']} ms in the map), "
          f"to another group at most {out['slot_move_other_write_max_ms']:.0f} ms\n"
          f"another group's longest XADD: slot_move_other_group_wait_ms={out['slot_move_other_group_wait_ms']:.0f} "
          f"during the move ({move_t1 - move_t0:.2f} s) vs no_move_other_group_wait_ms="
          f"{out['no_move_other_group_wait_ms']:.0f} over {window_s:.2f} s just before it (no move)")


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
