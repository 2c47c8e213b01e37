"""Cluster benchmark: a real 3-node xraft cluster (fsync always) beside redis-server with 2 replicas.

    python bench/cluster.py [--quick] [--json FILE] [--seconds S] [--dir DIR] [--keep]

Everything runs in one process run, so each xraft figure is printed beside a
reference measured a moment earlier on the same (shared, 2-core) machine:

* the raw Python gRPC floor (bench/grpc_floor.py in a subprocess: an echo
  server with no xraft in it): unary c1 p50/p99 and unary calls/s at 64 in
  flight, i.e. what grpc.aio alone costs;
* redis-server 7.0: a primary and 2 `--replicaof` replicas on free ports,
  `--save '' --appendonly no`; `WAIT 1 0` after each write batch is the
  closest redis has to "acknowledged by a replica" (no fsync anywhere, so it
  is a floor for the wire + replication, not a like-for-like durability);
* xraft: `ops.local_cluster.up(nodes=3, fsync="always")` starts real
  `xraft-node` processes; every write below is committed (leader + one
  follower fsynced) before it is acknowledged.

Phases (each runs --seconds, default 5, --quick 1, after a 0.5 s warm-up;
entries are `sensor-id 1234 temperature 19.8` everywhere):

1. XADD batches of 100 through the SDK (`xadd_batch`, BATCH_CONCURRENCY
   batches in flight on one client) vs redis.asyncio pipelines of 100 XADD +
   `WAIT 1 0`, the same number of pipelines in flight; and the same through the
   SDK's IDMP producer: BATCH_ROUNDS rounds alternating plain and IDMP
   (batch_rounds), each kind --seconds in all;
2. single XADD latency, one client, one request at a time: SDK `xadd` vs
   redis-py XADD + WAIT 1 0 (pipelined: one round trip) vs gRPC floor c1;
3. single XADD, 64 in flight on one SDK client vs the floor's unary c64. The
   SDK's default request ids (server-side dedup) allow only 8 tracked writes
   in flight per client, so the c64 figure uses `request_ids=False` (all 64
   really in flight, as in the floor); the default client is printed too;
4. consumer group through `Consume`: preload entries first (100,000; --quick
   5,000), then one session with max_batch=100 acking each 100 deliveries
   with one ack message, up to 8 acks in flight (see sdk_consume); entries/s
   from the first delivery to the last ack confirmed (all n confirmed and 0
   left pending, else the run fails). Again with max_batch=1000 through a
   second group over the same entries;
5. `redis-benchmark -n N -c 50 -P 16 XADD bench * f v` against the leader's
   RESP port and against the redis primary (with its 2 replicas):
   `resp_pipelined_xadd_per_s` beside `redis_replicas_pipelined_xadd_per_s`
   (bench/resp_pipeline.py runs this phase alone, with --profile);
6. failover: a sequential SDK writer runs; the leader gets SIGKILL; the
   figure is the time from the kill to the first write acknowledged by the new
   leader (the SDK client is built with backoff_max=0.1 s so its retry back-off
   adds at most ~0.1 s to what the cluster itself takes). The killed node is
   restarted from disk and caught up before the next repetition (3; --quick 1);
7. sharded batch: a second 3-node cluster with `--groups 6` (SHARDED_GROUPS);
   once every node leads 2 groups (leader_balance.py), phase 1's SDK workload
   (one client, BATCH_CONCURRENCY batches of 100 in flight) with each batch
   sent to the next group's key, so all three nodes lead writes. Printed with
   its ratio to phase 1's one-group figure (target >= 1.5x). Then cross-shard
   consume: 100,000 entries (--quick 5,000) preloaded over the six groups'
   streams, read by ONE SDK consume() over all six (one Consume per slot,
   merged; crossshard.py) acking each stream's ids 100 at a time:
   `crossshard_consume_entries_per_s`, printed beside phase 4's single-stream
   Consume figure (target >= 1x) and beside the same number of entries read from
   ONE stream by one Consume session on this same 6-group cluster
   (`crossshard_single_stream_same_cluster_entries_per_s`: like with like, since
   the 6-group cluster itself costs more per entry than the 1-group one).
   Also phase 5 with `redis-benchmark --cluster` (`XADD bench{tag}`: each
   connection to a slot its node serves): `sharded_resp_pipelined_xadd_per_s`.
8. slot move, on the same sharded cluster (bench/slot_move.py): a slot holding a stream of
   100k entries (--quick 5k) with a group of 10k (1k) pending entries moves to another group
   while probes write to it and to another group: slot_move_s, slot_move_write_wait_ms
   (targets <= 5 s, <= 1000 ms), slot_move_frozen_ms, slot_move_other_write_max_ms, and
   slot_move_other_group_wait_ms beside no_move_other_group_wait_ms (the same probe, an
   equally long window just before the move: does the move make other groups wait?).

Per phase the CPU use of each process (% of one core, from /proc) is printed:
on a 2-core machine with 3 nodes + the client, it shows which process limits
a figure. Load average is printed at start and end: other work on the machine
depresses every wall-clock figure here, the references included.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import redis
import redis.asyncio
import uvloop

from xraft.client.aio import Client
from xraft.client.errors import XRaftError
from xraft.client.slots import key_slot
from xraft.ops import local_cluster as lc

import resp_pipeline  # noqa: E402 - bench/resp_pipeline.py, beside this file
import slot_move  # noqa: E402 - bench/slot_move.py, beside this file
from resp_pipeline import redis_benchmark  # noqa: E402
# The measuring helpers live in bench/measure.py; re-exported here, where the other benches look for them.
from measure import (CLK_TCK, RAFT_COUNTERS, WARMUP_S, CpuMeter, children_cpu, free_ports,  # noqa: E402,F401
                     load_avg, pct, proc_cpu, raft_counters, timed)

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = {b"sensor-id": b"1234", b"temperature": b"19.8"}
BATCH = 100
BATCH_CONCURRENCY = 8          # batches in flight on one client (session 3 chose 8; the sharded phase keeps it)
BATCH_ROUNDS = 4               # phase 1's plain and IDMP figures: alternating rounds (batch_rounds)
C64 = 64
FAILOVER_LIMIT_S = 20.0        # no ack this long after the kill: the run fails (not a figure)
CATCH_UP_LIMIT_S = 30.0
CONSUME_STALL_S = 10.0         # a Consume session with no progress this long is reported as stalled
REDIS_START_LIMIT_S = 20.0
SHARDED_GROUPS = 6             # the sharded phase's cluster: 3 nodes, 2 groups led by each
BALANCE_LIMIT_S = 60.0         # for its leaders to reach their preferred nodes


# ----------------------------------------------------------------------------- gRPC floor

def grpc_floor(seconds: float, tmp: str) -> dict:
    """bench/grpc_floor.py in a subprocess (its own client + echo server processes)."""
    out = os.path.join(tmp, "grpc_floor.json")
    subprocess.run([sys.executable, os.path.join(HERE, "grpc_floor.py"), "--seconds", str(seconds), "--json", out],
                   check=True, stdout=subprocess.DEVNULL, timeout=30 + 6 * seconds)
    with open(out) as fh:
        return json.load(fh)


# ----------------------------------------------------------------------------- redis with 2 replicas

def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when we die, even by SIGKILL (no finally runs then)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


class RedisTrio:
    """A redis-server primary and 2 replicas (--replicaof) on free ports, no persistence."""

    def __init__(self, tmp: str):
        self.tmp = tmp
        self.procs = []
        self.ports = free_ports(3)

    def __enter__(self):
        try:
            for i, port in enumerate(self.ports):
                d = os.path.join(self.tmp, f"redis-{i}")
                os.makedirs(d)
                argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", d]
                if i:
                    argv += ["--replicaof", "127.0.0.1", str(self.ports[0])]
                self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                   preexec_fn=_die_with_parent))
            self._wait_synced()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_synced(self):
        deadline = time.monotonic() + REDIS_START_LIMIT_S
        while True:
            try:
                info = redis.Redis(port=self.ports[0]).info("replication")
                online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                          and v.get("state") == "online"]
                if len(online) == 2:
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis replicas not online within {REDIS_START_LIMIT_S:g} s")
            time.sleep(0.05)

    def __exit__(self, *exc):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    @property
    def pids(self) -> dict:
        return {"primary": self.procs[0].pid, "replica1": self.procs[1].pid, "replica2": self.procs[2].pid}


async def redis_batch_wait(port: int, seconds: float) -> float:
    """Entries/s: pipelines of 100 XADD + WAIT 1 0, BATCH_CONCURRENCY in flight (one connection each)."""
    r = redis.asyncio.Redis(port=port, max_connections=BATCH_CONCURRENCY)
    try:
        async def op():
            p = r.pipeline(transaction=False)
            for _ in range(BATCH):
                p.xadd("batch", FIELDS)
            p.wait(1, 0)
            replies = await p.execute()
            if replies[-1] < 1:
                raise RuntimeError("WAIT 1 0 returned without a replica")
            return BATCH
        return await timed(op, BATCH_CONCURRENCY, seconds)
    finally:
        await r.aclose()


def redis_single_wait(port: int, seconds: float) -> tuple:
    """(p50 ms, p99 ms, per s): redis-py XADD + WAIT 1 0 in one pipeline, one at a time."""
    r = redis.Redis(port=port)
    lat = []
    clock = time.perf_counter
    start = clock() + WARMUP_S
    end = start + seconds
    try:
        while (t0 := clock()) < end:
            p = r.pipeline(transaction=False)
            p.xadd("single", FIELDS)
            p.wait(1, 0)
            p.execute()
            if t0 >= start:
                lat.append(clock() - t0)
    finally:
        r.close()
    return statistics.median(lat) * 1e3, pct(lat, 0.99) * 1e3, len(lat) / seconds


# ----------------------------------------------------------------------------- xraft through the SDK

async def sdk_batch(seeds, seconds: float, keys: tuple = ("batch",), idempotent: bool = False,
                    idmp_per_entry: bool = False) -> float:
    """Entries/s of xadd_batch(100), BATCH_CONCURRENCY batches in flight on one client; each
    batch goes to the next of `keys` in turn (keys in several groups: the SDK sends each to
    its group's leader). `idempotent`: the SDK's IDMP producer (a producer id and one
    idempotent id per entry, deduplicated by the replicated table) instead of plain XADDs;
    `idmp_per_entry`: its ids sent one per entry, never as XAddRequest.idempotent_id_first."""
    async with Client(seeds, idempotent_producer=idempotent) as c:
        if idmp_per_entry:
            c._idempotent_id_first_ok = None        # None: never learnt (client/aio.py)
        batch = [FIELDS] * BATCH
        turn = 0

        async def op():
            nonlocal turn
            key = keys[turn % len(keys)]
            turn += 1
            results = await c.xadd_batch(key, batch)
            if len(results) != BATCH or any(isinstance(r, Exception) for r in results):
                raise RuntimeError(f"xadd_batch failed: {results[:3]}")
            return BATCH
        return await timed(op, BATCH_CONCURRENCY, seconds)


def batch_rounds(seeds, seconds: float, rounds: int, pids: dict, leader_resp: str) -> tuple:
    """Phase 1, plain and IDMP: `rounds` rounds of seconds / rounds each, the two kinds
    alternating and the order flipping every round (plain first, then IDMP first, ...), so a
    swing of the machine or the cluster's growing state hits both alike (one pair run back to
    back swung more than the difference measured: bench/README.md, session 13).
    Returns ((plain entries/s, CpuMeter line of its last round), (IDMP entries/s, line))."""
    done = {False: 0.0, True: 0.0}
    lines = {}
    for r in range(rounds):
        for idempotent in ((False, True) if r % 2 == 0 else (True, False)):
            key = ("idmp",) if idempotent else ("batch",)
            with CpuMeter(pids, leader_resp) as m:
                done[idempotent] += uvloop.run(sdk_batch(seeds, seconds / rounds, key, idempotent=idempotent)) / rounds
            lines[idempotent] = m.line()
    return (done[False], lines[False]), (done[True], lines[True])


async def sdk_single(seeds, seconds: float) -> tuple:
    """(p50 ms, p99 ms, per s) of one client's sequential xadd."""
    async with Client(seeds) as c:
        lat = []

        async def op():
            await c.xadd("single", FIELDS)
            return 1
        rate = await timed(op, 1, seconds, lat)
    return statistics.median(lat) * 1e3, pct(lat, 0.99) * 1e3, rate


