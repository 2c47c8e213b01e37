"""The Raft state machine of one group member (etcd raft.go, in Python).

Pure: no clock (time advances by tick()), no I/O (messages are queued in
`msgs` / `msgs_after_append` and handed out by RawNode.ready()), randomness only
from the injected rng. The leader-only logic lives in raft_leader.py.

Message queues:
  msgs              — may be sent before the current unstable state is durable
  msgs_after_append — promise durable state (vote grants, append acks): sent
                      only after the Ready holding that state is persisted;
                      those addressed to ourselves are stepped at advance().
"""
from __future__ import annotations

import enum
from typing import Optional

from ..invariant import invariant
from . import confchange
from . import quiesce
from . import raft_leader as leader
from .codec import MAX_SNAPSHOT_DATA_BYTES, CodecError, decode_conf_change_entry, encode_conf_change_v2
from .config import Config
from .log import RaftLog
from .progress import ProgressState
from .quorum import VoteResult
from .read_only import ReadOnly
from .storage import Storage
from .tracker import ProgressTracker, TrackerConfig
from .types import (
    NONE,
    ConfChange,
    ConfChangeV2,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType as MT,
    ProposalDropped,
    ReadState,
    Snapshot,
    SoftState,
    StateRole,
    StepError,
    StorageStateError,
    message_with,
)

CAMPAIGN_TRANSFER = b"CampaignTransfer"  # VOTE context: leadership transfer overrides the lease
_AFTER_APPEND = frozenset({MT.APP_RESP, MT.VOTE_RESP, MT.PRE_VOTE_RESP})
_VOTE_TYPES = frozenset({MT.VOTE, MT.VOTE_RESP, MT.PRE_VOTE, MT.PRE_VOTE_RESP})


class CampaignType(enum.Enum):
    PRE_ELECTION = 0
    ELECTION = 1
    TRANSFER = 2


class SnapshotReceiver:
    """Follower side of a chunked snapshot: chunks may arrive in any order, or twice.

    The network reorders messages, and the leader sends a window of chunks at once,
    so requiring in-order arrival livelocked catch-up (found by the simulator: every
    resend was reordered again). Chunks are kept by offset until they cover [0, total)
    contiguously; `prefix` is how far they do, which the follower acknowledges after
    each chunk (SNAP_STATUS, not reject, chunk_offset = prefix) so the leader can send
    the next ones (snapshot_send.SnapshotSend). A chunk of another snapshot starts over.
    When the last chunk arrives with a gap before it, the follower asks for a resend
    (SNAP_STATUS reject) but keeps what it has.
    """

    __slots__ = ("meta", "total", "chunks", "held", "done", "prefix")

    def __init__(self) -> None:
        self.meta = None  # metadata of the snapshot being assembled; None if idle
        self.total = 0  # its total data length (<= codec MAX_SNAPSHOT_DATA_BYTES)
        self.chunks: dict[int, bytes] = {}  # offset -> chunk data
        self.held = 0  # bytes in `chunks`. Invariant: <= 2 * total (reset beyond)
        self.done = None  # metadata of the last snapshot assembled: its late chunks are ignored
        self.prefix = 0  # chunks cover [0, prefix) contiguously. Invariant: <= total

    def reset(self) -> None:
        self.meta, self.total, self.chunks, self.held, self.prefix = None, 0, {}, 0, 0

    def add(self, meta, total: int, offset: int, data: bytes) -> Optional[bytes]:
        """Store one chunk; the whole snapshot data once every byte has arrived, else None."""
        if self.meta != meta or self.total != total:
            self.reset()
            self.meta, self.total = meta, total
        if offset not in self.chunks:
            if self.held + len(data) > 2 * total:
                self.reset()  # chunkings that do not line up: start over rather than grow
                self.meta, self.total = meta, total
            self.chunks[offset] = data
            self.held += len(data)
        while self.prefix < total:
            part = self.chunks.get(self.prefix)
            if not part:
                return None
            self.prefix += len(part)
        pos, parts = 0, []
        while pos < total:
            part = self.chunks[pos]
            parts.append(part)
            pos += len(part)
        self.reset()
        self.done = meta
        return b"".join(parts)[:total]


