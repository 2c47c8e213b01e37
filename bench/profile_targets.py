"""Where each issue-14 write-path figure spends its CPU: bench/cluster.py's phases under py-spy.

    python bench/profile_targets.py [--phases batch,idmp,single,c64,resp,sharded] [--seconds S] [--top N]
                                    [--json FILE] [--dir DIR] [--keep]

For each phase a fresh 3-node cluster (`ops.local_cluster.up`, fsync always, as bench/cluster.py;
for `sharded`, bench/cluster.py's 6-group cluster with its leaders spread and one key per group)
runs that phase's workload (the same functions bench/cluster.py measures with) while `py-spy
record --native` samples every node process and this client process. Printed per process:

* its CPU % of one core over the phase (/proc, as bench/cluster.py's CpuMeter) and the CPU µs it
  spends per operation (an entry for the batch phases, a call for the others);
* that CPU split into areas by the innermost frame of each sample that names one (the engine's
  apply, the fsm and its record codec, the Raft core, WAL and fsync, the peer transport, the gRPC
  and RESP front ends, the SDK, grpc's own library, protobuf, the event loop ...), each as a share
  and as µs per operation;
* the TOP functions by own (leaf) samples.

py-spy pauses a process for each native sample (--nonblocking cannot unwind native frames), so a
phase's figure under the profiler is lower than bench/cluster.py's (printed: compare); the split is what this bench
is for. Waiting threads (epoll, queues, the GIL) are left out of the split, and time in fdatasync is
printed apart: it is the disk's, not CPU. It needs py-spy
(`pip install py-spy`; PyPI wheel, no build) and root or ptrace rights.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import time

import uvloop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cb  # noqa: E402 - bench/cluster.py, beside this file

from xraft.ops import local_cluster as lc  # noqa: E402

RATE_HZ = 25                   # py-spy pauses a process for each native sample: kept low
RESP_REQUESTS = 500_000        # redis-benchmark -n for the resp phase (~9 s on a quiet machine)

# (area, pattern on one frame's text). A sample belongs to the first area that one of its frames
# matches, walking from the innermost frame out: an allocation inside an XADD's apply counts as the
# apply, a protobuf parse inside the gRPC handler as protobuf.
AREAS = (
    ("engine apply", re.compile(r"node/engine/|_listpack_c")),
    ("fsm + record codec", re.compile(r"node/fsm/|_entry_c")),
    ("raft core", re.compile(r"node/raft/")),
    ("WAL + storage", re.compile(r"node/runtime/(wal|disk_storage|snapfile)")),
    ("peer transport", re.compile(r"node/runtime/(grpc_transport|transport)")),
    ("node driver", re.compile(r"node/runtime/")),
    ("RESP front end", re.compile(r"node/server/resp")),
    ("gRPC front end", re.compile(r"node/server/grpc")),
    ("node server (routing, backend)", re.compile(r"node/server/")),
    ("SDK", re.compile(r"xraft/client/|/client/(aio|sync|slots|producer|consumer|errors|retry)")),
    ("bench workload", re.compile(r"bench/cluster\.py")),
    ("protobuf", re.compile(r"google/protobuf|_message\.|upb")),
    ("grpc library", re.compile(r"grpc|cygrpc")),
    ("event loop", re.compile(r"uvloop|asyncio/|epoll|libuv")),
)
OTHER = "interpreter, GC, other"
# py-spy's --native samples every thread whether it runs or waits; a sample whose innermost frames
# wait (the loop's epoll, a thread pool's queue, grpc's poller, the GIL after a blocking call) is
# not CPU. fdatasync is not CPU either (the disk's time): counted apart.
WAITING = re.compile(r"^(epoll_wait|epoll_pwait|poll|select|pthread_cond_wait|pthread_cond_timedwait|sem_wait|"
                     r"sem_timedwait|nanosleep|clock_nanosleep|accept4?|PyThread_acquire_lock_timed|"
                     r"take_gil|drop_gil) ")
IDLE, DISK = "(waiting)", "(in fdatasync: the disk's time, not CPU)"
WAIT_DEPTH = 4                 # how many innermost frames may show the wait (libc's unnamed futex frames)


def classify(frames: list) -> str:
    inner = frames[-WAIT_DEPTH:]
    if any(WAITING.match(f) for f in inner):
        return IDLE
    if any(f.startswith("fdatasync ") or f.startswith("fsync ") for f in inner):
        return DISK
    for frame in reversed(frames):                 # innermost first
        for area, pattern in AREAS:
            if pattern.search(frame):
                return area
    return OTHER


def read_raw(path: str) -> tuple:
    """(samples by area, samples by leaf frame, running samples) of one py-spy raw file; the
    waiting and fdatasync samples are in the areas but not in the total."""
    areas, leaves, total = collections.Counter(), collections.Counter(), 0
    try:
        with open(path) as fh:
            for line in fh:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                n = int(count)
                frames = stack.split(";")
                area = classify(frames)
                areas[area] += n
                if area not in (IDLE, DISK):
                    leaves[frames[-1]] += n
                    total += n
    except FileNotFoundError:
        pass
    return areas, leaves, total


def py_spy() -> str | None:
    """py-spy beside this interpreter (a venv's bin/) or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def spy(pid: int, seconds: float, out: str) -> subprocess.Popen:
    return subprocess.Popen([py_spy(), "record", "--native", "-r", str(RATE_HZ), "-d", str(max(1, round(seconds))),
                             "-f", "raw", "-o", out, "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_phase(name: str, args, seeds: list, leader: dict, keys: tuple):
    """(operations per second, what one operation is) of one phase; bench/cluster.py's functions."""
    s = args.seconds
    if name == "batch":
        return uvloop.run(cb.sdk_batch(seeds, s)), "entry"
    if name == "sharded":
        return uvloop.run(cb.sdk_batch(seeds, s, keys)), "entry"
    if name == "idmp":
        return uvloop.run(cb.sdk_batch(seeds, s, ("idmp",), idempotent=True)), "entry"
    if name == "single":
        p50, p99, rate = uvloop.run(cb.sdk_single(seeds, s))
        print(f"  single: p50 {p50:.2f} ms p99 {p99:.2f} ms")
        return rate, "call"
    if name == "c64":
        return uvloop.run(cb.sdk_c64(seeds, s, request_ids=False))[0], "call"
    if name == "resp":
        return cb.redis_benchmark(int(leader["resp"].rsplit(":", 1)[1]), RESP_REQUESTS).get("rps") or 0.0, "command"
    raise SystemExit(f"unknown phase {name}")


def profile_phase(name: str, args, tmp: str) -> dict:
    dir_ = os.path.join(tmp, name)
    groups = cb.SHARDED_GROUPS if name == "sharded" else 1
    cluster = lc.up(dir_, nodes=3, fsync="always", groups=groups)
    try:
        seeds = [n.grpc for n in cluster.nodes]
        leader = cb.wait_leader(cluster)
        if groups > 1:                                       # leaders spread, a key per group (bench/cluster.py)
            layout = cb.layout_of(cluster)
            cb.wait_balanced(cluster, layout)
            keys = cb.keys_per_group(layout)
            pids = {f"node{n.id}": n.pid for n in cluster.nodes}
        else:
            keys = ("batch",)
            pids = cb.cluster_pids(cluster)
        uvloop.run(cb.sdk_batch(seeds, 0.5))                  # warm every path once
        watched = dict(pids)
        if name != "resp":                                   # redis-benchmark is the client there
            watched["client"] = os.getpid()
        spies = {p: spy(pid, args.seconds, os.path.join(dir_, f"{p}.raw")) for p, pid in watched.items()}
        time.sleep(0.3)                                      # py-spy attached before the load starts
        with cb.CpuMeter(pids, leader["resp"] if groups == 1 else None) as meter:
            rate, unit = run_phase(name, args, seeds, leader, keys)
        for p in spies.values():
            p.wait(timeout=60)
    finally:
        lc.down(dir_)
    result = {"phase": name, "per_s": rate, "unit": unit, "load_avg": cb.load_avg(), "cpu_pct": meter.pct,
              "leader": meter.raft, "processes": {}}
    print(f"== {name}: {rate:,.0f} {unit}s/s   [{meter.line()}]")
    for proc in watched:
        areas, leaves, total = read_raw(os.path.join(dir_, f"{proc}.raw"))
        cpu_us = meter.pct.get(proc, 0.0) / 100 * 1e6 / rate if rate else 0.0
        disk_s = areas.pop(DISK, 0) / RATE_HZ / args.seconds        # thread-seconds per second in fdatasync
        areas.pop(IDLE, None)
        rows = {a: {"share": n / total, "us_per_op": cpu_us * n / total} for a, n in areas.most_common()} if total else {}
        result["processes"][proc] = {"cpu_us_per_op": cpu_us, "samples": total, "areas": rows,
                                     "fdatasync_busy": disk_s,
                                     "top": [(f, n / total) for f, n in leaves.most_common(args.top)] if total else []}
        print(f"  {proc}: {meter.pct.get(proc, 0):.0f} % of a core, {cpu_us:.1f} µs CPU per {unit} ({total} running "
              f"samples); a thread in fdatasync {disk_s:.0%} of the time")
        for area, row in rows.items():
            if row["share"] >= 0.01:
                print(f"      {area:<32} {row['share']:6.1%}  {row['us_per_op']:8.2f} µs")
        if args.top:
            for frame, share in result["processes"][proc]["top"]:
                print(f"        {share:6.1%}  {frame[:110]}")
    return result


def run(args, tmp: str, out: dict) -> None:
    print(f"load average {cb.load_avg():.1f}, {os.cpu_count()} cores, py-spy at {RATE_HZ} Hz, "
          f"{args.seconds:g} s per phase")
    out["phases"] = [profile_phase(name.strip(), args, tmp) for name in args.phases.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", default="batch,idmp,single,c64,resp")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds per phase (and of each py-spy recording)")
    ap.add_argument("--top", type=int, default=8, help="leaf functions printed per process")
    ap.add_argument("--json", metavar="FILE", help="write the figures and splits as JSON")
    ap.add_argument("--dir", help="work directory (must not exist; default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (raw profiles, node logs)")
    args = ap.parse_args()
    if py_spy() is None:
        print("profile_targets: needs py-spy (pip install py-spy)", file=sys.stderr)
        return 2
    return cb.run_in_work_dir(args, "xraft-profile-", run)


if __name__ == "__main__":
    sys.exit(main())
