"""The slot map: which Raft group owns each of the 16384 slots, who replicates each
group, and which nodes exist. A pure value (no I/O): every change makes a new map
with a larger epoch, so two maps are ordered by their epochs and a node can tell
a stale routing table from a fresh one.

    SlotMap
      epoch    int          Invariant: >= 1; grows by one with every change
      owners   bytes        2 * 16384 bytes, little-endian uint16 per slot: the group
                            that owns slot s is owners[2s:2s+2]. Invariant: every
                            slot names a group in `groups` (all slots always covered)
      groups   {gid: GroupSpec}   Invariant: gid >= 1 (0 is the metadata group's)
      nodes    {nid: NodeSpec}    Invariant: every voter and learner is a node here
      migrations {(first, last): Migration}  slot moves in progress (slot_move.py).
                            Invariant: a slot is in at most one migration; its source
                            group owns it until the decision, its target group after

    GroupSpec  voters (sorted node ids, non-empty), learners (sorted, disjoint from
               voters), preferred_leader (a voter: where placement wants its leader),
               conf_version (the group's membership version; grows on each change),
               left (sorted node ids whose latest replica of the group left its Raft
               configuration), generations (sorted (node id, generation) pairs of the replicas and
               `left` nodes whose generation is not 0; see replica ids below)
    NodeSpec   node_id, grpc "host:port", resp "host:port" ("" until known),
               state UP | DRAINING | REMOVED

    Migration  first..last (the slots moving), source and target group, phase
               (PRECOPYING SEALING COPYING VERIFIED DECIDED RELEASED ABORTED), cursor and
               replicated (copy progress), digest (the verified manifest), reason
               (why it was aborted), started_epoch (the map epoch that began it:
               with the range, the move's identity)

Replica ids (the Raft ids of a data group's members) are not node ids: Raft never takes
an id back into a group, so a node that left a group and rejoins it does so as a NEW
replica, the next generation: replica_id(node, generation) = generation << NODE_ID_BITS |
node. A node's first replica of a group is generation 0, whose replica id IS the node id
(every map and every Raft log written before generations existed). The node of a replica
id is its low bits (node_of_replica): routing a Raft message needs no map. Group 0 (the
metadata group, not in the map) keeps node ids as its Raft ids.

Encoding (`encode`/`decode`): canonical JSON (sorted keys, no spaces), slots as
[first, last, group] runs; "migrations" only when there are some, so a map without
moves encodes as it did before moves existed; "left" and "generations" likewise only when
non-empty. decode() validates every field and
every invariant above before returning, because the bytes come from disk or a peer.
"""
from __future__ import annotations

import enum
import functools
import itertools
import json
import struct
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping, Optional, Sequence

from ..engine.slots import SLOT_COUNT
from ..invariant import invariant

MAX_GROUPS = 4096            # a limit on everything: groups in one map
MAX_NODES = 1024             # nodes in one map
MAX_ENCODED_BYTES = 4 << 20  # what decode() accepts
MAX_GROUP_ID = 0xFFFF        # owners hold uint16 group ids
MAX_MIGRATIONS = 256         # slot moves in progress at once
MAX_CURSOR_BYTES = 1024      # a move's copy cursor (opaque to the map)
DIGEST_BYTES = 32            # a verified manifest's digest (sha256)
MAX_REASON_CHARS = 200       # why a move was aborted
NODE_ID_BITS = 40            # a replica id's low bits: its node
MAX_NODE_ID = (1 << NODE_ID_BITS) - 1
MAX_GENERATION = (1 << 22) - 1   # rejoins of one node to one group (replica ids stay < 2**62)
_OWNERS_FORMAT = "<%dH" % SLOT_COUNT


class SlotMapError(ValueError):
    """A map that breaks an invariant (from decode() or an invalid change)."""


class NodeState(enum.Enum):
    UP = "up"
    DRAINING = "draining"
    REMOVED = "removed"


@dataclass(frozen=True)
class NodeSpec:
    node_id: int             # Invariant: >= 1
    grpc: str                # "host:port" the node's gRPC listener (peers and SDK)
    resp: str = ""           # "host:port" its RESP listener ("" if not known yet)
    state: NodeState = NodeState.UP


