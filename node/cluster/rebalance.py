"""Plans: the changes that even out a cluster, drain a node, or bring a new node in.

A plan is a list of compare-and-set changes (changes.py) built by applying each one
to a working copy of the map as it is planned, so change i expects epoch
`map.epoch + i` and every prefix of the plan is a valid map. The driver applies them
in order; if anything else changed the map meanwhile, the next change meets
StaleEpoch and the driver plans again. Planning is deterministic (ties go to the
lowest id) and idempotent: applying a plan and planning again gives an empty plan.

  plan_rebalance  slots: every group ends with floor or ceil of 16384 / groups slots
                  (counts differ by at most 1), the extra slots staying with the groups
                  that hold the most, so the fewest slots move; each group gives its
                  highest movable slots, and each contiguous run becomes one BeginMove.
                  Slots already moving count for their target and are not moved again.
                  Leaders: each group's preferred leader goes to an UP voter so that the
                  counts per UP node are as even as the groups' voters allow (differ by
                  at most 1 when every group's voters allow it; see _even_leaders).
  plan_drain      the node goes DRAINING, its preferred leaderships move to the UP
                  voters leading the fewest groups, then each voter replica is replaced
                  (add learner on the UP node with the fewest replicas, promote, remove
                  the drained one); learner replicas are just removed.
  plan_add_node   adds the node, then swaps it in (learner, promote, remove) for replicas
                  of the UP nodes holding at least two more replicas than it, then evens
                  the leaders (which gives it some).

Nothing is ever placed on a DRAINING or REMOVED node. Promotions are planned right
after the learner is added; the driver waits for the learner to catch up before it
applies a PromoteLearner.
"""
from __future__ import annotations

import collections

from collections import deque
from typing import Optional

from ..engine.slots import SLOT_COUNT
from .changes import (AddLearner, AddNode, BeginMove, PromoteLearner, RemoveReplica, SetNodeState,
                      SetPreferredLeader, apply_change)
from .slot_map import MAX_MIGRATIONS, MovePhase, NodeSpec, NodeState, SlotMap, SlotMapError


class PlanError(SlotMapError):
    """A plan that cannot be made (the data says what is in the way)."""

    def __init__(self, message: str, *, node_id: Optional[int] = None, group_id: Optional[int] = None):
        super().__init__(message)
        self.node_id = node_id
        self.group_id = group_id


class _Plan:
    """Changes planned so far and the map they lead to."""

    def __init__(self, slot_map: SlotMap):
        self.map = slot_map
        self.changes: list = []

    def add(self, cls, **kwargs) -> None:
        change = cls(expect_epoch=self.map.epoch, **kwargs)
        self.map = apply_change(self.map, change)
        self.changes.append(change)


def _up_nodes(m: SlotMap) -> list:
    return sorted(n for n, spec in m.nodes.items() if spec.state is NodeState.UP)


def replica_counts(m: SlotMap) -> dict:
    """{node id: groups it replicates (voter or learner)} for every UP node."""
    counts = {n: 0 for n in _up_nodes(m)}
    for g in m.groups.values():
        for n in g.replicas:
            if n in counts:
                counts[n] += 1
    return counts


def leader_counts(m: SlotMap) -> dict:
    """{node id: groups that prefer it as leader} for every UP node."""
    counts = {n: 0 for n in _up_nodes(m)}
    for g in m.groups.values():
        if g.preferred_leader in counts:
            counts[g.preferred_leader] += 1
    return counts


def effective_owners(m: SlotMap) -> list:
    """The owner of each slot once every move in progress completes (aborted ones
    leave their slots with the source)."""
    owners = list(m.owner_ids())
    for mig in m.migrations.values():
        if mig.phase is not MovePhase.ABORTED:
            owners[mig.first:mig.last + 1] = [mig.target] * (mig.last - mig.first + 1)
    return owners


# -- slots -----------------------------------------------------------------------------------
def slot_quotas(counts: dict) -> dict:
    """{group: slots it should hold}: floor or ceil of SLOT_COUNT / groups, the ceil going
    to the groups holding the most now (ties: lower id), which moves the fewest slots."""
    base, extra = divmod(SLOT_COUNT, len(counts))
    order = sorted(counts, key=lambda g: (-counts[g], g))
    return {g: base + (1 if i < extra else 0) for i, g in enumerate(order)}


