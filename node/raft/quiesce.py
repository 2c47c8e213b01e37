"""Quiescence: an idle group stops ticking and heartbeating (CockroachDB's quiesced ranges).

Why: a node hosting many groups pays per group per tick (the leader's heartbeats and their
answers, the followers' election clocks) even when no group has anything to do; with 100
groups per node that was most of an idle node's CPU (bench/README.md, "Idle groups").

The protocol, all of it timers-as-messages inside the pure core (Config.quiesce enables it):

  * A leader whose heartbeat is due and that has nothing in flight (quiescable(): every
    entry is durable, committed and applied, every member has acknowledged the last entry,
    no read, transfer or configuration change is pending) sends a HEARTBEAT carrying
    QUIESCE_CTX instead of a plain one, and stops ticking.
  * A follower that gets it and holds exactly the leader's log (its commit, the heartbeat's
    commit and its last index are equal: committed entries are the leader's by Log Matching)
    stops ticking too, and says so by answering with QUIESCE_CTX. Any other answer, or no
    quiescence on its side, wakes the leader, which heartbeats again as usual.
  * Any other message stepped into a quiesced member wakes it (a proposal, a read, an
    append, a vote request of a member that missed the quiesce heartbeat, a configuration
    change...): from then on it is an ordinary Raft member. Only the quiesce heartbeat, its
    answer and a transport's "unreachable" report (the leader has nothing to resend) do not.
  * What quiesced members can no longer see for themselves is the application's job: it
    watches the NODES (one liveness message per peer node per tick for all groups,
    node/runtime/liveness.py) and calls wake(lease_expired=True) on a follower whose
    leader's node goes silent (or wake() when it no longer claims the group at that term),
    and on a leader when a quorum of its voters' nodes goes silent. A woken follower counts
    its leader lease as expired, so it grants (pre-)votes at once and campaigns within one
    election timeout: failover stays within the usual bound. A woken leader counts nobody
    as active, so check-quorum steps it down within an election timeout if nobody answers,
    and it does not quiesce again before everyone answered (quiescable()).

Safety does not depend on any of this: quiescence only stops clocks, and every Raft rule
(terms, votes, log matching, commitment) is unchanged. A leader quiesced while cut off
cannot commit anything (a proposal wakes it, and check-quorum then steps it down);
lease-based reads are refused for quiescence (Config.validate) because a quiesced leader
does not check its quorum.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .types import NONE, Message, MessageType as MT, StateRole

if TYPE_CHECKING:
    from .raft import Raft

QUIESCE_CTX = b"\x00xraft-quiesce"  # a heartbeat context no ReadIndex uses (theirs are non-empty ids)

# Messages that leave a quiesced member asleep (everything else wakes it, see the module doc).
_KEEP_ASLEEP = frozenset({MT.HEARTBEAT, MT.HEARTBEAT_RESP, MT.UNREACHABLE})


def keeps_asleep(m: Message) -> bool:
    """True if stepping `m` into a quiesced member must not wake it."""
    t = m.type
    if t not in _KEEP_ASLEEP:
        return False
    return t == MT.UNREACHABLE or m.context == QUIESCE_CTX


def quiescable(r: "Raft") -> bool:
    """A leader with nothing to send or wait for: safe to stop heartbeating."""
    if r.state != StateRole.LEADER or r.lead_transferee != NONE or r.pending_bcast:
        return False
    if r.read_only.queue or r.pending_read_index_messages or r.trk.config.joint():
        return False
    log = r.raft_log
    last = log.last_index()
    if log.committed != last or log.applied != last or log.unstable.entries \
            or log.unstable.snapshot is not None:
        return False
    for pr in r.trk.progress.values():
        # recent_active: every member answered since the last check-quorum (or the wake): a
        # leader woken because its quorum's nodes went silent must not fall asleep again
        # before it has heard from them, or it would never run check-quorum and step down.
        if pr.match != last or not pr.recent_active:
            return False
    return True


def quiesce_leader(r: "Raft") -> None:
    """Send every member the quiesce heartbeat and stop ticking. Call only if quiescable(r)."""
    commit = r.raft_log.committed  # every member holds it (quiescable)
    for pid, _ in r.trk.visit():
        if pid != r.id:
            r.send(Message(MT.HEARTBEAT, to=pid, commit=commit, context=QUIESCE_CTX))
    r.quiesced = True


def follower_quiesce(r: "Raft", m: Message) -> bytes:
    """A follower's answer to a quiesce heartbeat (already handled as a heartbeat): the context
    of its HEARTBEAT_RESP, QUIESCE_CTX if it quiesced, b"" (wake up) if it did not."""
    log = r.raft_log
    if (r.cfg.quiesce and r.state == StateRole.FOLLOWER and r.lead == m.frm
            and log.committed == m.commit == log.last_index()
            and log.unstable.snapshot is None and not r.read_states):
        r.quiesced = True
        return QUIESCE_CTX
    wake(r, False)  # already quiesced by an earlier one, but no longer in step: tick again
    return b""


def wake(r: "Raft", lease_expired: bool) -> None:
    """Resume ticking. lease_expired, on a follower: its leader's node is gone, so grant votes
    at once and campaign within one election timeout. On a leader: a quorum of its voters'
    nodes went silent, so count nobody as active: check-quorum steps it down after one
    election timeout unless they answer its heartbeats meanwhile."""
    if not r.quiesced:
        return
    r.quiesced = False
    r.heartbeat_elapsed = 0
    if r.state == StateRole.LEADER:
        r.election_elapsed = 0  # a fresh check-quorum period
        for pid, pr in r.trk.progress.items():
            pr.recent_active = pid == r.id or not lease_expired  # asleep, they were caught up
    elif lease_expired:
        r.election_elapsed = r.election_timeout