@dataclass(frozen=True)
class GroupSpec:
    group_id: int                    # Invariant: 1 <= group_id <= MAX_GROUP_ID
    voters: tuple                    # sorted node ids. Invariant: non-empty, distinct
    preferred_leader: int            # Invariant: in voters
    learners: tuple = ()             # sorted node ids. Invariant: disjoint from voters
    conf_version: int = 0            # Invariant: >= 0
    left: tuple = ()                 # sorted node ids whose latest replica left. Invariant: no replica, map nodes
    generations: tuple = ()          # sorted (node id, generation >= 1) of replicas and `left` nodes; 0 if absent

    @property
    def replicas(self) -> tuple:
        return tuple(sorted(self.voters + self.learners))

    def generation(self, node_id: int) -> int:
        """The generation of node_id's current (or, in `left`, latest) replica of the group."""
        for n, gen in self.generations:
            if n == node_id:
                return gen
        return 0

    def replica_id(self, node_id: int) -> int:
        """The Raft id of node_id's current replica of the group."""
        return replica_id(node_id, self.generation(node_id))

    def next_generation(self, node_id: int) -> int:
        """The generation node_id joins the group as: a node that left comes back as a new one."""
        return self.generation(node_id) + 1 if node_id in self.left else self.generation(node_id)


def replica_id(node_id: int, generation: int) -> int:
    invariant(1 <= node_id <= MAX_NODE_ID and 0 <= generation <= MAX_GENERATION, "valid replica")
    return (generation << NODE_ID_BITS) | node_id


def node_of_replica(replica: int) -> int:
    """The node that hosts Raft member `replica` (a data group's replica id or a node id)."""
    return replica & MAX_NODE_ID


def generation_of_replica(replica: int) -> int:
    return replica >> NODE_ID_BITS


class MovePhase(enum.Enum):
    """Where a slot move stands; the transitions are in slot_move.py."""
    PRECOPYING = "precopying"  # the source serves; the target pre-copies its keys (not frozen)
    SEALING = "sealing"      # the source is asked to stop reads and writes to the slots
    COPYING = "copying"      # the source is sealed; the target pulls chunks into staging
    VERIFIED = "verified"    # the target checked its staging against the manifest digest
    DECIDED = "decided"      # the point of no return: the target owns the slots
    RELEASED = "released"    # the source let go (parked clients -MOVED, keys deleted)
    ABORTED = "aborted"      # given up before the decision: the source unseals


# Phases in which the source still owns the slots (the target owns them in the others,
# except ABORTED, where the source owns them again for good).
BEFORE_DECISION = frozenset({MovePhase.PRECOPYING, MovePhase.SEALING, MovePhase.COPYING, MovePhase.VERIFIED})
# Phases in which routing parks requests for the slots (the source is, or is being, sealed).
FROZEN = frozenset({MovePhase.SEALING, MovePhase.COPYING, MovePhase.VERIFIED})
AFTER_DECISION = frozenset({MovePhase.DECIDED, MovePhase.RELEASED})