class Raft:
    def __init__(self, cfg: Config, storage: Storage) -> None:
        cfg.validate()
        self.id = cfg.id
        self.cfg = cfg
        self.rng = cfg.rng
        self.raft_log = RaftLog(storage, cfg.max_committed_size_per_ready)
        self.term = 0  # Invariant: never decreases
        self.vote = NONE
        self.lead = NONE
        self.state = StateRole.FOLLOWER
        self.is_learner = False
        self.trk = ProgressTracker(cfg.max_inflight_msgs, cfg.max_inflight_bytes)
        self.msgs: list[Message] = []
        self.msgs_after_append: list[Message] = []
        self.read_states: list[ReadState] = []
        self.lead_transferee = NONE
        self.pending_conf_index = 0  # a conf change at or below this index may be unapplied
        self.uncommitted_size = 0  # leader: payload bytes appended but not yet committed
        self.read_only = ReadOnly(cfg.read_only_option)
        self.pending_read_index_messages: list[Message] = []  # reads before the term's first commit
        self.pending_bcast = False  # leader: proposals appended, MsgApp not yet broadcast
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.election_timeout = cfg.election_tick
        self.heartbeat_timeout = cfg.heartbeat_tick
        self.randomized_election_timeout = cfg.election_tick
        self.check_quorum = cfg.check_quorum
        self.pre_vote = cfg.pre_vote
        self.snap_rx = SnapshotReceiver()
        self.snap_sends: dict = {}  # leader: follower id -> snapshot_send.SnapshotSend in progress
        self.quiesced = False  # no ticks, no heartbeats until a message wakes us (quiesce.py)

        hs, cs = storage.initial_state()
        cfg_, prs = confchange.restore(self.trk, self.raft_log.last_index(), cs)
        self.switch_to_config(cfg_, prs)
        if hs != HardState():
            self.load_state(hs)
        if cfg.applied > 0:
            if cfg.applied > self.raft_log.committed:
                raise StorageStateError("config.applied beyond the durable commit index",
                                        applied=cfg.applied, commit=self.raft_log.committed)
            self.raft_log.applied_to(cfg.applied)
        self.become_follower(self.term, NONE)

    # ------------------------------------------------ state accessors

    def soft_state(self) -> SoftState:
        return SoftState(self.lead, self.state)

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.raft_log.committed)

    def load_state(self, hs: HardState) -> None:
        log = self.raft_log
        if hs.commit < log.committed or hs.commit > log.last_index():
            raise StorageStateError("hard state commit out of range", commit=hs.commit,
                                    first_index=log.first_index(), last_index=log.last_index())
        log.committed = hs.commit
        self.term = hs.term
        self.vote = hs.vote

    def promotable(self) -> bool:
        pr = self.trk.progress.get(self.id)
        return pr is not None and not pr.is_learner and not self.raft_log.has_pending_snapshot()

    def past_election_timeout(self) -> bool:
        return self.election_elapsed >= self.randomized_election_timeout

    def reset_randomized_election_timeout(self) -> None:
        self.randomized_election_timeout = self.election_timeout + self.rng.randrange(self.election_timeout)

    # ------------------------------------------------ sending

    def send(self, m: Message) -> None:
        # At most one copy per message (message_with), never dataclasses.replace: send is on
        # the per-proposal path (see types.message_with).
        t = m.type
        frm = m.frm if m.frm != NONE else self.id
        if t in _VOTE_TYPES:
            if m.term == 0:  # guarded: the f-string would be built on every send
                invariant(False, f"vote message {t.name} without a term")
            if frm != m.frm:
                m = message_with(m, m.to, frm, m.term)
        else:
            if m.term != 0:
                invariant(False, f"{t.name} with preset term {m.term}")
            if t != MT.PROP and t != MT.READ_INDEX:
                m = message_with(m, m.to, frm, self.term)
            elif frm != m.frm:
                # PROP and READ_INDEX are forwarded as local messages: no term attached.
                m = message_with(m, m.to, frm, 0)
        if t in _AFTER_APPEND:
            self.msgs_after_append.append(m)
        else:
            self.msgs.append(m)

    # ------------------------------------------------ role transitions

    def reset(self, term: int) -> None:
        if self.term != term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.quiesced = False
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.reset_randomized_election_timeout()
        self.lead_transferee = NONE
        self.trk.reset_votes()
        log = self.raft_log
        last = log.last_index()
        # We count ourselves only for entries we know to be durable (below the unstable tail).
        durable = log.unstable.offset - 1 if log.unstable.snapshot is None else 0
        for pid, pr in self.trk.progress.items():
            pr.match = min(durable, last) if pid == self.id else 0
            pr.next = last + 1
            pr.state = ProgressState.PROBE
            pr.pending_snapshot = 0
            pr.msg_app_flow_paused = False
            pr.recent_active = False
            pr.inflights.reset()
        self.pending_conf_index = 0
        self.uncommitted_size = 0
        self.pending_bcast = False
        self.read_only = ReadOnly(self.cfg.read_only_option)
        self.pending_read_index_messages = []
        self.snap_sends = {}

    def become_follower(self, term: int, lead: int) -> None:
        self.reset(term)
        self.lead = lead
        self.state = StateRole.FOLLOWER

    def become_candidate(self) -> None:
        invariant(self.state != StateRole.LEADER, "invalid transition leader -> candidate")
        self.reset(self.term + 1)
        self.vote = self.id
        self.state = StateRole.CANDIDATE

    def become_pre_candidate(self) -> None:
        invariant(self.state != StateRole.LEADER, "invalid transition leader -> pre-candidate")
        # No term change and no vote: a pre-election must not disturb anyone (§9.6).
        self.trk.reset_votes()
        self.lead = NONE
        self.state = StateRole.PRE_CANDIDATE

    def become_leader(self) -> None:
        invariant(self.state != StateRole.FOLLOWER, "invalid transition follower -> leader")
        self.reset(self.term)
        self.lead = self.id
        self.state = StateRole.LEADER
        pr = self.trk.progress[self.id]
        pr.become_replicate()
        pr.recent_active = True  # the leader is always active for CheckQuorum
        # The empty entry of this term: commits everything before it (§5.4.2, thesis §6.4).
        ok = leader.append_entry(self, [Entry(term=0, index=0)])
        invariant(ok, "empty entry refused by the uncommitted size limit")
        # Known fix for single-server changes (Ongaro, raft-dev 2015): no conf change may be
        # proposed before an entry of this term commits; the empty entry is that entry.
        self.pending_conf_index = self.raft_log.last_index()

    # ------------------------------------------------ ticks

    def tick(self) -> None:
        if self.quiesced:
            return  # asleep: only a message (or the application's wake()) restarts the clocks
        if self.state == StateRole.LEADER:
            leader.tick_heartbeat(self)
        else:
            self.tick_election()

    def tick_election(self) -> None:
        # O(1), no allocation unless the timeout fires: idle followers must be cheap.
        self.election_elapsed += 1
        if self.election_elapsed >= self.randomized_election_timeout and self.promotable():
            self.election_elapsed = 0
            self.step(Message(MT.HUP, frm=self.id))

    # ------------------------------------------------ elections

    def hup(self, t: CampaignType) -> None:
        if self.state == StateRole.LEADER or not self.promotable():
            return
        if self.has_unapplied_conf_changes():
            return  # campaigning now could use a configuration about to change
        self.campaign(t)

    def has_unapplied_conf_changes(self) -> bool:
        log = self.raft_log
        if log.applied >= log.committed:
            return False
        lo = max(log.applied, log.first_index() - 1) + 1
        for e in log.slice(lo, log.committed + 1):
            if e.type != EntryType.NORMAL:
                return True
        return False

    def campaign(self, t: CampaignType) -> None:
        if t == CampaignType.PRE_ELECTION:
            self.become_pre_candidate()
            vote_type, term = MT.PRE_VOTE, self.term + 1  # the term we would campaign in
        else:
            self.become_candidate()
            vote_type, term = MT.VOTE, self.term
        resp_type = MT.PRE_VOTE_RESP if vote_type == MT.PRE_VOTE else MT.VOTE_RESP
        last, last_term = self.raft_log.last_index(), self.raft_log.last_term()
        ctx = CAMPAIGN_TRANSFER if t == CampaignType.TRANSFER else b""
        for vid in self.trk.voter_nodes():
            if vid == self.id:
                # Our own vote counts only once our (term, vote) is durable: stepped at advance().
                self.send(Message(resp_type, to=self.id, term=term))
                continue
            self.send(Message(vote_type, to=vid, term=term, index=last, log_term=last_term, context=ctx))

    def poll(self, frm: int, granted: bool) -> VoteResult:
        self.trk.record_vote(frm, granted)
        return self.trk.tally_votes()[2]

    # ------------------------------------------------ step

    def step(self, m: Message) -> None:
        if self.quiesced and not quiesce.keeps_asleep(m):
            quiesce.wake(self, False)
        if m.term == 0:
            pass  # local message (or a forwarded proposal / read)
        elif m.term > self.term:
            if m.type in (MT.VOTE, MT.PRE_VOTE):
                force = m.context == CAMPAIGN_TRANSFER
                in_lease = (self.check_quorum and self.lead != NONE
                            and self.election_elapsed < self.election_timeout)
                if not force and in_lease:
                    return  # we heard from a live leader recently: ignore the disruption (§4.2.3)
            if m.type == MT.PRE_VOTE:
                pass  # never change term for a pre-vote
            elif m.type == MT.PRE_VOTE_RESP and not m.reject:
                pass  # granted pre-votes carry the future term; adopt it only on winning
            elif m.type in (MT.APP, MT.HEARTBEAT, MT.SNAP):
                self.become_follower(m.term, m.frm)
            else:
                self.become_follower(m.term, NONE)
        elif m.term < self.term:
            if (self.check_quorum or self.pre_vote) and m.type in (MT.HEARTBEAT, MT.APP):
                # A stale leader (e.g. partitioned) learns our term and steps down, so that
                # our pre-votes / lease do not leave the cluster stuck.
                self.send(Message(MT.APP_RESP, to=m.frm))
            elif m.type == MT.PRE_VOTE:
                self.send(Message(MT.PRE_VOTE_RESP, to=m.frm, term=self.term, reject=True))
            return

        if m.type == MT.HUP:
            self.hup(CampaignType.PRE_ELECTION if self.pre_vote else CampaignType.ELECTION)
        elif m.type in (MT.VOTE, MT.PRE_VOTE):
            self._handle_vote_request(m)
        elif self.state == StateRole.LEADER:
            leader.step_leader(self, m)
        elif self.state in (StateRole.CANDIDATE, StateRole.PRE_CANDIDATE):
            self.step_candidate(m)
        else:
            self.step_follower(m)

    def _handle_vote_request(self, m: Message) -> None:
        can_vote = (self.vote == m.frm
                    or (self.vote == NONE and self.lead == NONE)
                    or (m.type == MT.PRE_VOTE and m.term > self.term))
        resp = MT.PRE_VOTE_RESP if m.type == MT.PRE_VOTE else MT.VOTE_RESP
        if can_vote and self.raft_log.is_up_to_date(m.index, m.log_term):
            # Reply with the request's term: a pre-vote grant must be recognised at that term.
            self.send(Message(resp, to=m.frm, term=m.term))
            if m.type == MT.VOTE:
                self.election_elapsed = 0
                self.vote = m.frm
        else:
            self.send(Message(resp, to=m.frm, term=self.term, reject=True))

    def step_candidate(self, m: Message) -> None:
        my_resp = MT.PRE_VOTE_RESP if self.state == StateRole.PRE_CANDIDATE else MT.VOTE_RESP
        if m.type == MT.PROP:
            raise ProposalDropped("no leader (campaigning)", self.id, self.term)
        if m.type == MT.APP:
            self.become_follower(m.term, m.frm)
            self.handle_append_entries(m)
        elif m.type == MT.HEARTBEAT:
            self.become_follower(m.term, m.frm)
            self.handle_heartbeat(m)
        elif m.type == MT.SNAP:
            self.become_follower(m.term, m.frm)
            self.handle_snapshot(m)
        elif m.type == my_resp:
            res = self.poll(m.frm, not m.reject)
            if res == VoteResult.WON:
                if self.state == StateRole.PRE_CANDIDATE:
                    self.campaign(CampaignType.ELECTION)
                else:
                    self.become_leader()
                    leader.bcast_append(self)
            elif res == VoteResult.LOST:
                # A rejection carries a term >= ours; it was adopted above when higher.
                self.become_follower(self.term, NONE)

    def step_follower(self, m: Message) -> None:
        t = m.type
        if t == MT.PROP:
            if self.lead == NONE:
                raise ProposalDropped("no leader", self.id, self.term)
            if self.cfg.disable_proposal_forwarding:
                raise ProposalDropped("proposal forwarding disabled", self.id, self.term)
            self.send(message_with(m, self.lead, m.frm, m.term))
        elif t in (MT.APP, MT.HEARTBEAT, MT.SNAP):
            self.election_elapsed = 0
            self.lead = m.frm
            if t == MT.APP:
                self.handle_append_entries(m)
            elif t == MT.HEARTBEAT:
                self.handle_heartbeat(m)
            else:
                self.handle_snapshot(m)
        elif t == MT.TRANSFER_LEADER:
            if self.lead != NONE:
                self.send(message_with(m, self.lead, m.frm, m.term))
        elif t == MT.TIMEOUT_NOW:
            # Leadership transfer never uses pre-vote: the old leader asked us to campaign.
            self.hup(CampaignType.TRANSFER)
        elif t == MT.READ_INDEX:
            if self.lead == NONE:
                raise ProposalDropped("no leader for read index", self.id, self.term)
            self.send(message_with(m, self.lead, m.frm, m.term))
        elif t == MT.READ_INDEX_RESP:
            self.read_states.append(ReadState(m.index, m.context))

    # ------------------------------------------------ follower handlers

    def handle_append_entries(self, m: Message) -> None:
        log = self.raft_log
        prev = m.index
        ents = m.entries
        if ents:
            # Indexes prev+1.. consecutive, terms non-decreasing and <= the leader's term; as
            # list comparisons (C loops), not a Python loop per entry: MsgApps carry thousands.
            terms = [e.term for e in ents]
            if ([e.index for e in ents] != list(range(prev + 1, prev + 1 + len(ents)))
                    or terms[-1] > m.term or terms != sorted(terms)):
                raise StepError("MsgApp entries not consecutive or terms out of order", m.type, m.frm)
            if terms[0] < m.log_term:
                raise StepError("MsgApp first entry term below log_term", m.type, m.frm)
        if prev < log.committed:
            # Everything up to committed is already ours; never re-examine (or truncate) it.
            self.send(Message(MT.APP_RESP, to=m.frm, index=log.committed))
            return
        last_new = log.maybe_append(prev, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self.send(Message(MT.APP_RESP, to=m.frm, index=last_new))
            return
        # Reject with a hint: our largest index <= prev whose term <= the leader's log_term, so
        # the leader can skip a whole term of mismatching entries per round trip (§5.3).
        hint = min(prev, log.last_index())
        hint, hint_term = log.find_conflict_by_term(hint, m.log_term)
        self.send(Message(MT.APP_RESP, to=m.frm, index=prev, reject=True,
                          reject_hint=hint, log_term=hint_term))

    def handle_heartbeat(self, m: Message) -> None:
        if m.commit > self.raft_log.last_index():
            raise StepError("heartbeat commit beyond our log", m.type, m.frm)
        self.raft_log.commit_to(m.commit)
        ctx = m.context
        if ctx == quiesce.QUIESCE_CTX:
            ctx = quiesce.follower_quiesce(self, m)
        self.send(Message(MT.HEARTBEAT_RESP, to=m.frm, context=ctx))

    def handle_snapshot(self, m: Message) -> None:
        if m.snapshot is None:
            raise StepError("MsgSnap without a snapshot", m.type, m.frm)
        if m.snapshot.metadata.index <= self.raft_log.committed:
            # It adds nothing (restore() would refuse it): say so at the first chunk. Silence
            # stranded the leader, whose window waits for acks (the simulator's seed 9651458: a
            # new leader re-sent the snapshot this follower had installed long before).
            self.send(Message(MT.APP_RESP, to=m.frm, index=self.raft_log.committed))
            return
        snap = self._assemble_snapshot(m)
        if snap is None:
            return
        if self.restore(snap):
            self.send(Message(MT.APP_RESP, to=m.frm, index=self.raft_log.last_index()))
        else:
            self.snap_rx.done = None  # not installed (e.g. deferred): a resend must be assembled again
            self.send(Message(MT.APP_RESP, to=m.frm, index=self.raft_log.committed))

    def _assemble_snapshot(self, m: Message) -> Optional[Snapshot]:
        rx = self.snap_rx
        chunk = m.snapshot
        meta = chunk.metadata
        if m.chunk_offset + len(chunk.data) > m.chunk_total or m.chunk_total > MAX_SNAPSHOT_DATA_BYTES:
            raise StepError("snapshot chunk extends past chunk_total or over the size limit",
                            m.type, m.frm)
        if m.chunk_offset == 0 and len(chunk.data) == m.chunk_total:
            return chunk  # unchunked (single message); a partial assembly stays as it is
        if rx.done == meta:
            return None  # a late or duplicated chunk of a snapshot already handed to restore()
        data = rx.add(meta, m.chunk_total, m.chunk_offset, chunk.data)
        if data is not None:
            return Snapshot(meta, data)
        # Acknowledge how far the chunks reach, so the leader sends the next window. If the last
        # chunk came and a piece is still missing (probably lost), reject: the leader sends the
        # snapshot again from the prefix; what we hold is kept, so the resend only fills gaps.
        last = m.chunk_offset + len(chunk.data) == m.chunk_total
        self.send(Message(MT.SNAP_STATUS, to=m.frm, index=meta.index, reject=last,
                          chunk_offset=rx.prefix, chunk_total=m.chunk_total))
        return None

    def restore(self, s: Snapshot) -> bool:
        """Install a snapshot from the leader; False if it adds nothing."""
        meta = s.metadata
        log = self.raft_log
        if meta.index <= log.committed:
            return False
        if self.state != StateRole.FOLLOWER:
            # Only a leader of a higher term could send it; step down safely and ignore it.
            self.become_follower(self.term + 1, NONE)
            return False
        if log.applying > log.applied:
            # Committed entries handed out in a Ready are being applied right now; replacing the
            # log and the configuration under them would make the application apply an old conf
            # change on top of the snapshot's configuration (found by the simulator). The leader
            # retries the snapshot later.
            return False
        cs = meta.conf_state
        in_snapshot = self.id in cs.voters or self.id in cs.learners or self.id in cs.voters_outgoing
        if not in_snapshot and not self._joining(cs):
            return False  # stale or misdirected: we were removed, or it is not for us
        if log.match_term(meta.index, meta.term):
            # We already hold this prefix: just move commit forward.
            log.commit_to(meta.index)
            return False
        log.restore(s)
        self.trk = ProgressTracker(self.cfg.max_inflight_msgs, self.cfg.max_inflight_bytes)
        cfg, prs = confchange.restore(self.trk, log.last_index(), cs)
        got = self.switch_to_config(cfg, prs)
        invariant(got.voters == cs.voters and got.learners == cs.learners,
                  "conf state after restore differs from the snapshot's")
        pr = self.trk.progress.get(self.id)
        if pr is not None:
            pr.maybe_update(pr.next - 1)
        return True

    def _joining(self, cs: ConfState) -> bool:
        """True if we are a node being added that has not applied the change adding it yet.

        A snapshot whose ConfState lacks us is normally stale or misdirected, and refused.
        But the leader sends MsgSnap only to members of its configuration, and its latest
        snapshot may predate the conf change that added us: a new node must take it, and
        the entries after it bring the change (bug 1 in docs/simulator.md). That holds for
        as long as we are outside our own configuration, not only while our log is empty:
        a new node that installed one such snapshot and then lost the entries after it may
        be sent another one that still predates the change (a new leader's snapshot taken
        as a follower, or a compaction in between). Refusing it stranded the node for good
        (bug 10). A node that was removed (our or the snapshot's `removed` holds us) keeps
        refusing: IDs are never reused, so it can never be a member again.
        """
        nid = self.id
        return nid not in self.trk.progress and nid not in self.trk.config.removed and nid not in cs.removed

    # ------------------------------------------------ membership

    def apply_conf_change(self, cc: ConfChange | ConfChangeV2) -> ConfState:
        changer = confchange.Changer(self.trk, self.raft_log.last_index())
        cfg, prs = changer.apply_v2(cc.as_v2())
        return self.switch_to_config(cfg, prs)

    def switch_to_config(self, cfg: TrackerConfig, prs: dict) -> ConfState:
        self.trk.config = cfg
        self.trk.progress = prs
        cs = self.trk.conf_state()
        pr = prs.get(self.id)
        self.is_learner = pr is not None and pr.is_learner
        if self.state != StateRole.LEADER:
            return cs
        if pr is None or pr.is_learner:
            # Removed or demoted leader: C_new is committed (we apply only committed entries),
            # so stepping down now is safe (thesis §4.2.2).
            self.become_follower(self.term, NONE)
            return cs
        if leader.maybe_commit(self):
            leader.bcast_append(self)
        else:
            for pid, _ in self.trk.visit():
                if pid != self.id:
                    leader.maybe_send_append(self, pid, send_if_empty=False)
        if self.lead_transferee != NONE and self.lead_transferee not in cfg.voters.ids():
            self.lead_transferee = NONE
        return cs

    def validate_conf_change_entry(self, e: Entry) -> str:
        """Why the leader must not append this conf change now ('' if it may)."""
        try:
            cc = decode_conf_change_entry(e).as_v2()
        except CodecError as exc:
            return f"undecodable conf change: {exc}"
        joint = self.trk.config.joint()
        if self.pending_conf_index > self.raft_log.applied:
            return (f"possible unapplied conf change at index {self.pending_conf_index} "
                    f"(applied {self.raft_log.applied})")
        if joint and not cc.leave_joint():
            return "must transition out of joint config first"
        if not joint and cc.leave_joint():
            return "not in joint state; refusing empty conf change"
        try:
            confchange.Changer(self.trk, self.raft_log.last_index()).apply_v2(cc)
        except Exception as exc:  # ConfChangeError: would be rejected by every replica on apply
            return str(exc)
        return ""

    # ------------------------------------------------ application feedback

    def applied_to(self, index: int, payload_bytes: int) -> None:
        log = self.raft_log
        log.applied_to(max(index, log.applied))
        self.uncommitted_size = max(0, self.uncommitted_size - payload_bytes)
        if (self.trk.config.auto_leave and self.state == StateRole.LEADER
                and log.applied >= self.pending_conf_index):
            # The joint config is committed and applied: propose leaving it (thesis §4.3).
            leave = encode_conf_change_v2(ConfChangeV2())
            try:
                self.step(Message(MT.PROP, frm=self.id,
                                  entries=(Entry(0, 0, EntryType.CONF_CHANGE_V2, leave),)))
            except ProposalDropped:
                pass  # e.g. a transfer in progress; retried on the next applied_to

    def applied_snap(self, snap: Snapshot) -> None:
        index = snap.metadata.index
        self.raft_log.stable_snap_to(index)
        self.raft_log.applied_to(index)
