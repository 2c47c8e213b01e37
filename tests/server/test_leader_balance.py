"""LeaderBalancer in process: 3 MultiRaft nodes over LocalTransport, one group that prefers
node 3. The leader hands leadership to node 3 once it is an active, caught-up voter; node 3
itself never transfers; while node 3 is cut off nobody tries; attempts are rate-limited."""
import asyncio

from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import GroupSpec, NodeSpec
from xraft.node.server.leader_balance import LeaderBalancer

from tests.server.test_raft_backend import ADDRESSES, IDS, Cluster, run  # noqa: F401 (fixture)

LAYOUT = initial_layout({n: NodeSpec(n, a.grpc, a.resp) for n, a in ADDRESSES.items()}, 1)
LAYOUT = LAYOUT.with_group(GroupSpec(1, (1, 2, 3), preferred_leader=3))


def balancers(c, now):
    return {n: LeaderBalancer(n, LAYOUT, {1: c.b[n]}, interval_s=0.05, cooldown_s=5.0, clock=lambda: now[0])
            for n in IDS}


def test_leadership_moves_to_the_preferred_node_and_stays(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            now = [0.0]
            bal = balancers(c, now)
            leader = await c.writable_leader()
            if leader.raft_id == 3:                   # start from another leader
                await leader.driver.transfer_leader(1)
                leader = await c.writable_leader(among=(1, 2))
            # Node 3 cut off: not recently active, so nobody hands it leadership.
            c.net.isolate(3, [1, 2])
            await c.wait_for(lambda: not leader.driver.raft_status().progress[3].recent_active,
                             "node 3 to look inactive", timeout=20)
            assert bal[leader.raft_id].candidates() == []
            c.net.heal()
            await c.wait_for(lambda: bal[leader.raft_id].candidates() == [(1, 3)], "node 3 active and caught up")
            await bal[leader.raft_id].step()
            # step() returns once the leader has stepped the transfer; node 3 wins its
            # election a few loop iterations later (the old leader stays writable until then).
            new = await c.writable_leader(among=(3,))
            assert new.raft_id == 3 and bal[leader.raft_id].transfers == 1
            # The preferred leader never transfers; the old one does not try again within the cooldown.
            assert all(b.candidates() == [] for b in bal.values())
            await new.driver.transfer_leader(leader.raft_id)
            away = await c.writable_leader(among=(1, 2))
            assert away is leader
            assert bal[away.raft_id].candidates() == []          # within the cooldown: no second try
            now[0] += 6.0
            await c.wait_for(lambda: bal[away.raft_id].candidates() == [(1, 3)], "after the cooldown")
        finally:
            await c.close()
    run(main())
