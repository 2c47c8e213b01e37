"""Changes to the slot map as compare-and-set commands: the entries of the metadata
group's Raft log.

Every change names the epoch of the map it was planned against (`expect_epoch`).
apply_change(map, change) applies it only to that map and returns the next one
(epoch + 1); any other map raises StaleEpoch, so two CLIs (or a CLI and a resumed
one) never interleave half-plans, and a change re-delivered after it committed is
refused instead of applied twice. already_applied(map, change) then tells a resuming
driver whether the refused change's effect is already there (done) or not (conflict:
plan again). A change that would change nothing, or break an invariant, raises
SlotMapError.

    AssignSlots(first, last, group)       force the owner of slots no move holds (an empty
                                          cluster, or slots known to hold no keys)
    AddNode(node)                         a new node id, UP (ids never return: REMOVED stays)
    SetNodeState(node, state)             UP -> DRAINING -> REMOVED, DRAINING -> UP (cancel);
                                          REMOVED only once the node holds no replica
    AddLearner(group, node)               conf_version + 1; the node must be UP. A node in the
                                          group's `left` rejoins as its next generation (a new
                                          replica id: Raft takes no id back)
    PromoteLearner(group, node)           learner -> voter, conf_version + 1
    RemoveReplica(group, node)            conf_version + 1; not the last voter, not the
                                          preferred leader (move that first); the node joins
                                          the group's `left` (its generation stays recorded)
    SetPreferredLeader(group, node)       an UP voter
    BeginMove(first, last, target)        slot_move.begin_move
    AdvanceMove(first, last, started_epoch, target, event)   slot_move.advance

Encoding: canonical JSON {"v": 1, "kind": ..., "expect_epoch": N, ...} (sorted keys, no
spaces); decode_change validates sizes, types and fields before returning.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

from ..engine.slots import SLOT_COUNT
from ..invariant import invariant
from .slot_map import (MAX_GENERATION, GroupSpec, NodeSpec, NodeState, SlotMap, SlotMapError, _int,
                       node_from_json_obj, node_to_json_obj)
from .slot_move import (Abort, Finish, MoveError, advance, begin_move, event_from_json_obj, event_reached,
                        event_to_json_obj, with_advanced)

CHANGE_VERSION = 1
MAX_CHANGE_BYTES = 16 << 10      # what decode_change accepts (a cursor is at most 2 KiB of hex)
MAX_REPLICAS = 15                # voters + learners of one group
MAX_ADDRESS_CHARS = 255


class StaleEpoch(Exception):
    """The change was planned against another map than the one it met."""

    def __init__(self, expected: int, actual: int, change: object = None):
        super().__init__("change planned for epoch %d, map is at epoch %d" % (expected, actual))
        self.expected = expected   # the change's expect_epoch
        self.actual = actual       # the epoch of the map it met
        self.change = change


# -- the changes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AssignSlots:
    expect_epoch: int
    first: int
    last: int
    group_id: int
    kind = "assign_slots"


@dataclass(frozen=True)
class AddNode:
    expect_epoch: int
    node: NodeSpec
    kind = "add_node"


@dataclass(frozen=True)
class SetNodeState:
    expect_epoch: int
    node_id: int
    state: NodeState
    kind = "set_node_state"


@dataclass(frozen=True)
class AddLearner:
    expect_epoch: int
    group_id: int
    node_id: int
    kind = "add_learner"


@dataclass(frozen=True)
class PromoteLearner:
    expect_epoch: int
    group_id: int
    node_id: int
    kind = "promote_learner"


@dataclass(frozen=True)
class RemoveReplica:
    expect_epoch: int
    group_id: int
    node_id: int
    kind = "remove_replica"


@dataclass(frozen=True)
class SetPreferredLeader:
    expect_epoch: int
    group_id: int
    node_id: int
    kind = "set_preferred_leader"


@dataclass(frozen=True)
class BeginMove:
    expect_epoch: int
    first: int
    last: int
    target: int
    kind = "begin_move"


@dataclass(frozen=True)
class AdvanceMove:
    expect_epoch: int
    first: int
    last: int
    started_epoch: int     # with first..last, which move (a later move of the same slots differs)
    target: int            # the move's target group (tells a finished move from an aborted one)
    event: object          # one of slot_move.EVENT_TYPES
    kind = "advance_move"


CHANGE_TYPES = (AssignSlots, AddNode, SetNodeState, AddLearner, PromoteLearner, RemoveReplica,
                SetPreferredLeader, BeginMove, AdvanceMove)
_CHANGE_BY_KIND = {t.kind: t for t in CHANGE_TYPES}
_STATE_STEPS = {(NodeState.UP, NodeState.DRAINING), (NodeState.DRAINING, NodeState.UP),
                (NodeState.DRAINING, NodeState.REMOVED)}


# -- apply -------------------------------------------------------------------------------------
def apply_change(slot_map: SlotMap, change) -> SlotMap:
    """The map after `change` (epoch + 1). StaleEpoch if change.expect_epoch is not
    slot_map.epoch; SlotMapError (MoveError for move steps) if the change is invalid
    or would change nothing."""
    if type(change) not in CHANGE_TYPES:
        raise SlotMapError("not a slot map change: %r" % (change,))
    if change.expect_epoch != slot_map.epoch:
        raise StaleEpoch(change.expect_epoch, slot_map.epoch, change)
    new_map = _APPLY[type(change)](slot_map, change)
    invariant(new_map.epoch == slot_map.epoch + 1, "a change moves the epoch by exactly one")
    return new_map


def _group(m: SlotMap, group_id: int) -> GroupSpec:
    spec = m.groups.get(group_id)
    if spec is None:
        raise SlotMapError("no group %r" % (group_id,))
    return spec


def _up_node(m: SlotMap, node_id: int) -> NodeSpec:
    spec = m.nodes.get(node_id)
    if spec is None:
        raise SlotMapError("no node %r" % (node_id,))
    if spec.state is not NodeState.UP:
        raise SlotMapError("node %d is %s, not up" % (node_id, spec.state.value))
    return spec


def _apply_assign(m: SlotMap, c: AssignSlots) -> SlotMap:
    _group(m, c.group_id)
    if not 0 <= c.first <= c.last < SLOT_COUNT:
        raise SlotMapError("slots %d-%d outside the map" % (c.first, c.last))
    for mig in m.migrations.values():
        if mig.first <= c.last and c.first <= mig.last:
            raise SlotMapError("slots %d-%d are moving (%d-%d %s): assign refused"
                               % (c.first, c.last, mig.first, mig.last, mig.phase.value))
    owner_ids = m.owner_ids()
    if all(owner_ids[s] == c.group_id for s in range(c.first, c.last + 1)):
        raise SlotMapError("slots %d-%d are already owned by group %d" % (c.first, c.last, c.group_id))
    return m.with_owner(range(c.first, c.last + 1), c.group_id)


def _check_address(text: str, what: str) -> None:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or len(text) > MAX_ADDRESS_CHARS:
        raise SlotMapError("%s address %r is not host:port" % (what, text))


def _apply_add_node(m: SlotMap, c: AddNode) -> SlotMap:
    node = c.node
    old = m.nodes.get(node.node_id)
    if old is not None:
        raise SlotMapError("node %d exists (%s); a removed or re-added node comes back with a new id"
                           % (node.node_id, old.state.value))
    if node.state is not NodeState.UP:
        raise SlotMapError("a node is added UP, not %s" % node.state.value)
    _check_address(node.grpc, "grpc")
    if node.resp:
        _check_address(node.resp, "resp")
    for other in m.nodes.values():
        if other.state is not NodeState.REMOVED and node.grpc == other.grpc:
            raise SlotMapError("node %d already listens on %s" % (other.node_id, node.grpc))
    return m.with_node(node)


def _apply_set_state(m: SlotMap, c: SetNodeState) -> SlotMap:
    node = m.nodes.get(c.node_id)
    if node is None:
        raise SlotMapError("no node %r" % (c.node_id,))
    if (node.state, c.state) not in _STATE_STEPS:
        raise SlotMapError("node %d: %s -> %s is not allowed" % (c.node_id, node.state.value, c.state.value))
    held = m.groups_of_node(c.node_id)
    if c.state is NodeState.REMOVED and held:
        raise SlotMapError("node %d still replicates groups %s: drain it first" % (c.node_id, held))
    return m.with_node(replace(node, state=c.state))


def _with_members(m: SlotMap, g: GroupSpec, voters: tuple, learners: tuple) -> SlotMap:
    """A membership change of group g: a new conf_version, so the data group can order it."""
    return m.with_group(replace(g, voters=tuple(sorted(voters)), learners=tuple(sorted(learners)),
                                conf_version=g.conf_version + 1))


def _apply_add_learner(m: SlotMap, c: AddLearner) -> SlotMap:
    g = _group(m, c.group_id)
    _up_node(m, c.node_id)
    if c.node_id in g.replicas:
        raise SlotMapError("node %d already replicates group %d" % (c.node_id, c.group_id))
    if len(g.replicas) >= MAX_REPLICAS:
        raise SlotMapError("group %d has %d replicas already" % (c.group_id, MAX_REPLICAS))
    if c.node_id in g.left:
        # Raft never takes a replica id back: the node rejoins as a new replica, the next generation.
        generation = g.next_generation(c.node_id)
        if generation > MAX_GENERATION:
            raise SlotMapError("node %d rejoined group %d %d times already" % (c.node_id, c.group_id, MAX_GENERATION))
        g = replace(g, left=tuple(n for n in g.left if n != c.node_id),
                    generations=tuple(sorted((dict(g.generations) | {c.node_id: generation}).items())))
    return _with_members(m, g, g.voters, g.learners + (c.node_id,))


def _apply_promote(m: SlotMap, c: PromoteLearner) -> SlotMap:
    g = _group(m, c.group_id)
    _up_node(m, c.node_id)
    if c.node_id not in g.learners:
        raise SlotMapError("node %d is not a learner of group %d" % (c.node_id, c.group_id))
    return _with_members(m, g, g.voters + (c.node_id,), tuple(n for n in g.learners if n != c.node_id))


def _apply_remove_replica(m: SlotMap, c: RemoveReplica) -> SlotMap:
    g = _group(m, c.group_id)
    if c.node_id not in g.replicas:
        raise SlotMapError("node %r does not replicate group %d" % (c.node_id, c.group_id))
    if c.node_id == g.preferred_leader:
        raise SlotMapError("node %d is group %d's preferred leader: move that first" % (c.node_id, c.group_id))
    g = replace(g, left=tuple(sorted(g.left + (c.node_id,))))
    return _with_members(m, g, tuple(n for n in g.voters if n != c.node_id),
                         tuple(n for n in g.learners if n != c.node_id))


def _apply_preferred(m: SlotMap, c: SetPreferredLeader) -> SlotMap:
    g = _group(m, c.group_id)
    _up_node(m, c.node_id)
    if c.node_id not in g.voters:
        raise SlotMapError("node %d is not a voter of group %d" % (c.node_id, c.group_id))
    if c.node_id == g.preferred_leader:
        raise SlotMapError("node %d already is group %d's preferred leader" % (c.node_id, c.group_id))
    return m.with_group(replace(g, preferred_leader=c.node_id))


def _apply_begin_move(m: SlotMap, c: BeginMove) -> SlotMap:
    migration = begin_move(m, c.first, c.last, c.target)
    migrations = dict(m.migrations)
    migrations[migration.key] = migration
    return SlotMap(m.epoch + 1, m.owners, m.groups, m.nodes, migrations)


def _find_move(m: SlotMap, c: AdvanceMove):
    mig = m.migrations.get((c.first, c.last))
    if mig is None or mig.started_epoch != c.started_epoch or mig.target != c.target:
        return None
    return mig


def _apply_advance_move(m: SlotMap, c: AdvanceMove) -> SlotMap:
    mig = _find_move(m, c)
    if mig is None:
        raise MoveError("no move of slots %d-%d started at epoch %d" % (c.first, c.last, c.started_epoch),
                        event=c.event, already_applied=already_applied(m, c))
    return with_advanced(m, mig, advance(mig, c.event))


_APPLY = {AssignSlots: _apply_assign, AddNode: _apply_add_node, SetNodeState: _apply_set_state,
          AddLearner: _apply_add_learner, PromoteLearner: _apply_promote, RemoveReplica: _apply_remove_replica,
          SetPreferredLeader: _apply_preferred, BeginMove: _apply_begin_move, AdvanceMove: _apply_advance_move}


# -- done or conflict ---------------------------------------------------------------------------
def already_applied(slot_map: SlotMap, change) -> bool:
    """True if the effect of `change` is already in `slot_map`, so a driver whose
    change was refused (StaleEpoch after a crash or a lost reply) can count it as done.
    False means not there: apply it if the epoch matches, else plan again.

    For a move that is no longer in the map the answer comes from the owners: a
    finished move left its slots with the target, an aborted one with the source (a
    later move of the same slots can make that answer wrong; resume promptly)."""
    m, c = slot_map, change
    if type(c) is AssignSlots:
        return _owned_by(m, c.first, c.last, c.group_id)
    if type(c) is AddNode:
        return m.nodes.get(c.node.node_id) is not None and _same_address(m.nodes[c.node.node_id], c.node)
    if type(c) is SetNodeState:
        node = m.nodes.get(c.node_id)
        return node is not None and (node.state is c.state or
                                     (c.state is NodeState.DRAINING and node.state is NodeState.REMOVED))
    g = m.groups.get(getattr(c, "group_id", None))
    if type(c) is AddLearner:
        return g is not None and c.node_id in g.replicas
    if type(c) is PromoteLearner:
        return g is not None and c.node_id in g.voters
    if type(c) is RemoveReplica:
        return g is not None and c.node_id not in g.replicas
    if type(c) is SetPreferredLeader:
        return g is not None and g.preferred_leader == c.node_id
    if type(c) is BeginMove:
        mig = m.migrations.get((c.first, c.last))
        if mig is not None:
            return mig.target == c.target and mig.started_epoch == c.expect_epoch + 1
        return _owned_by(m, c.first, c.last, c.target)
    if type(c) is AdvanceMove:
        mig = _find_move(m, c)
        if mig is not None:
            return event_reached(mig, c.event)
        if m.migrations.get((c.first, c.last)) is None and c.started_epoch <= m.epoch:
            return _move_gone_with(m, c)
        return False
    raise SlotMapError("not a slot map change: %r" % (c,))


def _same_address(a: NodeSpec, b: NodeSpec) -> bool:
    return a.grpc == b.grpc and a.resp == b.resp


def _owned_by(m: SlotMap, first: int, last: int, group_id: int) -> bool:
    if not 0 <= first <= last < SLOT_COUNT:
        return False
    owner_ids = m.owner_ids()
    return all(owner_ids[s] == group_id for s in range(first, last + 1))


def _move_gone_with(m: SlotMap, c: AdvanceMove) -> bool:
    """A move no longer in the map either finished (its slots with the target: every step
    but Abort was taken) or was aborted (not with the target: Abort and Finish were)."""
    finished = _owned_by(m, c.first, c.last, c.target)
    if isinstance(c.event, Finish):
        return True
    return finished != isinstance(c.event, Abort)


# -- encoding ------------------------------------------------------------------------------------
def change_to_json_obj(change) -> dict:
    if type(change) not in CHANGE_TYPES:
        raise SlotMapError("not a slot map change: %r" % (change,))
    obj = {"v": CHANGE_VERSION, "kind": change.kind}
    for f in fields(change):
        value = getattr(change, f.name)
        if f.name == "node":
            value = node_to_json_obj(value)
        elif f.name == "state":
            value = value.value
        elif f.name == "event":
            value = event_to_json_obj(value)
        obj[f.name] = value
    return obj


def encode_change(change) -> bytes:
    return json.dumps(change_to_json_obj(change), sort_keys=True, separators=(",", ":")).encode()


def decode_change(data: bytes):
    """The change encode_change wrote; SlotMapError for anything else."""
    if len(data) > MAX_CHANGE_BYTES:
        raise SlotMapError("encoded change over %d bytes" % MAX_CHANGE_BYTES)
    try:
        obj = json.loads(data)
        if _int(obj["v"]) != CHANGE_VERSION:
            raise SlotMapError("change version %r, this node reads %d" % (obj["v"], CHANGE_VERSION))
        cls = _CHANGE_BY_KIND.get(obj["kind"])
        if cls is None:
            raise SlotMapError("unknown change kind %r" % (obj["kind"],))
        names = [f.name for f in fields(cls)]
        if set(obj) != set(names) | {"v", "kind"}:
            raise SlotMapError("change %s: fields must be %s" % (cls.kind, sorted(names)))
        values = {}
        for name in names:
            raw = obj[name]
            if name == "node":
                values[name] = node_from_json_obj(raw)
            elif name == "state":
                values[name] = NodeState(raw)
            elif name == "event":
                values[name] = event_from_json_obj(raw)
            else:
                values[name] = _int(raw)
                if values[name] < (1 if name == "expect_epoch" else 0):
                    raise SlotMapError("change %s: %s %d out of range" % (cls.kind, name, values[name]))
        return cls(**values)
    except SlotMapError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SlotMapError("invalid encoded change: %r" % (exc,)) from None
