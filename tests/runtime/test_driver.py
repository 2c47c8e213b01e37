"""GroupDriver through MultiRaft: 3 nodes x 1 group over real DiskStorage (fsync on), LocalTransport,
real asyncio. Crashes are modelled by abandoning a node (no sync, unsynced WAL buffer discarded) and
reopening its directory."""
import asyncio
import hashlib
import json
import threading
import time

import pytest

from xraft.node.raft.progress import ProgressState
from xraft.node.raft.types import ConfChange, ConfChangeType, MessageType as MT, StateRole
from xraft.node.runtime.multiraft import MultiRaft, MultiRaftOptions
from xraft.node.runtime.raft_driver import GroupOptions, NotLeader, ProposalDropped, ReadFailed, \
    UnknownOutcome
from xraft.node.runtime.transport import LocalNetwork, LocalTransport

TICK = 0.01  # seconds; election timeout = 20..40 ticks (slack for a loaded 2-core CI box)


class KV:
    """A tiny deterministic state machine: `key=value` puts. apply() returns the index.

    `chain` hashes every applied command in order (index and data) and travels in
    the snapshot, so two replicas with equal chains applied identical histories.
    """

    def __init__(self):
        self.data: dict[str, str] = {}
        self.applied_index = 0
        self.chain = "0" * 32
        self.restores = 0

    def apply(self, index: int, data: bytes) -> int:
        assert index > self.applied_index, (index, self.applied_index)
        k, _, v = data.decode().partition("=")
        self.data[k] = v
        self.applied_index = index
        self.chain = hashlib.blake2b(f"{self.chain}/{index}/{data.hex()}".encode(), digest_size=16).hexdigest()
        return index

    def snapshot(self) -> bytes:
        return json.dumps({"d": self.data, "i": self.applied_index, "c": self.chain}).encode()

    def restore(self, data: bytes, index: int) -> None:
        obj = json.loads(data)
        # The image is the state at its index (0: the bootstrap image of an empty machine).
        assert obj["i"] in (index, 0), f"snapshot data at {obj['i']} named index {index}"
        self.data, self.chain = obj["d"], obj["c"]
        self.applied_index = index
        self.restores += 1


def crash_storage(st) -> None:
    """What a process crash leaves: records written to the OS survive, the WAL's user-space
    buffer (appended, not yet written by a sync) does not."""
    wal = st._wal
    wal._pending.clear()
    wal._pending_at.clear()
    wal._pending_bytes = 0
    wal.close()
    st.closed = True


def group_options(**kw) -> GroupOptions:
    base = dict(election_tick=20, heartbeat_tick=2, seed=None)
    base.update(kw)
    return GroupOptions(**base)