def _even_slots(plan: _Plan) -> None:
    m = plan.map
    owners = effective_owners(m)
    moving = bytearray(SLOT_COUNT)
    for mig in m.migrations.values():
        moving[mig.first:mig.last + 1] = b"\x01" * (mig.last - mig.first + 1)
    counts = {g: 0 for g in m.groups}
    for g in owners:
        counts[g] += 1
    quotas = slot_quotas(counts)
    # Donors give their highest movable slots; the pool is then dealt out in slot order to
    # the receivers in id order, so each receiver takes contiguous runs where it can.
    pool = []
    for g in sorted(counts):
        surplus = counts[g] - quotas[g]
        s = SLOT_COUNT - 1
        while surplus > 0 and s >= 0:
            if owners[s] == g and not moving[s]:
                pool.append(s)
                surplus -= 1
            s -= 1
    pool.sort()
    deal = iter(pool)
    target = {}
    for g in sorted(counts):
        for _ in range(max(0, quotas[g] - counts[g])):
            s = next(deal, None)
            if s is None:
                break
            target[s] = g
    run_start = None
    for s in sorted(target) + [None]:
        if run_start is not None and (s is None or s != prev + 1 or target[s] != target[run_start]
                                      or owners[s] != owners[run_start]):
            if len(plan.map.migrations) >= MAX_MIGRATIONS:
                return      # the map holds no more moves at once; planning again after some finish goes on
            plan.add(BeginMove, first=run_start, last=prev, target=target[run_start])
            run_start = None
        if s is not None and run_start is None:
            run_start = s
        prev = s


# -- leaders --------------------------------------------------------------------------------------
def _even_leaders(plan: _Plan) -> None:
    """Preferred leaders on UP voters, as even across UP nodes as the voters allow.

    Load balancing on a bipartite graph (groups -> their UP voters): an assignment is
    optimal (its load vector is majorized by every other one, so max - min is smallest)
    exactly when no cost-reducing path exists: no chain of groups moving their leader
    from a node with load L, voter to voter, to a node with load <= L - 2 (Harvey et al.,
    "Semi-matchings for bipartite graphs and load balancing"). Each path found moves
    one leadership along the chain, lowering the sum of squared loads, so this ends."""
    m = plan.map
    up = set(_up_nodes(m))
    if not up:
        return
    voters_up = {gid: [n for n in g.voters if n in up] for gid, g in sorted(m.groups.items())}
    leader = {gid: g.preferred_leader for gid, g in m.groups.items()}
    load = {n: 0 for n in sorted(up)}
    for gid in voters_up:
        if leader[gid] in up:
            load[leader[gid]] += 1
    for gid, cands in voters_up.items():
        if leader[gid] not in up and cands:
            leader[gid] = min(cands, key=lambda n: (load[n], n))
            load[leader[gid]] += 1
    led_by = {n: [] for n in load}
    for gid in voters_up:
        if leader[gid] in up:
            led_by[leader[gid]].append(gid)
    while True:
        path = _cost_reducing_path(load, led_by, voters_up)
        if path is None:
            break
        for gid, src, dst in path:
            leader[gid] = dst
            led_by[src].remove(gid)
            led_by[dst].append(gid)
            led_by[dst].sort()
        load[path[0][1]] -= 1
        load[path[-1][2]] += 1
    for gid in sorted(leader):
        if leader[gid] != m.groups[gid].preferred_leader:
            plan.add(SetPreferredLeader, group_id=gid, node_id=leader[gid])


def _cost_reducing_path(load: dict, led_by: dict, voters_up: dict) -> Optional[list]:
    """[(group, from, to), ...] from a most-loaded-first start to a node with load at
    least 2 lower, found breadth first in id order; None if there is none."""
    for start in sorted(load, key=lambda n: (-load[n], n)):
        came = {start: None}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if load[node] <= load[start] - 2:
                path = []
                while came[node] is not None:
                    gid, prev = came[node]
                    path.append((gid, prev, node))
                    node = prev
                return path[::-1]
            for gid in led_by[node]:
                for nxt in voters_up[gid]:
                    if nxt not in came:
                        came[nxt] = (gid, node)
                        queue.append(nxt)
    return None


# -- the plans ---------------------------------------------------------------------------------------
def plan_rebalance(slot_map: SlotMap) -> list:
    """Changes that even slots across groups and preferred leaders across UP nodes."""
    plan = _Plan(slot_map)
    _even_slots(plan)
    _even_leaders(plan)
    return plan.changes


def replication_factor(m: SlotMap) -> int:
    """The replica count most groups have (ties: the smaller): what a swap or a replacement
    restores, so a plan re-made after a driver crashed half way knows a surplus replica."""
    sizes = collections.Counter(len(g.replicas) for g in m.groups.values())
    return min(sizes, key=lambda n: (-sizes[n], n)) if sizes else 0


def _finish_swap(plan: "_Plan", gid: int, keep: int, size: int) -> None:
    """Group gid got node `keep` in (a learner or a voter) but still holds more than `size`
    replicas (a driver stopped between its AddLearner and its RemoveReplica): promote it and
    remove the UP voters holding the most replicas (not `keep`) down to `size`."""
    g = plan.map.groups[gid]
    if keep in g.learners:
        plan.add(PromoteLearner, group_id=gid, node_id=keep)
    while len(plan.map.groups[gid].replicas) > size:
        g = plan.map.groups[gid]
        counts = replica_counts(plan.map)
        donors = [n for n in g.voters if n != keep]
        if not donors:
            return
        # As the swap picks it: the most replicas (a node not UP first), then the lowest id.
        donor = min(donors, key=lambda n: (-counts.get(n, 1 << 30), n))
        if g.preferred_leader == donor:
            heir = _fewest(plan.map, leader_counts(plan.map), [n for n in g.voters if n != donor])
            if heir is None:
                return
            plan.add(SetPreferredLeader, group_id=gid, node_id=heir)
        plan.add(RemoveReplica, group_id=gid, node_id=donor)


