"""One replica of one Raft group on one simulated node: the REAL RawNode over a crashable
MemoryStorage, feeding the REAL state machine of its group.

    group 0      node/cluster/meta_machine.MetaMachine (the slot map, changed by its log)
    group 1, 2   node/fsm/state_machine.StateMachine (streams, sessions, owned slots, moves)

As in tests/raft/sim/node.py a Ready is handled in two scheduler events, so that a crash
can fall between them: `write` sends rd.messages and writes (not yet durably) entries,
snapshot and hard state; `sync` makes them durable, sends rd.persisted_messages, applies
the committed entries and hands the read states over. Every applied entry and its result
go to the simulation (`sim.on_applied`), which completes proposals and runs the checks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from xraft.node.cluster.meta_machine import MetaMachine
from xraft.node.cluster.slot_map import SlotMap
from xraft.node.fsm.slot_owner import OwnedSlots
from xraft.node.fsm.state_machine import StateMachine
from xraft.node.raft.config import Config
from xraft.node.raft.rawnode import RawNode
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import ConfState, EntryType, Ready, Snapshot, SnapshotMetadata, StateRole

if TYPE_CHECKING:
    from .world import ShardSim

META = 0


class MetaAdapter:
    """MetaMachine with the applied index of Raft's empty entries too (they are no change)."""

    def __init__(self, founding: SlotMap):
        self.mm = MetaMachine(founding)
        self.applied_index = 0

    def apply(self, index: int, data: bytes):
        self.applied_index = index
        return self.mm.apply(index, data) if data else None

    def snapshot(self) -> bytes:
        return self.mm.snapshot()

    def restore(self, data: bytes, index: int) -> None:
        self.mm.restore(data, index)
        self.applied_index = index

    @property
    def slot_map(self) -> SlotMap:
        return self.mm.slot_map


class DataAdapter:
    """A data group's StateMachine; one request per record, so one result per entry.
    prepare_ahead: run StateMachine.prepare's callable right before each apply, as a node's
    prepare thread does (runtime/apply_ahead.py); replicas that do and replicas that do not
    must still hold byte-identical states (the checker's "same state")."""

    def __init__(self, prepare_ahead: bool = False):
        self.sm = StateMachine()
        self.prepare_ahead = prepare_ahead
        self.prepared = 0                    # applies whose prepare ran first

    @property
    def applied_index(self) -> int:
        return self.sm.applied_index

    def apply(self, index: int, data: bytes):
        if self.prepare_ahead:
            fn = self.sm.prepare(index, data)
            if fn is not None:
                fn()
                self.prepared += 1
        results = self.sm.apply(index, data)
        return results[0] if results else None

    def snapshot(self) -> bytes:
        return self.sm.snapshot()

    def restore(self, data: bytes, index: int) -> None:
        self.sm.restore(data)
        if self.sm.applied_index != index:
            raise AssertionError("harness: data snapshot index %d != metadata %d" % (self.sm.applied_index, index))


def machine_for(gid: int, founding: SlotMap, prepare_ahead: bool = False):
    return MetaAdapter(founding) if gid == META else DataAdapter(prepare_ahead)


def bootstrap_snapshot(gid: int, founding: SlotMap, voters: tuple, setup_record: Optional[bytes]) -> Snapshot:
    """The founding state of a group at index 1 (every founding replica starts from it):
    the map for group 0; for a data group its owned slots and `setup_record` applied."""
    if gid == META:
        data = founding.encode()
    else:
        sm = StateMachine(owned=OwnedSlots.from_ranges(founding.ranges(gid)))
        if setup_record is None:
            sm.skip(1)
        else:
            for r in sm.apply(1, setup_record):
                if isinstance(r, Exception):
                    raise AssertionError("harness: setup request refused: %r" % (r,))
        data = sm.snapshot()
    return Snapshot(SnapshotMetadata(index=1, term=1, conf_state=ConfState(voters=voters)), data)


class Replica:
    def __init__(self, sim: "ShardSim", node_id: int, gid: int, storage: MemoryStorage):
        self.sim = sim
        self.node_id = node_id
        self.gid = gid
        self.storage = storage
        self.rn: Optional[RawNode] = None
        self.machine = None
        self.conf_state = ConfState()
        self.pending: Optional[Ready] = None
        self.start()

    def start(self) -> None:
        snap = self.storage.snapshot()
        self.machine = machine_for(self.gid, self.sim.founding, prepare_ahead=self.node_id % 2 == 1)
        self.machine.restore(snap.data, snap.metadata.index)
        self.conf_state = snap.metadata.conf_state
        c = self.sim.cfg
        cfg = Config(id=self.node_id, election_tick=c.election_tick, heartbeat_tick=c.heartbeat_tick,
                     applied=snap.metadata.index, rng=self.sim.rng, check_quorum=True, pre_vote=True,
                     max_size_per_msg=c.max_size_per_msg, max_inflight_msgs=c.max_inflight_msgs,
                     max_snapshot_chunk_bytes=c.snapshot_chunk_bytes)
        self.rn = RawNode(cfg, self.storage)
        self.pending = None

    def crash(self) -> None:
        self.storage = self.storage.crash()
        self.rn = None
        self.machine = None
        self.pending = None

    def is_leader(self) -> bool:
        return self.rn is not None and self.rn.raft.state == StateRole.LEADER

    # -- Ready ------------------------------------------------------------------------------
    def write_ready(self) -> None:
        rd = self.rn.ready()
        for m in rd.messages:
            self.sim.send(self.gid, m)
        st = self.storage
        if rd.snapshot is not None:
            st.apply_snapshot(rd.snapshot)
        if rd.entries:
            st.append(rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        self.pending = rd

    def sync_ready(self) -> None:
        rd, self.pending = self.pending, None
        if rd.must_sync:
            self.storage.sync()
        for m in rd.persisted_messages:
            self.sim.send(self.gid, m)
        if rd.snapshot is not None:
            snap = rd.snapshot
            self.machine = machine_for(self.gid, self.sim.founding, prepare_ahead=self.node_id % 2 == 1)
            self.machine.restore(snap.data, snap.metadata.index)
            self.conf_state = snap.metadata.conf_state
        for e in rd.committed_entries:
            if e.index <= self.machine.applied_index:
                continue                      # covered by the snapshot of this same Ready
            if e.type != EntryType.NORMAL:
                raise AssertionError("harness: the simulation makes no membership change")
            self.sim.before_apply(self, e)
            result = self.machine.apply(e.index, e.data)
            self.sim.on_applied(self, e, result)
        for rs in rd.read_states:
            self.sim.on_read_state(self, rs)
        self.rn.advance(rd)
        self.sim.after_apply(self)
        self.maybe_compact()

    def maybe_compact(self) -> None:
        """Snapshot + compact past the bound, so laggards and restarts go through restore()."""
        st, bound = self.storage, self.sim.cfg.log_bound
        applied = self.machine.applied_index
        if applied - st.first_index() + 1 <= bound or applied > st.last_index():
            return
        if applied > st.snapshot().metadata.index:
            st.create_snapshot(applied, self.conf_state, self.machine.snapshot())
        upto = applied - self.sim.rng.randint(0, bound // 2)
        if upto >= st.first_index():
            st.compact(upto)
