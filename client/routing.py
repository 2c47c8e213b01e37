"""The cluster layout a client routes by, and the routing table built from it (no I/O).

A node answers the ClusterLayout RPC with the slot map it knows: the epoch, the
nodes (id, gRPC and RESP addresses, state) and the Raft groups (slot ranges,
voters, learners, the leader it last saw and in which term). `Layout.from_pb`
validates that answer (it comes from the network) into frozen dataclasses;
`RouteTable` turns one into slot -> group -> leader gRPC address and keeps the
leader hints that errors bring (NOT_LEADER names the group's leader, MOVED the
slot's new home) until the next layout replaces it.

Which layout wins (`RouteTable.updated`): a larger epoch replaces everything
(the slot map changed); the same epoch updates the leaders seen in a later term
(a failover, the map unchanged); a smaller epoch is ignored (a node lagging behind).
"""
from dataclasses import dataclass

from xraft.proto.v1 import client_pb2 as pb

from .slots import SLOT_COUNT

MAX_LAYOUT_NODES = 4096        # bounds on a layout from the network, far above any real cluster
MAX_LAYOUT_GROUPS = SLOT_COUNT  # a group owns at least one slot
MAX_ADDRESS_BYTES = 256        # as ErrorDetail.leader_address
NODE_STATES = ("up", "draining", "removed")


class LayoutError(ValueError):
    """A ClusterLayoutResponse that cannot be routed by; `problem` says why."""

    def __init__(self, problem: str):
        super().__init__(f"invalid cluster layout: {problem}")
        self.problem = problem


@dataclass(frozen=True)
class LayoutNode:
    id: int
    grpc: str                  # "host:port" of the client API
    resp: str                  # "host:port" of the RESP listener, "" if unknown
    state: str                 # "up" | "draining" | "removed" (a newer node may say more)


@dataclass(frozen=True)
class LayoutGroup:
    id: int
    leader: int                # node id of the leader the answering node knows, 0 if none
    term: int                  # the term that leader was seen in
    voters: tuple              # node ids
    learners: tuple
    slots: tuple               # ((first, last), ...) inclusive, ascending, disjoint
    preferred_leader: int = 0

    @property
    def slots_text(self) -> str:
        return format_ranges(self.slots)


@dataclass(frozen=True)
class Layout:
    epoch: int
    nodes: tuple               # of LayoutNode, in the answer's order
    groups: tuple              # of LayoutGroup
    node_id: int = 0           # the node that answered

    @classmethod
    def from_pb(cls, m: pb.ClusterLayoutResponse) -> "Layout":
        """Validate and convert; LayoutError if the slots are not covered
        exactly once, ids repeat, or something is out of bounds."""
        if len(m.nodes) > MAX_LAYOUT_NODES or len(m.groups) > MAX_LAYOUT_GROUPS:
            raise LayoutError(f"{len(m.nodes)} nodes and {len(m.groups)} groups is over the limits")
        nodes = tuple(LayoutNode(n.id, n.grpc, n.resp, n.state) for n in m.nodes)
        node_ids = [n.id for n in nodes]
        if len(set(node_ids)) != len(node_ids) or 0 in node_ids:
            raise LayoutError(f"node ids must be distinct and non-zero: {node_ids}")
        for n in nodes:
            if not n.grpc or len(n.grpc) > MAX_ADDRESS_BYTES or ":" not in n.grpc:
                raise LayoutError(f"node {n.id} has no valid gRPC address: {n.grpc[:MAX_ADDRESS_BYTES]!r}")
        groups = []
        owner = [0] * SLOT_COUNT
        for g in m.groups:
            if g.id == 0 or any(x.id == g.id for x in groups):
                raise LayoutError(f"group id {g.id} is zero or repeated")
            ranges = tuple((r.first, r.last) for r in g.slots)
            previous_last = -1
            for first, last in ranges:
                if not previous_last < first <= last < SLOT_COUNT:
                    raise LayoutError(f"group {g.id}: slot range {first}-{last} is out of order or bounds")
                previous_last = last
                for slot in range(first, last + 1):
                    if owner[slot]:
                        raise LayoutError(f"slot {slot} is in groups {owner[slot]} and {g.id}")
                    owner[slot] = g.id
            groups.append(LayoutGroup(g.id, g.leader, g.term, tuple(g.voters), tuple(g.learners), ranges,
                                      g.preferred_leader))
        if not all(owner):
            raise LayoutError(f"slot {owner.index(0)} belongs to no group")
        return cls(m.epoch, nodes, tuple(groups), m.node_id)

    def to_json(self) -> dict:
        """The operator's view (`xraftctl status --json`): leader is a node id or
        None when the answering node knows none."""
        return {"epoch": self.epoch,
                "nodes": [{"id": n.id, "grpc": n.grpc, "resp": n.resp, "state": n.state} for n in self.nodes],
                "groups": [{"id": g.id, "leader": g.leader or None, "voters": list(g.voters),
                            "learners": list(g.learners), "slots": g.slots_text} for g in self.groups]}