async def sdk_c64(seeds, seconds: float, request_ids: bool) -> tuple:
    """(acknowledged xadd/s, failed calls) with 64 calls in flight on one client. Failures are
    counted, not fatal: with request ids a call can be refused as "too old to tell" (see the
    README), and a short per-call timeout keeps such a call from stalling the phase."""
    errors = []
    async with Client(seeds, request_ids=request_ids) as c:
        async def op():
            try:
                await c.xadd("c64", FIELDS, timeout=2.0)
            except XRaftError as e:
                errors.append(e)
                return 0
            return 1
        rate = await timed(op, C64, seconds)
    if errors:
        print(f"  {len(errors)} xadd calls failed, e.g. {errors[0]!r}")
    return rate, len(errors)


async def sdk_preload(seeds, key: str, n: int) -> None:
    async with Client(seeds) as c:
        left = n

        async def loader():
            nonlocal left
            while left > 0:
                k = min(BATCH, left)
                left -= k
                await c.xadd_batch(key, [FIELDS] * k)
        await asyncio.gather(*(loader() for _ in range(BATCH_CONCURRENCY)))


async def sdk_consume(seeds, key: str, n: int, group: str = "g", batch: int = BATCH, acks_in_flight: int = 8,
                      max_unacked: int = 0) -> dict:
    """A new group reads the n preloaded entries through one Consume session
    (max_batch=batch, the server's default window of 1,000 unacked), acking
    each `batch` ids with one ack message, as a consumer that processes a batch
    and acks it without waiting would: up to `acks_in_flight` ack() calls
    overlap (ConsumerSession.ack() may be called concurrently; its one writer
    task sends them in order), while deliveries keep flowing. Returns rate
    (entries acked per s, from the first delivery to the last CONFIRMED ack),
    acked (the sum of the confirmed acks' counts: n, else RuntimeError),
    pending (XPENDING after: 0, else RuntimeError), stalled: if nothing moved
    for CONSUME_STALL_S the session is abandoned and the rate is taken up to
    the last progress (the stall is reported, not hidden in a lower figure)."""
    async with Client(seeds) as c:
        await c.xgroup_create(key, group, id="0")
        session = c.consume([key], group, "worker", max_batch=batch, max_unacked=max_unacked)
        room = asyncio.Semaphore(acks_in_flight)
        acking: set = set()
        st = {"delivered": 0, "acked": 0, "t0": None, "last": time.perf_counter(), "last_ack": None}

        async def ack(ids):
            try:
                acked = await session.ack(key, ids)      # (not `+= await`: it would read before awaiting)
                st["acked"] += acked
                st["last"] = st["last_ack"] = time.perf_counter()
            finally:
                room.release()

        async def consume():
            ids = []
            async for d in session:
                now = time.perf_counter()
                st["t0"] = st["t0"] or now
                st["last"] = now
                st["delivered"] += 1
                ids.append(d.id)
                if len(ids) == batch or st["delivered"] == n:
                    await room.acquire()
                    t = asyncio.ensure_future(ack(ids))
                    acking.add(t)
                    t.add_done_callback(acking.discard)
                    ids = []
                if st["delivered"] >= n:
                    break
            while acking:                          # the last acks' confirmations (failures raise here)
                await asyncio.gather(*acking)

        stalled = None
        task = asyncio.ensure_future(consume())
        try:
            while not task.done():
                await asyncio.sleep(0.05)
                if time.perf_counter() - st["last"] > CONSUME_STALL_S:
                    stalled = (f"no delivery or ack confirmation for {CONSUME_STALL_S:g} s after "
                               f"{st['delivered']:,} delivered, {st['acked']:,} acked")
                    break
            if task.done():
                task.result()                      # a failed session fails the run
        finally:
            for t in (task, *acking):
                t.cancel()
            await asyncio.gather(task, *acking, return_exceptions=True)
            await session.close()
        pending = (await c.xpending(key, group)).count
    if not stalled and (st["acked"] != n or pending):
        raise RuntimeError(f"consume: {st['acked']:,} of {n:,} acked, {pending:,} left pending")
    end = st["last_ack"] or st["t0"]
    elapsed = end - st["t0"] if st["t0"] is not None else 0.0
    return {"rate": st["acked"] / elapsed if elapsed > 0 else 0.0, "acked": st["acked"], "pending": pending,
            "stalled": stalled}


