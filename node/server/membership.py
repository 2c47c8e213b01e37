"""Membership on the node: the Raft groups follow the slot map (docs/sharding.md, "Membership").

    MembershipRpcs        GroupMembership on a group's leader: its applied configuration (node
                          ids, and the Raft ids: a data group's replica ids, cluster/slot_map.py)
                          and replicas' match indexes; with apply=true one conf change toward the
                          wanted members, named by Raft id (cluster/membership.next_conf_step).
                          Group 0's wanted members come from the leader's own map
                          (meta_members_wanted); its Raft ids are node ids.
    MembershipReconciler  on the metadata group's leader: every group (0 included) whose Raft
                          configuration differs from the map's members gets GroupMembership
                          apply=true on its leader, round after round, until it answers done.
                          It keeps nothing that matters: a new metadata leader starts again
                          from the map (a round asks every group once, then only the not done).
    MembershipFollower    on every node: the transport knows every node of the map that is not
                          REMOVED (and forgets REMOVED ones); a group that lists this node and
                          that it does not run is opened EMPTY (no bootstrap: the leader's
                          snapshot fills it) as the replica the map names; a replica the map no
                          longer names (the node left the group, or rejoined it as a newer
                          replica) is closed and its directory deleted only once it is out of
                          the group's Raft configuration (its own applied one, or its leader's),
                          and only then is a newer replica of the group opened.
                          A node cut off while it was removed never applies the map entries that
                          remove it (its peers refuse it once the map says REMOVED): when a peer
                          refuses its link, it reads the map from the other nodes (GetSlotMap)
                          and leaves the groups a newer map no longer gives it too.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from xraft.proto.v1 import client_pb2 as pb

from ..cluster.membership import (ADD_LEARNER, CATCH_UP_ENTRIES, DEMOTE, LEAVE_JOINT, PROMOTE, REMOVE, WAIT,
                                  Conf, ConfStep, meta_members_wanted, next_conf_step, wanted_members)
from ..cluster.changes import encode_change
from ..cluster.meta_machine import META_GROUP_ID
from ..cluster.rebalance import plan_add_node, plan_remove_node
from ..cluster.slot_map import NodeSpec, NodeState, SlotMap, SlotMapError, node_of_replica
from ..raft.types import ConfChangeError, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2
from ..runtime.driver_api import DriverError
from .config import NodeAddresses
from .move_reconciler import run_rounds
from .node_join import fetch_map
from .slot_move_steps import MoveStepRefused, MoveSteps, MoveStepUnavailable

log = logging.getLogger("xraft.membership")

PROPOSE_S = 5.0            # one conf change, on the leader
CALL_S = 5.0               # one GroupMembership call, redirects and retries included
IDLE_WAIT_S = 1.0          # nothing to do: look again after this (or on a new map)
RETRY_S = 0.3              # something not done yet
MAP_FETCH_EVERY_S = 5.0    # a refused node reads a peer's map at most this often
MAP_FETCH_S = 2.0          # one GetSlotMap, per node asked
MAX_MEMBERS = 64           # wanted voters + learners a request may name

_CC_TYPE = {ADD_LEARNER: ConfChangeType.ADD_LEARNER_NODE, PROMOTE: ConfChangeType.ADD_NODE,
            REMOVE: ConfChangeType.REMOVE_NODE, DEMOTE: ConfChangeType.ADD_LEARNER_NODE}


def conf_change_of(step: ConfStep) -> ConfChangeV2:
    """The Raft change of a step: joint (implicit auto leave) or one simple change."""
    changes = tuple(ConfChangeSingle(_CC_TYPE[kind], node) for kind, node in step.changes)
    if step.kind == LEAVE_JOINT:
        return ConfChangeV2()
    transition = ConfChangeTransition.JOINT_IMPLICIT if step.joint else ConfChangeTransition.AUTO
    return ConfChangeV2(transition=transition, changes=changes)


def describe(step: ConfStep) -> str:
    return step.kind + ("" if not step.changes else " " + ",".join("%s %d" % c for c in step.changes))


def group_driver(node, group_id: int):
    if group_id == META_GROUP_ID:
        return node.meta.driver
    b = node.backends.get(group_id)
    return b.driver if b is not None else None


def replica_addresses(slot_map: SlotMap, group_id: int) -> list:
    """gRPC addresses where `group_id`'s leader may be: group 0 on every node not REMOVED;
    a data group on its voters (preferred leader first), then its learners."""
    if group_id == META_GROUP_ID:
        ids = [n for n, s in sorted(slot_map.nodes.items()) if s.state is not NodeState.REMOVED]
    else:
        spec = slot_map.groups.get(group_id)
        if spec is None:
            return []
        ids = [spec.preferred_leader] + [v for v in spec.voters if v != spec.preferred_leader] + list(spec.learners)
    return [slot_map.nodes[n].grpc for n in ids if n in slot_map.nodes]


class MembershipRpcs:
    def __init__(self, node):
        self.node = node           # node_main.Node: its layout, meta, backends

    async def handle(self, req: pb.GroupMembershipRequest) -> pb.GroupMembershipResponse:
        m: SlotMap = self.node.layout
        gid = req.group_id
        if gid != META_GROUP_ID and gid not in m.groups:
            return pb.GroupMembershipResponse(refused="ERR no group %d in the slot map" % gid)
        if len(req.voters) + len(req.learners) > MAX_MEMBERS:
            return pb.GroupMembershipResponse(refused="ERR more than %d members named" % MAX_MEMBERS)
        d = group_driver(self.node, gid)
        if d is None or d.failed is not None:
            others = [a for a in replica_addresses(m, gid) if a != self.node.cfg.grpc]
            return pb.GroupMembershipResponse(leader_grpc=others[0]) if others else \
                pb.GroupMembershipResponse(unavailable="no replica of group %d known" % gid)
        if not d.is_leader():
            lead = node_of_replica(d.status().leader_id)
            spec = m.nodes.get(lead)
            if spec is None or lead == self.node.cfg.id:
                return pb.GroupMembershipResponse(unavailable="group %d has no known leader" % gid)
            return pb.GroupMembershipResponse(leader_grpc=spec.grpc)
        out, conf, caught_up = self._status(d)
        if not req.apply:
            return out
        if gid == META_GROUP_ID:
            voters, learners = meta_members_wanted(m, conf.voters, conf.learners)
        else:
            voters, learners = tuple(req.voters), tuple(req.learners)
        if not voters:
            return pb.GroupMembershipResponse(refused="ERR a group needs at least one voter")
        step = next_conf_step(conf, voters, learners, caught_up)
        if step is None:
            out.done = True
            return out
        if step.kind == WAIT:
            out.waiting = step.why
            return out
        try:
            await d.propose_conf_change(conf_change_of(step), timeout=PROPOSE_S)
        except ConfChangeError as exc:
            return pb.GroupMembershipResponse(refused="ERR group %d: %s" % (gid, exc))
        except DriverError as exc:
            return pb.GroupMembershipResponse(unavailable="group %d: %s" % (gid, exc))
        log.warning("group %d: %s", gid, describe(step))
        out, conf, _ = self._status(d)
        out.proposed = describe(step)
        out.done = next_conf_step(conf, voters, learners, frozenset(conf.learners)) is None
        return out

    def plan(self, req: pb.MembershipPlanRequest) -> pb.MembershipPlanResponse:
        m: SlotMap = self.node.meta.slot_map
        try:
            if req.op == "add":
                changes = plan_add_node(m, NodeSpec(req.node_id, req.grpc, req.resp))
            elif req.op == "remove":
                node = m.nodes.get(req.node_id)
                changes = [] if node is not None and node.state is NodeState.REMOVED else \
                    plan_remove_node(m, req.node_id)
            else:
                return pb.MembershipPlanResponse(epoch=m.epoch, refused="ERR op must be add or remove")
        except (SlotMapError, ValueError) as exc:
            return pb.MembershipPlanResponse(epoch=m.epoch, refused="ERR %s" % exc)
        return pb.MembershipPlanResponse(epoch=m.epoch, changes=[encode_change(c).decode() for c in changes])

    @staticmethod
    def _status(d) -> tuple:
        """The response's status fields, the Conf (Raft ids) and the caught-up learners."""
        cs = d.conf_state
        st = d.status()
        conf = Conf(tuple(cs.voters), tuple(cs.learners), tuple(cs.voters_outgoing), cs.auto_leave)
        nodes = lambda ids: [node_of_replica(r) for r in ids]       # noqa: E731
        out = pb.GroupMembershipResponse(leader=node_of_replica(st.node_id), voters=nodes(cs.voters),
                                         learners=nodes(cs.learners), voters_outgoing=nodes(cs.voters_outgoing),
                                         last_index=st.last_index, leader_replica=st.node_id,
                                         replica_voters=cs.voters, replica_learners=cs.learners,
                                         replica_voters_outgoing=cs.voters_outgoing)
        caught_up = set()
        # By node, a node's newest replica first (one leaving while its successor joins: the
        # successor is the one a reader of node ids means).
        for rid, pr in sorted(d.raft_status().progress.items(), key=lambda kv: (node_of_replica(kv[0]), -kv[0])):
            match = st.last_index if rid == st.node_id else pr.match
            out.progress.add(node_id=node_of_replica(rid), match=match, learner=pr.is_learner,
                             recent_active=pr.recent_active, replica_id=rid)
            if pr.is_learner and match + CATCH_UP_ENTRIES >= st.last_index:
                caught_up.add(rid)
        return out, conf, frozenset(caught_up)