def _fewest(m: SlotMap, counts: dict, candidates) -> Optional[int]:
    return min(candidates, key=lambda n: (counts[n], n), default=None)


def plan_drain(slot_map: SlotMap, node_id: int) -> list:
    """Changes that leave `node_id` DRAINING with no leadership and no replica.
    PlanError if a group would be left with no voter to lead it."""
    node = slot_map.nodes.get(node_id)
    if node is None or node.state is NodeState.REMOVED:
        raise PlanError("no node %r to drain" % (node_id,), node_id=node_id)
    plan = _Plan(slot_map)
    if node.state is NodeState.UP:
        plan.add(SetNodeState, node_id=node_id, state=NodeState.DRAINING)
    up = set(_up_nodes(plan.map))
    # Leaders first, so clients move before replicas do.
    for gid in plan.map.groups_of_node(node_id):
        g = plan.map.groups[gid]
        if g.preferred_leader == node_id:
            heir = _fewest(plan.map, leader_counts(plan.map), [n for n in g.voters if n in up])
            if heir is not None:
                plan.add(SetPreferredLeader, group_id=gid, node_id=heir)
    size = replication_factor(plan.map)
    for gid in plan.map.groups_of_node(node_id):
        g = plan.map.groups[gid]
        if node_id in g.voters:
            waiting = [n for n in g.learners if n in up]
            if waiting:                          # a replacement a crashed driver already added
                for n in waiting:
                    plan.add(PromoteLearner, group_id=gid, node_id=n)
            elif len(g.replicas) <= size:        # (more: a replacement already promoted)
                spare = _fewest(plan.map, replica_counts(plan.map), sorted(up - set(g.replicas)))
                if spare is not None:
                    plan.add(AddLearner, group_id=gid, node_id=spare)
                    plan.add(PromoteLearner, group_id=gid, node_id=spare)
            g = plan.map.groups[gid]
            if g.voters == (node_id,):
                raise PlanError("group %d: node %d is its only voter and no UP node can replace it"
                                % (gid, node_id), node_id=node_id, group_id=gid)
            if g.preferred_leader == node_id:
                heir = [n for n in g.voters if n in up]
                if not heir:
                    raise PlanError("group %d: no UP voter can lead it once node %d leaves" % (gid, node_id),
                                    node_id=node_id, group_id=gid)
                plan.add(SetPreferredLeader, group_id=gid,
                         node_id=_fewest(plan.map, leader_counts(plan.map), heir))
        plan.add(RemoveReplica, group_id=gid, node_id=node_id)
    return plan.changes


def plan_remove_node(slot_map: SlotMap, node_id: int) -> list:
    """plan_drain, then REMOVED (the id never returns)."""
    changes = plan_drain(slot_map, node_id)
    drained = slot_map
    for change in changes:
        drained = apply_change(drained, change)
    return changes + [SetNodeState(drained.epoch, node_id, NodeState.REMOVED)]


def plan_add_node(slot_map: SlotMap, node: NodeSpec) -> list:
    """Changes that add `node` (if the map lacks it) and even replica counts by swapping
    it in for replicas of the UP nodes holding the most, then even the leaders."""
    existing = slot_map.nodes.get(node.node_id)
    if existing is not None and (existing.grpc, existing.resp, existing.state) != (node.grpc, node.resp, NodeState.UP):
        raise PlanError("node %d is already in the map as %s at %s; a new node needs a new id"
                        % (node.node_id, existing.state.value, existing.grpc), node_id=node.node_id)
    plan = _Plan(slot_map)
    if existing is None:
        plan.add(AddNode, node=node)
    nid = node.node_id
    size = replication_factor(plan.map)
    for gid in plan.map.groups_of_node(nid):     # swaps a crashed driver left half done
        if nid in plan.map.groups[gid].learners or len(plan.map.groups[gid].replicas) > size:
            _finish_swap(plan, gid, nid, size)
    while True:
        counts = replica_counts(plan.map)
        swap = None
        for donor in sorted((n for n in counts if n != nid), key=lambda n: (-counts[n], n)):
            if counts[donor] < counts[nid] + 2:
                break
            for gid in plan.map.groups_of_node(donor):
                g = plan.map.groups[gid]
                if donor in g.voters and nid not in g.replicas:
                    swap = (gid, donor)
                    break
            if swap:
                break
        if swap is None:
            break
        gid, donor = swap
        plan.add(AddLearner, group_id=gid, node_id=nid)
        plan.add(PromoteLearner, group_id=gid, node_id=nid)
        g = plan.map.groups[gid]
        if g.preferred_leader == donor:
            loads = leader_counts(plan.map)
            heir = _fewest(plan.map, loads, [n for n in g.voters if n != donor and n in loads])
            plan.add(SetPreferredLeader, group_id=gid, node_id=heir)
        plan.add(RemoveReplica, group_id=gid, node_id=donor)
    _even_leaders(plan)
    return plan.changes