# ----------------------------------------------------------------------------- failover

async def _writer(seeds, stop: asyncio.Event, acks: list, errors: list) -> None:
    """Sequential xadd until stopped; acks: (monotonic time of the ack, leader address that gave it)."""
    async with Client(seeds, backoff_max=0.1, timeout=FAILOVER_LIMIT_S) as c:
        while not stop.is_set():
            try:
                await c.xadd("failover", FIELDS)
                # The address that just answered: the known leader, else the seed the call
                # went to (a seed that answers is not redirected, so `leader` stays unset).
                acks.append((time.perf_counter(), c.leader or c._target()))
            except Exception as e:  # noqa: BLE001 - counted and reported; the writer carries on
                errors.append(repr(e))


async def failover_once(cluster: lc.ClusterInfo, seeds) -> tuple:
    """(seconds from SIGKILL of the leader to the first ack by another node, old id, new leader addr)."""
    leader = wait_leader(cluster)
    stop, acks, errors = asyncio.Event(), [], []
    task = asyncio.ensure_future(_writer(seeds, stop, acks, errors))
    try:
        # The writer must be writing to this leader before the kill, as a live client would be.
        deadline = time.perf_counter() + 10
        while not (acks and acks[-1][1] == leader["grpc"]):
            if time.perf_counter() > deadline or task.done():
                raise RuntimeError(f"writer never reached leader {leader['grpc']}: {errors[-3:]}")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        t_kill = time.perf_counter()
        os.kill(leader["pid"], signal.SIGKILL)
        while True:
            after = [(t, addr) for t, addr in acks if t > t_kill and addr != leader["grpc"]]
            if after:
                return after[0][0] - t_kill, leader["id"], after[0][1]
            if time.perf_counter() - t_kill > FAILOVER_LIMIT_S or task.done():
                raise RuntimeError(f"no write acknowledged within {FAILOVER_LIMIT_S:g} s of killing node "
                                   f"{leader['id']}; writer errors: {errors[-3:]}")
            await asyncio.sleep(0.005)
    finally:
        stop.set()
        await task