@dataclass(frozen=True)
class Migration:
    first: int               # Invariant: 0 <= first <= last < SLOT_COUNT
    last: int
    source: int              # the group that owned the slots when the move began
    target: int              # Invariant: != source
    phase: MovePhase
    started_epoch: int       # the epoch of the map that first held this migration
    cursor: bytes = b""      # where the copy resumes (opaque; written by the copier)
    replicated: int = 0      # chunks the target has replicated; only grows
    digest: bytes = b""      # Invariant: DIGEST_BYTES long from VERIFIED on, b"" before (either if ABORTED)
    reason: str = ""         # Invariant: "" unless ABORTED

    @property
    def key(self) -> tuple:
        return (self.first, self.last)

    @property
    def owner(self) -> int:
        """The group the map names as the slots' owner in this phase."""
        return self.target if self.phase in AFTER_DECISION else self.source

    def problem(self) -> Optional[str]:
        """None if the fields are consistent with each other, else what is wrong."""
        if not (type(self.first) is int and type(self.last) is int and 0 <= self.first <= self.last < SLOT_COUNT):
            return "slots %r-%r outside 0-%d" % (self.first, self.last, SLOT_COUNT - 1)
        if not isinstance(self.phase, MovePhase):
            return "phase %r" % (self.phase,)
        for name in ("source", "target", "started_epoch", "replicated"):
            if type(getattr(self, name)) is not int:
                return "%s must be an integer" % name
        if self.source == self.target:
            return "source and target are both group %d" % self.source
        if self.started_epoch < 1 or self.replicated < 0:
            return "started_epoch must be >= 1 and replicated >= 0"
        if not isinstance(self.cursor, bytes) or len(self.cursor) > MAX_CURSOR_BYTES:
            return "cursor must be bytes of at most %d" % MAX_CURSOR_BYTES
        if self.phase in (MovePhase.PRECOPYING, MovePhase.SEALING) and (self.cursor or self.replicated):
            return "a %s move has copied nothing" % self.phase.value
        verified = self.phase in (MovePhase.VERIFIED, MovePhase.DECIDED, MovePhase.RELEASED)
        # An abort keeps what it knew: a digest if it came from VERIFIED, none before.
        lengths = (DIGEST_BYTES,) if verified else (0, DIGEST_BYTES) if self.phase is MovePhase.ABORTED else (0,)
        if not isinstance(self.digest, bytes) or len(self.digest) not in lengths:
            return "digest must be %d bytes from VERIFIED on and empty before" % DIGEST_BYTES
        aborted = self.phase is MovePhase.ABORTED
        if not isinstance(self.reason, str) or len(self.reason) > MAX_REASON_CHARS or bool(self.reason) != aborted:
            return "reason must be 1-%d characters when ABORTED and empty otherwise" % MAX_REASON_CHARS
        return None

    def to_json_obj(self) -> dict:
        return {"first": self.first, "last": self.last, "source": self.source, "target": self.target,
                "phase": self.phase.value, "started_epoch": self.started_epoch, "cursor": self.cursor.hex(),
                "replicated": self.replicated, "digest": self.digest.hex(), "reason": self.reason}

    @classmethod
    def from_json_obj(cls, obj) -> "Migration":
        """SlotMapError (or KeyError/ValueError/TypeError, which decode turns into one)."""
        m = cls(_int(obj["first"]), _int(obj["last"]), _int(obj["source"]), _int(obj["target"]),
                MovePhase(obj["phase"]), _int(obj["started_epoch"]), _hex(obj["cursor"]),
                _int(obj["replicated"]), _hex(obj["digest"]), _str(obj["reason"]))
        problem = m.problem()
        if problem:
            raise SlotMapError("migration %r: %s" % (obj, problem))
        return m


def _ranges_of(owners: bytes, group_id: int) -> list:
    return [(first, last) for gid, first, last in _runs_of(owners) if gid == group_id]


@functools.lru_cache(maxsize=8)
def _runs_of(owners: bytes) -> tuple:
    """((group, first, last), ...): the map's runs of slots with one owner, ascending.
    One unpack and a C-level groupby over the 16384 owners, cached per owners value: a
    node asks for every group's ranges at each new map epoch (and layout requests ask
    again), and the per-slot Python loop this replaces cost ~3 ms per group on every
    node, on its event loop, at each of a slot move's epochs (bench/slot_move.py)."""
    runs = []
    first = 0
    for gid, same in itertools.groupby(struct.unpack(_OWNERS_FORMAT, owners)):
        n = len(list(same))
        runs.append((gid, first, first + n - 1))
        first += n
    return tuple(runs)


def format_ranges(ranges: Iterable) -> str:
    """[(0, 5460), (7, 7)] -> "0-5460,7" (the CLI's and the status JSON's form)."""
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in ranges)


def parse_ranges(text: str) -> list:
    """"100-199,300" -> [(100, 199), (300, 300)]; SlotMapError on anything else."""
    out = []
    for part in text.split(","):
        part = part.strip()
        a, sep, b = part.partition("-")
        try:
            first = int(a)
            last = int(b) if sep else first
        except ValueError:
            raise SlotMapError("invalid slot range %r" % part) from None
        if not 0 <= first <= last < SLOT_COUNT:
            raise SlotMapError("slot range %r outside 0-%d" % (part, SLOT_COUNT - 1))
        out.append((first, last))
    return out