def format_ranges(ranges) -> str:
    """((0, 5460), (7, 7)) -> "0-5460,7" (a single slot as redis CLUSTER NODES writes it)."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


class RouteTable:
    """slot -> group -> the address to send to, from one Layout plus the
    leader hints errors brought since. Not thread-safe: owned by one loop."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.epoch = layout.epoch
        grpc_of = {n.id: n.grpc for n in layout.nodes if n.state != "removed"}   # a removed node serves nothing
        self._slot_group = [0] * SLOT_COUNT
        self._leader: dict[int, str | None] = {}       # group -> leader's gRPC address, None if unknown
        self._term: dict[int, int] = {}
        self._members: dict[int, tuple] = {}           # group -> voters' gRPC addresses (leader unknown: try them)
        for g in layout.groups:
            for first, last in g.slots:
                self._slot_group[first:last + 1] = [g.id] * (last - first + 1)
            self._leader[g.id] = grpc_of.get(g.leader)
            self._term[g.id] = g.term
            self._members[g.id] = tuple(grpc_of[v] for v in g.voters if v in grpc_of)
        self._moved: dict[int, str] = {}               # slot -> address a MOVED named, until the next layout
        self.addresses = tuple(dict.fromkeys(grpc_of.values()))   # every node's gRPC address, once

    def group_of(self, slot: int) -> int:
        return self._slot_group[slot]

    def address_for(self, slot: int, rotation: int = 0) -> str | None:
        """Where a request for `slot` goes: a MOVED hint, else the group's
        leader, else one of its voters (picked by `rotation`; a follower
        answers NOT_LEADER naming the leader). None: nothing known."""
        moved = self._moved.get(slot)
        if moved is not None:
            return moved
        group = self._slot_group[slot]
        leader = self._leader.get(group)
        if leader is not None:
            return leader
        members = self._members.get(group) or self.addresses
        return members[rotation % len(members)] if members else None

    def leader_of(self, group: int) -> str | None:
        return self._leader.get(group)

    def note_leader(self, slot: int, address: str, group_id: int = 0) -> None:
        """A NOT_LEADER named `address` as the leader of the group of `slot`
        (`group_id` if the error said; another group than the table's means
        the slot moved: remembered for the slot alone)."""
        group = self._slot_group[slot]
        if group_id and group_id != group:
            self._moved[slot] = address
            return
        self._moved.pop(slot, None)
        self._leader[group] = address

    def note_moved(self, slot: int, address: str) -> None:
        self._moved[slot] = address

    def forget(self, slot: int, address: str) -> None:
        """`address` failed (unreachable, no leader there) for `slot`: stop
        sending there until an error or a layout names a leader again."""
        if self._moved.get(slot) == address:
            del self._moved[slot]
        group = self._slot_group[slot]
        if self._leader.get(group) == address:
            self._leader[group] = None

    def updated(self, layout: Layout) -> "RouteTable | None":
        """The table for a newer `layout`, or None to keep this one (module
        doc). On the same epoch a leader hint an error brought survives unless
        the layout saw that group's leader in a later term."""
        if layout.epoch < self.epoch:
            return None
        new = RouteTable(layout)
        if layout.epoch == self.epoch:
            for group, leader in self._leader.items():
                if leader is not None and new._term.get(group, 0) <= self._term[group] and group in new._leader:
                    new._leader[group] = leader
            new._moved.update(self._moved)
        return new
