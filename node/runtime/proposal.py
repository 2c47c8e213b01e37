"""A proposal on its way through a group's driver (raft_driver.py): queued, then proposed at a
(term, index), then settled exactly once — by its entry's apply, by a deadline, or by the
end of the leadership it was proposed under.

    Proposal   the data (and its decoded form), its conf change if any, what settles it (a
               future or a Callback), its state and log position, its deadline timer
    Callback   a proposer's function in place of a future (propose_nowait): the same
               done()/set_result()/set_exception() surface, so every settle path is shared
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Optional, Union

from ..raft.types import ConfChange, ConfChangeV2

log = logging.getLogger("xraft.driver")

QUEUED, PROPOSED = 0, 1


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class Proposal:
    __slots__ = ("data", "cc", "fut", "state", "term", "index", "timer", "decoded")

    def __init__(self, data: bytes, cc: Optional[Union[ConfChange, ConfChangeV2]],
                 fut: Union[asyncio.Future, Callback], decoded: Any = None):
        self.data = data
        # The state machine's in-memory form of data, which the proposer encoded data
        # from (propose_nowait's `decoded`): applied in place of data once the entry
        # commits at this proposal's term and index, so the leader does not decode
        # what it has just encoded. Followers decode data.
        self.decoded = decoded
        self.cc = cc
        self.fut = fut
        self.state = QUEUED
        self.term = 0
        self.index = 0
        self.timer: Optional[asyncio.TimerHandle] = None


class Callback:
    """A proposer's callback in place of a future (propose_nowait): the same done()/set_*
    surface, so every path that settles a proposal works unchanged. Called synchronously,
    exactly once, on the loop thread."""

    __slots__ = ("fn", "_done")

    def __init__(self, fn: Callable[[Any, Optional[BaseException]], None]):
        self.fn = fn
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any) -> None:
        self._call(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._call(None, exc)

    def _call(self, result: Any, exc: Optional[BaseException]) -> None:
        self._done = True
        try:
            self.fn(result, exc)
        except Exception:  # the proposer's bug must not fail-stop the group
            log.exception("a proposal's callback failed")


