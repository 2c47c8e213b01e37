"""One simulated server: a RawNode over a crashable MemoryStorage, feeding a KVStore.

A Ready is handled in two scheduler events, so that a crash can fall between them:

  write  — take the Ready; release rd.messages at once (the contract allows
           it); write snapshot, entries and hard state to storage (not yet
           synced: a crash now loses them, and nothing promised them).
  sync   — fsync if rd.must_sync; only now release rd.persisted_messages;
           apply the snapshot and the committed entries; hand read states to
           the workload; advance(); compact the log if it is over its bound.

The node reports everything it does to the simulator (`sim`), whose checker
sees each persisted entry, each applied entry and each role change.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from xraft.node.raft.codec import decode_conf_change_entry
from xraft.node.raft.config import Config
from xraft.node.raft.rawnode import RawNode
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import (
    ConfState,
    EntryType,
    Ready,
    Snapshot,
    SnapshotMetadata,
    StateRole,
)

from .kv import KVStore

if TYPE_CHECKING:
    from .simulator import Simulation


def bootstrap_storage(voters: tuple[int, ...]) -> MemoryStorage:
    """A founding member's disk: a snapshot at index 1 (term 1) holding the first configuration."""
    st = MemoryStorage()
    kv = KVStore()
    kv.applied_index = 1
    st.apply_snapshot(Snapshot(SnapshotMetadata(index=1, term=1, conf_state=ConfState(voters=voters)),
                               kv.serialize()))
    st.sync()
    return st


