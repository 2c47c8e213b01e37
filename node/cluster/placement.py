"""Placement: where a new cluster's groups, replicas, slots and leaders go.

initial_layout(nodes, groups, replicas) is what every founding node computes from
the same --peers and --groups, so all of them start from the same map (epoch 1)
without talking first:

  - slots: 16384 split into `groups` contiguous runs of near-equal size, the way
    `redis-cli --cluster create` splits them (run i is
    [round(i * 16384 / G), round((i + 1) * 16384 / G) - 1]);
  - group i (id i + 1) is replicated on `replicas` consecutive nodes of the sorted
    node list, starting at node i mod N, and prefers that first node as its leader,
    so with G a multiple of N every node prefers the same number of leaders and
    holds the same number of replicas.
"""
from __future__ import annotations

from typing import Mapping

from ..engine.slots import SLOT_COUNT
from .slot_map import GroupSpec, NodeSpec, SlotMap, SlotMapError, owners_from_ranges

DEFAULT_REPLICAS = 3


def even_slot_runs(groups: int) -> list:
    """[(first, last), ...] for `groups` contiguous runs covering every slot."""
    if not 1 <= groups <= SLOT_COUNT:
        raise SlotMapError("groups must be 1..%d, got %d" % (SLOT_COUNT, groups))
    per = SLOT_COUNT / groups
    return [(round(i * per), round((i + 1) * per) - 1) for i in range(groups)]


def initial_layout(nodes: Mapping, groups: int, replicas: int = DEFAULT_REPLICAS) -> SlotMap:
    """The epoch-1 map of a new cluster. `nodes`: {node_id: NodeSpec}."""
    ids = sorted(nodes)
    if not ids:
        raise SlotMapError("a cluster needs at least one node")
    if replicas < 1:
        raise SlotMapError("replicas must be >= 1")
    r = min(replicas, len(ids))
    specs = {}
    runs = []
    for i, (first, last) in enumerate(even_slot_runs(groups)):
        gid = i + 1
        members = [ids[(i + k) % len(ids)] for k in range(r)]
        specs[gid] = GroupSpec(gid, tuple(sorted(members)), preferred_leader=members[0])
        runs.append((first, last, gid))
    for nid, spec in nodes.items():
        if not isinstance(spec, NodeSpec) or spec.node_id != nid:
            raise SlotMapError("node %r: not a NodeSpec with that id" % (nid,))
    return SlotMap(1, owners_from_ranges(runs), specs, dict(nodes))
