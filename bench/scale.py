"""Scale benchmark: costs that stay flat as data grows (issue 14), each beside its small-data twin.

    python bench/scale.py [--entries N] [--quick] [--json FILE] [--seconds S] [--dir DIR] [--keep]

One run, one real 3-node cluster (`ops.local_cluster.up`, fsync always, like bench/cluster.py)
and one private redis-server for the memory reference. Sizes derive from --entries N (default
10,000,000; --entries 200000 is a quick check): the group's pending list holds N/10, the
restart state is 1 GiB x N/10M (at least 16 MiB). Every size used is printed and written to
the JSON (`scale_*` keys).

1. `redis_bytes_per_entry_10m`: redis-server (`--save '' --appendonly no`), INFO memory
   used_memory before and after `redis-benchmark -n N -c 1 -P 1000 XADD big * sensor-id 1234
   temperature 19.8` (XLEN checked), divided by N.
2. `xadd_per_s_empty`: bench/cluster.py's SDK workload (xadd_batch of 100, 8 in flight, one
   client) into the empty stream `big`.
3. Load N entries into `big` (xadd_batch of LOAD_BATCH, LOAD_IN_FLIGHT in flight; progress
   printed). `bytes_per_entry_10m`: the leader's RSS (VmRSS, /proc) after the load minus before
   it, divided by the entries loaded - the node's whole cost, not the engine's estimate.
   `snapshot_bytes_per_entry_10m` beside it: the newest snapshot's data / entries (the bytes the
   engine itself serializes: listpacks, rax keys, headers).
4. A group `g` reads N/10 entries (XREADGROUP COUNT 10000): N/10 pending. Then
   `xadd_per_s_at_10m`: workload 2 again, into `big` (N entries, group with N/10 pending).
5. `xack_per_s_at_1m_pending`: XACK of 100 ids, 8 in flight, oldest first, A = min(N/10,
   200,000) ids of `g` (its PEL goes from N/10 to N/10 - A). Twin `xack_per_s_at_1k_pending`:
   the same A acks over A/1000 groups of a 1,000-entry stream, each group reading all 1,000
   first (every PEL holds at most 1,000).
6. `restart_s_1gb`: entries of 1,000-byte values go into `bulk` until a follower's state (its
   newest snapshot file + its WAL) reaches the target; that follower gets SIGKILL and is
   restarted; seconds from the restart to its applied index reaching the commit index seen
   at the kill (it has read its snapshot and replayed its WAL) and its INFO answering.
7. `snapshot_catchup_mb_per_s`: a 4th node joins (`xraftctl local add-node`, i.e. `node add`:
   a learner replica caught up, then promoted); the leader's log is compacted behind its last
   snapshot, so the learner is caught up by snapshot install. MB (1e6 bytes) of the snapshot it
   installed / seconds from its start until it applied the leader's commit index.

Nodes run with `--snapshot-entries SNAPSHOT_ENTRIES` (printed): the default counts Raft
records, and one load record carries LOAD_BATCH entries, so with the default a 10M-entry load
would never snapshot and step 7 would replay the log instead of installing a snapshot.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time

import redis
import uvloop

from xraft.client.aio import Client
from xraft.client.errors import ReplyNotKeptError
from xraft.ops import local_cluster as lc

import cluster as cb  # noqa: E402 - bench/cluster.py, beside this file

FULL_ENTRIES = 10_000_000
FULL_STATE_BYTES = 1 << 30
MIN_STATE_BYTES = 16 << 20
LOAD_BATCH = 5_000               # entries per xadd_batch while loading (grpc_convert.MAX_BATCH = 10,000)
LOAD_IN_FLIGHT = 4
READ_COUNT = 10_000              # XREADGROUP COUNT while building the pending list
ACK_IDS = 100
ACK_IN_FLIGHT = 8
MAX_ACKS = 200_000
SMALL_PEL = 1_000
BULK_VALUE = b"v" * 1000
BULK_BATCH = 500
SNAPSHOT_ENTRIES = 1_000         # node --snapshot-entries (records between snapshots)
KEEP_ENTRIES = 1_000             # GroupOptions.snapshot_keep_entries: the log kept behind a snapshot
CATCH_UP_LIMIT_S = 600.0
PROGRESS_S = 5.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass        # a snapshot .tmp renamed or a WAL segment released meanwhile
    return total


def state_bytes(data_dir: str) -> tuple:
    """(newest snapshot file + WAL bytes, newest snapshot file bytes) of a node's data directory."""
    snaps, wal = [], 0
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            path = os.path.join(root, name)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if name.endswith(".snap"):
                snaps.append((name, size))
            elif not name.endswith(".tmp") and os.sep + "wal" in root:
                wal += size
    newest = max(snaps)[1] if snaps else 0      # names sort by index (snapfile.py)
    return newest + wal, newest


