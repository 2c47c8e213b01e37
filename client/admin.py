"""The operator's calls (xraftctl): leader transfer and the rebalance plan.

transfer_leader(group, to): the request goes first to the group's voters that do
not lead it (each records `to` as the group's preferred leader for its leader
balancer and answers NOT_LEADER; a voter that is down is skipped, it forgets
overrides on restart anyway, and a hung one gets a quarter of the time left),
then to the leader, following NOT_LEADER, which starts the transfer and answers
once `to` leads (node/server/admin_rpcs.py).
Errors are the server's typed ones: CommandError (unknown group, target not a
voter), UnavailableError (target not reachable or not caught up) and
DeadlineExceededError (it did not take over in time).

get_slot_map(): the slot map (canonical JSON bytes, node/cluster/slot_map.py) as the first
node that answers has applied it. propose_map_change(change bytes): to the metadata group's
leader (the seed first, following NOT_LEADER; during an election it asks again); the answer
says whether the change applied or why the map refused it (ProposeMapChangeResponse).
"""
from __future__ import annotations

import asyncio

import grpc

from xraft.proto.v1 import client_pb2 as pb

from .errors import CommandError, DeadlineExceededError, NotLeaderError, UnavailableError, from_rpc_error

MAX_REDIRECTS = 8
SERVER_SHARE = 0.8          # of the time left, the leader waits for the target (its answer must get back)
FOLLOWER_SHARE = 0.25       # of the time left, one follower may take to record the override (a hung one)


async def _call(client, address: str, rpc: str, request, deadline: float):
    left = deadline - asyncio.get_running_loop().time()
    if left <= 0:
        raise DeadlineExceededError(f"{rpc}: no answer in time")
    request.options.deadline_hint_ms = max(1, int(left * 1000 * 0.9))
    try:
        return await getattr(client._node(address).stub, rpc)(request, timeout=left,
                                                              metadata=client._metadata(None))
    except grpc.aio.AioRpcError as e:
        raise from_rpc_error(e, write=False) from None


async def transfer_leader(client, group_id: int, to_node: int, timeout: float) -> pb.TransferLeaderResponse:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    layout = await client.cluster_layout(timeout=timeout)
    grpc_of = {n.id: n.grpc for n in layout.nodes}
    group = next((g for g in layout.groups if g.id == group_id), None)

    def request():
        wait_ms = max(1, int((deadline - loop.time()) * 1000 * SERVER_SHARE))
        return pb.TransferLeaderRequest(group_id=group_id, to_node=to_node, wait_ms=min(wait_ms, 60_000))

    if group is None:       # the server says so, in its words
        return await _call(client, grpc_of.get(layout.node_id) or client._seeds[0], "TransferLeader",
                           request(), deadline)
    for nid in group.voters:
        if nid == group.leader or nid not in grpc_of:
            continue
        cap = loop.time() + (deadline - loop.time()) * FOLLOWER_SHARE
        try:
            return await _call(client, grpc_of[nid], "TransferLeader", request(), cap)
        except NotLeaderError:
            pass            # recorded the override; not the leader
        except (UnavailableError, DeadlineExceededError):
            pass            # down or hung: it keeps no override, the transfer goes on without it
    address = grpc_of.get(group.leader) or grpc_of[group.voters[0]]
    last = None
    for _ in range(MAX_REDIRECTS):
        try:
            return await _call(client, address, "TransferLeader", request(), deadline)
        except NotLeaderError as e:
            last = e
            if e.leader_address:
                address = e.leader_address
            else:           # an election is under way: ask again shortly
                await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))
    raise last


async def rebalance_plan(client, timeout: float) -> pb.RebalancePlanResponse:
    """The plan from the first node that answers (any node computes it on its slot map)."""
    deadline = asyncio.get_running_loop().time() + timeout
    layout = await client.cluster_layout(timeout=timeout)
    address = next((n.grpc for n in layout.nodes if n.id == layout.node_id), client._seeds[0])
    return await _call(client, address, "RebalancePlan", pb.RebalancePlanRequest(), deadline)


async def get_slot_map(client, timeout: float) -> pb.GetSlotMapResponse:
    """The map of the first node that answers (the known nodes, then the seeds)."""
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    for address in _addresses(client):
        try:
            return await _call(client, address, "GetSlotMap", pb.GetSlotMapRequest(), deadline)
        except (UnavailableError, DeadlineExceededError) as e:
            last = e
    raise last or UnavailableError("GetSlotMap: no node to ask")


async def propose_map_change(client, change: bytes, timeout: float) -> pb.ProposeMapChangeResponse:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    addresses = _addresses(client)
    address, last = addresses[0], None
    for attempt in range(MAX_REDIRECTS * 4):
        try:
            return await _call(client, address, "ProposeMapChange", pb.ProposeMapChangeRequest(change=change),
                               deadline)
        except NotLeaderError as e:
            last = e
            if e.leader_address:
                address = e.leader_address
                continue
        except UnavailableError as e:       # that node is down: another one names the leader
            last = e
            address = addresses[(attempt + 1) % len(addresses)]
        await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))   # an election is under way
    raise last


async def group_membership(client, group_id: int, timeout: float) -> pb.GroupMembershipResponse:
    """A Raft group's configuration and its replicas' match indexes, from the group's leader
    (GroupMembership, status only): the seed first, following leader_grpc; "unavailable"
    (an election) is asked again until the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    addresses = _addresses(client)
    address, why = addresses[0], ""
    for attempt in range(MAX_REDIRECTS * 8):
        try:
            r = await _call(client, address, "GroupMembership", pb.GroupMembershipRequest(group_id=group_id),
                            deadline)
        except UnavailableError as e:       # that node is down: another one names the leader
            why = str(e)
            address = addresses[(attempt + 1) % len(addresses)]
            r = None
        if r is not None:
            if r.refused:
                raise CommandError(r.refused)
            if r.leader_grpc:
                address = r.leader_grpc
                continue
            if not r.unavailable:
                return r
            why = r.unavailable
        if loop.time() >= deadline:
            break
        await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))
    raise UnavailableError(f"GroupMembership of group {group_id}: no leader answered ({why})")


async def membership_plan(client, op: str, node_id: int, grpc_address: str, resp: str,
                          timeout: float) -> pb.MembershipPlanResponse:
    """The changes that add or remove a node, planned by the first node that answers."""
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    for address in _addresses(client):
        try:
            return await _call(client, address, "MembershipPlan", pb.MembershipPlanRequest(
                op=op, node_id=node_id, grpc=grpc_address, resp=resp), deadline)
        except (UnavailableError, DeadlineExceededError) as e:
            last = e
    raise last or UnavailableError("MembershipPlan: no node to ask")


def _addresses(client) -> list:
    """gRPC addresses to ask: the seeds, then every node the routing knows."""
    table = client._router.table
    known = list(table.addresses) if table is not None else []
    out = []
    for a in list(client._seeds) + known:
        if a and a not in out:
            out.append(a)
    return out
