"""ShardedBackend in process: one node's MultiRaft with real DiskStorage hosting groups 1 and 3
of a 3-group map (group 2 lives on node 2 only), driven through the Backend protocol.

Routing by slot, CROSSSLOT, the keyless rules (DBSIZE/KEYS/SCAN over the groups led here,
FLUSHALL and CONFIG SET proposed to each), REGISTER ... SLOT, per-group WATCH indexes,
CLUSTER SLOTS' shards, and a record refused at apply after the map moved its slot: the
client gets a MOVED to the slot's new owner."""
import asyncio
import time

import pytest

from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import NodeSpec
from xraft.node.engine.errors import EngineError
from xraft.node.engine.slots import key_slot
from xraft.node.fsm.entry import Request
from xraft.node.fsm.resolve import resolve_command, resolve_config_set, resolve_transaction
from xraft.node.fsm.slot_owner import OwnedSlots
from xraft.node.runtime.disk_storage import DiskStorageOptions
from xraft.node.runtime.multiraft import MultiRaft, MultiRaftOptions
from xraft.node.runtime.raft_driver import GroupOptions
from xraft.node.runtime.transport import LocalNetwork, LocalTransport
from xraft.node.runtime.wal import FsyncPolicy, WalOptions
from xraft.node.server.backend import NotLeader
from xraft.node.server.config import NodeAddresses
from xraft.node.server.raft_backend import RaftBackend
from xraft.node.server.sharded_backend import CROSSSLOT, ShardedBackend

ADDRESSES = {n: NodeAddresses("127.0.0.1:%d" % (7000 + n), "127.0.0.1:%d" % (6000 + n)) for n in (1, 2)}
LAYOUT = initial_layout({n: NodeSpec(n, a.grpc, a.resp) for n, a in ADDRESSES.items()}, 3, replicas=1)
RUNS = {1: (0, 5460), 2: (5461, 10922), 3: (10923, 16383)}


def key_in(group: int, prefix: str = "k") -> bytes:
    lo, hi = RUNS[group]
    return next(k for k in (("%s%d" % (prefix, i)).encode() for i in range(100_000)) if lo <= key_slot(k) <= hi)


def cmd(*argv):
    return resolve_command(0, 0, [a if isinstance(a, bytes) else a.encode() for a in argv]).request


@pytest.fixture
def run():
    import uvloop

    def _run(coro):
        return uvloop.run(asyncio.wait_for(coro, 60))
    return _run


class Node:
    """Node 1: groups 1 and 3 (their only voter, so it leads both at once)."""

    async def start(self, tmp_path):
        self.mr = MultiRaft(1, LocalTransport(LocalNetwork(codec=True), 1), MultiRaftOptions(
            tick_interval_s=0.01, group=GroupOptions(election_tick=10, heartbeat_tick=2, storage=DiskStorageOptions(
                wal=WalOptions(fsync=FsyncPolicy.NEVER)))))
        await self.mr.start()
        self.groups = {}
        for gid in LAYOUT.groups_of_node(1):
            b = RaftBackend(1, ADDRESSES, group_id=gid, owned=OwnedSlots.from_ranges(LAYOUT.ranges(gid)))
            d = await self.mr.add_group(gid, str(tmp_path / ("g%d" % gid)), b.machine,
                                        bootstrap_voters=LAYOUT.groups[gid].voters)
            b.attach(d)
            self.groups[gid] = b
        self.sb = ShardedBackend(1, ADDRESSES, LAYOUT, self.groups)
        deadline = time.monotonic() + 20
        while not all(b.writable() for b in self.groups.values()):
            assert time.monotonic() < deadline, "groups never became writable"
            await asyncio.sleep(0.01)
        return self

    async def close(self):
        for b in self.groups.values():
            await b.close()
        await self.mr.close()


def run_on_node(tmp_path, run, body):
    async def main():
        n = await Node().start(tmp_path)
        try:
            await body(n)
        finally:
            await n.close()
    run(main())


def test_routing_by_slot_and_crossslot(tmp_path, run):
    async def main(n):
        sb = n.sb
        assert sorted(n.groups) == [1, 3]
        k1, k3, k2 = key_in(1), key_in(3), key_in(2)
        assert await sb.submit([cmd("RPUSH", k1, "a")]) == [1]
        assert await sb.submit([cmd("RPUSH", k3, "a"), cmd("RPUSH", k3, "b")]) == [1, 2]
        assert n.groups[1].sm.keyspace.exists(k1) and not n.groups[3].sm.keyspace.exists(k1)
        assert n.groups[3].sm.keyspace.exists(k3)
        assert await sb.read([b"LLEN", k3]) == 2
        # A group this node does not host: its preferred leader, with the group and slot.
        with pytest.raises(NotLeader) as ei:
            await sb.submit([cmd("RPUSH", k2, "a")])
        e = ei.value
        assert (e.leader_address, e.grpc_address, e.leader_id, e.group_id, e.slot) == \
            (ADDRESSES[2].resp, ADDRESSES[2].grpc, 2, 2, key_slot(k2))
        assert sb.redirect_for(key_slot(k2)) == ADDRESSES[2].resp and sb.redirect_for(key_slot(k1)) is None
        for reqs in ([resolve_transaction(0, 0, [[b"RPUSH", k1, b"x"], [b"RPUSH", k3, b"x"]])],
                     [cmd("RPUSH", k1, "x"), cmd("RPUSH", k3, "x")]):
            with pytest.raises(EngineError, match="^CROSSSLOT"):
                await sb.submit(reqs)
        with pytest.raises(EngineError) as ei:
            await sb.read([b"XREAD", b"STREAMS", k1, k3, b"0", b"0"])
        assert ei.value.message == CROSSSLOT
        assert await sb.read([b"LLEN", k1]) == 1           # nothing of the refused ones applied
    run_on_node(tmp_path, run, main)