def restart_and_catch_up(dir_: str) -> float:
    """Restart the killed node from disk; wait until every node applied the leader's commit index."""
    t0 = time.monotonic()
    cluster = lc.up(dir_, fsync="always")
    deadline = t0 + CATCH_UP_LIMIT_S
    while True:
        rows = lc.status(cluster)
        leader = lc.leader_of(rows)
        if leader and all(r["alive"] and r["applied_index"] is not None
                          and int(r["applied_index"]) >= int(leader["commit_index"]) for r in rows):
            return time.monotonic() - t0
        if time.monotonic() > deadline:
            raise RuntimeError(f"restarted node did not catch up within {CATCH_UP_LIMIT_S:g} s: {rows}")
        time.sleep(0.1)


# ----------------------------------------------------------------------------- sharded

def layout_of(cluster: lc.ClusterInfo):
    """The cluster's layout (client/routing.Layout: groups, slots, preferred leaders) via the SDK."""
    async def fetch():
        async with Client([n.grpc for n in cluster.nodes]) as c:
            return await c.cluster_layout()
    return uvloop.run(fetch())


def wait_balanced(cluster: lc.ClusterInfo, layout, limit: float = BALANCE_LIMIT_S) -> list:
    """Status rows once every group is led by exactly one node, its preferred leader when
    there are several groups (leader_balance.py hands each group there after the first
    elections put leaders anywhere; measuring before would count the hand-overs too)."""
    want = {g.id: g.preferred_leader if len(layout.groups) > 1 else None for g in layout.groups}
    deadline = time.monotonic() + limit
    while True:
        rows = lc.status(cluster, timeout=2.0)
        leaders = {}
        for r in rows:
            for g in r["leads"] or ():
                leaders.setdefault(g, []).append(r["id"])
        if all(len(leaders.get(g, ())) == 1 and pref in (None, leaders[g][0]) for g, pref in want.items()):
            return rows
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(want)} groups not led by their preferred nodes within {limit:g} s: "
                               f"leaders {leaders}, preferred {want}")
        time.sleep(0.2)


