"""Where one XADD's time goes: a per-phase breakdown measured on real processes (issue 14).

    python bench/latency.py [--seconds S] [--json FILE] [--dir DIR] [--no-untraced] [--profile TOP]

A 3-node cluster (`ops.local_cluster.up`, `--fsync always`) is started with
XRAFT_LATENCY_TRACE set (node/runtime/latency_trace.py): every node then stamps
the steps below with CLOCK_MONOTONIC, which all processes on one machine share,
and writes them out as it exits. One SDK client sends XADDs one at a time for
--seconds (after a warm-up), stamping each send and reply with the same clock.
Each write is followed through the processes by time (its leader events fall
between its send and its reply) and by log index, along its critical path
through the follower whose acknowledgement reached the leader first:

    client send -> leader rpc_in (gRPC handler entered) -> submit (RaftBackend)
    -> propose (appended to the leader's log: index X) -> queued_app (MsgApp X
    handed to the peer transport) -> write_app (the link writer takes it) ->
    follower in_app (read off the stream) -> follower persist_start ->
    persist_done (append + fsync) -> follower queued_resp (ack queued) ->
    write_resp -> leader in_resp -> commit (the Ready that commits X) ->
    applied -> rpc_out (handler returns) -> client reply

The phases telescope: their sum is the client's latency. Beside the path, the
leader's own write of X: propose -> persist_start (executor hop) -> persist_done
(its fsync) -> persisted (back on the loop), and how often the commit waited
for it rather than for the follower's ack.

Printed beside, from the same run: the fsync floor (bench/wal_sync.py's
append+fsync of one 300-byte record, one process alone), the gRPC unary c1
floor (bench/grpc_floor.py) and, unless --no-untraced, the same SDK loop
against an untraced cluster (what the trace points cost). --profile TOP runs
the loop once more under cProfile in every node and in the client and prints
each one's TOP functions by own time, in microseconds per write.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections import defaultdict

import uvloop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cb  # noqa: E402 - bench/cluster.py: floors, CPU meter, the SDK loop
import wal_sync  # noqa: E402 - bench/wal_sync.py: the fsync floor

from xraft.client.aio import Client  # noqa: E402
from xraft.node.runtime.wal import FsyncPolicy  # noqa: E402
from xraft.ops import local_cluster as lc  # noqa: E402

TRACE_ENV = "XRAFT_LATENCY_TRACE"   # node/runtime/latency_trace.py ENV
CPROFILE_ENV = "XRAFT_CPROFILE"     # node/server/node_main.py: the node runs under cProfile
MAX_WRITES = 200_000                # per run: the client keeps its stamps in memory

# (name, from event, to event); "c0"/"c1" are the client's stamps, "F." a follower's events.
PATH = (
    ("client -> leader handler", "c0", "rpc_in"),
    ("handler -> submit", "rpc_in", "submit"),
    ("submit -> propose (group commit, pump)", "submit", "propose"),
    ("propose -> MsgApp queued", "propose", "queued_app"),
    ("MsgApp queued -> link writer runs", "queued_app", "write_app"),
    ("writer -> follower read (gRPC, wire)", "write_app", "F.in_app"),
    ("follower read -> WAL write start", "F.in_app", "F.persist_start"),
    ("follower append + fsync", "F.persist_start", "F.persist_done"),
    ("follower fsync -> ack queued", "F.persist_done", "F.queued_resp"),
    ("ack queued -> link writer runs", "F.queued_resp", "F.write_resp"),
    ("writer -> leader read (gRPC, wire)", "F.write_resp", "in_resp"),
    ("ack read -> commit", "in_resp", "commit"),
    ("apply", "commit", "applied"),
    ("applied -> handler returns", "applied", "rpc_out"),
    ("handler returns -> client reply", "rpc_out", "c1"),
)
# The path's phases by what bounds them: the floors (gRPC, the peer streams, the disk) and the
# Python steps of each process. Each write's phases add up per group; p50/p99 are over writes.
GROUPS = (
    ("client <-> leader gRPC (SDK, unary call, handler entry/exit)",
     ("client -> leader handler", "handler returns -> client reply")),
    ("peer streams (writer task hop, gRPC write, wire, read), both ways",
     ("MsgApp queued -> link writer runs", "writer -> follower read (gRPC, wire)",
      "ack queued -> link writer runs", "writer -> leader read (gRPC, wire)")),
    ("follower append + fsync", ("follower append + fsync",)),
    ("leader Python (handler, group commit, propose, Ready, commit, apply)",
     ("handler -> submit", "submit -> propose (group commit, pump)", "propose -> MsgApp queued",
      "ack read -> commit", "apply", "applied -> handler returns")),
    ("follower Python (step the append, queue the ack)",
     ("follower read -> WAL write start", "follower fsync -> ack queued")),
)
LEADER_WRITE = (
    ("leader: propose -> WAL write start (executor)", "propose", "persist_start"),
    ("leader: append + fsync", "persist_start", "persist_done"),
    ("leader: fsync done -> back on its loop", "persist_done", "persisted"),
)


def load_traces(trace_dir: str, pid_to_node: dict) -> dict:
    """node id -> event -> key -> [times ns] (ascending), and node id -> event -> [(t, key, peer)]."""
    by_key: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    seq: dict = defaultdict(lambda: defaultdict(list))
    for name in os.listdir(trace_dir):
        pid = int(name.split("-", 1)[1].split(".")[0])
        node = pid_to_node.get(pid)
        if node is None:
            continue
        with open(os.path.join(trace_dir, name)) as fh:
            for line in fh:
                t, event, key, peer = line.split("\t")
                t, key, peer = int(t), int(key), int(peer)
                by_key[node][event][key].append((t, peer))
                seq[node][event].append((t, key, peer))
    for node in seq:
        for event in seq[node]:
            seq[node][event].sort()
    return by_key, seq


def _first(times, after: int, peer: int | None = None):
    for t, p in sorted(times):
        if t >= after and (peer is None or p == peer):
            return t
    return None


def follow(writes: list, by_key: dict, seq: dict) -> tuple[list, dict]:
    """One dict of stamps per write that could be followed end to end; counts of the rest."""
    import bisect
    leaders = [n for n in seq if seq[n].get("propose")]
    skipped: dict = defaultdict(int)
    if len(leaders) != 1:
        raise RuntimeError(f"expected one node that proposed, got {leaders}")
    lead = leaders[0]
    L, Ls = by_key[lead], seq[lead]
    followers = [n for n in by_key if n != lead]
    proposes = Ls["propose"]
    ptimes = [t for t, _, _ in proposes]
    rpc_in = [t for t, _, _ in Ls.get("rpc_in", [])]
    rpc_out = [t for t, _, _ in Ls.get("rpc_out", [])]
    submits = [t for t, _, _ in Ls.get("submit", [])]
    out = []
    for c0, c1 in writes:
        i, j = bisect.bisect_left(ptimes, c0), bisect.bisect_right(ptimes, c1)
        if j - i != 1:
            skipped[f"{j - i} proposals in the window"] += 1
            continue
        t_prop, x, _ = proposes[i]
        st = {"c0": c0, "c1": c1, "propose": t_prop}
        k = bisect.bisect_left(rpc_in, c0)
        st["rpc_in"] = rpc_in[k] if k < len(rpc_in) and rpc_in[k] <= t_prop else None
        k = bisect.bisect_left(submits, c0)
        st["submit"] = submits[k] if k < len(submits) and submits[k] <= t_prop else None
        k = bisect.bisect_right(rpc_out, c1) - 1
        st["rpc_out"] = rpc_out[k] if k >= 0 and rpc_out[k] >= t_prop else None
        for ev in ("persist_start", "persist_done", "persisted", "commit", "applied"):
            st[ev] = _first(L.get(ev, {}).get(x, ()), t_prop)
        # The follower whose ack for x reached the leader first.
        best = None
        for f in followers:
            t_in = _first(L.get("in_resp", {}).get(x, ()), t_prop, f)
            if t_in is not None and (best is None or t_in < best[1]):
                best = (f, t_in)
        if best is None:
            skipped["no ack for its index"] += 1
            continue
        f, st["in_resp"] = best
        st["queued_app"] = _first(L.get("queued_app", {}).get(x, ()), t_prop, f)
        st["write_app"] = _first(L.get("write_app", {}).get(x, ()), t_prop, f)
        F = by_key[f]
        for ev in ("in_app", "persist_start", "persist_done"):
            st["F." + ev] = _first(F.get(ev, {}).get(x, ()), t_prop)
        for ev in ("queued_resp", "write_resp"):
            st["F." + ev] = _first(F.get(ev, {}).get(x, ()), t_prop, lead)
        missing = [k for k, v in st.items() if v is None]
        if missing:
            skipped["missing " + ",".join(sorted(missing))] += 1
            continue
        st["waited_for_leader_fsync"] = st["persisted"] > st["in_resp"]
        out.append(st)
    return out, dict(skipped)


def _row(d: list) -> tuple:
    d = sorted(d)
    return statistics.median(d), cb.pct(d, 0.99), statistics.fmean(d)


def summarize(stamps: list) -> tuple[dict, dict]:
    """(phase -> (p50, p99, mean) ms, group -> the same over each write's sum of its phases)."""
    steps = {name: (a, b) for name, a, b in PATH + LEADER_WRITE + (("total (client)", "c0", "c1"),)}
    rows = {name: _row([(s[b] - s[a]) / 1e6 for s in stamps]) for name, (a, b) in steps.items()}
    groups = {}
    for gname, members in GROUPS:
        groups[gname] = _row([sum(s[steps[m][1]] - s[steps[m][0]] for m in members) / 1e6 for s in stamps])
    return rows, groups


async def sdk_sequential(seeds, seconds: float) -> list:
    """(send ns, reply ns) of one client's sequential XADDs in the window after a warm-up."""
    clock = time.monotonic_ns
    async with Client(seeds) as c:
        start = clock() + int(cb.WARMUP_S * 1e9)
        end = start + int(seconds * 1e9)
        out = []
        while len(out) < MAX_WRITES:
            t0 = clock()
            if t0 >= end:
                break
            await c.xadd("single", cb.FIELDS)
            t1 = clock()
            if t0 >= start:
                out.append((t0, t1))
        return out


def run_cluster(dir_: str, seconds: float, env: dict, client_profile=None):
    """(writes, pid -> node id, CPU line, leader id) of the sequential loop on a fresh 3-node
    cluster whose nodes start with `env` added to ours (the trace or cProfile variables);
    `client_profile`: a cProfile.Profile run around the client's loop."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        cluster = lc.up(dir_, nodes=3, fsync="always")
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        seeds = [n.grpc for n in cluster.nodes]
        pids = {n.pid: n.id for n in cluster.nodes}
        leader = cb.wait_leader(cluster)
        with cb.CpuMeter(cb.cluster_pids(cluster), leader["resp"]) as m:
            if client_profile is not None:
                client_profile.enable()
            try:
                writes = uvloop.run(sdk_sequential(seeds, seconds))
            finally:
                if client_profile is not None:
                    client_profile.disable()
    finally:
        lc.down(dir_)   # SIGTERM: each node writes its trace (or profile) as it exits
    return writes, pids, m.line(), leader["id"]


def print_profile(title: str, stats, writes: int, top: int) -> None:
    """The `top` functions by own time, in microseconds per write (cProfile inflates them all).
    Only functions called at least once per two writes: the process's start-up, its idle
    tasks and the loop's own wait (`run`) are not the write's."""
    import pstats
    st = pstats.Stats(stats)
    per_write = {k: v for k, v in st.stats.items() if v[1] >= writes / 2 and k[2] != "run"}
    rows = sorted(per_write.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in per_write.values())
    print(f"\n{title}: {total / writes * 1e6:,.0f} us of profiled main-thread time per write in functions "
          f"called at least every other write; top {top} by own time, us per write:")
    for (file, line, fn), (_, ncalls, tottime, cumtime, _) in rows:
        where = f"{os.path.basename(file)}:{line}" if line else file
        print(f"  {tottime / writes * 1e6:8.1f}  {cumtime / writes * 1e6:8.1f} cum  "
              f"{ncalls / writes:6.1f} calls  {fn} ({where})")


def profile_run(tmp: str, seconds: float, top: int) -> None:
    """The loop again with every node under cProfile (node_main XRAFT_CPROFILE) and the
    client's loop under cProfile here: where each process's Python time per write goes."""
    import cProfile
    prof_dir = os.path.join(tmp, "profile")
    os.makedirs(prof_dir)
    client = cProfile.Profile()
    writes, _, line, leader = run_cluster(os.path.join(tmp, "profiled"), seconds,
                                          {CPROFILE_ENV: prof_dir}, client)
    print(f"\nprofiled cluster (cProfile in every node and the client): {len(writes)} writes   [{line}]")
    print_profile("client (SDK)", client, len(writes), top)
    follower = next(n for n in (1, 2, 3) if n != leader)
    for node, role in ((leader, "leader"), (follower, "a follower")):
        path = os.path.join(prof_dir, f"node-{node}.prof")
        if os.path.exists(path):
            print_profile(f"node {node} ({role})", path, len(writes), top)


def client_figures(writes: list) -> tuple:
    lat = sorted((b - a) / 1e6 for a, b in writes)
    return statistics.median(lat), cb.pct(lat, 0.99)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json")
    ap.add_argument("--dir")
    ap.add_argument("--no-untraced", action="store_true", help="skip the untraced cluster's run")
    ap.add_argument("--profile", type=int, default=0, metavar="TOP",
                    help="also run the loop under cProfile (every node and the client) and print "
                         "each one's TOP functions by own time per write")
    args = ap.parse_args()
    tmp = cb.work_dir(args.dir, "xraft-latency-")
    out: dict = {"load_avg_start": cb.load_avg()}
    try:
        print(f"xraft single-XADD latency breakdown: {os.cpu_count()} cores, load average "
              f"{out['load_avg_start']:.1f}, {args.seconds:g} s per phase")
        p50, p99, _, n = wal_sync.run(FsyncPolicy.ALWAYS, 1, min(args.seconds, 3.0))
        out.update(fsync_p50_ms=p50 / 1e3, fsync_p99_ms=p99 / 1e3)
        print(f"fsync floor (WAL append+fsync of 300 bytes, one process): p50 {p50 / 1e3:.3f} ms "
              f"p99 {p99 / 1e3:.3f} ms ({n} syncs)")
        floor = cb.grpc_floor(args.seconds, tmp)
        out.update(grpc_floor_p50_ms=floor["grpc_floor_p50_ms"], grpc_floor_p99_ms=floor["grpc_floor_p99_ms"])
        print(f"gRPC floor unary c1: p50 {floor['grpc_floor_p50_ms']:.3f} ms p99 {floor['grpc_floor_p99_ms']:.3f} ms")
        if not args.no_untraced:
            writes, _, line, _ = run_cluster(os.path.join(tmp, "plain"), args.seconds, {})
            p50, p99 = client_figures(writes)
            out.update(untraced_xadd_p50_ms=p50, untraced_xadd_p99_ms=p99, untraced_writes=len(writes))
            print(f"untraced cluster, SDK xadd one at a time: p50 {p50:.3f} ms p99 {p99:.3f} ms "
                  f"({len(writes)} writes)   [{line}]")
        trace_dir = os.path.join(tmp, "trace")
        os.makedirs(trace_dir)
        writes, pids, line, _ = run_cluster(os.path.join(tmp, "traced"), args.seconds, {TRACE_ENV: trace_dir})
        p50, p99 = client_figures(writes)
        out.update(xadd_p50_ms=p50, xadd_p99_ms=p99, traced_writes=len(writes))
        print(f"traced cluster, SDK xadd one at a time: p50 {p50:.3f} ms p99 {p99:.3f} ms "
              f"({len(writes)} writes)   [{line}]")
        by_key, seq = load_traces(trace_dir, pids)
        stamps, skipped = follow(writes, by_key, seq)
        out.update(followed=len(stamps), skipped=skipped)
        if not stamps:
            raise RuntimeError(f"no write could be followed through the trace: {skipped}")
        rows, groups = summarize(stamps)
        waited = sum(s["waited_for_leader_fsync"] for s in stamps) / len(stamps)
        out.update(phases_ms={k: {"p50": v[0], "p99": v[1], "mean": v[2]} for k, v in rows.items()},
                   groups_ms={k: {"p50": v[0], "p99": v[1], "mean": v[2]} for k, v in groups.items()},
                   commit_waited_for_leader_fsync=waited)
        print(f"\n{len(stamps)} of {len(writes)} writes followed end to end"
              + (f" (skipped: {skipped})" if skipped else ""))
        print(f"{'phase':48} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
        for name, (a, b, c) in rows.items():
            if name.startswith("leader:") and "rule" not in out:
                out["rule"] = True
                print("  beside the path, the leader's own write:")
            print(f"{name:48} {a:8.3f} {b:8.3f} {c:8.3f}")
        out.pop("rule", None)
        print(f"sum of the path's means: {sum(rows[n][2] for n, _, _ in PATH):.3f} ms (= the total's mean)")
        print(f"the commit waited for the leader's own fsync (not the ack) in {waited:.0%} of writes")
        # Does the leader's own WAL write (executor thread, GIL) slow the MsgApp's way out?
        flight = {True: [], False: []}
        for st in stamps:
            flight[st["write_app"] <= st["persist_start"] <= st["F.in_app"]].append(
                (st["F.in_app"] - st["write_app"]) / 1e6)
        out["msgapp_flight_p50_ms"] = {"leader_wal_write_during": statistics.median(flight[True] or [math.nan]),
                                       "not_during": statistics.median(flight[False] or [math.nan]),
                                       "share_during": len(flight[True]) / len(stamps)}
        print("MsgApp writer -> follower read, p50: {leader_wal_write_during:.3f} ms when the leader's WAL write "
              "started in between ({share_during:.0%} of writes), {not_during:.3f} ms otherwise"
              .format(**out["msgapp_flight_p50_ms"]))
        print(f"\n{'the path by what bounds it':72} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
        for name, (a, b, c) in groups.items():
            print(f"{name:72} {a:8.3f} {b:8.3f} {c:8.3f}")
        print(f"floors: fsync p50 {out['fsync_p50_ms']:.3f} ms, gRPC unary c1 p50 {out['grpc_floor_p50_ms']:.3f} ms")
        if args.profile:
            profile_run(tmp, args.seconds, args.profile)
    finally:
        out["load_avg_end"] = cb.load_avg()
        print(f"load average at the end: {out['load_avg_end']:.1f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
