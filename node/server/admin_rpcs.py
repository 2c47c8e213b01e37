"""The operator's RPCs (xraftctl): TransferLeader and RebalancePlan.

TransferLeader(group, to): validated against this node's slot map (an unknown
group or a target that is not one of the group's voters is a COMMAND_ERROR: the
same request would fail again). Every node replicating the group records the
target as the group's preferred leader in its LeaderBalancer (an in-memory
override, leader_balance.py), so no balancer pulls the group back to the slot
map's choice; the SDK sends the request to the group's other voters first for
that. The leader then starts Raft's transfer and answers once the target leads;
a node that does not lead answers NOT_LEADER naming the leader. A target that
does not answer heartbeats, or is still behind when the wait ends, is
UNAVAILABLE ("not reachable" / "not caught up"); one that was caught up but did
not take over in time is TIMEOUT. Both are retriable: nothing else changed.

RebalancePlan: plan_rebalance on this node's slot map, as data: slot runs that
would move (from the group owning them now to the target) and preferred leaders
that would change. Nothing is applied (the CLI proposes the moves one at a time).

GetSlotMap: this node's copy of the map (group 0's state as applied here) and the metadata
leader it knows. ProposeMapChange: one encoded change (changes.py) proposed to group 0 on
its leader; another node answers NOT_LEADER naming the leader's gRPC address (group 0).
A change the map refuses is an answer, not an error: applied=false with the refusal's kind
("stale_epoch" with already_applied, "move" for a MoveError, "invalid" for the rest), so a
driver can tell "done already" from "plan again". Bytes that do not decode are refused the
same way, before anything is proposed.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Optional

from xraft.proto.v1 import client_pb2 as pb

from ..cluster.changes import BeginMove, SetPreferredLeader, StaleEpoch, already_applied, decode_change
from ..cluster.meta_machine import META_GROUP_ID, MetaApplied
from ..cluster.rebalance import plan_rebalance
from ..cluster.slot_map import SlotMap, SlotMapError
from ..cluster.slot_move import MoveError
from ..runtime.driver_api import NotLeader as DriverNotLeader, ProposalDropped, UnknownOutcome
from ..engine.errors import EngineError
from .backend import BackendError, NotLeader, Unavailable
from .leader_balance import LeaderBalancer

DEFAULT_WAIT_S = 5.0
MAX_WAIT_S = 60.0
POLL_S = 0.02
PROPOSE_WAIT_S = 5.0


def _ids(ids) -> str:
    return ",".join(map(str, sorted(ids))) or "none"


class AdminRpcs:
    def __init__(self, node_id: int, slot_map: SlotMap, backends: dict,
                 balancer: Callable[[], Optional[LeaderBalancer]], grpc_of_node: dict, meta=None):
        self.node_id = node_id
        self.slot_map = slot_map
        self.backends = backends                 # {group id: RaftBackend}
        self._balancer = balancer                # the node's, once started (None for one group)
        self._grpc_of_node = grpc_of_node        # {node id: gRPC address}, for NOT_LEADER
        self.meta = meta                         # meta_group.MetaGroup (None: no map changes)

    async def transfer_leader(self, request: pb.TransferLeaderRequest, remaining: Optional[float]):
        gid, to = request.group_id, request.to_node
        spec = self.slot_map.groups.get(gid)
        if spec is None:
            raise EngineError(f"ERR no group {gid} in the slot map (groups {_ids(self.slot_map.groups)})")
        if to not in spec.voters:
            raise EngineError(f"ERR node {to} is not a voter of group {gid} (voters {_ids(spec.voters)})")
        b = self.backends.get(gid)
        if b is None or b.driver is None:
            raise EngineError(f"ERR node {self.node_id} does not replicate group {gid} "
                              f"(voters {_ids(spec.voters)}): ask one of them")
        balancer = self._balancer()
        if balancer is not None:
            balancer.set_override(gid, to)
        d = b.driver
        lead, term = b.leader_term()
        if lead == to and (to != self.node_id or d.is_leader()):
            return pb.TransferLeaderResponse(group_id=gid, leader=to, term=term)
        if not d.is_leader():
            exc = NotLeader(None)
            exc.grpc_address = self._grpc_of_node.get(lead) if lead else None
            exc.leader_id, exc.group_id = lead, gid
            raise exc
        pr = d.raft_status().progress.get(b.replica_of(to))
        if pr is None or not pr.recent_active:
            raise Unavailable(f"node {to} is not reachable from group {gid}'s leader (it answered none of "
                              f"this term's heartbeats): try again when it is up")
        wait = min(request.wait_ms / 1000 if request.wait_ms else DEFAULT_WAIT_S, MAX_WAIT_S)
        if remaining is not None:
            wait = max(0.0, min(wait, remaining))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        try:
            async with asyncio.timeout(wait):
                await d.transfer_leader(b.replica_of(to))
        except asyncio.TimeoutError:
            pass                                 # judged below, as a transfer that did not finish
        while loop.time() < deadline:
            lead, term = b.leader_term()
            if lead == to and not d.is_leader():
                return pb.TransferLeaderResponse(group_id=gid, leader=to, term=term)
            await asyncio.sleep(POLL_S)
        raise self._not_done(b, gid, to, wait)

    def _not_done(self, b, gid: int, to: int, wait: float) -> BackendError:
        """Why `to` does not lead after the wait: still behind (UNAVAILABLE) or not (TIMEOUT)."""
        d = b.driver
        if d.is_leader():
            pr = d.raft_status().progress.get(b.replica_of(to))
            behind = d.status().last_index - pr.match if pr is not None else None
            if behind:
                return Unavailable(f"node {to} is not caught up with group {gid} ({behind} entries behind "
                                   f"its leader) after {wait:.1f}s: try again")
        lead, _ = b.leader_term()
        return BackendError(f"TIMEOUT node {to} did not take the leadership of group {gid} within "
                            f"{wait:.1f}s (leader now: {lead or 'none known'})")

    def rebalance_plan(self) -> pb.RebalancePlanResponse:
        m = self.slot_map
        out = pb.RebalancePlanResponse(epoch=m.epoch, node_id=self.node_id)
        for change in plan_rebalance(m):
            if isinstance(change, BeginMove):
                out.slot_moves.add(first=change.first, last=change.last, from_group=m.owner(change.first),
                                   to_group=change.target)
            elif isinstance(change, SetPreferredLeader):
                out.leader_changes.add(group_id=change.group_id, to_node=change.node_id,
                                       from_node=m.groups[change.group_id].preferred_leader)
            else:                                # plan_rebalance makes only these two kinds
                raise EngineError(f"ERR unexpected change in a rebalance plan: {change.kind}")
        return out

    def get_slot_map(self) -> pb.GetSlotMapResponse:
        m = self.meta.slot_map if self.meta is not None else self.slot_map
        lead = self.meta.leader_id() if self.meta is not None else 0
        return pb.GetSlotMapResponse(epoch=m.epoch, slot_map=m.encode(), node_id=self.node_id, meta_leader=lead)

    async def propose_map_change(self, request: pb.ProposeMapChangeRequest,
                                 remaining: Optional[float]) -> pb.ProposeMapChangeResponse:
        if self.meta is None:
            raise EngineError("ERR this node runs no metadata group")
        try:
            change = decode_change(bytes(request.change))
        except SlotMapError as exc:
            m = self.meta.slot_map
            return pb.ProposeMapChangeResponse(applied=False, epoch=m.epoch, slot_map=m.encode(),
                                               refused_kind="invalid", refused=str(exc))
        if not self.meta.is_leader():
            raise self._meta_not_leader()
        wait = PROPOSE_WAIT_S if remaining is None else max(0.01, min(PROPOSE_WAIT_S, remaining))
        try:
            result = await self.meta.propose(change, wait)
        except DriverNotLeader:
            raise self._meta_not_leader() from None
        except ProposalDropped as exc:
            raise Unavailable(f"the metadata group dropped the change ({exc}): nothing changed, try again") from None
        except UnknownOutcome:
            raise BackendError("UNKNOWNOUTCOME the map change may or may not have been applied: read the "
                               "map (GetSlotMap) before proposing again") from None
        m = self.meta.slot_map
        if isinstance(result, MetaApplied):
            return pb.ProposeMapChangeResponse(applied=True, epoch=result.slot_map.epoch,
                                               slot_map=result.slot_map.encode())
        err = result.error
        kind = "stale_epoch" if isinstance(err, StaleEpoch) else "move" if isinstance(err, MoveError) else "invalid"
        done = already_applied(m, change) if isinstance(err, StaleEpoch) else \
            bool(getattr(err, "already_applied", False))
        return pb.ProposeMapChangeResponse(applied=False, epoch=m.epoch, slot_map=m.encode(), refused_kind=kind,
                                           refused=str(err), already_applied=done)

    def _meta_not_leader(self) -> NotLeader:
        lead = self.meta.leader_id()
        exc = NotLeader(None)
        exc.grpc_address = self._grpc_of_node.get(lead) if lead else None
        exc.leader_id, exc.group_id = lead, META_GROUP_ID
        return exc
