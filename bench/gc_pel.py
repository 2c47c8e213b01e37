"""A consumer group reading a backlog into its PEL: the node's collector policy
(node/server/gc_policy.py) beside CPython's default thresholds and redis-server.

    python bench/gc_pel.py [--pending 1000000] [--json FILE]

One stream of PENDING entries; a group reads all of them with XREADGROUP COUNT 10000 (a PEL
of PENDING entries at the end). Ours: in process through the command layer, each collector
setting in a fresh subprocess (the same code, the same allocations); printed per setting: the
reads' wall and CPU seconds, the full (generation 2) collections they ran, the longest pause
of any collection. Reference: redis-server 7.0 (Debian's), the same reads (wall seconds, as a
client sees them: redis-benchmark, one client, one XREADGROUP at a time, replies not parsed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

READ_COUNT = 10_000
DEFAULT_THRESHOLDS = (700, 10, 10)     # CPython's


def read_backlog(pending: int, thresholds: tuple) -> dict:
    """In this process: a stream of `pending` entries built with the collector off, then a
    group reading them all under `thresholds` (tests/server/test_gc_policy.py counts its full
    collections too)."""
    import gc

    from xraft.node.engine.commands import execute
    from xraft.node.engine.keyspace import Keyspace
    from xraft.node.server.gc_policy import GcWatch
    db = Keyspace()
    gc.disable()                         # the stream is built alike under both settings
    ms = 1
    for ms in range(1, pending // 1000 + 1):
        for seq in range(1, 1001):
            execute(db, [b"XADD", b"s", b"%d-%d" % (ms, seq), b"f", b"v"], ms)
    execute(db, [b"XGROUP", b"CREATE", b"s", b"g", b"0"], ms)
    gc.collect()
    watch = GcWatch()
    watch.install(thresholds)
    gc.enable()
    t, c = time.perf_counter(), time.process_time()
    try:
        for _ in range(pending // READ_COUNT):
            execute(db, [b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", b"%d" % READ_COUNT, b"STREAMS", b"s", b">"],
                    ms)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    finally:
        watch.uninstall()
    return {"wall_s": wall, "cpu_s": cpu, "full_collections": watch.collections[2],
            "gc_pause_s": sum(watch.pause_s), "max_pause_ms": max(watch.max_pause_s) * 1000,
            "pending": execute(db, [b"XPENDING", b"s", b"g"], ms)[0]}


def ours(pending: int, thresholds: tuple) -> dict:
    code = ("import json, sys; sys.path.insert(0, %r); import gc_pel; "
            "print(json.dumps(gc_pel.read_backlog(%d, %r)))" % (HERE, pending, thresholds))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def redis_reads(pending: int) -> float:
    sys.path.insert(0, HERE)
    from engine import Redis
    r = Redis()
    try:
        for ms in range(1, pending // 1000 + 1):
            r.pipeline([(b"XADD", b"s", b"%d-%d" % (ms, seq), b"f", b"v") for seq in range(1, 1001)])
        r.call(b"XGROUP", b"CREATE", b"s", b"g", b"0")
        reads = pending // READ_COUNT
        rate = r.benchmark(reads, 1, b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", b"%d" % READ_COUNT,
                           b"STREAMS", b"s", b">")
        return reads / rate
    finally:
        r.close()


def main(argv=None) -> int:
    from xraft.node.server.gc_policy import THRESHOLDS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    pending = max(READ_COUNT, args.pending // READ_COUNT * READ_COUNT)
    print(f"a group reads {pending:,} entries into its PEL (XREADGROUP COUNT {READ_COUNT}); "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    out = {"pending": pending}
    for name, th in (("default", DEFAULT_THRESHOLDS), ("node", THRESHOLDS)):
        r = ours(pending, th)
        out[name] = r
        print(f"  ours, thresholds {th} ({name}): {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, "
              f"{r['full_collections']} full collections, {r['gc_pause_s']:.2f} s in the collector, "
              f"longest pause {r['max_pause_ms']:.1f} ms", flush=True)
    try:
        out["redis_s"] = redis_reads(pending)
        print(f"  redis-server: {out['redis_s']:.2f} s wall", flush=True)
    except (OSError, RuntimeError) as exc:
        print(f"  redis-server: not measured ({exc})")
    print(f"node / default: {out['node']['wall_s'] / out['default']['wall_s']:.2f}x the time; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