class MembershipCalls:
    """GroupMembership on a group's leader from this node (its token and TLS), following
    redirects among the replicas of the node's current map."""

    def __init__(self, node, channel=None):
        kw = {"token": node.token, "step_timeout_s": CALL_S}
        if channel is not None:
            kw["channel"] = channel
        self._calls = MoveSteps(lambda gid: replica_addresses(node.layout, gid), **kw)

    async def call(self, group_id: int, apply: bool, voters=(), learners=()) -> pb.GroupMembershipResponse:
        req = pb.GroupMembershipRequest(group_id=group_id, voters=voters, learners=learners, apply=apply)
        return await self._calls.call_leader("GroupMembership", group_id, req, "GroupMembership")

    async def close(self) -> None:
        await self._calls.close()


class MembershipReconciler:
    def __init__(self, node, calls: MembershipCalls):
        self.node = node
        self.calls = calls
        self._done: set = set()      # (group, wanted) a leader answered done, while we lead group 0
        self.rounds = 0

    async def run(self) -> None:
        await run_rounds(self.round, self.node.meta, "membership round", busy_pause_s=RETRY_S, idle_s=IDLE_WAIT_S)

    def _wanted(self, m: SlotMap) -> dict:
        out = {gid: wanted_members(m, gid) for gid in m.groups}
        # Group 0's wanted members depend on its configuration too: its leader computes them;
        # the key is what they depend on in the map (node states).
        out[META_GROUP_ID] = tuple(sorted((n, s.state.value) for n, s in m.nodes.items()))
        return out

    async def round(self) -> bool:
        """One GroupMembership(apply) per group not known done. True while some are not."""
        self.rounds += 1
        meta = self.node.meta
        if not meta.is_leader():
            self._done.clear()
            return False
        m = meta.slot_map
        todo = [(gid, w) for gid, w in sorted(self._wanted(m).items()) if (gid, w) not in self._done]
        if not todo:
            return False
        results = await asyncio.gather(*(self._reconcile(gid, w) for gid, w in todo), return_exceptions=True)
        busy = False
        for (gid, w), r in zip(todo, results):
            if r is True:
                self._done.add((gid, w))
            else:
                busy = True
                if isinstance(r, BaseException) and not isinstance(r, MoveStepUnavailable):
                    log.info("group %d membership: %r", gid, r)
        return busy

    async def _reconcile(self, gid: int, wanted) -> bool:
        if gid == META_GROUP_ID:
            r = await self.calls.call(gid, True)
        else:
            r = await self.calls.call(gid, True, wanted[0], wanted[1])
        if r.proposed:
            log.info("group %d: proposed %s", gid, r.proposed)
        return r.done and not r.proposed


