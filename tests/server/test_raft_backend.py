"""RaftBackend in process: 3 MultiRaft nodes over LocalTransport (partitions, heal) and real
DiskStorage in tmp dirs, driven through the Backend protocol the front ends use."""
import asyncio
import time

import pytest

from xraft.node.engine.errors import EngineError
from xraft.node.fsm.resolve import resolve_command
from xraft.node.runtime.disk_storage import DiskStorageOptions
from xraft.node.runtime.multiraft import MultiRaft, MultiRaftOptions
from xraft.node.runtime.raft_driver import GroupOptions
from xraft.node.runtime.transport import LocalNetwork, LocalTransport
from xraft.node.runtime.wal import FsyncPolicy, WalOptions
from xraft.node.server.backend import NotLeader, UnknownOutcome
from xraft.node.server.config import NodeAddresses
from xraft.node.server.raft_backend import RaftBackend

TICK = 0.01          # election timeout 20..40 ticks: slack for a loaded 2-core box
IDS = (1, 2, 3)
ADDRESSES = {n: NodeAddresses("127.0.0.1:%d" % (7000 + n), "127.0.0.1:%d" % (6000 + n)) for n in IDS}


@pytest.fixture
def run():
    import uvloop

    def _run(coro):
        return uvloop.run(asyncio.wait_for(coro, 90))
    return _run


def xadd(key: bytes, id_: bytes = b"*", **fields):
    argv = [b"XADD", key, id_] + [x for k, v in fields.items() for x in (k.encode(), v.encode())]
    return resolve_command(0, 0, argv).request


class Cluster:
    def __init__(self, tmp_path, clocks=None, **group_kw):
        self.tmp = tmp_path
        self.net = LocalNetwork(codec=True)
        # Clocks are per node and settable (ms): a test can put one node's clock behind.
        self.clock = dict(clocks or {})
        kw = dict(election_tick=20, heartbeat_tick=2,
                  storage=DiskStorageOptions(wal=WalOptions(fsync=FsyncPolicy.NEVER),
                                             cache_bytes=1 << 20, snapshot_cache_bytes=1 << 20))
        kw.update(group_kw)
        self.opts = GroupOptions(**kw)
        self.nodes: dict[int, MultiRaft] = {}
        self.b: dict[int, RaftBackend] = {}
        self.ready: dict[int, list] = {}      # ready keys each node's listener saw
        self.roles: dict[int, list] = {}      # (leader?, leader address) at each role callback

    async def start(self):
        for nid in IDS:
            clock = (lambda n=nid: self.clock[n]) if nid in self.clock else None
            b = RaftBackend(nid, ADDRESSES, clock=clock, propose_timeout_s=30, read_timeout_s=10,
                            leader_ready_timeout_s=10, leader_settle_s=5)
            self.ready[nid], self.roles[nid] = [], []
            b.add_ready_listener(self.ready[nid].append)
            b.add_role_listener(lambda b=b, nid=nid: self.roles[nid].append((b.is_leader(), b.leader_address())))
            mr = MultiRaft(nid, LocalTransport(self.net, nid), MultiRaftOptions(tick_interval_s=TICK, group=self.opts))
            await mr.start()
            driver = await mr.add_group(1, str(self.tmp / ("n%d" % nid)), b.machine, bootstrap_voters=IDS)
            b.attach(driver)
            self.nodes[nid], self.b[nid] = mr, b
        return self

    async def wait_for(self, cond, what, timeout=20.0):
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for " + what)
            await asyncio.sleep(TICK)

    async def writable_leader(self, among=IDS) -> RaftBackend:
        found = []

        def one():
            found[:] = [n for n in among if self.b[n].raft_info()["raft_writable"]]
            return len(found) == 1
        await self.wait_for(one, "a writable leader among %s" % (among,))
        return self.b[found[0]]

    async def converged(self, ids=IDS):
        await self.wait_for(lambda: len({self.b[n].sm.applied_index for n in ids}) == 1
                            and len({self.b[n].driver.applied for n in ids}) == 1, "replicas to converge")

    async def close(self):
        for nid, mr in self.nodes.items():
            await self.b[nid].close()
            await mr.close()


