"""Maps and drivers the cluster_map tests share."""
import hashlib

from hypothesis import strategies as st

from xraft.node.cluster.changes import AdvanceMove, apply_change
from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import GroupSpec, MovePhase, NodeSpec, NodeState, SlotMap
from xraft.node.cluster.slot_move import Copied, Decide, Finish, Precopied, Released, Sealed, Verified
from xraft.node.engine.slots import SLOT_COUNT


def nodes(n, first=1):
    return {i: NodeSpec(i, "127.0.0.1:%d" % (7000 + i), "127.0.0.1:%d" % (6000 + i))
            for i in range(first, first + n)}


def digest(text="manifest") -> bytes:
    return hashlib.sha256(text.encode()).digest()


def next_event(phase: MovePhase, replicated: int = 0):
    """What a healthy driver proposes next for a move in `phase`."""
    return {MovePhase.PRECOPYING: Precopied(), MovePhase.SEALING: Sealed(),
            MovePhase.COPYING: Verified(digest()) if replicated >= 2 else Copied(b"k%d" % (replicated + 1),
                                                                                replicated + 1),
            MovePhase.VERIFIED: Decide(), MovePhase.DECIDED: Released(),
            MovePhase.RELEASED: Finish(), MovePhase.ABORTED: Finish()}[phase]


def advance_change(m: SlotMap, mig, event) -> AdvanceMove:
    return AdvanceMove(m.epoch, mig.first, mig.last, mig.started_epoch, mig.target, event)


def finish_moves(m: SlotMap) -> SlotMap:
    """Drive every move in `m` to its end along the healthy path."""
    while m.migrations:
        mig = m.migrations[min(m.migrations)]
        m = apply_change(m, advance_change(m, mig, next_event(mig.phase, mig.replicated)))
    return m


@st.composite
def cluster_maps(draw, max_nodes=7, max_groups=12):
    """A valid migration-free map: initial_layout, slots skewed by direct assignment,
    preferred leaders shuffled among voters, and some nodes DRAINING."""
    n = draw(st.integers(1, max_nodes))
    g = draw(st.integers(1, max_groups))
    r = draw(st.integers(1, 3))
    m = initial_layout(nodes(n), g, r)
    owners = list(m.owner_ids())
    for _ in range(draw(st.integers(0, 4))):
        first = draw(st.integers(0, SLOT_COUNT - 1))
        length = draw(st.integers(0, 6000))
        gid = draw(st.integers(1, g))
        owners[first:min(SLOT_COUNT, first + length + 1)] = [gid] * (min(SLOT_COUNT, first + length + 1) - first)
    groups = {}
    for gid, spec in m.groups.items():
        groups[gid] = GroupSpec(gid, spec.voters, draw(st.sampled_from(spec.voters)))
    node_specs = dict(m.nodes)
    for nid in draw(st.sets(st.sampled_from(sorted(node_specs)), max_size=max(0, n - 1))):
        node_specs[nid] = NodeSpec(nid, node_specs[nid].grpc, node_specs[nid].resp, NodeState.DRAINING)
    raw = b"".join(gid.to_bytes(2, "little") for gid in owners)
    return SlotMap(m.epoch, raw, groups, node_specs)


def apply_all(m: SlotMap, changes) -> SlotMap:
    for c in changes:
        m = apply_change(m, c)
    return m