class MembershipFollower:
    def __init__(self, node, calls: MembershipCalls):
        self.node = node
        self.calls = calls
        self._wake = asyncio.Event()
        self._removed_told = False
        self._map_suspect = False       # a peer refused us: our map may be behind the cluster's
        self._fetched_at = float("-inf")
        self._newer: Optional[SlotMap] = None   # a peer's map newer than ours (_refresh_newer_map)

    def on_map(self, slot_map: SlotMap) -> None:
        """Peers and addresses now (the apply path: quick); groups in run()."""
        node = self.node
        me = node.cfg.id
        mine = slot_map.nodes.get(me)
        if mine is not None and mine.state is NodeState.REMOVED and not self._removed_told:
            self._removed_told = True
            log.warning("node %d is REMOVED from the cluster (map epoch %d): it leaves its groups and "
                        "serves nothing; stop it (its id never returns)", me, slot_map.epoch)
        for nid, spec in slot_map.nodes.items():
            if nid == me:
                continue
            if spec.state is NodeState.REMOVED:
                if nid in node.peer_grpc:
                    node.transport.remove_peer(nid)
                    del node.peer_grpc[nid]
                continue
            if node.peer_grpc.get(nid) != spec.grpc:
                node.transport.add_peer(nid, spec.grpc)
                node.peer_grpc[nid] = spec.grpc
            node.learn_address(nid, NodeAddresses(spec.grpc, spec.resp or None))
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(IDLE_WAIT_S):
                    await self._wake.wait()
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.sync_groups()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - next map or next second tries again
                log.info("following the map's groups failed (%r); retrying", exc)

    def on_config_refusal(self, peer: int) -> None:
        """The transport's hook: `peer` refused our link for configuration (its map does not
        list us as a peer, or lists us REMOVED). Its map may be newer than ours."""
        self._map_suspect = True
        self._wake.set()

    async def _refresh_newer_map(self, mine: SlotMap) -> Optional[SlotMap]:
        """After a refusal: the newest map another node of our map answers (at most every
        MAP_FETCH_EVERY_S), kept while it is newer than ours. Used only to leave groups and not
        to reopen them; leaving still needs the group's configuration (its own or its
        leader's) to say our replica is out, so an old or wrong map cannot make a replica
        delete data it still owes the group."""
        if self._newer is not None and self._newer.epoch <= mine.epoch:
            self._newer = None                      # ours caught up
        loop = asyncio.get_running_loop()
        if not self._map_suspect or loop.time() - self._fetched_at < MAP_FETCH_EVERY_S:
            return self._newer
        self._fetched_at = loop.time()
        node, best = self.node, None
        for nid, spec in sorted(mine.nodes.items()):
            if nid == node.cfg.id or spec.state is NodeState.REMOVED:
                continue
            try:
                got = await fetch_map(spec.grpc, node.tls, node.token, MAP_FETCH_S)
            except Exception as exc:  # noqa: BLE001 - another node may answer
                log.info("node %d: reading node %d's slot map: %r", node.cfg.id, nid, exc)
                continue
            if got is not None and (best is None or got.epoch > best.epoch):
                best = got
        if best is None:
            return self._newer                      # nobody answered: ask again later
        if best.epoch <= mine.epoch:
            self._map_suspect = False               # ours is current: the refusal was something else
            return self._newer
        self._newer = best
        spec = best.nodes.get(node.cfg.id)
        if spec is not None and spec.state is NodeState.REMOVED and not self._removed_told:
            self._removed_told = True
            log.warning("node %d is REMOVED from the cluster (a peer's map, epoch %d; ours is %d and will "
                        "not catch up: its peers refuse it): it leaves its groups and serves nothing; "
                        "stop it (its id never returns)", node.cfg.id, best.epoch, mine.epoch)
        return best

    async def sync_groups(self) -> None:
        node, m, me = self.node, self.node.layout, self.node.cfg.id
        newer = await self._refresh_newer_map(m)

        def named(slot_map: SlotMap, gid: int, hosted: int) -> bool:
            spec = slot_map.groups.get(gid)
            return spec is not None and me in spec.replicas and spec.replica_id(me) == hosted
        # Replicas the map no longer names first: a node rejoining a group it has not closed
        # yet opens the new replica only once the old one is out (one replica per group here).
        for gid in sorted(node.backends):
            d = group_driver(node, gid)
            hosted = d.node_id if d is not None else me
            if named(m, gid, hosted) and (newer is None or named(newer, gid, hosted)):
                continue
            if await self._out_of_group(gid, hosted):
                log.warning("node %d: replica %d is out of group %d's configuration: closing it, deleting "
                            "its data", me, hosted, gid)
                await node.close_data_group(gid)
        for gid in m.groups_of_node(me):
            if newer is not None and gid not in newer.groups_of_node(me):
                continue                            # ours is old: the cluster took this group from us
            if gid not in node.backends:
                rid = m.groups[gid].replica_id(me)
                log.warning("node %d: joining group %d as replica %d (empty: the leader's snapshot fills it)",
                            me, gid, rid)
                await node.open_data_group(gid, bootstrap=(), replica=rid)

    async def _out_of_group(self, gid: int, hosted: int) -> bool:
        """Replica `hosted` (a Raft id) is in none of the group's voter or learner sets: its
        own applied configuration says so, or the group's leader does."""
        d = group_driver(self.node, gid)
        if d is not None and d.failed is None:
            cs = d.conf_state
            if hosted not in set(cs.voters) | set(cs.learners) | set(cs.voters_outgoing):
                return True
        try:
            r = await self.calls.call(gid, False)
        except (MoveStepUnavailable, MoveStepRefused):
            return False
        if not r.replica_voters:
            # A leader that predates replica ids (a group always has a voter): its ids are node ids.
            return r.leader != hosted and hosted not in set(r.voters) | set(r.learners) | set(r.voters_outgoing)
        if r.leader_replica == hosted:
            return False
        return hosted not in set(r.replica_voters) | set(r.replica_learners) | set(r.replica_voters_outgoing)


def members_of(slot_map: Optional[SlotMap]) -> dict:
    """{node id: gRPC address} of the nodes of `slot_map` that are not REMOVED."""
    if slot_map is None:
        return {}
    return {n: s.grpc for n, s in slot_map.nodes.items() if s.state is not NodeState.REMOVED}