# ----------------------------------------------------------------------------- redis reference

def redis_bytes_per_entry(tmp: str, n: int) -> dict:
    port = cb.free_ports(1)[0]
    d = os.path.join(tmp, "redis-mem")
    os.makedirs(d)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", d], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=cb._die_with_parent)
    try:
        r = redis.Redis(port=port)
        deadline = time.monotonic() + cb.REDIS_START_LIMIT_S
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        before = r.info("memory")
        t = time.perf_counter()
        subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(n), "-c", "1",
                        "-P", "1000", "-q", "XADD", "big", "*", "sensor-id", "1234", "temperature", "19.8"],
                       check=True, stdout=subprocess.DEVNULL, timeout=600)
        loaded_s = time.perf_counter() - t
        got = r.xlen("big")
        if got != n:
            raise RuntimeError(f"redis XLEN big = {got}, expected {n}")
        after = r.info("memory")
        r.close()
        return {"redis_bytes_per_entry_10m": (after["used_memory"] - before["used_memory"]) / n,
                "redis_rss_bytes_per_entry_10m": (after["used_memory_rss"] - before["used_memory_rss"]) / n,
                "redis_load_s": loaded_s, "redis_rss_bytes": after["used_memory_rss"]}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ----------------------------------------------------------------------------- xraft phases

async def load(seeds, key: str, n: int, fields: dict, batch: int, what: str, stop=None) -> int:
    """xadd_batch `n` entries (or until stop() is true) into key, LOAD_IN_FLIGHT requests in flight;
    prints progress every PROGRESS_S. Returns the entries written."""
    async with Client(seeds, timeout=120.0) as c:
        left, done = n, 0
        t0 = last = time.perf_counter()
        chunk = [fields] * batch

        async def loader():
            nonlocal left, done, last
            while left > 0 and not (stop and stop()):
                k = min(batch, left)
                left -= k
                try:
                    results = await c.xadd_batch(key, chunk[:k] if k < batch else chunk)
                except ReplyNotKeptError:
                    # A resend after an unknown outcome (a leader change) found the batch applied:
                    # its entries are in, only its ids are not kept for resends.
                    results = ()
                if any(isinstance(r, Exception) for r in results):
                    raise RuntimeError(f"load into {key} failed: {[r for r in results if isinstance(r, Exception)][:1]}")
                done += k
                now = time.perf_counter()
                if now - last >= PROGRESS_S:
                    last = now
                    print(f"  {what}: {done:,} entries, {done / (now - t0):,.0f}/s", flush=True)
        await asyncio.gather(*(loader() for _ in range(LOAD_IN_FLIGHT)))
        return done


async def make_pending(seeds, key: str, group: str, n: int) -> list:
    """Group `group` from 0 reads n entries of key (one consumer): returns their ids, oldest first."""
    ids = []
    async with Client(seeds, timeout=120.0) as c:
        await c.xgroup_create(key, group, id="0")
        while len(ids) < n:
            got = await c.xreadgroup(group, "worker", {key: ">"}, count=min(READ_COUNT, n - len(ids)))
            entries = got.get(key.encode()) or got.get(key) or []
            if not entries:
                raise RuntimeError(f"XREADGROUP on {key} returned nothing after {len(ids)} ids")
            ids.extend(str(e.id) for e in entries)
    return ids


async def ack_all(seeds, work: list) -> float:
    """work: [(key, group, [ids])], each list ACK_IDS ids; XACKs them all, ACK_IN_FLIGHT in flight.
    Returns ids acked per second (every XACK must ack all its ids)."""
    async with Client(seeds) as c:
        queue = list(reversed(work))
        acked = 0

        async def worker():
            nonlocal acked
            while queue:
                key, group, ids = queue.pop()
                got = await c.xack(key, group, *ids)
                if got != len(ids):
                    raise RuntimeError(f"XACK {key} {group} acked {got} of {len(ids)}")
                acked += got
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(ACK_IN_FLIGHT)))
        return acked / (time.perf_counter() - t)


