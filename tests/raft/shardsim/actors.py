"""Actors: the move driver and the clients, written as generators that yield calls.

An actor's code reads like the real asyncio code it models (node/server/move_reconciler.py,
slot_move_steps.py, the SDK's retry loop) but is a plain generator: it yields one call
(Propose, Read, Sleep) and the simulation sends back the call's result, or throws
Unavailable into it, when the call completes in simulated time. One RNG, no threads, so a
seed replays exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


class Unavailable(Exception):
    """No leader reachable, the proposal was lost or its outcome is unknown (timeout, crash)."""


class NotSent(Unavailable):
    """The call never reached a log (no leader reachable, the proposal was dropped): it
    cannot have applied."""


@dataclass
class Propose:
    gid: int
    data: bytes
    via: Optional[int] = None     # the caller's node (a partition can cut it off); None: a client
    local: bool = False           # only via's own replica of gid (the reconciler's metadata proposals)


@dataclass
class Read:
    gid: int
    fn: Callable                  # fn(state machine) on the leader after a ReadIndex
    via: Optional[int] = None


@dataclass
class Sleep:
    steps: int


class Actor:
    """One generator and where it stands: 'queued' (a call to issue), 'waiting' (a call in
    flight, until `deadline`), 'sleep' (until `wake_at`) or 'done'."""

    def __init__(self, name: str, gen, node: Optional[int] = None):
        self.name = name
        self.gen = gen
        self.node = node
        self.call = None
        self.state = "queued"
        self.wake_at = 0
        self.deadline = 0
        self.token = 0                # bumped at each resume: a stale completion is ignored
        self.started = False

    def resume(self, now: int, value=None, exc: Optional[BaseException] = None) -> None:
        self.token += 1
        try:
            if not self.started:
                self.started = True
                call = next(self.gen)
            elif exc is not None:
                call = self.gen.throw(exc)
            else:
                call = self.gen.send(value)
        except StopIteration:
            self.state, self.call = "done", None
            return
        self.call = call
        if isinstance(call, Sleep):
            self.state, self.wake_at = "sleep", now + max(1, call.steps)
        else:
            self.state = "queued"

    def close(self) -> None:
        self.token += 1
        self.gen.close()
        self.state, self.call = "done", None