class SimNode:
    def __init__(self, sim: "Simulation", node_id: int, storage: MemoryStorage) -> None:
        self.sim = sim
        self.id = node_id
        self.storage = storage
        self.rn: Optional[RawNode] = None
        self.kv = KVStore()
        self.conf_state = ConfState()
        self.pending: Optional[Ready] = None  # a Ready written but not yet synced/applied
        self.crashed = False
        self.paused = False
        # Transport reports addressed to this node while it is paused, delivered on resume (a
        # stopped process runs its transport's completions when it continues; dropping them
        # strands a follower: a leader leaves the SNAPSHOT state only on report_snapshot or an
        # ack). Deduplicated as the runtime's GroupDriver does. Invariant: at most one entry
        # per peer in each, so bounded by the cluster size.
        self.deferred_unreachable: dict[int, None] = {}  # peers, in report order
        self.deferred_snap_reports: dict[int, bool] = {}  # peer -> latest outcome
        self.commit_floor = 0  # highest commit index ever made durable (must survive crashes)
        self.last_commit = 0  # highest commit index seen in this incarnation's hard states
        self.restarts = 0
        self.start()

    # ------------------------------------------------ life cycle

    def config(self, applied: int) -> Config:
        c = self.sim.cfg
        return Config(id=self.id, election_tick=c.election_tick, heartbeat_tick=c.heartbeat_tick,
                      applied=applied, rng=self.sim.rng, check_quorum=True, pre_vote=True,
                      max_size_per_msg=c.max_size_per_msg, max_inflight_msgs=c.max_inflight_msgs,
                      max_snapshot_chunk_bytes=c.snapshot_chunk_bytes,
                      max_snapshot_inflight_bytes=(c.snapshot_chunk_bytes * c.snapshot_window_chunks
                                                   or max(8 << 20, c.snapshot_chunk_bytes)),
                      quiesce=c.quiesce)

    def start(self) -> None:
        snap = self.storage.snapshot()
        self.kv = KVStore.restore(snap.data)
        invariant_eq(self.kv.applied_index, snap.metadata.index, "snapshot data index vs metadata")
        self.conf_state = snap.metadata.conf_state
        self.rn = RawNode(self.config(snap.metadata.index), self.storage)
        self.pending = None
        self.crashed = False
        self.last_commit = self.rn.raft.raft_log.committed
        self.sim.checker.on_start(self)

    def crash(self) -> None:
        """Power loss: unsynced writes, the unfinished Ready and queued inbound messages are gone."""
        self.storage = self.storage.crash()
        self.rn = None
        self.pending = None
        self.crashed = True
        self.deferred_unreachable.clear()  # the progress they were about is gone with the process
        self.deferred_snap_reports.clear()
        self.restarts += 1
        self.sim.report_lost(self.sim.net.drop_to(self.id))

    def is_up(self) -> bool:
        return not self.crashed and not self.paused

    def resume(self) -> None:
        self.paused = False
        if self.crashed:
            return
        unreachable, self.deferred_unreachable = self.deferred_unreachable, {}
        snaps, self.deferred_snap_reports = self.deferred_snap_reports, {}
        for peer in unreachable:
            self.call(self.rn.report_unreachable, peer)
        for peer, ok in snaps.items():
            self.call(self.rn.report_snapshot, peer, ok)

    # ------------------------------------------------ transport reports (RawNode contract)

    def report_unreachable(self, peer: int) -> None:
        if self.crashed:
            return
        if self.paused:
            self.deferred_unreachable[peer] = None
            return
        self.call(self.rn.report_unreachable, peer)

    def report_snapshot(self, peer: int, ok: bool) -> None:
        """Every MsgSnap is reported once the transport knows its fate: never dropped for a live node."""
        if self.crashed:
            return
        if self.paused:
            self.deferred_snap_reports.pop(peer, None)
            self.deferred_snap_reports[peer] = ok
            return
        self.call(self.rn.report_snapshot, peer, ok)

    # ------------------------------------------------ Ready handling

    def can_write(self) -> bool:
        return self.is_up() and self.pending is None and self.rn.has_ready()

    def write_ready(self) -> None:
        rd = self.rn.ready()
        self.sim.checker.on_ready(self, rd)
        for m in rd.messages:
            self.sim.send(m, self.id)
        st = self.storage
        if rd.snapshot is not None:
            st.apply_snapshot(rd.snapshot)
        if rd.entries:
            st.append(rd.entries)
            self.sim.checker.on_persist(self, rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        if "early_persisted_messages" in self.sim.cfg.inject:
            # INJECTED BUG (checker self-test): promise durable state before it is durable.
            for m in rd.persisted_messages:
                self.sim.send(m, self.id)
        self.pending = rd

    def sync_ready(self) -> None:
        rd = self.pending
        self.pending = None
        if rd.must_sync:
            self.storage.sync()
            self.commit_floor = max(self.commit_floor, self.storage.hard_state().commit)
        if "early_persisted_messages" not in self.sim.cfg.inject:
            for m in rd.persisted_messages:
                self.sim.send(m, self.id)
        if rd.snapshot is not None:
            snap = rd.snapshot
            self.kv = KVStore.restore(snap.data)
            invariant_eq(self.kv.applied_index, snap.metadata.index, "received snapshot data index")
            self.conf_state = snap.metadata.conf_state
            self.sim.checker.on_snapshot_applied(self, snap)
        for e in rd.committed_entries:
            self.apply_entry(e)
        for rs in rd.read_states:
            self.sim.workload.on_read_state(self, rs)
        self.rn.advance(rd)
        self.sim.checker.after_input(self)
        self.sim.workload.on_applied(self)
        self.maybe_compact()

    def apply_entry(self, e) -> None:
        if e.index <= self.kv.applied_index:
            return  # covered by a snapshot applied in this same Ready
        is_cmd = e.type == EntryType.NORMAL
        if not is_cmd:
            self.conf_state = self.rn.apply_conf_change(decode_conf_change_entry(e))
        if "flip_apply" in self.sim.cfg.inject and self.id == 1 and e.data and is_cmd and e.index % 7 == 0:
            # INJECTED BUG (checker self-test): node 1 applies a corrupted command.
            e = type(e)(e.term, e.index, e.type, e.data.replace(b"|", b"|9", 1))
        self.kv.apply(e, is_cmd)
        self.sim.checker.on_apply(self, e)

    def maybe_compact(self) -> None:
        """Snapshot + compact once the log holds more than the bound (so laggards need MsgSnap)."""
        st = self.storage
        applied = self.kv.applied_index
        if applied - st.first_index() + 1 <= self.sim.cfg.log_bound or applied > st.last_index():
            return
        if applied > st.snapshot().metadata.index:
            st.create_snapshot(applied, self.conf_state, self.kv.serialize())
        keep = self.sim.rng.randint(0, self.sim.cfg.log_bound // 2)
        upto = applied - keep
        if upto >= st.first_index():
            st.compact(upto)

    # ------------------------------------------------ inputs (checked after each)

    def tick(self) -> None:
        self.rn.tick()
        self.sim.checker.after_input(self)

    def step(self, m) -> None:
        self.rn.step(m)
        self.sim.checker.after_input(self)

    def call(self, fn, *args) -> None:
        """Any other input (campaign, propose, read_index, ...); exceptions go to the caller."""
        try:
            fn(*args)
        finally:
            self.sim.checker.after_input(self)

    def role(self) -> StateRole:
        return self.rn.raft.state

    def leader_hint(self) -> int:
        return self.rn.raft.lead


def invariant_eq(a, b, what: str) -> None:
    if a != b:
        raise AssertionError(f"harness: {what}: {a} != {b}")


def new_member_storage() -> MemoryStorage:
    """A node added by a conf change starts empty and is caught up by the leader's snapshot."""
    return MemoryStorage()

