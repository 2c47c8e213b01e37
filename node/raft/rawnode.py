"""RawNode: the application's handle on one Raft group member (etcd rawnode.go).

THE READY CONTRACT. The application drives the node in a loop:

    if node.has_ready():
        rd = node.ready()
        1. persist, in this order: rd.snapshot (if any), rd.entries (append;
           an entry at index i replaces the stored entry i and everything after
           it), rd.hard_state (if not None); fsync if rd.must_sync.
        2. send rd.persisted_messages — ONLY after step 1 is durable: they
           promise durable state (vote grants, append acks).
           rd.messages may be sent at any time, even before step 1 (the
           leader's MsgApp and heartbeats; thesis §10.2.1: the leader writes
           its log in parallel with replicating it).
        3. apply rd.snapshot (if any) then rd.committed_entries, in order, to
           the state machine; for a CONF_CHANGE(_V2) entry call
           apply_conf_change(decoded change) as part of applying it.
        4. node.advance(rd)

advance() tells the core that the Ready is durable and applied. It turns that
into local steps (etcd's stepsOnAdvance): the unstable entries become stable,
our own vote response is counted (a candidate counts itself only once its
vote is durable) and the leader's own append acknowledgement is stepped, so a
leader counts itself toward commitment only for entries it has persisted.
Between ready() and advance() the application may keep calling step/tick/
propose; it must not call ready() again before advance().

Errors: propose()/propose_batch()/read_index()/transfer_leader() raise ProposalDropped when
there is no leader, a transfer is in progress, or limits are hit. step() raises
StepError for messages that cannot come from a correct peer; proposals or
reads forwarded by other nodes that cannot be served are silently dropped
(the originating client times out and retries).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from ..invariant import invariant
from . import quiesce
from . import raft_leader as leader
from .codec import MAX_ENTRIES_PER_MESSAGE, conf_change_entry_data
from .config import Config
from .progress import ProgressState
from .raft import Raft
from .storage import Storage
from .types import (
    FORWARDED_MESSAGES,
    LOCAL_MESSAGES,
    NONE,
    RESPONSE_MESSAGES,
    ConfChange,
    ConfChangeV2,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType as MT,
    ProposalDropped,
    Ready,
    SoftState,
    StateRole,
    StepError,
)

_NORMAL = EntryType.NORMAL


@dataclass(frozen=True, slots=True)
class ProgressStatus:
    match: int
    next: int
    state: ProgressState
    is_learner: bool
    recent_active: bool
    inflight: int


@dataclass(frozen=True, slots=True)
class Status:
    id: int
    hard_state: HardState
    soft_state: SoftState
    applied: int
    lead_transferee: int
    conf_state: ConfState
    progress: dict = field(default_factory=dict)  # id -> ProgressStatus; leader only


class RawNode:
    def __init__(self, config: Config, storage: Storage) -> None:
        self.raft = Raft(config, storage)
        self.id = config.id
        self._prev_soft = self.raft.soft_state()
        self._prev_hard = self.raft.hard_state()
        self._outstanding: Optional[Ready] = None  # the Ready handed out, awaiting advance()
        self._steps_on_advance: list[Message] = []

    # ------------------------------------------------ inputs

    def tick(self) -> None:
        self.raft.tick()

    def campaign(self) -> None:
        self.raft.step(Message(MT.HUP, frm=self.id))

    def propose(self, data: bytes) -> None:
        """Propose one command; raises ProposalDropped (see module doc) if it cannot be taken.

        Several propose() calls between two Readies already share one MsgApp per follower and
        one durable write; propose_batch() also saves the per-call step through the core.
        """
        self.raft.step(Message(MT.PROP, frm=self.id, entries=(Entry(0, 0, _NORMAL, bytes(data)),)))

    def propose_batch(self, datas: Sequence[bytes]) -> None:
        """Propose many commands as ONE proposal: "many client commands -> one append".

        The commands become consecutive log entries in the order given, appended together by
        the leader (or forwarded by a follower to the leader as one message). All or nothing:
        ProposalDropped is raised for the same reasons as propose() (no leader, leadership
        transfer in progress, leader removed, max_uncommitted_entries_size exceeded, forwarding
        disabled) and then none of the commands was appended. As for propose(), a batch that
        was accepted may still be lost before it commits (leader change); the client retries.
        Raises StepError for an empty batch or one over the wire codec's entries-per-message
        limit (it could not be forwarded).
        """
        n = len(datas)
        if n == 0 or n > MAX_ENTRIES_PER_MESSAGE:
            raise StepError(f"proposal batch of {n} entries (1..{MAX_ENTRIES_PER_MESSAGE})", MT.PROP, self.id)
        ents = tuple([Entry(0, 0, _NORMAL, bytes(d)) for d in datas])
        self.raft.step(Message(MT.PROP, frm=self.id, entries=ents))

    def propose_conf_change(self, cc: Union[ConfChange, ConfChangeV2]) -> None:
        etype, data = conf_change_entry_data(cc)
        self.raft.step(Message(MT.PROP, frm=self.id, entries=(Entry(0, 0, etype, data),)))

    def step(self, m: Message) -> None:
        """Deliver a message from a peer."""
        if m.type in LOCAL_MESSAGES:
            raise StepError("local message received from the network", m.type, m.frm)
        if m.to != self.id and m.to != NONE:
            raise StepError(f"message addressed to {m.to}", m.type, m.frm)
        # A forwarded proposal, read or transfer keeps its originator in `frm`, so one can come
        # back to its originator (two followers with stale leader hints bounce it; found by the
        # simulator). Every other message from ourselves over the network is a bug.
        if m.frm == NONE or (m.frm == self.id and m.type not in FORWARDED_MESSAGES):
            raise StepError("network message without a valid sender", m.type, m.frm)
        if m.type in RESPONSE_MESSAGES and m.frm not in self.raft.trk.progress:
            return  # a response from a node no longer in the configuration: irrelevant
        try:
            self.raft.step(m)
        except ProposalDropped:
            if m.type not in (MT.PROP, MT.READ_INDEX):
                raise
            # forwarded by another node: nobody here to tell; the client retries.

    def read_index(self, ctx: bytes) -> None:
        """Request a linearizable read; a ReadState(index, ctx) appears in a later Ready."""
        if not ctx:
            raise StepError("read_index needs a non-empty, unique context", MT.READ_INDEX, self.id)
        self.raft.step(Message(MT.READ_INDEX, context=bytes(ctx)))

    def transfer_leader(self, to: int) -> None:
        self.raft.step(Message(MT.TRANSFER_LEADER, frm=to))

    def apply_conf_change(self, cc: Union[ConfChange, ConfChangeV2]) -> ConfState:
        """Apply a committed conf change; raises ConfChangeError (identically on all replicas)."""
        return self.raft.apply_conf_change(cc)

    @property
    def quiesced(self) -> bool:
        """Asleep (quiesce.py): ticks are no-ops; the application need not tick us at all."""
        return self.raft.quiesced

    def wake(self, lease_expired: bool = False) -> None:
        """Resume ticking (quiesce.py). lease_expired: the leader's node is gone or no longer
        leads this group at our term, so grant votes at once and campaign within an election
        timeout."""
        quiesce.wake(self.raft, lease_expired)

    def report_unreachable(self, node_id: int) -> None:
        self.raft.step(Message(MT.UNREACHABLE, frm=node_id))

    def report_snapshot(self, node_id: int, ok: bool) -> None:
        self.raft.step(Message(MT.SNAP_STATUS, frm=node_id, reject=not ok))

    # ------------------------------------------------ outputs

    def has_ready(self) -> bool:
        r = self.raft
        leader.flush_pending_bcast(r)
        log = r.raft_log
        if r.msgs or r.msgs_after_append or r.read_states:
            return True
        if log.has_next_unstable_ents() or log.unstable.next_snapshot() is not None:
            return True
        if log.has_next_committed_ents():
            return True
        if r.lead != self._prev_soft.leader or r.state != self._prev_soft.role:
            return True
        hs = self._prev_hard
        return r.term != hs.term or r.vote != hs.vote or log.committed != hs.commit

    def ready(self) -> Ready:
        invariant(self._outstanding is None, "ready() called again before advance()")
        r = self.raft
        leader.flush_pending_bcast(r)
        log = r.raft_log
        soft = r.soft_state()
        hard = r.hard_state()
        entries = tuple(log.next_unstable_ents())
        snap = log.unstable.next_snapshot()
        committed = tuple(log.next_committed_ents())
        persisted = tuple(m for m in r.msgs_after_append if m.to != self.id)
        self_steps = [m for m in r.msgs_after_append if m.to == self.id]
        hard_changed = hard != self._prev_hard
        rd = Ready(
            soft_state=soft if soft != self._prev_soft else None,
            hard_state=hard if hard_changed else None,
            entries=entries,
            snapshot=snap,
            messages=tuple(r.msgs),
            persisted_messages=persisted,
            committed_entries=committed,
            read_states=tuple(r.read_states),
            must_sync=(bool(entries) or snap is not None
                       or hard.term != self._prev_hard.term or hard.vote != self._prev_hard.vote),
        )
        # Accept: everything in rd is now the application's responsibility.
        self._prev_soft = soft
        r.msgs = []
        r.msgs_after_append = []
        r.read_states = []
        self._steps_on_advance = self_steps
        log.unstable.accept_in_progress()
        if committed:
            log.accept_applying(committed[-1].index)
        self._outstanding = rd
        return rd

    def advance(self, rd: Ready) -> None:
        invariant(rd is self._outstanding, "advance() with a Ready that is not the outstanding one")
        self._outstanding = None
        r = self.raft
        if rd.hard_state is not None:
            self._prev_hard = rd.hard_state
        if rd.entries:
            last = rd.entries[-1]
            r.raft_log.stable_to(last.index, last.term)
        if rd.snapshot is not None:
            r.applied_snap(rd.snapshot)
        steps, self._steps_on_advance = self._steps_on_advance, []
        for m in steps:
            r.step(m)
        if rd.committed_entries:
            r.applied_to(rd.committed_entries[-1].index, leader.payload_size(rd.committed_entries))

    # ------------------------------------------------ introspection

    def status(self) -> Status:
        r = self.raft
        prs = {}
        if r.state == StateRole.LEADER:
            prs = {pid: ProgressStatus(pr.match, pr.next, pr.state, pr.is_learner, pr.recent_active,
                                       pr.inflights.count())
                   for pid, pr in r.trk.visit()}
        return Status(id=self.id, hard_state=r.hard_state(), soft_state=r.soft_state(),
                      applied=r.raft_log.applied, lead_transferee=r.lead_transferee,
                      conf_state=r.trk.conf_state(), progress=prs)