def others(b: RaftBackend):
    return [n for n in IDS if n != b.raft_id]


def test_writes_resolve_after_apply_with_their_results(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.writable_leader()
            ok, dup = await leader.submit([xadd(b"s", b"1-1", f="a"), xadd(b"s", b"1-1", f="b")])
            assert ok == b"1-1" and isinstance(dup, EngineError) and "equal or smaller" in dup.message
            # One loop iteration's submits share one record; each gets its own results.
            before = leader.records
            got = await asyncio.gather(*(leader.submit([xadd(b"s", b"2-%d" % i, i=str(i))]) for i in range(1, 11)))
            assert [r[0] for r in got] == [b"2-%d" % i for i in range(1, 11)]
            assert leader.records == before + 1
            # The driver's on_change hook reported every entry this leader appended.
            assert leader.raft_info()["raft_leader_appended"] == leader.records == 2
            # Resolved only after applying here: the state already shows them.
            assert leader.sm.read([b"XLEN", b"s"], leader.now_ms()) == 11
            await c.converged()
            for n in IDS:
                assert await c.b[n].read([b"XLEN", b"s"], linearizable=False) == 11
        finally:
            await c.close()
    run(main())


def test_a_partitioned_leaders_pending_writes_end_unknown_outcome(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            old = await c.writable_leader()
            await old.submit([xadd(b"s", b"1-1", f="v")])
            c.net.isolate(old.raft_id, IDS)
            pending = asyncio.ensure_future(old.submit([xadd(b"s", b"2-1", f="lost?")]))
            new = await c.writable_leader(among=others(old))
            # The old leader steps down (check quorum): what it appended may or may not
            # commit, so the caller hears UnknownOutcome, never a plain failure.
            with pytest.raises(UnknownOutcome):
                await pending
            await c.wait_for(lambda: not old.is_leader(), "the old leader to step down")
            with pytest.raises(NotLeader):             # and from now on nothing is proposed there
                await old.submit([xadd(b"s", b"3-1", f="v")])
            assert await new.submit([xadd(b"s", b"4-1", f="v")]) == [b"4-1"]
            c.net.heal()
            await c.converged()
            # The uncommitted entry was overwritten by the new leader's log on every replica.
            for n in IDS:
                ids = [e[0] for e in await c.b[n].read([b"XRANGE", b"s", b"-", b"+"], linearizable=False)]
                assert ids == [b"1-1", b"4-1"]
        finally:
            await c.close()
    run(main())


def test_linearizable_reads_see_every_acknowledged_write_across_a_leader_change(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.writable_leader()
            for i in range(1, 6):
                await leader.submit([xadd(b"s", b"1-%d" % i, i=str(i))])
                assert await leader.read([b"XLEN", b"s"]) == i
            target = others(leader)[0]
            seen = len(c.roles[leader.raft_id])
            await leader.driver.transfer_leader(target)
            new = await c.writable_leader(among=(target,))
            # No wait for the new leader to apply: the ReadIndex round does that.
            assert await new.read([b"XLEN", b"s"]) == 5
            # The deposed leader's listeners heard of the change with the successor's address
            # (never "no leader": blocked clients get a MOVED they can follow).
            await c.wait_for(lambda: len(c.roles[leader.raft_id]) > seen and not c.roles[leader.raft_id][-1][0],
                             "the old leader's role callback")
            told = [r for r in c.roles[leader.raft_id][seen:] if not r[0]]
            assert told and all(addr == ADDRESSES[target].resp for _, addr in told), told
        finally:
            await c.close()
    run(main())


def test_a_follower_refuses_linearizable_reads_and_serves_stale_ones(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.writable_leader()
            await leader.submit([xadd(b"s", b"1-1", f="v")])
            follower = c.b[others(leader)[0]]
            await c.wait_for(lambda: follower.leader_id() == leader.raft_id, "the follower to know its leader")
            with pytest.raises(NotLeader) as ei:
                await follower.read([b"XLEN", b"s"])
            assert ei.value.leader_address == ADDRESSES[leader.raft_id].resp
            assert ei.value.grpc_address == ADDRESSES[leader.raft_id].grpc
            with pytest.raises(NotLeader) as ei:
                await follower.submit([xadd(b"s", b"2-1", f="v")])
            assert ei.value.leader_address == ADDRESSES[leader.raft_id].resp
            await c.converged()
            assert await follower.read([b"XLEN", b"s"], linearizable=False) == 1
            assert follower.redirect_for(0) == ADDRESSES[leader.raft_id].resp
        finally:
            await c.close()
    run(main())


def test_a_follower_that_missed_a_snapshots_worth_catches_up(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path, snapshot_entries=20, snapshot_keep_entries=5).start()
        try:
            leader = await c.writable_leader()
            lagging = c.b[others(leader)[0]]
            c.net.isolate(lagging.raft_id, IDS)
            for i in range(1, 61):
                await leader.submit([xadd(b"s", b"1-%d" % i, i=str(i))])
            # Images are made by forked children while the group goes on: wait for two.
            for _ in range(1000):
                if leader.driver.stats.snapshots_created >= 2:
                    break
                await asyncio.sleep(0.01)
            assert leader.driver.stats.snapshots_created >= 2
            assert leader.driver.status().first_index > lagging.driver.applied + 1   # its entries are gone
            c.ready[lagging.raft_id].clear()
            c.net.heal()
            await c.converged()
            assert lagging.driver.stats.snapshots_installed >= 1
            # decoded off the loop, in the storage job that persisted it (raft_driver._persist)
            assert lagging.driver.stats.snapshot_restores_prepared == lagging.driver.stats.snapshots_installed
            assert await lagging.read([b"XLEN", b"s"], linearizable=False) == 60
            # Readers of the key were woken (READONLY XREAD BLOCK on a follower): by the
            # restore, or by the entries applied after it.
            assert any(b"s" in keys for keys in c.ready[lagging.raft_id])
        finally:
            await c.close()
    run(main())


def test_time_stamps_stay_monotonic_when_the_new_leaders_clock_is_behind(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path, clocks={1: 1_000_000, 2: 1_000_000, 3: 1_000_000}).start()
        try:
            leader = await c.writable_leader()
            assert await leader.submit([xadd(b"a", f="v")]) == [b"1000000-0"]
            target = others(leader)[0]
            for n in others(leader):
                c.clock[n] = 400_000                  # the successor's clock is 10 minutes behind
            await leader.driver.transfer_leader(target)
            new = await c.writable_leader(among=(target,))
            assert new.stamper.floor_ms >= 1_000_000
            # A new stream's "*" ID is the record's time: never before a time already in the log.
            assert await new.submit([xadd(b"b", f="v")]) == [b"1000000-0"]
            c.clock[target] = 1_000_005
            assert await new.submit([xadd(b"c", f="v")]) == [b"1000005-0"]
            await c.converged()
            assert {c.b[n].sm.last_now_ms for n in IDS} == {1_000_005}
        finally:
            await c.close()
    run(main())


def test_ready_keys_fire_on_every_nodes_applies(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.writable_leader()
            for n in IDS:
                c.ready[n].clear()
            await leader.submit([xadd(b"k1", f="v"), xadd(b"k2", f="v")])
            await c.wait_for(lambda: all(any({b"k1", b"k2"} <= keys for keys in c.ready[n]) for n in IDS),
                             "ready keys on every node")
            assert all(b"other" not in keys for n in IDS for keys in c.ready[n])
        finally:
            await c.close()
    run(main())
