"""A group's proposals (GroupDriver's part): queued by callers, given to the core as runs
(one append, one MsgApp per follower), matched to applied entries by (term, index), and
settled when leadership is lost (raft_driver.py's module docstring lists the outcomes).

A mixin of GroupDriver (raft_driver.py): it uses the driver's core (rn), options, stats,
host and read queue, and the fields it sets in __init__: _queue, _pending, _lead_term,
_orphaned_term, _orphan_ticks, _inflight.
"""
from __future__ import annotations

from typing import Any, Optional

from ..invariant import invariant
from ..raft.types import ProposalDropped as CoreProposalDropped, StateRole
from . import latency_trace
from .driver_api import NotLeader, ProposalDropped, UnknownOutcome
from .proposal import PROPOSED, QUEUED, Proposal
from .read_index import settle

# A deposed leader's proposals wait this many election timeouts (in ticks) for their entries'
# fate before they end UnknownOutcome (Proposals._check_leadership).
ORPHAN_WAIT_ELECTIONS = 2


class Proposals:
    async def _submit(self, data: bytes, cc, timeout: Optional[float]) -> Any:
        fut = self.host.loop.create_future()
        self._enqueue(data, cc, timeout, fut)
        return await fut

    def _enqueue(self, data: bytes, cc, timeout: Optional[float], fut, decoded: Any = None) -> None:
        self._check_usable()
        r = self.rn.raft
        if r.state != StateRole.LEADER:
            raise NotLeader(self.group_id, r.lead, r.term)
        if self._inflight >= self.options.max_inflight_proposals:
            raise ProposalDropped(self.group_id, f"{self._inflight} proposals in flight (limit)")
        p = Proposal(data, cc, fut, decoded)
        if timeout is not None:
            p.timer = self.host.loop.call_later(timeout, self._expire, p)
        self._queue.append(p)
        self._inflight += 1
        self.host.mark_dirty(self)

    def _check_usable(self) -> None:
        if self.closed or self.host.closing:
            raise ProposalDropped(self.group_id, "shutting down")
        if self.failed is not None:
            raise ProposalDropped(self.group_id, f"group failed: {self.failed!r}")

    def _expire(self, p: Proposal) -> None:
        if p.state == QUEUED:
            # Still in our queue: _propose_queued() skips it, so it never reaches the log.
            settle(p.fut, exc=ProposalDropped(self.group_id, "deadline passed before it was proposed"))
        else:
            # Stays in _pending (counted in flight) until its index is applied or leadership ends.
            settle(p.fut, exc=UnknownOutcome(self.group_id, "deadline passed", p.term, p.index))

    def _propose_queued(self) -> None:
        r = self.rn.raft
        q = self._queue
        if r.state != StateRole.LEADER:
            while q:
                p = q.popleft()
                self._done(p)
                settle(p.fut, exc=NotLeader(self.group_id, r.lead, r.term))
            return
        self._lead_term = r.term
        rn, log_ = self.rn, r.raft_log
        n = 0
        while q and n < self.options.max_proposals_per_ready:
            # Take a run of data proposals (stopping at a conf change): they enter the core as
            # ONE proposal — one append, one MsgApp per follower — the cheap path in the core.
            run = []
            while q and n + len(run) < self.options.max_proposals_per_ready and q[0].cc is None:
                p = q.popleft()
                if p.fut.done():  # expired or cancelled while queued: never proposed
                    self._done(p)
                    continue
                run.append(p)
            if not run:
                if not q or q[0].cc is None:
                    continue
                p = q.popleft()
                if p.fut.done():
                    self._done(p)
                    continue
                try:
                    rn.propose_conf_change(p.cc)
                except CoreProposalDropped as exc:
                    self._done(p)
                    settle(p.fut, exc=ProposalDropped(self.group_id, exc.reason))
                    continue
                run = [p]
            else:
                try:
                    rn.propose_batch([p.data for p in run])
                except CoreProposalDropped as exc:  # all or nothing: none was appended
                    for p in run:
                        self._done(p)
                        settle(p.fut, exc=ProposalDropped(self.group_id, exc.reason))
                    continue
            # A leader's propose appends synchronously at the end of its log, in order.
            last = log_.last_index()
            if latency_trace.ON:
                latency_trace.mark("propose", last)
            for i, p in enumerate(run):
                index = last - len(run) + 1 + i
                if index in self._pending:   # a lost leadership's proposal, cut from our log
                    self._end_orphan(index)
                invariant(log_.term(index) == r.term, "a proposal lands at an index of the leader's term")
                p.state, p.term, p.index = PROPOSED, r.term, index
                self._pending[index] = p
            n += len(run)
        self.stats.proposals += n
        if q:
            self.host.mark_dirty(self)  # the rest go into the next Ready

    def _done(self, p: Proposal) -> None:
        """p leaves our structures (it is resolved or about to be)."""
        self._inflight -= 1
        if p.timer is not None:
            p.timer.cancel()
        invariant(self._inflight >= 0, "in-flight proposal accounting")

    def _check_leadership(self) -> None:
        """Entries appended in a term we no longer lead may or may not commit. This replica
        learns which as it applies their indexes: the successor's log reaches it within a
        round trip or two (a transfer's successor holds every one of them). So they are
        settled by _apply (their result if the entry at their index is theirs, else
        ProposalDropped: it can never apply), and only those still unsettled after
        ORPHAN_WAIT_ELECTIONS election timeouts of ticks (this replica cut off) end
        UnknownOutcome; callers then retry elsewhere instead of waiting for a deadline."""
        r = self.rn.raft
        if self._pending and (r.state != StateRole.LEADER or r.term != self._lead_term) \
                and self._orphaned_term != self._lead_term:
            self._orphaned_term = self._lead_term
            self._orphan_ticks = ORPHAN_WAIT_ELECTIONS * self.options.election_tick
        if self._reads.in_round:
            self._reads.fail_stale(r.term, r.lead)

    def _end_orphan(self, index: int) -> None:
        """Our new log reuses the index of a lost leadership's proposal, whose entry was
        truncated from it: another replica may still hold (and commit) it."""
        invariant(self._pending[index].term != self.rn.raft.term, "a proposal of this term at a reused index")
        self._end_unknown(index, "its index was reused")

    def _end_unknown(self, index: int, reason: str) -> None:
        """Proposal `index` leaves _pending with UnknownOutcome: it may or may not apply."""
        p = self._pending.pop(index)
        self._done(p)
        settle(p.fut, exc=UnknownOutcome(self.group_id, reason, p.term, p.index))

    def _end_orphans_beyond_log(self) -> None:
        """Quiesced: no tick will come to end the wait, and this replica's log is the leader's,
        all committed. A lost leadership's proposal at an index within it is settled when that
        index applies; one beyond it has no entry here to wait for: UnknownOutcome now (what
        the wait would end in), not at its deadline."""
        last, term = self.rn.raft.raft_log.last_index(), self.rn.raft.term
        for index in [i for i, p in self._pending.items() if i > last and p.term != term]:
            self._end_unknown(index, "leadership lost; the group went quiet without its entry")
        if all(p.term == term for p in self._pending.values()):
            self._orphan_ticks = 0

    def _count_orphan_ticks(self, n: int) -> None:
        """n ticks passed: past the wait, the proposals of a lost leadership end UnknownOutcome."""
        self._orphan_ticks -= n
        if self._orphan_ticks > 0:
            return
        self._orphan_ticks = 0
        r = self.rn.raft
        current = r.term if r.state == StateRole.LEADER else None
        reason = f"leadership lost (now term {r.term}, leader {r.lead or 'unknown'})"
        for index in [i for i, p in self._pending.items() if p.term != current]:
            self._end_unknown(index, reason)

    def _fail_pending(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            self._done(p)
            settle(p.fut, exc=UnknownOutcome(self.group_id, reason, p.term, p.index))
