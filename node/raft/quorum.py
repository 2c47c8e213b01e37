"""Quorum arithmetic: majority and joint (two-majority) configurations (thesis §4.3).

A joint config needs a majority of BOTH the incoming and the outgoing voters.
An empty majority config is a neutral element: it commits everything (index
= infinity) and wins every vote, so a non-joint config is (voters, empty).
"""
from __future__ import annotations

import enum
from typing import Callable, Mapping, Optional

INFINITE_INDEX = (1 << 63) - 1


class VoteResult(enum.IntEnum):
    PENDING = 0
    LOST = 1
    WON = 2


def majority_committed_index(voters: frozenset[int], acked: Callable[[int], Optional[int]]) -> int:
    """Largest index acknowledged by a majority of `voters` (unknown ack = 0)."""
    n = len(voters)
    if n == 0:
        return INFINITE_INDEX
    srt = sorted((acked(v) or 0) for v in voters)
    return srt[n - (n // 2 + 1)]


def majority_vote_result(voters: frozenset[int], votes: Mapping[int, bool]) -> VoteResult:
    if not voters:
        return VoteResult.WON
    yes = missing = 0
    for v in voters:
        got = votes.get(v)
        if got is None:
            missing += 1
        elif got:
            yes += 1
    q = len(voters) // 2 + 1
    if yes >= q:
        return VoteResult.WON
    if yes + missing >= q:
        return VoteResult.PENDING
    return VoteResult.LOST


class JointConfig:
    """(incoming, outgoing) voter sets; outgoing is empty unless joint."""

    __slots__ = ("incoming", "outgoing")

    def __init__(self, incoming: frozenset[int] = frozenset(), outgoing: frozenset[int] = frozenset()):
        self.incoming = frozenset(incoming)
        self.outgoing = frozenset(outgoing)

    def ids(self) -> frozenset[int]:
        return self.incoming | self.outgoing

    def committed_index(self, acked: Callable[[int], Optional[int]]) -> int:
        return min(majority_committed_index(self.incoming, acked),
                   majority_committed_index(self.outgoing, acked))

    def vote_result(self, votes: Mapping[int, bool]) -> VoteResult:
        r1 = majority_vote_result(self.incoming, votes)
        r2 = majority_vote_result(self.outgoing, votes)
        if r1 == r2:
            return r1
        if VoteResult.LOST in (r1, r2):
            return VoteResult.LOST
        return VoteResult.PENDING

    def __repr__(self) -> str:
        if self.outgoing:
            return f"{sorted(self.incoming)}&&{sorted(self.outgoing)}"
        return f"{sorted(self.incoming)}"
