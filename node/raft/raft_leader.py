"""Leader behaviour: replication, commitment, heartbeats, ReadIndex, transfer.

Functions over a Raft (raft.py) rather than methods, to keep each file small.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..invariant import invariant
from . import quiesce, snapshot_send
from .progress import ProgressState
from .quorum import VoteResult
from .read_only import ReadOnlyOption
from .storage import payload_size as storage_payload_size
from .types import (
    NONE,
    Compacted,
    Entry,
    EntryType,
    Message,
    MessageType as MT,
    ProposalDropped,
    ReadState,
    SnapshotTemporarilyUnavailable,
    StateRole,
    StepError,
    Unavailable,
)

if TYPE_CHECKING:
    from .raft import Raft

MAX_PENDING_READ_INDEX_MESSAGES = 4096  # reads waiting for the term's first commit


payload_size = storage_payload_size  # sum of len(e.data); re-exported for rawnode


# ------------------------------------------------------------------ ticks


def tick_heartbeat(r: "Raft") -> None:
    r.heartbeat_elapsed += 1
    r.election_elapsed += 1
    if r.election_elapsed >= r.election_timeout:
        r.election_elapsed = 0
        if r.check_quorum:
            r.step(Message(MT.CHECK_QUORUM, frm=r.id))
        if r.state == StateRole.LEADER and r.lead_transferee != NONE:
            r.lead_transferee = NONE  # transfer did not finish within an election timeout
    if r.state != StateRole.LEADER:
        return
    if r.heartbeat_elapsed >= r.heartbeat_timeout:
        r.heartbeat_elapsed = 0
        if r.cfg.quiesce and quiesce.quiescable(r):
            quiesce.quiesce_leader(r)  # the last heartbeat until something happens
            return
        r.step(Message(MT.BEAT, frm=r.id))


# ------------------------------------------------------------------ appending / sending


def append_entry(r: "Raft", es) -> bool:
    """Append proposals at the end of the leader's log; False if over the uncommitted limit.

    All or nothing: nothing is appended when the batch is refused.
    """
    size = payload_size(es)
    limit = r.cfg.max_uncommitted_entries_size
    if limit > 0 and r.uncommitted_size > 0 and size > 0 and r.uncommitted_size + size > limit:
        return False  # (a single oversized batch is still admitted when nothing is pending)
    log = r.raft_log
    first = log.last_index() + 1
    term = r.term
    li = log.append([Entry(term, i, e.type, e.data) for i, e in enumerate(es, first)])
    r.uncommitted_size += size
    # Self-acknowledgement, delivered at advance() once these entries are durable. Proposals
    # appended between two Readies share one: all of them become durable in the same Ready,
    # and an ack of index li subsumes the acks of every index below it (Progress.maybe_update
    # only moves match forward). Without this, N propose() calls stepped N self-acks at
    # advance(), each recomputing the commit index.
    after = r.msgs_after_append
    if after:
        prev = after[-1]
        if (prev.type == MT.APP_RESP and prev.to == r.id and prev.term == term
                and not prev.reject):
            after[-1] = Message(MT.APP_RESP, to=r.id, frm=r.id, term=term, index=li)  # as send() builds it
            return True
    r.send(Message(MT.APP_RESP, to=r.id, index=li))
    return True


def flush_pending_bcast(r: "Raft") -> None:
    """Broadcast proposals batched since the last Ready: one MsgApp per follower."""
    if r.pending_bcast:
        r.pending_bcast = False
        if r.state == StateRole.LEADER:
            for pid, _ in r.trk.visit():
                if pid != r.id:
                    maybe_send_append(r, pid, send_if_empty=False)


def maybe_send_append(r: "Raft", to: int, send_if_empty: bool) -> bool:
    pr = r.trk.progress[to]
    if pr.is_paused():
        return False
    log = r.raft_log
    prev_index = pr.next - 1
    try:
        prev_term = log.term(prev_index)
    except (Compacted, Unavailable):
        return maybe_send_snapshot(r, to)
    ents: list[Entry] = []
    if pr.state != ProgressState.REPLICATE or not pr.inflights.full():
        try:
            ents = log.entries(pr.next, r.cfg.max_size_per_msg)
        except Compacted:
            return maybe_send_snapshot(r, to)
    if not ents and not send_if_empty:
        return False
    r.send(Message(MT.APP, to=to, index=prev_index, log_term=prev_term, entries=tuple(ents),
                   commit=log.committed))
    pr.sent_entries(len(ents), payload_size(ents))
    return True


def send_append(r: "Raft", to: int) -> None:
    maybe_send_append(r, to, send_if_empty=True)


def maybe_send_snapshot(r: "Raft", to: int) -> bool:
    pr = r.trk.progress[to]
    if not pr.recent_active:
        return False  # don't push a large snapshot at a peer that may be down
    try:
        snap = r.raft_log.snapshot()
    except SnapshotTemporarilyUnavailable:
        return False
    invariant(not snap.is_empty(), "need a non-empty snapshot to catch up a follower")
    pr.become_snapshot(snap.metadata.index)
    snapshot_send.start(r, to, snap)  # a window of chunks; the rest as the follower acks
    return True


def send_heartbeat(r: "Raft", to: int, ctx: bytes) -> None:
    # Never tell a follower to commit beyond what it is known to hold.
    commit = min(r.trk.progress[to].match, r.raft_log.committed)
    r.send(Message(MT.HEARTBEAT, to=to, commit=commit, context=ctx))


def bcast_append(r: "Raft") -> None:
    for pid, _ in r.trk.visit():
        if pid != r.id:
            send_append(r, pid)


def bcast_heartbeat(r: "Raft", ctx: Optional[bytes] = None) -> None:
    if ctx is None:
        ctx = r.read_only.last_pending_request_ctx()
    for pid, _ in r.trk.visit():
        if pid != r.id:
            send_heartbeat(r, pid, ctx)


def maybe_commit(r: "Raft") -> bool:
    # Only an entry of the current term is committed by counting replicas (§5.4.2).
    return r.raft_log.maybe_commit(r.trk.committed(), r.term)


# ------------------------------------------------------------------ reads


def committed_entry_in_current_term(r: "Raft") -> bool:
    return r.raft_log.term_or_zero(r.raft_log.committed) == r.term


def response_to_read_index_req(r: "Raft", req: Message, read_index: int) -> Optional[Message]:
    if req.frm in (NONE, r.id):
        r.read_states.append(ReadState(read_index, req.context))
        return None
    return Message(MT.READ_INDEX_RESP, to=req.frm, index=read_index, context=req.context)


def send_read_index_response(r: "Raft", m: Message) -> None:
    if r.read_only.option == ReadOnlyOption.SAFE:
        if not r.read_only.add_request(r.raft_log.committed, m):
            return  # duplicate context or too many pending reads: the client retries
        r.read_only.recv_ack(r.id, m.context)
        bcast_heartbeat(r, m.context)
    else:
        resp = response_to_read_index_req(r, m, r.raft_log.committed)
        if resp is not None:
            r.send(resp)


def release_pending_read_index_messages(r: "Raft") -> None:
    if not r.pending_read_index_messages or not committed_entry_in_current_term(r):
        return
    msgs, r.pending_read_index_messages = r.pending_read_index_messages, []
    for m in msgs:
        send_read_index_response(r, m)


# ------------------------------------------------------------------ step


def step_leader(r: "Raft", m: Message) -> None:
    t = m.type
    if t == MT.BEAT:
        bcast_heartbeat(r)
        return
    if t == MT.CHECK_QUORUM:
        if not r.trk.quorum_active():
            r.become_follower(r.term, NONE)  # lost contact with a quorum: stop serving
            return
        for pid, pr in r.trk.progress.items():
            if pid != r.id:
                pr.recent_active = False
        return
    if t == MT.PROP:
        _step_proposal(r, m)
        return
    if t == MT.READ_INDEX:
        if not m.context:
            raise StepError("read index with an empty context", t, m.frm)
        if r.trk.is_singleton():
            resp = response_to_read_index_req(r, m, r.raft_log.committed)
            if resp is not None:
                r.send(resp)
        elif not committed_entry_in_current_term(r):
            # §6.4: our commit index is only known current once an entry of our term commits.
            if len(r.pending_read_index_messages) < MAX_PENDING_READ_INDEX_MESSAGES:
                r.pending_read_index_messages.append(m)
        else:
            send_read_index_response(r, m)
        return

    pr = r.trk.progress.get(m.frm)
    if pr is None:
        return
    if t == MT.APP_RESP:
        _handle_append_response(r, m, pr)
    elif t == MT.HEARTBEAT_RESP:
        pr.recent_active = True
        pr.msg_app_flow_paused = False
        if pr.state == ProgressState.SNAPSHOT:
            snapshot_send.on_heartbeat_response(r, m.frm, pr)
        if pr.match < r.raft_log.last_index() or pr.state == ProgressState.PROBE:
            send_append(r, m.frm)
        if r.read_only.option != ReadOnlyOption.SAFE or not m.context:
            return
        acks = r.read_only.recv_ack(m.frm, m.context)
        if acks is None or r.trk.config.voters.vote_result(acks) != VoteResult.WON:
            return
        for rs in r.read_only.advance(m.context):
            resp = response_to_read_index_req(r, rs.req, rs.index)
            if resp is not None:
                r.send(resp)
    elif t == MT.SNAP_STATUS:
        if m.chunk_total > 0:  # from the follower (a local report has no range)
            if not m.reject:
                snapshot_send.on_ack(r, m, pr)
                return
            snapshot_send.note_holds(r, m)  # a broken transfer: the next attempt resumes there
        if pr.state != ProgressState.SNAPSHOT:
            return
        if m.reject:
            pr.pending_snapshot = 0  # failed: retry from scratch after a heartbeat interval
        pr.become_probe()
        # Success: wait for the follower's MsgAppResp; failure: wait for a heartbeat.
        pr.msg_app_flow_paused = True
    elif t == MT.UNREACHABLE:
        if pr.state == ProgressState.REPLICATE:
            pr.become_probe()
    elif t == MT.TRANSFER_LEADER:
        _step_transfer(r, m, pr)


def _step_proposal(r: "Raft", m: Message) -> None:
    if not m.entries:
        raise StepError("empty proposal", m.type, m.frm)
    if r.id not in r.trk.progress:
        raise ProposalDropped("leader removed from the configuration", r.id, r.term)
    if r.lead_transferee != NONE:
        raise ProposalDropped(f"leadership transfer to {r.lead_transferee} in progress", r.id, r.term)
    ents = m.entries
    if any([e.type for e in ents]):  # NORMAL is 0; conf changes are rare, batches are long
        ents = list(ents)
        for i, e in enumerate(ents):
            if e.type == EntryType.NORMAL:
                continue
            why = r.validate_conf_change_entry(e)
            if why:
                # Keep the batch's shape: an empty normal entry instead (as etcd does).
                ents[i] = Entry(0, 0, EntryType.NORMAL, b"")
            else:
                r.pending_conf_index = r.raft_log.last_index() + i + 1
    if not append_entry(r, ents):
        raise ProposalDropped("too many uncommitted bytes", r.id, r.term)
    r.pending_bcast = True  # batched: flushed when the application asks for a Ready


def _handle_append_response(r: "Raft", m: Message, pr) -> None:
    log = r.raft_log
    pr.recent_active = True
    if m.reject:
        if m.index > log.last_index():
            return  # we never sent that: ignore rather than corrupt progress
        next_probe = m.reject_hint
        if m.log_term > 0:
            # Skip every entry of ours whose term is above the follower's term at the hint.
            next_probe, _ = log.find_conflict_by_term(m.reject_hint, m.log_term)
        if pr.maybe_decr_to(m.index, next_probe):
            if pr.state == ProgressState.REPLICATE:
                pr.become_probe()
            send_append(r, m.frm)
        return
    if m.index > log.last_index():
        return  # an ack beyond our log cannot be genuine
    old_paused = pr.is_paused()
    if not (pr.maybe_update(m.index) or (pr.match == m.index and pr.state == ProgressState.PROBE)):
        return
    if pr.state == ProgressState.PROBE:
        pr.become_replicate()
    elif pr.state == ProgressState.SNAPSHOT and pr.match + 1 >= log.first_index():
        # The snapshot (or catch-up) brought it to where our log can take over.
        pr.become_probe()
        pr.become_replicate()
    elif pr.state == ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
        # The follower holds the snapshot we sent (its ack proves it), but our log was compacted
        # past it meanwhile. Waiting for report_snapshot would strand the follower for good if
        # that report never comes (etcd waits): probe now, which sends a newer snapshot below.
        pr.become_probe()
    elif pr.state == ProgressState.REPLICATE:
        pr.inflights.free_le(m.index)
    if r.snap_sends and pr.state != ProgressState.SNAPSHOT:
        snapshot_send.forget(r, m.frm)  # installed: what was kept for the send goes
    if maybe_commit(r):
        release_pending_read_index_messages(r)
        bcast_append(r)
    elif old_paused and m.frm != r.id:
        send_append(r, m.frm)
    if m.frm != r.id:
        while maybe_send_append(r, m.frm, send_if_empty=False):
            pass
    if m.frm == r.lead_transferee and pr.match == log.last_index():
        r.send(Message(MT.TIMEOUT_NOW, to=m.frm))  # target caught up: let it campaign now


def _step_transfer(r: "Raft", m: Message, pr) -> None:
    if pr.is_learner:
        return  # a learner cannot lead
    target = m.frm
    if r.lead_transferee != NONE:
        if r.lead_transferee == target:
            return  # same transfer already in progress
        r.lead_transferee = NONE
    if target == r.id:
        return  # already leader
    r.election_elapsed = 0  # the transfer must finish within one election timeout
    r.lead_transferee = target
    if pr.match == r.raft_log.last_index():
        r.send(Message(MT.TIMEOUT_NOW, to=target))
    else:
        send_append(r, target)