def keys_per_group(layout) -> tuple:
    """One key per data group ("batch-<n>", the first n whose slot that group owns), in group order."""
    keys = []
    for group in sorted(layout.groups, key=lambda g: g.id):
        first, last = group.slots[0]
        n = 0
        while not first <= key_slot(b"batch-%d" % n) <= last:     # ~16384/slots tries on average
            n += 1
        keys.append(f"batch-{n}")
    return tuple(keys)


def sharded_batch(args, tmp: str, out: dict) -> None:
    """The batch phase again on a 3-node cluster of SHARDED_GROUPS groups, each batch to the
    next group's key: `sharded_xadd_batch100_entries_per_s` beside the one-group figure."""
    dir_ = os.path.join(tmp, "sharded")
    t = time.perf_counter()
    try:
        cluster = lc.up(dir_, nodes=3, fsync="always", groups=SHARDED_GROUPS)
        layout = layout_of(cluster)
        rows = wait_balanced(cluster, layout)
        print(f"sharded cluster ({SHARDED_GROUPS} groups) up and balanced in {time.perf_counter() - t:.1f} s: "
              + ", ".join(f"node{r['id']} leads {r['leads']}" for r in rows))
        seeds = [n.grpc for n in cluster.nodes]
        keys = keys_per_group(layout)
        pids = {f"node{n.id}": n.pid for n in cluster.nodes}
        with CpuMeter(pids) as m:
            rate = uvloop.run(sdk_batch(seeds, args.seconds, keys))
        one = out["xadd_batch100_entries_per_s"]
        out["sharded_xadd_batch100_entries_per_s"] = rate
        out["sharded_vs_one_group"] = rate / one if one else 0.0
        print(f"SDK xadd_batch(100) x {BATCH_CONCURRENCY} over {len(keys)} groups: {rate:,.0f} entries/s = "
              f"{out['sharded_vs_one_group']:.2f}x one group ({one:,.0f}; target >= 1.5x)   [{m.line()}]")
        with CpuMeter(pids) as m:
            xb = redis_benchmark(int(cluster.nodes[0].resp.rsplit(":", 1)[1]), 2_000 if args.quick else 20_000,
                                 cluster=True)
        out["sharded_resp_pipelined_xadd_per_s"] = xb.get("rps")
        print(f"redis-benchmark --cluster XADD -c 50 -P 16 over {SHARDED_GROUPS} groups: {xb} (one group: "
              f"{out.get('resp_pipelined_xadd_per_s')}; redis+2 replicas: "
              f"{out.get('redis_replicas_pipelined_xadd_per_s')})   [{m.line()}]")
        n_per_key = (5_000 if args.quick else 100_000) // len(keys)
        t = time.perf_counter()
        uvloop.run(_preload_all(seeds, keys, n_per_key))
        print(f"preloaded {n_per_key:,} entries into each of {len(keys)} streams in {time.perf_counter() - t:.1f} s")
        with CpuMeter(pids) as m:
            rate = uvloop.run(asyncio.wait_for(crossshard_consume(seeds, keys, n_per_key), CROSSSHARD_LIMIT_S))
        single = out.get("consume_ack_entries_per_s", 0.0)
        out["crossshard_consume_entries_per_s"] = rate
        out["crossshard_vs_single_consume"] = rate / single if single else 0.0
        print(f"SDK consume() over {len(keys)} streams in {len(keys)} groups (max_batch={BATCH}) deliver+ack: "
              f"{rate:,.0f} entries/s = {out['crossshard_vs_single_consume']:.2f}x single-stream Consume "
              f"({single:,.0f}; target >= 1x)   [{m.line()}]")
        same = f"single-{len(keys)}x{n_per_key}"
        uvloop.run(sdk_preload(seeds, same, n_per_key * len(keys)))
        with CpuMeter(pids) as m:
            same_rate = uvloop.run(sdk_consume(seeds, same, n_per_key * len(keys)))["rate"]
        out["crossshard_single_stream_same_cluster_entries_per_s"] = same_rate
        out["crossshard_vs_single_same_cluster"] = rate / same_rate if same_rate else 0.0
        print(f"the same {n_per_key * len(keys):,} entries from ONE stream (one Consume) on this cluster: "
              f"{same_rate:,.0f} entries/s; cross-shard = {out['crossshard_vs_single_same_cluster']:.2f}x of it"
              f"   [{m.line()}]")
        slot_move.run_phase(seeds, args.quick, out)
    finally:
        if lc.cluster_file(dir_).exists():
            lc.down(dir_)