async def small_pel_work(seeds, acks: int) -> list:
    """acks/SMALL_PEL groups on a SMALL_PEL-entry stream, each having read it all: their XACK work."""
    async with Client(seeds) as c:
        await c.xadd_batch("small", [cb.FIELDS] * SMALL_PEL)
    groups = max(1, acks // SMALL_PEL)
    work = []
    sem = asyncio.Semaphore(8)

    async def one(i):
        async with sem:
            ids = await make_pending(seeds, "small", f"s{i}", SMALL_PEL)
        work.extend(("small", f"s{i}", ids[j:j + ACK_IDS]) for j in range(0, len(ids), ACK_IDS))
    await asyncio.gather(*(one(i) for i in range(groups)))
    return work     # group after group, oldest first within each: as the big PEL's acks are ordered


def wait_applied(cluster, target: int | None = None, node_id: int | None = None,
                 limit: float = CATCH_UP_LIMIT_S) -> float:
    """Seconds until node_id (else every node) applied `target` (else the leader's commit index)."""
    t0 = time.monotonic()
    while True:
        rows = lc.status(cluster, timeout=2.0)
        leader = lc.leader_of(rows)
        want = target if target is not None else (int(leader["commit_index"]) if leader else None)
        watched = [r for r in rows if node_id is None or r["id"] == node_id]
        if want is not None and watched and all(r["alive"] and r["applied_index"] is not None
                                                and int(r["applied_index"]) >= want for r in watched):
            return time.monotonic() - t0
        if time.monotonic() - t0 > limit:
            raise RuntimeError(f"not applied {want} within {limit:g} s: {rows}")
        time.sleep(0.05)


def meter(cluster) -> cb.CpuMeter:
    """CPU of every node and of us over a block, and the group commit of the leader as it is now."""
    return cb.CpuMeter(cb.cluster_pids(cluster), cb.wait_leader(cluster)["resp"])


def follower_of(cluster) -> lc.NodeInfo:
    leader = cb.wait_leader(cluster)
    return next(n for n in cluster.nodes if n.id != leader["id"])


def run(args, tmp: str, out: dict) -> None:
    n = args.entries
    pending = max(SMALL_PEL, n // 10)
    acks = min(pending, MAX_ACKS) // ACK_IDS * ACK_IDS
    state_target = args.state_mb << 20 if args.state_mb else max(MIN_STATE_BYTES, FULL_STATE_BYTES * n // FULL_ENTRIES)
    s = args.seconds
    out.update(scale_entries=n, scale_pending=pending, scale_acks=acks, scale_state_target_bytes=state_target,
               scale_snapshot_entries=args.snapshot_entries, scale_load_avg_start=cb.load_avg())
    print(f"xraft scale benchmark: {n:,} entries, {pending:,} pending, {acks:,} acks per XACK figure, "
          f"restart state {state_target / 2**20:,.0f} MiB; {s:g} s per XADD phase; nodes --snapshot-entries "
          f"{args.snapshot_entries}; load average {out['scale_load_avg_start']:.1f}", flush=True)
    t_all = time.perf_counter()

    ref = redis_bytes_per_entry(tmp, n)
    out.update(ref)
    print(f"redis: {n:,} entries loaded in {ref['redis_load_s']:.1f} s; used_memory "
          f"{ref['redis_bytes_per_entry_10m']:.2f} bytes/entry (RSS {ref['redis_rss_bytes_per_entry_10m']:.2f})",
          flush=True)

    dir_ = os.path.join(tmp, "cluster")
    try:
        cluster = lc.up(dir_, nodes=3, fsync="always", node_args=["--snapshot-entries", str(args.snapshot_entries)])
        seeds = [n_.grpc for n_ in cluster.nodes]
        leader = cb.wait_leader(cluster)

        with meter(cluster) as m:
            out["xadd_per_s_empty"] = uvloop.run(cb.sdk_batch(seeds, s, ("big",)))
        print(f"xadd_per_s_empty: {out['xadd_per_s_empty']:,.0f} entries/s   [{m.line()}]", flush=True)

        wait_applied(cluster)
        rss0 = {x.id: rss_bytes(x.pid) for x in cluster.nodes}
        t = time.perf_counter()
        with meter(cluster) as m:
            loaded = uvloop.run(load(seeds, "big", n, cb.FIELDS, LOAD_BATCH, "load"))
        wait_applied(cluster)
        load_s = time.perf_counter() - t
        rss1 = {x.id: rss_bytes(x.pid) for x in cluster.nodes}
        per_node = {i: (rss1[i] - rss0[i]) / loaded for i in rss1}
        rss1 = rss1[leader["id"]]
        out.update(scale_load_s=load_s, scale_load_entries_per_s=loaded / load_s,
                   bytes_per_entry_10m=per_node[leader["id"]], scale_leader_rss_bytes=rss1,
                   scale_rss_bytes_per_entry_by_node=per_node)
        _, snap = state_bytes(next(x for x in cluster.nodes if x.id == leader["id"]).data_dir)
        out["snapshot_bytes_per_entry_10m"] = snap / (loaded + out["xadd_per_s_empty"] * s)
        held = lc.raft_info(leader["resp"], timeout=5.0) or {}           # the storage's caches (INFO raft)
        out["scale_leader_log_cache_bytes"] = int(held.get("raft_log_cache_bytes", 0))
        out["scale_leader_snapshot_cache_bytes"] = int(held.get("raft_snapshot_cache_bytes", 0))
        print(f"loaded {loaded:,} entries in {load_s:.1f} s ({loaded / load_s:,.0f}/s)   [{m.line()}]")
        print(f"bytes_per_entry_10m (leader RSS delta): {out['bytes_per_entry_10m']:.2f} vs redis used_memory "
              f"{out['redis_bytes_per_entry_10m']:.2f} ({out['bytes_per_entry_10m'] / out['redis_bytes_per_entry_10m']:.2f}x;"
              f" target <= 1.0x; every node: {', '.join(f'{v:.1f}' for v in per_node.values())}); leader RSS {rss1 / 2**20:,.0f} MiB; newest snapshot {snap / 2**20:,.1f} MiB "
              f"({out['snapshot_bytes_per_entry_10m']:.2f} bytes/entry); the leader's storage holds "
              f"{out['scale_leader_log_cache_bytes'] / 2**20:,.1f} MiB of log entries and "
              f"{out['scale_leader_snapshot_cache_bytes'] / 2**20:,.1f} MiB of snapshot in memory", flush=True)

        t = time.perf_counter()
        big_ids = uvloop.run(make_pending(seeds, "big", "g", pending))
        print(f"group g: {len(big_ids):,} pending in {time.perf_counter() - t:.1f} s", flush=True)

        with meter(cluster) as m:
            out["xadd_per_s_at_10m"] = uvloop.run(cb.sdk_batch(seeds, s, ("big",)))
        out["xadd_at_10m_vs_empty"] = out["xadd_per_s_at_10m"] / out["xadd_per_s_empty"]
        print(f"xadd_per_s_at_10m: {out['xadd_per_s_at_10m']:,.0f} entries/s = {out['xadd_at_10m_vs_empty']:.2f}x "
              f"empty (target >= 0.8x)   [{m.line()}]", flush=True)

        small = uvloop.run(small_pel_work(seeds, acks))
        with meter(cluster) as m:
            out["xack_per_s_at_1k_pending"] = uvloop.run(ack_all(seeds, small))
        print(f"xack_per_s_at_1k_pending: {out['xack_per_s_at_1k_pending']:,.0f} ids/s ({len(small) // 10} groups "
              f"of {SMALL_PEL})   [{m.line()}]", flush=True)
        big = [("big", "g", big_ids[j:j + ACK_IDS]) for j in range(0, acks, ACK_IDS)]
        with meter(cluster) as m:
            out["xack_per_s_at_1m_pending"] = uvloop.run(ack_all(seeds, big))
        out["xack_at_1m_vs_1k"] = out["xack_per_s_at_1m_pending"] / out["xack_per_s_at_1k_pending"]
        print(f"xack_per_s_at_1m_pending: {out['xack_per_s_at_1m_pending']:,.0f} ids/s = "
              f"{out['xack_at_1m_vs_1k']:.2f}x the 1k figure (target >= 0.8x)   [{m.line()}]", flush=True)
        del big_ids, big, small

        restart(cluster, dir_, seeds, state_target, out)
        cluster = lc.load(dir_)
        catch_up(cluster, seeds, out)
    finally:
        if lc.cluster_file(dir_).exists():
            lc.down(dir_)
    out["scale_total_s"] = time.perf_counter() - t_all
    out["scale_load_avg_end"] = cb.load_avg()
    print(f"scale benchmark done in {out['scale_total_s']:.0f} s; load average {out['scale_load_avg_end']:.1f}")


def restart(cluster, dir_: str, seeds, state_target: int, out: dict) -> None:
    victim = follower_of(cluster)
    bulk_fields = {b"payload": BULK_VALUE}
    size = state_bytes(victim.data_dir)[0]
    if size < state_target:
        t = time.perf_counter()
        loaded = uvloop.run(load(seeds, "bulk", 1 << 40, bulk_fields, BULK_BATCH, "1 KB entries",
                                 stop=lambda: state_bytes(victim.data_dir)[0] >= state_target))
        wait_applied(cluster)
        print(f"added {loaded:,} entries of 1,000-byte values in {time.perf_counter() - t:.1f} s", flush=True)
    size, snap = state_bytes(victim.data_dir)
    leader = cb.wait_leader(cluster)
    target = int(leader["commit_index"])
    wait_applied(cluster, target, victim.id)
    lc.kill(dir_, victim.id, "KILL")
    t = time.perf_counter()
    lc.up(dir_, fsync="always", timeout=CATCH_UP_LIMIT_S)
    started = time.perf_counter() - t
    wait_applied(lc.load(dir_), target, victim.id)
    out["restart_s_1gb"] = time.perf_counter() - t
    out.update(restart_state_bytes=size, restart_snapshot_bytes=snap, restart_start_s=started)
    print(f"restart_s_1gb: node {victim.id} with {size / 2**20:,.0f} MiB of state (snapshot {snap / 2**20:,.0f} "
          f"MiB + WAL) served its data {out['restart_s_1gb']:.1f} s after the restart (logged ready after "
          f"{started:.1f} s; target <= 30 s)", flush=True)


def catch_up(cluster, seeds, out: dict) -> None:
    """A follower is stopped (SIGSTOP) while writes move the leader's snapshot past what its log
    keeps behind it, then continued: the leader can only send it a snapshot."""
    victim = follower_of(cluster)
    others = [n for n in cluster.nodes if n.id != victim.id]
    # Its log's end, not its applied index: the leader may already have sent it more.
    behind = int(lc.raft_info(victim.resp, timeout=5.0)["raft_last_index"])
    installed0 = int(lc.raft_info(victim.resp, timeout=5.0).get("raft_snapshots_installed", 0))
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        def compacted_past() -> bool:
            # Every other node's log starts past the victim's (whichever of them leads now):
            # snapshot index - KEEP_ENTRIES is where a log starts; a margin of KEEP_ENTRIES more.
            infos = [lc.raft_info(n.resp, timeout=5.0) or {} for n in others]
            return min(int(i.get("raft_snapshot_index", 0)) for i in infos) > behind + 2 * KEEP_ENTRIES + 1
        # small batches of 1 KB entries: many Raft records and enough log bytes (an image is due
        # once the log is 1/16 of the last one, driver_snapshots.SNAPSHOT_LOG_RATIO), so the
        # leader snapshots and compacts soon
        written = uvloop.run(load(seeds, "gap", 1 << 40, {b"payload": BULK_VALUE}, 10,
                                  "writes while a follower is stopped", stop=compacted_past))
        commit = int(cb.wait_leader(cluster)["commit_index"])
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    t = time.perf_counter()
    wait_applied(cluster, commit, victim.id)
    secs = time.perf_counter() - t
    info = lc.raft_info(victim.resp, timeout=5.0) or {}
    installed = int(info.get("raft_snapshots_installed", 0)) - installed0
    _, snap = state_bytes(victim.data_dir)
    out.update(snapshot_catchup_s=secs, snapshot_catchup_bytes=snap, snapshot_catchup_installed=installed)
    out["snapshot_catchup_mb_per_s"] = snap / 1e6 / secs if installed else 0.0
    print(f"snapshot_catchup_mb_per_s: node {victim.id}, stopped while {written:,} entries were written, installed "
          f"{installed} snapshot(s) of {snap / 1e6:,.1f} MB and caught up {secs:.1f} s after SIGCONT = "
          f"{out['snapshot_catchup_mb_per_s']:.1f} MB/s (target >= 50)", flush=True)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--entries", type=int, default=FULL_ENTRIES, help="entries in the big stream (default 10M)")
    ap.add_argument("--state-mb", type=int, help="restart state in MiB (default 1024 x entries / 10M, >= 16)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    ap.add_argument("--quick", action="store_true", help="smoke run: --entries 20000 --seconds 1 --state-mb 4 "
                                                         "--snapshot-entries 200")
    ap.add_argument("--snapshot-entries", type=int, default=SNAPSHOT_ENTRIES,
                    help=f"the nodes' --snapshot-entries (default {SNAPSHOT_ENTRIES})")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per XADD phase (default 5)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (node logs)")
    ap.add_argument("--dir", help="work directory (must not exist; default: a new temporary one)")
    args = ap.parse_args()
    if args.quick:
        args.entries, args.seconds, args.state_mb, args.snapshot_entries = 20_000, 1.0, 4, 200
    if not 1_000 <= args.entries <= 100_000_000:
        ap.error("--entries must be in [1000, 100000000]")
    for tool in ("redis-server", "redis-benchmark"):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not installed (./dev test installs it)")
    return cb.run_in_work_dir(args, "xraft-bench-scale-", run)


if __name__ == "__main__":
    sys.exit(main())