def test_keyless_commands_cover_the_groups_led_here(tmp_path, run):
    async def main(n):
        sb = n.sb
        keys = {key_in(g, "a%d-" % i) for g in (1, 3) for i in range(5)}
        for k in keys:
            await sb.submit([cmd("SET", k, "v")])
        assert await sb.read([b"DBSIZE"]) == len(keys) == 10
        assert set(await sb.read([b"KEYS", b"*"])) == keys
        seen, cursor, calls = [], b"0", 0
        while True:
            cursor, got = await sb.read([b"SCAN", cursor, b"COUNT", b"2"])
            seen += got
            calls += 1
            if cursor == b"0":
                break
            assert calls < 50
        assert sorted(seen) == sorted(keys)              # every key once, over both groups
        reply = await sb.submit([resolve_config_set(0, 0, [b"CONFIG", b"SET", b"stream-node-max-entries", b"7"])])
        assert str(reply[0]) == "OK"
        assert [b.sm.keyspace.config.stream_node_max_entries for b in n.groups.values()] == [7, 7]
        assert str((await sb.submit([cmd("FLUSHALL")]))[0]) == "OK"
        assert await sb.read([b"DBSIZE"]) == 0 and await sb.read([b"PING"]) is not None
    run_on_node(tmp_path, run, main)


def test_register_watch_index_and_shards_follow_the_groups(tmp_path, run):
    async def main(n):
        sb = n.sb
        await sb.submit([Request.register(7, route_slot=RUNS[3][0])])
        await sb.submit([Request.register(8)])                    # slot 0: group 1
        assert 7 in n.groups[3].sm.sessions.clients and 7 not in n.groups[1].sm.sessions.clients
        assert 8 in n.groups[1].sm.sessions.clients
        with pytest.raises(NotLeader) as ei:
            await sb.submit([Request.register(9, route_slot=RUNS[2][0])])
        assert ei.value.group_id == 2
        await sb.submit([cmd("SET", key_in(3), "v")])
        assert sb.applied_index([key_in(3)]) == n.groups[3].sm.applied_index
        assert sb.applied_index([key_in(1)]) == n.groups[1].sm.applied_index
        shards = sb.shards()
        assert [s.slot_ranges for s in shards] == [(RUNS[g],) for g in (1, 2, 3)]
        assert [s.nodes[0].address for s in shards] == [ADDRESSES[1].resp, ADDRESSES[2].resp,
                                                        ADDRESSES[1].resp]
        assert [s.nodes[0].myself for s in shards] == [True, False, True]
        info = sb.raft_info()
        assert info["raft_groups_led"] == "1,3" and "slots=10923-16383" in info["raft_group3"]
        # The node loop's counters, once per node (not per group): what this loop did so far.
        assert info["raft_loop_iterations"] > 0 and info["raft_loop_pumps"] > 0
        assert info["raft_loop_iterations"] <= n.mr.stats.iterations
        assert "raft_loop_commits_held" in info and "raft_loop_messages_sent" in info
    run_on_node(tmp_path, run, main)


def test_a_record_applied_after_its_slot_moved_away_gets_moved_to_the_new_owner(tmp_path, run):
    async def main(n):
        sb = n.sb
        k = key_in(1)
        slot = key_slot(k)
        pending = asyncio.get_running_loop().create_task(sb.submit([cmd("RPUSH", k, "a")]))
        await asyncio.sleep(0)                # routed to group 1 and gathered, not yet applied
        # The slot moves to group 2 (node 2) before the record applies: the new map, and
        # group 1's fsm no longer owning it (what a replicated layout change will do).
        sb.slot_map = LAYOUT.with_owner([slot], 2)
        g1 = n.groups[1]
        g1.sm.owned = OwnedSlots.from_ranges([(RUNS[1][0], slot - 1), (slot + 1, RUNS[1][1])])
        [reply] = await pending
        assert isinstance(reply, EngineError) and reply.message == "MOVED %d %s" % (slot, ADDRESSES[2].resp)
        assert not g1.sm.keyspace.exists(k)
    run_on_node(tmp_path, run, main)


def test_keys_in_slot_reads_go_to_the_slots_group(tmp_path, run):
    """CLUSTER COUNTKEYSINSLOT/GETKEYSINSLOT name no key: their internal reads are routed by
    the slot they name, so each is answered by the group that owns it; hosts_slot tells a
    slot of a hosted group from one of a group this node has no replica of."""
    from xraft.node.server.cluster_cmds import cluster_reply

    async def main(n):
        sb = n.sb
        k1, k3 = key_in(1), key_in(3)
        await sb.submit([cmd("RPUSH", k1, "a")])
        await sb.submit([cmd("RPUSH", k3, "a")])
        for k in (k1, k3):
            s = b"%d" % key_slot(k)
            assert await cluster_reply(sb, [b"CLUSTER", b"COUNTKEYSINSLOT", s], 2) == 1
            assert await cluster_reply(sb, [b"CLUSTER", b"GETKEYSINSLOT", s, b"10"], 2) == [k]
        assert sb.hosts_slot(key_slot(k1)) and sb.hosts_slot(key_slot(k3))
        assert not sb.hosts_slot(key_slot(key_in(2)))
        with pytest.raises(EngineError, match="^MOVED %d " % key_slot(key_in(2))):
            await cluster_reply(sb, [b"CLUSTER", b"COUNTKEYSINSLOT", b"%d" % key_slot(key_in(2))], 2)
    run_on_node(tmp_path, run, main)