CROSSSHARD_LIMIT_S = 300.0      # the cross-shard consume phase fails rather than hangs


async def _preload_all(seeds, keys, n_per_key: int) -> None:
    """Group "g" at each stream's end (the batch phase wrote to these keys), then n_per_key entries each."""
    async with Client(seeds) as c:
        for k in keys:
            await c.xgroup_create(k, "g", id="$", mkstream=True)
    await asyncio.gather(*(sdk_preload(seeds, k, n_per_key) for k in keys))


async def crossshard_consume(seeds, keys, n_per_key: int, batch: int = BATCH, acks_in_flight: int = 8) -> float:
    """One consume() over streams of different groups (client/crossshard.py: one Consume
    session per slot, merged): each stream's ids acked `batch` at a time, up to
    `acks_in_flight` ack messages overlapping per stream (as sdk_consume's one stream).
    Entries acked per s, from the first delivery to the last confirmed ack; every entry
    acked and every PEL empty, else RuntimeError."""
    async with Client(seeds) as c:
        n = n_per_key * len(keys)
        rooms = {k.encode(): asyncio.Semaphore(acks_in_flight) for k in keys}
        acking: set = set()
        st = {"delivered": 0, "acked": 0, "t0": None, "last_ack": None}
        async with c.consume(keys, "g", "worker", max_batch=batch) as session:

            async def ack(key, ids):
                try:
                    acked = await session.ack(key, ids)
                    st["acked"] += acked
                    st["last_ack"] = time.perf_counter()
                finally:
                    rooms[key].release()

            held = {k.encode(): [] for k in keys}

            async def send(key):
                await rooms[key].acquire()
                t = asyncio.ensure_future(ack(key, held[key]))
                acking.add(t)
                t.add_done_callback(acking.discard)
                held[key] = []

            # Per delivery only its own stream's batch can fill (what sdk_consume does for
            # its one stream); the other streams' partial batches go with the last delivery.
            async for d in session:
                st["t0"] = st["t0"] or time.perf_counter()
                st["delivered"] += 1
                ids = held[d.key]
                ids.append(d.id)
                if len(ids) == batch:
                    await send(d.key)
                if st["delivered"] >= n:
                    for key, ids in held.items():
                        if ids:
                            await send(key)
                    break
            while acking:
                await asyncio.gather(*acking)
        pending = sum([(await c.xpending(k, "g")).count for k in keys])
    if st["acked"] != n or pending:
        raise RuntimeError(f"crossshard consume: {st['acked']:,} of {n:,} acked, {pending:,} left pending")
    elapsed = st["last_ack"] - st["t0"]
    return n / elapsed if elapsed > 0 else 0.0


# ----------------------------------------------------------------------------- the run