@dataclass(frozen=True)
class SlotMap:
    epoch: int
    owners: bytes
    groups: Mapping = field(default_factory=dict)
    nodes: Mapping = field(default_factory=dict)
    migrations: Mapping = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        object.__setattr__(self, "nodes", MappingProxyType(dict(self.nodes)))
        object.__setattr__(self, "migrations", MappingProxyType(dict(self.migrations)))
        self.validate()

    def __repr__(self) -> str:
        # The owners bytes are 32 KiB: show them as runs, the way encode() does.
        obj = self.to_json_obj()
        return "SlotMap(epoch=%d, slots=%s, groups=%r, nodes=%r, migrations=%r)" % (
            self.epoch, obj["slots"], dict(self.groups), dict(self.nodes), dict(self.migrations))

    # -- queries ---------------------------------------------------------------------
    def owner(self, slot: int) -> int:
        """The group that owns `slot`."""
        o = self.owners
        return o[2 * slot] | (o[2 * slot + 1] << 8)

    def ranges(self, group_id: int) -> list:
        """The inclusive (first, last) runs of slots `group_id` owns, ascending."""
        return _ranges_of(self.owners, group_id)

    def owner_ids(self) -> tuple:
        """The owner of every slot, indexed by slot (one unpack, for whole-map scans)."""
        return struct.unpack(_OWNERS_FORMAT, self.owners)

    def slot_counts(self) -> dict:
        counts = {g: 0 for g in self.groups}
        for gid in self.owner_ids():
            counts[gid] += 1
        return counts

    def migration_of(self, slot: int) -> Optional["Migration"]:
        """The move in progress that holds `slot`, if any."""
        for m in self.migrations.values():
            if m.first <= slot <= m.last:
                return m
        return None

    def groups_of_node(self, node_id: int) -> list:
        """Group ids that have `node_id` as a voter or learner, ascending."""
        return sorted(g for g, spec in self.groups.items()
                      if node_id in spec.voters or node_id in spec.learners)

    # -- changes (each returns a new map, epoch + 1) ------------------------------------
    def with_owner(self, slots: Iterable, group_id: int) -> "SlotMap":
        if group_id not in self.groups:
            raise SlotMapError("no group %d" % group_id)
        owners = bytearray(self.owners)
        lo, hi = group_id & 0xFF, group_id >> 8
        for s in slots:
            if not 0 <= s < SLOT_COUNT:
                raise SlotMapError("slot %r outside 0-%d" % (s, SLOT_COUNT - 1))
            owners[2 * s], owners[2 * s + 1] = lo, hi
        return SlotMap(self.epoch + 1, bytes(owners), self.groups, self.nodes, self.migrations)

    def with_group(self, spec: GroupSpec) -> "SlotMap":
        groups = dict(self.groups)
        groups[spec.group_id] = spec
        return SlotMap(self.epoch + 1, self.owners, groups, self.nodes, self.migrations)

    def with_node(self, spec: NodeSpec) -> "SlotMap":
        nodes = dict(self.nodes)
        nodes[spec.node_id] = spec
        return SlotMap(self.epoch + 1, self.owners, self.groups, nodes, self.migrations)

    # -- invariants --------------------------------------------------------------------
    def validate(self) -> None:
        """SlotMapError unless every invariant of the module doc holds."""
        if not isinstance(self.epoch, int) or self.epoch < 1:
            raise SlotMapError("epoch must be >= 1, got %r" % (self.epoch,))
        if not isinstance(self.owners, bytes) or len(self.owners) != 2 * SLOT_COUNT:
            raise SlotMapError("owners must be %d bytes" % (2 * SLOT_COUNT))
        if not self.groups or len(self.groups) > MAX_GROUPS:
            raise SlotMapError("a map has 1 to %d groups, got %d" % (MAX_GROUPS, len(self.groups)))
        if len(self.nodes) > MAX_NODES:
            raise SlotMapError("a map has at most %d nodes" % MAX_NODES)
        for nid, n in self.nodes.items():
            if not isinstance(n, NodeSpec) or n.node_id != nid or not 1 <= nid <= MAX_NODE_ID:
                raise SlotMapError("node entry %r is not a valid NodeSpec" % (nid,))
        for gid, g in self.groups.items():
            if not isinstance(g, GroupSpec) or g.group_id != gid or not 1 <= gid <= MAX_GROUP_ID:
                raise SlotMapError("group entry %r is not a valid GroupSpec" % (gid,))
            if not g.voters or list(g.voters) != sorted(set(g.voters)):
                raise SlotMapError("group %d: voters must be non-empty, sorted and distinct" % gid)
            if list(g.learners) != sorted(set(g.learners)) or set(g.learners) & set(g.voters):
                raise SlotMapError("group %d: learners must be sorted, distinct, not voters" % gid)
            if g.preferred_leader not in g.voters:
                raise SlotMapError("group %d: preferred leader %d is not a voter" % (gid, g.preferred_leader))
            if g.conf_version < 0:
                raise SlotMapError("group %d: conf_version < 0" % gid)
            if list(g.left) != sorted(set(g.left)) or set(g.left) & set(g.voters + g.learners) or \
                    any(n not in self.nodes for n in g.left):
                raise SlotMapError("group %d: left must be sorted, distinct map nodes that are not replicas" % gid)
            gen_nodes = [n for n, _ in g.generations]
            if gen_nodes != sorted(set(gen_nodes)) or not set(gen_nodes) <= set(g.replicas + g.left) or \
                    any(not 1 <= gen <= MAX_GENERATION for _, gen in g.generations):
                raise SlotMapError("group %d: generations must be sorted (node, 1..%d) of replicas or left nodes"
                                   % (gid, MAX_GENERATION))
            missing = [r for r in g.voters + g.learners if r not in self.nodes]
            if missing:
                raise SlotMapError("group %d names unknown nodes %s" % (gid, missing))
        owner_ids = self.owner_ids()
        strays = set(owner_ids) - set(self.groups)
        if strays:
            raise SlotMapError("slots owned by unknown groups %s" % sorted(strays))
        self._validate_migrations(owner_ids)

    def _validate_migrations(self, owner_ids: tuple) -> None:
        if len(self.migrations) > MAX_MIGRATIONS:
            raise SlotMapError("a map has at most %d migrations" % MAX_MIGRATIONS)
        previous_last = -1
        for key in sorted(self.migrations):
            m = self.migrations[key]
            if not isinstance(m, Migration) or key != m.key:
                raise SlotMapError("migration entry %r is not a Migration of those slots" % (key,))
            problem = m.problem()
            if problem:
                raise SlotMapError("migration %d-%d: %s" % (m.first, m.last, problem))
            if m.first <= previous_last:
                raise SlotMapError("slot %d is in two migrations" % m.first)
            previous_last = m.last
            if m.source not in self.groups or m.target not in self.groups:
                raise SlotMapError("migration %d-%d names unknown groups" % key)
            if m.started_epoch > self.epoch:
                raise SlotMapError("migration %d-%d started after epoch %d" % (m.first, m.last, self.epoch))
            if any(owner_ids[s] != m.owner for s in range(m.first, m.last + 1)):
                raise SlotMapError("migration %d-%d (%s): group %d must own every slot"
                                   % (m.first, m.last, m.phase.value, m.owner))

    # -- encoding ----------------------------------------------------------------------
    def to_json_obj(self) -> dict:
        runs = []
        start = 0
        for gid, run in itertools.groupby(self.owner_ids()):
            length = sum(1 for _ in run)
            runs.append([start, start + length - 1, gid])
            start += length
        return {
            "epoch": self.epoch,
            "slots": runs,
            # "left" and "generations" only when some node left: a map without departures
            # encodes as before.
            "groups": [{"id": g.group_id, "voters": list(g.voters), "learners": list(g.learners),
                        "preferred_leader": g.preferred_leader, "conf_version": g.conf_version}
                       | ({"left": list(g.left)} if g.left else {})
                       | ({"generations": [list(p) for p in g.generations]} if g.generations else {})
                       for g in sorted(self.groups.values(), key=lambda g: g.group_id)],
            "nodes": [node_to_json_obj(n) for n in sorted(self.nodes.values(), key=lambda n: n.node_id)],
        } | ({"migrations": [self.migrations[k].to_json_obj() for k in sorted(self.migrations)]}
             if self.migrations else {})

    def encode(self) -> bytes:
        return json.dumps(self.to_json_obj(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "SlotMap":
        """The map `encode` wrote; SlotMapError for anything else (never a partial map)."""
        if len(data) > MAX_ENCODED_BYTES:
            raise SlotMapError("encoded slot map over %d bytes" % MAX_ENCODED_BYTES)
        try:
            obj = json.loads(data)
            nodes = {}
            for n in obj["nodes"]:
                spec = node_from_json_obj(n)
                if spec.node_id in nodes:
                    raise SlotMapError("node %d twice" % spec.node_id)
                nodes[spec.node_id] = spec
            groups = {}
            for g in obj["groups"]:
                spec = GroupSpec(_int(g["id"]), tuple(_int(v) for v in g["voters"]), _int(g["preferred_leader"]),
                                 tuple(_int(v) for v in g["learners"]), _int(g["conf_version"]),
                                 tuple(_int(v) for v in g.get("left", ())),
                                 tuple(_generation_pair(p) for p in g.get("generations", ())))
                if spec.group_id in groups:
                    raise SlotMapError("group %d twice" % spec.group_id)
                groups[spec.group_id] = spec
            owner_runs = []
            expect = 0
            for first, last, gid in obj["slots"]:
                first, last, gid = _int(first), _int(last), _int(gid)
                if first != expect or last < first or last >= SLOT_COUNT or not 0 <= gid <= MAX_GROUP_ID:
                    raise SlotMapError("slot runs must cover 0-%d in order" % (SLOT_COUNT - 1))
                owner_runs.append(gid.to_bytes(2, "little") * (last - first + 1))
                expect = last + 1
            owners = b"".join(owner_runs)
            if expect != SLOT_COUNT:
                raise SlotMapError("slot runs end at %d, not %d" % (expect - 1, SLOT_COUNT - 1))
            migrations = {}
            for m in obj.get("migrations", ()):
                migration = Migration.from_json_obj(m)
                if migration.key in migrations:
                    raise SlotMapError("migration %d-%d twice" % migration.key)
                migrations[migration.key] = migration
            return cls(_int(obj["epoch"]), bytes(owners), groups, nodes, migrations)
        except SlotMapError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise SlotMapError("invalid encoded slot map: %r" % (exc,)) from None


def node_to_json_obj(n: NodeSpec) -> dict:
    return {"id": n.node_id, "grpc": n.grpc, "resp": n.resp, "state": n.state.value}


def node_from_json_obj(obj) -> NodeSpec:
    """The NodeSpec node_to_json_obj wrote (KeyError/ValueError/SlotMapError otherwise)."""
    return NodeSpec(_int(obj["id"]), _str(obj["grpc"]), _str(obj["resp"]), NodeState(obj["state"]))


def _generation_pair(obj) -> tuple:
    if type(obj) is not list or len(obj) != 2:
        raise SlotMapError("a generation is [node, generation], got %r" % (obj,))
    return _int(obj[0]), _int(obj[1])


def _hex(v) -> bytes:
    """Lower-case hex with nothing between the bytes (what bytes.hex() writes, one form only)."""
    data = bytes.fromhex(_str(v))
    if data.hex() != v:
        raise SlotMapError("expected lower-case hex, got %r" % (v[:80],))
    return data


def _int(v) -> int:
    if type(v) is not int:
        raise SlotMapError("expected an integer, got %r" % (v,))
    return v


def _str(v) -> str:
    if type(v) is not str:
        raise SlotMapError("expected a string, got %r" % (v,))
    return v


def owners_from_ranges(assignments: Sequence) -> bytes:
    """owners bytes from [(first, last, group_id), ...]; slots not named stay group 0
    (which validate() refuses, so every slot must be named)."""
    owners = bytearray(2 * SLOT_COUNT)
    for first, last, gid in assignments:
        invariant(0 <= first <= last < SLOT_COUNT and 1 <= gid <= MAX_GROUP_ID, "valid slot run")
        for s in range(first, last + 1):
            owners[2 * s], owners[2 * s + 1] = gid & 0xFF, gid >> 8
    return bytes(owners)


def find_group(slot_map: SlotMap, slot: int) -> Optional[GroupSpec]:
    return slot_map.groups.get(slot_map.owner(slot))
