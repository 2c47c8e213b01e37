"""ProgressTracker: the configuration, per-peer Progress and election votes.

TrackerConfig mirrors ConfState (voters as a JointConfig); `removed` holds
every ID that ever left, so it can never be re-added (IDs are not reused).
"""
from __future__ import annotations

from typing import Iterator, Optional

from .inflights import Inflights
from .progress import Progress
from .quorum import JointConfig, VoteResult
from .types import ConfState


class TrackerConfig:
    __slots__ = ("voters", "learners", "learners_next", "auto_leave", "removed")

    def __init__(self) -> None:
        self.voters = JointConfig()
        # Invariant: learners disjoint from voters.ids(); learners_next subset of voters.outgoing
        self.learners: frozenset[int] = frozenset()
        self.learners_next: frozenset[int] = frozenset()
        self.auto_leave = False  # Invariant: only True while joint
        self.removed: frozenset[int] = frozenset()  # Invariant: disjoint from all members

    def clone(self) -> "TrackerConfig":
        c = TrackerConfig()
        c.voters = JointConfig(self.voters.incoming, self.voters.outgoing)
        c.learners, c.learners_next = self.learners, self.learners_next
        c.auto_leave, c.removed = self.auto_leave, self.removed
        return c

    def joint(self) -> bool:
        return bool(self.voters.outgoing)

    def to_conf_state(self) -> ConfState:
        return ConfState(
            voters=tuple(sorted(self.voters.incoming)),
            learners=tuple(sorted(self.learners)),
            voters_outgoing=tuple(sorted(self.voters.outgoing)),
            learners_next=tuple(sorted(self.learners_next)),
            auto_leave=self.auto_leave,
            removed=tuple(sorted(self.removed)),
        )

    def __repr__(self) -> str:
        s = f"voters={self.voters!r}"
        if self.learners:
            s += f" learners={sorted(self.learners)}"
        if self.learners_next:
            s += f" learners_next={sorted(self.learners_next)}"
        if self.auto_leave:
            s += " autoleave"
        return s


class ProgressTracker:
    __slots__ = ("config", "progress", "votes", "max_inflight", "max_inflight_bytes")

    def __init__(self, max_inflight: int, max_inflight_bytes: int) -> None:
        self.config = TrackerConfig()
        self.progress: dict[int, Progress] = {}  # Invariant: keys == all members of config
        self.votes: dict[int, bool] = {}  # votes received in the current election
        self.max_inflight = max_inflight
        self.max_inflight_bytes = max_inflight_bytes

    def new_inflights(self) -> Inflights:
        return Inflights(self.max_inflight, self.max_inflight_bytes)

    def conf_state(self) -> ConfState:
        return self.config.to_conf_state()

    def is_singleton(self) -> bool:
        return len(self.config.voters.incoming) == 1 and not self.config.voters.outgoing

    def committed(self) -> int:
        prs = self.progress

        def acked(vid: int) -> Optional[int]:
            pr = prs.get(vid)
            return pr.match if pr is not None else None

        return self.config.voters.committed_index(acked)

    def visit(self) -> Iterator[tuple[int, Progress]]:
        """Peers in ID order (determinism: same message order on every run)."""
        for pid in sorted(self.progress):
            yield pid, self.progress[pid]

    def quorum_active(self) -> bool:
        votes = {pid: pr.recent_active for pid, pr in self.progress.items() if not pr.is_learner}
        return self.config.voters.vote_result(votes) == VoteResult.WON

    def voter_nodes(self) -> list[int]:
        return sorted(self.config.voters.ids())

    def reset_votes(self) -> None:
        self.votes = {}

    def record_vote(self, pid: int, granted: bool) -> None:
        if pid not in self.votes:
            self.votes[pid] = granted

    def tally_votes(self) -> tuple[int, int, VoteResult]:
        granted = rejected = 0
        for pid, pr in self.progress.items():
            if pr.is_learner or pid not in self.votes:
                continue
            if self.votes[pid]:
                granted += 1
            else:
                rejected += 1
        return granted, rejected, self.config.voters.vote_result(self.votes)
