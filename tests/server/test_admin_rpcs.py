"""AdminRpcs in process: 3 MultiRaft nodes over LocalTransport, one group preferring node 3.

TransferLeader: a non-leader records the override and answers NOT_LEADER naming the
leader; the leader transfers and answers once the target leads; every reached node's
balancer then prefers the target (so none pulls the group back); a transfer to the
map's preferred node clears the override; an unknown group or a non-voter target is a
final COMMAND_ERROR; an unreachable target is a retriable UNAVAILABLE, and a transfer
that did not finish is UNAVAILABLE while the target lags, TIMEOUT otherwise.
RebalancePlan: plan_rebalance of the node's map, as data."""
import pytest

from xraft.node.cluster.changes import BeginMove, SetPreferredLeader
from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.rebalance import plan_rebalance
from xraft.node.cluster.slot_map import GroupSpec, NodeSpec
from xraft.node.engine.errors import EngineError
from xraft.node.server.admin_rpcs import AdminRpcs
from xraft.node.server.backend import NotLeader
from xraft.node.server.leader_balance import LeaderBalancer
from xraft.node.server.wire_errors import wire_for_message
from xraft.proto.v1 import client_pb2 as pb

from tests.server.test_raft_backend import ADDRESSES, IDS, Cluster, run, xadd  # noqa: F401 (fixture)

NODES = {n: NodeSpec(n, a.grpc, a.resp) for n, a in ADDRESSES.items()}
LAYOUT = initial_layout(NODES, 1).with_group(GroupSpec(1, (1, 2, 3), preferred_leader=3))
GRPC = {n: a.grpc for n, a in ADDRESSES.items()}


def admins(c):
    bal = {n: LeaderBalancer(n, LAYOUT, {1: c.b[n]}, interval_s=0.05, cooldown_s=5.0, clock=lambda: 0.0)
           for n in IDS}
    return bal, {n: AdminRpcs(n, LAYOUT, {1: c.b[n]}, lambda n=n: bal[n], GRPC) for n in IDS}


def req(group, to, wait_ms=10_000):
    return pb.TransferLeaderRequest(group_id=group, to_node=to, wait_ms=wait_ms)


def test_transfer_records_the_override_and_waits_for_the_target(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            bal, rpcs = admins(c)
            leader = await c.writable_leader()
            target = next(n for n in IDS if n not in (leader.raft_id, 3))   # not the map's choice
            bystander = next(n for n in IDS if n not in (leader.raft_id, target))
            # A leader is writable once ONE follower has its first entry: the other may not
            # have heard from it yet (it would rightly answer "no leader known").
            await c.wait_for(lambda: all(c.b[n].leader_id() == leader.raft_id for n in IDS),
                             "every replica to know the leader")
            for follower in (bystander, target):            # as the SDK does: followers first
                with pytest.raises(NotLeader) as ei:
                    await rpcs[follower].transfer_leader(req(1, target), None)
                assert (ei.value.leader_id, ei.value.grpc_address) == (leader.raft_id, GRPC[leader.raft_id])
                assert bal[follower].preferred(1) == target
            r = await rpcs[leader.raft_id].transfer_leader(req(1, target), None)
            assert r.leader == target and c.b[target].driver.is_leader()
            assert bal[leader.raft_id].preferred(1) == target
            await c.wait_for(lambda: c.b[target].writable(), "the new leader settled")
            assert bal[target].candidates() == []           # its balancer leaves it there (map: node 3)
            again = await rpcs[target].transfer_leader(req(1, target), None)   # already leads: at once
            assert again.leader == target and again.term == r.term
            # Back to the map's preferred leader: the override is cleared.
            r = await rpcs[target].transfer_leader(req(1, 3), None)
            assert r.leader == 3 and 1 not in bal[target].overrides
        finally:
            await c.close()
    run(main())


def test_transfer_errors_are_typed(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            _, rpcs = admins(c)
            leader = await c.writable_leader()
            for request, text in ((req(9, 1), "ERR no group 9 in the slot map (groups 1)"),
                                  (req(1, 7), "ERR node 7 is not a voter of group 1 (voters 1,2,3)")):
                with pytest.raises(EngineError) as ei:
                    await rpcs[leader.raft_id].transfer_leader(request, None)
                assert ei.value.message == text and not wire_for_message(text).retriable
            target = next(n for n in IDS if n != leader.raft_id)
            c.net.isolate(target, [n for n in IDS if n != target])
            await c.wait_for(lambda: not leader.driver.raft_status().progress[target].recent_active,
                             "the target to look inactive", timeout=20)
            with pytest.raises(Exception) as ei:
                await rpcs[leader.raft_id].transfer_leader(req(1, target), None)
            message = ei.value.message
            assert message.startswith(f"UNAVAILABLE node {target} is not reachable from group 1's leader")
            assert wire_for_message(message).retriable and leader.driver.is_leader()
            # A transfer that did not finish is told apart by the target's lag.
            await leader.submit([xadd(b"s", b"*", f="while the target is away")])
            lagging = rpcs[leader.raft_id]._not_done(leader, 1, target, 1.0)
            assert lagging.message.startswith(f"UNAVAILABLE node {target} is not caught up with group 1 (")
            c.net.heal()
            d = leader.driver
            await c.wait_for(lambda: d.raft_status().progress[target].match == d.status().last_index,
                             "the target to catch up")
            slow = rpcs[leader.raft_id]._not_done(leader, 1, target, 1.0)
            assert slow.message.startswith(f"TIMEOUT node {target} did not take the leadership of group 1 "
                                           f"within 1.0s (leader now: {leader.raft_id})")
            assert wire_for_message(slow.message).retriable
        finally:
            await c.close()
    run(main())


def test_rebalance_plan_is_plan_rebalance_as_data():
    m = initial_layout(NODES, 3)
    assert AdminRpcs(1, m, {}, lambda: None, GRPC).rebalance_plan().slot_moves == []
    g1, g2 = m.groups[1], m.groups[2]
    skewed = m.with_owner(m_slots(m, 2)[:2000], 1).with_group(
        GroupSpec(2, g2.voters, preferred_leader=g1.preferred_leader))
    r = AdminRpcs(2, skewed, {}, lambda: None, GRPC).rebalance_plan()
    assert r.epoch == skewed.epoch and r.node_id == 2
    changes = plan_rebalance(skewed)
    assert [(x.first, x.last, x.to_group) for x in r.slot_moves] == \
        [(ch.first, ch.last, ch.target) for ch in changes if isinstance(ch, BeginMove)]
    assert r.slot_moves and all(x.from_group == skewed.owner(x.first) == 1 for x in r.slot_moves)
    assert [(x.group_id, x.to_node) for x in r.leader_changes] == \
        [(ch.group_id, ch.node_id) for ch in changes if isinstance(ch, SetPreferredLeader)]
    assert r.leader_changes and all(x.from_node == skewed.groups[x.group_id].preferred_leader
                                    for x in r.leader_changes)


def m_slots(m, gid) -> list:
    return [s for a, b in m.ranges(gid) for s in range(a, b + 1)]