def wait_leader(cluster: lc.ClusterInfo, limit: float = 15.0) -> dict:
    """The leader's status row. Polled: on this loaded machine a node can take longer than
    INFO's 1 s timeout to answer, and find_leader then sees no leader for a moment."""
    deadline = time.monotonic() + limit
    while (leader := lc.find_leader(cluster, timeout=2.0)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no leader within {limit:g} s: {lc.status(cluster)}")
        time.sleep(0.1)
    return leader


def cluster_pids(cluster: lc.ClusterInfo) -> dict:
    leader = wait_leader(cluster)
    out = {}
    for n in cluster.nodes:
        out[f"node{n.id}{'(L)' if leader and leader['id'] == n.id else ''}"] = n.pid
    return out


def run(args, tmp: str, out: dict) -> None:
    s = args.seconds
    preload = 5_000 if args.quick else 100_000
    bench_n_redis = 20_000 if args.quick else 200_000
    bench_n_xraft = 2_000 if args.quick else 20_000
    reps = 1 if args.quick else 3
    out["load_avg_start"] = load_avg()
    print(f"xraft cluster benchmark: {os.cpu_count()} cores, load average {out['load_avg_start']:.1f}, "
          f"{s:g} s per phase, batch {BATCH} x {BATCH_CONCURRENCY} in flight")

    # -- references first: the gRPC floor, then redis with 2 replicas.
    t = time.perf_counter()
    floor = grpc_floor(s, tmp)
    out.update({k: floor[k] for k in ("grpc_floor_unary_c1_per_s", "grpc_floor_unary_c64_per_s",
                                      "grpc_floor_p50_ms", "grpc_floor_p99_ms", "grpc_floor_unary_c64_per_cpu_s")})
    print(f"gRPC floor ({time.perf_counter() - t:.0f} s): unary c1 {floor['grpc_floor_unary_c1_per_s']:,.0f}/s "
          f"p50 {floor['grpc_floor_p50_ms']:.2f} ms p99 {floor['grpc_floor_p99_ms']:.2f} ms; "
          f"unary c64 {floor['grpc_floor_unary_c64_per_s']:,.0f}/s "
          f"({floor['grpc_floor_unary_c64_per_cpu_s']:,.0f} per CPU-s of client + server)")

    with RedisTrio(tmp) as trio:
        port = trio.ports[0]
        with CpuMeter(trio.pids) as m:
            out["redis_wait1_batch100_entries_per_s"] = uvloop.run(redis_batch_wait(port, s))
        print(f"redis batch100+WAIT: {out['redis_wait1_batch100_entries_per_s']:,.0f} entries/s   [{m.line()}]")
        p50, p99, rate = redis_single_wait(port, s)
        out.update(redis_wait1_p50_ms=p50, redis_wait1_p99_ms=p99, redis_wait1_single_per_s=rate)
        print(f"redis XADD+WAIT single: p50 {p50:.3f} ms p99 {p99:.3f} ms ({rate:,.0f}/s)")
        rb = redis_benchmark(port, bench_n_redis)
        out["redis_benchmark_xadd_per_s"] = out["redis_replicas_pipelined_xadd_per_s"] = rb.get("rps")
        print(f"redis-benchmark XADD -c 50 -P 16 on the primary: {rb}")

    # -- xraft: 3 real nodes, fsync always.
    dir_ = os.path.join(tmp, "cluster")
    t = time.perf_counter()
    try:
        cluster = lc.up(dir_, nodes=3, fsync="always")
        print(f"cluster up in {time.perf_counter() - t:.1f} s ({dir_})")
        seeds = [n.grpc for n in cluster.nodes]
        pids = cluster_pids(cluster)
        leader_resp = wait_leader(cluster)["resp"]

        plain, idmp = batch_rounds(seeds, s, 1 if args.quick else BATCH_ROUNDS, pids, leader_resp)
        out["xadd_batch100_entries_per_s"], out["idmp_xadd_batch100_entries_per_s"] = plain[0], idmp[0]
        print(f"SDK xadd_batch(100) x {BATCH_CONCURRENCY}: {out['xadd_batch100_entries_per_s']:,.0f} entries/s "
              f"= {out['xadd_batch100_entries_per_s'] / out['redis_wait1_batch100_entries_per_s']:.2f}x redis+WAIT "
              f"{out['redis_wait1_batch100_entries_per_s']:,.0f} (target >= 1.0x)   [{plain[1]}]")
        ratio = out["idmp_xadd_batch100_entries_per_s"] / out["xadd_batch100_entries_per_s"]
        print(f"SDK xadd_batch(100) IDMP x {BATCH_CONCURRENCY}: {out['idmp_xadd_batch100_entries_per_s']:,.0f} "
              f"entries/s ({ratio:.2f}x plain; target >= 0.9x)   [{idmp[1]}]")

        with CpuMeter(pids, leader_resp) as m:
            p50, p99, rate = uvloop.run(sdk_single(seeds, s))
        out.update(xadd_p50_ms=p50, xadd_p99_ms=p99, xadd_single_per_s=rate)
        print(f"SDK xadd single: p50 {p50:.2f} ms p99 {p99:.2f} ms ({rate:,.0f}/s) | redis+WAIT p50 "
              f"{out['redis_wait1_p50_ms']:.2f} p99 {out['redis_wait1_p99_ms']:.2f} | gRPC floor c1 p50 "
              f"{out['grpc_floor_p50_ms']:.2f} p99 {out['grpc_floor_p99_ms']:.2f} | target p50 <= 1.0, p99 <= 5"
              f"   [{m.line()}]")

        with CpuMeter(pids, leader_resp) as m:
            out["xadd_c64_per_s"], out["xadd_c64_errors"] = uvloop.run(sdk_c64(seeds, s, request_ids=False))
        out["xadd_c64_vs_grpc_floor"] = out["xadd_c64_per_s"] / out["grpc_floor_unary_c64_per_s"]
        print(f"SDK xadd c64 (request_ids=False): {out['xadd_c64_per_s']:,.0f}/s = "
              f"{out['xadd_c64_vs_grpc_floor']:.0%} of the gRPC floor c64 "
              f"{out['grpc_floor_unary_c64_per_s']:,.0f}/s (target >= 70%)   [{m.line()}]")
        with CpuMeter(pids, leader_resp) as m:
            out["xadd_c64_request_ids_per_s"], out["xadd_c64_request_ids_errors"] = \
                uvloop.run(sdk_c64(seeds, s, request_ids=True))
        print(f"SDK xadd c64 (default client, request ids: 8 in flight): "
              f"{out['xadd_c64_request_ids_per_s']:,.0f}/s   [{m.line()}]")

        t = time.perf_counter()
        uvloop.run(sdk_preload(seeds, "consume", preload))
        print(f"preloaded {preload:,} entries in {time.perf_counter() - t:.1f} s")
        for group, batch, name in (("g", BATCH, "consume_ack_entries_per_s"),
                                   ("g1000", 1000, "consume_ack_batch1000_entries_per_s")):
            # The second run reads the same entries again through another group with 10x larger
            # batches: shows whether the figure is bound per batch (one committed XREADGROUP + one
            # XACK each) or per entry.
            with CpuMeter(pids, leader_resp) as m:
                r = uvloop.run(sdk_consume(seeds, "consume", preload, group=group, batch=batch))
            out[name] = r["rate"]
            if batch == BATCH:
                out.update(consume_acked=r["acked"], consume_pending_after=r["pending"],
                           consume_stalled=int(bool(r["stalled"])))
            print(f"SDK Consume(max_batch={batch}) deliver+ack: {r['rate']:,.0f} entries/s ({r['acked']:,} acked, "
                  f"{r['pending']} left pending{'; target >= 50,000' if batch == BATCH else ''})   [{m.line()}]")
            if r["stalled"]:
                print(f"  STALLED: {r['stalled']}")

        leader = wait_leader(cluster)
        with CpuMeter(pids, leader_resp) as m:
            xb = redis_benchmark(int(leader["resp"].rsplit(":", 1)[1]), bench_n_xraft)
        out["resp_benchmark_xadd_per_s"] = out["resp_pipelined_xadd_per_s"] = xb.get("rps")
        resp_pipeline.record(out)             # resp_pipelined_vs_redis_replicas (issue 14: >= 0.2)
        print(f"redis-benchmark XADD -c 50 -P 16 on the xraft leader's RESP port: {xb} "
              f"(redis primary: {out['redis_benchmark_xadd_per_s']})   [{m.line()}]")

        each = []
        for i in range(reps):
            secs, old, new = uvloop.run(failover_once(cluster, seeds))
            each.append(secs)
            catch = restart_and_catch_up(dir_)
            cluster = lc.load(dir_)
            print(f"failover {i + 1}/{reps}: killed leader node {old}; first ack from {new} after {secs:.2f} s "
                  f"(target <= 3 s); node {old} restarted and caught up in {catch:.1f} s")
        out["failover_s_each"] = each
        out["failover_s"] = max(each)
    finally:
        if lc.cluster_file(dir_).exists():
            lc.down(dir_)
    sharded_batch(args, tmp, out)
    out["load_avg_end"] = load_avg()
    print(f"load average at the end: {out['load_avg_end']:.1f}")


def work_dir(requested: str | None, prefix: str) -> str:
    """The run's work directory: `requested` (created; it must not exist) or a new temporary
    one. Also makes SIGTERM run the caller's finally blocks (sys.exit): the nodes run in their
    own sessions and would outlive us."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if requested:
        os.makedirs(requested)
        return requested
    return tempfile.mkdtemp(prefix=prefix)


def run_scale(entries: int, dir_: str, out: dict) -> None:
    """bench/scale.py in a subprocess (its own cluster, after ours is down); its keys join `out`."""
    path = os.path.join(os.path.dirname(dir_), "scale.json")
    subprocess.run([sys.executable, os.path.join(HERE, "scale.py"), "--entries", str(entries), "--dir", dir_,
                    "--json", path], check=True)
    with open(path) as fh:
        out.update(json.load(fh))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run (1 s phases, 1 failover)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--seconds", type=float, help="seconds per phase (default 5; --quick 1)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (node logs)")
    ap.add_argument("--dir", help="work directory (must not exist; default: a new temporary one). The clusters "
                                  "live in DIR/cluster and DIR/sharded, so a caller can stop them if we are killed")
    ap.add_argument("--scale", action="store_true", help="also run bench/scale.py (costs as data grows: 10M entries, "
                                                         "1 GB restart, snapshot catch-up) and merge its keys")
    ap.add_argument("--scale-entries", type=int, default=10_000_000, help="--entries for bench/scale.py")
    args = ap.parse_args()
    args.seconds = args.seconds or (1.0 if args.quick else 5.0)
    if not 0 < args.seconds <= 120:
        ap.error("--seconds must be in (0, 120]")
    for tool in ("redis-server", "redis-benchmark"):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not installed (./dev test installs it)")
    def run_all(args, tmp, out):
        run(args, tmp, out)
        if args.scale:
            run_scale(args.scale_entries, os.path.join(tmp, "scale"), out)
    return run_in_work_dir(args, "xraft-bench-cluster-", run_all)


def run_in_work_dir(args, prefix: str, run_fn) -> int:
    """run_fn(args, tmp, out) in work_dir(args.dir, prefix), removed after unless args.keep;
    then the figures in `out` go to args.json if given."""
    tmp = work_dir(args.dir, prefix)
    out: dict = {}
    try:
        run_fn(args, tmp, out)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
