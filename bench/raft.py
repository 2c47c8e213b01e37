"""Raft benchmarks: WAL group commit vs a raw fsync loop, and an in-process 3-voter group.

    python bench/raft.py [--json FILE] [--quick] [--dir DIR] [--no-wal] [--no-modes | --only-modes]

(1) WAL: records/s for 100-byte records appended in batches of 1, 16 and 256
    with one sync() (one write + one fdatasync) per batch, fsync=always; beside
    it, in the same run and directory, a plain os.write + os.fsync loop of
    100-byte writes (and the same loop with os.fdatasync, which the WAL uses).
    Also DiskStorage.save()+sync() of 100-byte entries in batches of 256 (adds
    entry encoding and indexing on top of the WAL). --no-wal skips (1).
(2) Raft: committed entries/s for a 3-voter group in one process, MemoryStorage,
    100-byte entries, public RawNode API only, every node following the Ready
    contract (persist, sync, send, apply, advance), storage compacted to the last
    2000 applied entries after each round; one round = `batch` entries proposed,
    then Ready cycles until the group is idle. Counted on the leader as committed
    entries handed to the application. Two ways in: `batch` RawNode.propose()
    calls per round ("single"), and one RawNode.propose_batch() of `batch`
    entries per round. Reported per wall-clock second and per CPU second
    (time.process_time: the machine is shared, so wall-clock varies with load).
(3) Idle groups: 500 follower RawNodes (3-voter groups whose leader is elsewhere)
    ticked 10 times a second for a few seconds, has_ready() checked after each
    tick as a driver does: CPU % of one core. Once with ticks only (election
    timeout 100 ticks, so nothing fires within the run), once with the leader's
    heartbeat delivered every tick (the default heartbeat_tick=1) and each
    resulting Ready handled (the response is dropped).

(4) Fsync modes: the same 3-voter group through the real runtime (MultiRaft +
    GroupDriver + DiskStorage on --dir, in-process LocalTransport), once per
    --fsync mode in the same run: one proposal at a time for a while (entries/s
    and median latency), then 64 proposers at once (entries/s), and the WAL
    fdatasyncs per second of the three nodes together. --no-modes skips (4).

Every figure is measured; nothing is estimated or extrapolated.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from xraft.node.raft.config import Config  # noqa: E402
from xraft.node.raft.rawnode import RawNode  # noqa: E402
from xraft.node.raft.storage import MemoryStorage  # noqa: E402
from xraft.node.raft.types import (  # noqa: E402
    ConfState,
    Entry,
    HardState,
    Message,
    MessageType as MT,
    Snapshot,
    SnapshotMetadata,
    StateRole,
)
from xraft.node.runtime.disk_storage import DiskStorage, DiskStorageOptions  # noqa: E402
from xraft.node.runtime.wal import FsyncPolicy, RecordType, Wal, WalOptions  # noqa: E402

ENTRY_BYTES = 100


def _timed_loop(seconds: float, step) -> tuple[int, float]:
    """Call step() (returns units done) until `seconds` elapsed: (units, elapsed)."""
    n, wall, _ = _timed_loop_cpu(seconds, step)
    return n, wall


def _timed_loop_cpu(seconds: float, step) -> tuple[int, float, float]:
    """As _timed_loop, also returning the CPU seconds of this process: (units, wall, cpu)."""
    done = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        done += step()
        now = time.perf_counter()
        if now >= deadline:
            return done, now - t0, time.process_time() - c0


def bench_wal(base: str, batch: int, seconds: float) -> float:
    d = tempfile.mkdtemp(prefix=f"wal-b{batch}-", dir=base)
    try:
        wal = Wal.open(d, WalOptions(fsync=FsyncPolicy.ALWAYS))
        payload = os.urandom(ENTRY_BYTES)
        records = [(RecordType.ENTRIES, payload)] * batch

        def step() -> int:
            wal.append(records)
            wal.sync()
            return batch

        n, dt = _timed_loop(seconds, step)
        wal.close()
        return n / dt
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bench_raw_fsync(base: str, seconds: float, sync=os.fsync) -> float:
    path = os.path.join(tempfile.mkdtemp(prefix="raw-", dir=base), "raw.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    buf = os.urandom(ENTRY_BYTES)
    try:
        def step() -> int:
            os.write(fd, buf)
            sync(fd)
            return 1

        n, dt = _timed_loop(seconds, step)
        return n / dt
    finally:
        os.close(fd)
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def bench_disk_storage(base: str, batch: int, seconds: float) -> float:
    d = tempfile.mkdtemp(prefix="ds-", dir=base)
    try:
        st = DiskStorage.open(d, DiskStorageOptions(wal=WalOptions(fsync=FsyncPolicy.ALWAYS)))
        data = os.urandom(ENTRY_BYTES)
        nxt = [1]

        def step() -> int:
            i = nxt[0]
            st.save(HardState(1, 1, i - 1), [Entry(1, j, data=data) for j in range(i, i + batch)])
            st.sync()
            nxt[0] = i + batch
            return batch

        n, dt = _timed_loop(seconds, step)
        st.close()
        return n / dt
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Group:
    """Three RawNodes over MemoryStorage in one process, driven by the Ready contract."""

    def __init__(self, seed: int = 1):
        ids = (1, 2, 3)
        self.storage = {}
        self.nodes = {}
        for nid in ids:
            st = MemoryStorage()
            cs = ConfState(voters=ids)
            st.apply_snapshot(Snapshot(SnapshotMetadata(index=1, term=1, conf_state=cs), b""))
            st.set_hard_state(HardState(term=1, vote=0, commit=1))
            st.sync()
            self.storage[nid] = st
            self.nodes[nid] = RawNode(Config(id=nid, rng=random.Random(seed * 1000 + nid)), st)
        self.queue = []
        self.applied = {nid: 1 for nid in ids}
        self.committed_on_leader = 0
        self.leader = 0

    def process(self) -> bool:
        progressed = False
        for nid, node in self.nodes.items():
            if not node.has_ready():
                continue
            rd = node.ready()
            st = self.storage[nid]
            if rd.snapshot is not None:
                st.apply_snapshot(rd.snapshot)
            if rd.entries:
                st.append(rd.entries)
            if rd.hard_state is not None:
                st.set_hard_state(rd.hard_state)
            st.sync()  # MemoryStorage's model of fsync: required before persisted_messages
            self.queue.extend(rd.messages)
            self.queue.extend(rd.persisted_messages)
            if rd.committed_entries:
                self.applied[nid] = rd.committed_entries[-1].index
                if nid == self.leader:
                    self.committed_on_leader += sum(1 for e in rd.committed_entries if e.data)
            node.advance(rd)
            progressed = True
        return progressed

    def deliver(self) -> bool:
        if not self.queue:
            return False
        q, self.queue = self.queue, []
        for m in q:
            self.nodes[m.to].step(m)
        return True

    def stabilize(self) -> None:
        while self.process() | self.deliver():
            pass

    def compact(self, keep: int = 2000) -> None:
        """Keep storage small the way an application would (after snapshots)."""
        low = min(self.applied.values()) - keep
        for st in self.storage.values():
            if low > st.first_index():
                st.compact(low)
                st.sync()


def bench_group(batch: int, seconds: float, use_batch_api: bool) -> tuple[float, float, int]:
    """Committed entries/s (wall, cpu, count) with `batch` entries per round, proposed by
    `batch` RawNode.propose() calls (use_batch_api=False) or one RawNode.propose_batch()."""
    g = Group()
    g.nodes[1].campaign()
    g.stabilize()
    leader = g.nodes[1]
    assert leader.status().soft_state.role == StateRole.LEADER, "node 1 did not win the election"
    g.leader = 1
    payloads = [os.urandom(ENTRY_BYTES) for _ in range(batch)]
    rounds = [0]

    def step() -> int:
        before = g.committed_on_leader
        if use_batch_api:
            leader.propose_batch(payloads)
        else:
            for p in payloads:
                leader.propose(p)
        g.stabilize()
        rounds[0] += 1
        g.compact()
        return g.committed_on_leader - before

    n, wall, cpu = _timed_loop_cpu(seconds, step)
    assert n == rounds[0] * batch, f"committed {n} of {rounds[0] * batch} proposed"
    return n / wall, n / cpu, n


def bench_idle_groups(groups: int, seconds: float, heartbeats: bool, hz: int = 10) -> float:
    """CPU % of one core for `groups` idle followers ticked `hz` times a second (see (3))."""
    ids = (1, 2, 3)
    nodes = []
    for k in range(groups):
        st = MemoryStorage()
        st.apply_snapshot(Snapshot(SnapshotMetadata(index=1, term=1, conf_state=ConfState(voters=ids)), b""))
        st.set_hard_state(HardState(term=1, vote=0, commit=1))
        cfg = Config(id=2, rng=random.Random(k), election_tick=10 if heartbeats else 100)
        n = RawNode(cfg, st)
        n.step(Message(MT.HEARTBEAT, to=2, frm=1, term=1, commit=1))  # learn the leader
        n.advance(n.ready())
        nodes.append(n)
    hb = Message(MT.HEARTBEAT, to=2, frm=1, term=1, commit=1)
    period = 1.0 / hz
    c0, t0 = time.process_time(), time.perf_counter()
    next_at = t0
    readies = 0
    while True:
        for n in nodes:
            n.tick()
            if heartbeats:
                n.step(hb)
            if n.has_ready():
                n.advance(n.ready())
                readies += 1
        next_at += period
        now = time.perf_counter()
        if now - t0 >= seconds:
            break
        if next_at > now:
            time.sleep(next_at - now)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    for n in nodes:
        assert n.status().soft_state.role == StateRole.FOLLOWER, "an idle follower campaigned"
    # Ticks alone must not make an idle follower produce a Ready; heartbeats always do (a response).
    assert (readies > 0) == heartbeats, f"{readies} Readies (heartbeats={heartbeats})"
    return 100.0 * cpu / wall


class _CountingMachine:
    """The smallest state machine the driver accepts: counts applied entries."""

    def __init__(self):
        self.applied_index = 0

    def apply(self, index: int, data: bytes, want_result: bool = True) -> int:
        self.applied_index = index
        return index

    def snapshot(self) -> bytes:
        return str(self.applied_index).encode()

    def restore(self, data: bytes, index: int) -> None:
        self.applied_index = index


async def _bench_mode(base: str, policy: FsyncPolicy, secs: float, concurrency: int) -> dict:
    from xraft.node.runtime.multiraft import MultiRaft, MultiRaftOptions
    from xraft.node.runtime.raft_driver import GroupOptions
    from xraft.node.runtime.transport import LocalNetwork, LocalTransport

    d = tempfile.mkdtemp(prefix=f"fsync-{policy.value}-", dir=base)
    net = LocalNetwork(codec=True)
    storage = DiskStorageOptions(wal=WalOptions(fsync=policy), cache_bytes=8 << 20,
                                 snapshot_cache_bytes=8 << 20)
    opts = MultiRaftOptions(tick_interval_s=0.01, group=GroupOptions(
        election_tick=20, heartbeat_tick=2, snapshot_entries=1 << 30, storage=storage))
    nodes = []
    real_fdatasync = os.fdatasync
    fdatasyncs = [0]

    def counting_fdatasync(fd):
        real_fdatasync(fd)
        fdatasyncs[0] += 1
    try:
        for nid in (1, 2, 3):
            mr = MultiRaft(nid, LocalTransport(net, nid), opts)
            await mr.start()
            await mr.add_group(1, os.path.join(d, f"n{nid}"), _CountingMachine(), bootstrap_voters=(1, 2, 3))
            nodes.append(mr)
        deadline = time.monotonic() + 20
        while not any(mr.group(1).is_leader() for mr in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("no leader within 20 s")
            await asyncio.sleep(0.01)
        leader = next(mr.group(1) for mr in nodes if mr.group(1).is_leader())
        data = os.urandom(ENTRY_BYTES)
        os.fdatasync = counting_fdatasync
        t0 = time.perf_counter()
        lat = []
        while time.perf_counter() - t0 < secs:
            a = time.perf_counter()
            await leader.propose(data, 10)
            lat.append(time.perf_counter() - a)
        seq_wall = time.perf_counter() - t0
        seq_syncs = fdatasyncs[0]
        stop_at = time.perf_counter() + secs
        done = [0]

        async def proposer():
            while time.perf_counter() < stop_at:
                await leader.propose(data, 10)
                done[0] += 1
        t1 = time.perf_counter()
        await asyncio.gather(*(proposer() for _ in range(concurrency)))
        conc_wall = time.perf_counter() - t1
        os.fdatasync = real_fdatasync
        lat.sort()
        return {"sequential_per_s": round(len(lat) / seq_wall, 1),
                "sequential_p50_ms": round(1000 * lat[len(lat) // 2], 3),
                f"concurrent{concurrency}_per_s": round(done[0] / conc_wall, 1),
                "fdatasyncs_per_s_sequential": round(seq_syncs / seq_wall, 1),
                "fdatasyncs_per_s_concurrent": round((fdatasyncs[0] - seq_syncs) / conc_wall, 1)}
    finally:
        os.fdatasync = real_fdatasync
        for mr in nodes:
            await mr.close()
        shutil.rmtree(d, ignore_errors=True)


def fsync_mode_figures(base: str, secs: float, concurrency: int = 64) -> dict:
    """(4): {mode: figures} for always, batch and never, one after the other in this run."""
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    return {p.value: run(_bench_mode(base, p, secs, concurrency)) for p in FsyncPolicy}


def wal_figures(base: str, secs: float) -> dict:
    res: dict = {}
    res["raw_fsync_per_s"] = round(bench_raw_fsync(base, secs), 1)
    # The WAL uses fdatasync; the same loop with it is the like-for-like baseline for batch 1.
    res["raw_fdatasync_per_s"] = round(bench_raw_fsync(base, secs, os.fdatasync), 1)
    by_batch = {}
    for b in (1, 16, 256):
        by_batch[str(b)] = round(bench_wal(base, b, secs), 1)
    res["wal_records_per_s_by_batch"] = by_batch
    res["wal_records_per_s"] = by_batch["256"]
    res["disk_storage_entries_per_s_batch256"] = round(bench_disk_storage(base, 256, secs), 1)
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write results to this file")
    ap.add_argument("--quick", action="store_true", help="short runs (CI smoke)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="directory for WAL files")
    ap.add_argument("--no-wal", action="store_true", help="skip the WAL/fsync figures (1)")
    ap.add_argument("--no-modes", action="store_true", help="skip the --fsync mode figures (4)")
    ap.add_argument("--only-modes", action="store_true", help="only the --fsync mode figures (4)")
    args = ap.parse_args(argv)
    secs = 0.3 if args.quick else 2.0

    res: dict = {"entry_bytes": ENTRY_BYTES, "wal_dir": os.path.abspath(args.dir), "quick": args.quick}
    if not args.no_modes:
        modes = res["fsync_modes"] = fsync_mode_figures(args.dir, secs)
        print(f"{'--fsync mode figures (3 voters, one process)':44s}" + "".join(f"{m:>12s}" for m in modes))
        for k in next(iter(modes.values())):
            print(f"  {k:42s}" + "".join(f"{modes[m][k]:>12}" for m in modes))
        if args.only_modes:
            return _report(res, args.json)
    if not args.no_wal:
        res.update(wal_figures(args.dir, secs))
    for name, use_batch_api in (("", True), ("_single", False)):
        by_batch, by_batch_cpu = {}, {}
        for b in (64, 256, 1024):
            rate, rate_cpu, _ = bench_group(b, secs, use_batch_api)
            by_batch[str(b)] = round(rate, 1)
            by_batch_cpu[str(b)] = round(rate_cpu, 1)
        res[f"committed_entries_per_s{name}_by_batch"] = by_batch
        res[f"committed_entries_per_cpu_s{name}_by_batch"] = by_batch_cpu
        res[f"committed_entries_per_s{name}"] = max(by_batch.values())
        res[f"committed_entries_per_cpu_s{name}"] = max(by_batch_cpu.values())
    idle_secs = 1.0 if args.quick else 3.0
    res["idle_groups_500_cpu_pct"] = round(bench_idle_groups(500, idle_secs, heartbeats=False), 2)
    res["idle_groups_500_heartbeats_cpu_pct"] = round(bench_idle_groups(500, idle_secs, heartbeats=True), 2)
    res["committed_entries_target_per_s"] = 200_000
    return _report(res, args.json)


def _report(res: dict, json_path) -> dict:
    for k, v in res.items():
        if k != "fsync_modes":
            print(f"{k:40s} {v}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2, sort_keys=True)
    return res


if __name__ == "__main__":
    main()
