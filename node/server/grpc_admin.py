"""The cluster-management RPCs of XRaftService (grpc_service.py): the slot map and layout,
leader transfer, rebalancing and membership plans, map changes and slot-move steps.

A mixin: each RPC runs through the service's `_handle` (authentication, deadline, error
mapping) and calls the part of the node that owns it (admin_rpcs.py, slot_move_steps.py,
membership.py). A server built without that part (a single-group test server) answers
UNIMPLEMENTED, naming what it lacks.
"""
from __future__ import annotations

import grpc

from xraft.proto.v1 import client_pb2 as pb


class AdminRpcs:
    """Needs of its host: `_handle(request, context, body)`, and `_layout`, `_admin`,
    `_slot_moves`, `_membership` (each None when the server has no such part)."""

    async def _part(self, part, missing: str, request, context, fn):
        """fn(part, call) through _handle, or UNIMPLEMENTED if the server has no `part`."""
        if part is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server has no " + missing)

        async def body(call):
            return await fn(part, call)
        return await self._handle(request, context, body)

    async def ClusterLayout(self, request, context):
        async def fn(layout, call):
            return layout_pb(*layout())
        return await self._part(self._layout, "slot map", request, context, fn)

    async def TransferLeader(self, request, context):
        async def fn(admin, call):
            return await admin.transfer_leader(request, call.remaining())
        return await self._part(self._admin, "leader transfer", request, context, fn)

    async def RebalancePlan(self, request, context):
        async def fn(admin, call):
            return admin.rebalance_plan()
        return await self._part(self._admin, "slot map", request, context, fn)

    async def GetSlotMap(self, request, context):
        async def fn(admin, call):
            return admin.get_slot_map()
        return await self._part(self._admin, "slot map", request, context, fn)

    async def ProposeMapChange(self, request, context):
        async def fn(admin, call):
            return await admin.propose_map_change(request, call.remaining())
        return await self._part(self._admin, "metadata group", request, context, fn)

    async def SlotMoveStep(self, request, context):
        async def fn(moves, call):
            return await moves.step(request)
        return await self._part(self._slot_moves, "slot moves", request, context, fn)

    async def GroupMembership(self, request, context):
        async def fn(membership, call):
            return await membership.handle(request)
        return await self._part(self._membership, "membership changes", request, context, fn)

    async def MembershipPlan(self, request, context):
        async def fn(membership, call):
            return membership.plan(request)
        return await self._part(self._membership, "membership changes", request, context, fn)


def layout_pb(slot_map, leaders: dict, node_id: int) -> pb.ClusterLayoutResponse:
    """ClusterLayoutResponse of a cluster/slot_map.SlotMap, {group id: (leader id, term)} and
    the answering node's id."""
    out = pb.ClusterLayoutResponse(epoch=slot_map.epoch, node_id=node_id)
    for n in sorted(slot_map.nodes.values(), key=lambda n: n.node_id):
        out.nodes.add(id=n.node_id, grpc=n.grpc, resp=n.resp, state=n.state.value)
    for gid, g in sorted(slot_map.groups.items()):
        lead, term = leaders.get(gid, (0, 0))
        out.groups.add(id=gid, leader=lead, term=term, voters=g.voters, learners=g.learners,
                       preferred_leader=g.preferred_leader,
                       slots=[pb.SlotRange(first=a, last=b) for a, b in slot_map.ranges(gid)])
    return out