class Cluster:
    def __init__(self, tmp_path, n=3, groups=(1,), tick=TICK, net=None, sm_factory=None, mr_kw=None,
                 **group_kw):
        self.sm_factory = sm_factory or KV
        self.mr_kw = dict(mr_kw or {})  # more MultiRaftOptions
        self.tmp = tmp_path
        self.ids = tuple(range(1, n + 1))
        self.gids = tuple(groups)
        self.tick = tick
        self.net = net or LocalNetwork(codec=True)
        self.opts = group_options(**group_kw)
        self.nodes: dict[int, MultiRaft] = {}
        self.sms: dict[tuple[int, int], KV] = {}

    def dir(self, nid, gid):
        return str(self.tmp / f"n{nid}" / f"g{gid}")

    async def start_node(self, nid, voters=None, groups=None):
        mr = MultiRaft(nid, LocalTransport(self.net, nid),
                       MultiRaftOptions(tick_interval_s=self.tick, group=self.opts, **self.mr_kw))
        await mr.start()
        for gid in groups or self.gids:
            sm = self.sms[(nid, gid)] = self.sm_factory()
            await mr.add_group(gid, self.dir(nid, gid), sm,
                               bootstrap_voters=self.ids if voters is None else voters)
        self.nodes[nid] = mr
        return mr

    async def start(self):
        for nid in self.ids:
            await self.start_node(nid)
        return self

    def g(self, nid, gid=1):
        return self.nodes[nid].group(gid)

    async def wait_leader(self, gid=1, timeout=10.0, among=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leads = [self.g(n, gid) for n in (among or self.nodes) if self.g(n, gid).is_leader()]
            if len(leads) == 1:
                return leads[0]
            await asyncio.sleep(self.tick)
        raise AssertionError(f"no single leader for group {gid} within {timeout}s")

    async def wait_for(self, cond, timeout=10.0, what="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            await asyncio.sleep(self.tick)
        raise AssertionError(f"timed out waiting for {what}")

    async def wait_converged(self, gid=1, timeout=10.0, nodes=None):
        nodes = nodes or list(self.nodes)

        def same():
            sms = [self.sms[(n, gid)] for n in nodes]
            return len({(s.applied_index, s.chain) for s in sms}) == 1 and \
                len({self.g(n, gid).applied for n in nodes}) == 1
        await self.wait_for(same, timeout, f"group {gid} replicas to converge")

    async def crash(self, nid):
        mr = self.nodes.pop(nid)
        for st in await mr.abort():
            crash_storage(st)

    async def close(self):
        for nid in list(self.nodes):
            await self.nodes.pop(nid).close()


@pytest.fixture
def run():
    """Run a coroutine on a fresh event loop (uvloop, as in production)."""
    import uvloop

    def _run(coro):
        return uvloop.run(asyncio.wait_for(coro, 60))
    return _run


async def propose_all(g, n, prefix="k", timeout=10.0):
    return await asyncio.gather(*(g.propose(f"{prefix}{i}={i}".encode(), timeout) for i in range(n)),
                                return_exceptions=True)


# ---------------------------------------------------------------- tests


def test_concurrent_proposals_are_batched_and_applied_identically(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.wait_leader()
            syncs0, readies0 = leader.stats.syncs, leader.stats.readies
            results = await propose_all(leader, 1000)
            assert all(isinstance(r, int) for r in results), [r for r in results if not isinstance(r, int)][:3]
            assert len(set(results)) == 1000  # every proposal resolved with its own log index
            await c.wait_converged()
            sms = [c.sms[(n, 1)] for n in c.ids]
            assert all(s.data == sms[0].data for s in sms) and len(sms[0].data) == 1000
            syncs = leader.stats.syncs - syncs0
            readies = leader.stats.readies - readies0
            # Group commit: many proposals per Ready, one fsync per Ready.
            assert syncs <= 200, f"{syncs} syncs for 1000 proposals"
            assert leader.stats.proposals >= 1000
            print(f"\n1000 concurrent proposals: leader {readies} Readies, {syncs} syncs "
                  f"({1000 / max(syncs, 1):.1f} proposals per fsync)")
        finally:
            await c.close()
    run(main())


def test_follower_answers_not_leader_with_the_leader_id(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.wait_leader()
            await leader.propose(b"a=1", 5)
            await c.wait_converged()
            follower = next(c.g(n) for n in c.ids if n != leader.node_id)
            with pytest.raises(NotLeader) as ei:
                await follower.propose(b"b=2", 5)
            assert ei.value.leader_id == leader.node_id and ei.value.group_id == 1
            with pytest.raises(ProposalDropped):
                await leader.propose(b"", 5)  # empty data is reserved for leader no-ops
        finally:
            await c.close()
    run(main())


def test_isolated_leader_reports_unknown_outcome_then_majority_moves_on(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            old = await c.wait_leader()
            await old.propose(b"before=1", 5)
            c.net.isolate(old.node_id, c.ids)
            # Appended to the old leader's log, never committable: check_quorum makes it step
            # down and every pending proposal must come back UnknownOutcome, not a failure.
            results = await propose_all(old, 50, prefix="lost")
            assert all(isinstance(r, UnknownOutcome) for r in results), results[:3]
            assert {r.reason.split(" (")[0] for r in results} == {"leadership lost"}
            others = [n for n in c.ids if n != old.node_id]
            new = await c.wait_leader(among=others)
            assert new.node_id != old.node_id
            assert await new.propose(b"after=1", 5) > 0
            c.net.heal()
            await c.wait_converged()
            kv = c.sms[(old.node_id, 1)]
            assert kv.data.get("after") == "1" and kv.data.get("before") == "1"
            assert not any(k.startswith("lost") for k in kv.data)  # overwritten by the new leader
        finally:
            await c.close()
    run(main())


def test_proposal_deadline_gives_unknown_outcome(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.wait_leader()
            c.net.isolate(leader.node_id, c.ids)
            t0 = time.monotonic()
            # Well below the election timeout: the deadline, not the step-down, ends it.
            with pytest.raises(UnknownOutcome) as ei:
                await leader.propose(b"x=1", timeout=0.03)
            assert ei.value.reason == "deadline passed" and ei.value.index > 0
            assert time.monotonic() - t0 < 5  # liveness only: the reason above says the deadline ended it
        finally:
            await c.close()
    run(main())


def test_killed_leader_pending_unknown_new_leader_and_restart_recovers(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            old = await c.wait_leader()
            acked = await propose_all(old, 200, prefix="acked")
            assert all(isinstance(r, int) for r in acked)
            old_id = old.node_id
            others = [n for n in c.ids if n != old_id]
            # In flight at the moment of the crash: in the leader's log, not replicated (its
            # outbound links are cut), so not committed: the outcome is unknown to the caller.
            for n in others:
                c.net.cut(old_id, n)
            tasks = [asyncio.ensure_future(old.propose(f"inflight{i}={i}".encode(), 5)) for i in range(300)]
            await c.wait_for(lambda: old.stats.proposals >= 200 + 300, 5, "proposals reaching the log")
            await c.crash(old_id)
            c.net.heal()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(o, UnknownOutcome) and o.reason == "node stopped" for o in outcomes)
            new = await c.wait_leader(among=others)
            assert await new.propose(b"after-crash=1", 5) > 0
            await c.start_node(old_id)  # reopen the dead node's directory
            await c.wait_converged()
            for n in c.ids:
                kv = c.sms[(n, 1)]
                assert all(kv.data.get(f"acked{i}") == str(i) for i in range(200))
                assert kv.data.get("after-crash") == "1"
                assert not any(k.startswith("inflight") for k in kv.data)  # never committed
        finally:
            await c.close()
    run(main())


@pytest.mark.parametrize("inline_sync_bytes", [0, MultiRaftOptions().inline_sync_bytes])
def test_acknowledged_proposals_survive_restart_of_all_nodes(tmp_path, run, inline_sync_bytes):
    async def main():
        # One snapshot (at ~300), then 100 more entries: recovery is snapshot + WAL replay.
        # Followers sync their appends on the loop thread (inline) or in the executor.
        c = await Cluster(tmp_path, snapshot_entries=250, snapshot_keep_entries=20,
                          mr_kw=dict(inline_sync_bytes=inline_sync_bytes)).start()
        try:
            leader = await c.wait_leader()
            acked = {}
            for rnd in range(4):
                res = await propose_all(leader, 100, prefix=f"r{rnd}k")
                for i, r in enumerate(res):
                    assert isinstance(r, int), r
                    acked[f"r{rnd}k{i}"] = str(i)
            await c.wait_converged()
            # Images are made by forked children while the group goes on: wait for them.
            await c.wait_for(lambda: all(c.g(n).stats.snapshots_created == 1 for n in c.ids), what="the snapshots")
            for n in c.ids:
                assert c.g(n).stats.snapshots_created == 1 and c.g(n).applied - c.g(n).snap_index >= 100
            for n in list(c.nodes):
                await c.crash(n)
            c.sms.clear()
            await c.start()
            # Each machine was recovered from its snapshot (then the log after it is replayed).
            for n in c.ids:
                assert c.sms[(n, 1)].restores == 1 and c.g(n).applied >= c.g(n).snap_index > 1
            leader = await c.wait_leader()
            await leader.propose(b"post=1", 5)  # commits the new term; every node catches up
            await c.wait_converged()
            for n in c.ids:
                data = c.sms[(n, 1)].data
                missing = [k for k, v in acked.items() if data.get(k) != v]
                assert not missing, f"node {n} lost {len(missing)} acknowledged writes, e.g. {missing[:3]}"
        finally:
            await c.close()
    run(main())


def test_nodes_leading_some_groups_keep_acknowledged_writes_of_all_across_a_crash(tmp_path, run):
    """Node 1 leads groups 1 and 2, node 2 leads group 3: both sync their follower appends in
    the executor (they lead a group), node 3 too (it follows three awake groups). Every write
    acknowledged before all nodes crash (storage left as a process crash leaves it) is there on
    every node after the restart."""
    async def main():
        c = Cluster(tmp_path, groups=(1, 2, 3), election_tick=300)  # leaders only by campaign()
        await c.start()
        try:
            for gid, nid in ((1, 1), (2, 1), (3, 2)):
                await c.g(nid, gid).campaign()
                await c.wait_for(lambda: c.g(nid, gid).is_leader(), 10, f"node {nid} to lead group {gid}")
            leaders = {1: c.g(1, 1), 2: c.g(1, 2), 3: c.g(2, 3)}
            await c.wait_for(lambda: [c.nodes[n].inline_sync_bytes for n in c.ids]
                             == [0, 0, 0], 10, "the inline limits")
            acked: dict[int, dict[str, str]] = {gid: {} for gid in leaders}

            async def write(gid, key):
                await leaders[gid].propose(f"{key}={gid}".encode(), 10)
                acked[gid][key] = str(gid)

            for rnd in range(3):
                await asyncio.gather(*(write(gid, f"r{rnd}k{i}") for i in range(40) for gid in leaders))
            # A last round still in flight when every node crashes.
            tasks = [asyncio.ensure_future(write(gid, f"late{i}")) for i in range(40) for gid in leaders]
            await c.wait_for(lambda: any(acked[gid].get("late0") for gid in leaders), 10, "a late ack")
            for n in list(c.nodes):
                await c.crash(n)
            await asyncio.gather(*tasks, return_exceptions=True)
            c.sms.clear()
            await c.start()
            for gid in leaders:
                await c.g(1, gid).campaign()
                leader = await c.wait_leader(gid)
                await leader.propose(b"post=1", 10)  # commits the new term; every node catches up
                await c.wait_converged(gid)
                for n in c.ids:
                    data = c.sms[(n, gid)].data
                    missing = [k for k, v in acked[gid].items() if data.get(k) != v]
                    assert not missing, f"node {n} group {gid} lost acknowledged writes, e.g. {missing[:3]}"
        finally:
            await c.close()
    run(main())


def test_read_index_sees_every_acknowledged_write(tmp_path, run):
    async def main():
        # With link latency a follower learns the commit index a hop after the leader acked,
        # so a read on it must really wait for the apply.
        c = await Cluster(tmp_path, net=LocalNetwork(latency_s=0.002)).start()
        try:
            leader = await c.wait_leader()
            follower = next(c.g(n) for n in c.ids if n != leader.node_id)
            fsm = c.sms[(follower.node_id, 1)]
            lagged = 0
            for i in range(30):
                idx = await leader.propose(f"w{i}={i}".encode(), 5)
                lagged += follower.applied < idx
                # A read started after the ack must see it, on the leader and on a follower.
                for g, sm in ((leader, c.sms[(leader.node_id, 1)]), (follower, fsm)):
                    ri = await g.read_index(5)
                    assert ri >= idx and g.applied >= ri
                    assert sm.data[f"w{i}"] == str(i)
            assert lagged > 0
            # Many concurrent reads share ReadIndex rounds.
            reads = await asyncio.gather(*(follower.read_index(5) for _ in range(200)))
            assert min(reads) >= idx
        finally:
            await c.close()
    run(main())


def test_read_index_without_leader_fails_typed(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.wait_leader()
            c.net.isolate(leader.node_id, c.ids)
            # The isolated leader cannot get a heartbeat quorum: the read never confirms.
            with pytest.raises(ReadFailed):
                await leader.read_index(timeout=0.05)
        finally:
            await c.close()
    run(main())


def test_far_behind_follower_catches_up_via_snapshot(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path, snapshot_entries=100, snapshot_keep_entries=10).start()
        try:
            leader = await c.wait_leader()
            lag = next(n for n in c.ids if n != leader.node_id)
            c.net.isolate(lag, c.ids)
            for rnd in range(3):
                res = await propose_all(leader, 150, prefix=f"r{rnd}k")
                assert all(isinstance(r, int) for r in res)
            await c.wait_for(lambda: leader.status().first_index > c.g(lag).applied + 1, 5,
                             "the leader to compact past the lagging follower")
            c.net.heal()
            await c.wait_converged(timeout=15)
            assert c.g(lag).stats.snapshots_installed >= 1 and c.sms[(lag, 1)].restores >= 1
            assert len(c.sms[(lag, 1)].data) == 450
            # The installed snapshot is durable: the follower restarts from it.
            await c.crash(lag)
            await c.start_node(lag)
            assert c.g(lag).applied >= c.g(lag).snap_index > 100
            await leader.propose(b"z=1", 5)
            await c.wait_converged()
        finally:
            await c.close()
    run(main())


def test_conf_change_adds_an_empty_node_that_catches_up(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path, snapshot_entries=50, snapshot_keep_entries=5).start()
        try:
            leader = await c.wait_leader()
            res = await propose_all(leader, 120)
            assert all(isinstance(r, int) for r in res)
            await c.start_node(4, voters=())  # empty: no bootstrap, learns everything from the leader
            cs = await leader.propose_conf_change(ConfChange(ConfChangeType.ADD_NODE, 4), 5)
            assert cs.voters == (1, 2, 3, 4)
            c.ids = (1, 2, 3, 4)
            await c.wait_converged(timeout=15)
            assert c.g(4).conf_state.voters == (1, 2, 3, 4) and c.g(4).stats.snapshots_installed == 1
            # After the snapshot the leader probes node 4, then replicates once an append is acked.
            await c.wait_for(lambda: leader.raft_status().progress[4].state == ProgressState.REPLICATE, 10,
                             "the leader replicating to node 4")
        finally:
            await c.close()
    run(main())


class PoisonKV(KV):
    def apply(self, index, data):
        if data == b"poison=1":
            raise RuntimeError("state machine bug")
        return super().apply(index, data)


def test_state_machine_error_stops_the_group_without_claiming_failure(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path, sm_factory=PoisonKV).start()
        try:
            leader = await c.wait_leader()
            assert await leader.propose(b"ok=1", 5) > 0
            outcomes = await asyncio.gather(leader.propose(b"poison=1", 5), leader.propose(b"after=1", 5),
                                            return_exceptions=True)
            # Both are committed but this replica cannot vouch for their effect: unknown, not failed.
            assert all(isinstance(o, UnknownOutcome) and "group failed" in o.reason for o in outcomes)
            await c.wait_for(lambda: all(c.g(n).failed is not None for n in c.ids), 5, "every replica to stop")
            assert "state machine bug" in leader.status().failed
            with pytest.raises(ProposalDropped):
                await leader.propose(b"more=1", 5)
        finally:
            await c.close()
    run(main())


def test_transfer_leader(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.wait_leader()
            await leader.propose(b"a=1", 5)
            to = next(n for n in c.ids if n != leader.node_id)
            await c.wait_converged()
            await leader.transfer_leader(to)
            await c.wait_for(lambda: c.g(to).is_leader(), 5, "the transfer")
            assert c.g(to).status().role == StateRole.LEADER
            assert await c.g(to).propose(b"b=2", 5) > 0
        finally:
            await c.close()
    run(main())


def test_clean_close_resolves_every_caller(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        leader = await c.wait_leader()
        c.net.isolate(leader.node_id, c.ids)  # nothing can commit
        # Occupy every I/O thread of the leader's node: its next Ready stays "busy" (in the
        # log, being persisted) and later proposals wait in the queue behind it.
        mr = c.nodes[leader.node_id]
        gate = threading.Event()
        blockers = [mr.executor.submit(gate.wait) for _ in range(mr.options.io_threads)]
        in_log = [asyncio.ensure_future(leader.propose(f"a{i}=1".encode())) for i in range(10)]
        await c.wait_for(lambda: leader.stats.proposals >= 10 and leader.busy, 5, "a busy Ready")
        queued = [asyncio.ensure_future(leader.propose(f"b{i}=1".encode())) for i in range(10)]
        await asyncio.sleep(0.05)
        assert leader.busy and leader.stats.proposals == 10
        closer = asyncio.ensure_future(c.close())
        await asyncio.sleep(0.01)
        gate.set()
        await closer
        assert all(b.done() for b in blockers)
        for o in await asyncio.gather(*in_log, return_exceptions=True):
            assert isinstance(o, UnknownOutcome) and o.index > 0, o
        for o in await asyncio.gather(*queued, return_exceptions=True):
            assert isinstance(o, ProposalDropped) and o.reason == "node shutting down", o
    run(main())


def test_throughput_batched_vs_single_with_fsync(tmp_path, run):
    """Committed proposals/s through the driver (fsync on): one caller at a time vs 2000 at once."""
    async def main():
        c = await Cluster(tmp_path, snapshot_entries=100_000, election_tick=50).start()
        try:
            leader = await c.wait_leader()
            t0 = time.perf_counter()
            n_single = 0
            while time.perf_counter() - t0 < 1.0:
                await leader.propose(b"s=%d" % n_single, 5)
                n_single += 1
            single = n_single / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            res = await propose_all(leader, 4000, prefix="b")
            batched = len(res) / (time.perf_counter() - t0)
            assert all(isinstance(r, int) for r in res), {repr(r) for r in res if not isinstance(r, int)}
            print(f"\nthroughput with fsync: single {single:.0f}/s, batched {batched:.0f}/s "
                  f"({leader.stats.syncs} leader syncs total)")
            assert batched > 3 * single
        finally:
            await c.close()
    run(main())


# ---------------------------------------------------------------- persist paths and callbacks


class DurableWatch:
    """Records, per node, what its storage has made durable (a sync() that returned) and on
    which thread; checks every ack and vote grant the node sends against it."""

    def __init__(self, c: Cluster, gid: int = 1):
        self.c = c
        self.gid = gid  # the group watched
        self.durable: dict[int, tuple[int, object]] = {}  # node -> (last index, hard state)
        self.sync_threads: dict[int, list[bool]] = {}  # node -> [ran on the loop thread?]
        self.checked = {MT.APP_RESP: 0, MT.VOTE_RESP: 0}
        self.violations: list[str] = []
        self.loop_thread = threading.get_ident()

    def install(self, nid: int) -> None:
        mr = self.c.nodes[nid]
        g = mr.group(self.gid)
        st = g.storage
        inner_sync, inner_send = st.sync, mr.send
        self.durable[nid] = (st.last_index(), st.hard_state())
        self.sync_threads.setdefault(nid, [])

        def sync(*a, **kw):
            ok = inner_sync(*a, **kw)
            self.sync_threads[nid].append(threading.get_ident() == self.loop_thread)
            self.durable[nid] = (st.last_index(), st.hard_state())
            return ok

        def send(gid, m):
            if gid == self.gid and m.type in self.checked and not m.reject:
                self.checked[m.type] += 1
                last, hs = self.durable[nid]
                if m.type == MT.APP_RESP and m.index > last:
                    self.violations.append(f"node {nid} acked {m.index} with {last} durable")
                if m.type == MT.VOTE_RESP and (hs.term != m.term or hs.vote != m.to):
                    self.violations.append(f"node {nid} granted a vote to {m.to} in term {m.term} "
                                           f"before it was durable ({hs})")
            inner_send(gid, m)
        st.sync = sync
        mr.send = send


@pytest.mark.parametrize("inline_sync_bytes", [0, MultiRaftOptions().inline_sync_bytes])
def test_acks_and_vote_grants_leave_only_after_their_sync(tmp_path, run, inline_sync_bytes):
    """The Ready contract on both persist paths: persisted messages (MsgAppResp, vote grants)
    are sent only once the state they promise is durable."""
    async def main():
        c = Cluster(tmp_path, mr_kw=dict(inline_sync_bytes=inline_sync_bytes))
        w = DurableWatch(c)
        for nid in c.ids:
            await c.start_node(nid)
            w.install(nid)
        try:
            leader = await c.wait_leader()
            for rnd in range(3):
                res = await propose_all(leader, 100, prefix=f"r{rnd}k")
                assert all(isinstance(r, int) for r in res), res[:3]
                to = next(n for n in c.ids if n != leader.node_id)
                await c.wait_converged()
                await leader.transfer_leader(to)  # a new election: vote grants
                await c.wait_for(lambda: c.g(to).is_leader(), 10, "the transfer")
                leader = c.g(to)
            await leader.propose(b"last=1", 5)
            await c.wait_converged()
            assert not w.violations, w.violations[:5]
            assert w.checked[MT.APP_RESP] > 0 and w.checked[MT.VOTE_RESP] > 0, w.checked
            on_loop = [x for n in c.ids for x in w.sync_threads[n]]
            # inline: followers' appends are synced on the loop thread; 0: every sync in the executor
            assert any(on_loop) == bool(inline_sync_bytes) and not all(on_loop)
        finally:
            await c.close()
    run(main())


def test_a_node_leading_a_group_syncs_its_follower_appends_in_the_executor(tmp_path, run):
    """Two groups: node 1 leads group 1, node 2 leads group 2. Node 1 follows group 2, and its
    appends there are synced in the executor, not on the loop (where each would stall group
    1's leader), yet still acked only once durable; node 3 leads nothing but follows both
    awake groups, and syncs in the executor too (an inline fsync of one group's append would
    hold up the other's)."""
    async def main():
        c = Cluster(tmp_path, groups=(1, 2), election_tick=300)  # leaders only by campaign()
        w = DurableWatch(c, gid=2)
        for nid in c.ids:
            await c.start_node(nid)
            w.install(nid)
        try:
            await c.g(1, 1).campaign()
            await c.g(2, 2).campaign()
            await c.wait_for(lambda: c.g(1, 1).is_leader() and c.g(2, 2).is_leader(), 10, "the campaigns")
            # The node loop re-reads who it leads at each tick.
            await c.wait_for(lambda: [c.nodes[n].inline_sync_bytes for n in c.ids]
                             == [0, 0, 0], 10, "the inline limits")
            for threads in w.sync_threads.values():
                threads.clear()
            for rnd in range(3):
                res = await propose_all(c.g(2, 2), 50, prefix=f"r{rnd}k")
                assert all(isinstance(r, int) for r in res), res[:3]
            await c.wait_converged(gid=2)
            assert not w.violations, w.violations[:5]
            assert w.checked[MT.APP_RESP] > 0, w.checked
            assert w.sync_threads[1] and not any(w.sync_threads[1]), w.sync_threads[1]
            assert w.sync_threads[3] and not any(w.sync_threads[3]), w.sync_threads[3]
        finally:
            await c.close()
    run(main())


def test_a_leaders_sync_goes_to_the_executor_while_its_appends_are_sent(tmp_path, run):
    """A leader's Ready has MsgApps: its sync runs in the executor (the loop keeps running),
    and the MsgApps are with the transport before that sync has returned."""
    async def main():
        c = await Cluster(tmp_path, election_tick=300).start()  # no election while the sync is held
        try:
            await c.g(1).campaign()
            leader = await c.wait_leader()
            await leader.propose(b"warm=1", 5)  # both followers in replicate state (not probing)
            await c.wait_converged()
            mr = c.nodes[leader.node_id]
            gate = threading.Event()
            entered = threading.Event()
            inner = leader.storage.sync

            def held_sync(*a, **kw):
                entered.set()
                assert threading.get_ident() != loop_thread
                gate.wait(10)
                return inner(*a, **kw)
            loop_thread = threading.get_ident()
            leader.storage.sync = held_sync
            sent0 = mr.stats.messages_sent
            fut = asyncio.ensure_future(leader.propose(b"a=1", 10))
            await c.wait_for(lambda: entered.is_set() and mr.stats.messages_sent >= sent0 + 2, 5,
                             "the leader's sync running while its MsgApps went out")
            assert leader.busy and not fut.done()
            # The followers append (and ack) while the leader is still syncing.
            last = leader.rn.raft.raft_log.last_index()  # the entry being synced
            assert leader.status().last_index < last  # status: the storage as of its last job
            await c.wait_for(lambda: all(c.g(n).status().last_index >= last
                                         for n in c.ids if n != leader.node_id), 5, "follower appends")
            gate.set()
            assert await fut > 0
            leader.storage.sync = inner
            await c.wait_converged()
        finally:
            gate.set()
            await c.close()
    run(main())


def test_propose_nowait_calls_back_once_with_the_outcome(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.wait_leader()
            got = []
            leader.propose_nowait(b"a=1", lambda r, e: got.append((r, e)), timeout=5)
            leader.kick()
            await c.wait_for(lambda: got, 5, "the callback")
            await asyncio.sleep(0.05)
            assert len(got) == 1 and got[0][1] is None and got[0][0] == c.sms[(leader.node_id, 1)].applied_index
            follower = next(c.g(n) for n in c.ids if n != leader.node_id)
            with pytest.raises(NotLeader):
                follower.propose_nowait(b"b=1", lambda r, e: got.append((r, e)))
            with pytest.raises(ProposalDropped):
                leader.propose_nowait(b"", lambda r, e: got.append((r, e)))
            # In the log but never committed: the deadline gives UnknownOutcome, once.
            c.net.isolate(leader.node_id, c.ids)
            late = []

            def cb(r, e):
                late.append((r, e))
                raise RuntimeError("a callback's bug is logged, not the group's failure")
            leader.propose_nowait(b"c=1", cb, timeout=0.2)
            await c.wait_for(lambda: late, 5, "the deadline")
            await asyncio.sleep(0.05)
            assert len(late) == 1 and isinstance(late[0][1], UnknownOutcome) and late[0][1].index > 0
            assert leader.failed is None and len(got) == 1
        finally:
            await c.close()
    run(main())


def test_wait_idle_and_on_idle_follow_the_storage_job(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.wait_leader()
            await leader.wait_idle()  # not busy: returns at once (or after the current job)
            idle = []
            leader.on_idle = lambda: idle.append(leader.busy)
            gate = threading.Event()
            inner = leader.storage.sync
            leader.storage.sync = lambda *a, **kw: (gate.wait(10), inner(*a, **kw))[1]
            fut = asyncio.ensure_future(leader.propose(b"a=1", 10))
            await c.wait_for(lambda: leader.busy, 5, "a busy leader")
            waiter = asyncio.ensure_future(leader.wait_idle())
            await asyncio.sleep(0.05)
            assert not waiter.done() and not idle
            gate.set()
            await waiter
            assert idle and idle[0] is False  # called with the group no longer busy
            leader.storage.sync = inner
            assert await fut > 0
        finally:
            gate.set()
            await c.close()
    run(main())


class OptionalKV(KV):
    """KV that declares results_optional: records, per applied index, whether
    the driver wanted its result."""
    results_optional = True

    def __init__(self):
        super().__init__()
        self.wanted: dict[int, bool] = {}

    def apply(self, index: int, data: bytes, want_results: bool = True):
        self.wanted[index] = want_results
        result = super().apply(index, data)
        return result if want_results else None


def test_results_are_wanted_only_where_a_proposal_waits(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path, sm_factory=OptionalKV).start()
        try:
            leader = await c.wait_leader()
            results = await propose_all(leader, 50)
            assert all(isinstance(r, int) for r in results), results[:3]   # the proposers get results
            await c.wait_converged()
            lsm = c.sms[(leader.node_id, 1)]
            for nid in c.ids:
                sm = c.sms[(nid, 1)]
                proposed = [i for i in sm.wanted if i in set(results)]
                assert len(proposed) == 50
                if sm is lsm:
                    assert all(sm.wanted[i] for i in results)
                else:                                  # followers: nobody waits there
                    assert not any(sm.wanted.values())
            assert len({c.sms[(n, 1)].chain for n in c.ids}) == 1     # same state everywhere
        finally:
            await c.close()
    run(main())
