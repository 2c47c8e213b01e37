"""Progress: the leader's view of one follower's log (etcd tracker.Progress).

States (thesis §3.5, etcd's design):
  PROBE      — next index unknown: send one MsgApp per heartbeat interval and
               wait for its answer before sending again.
  REPLICATE  — steady state: optimistically pipeline MsgApps, limited by Inflights.
  SNAPSHOT   — the follower needs a snapshot; send nothing else until it is
               installed (or reported failed).

Invariant: match < next (match = highest index known replicated, next = next to send).
"""
from __future__ import annotations

import enum

from ..invariant import invariant
from .inflights import Inflights


class ProgressState(enum.IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Progress:
    __slots__ = ("match", "next", "state", "pending_snapshot", "recent_active",
                 "msg_app_flow_paused", "inflights", "is_learner")

    def __init__(self, match: int, next_index: int, inflights: Inflights, is_learner: bool = False,
                 recent_active: bool = False) -> None:
        invariant(match < next_index, f"progress match {match} >= next {next_index}")
        self.match = match
        self.next = next_index
        self.state = ProgressState.PROBE
        self.pending_snapshot = 0  # index of the snapshot being sent (SNAPSHOT state)
        self.recent_active = recent_active  # heard from since the last CheckQuorum
        self.msg_app_flow_paused = False  # PROBE: one MsgApp sent, await reply/heartbeat
        self.inflights = inflights
        self.is_learner = is_learner

    def __repr__(self) -> str:
        return (f"Progress({self.state.name} match={self.match} next={self.next}"
                f"{' learner' if self.is_learner else ''} inflight={self.inflights.count()})")

    def clone(self) -> "Progress":
        p = Progress(self.match, self.next, self.inflights.clone(), self.is_learner, self.recent_active)
        p.state = self.state
        p.pending_snapshot = self.pending_snapshot
        p.msg_app_flow_paused = self.msg_app_flow_paused
        return p

    def _reset_state(self, state: ProgressState) -> None:
        self.msg_app_flow_paused = False
        self.pending_snapshot = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        if self.state == ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset_state(ProgressState.PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        self._reset_state(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def sent_entries(self, count: int, nbytes: int) -> None:
        """Record a MsgApp carrying `count` entries starting at `next`."""
        if self.state == ProgressState.REPLICATE:
            if count > 0:
                self.next += count
                self.inflights.add(self.next - 1, nbytes)
            self.msg_app_flow_paused = self.inflights.full()
        elif self.state == ProgressState.PROBE:
            self.msg_app_flow_paused = True
        else:
            invariant(False, f"sending entries in state {self.state.name}")

    def maybe_update(self, n: int) -> bool:
        """A successful ack for index n; True if match advanced."""
        if n > self.match:
            self.match = n
            self.next = max(self.next, n + 1)
            self.msg_app_flow_paused = False
            return True
        return False

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the MsgApp at index `rejected`; False if stale."""
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False  # stale: we already know a higher match
            self.next = self.match + 1  # directly go back to match+1
            return True
        if self.next - 1 != rejected:
            return False  # stale: not the probe we are waiting for
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.msg_app_flow_paused = False
        return True

    def is_paused(self) -> bool:
        if self.state == ProgressState.PROBE:
            return self.msg_app_flow_paused
        if self.state == ProgressState.REPLICATE:
            return self.msg_app_flow_paused
        return True  # SNAPSHOT
