"""Blocked clients: XREAD BLOCK, XREADGROUP BLOCK, BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP.

Blocking happens here, never in the log (fsm/blocking.py). A blocking command
runs as:

    register the waiter on its keys          BEFORE the first attempt, so a key
                                             signalled while the attempt is in
                                             flight is never missed
    attempt: the non-blocking form           writes through backend.submit (a
                                             served BLPOP is an LPOP in the log
                                             before anyone is told), XREAD
                                             through backend.read
    served -> reply;  not served -> wait     until a key is signalled ready
                                             (backend ready listener), the
                                             timeout passes (timeout reply), or
                                             the waiter is failed (leadership
                                             lost: a redirect error, never a
                                             silent empty reply)

Order. Waiters queue per key in arrival order (FIFO per key; across keys a
waiter keeps its arrival number). A ready key wakes waiters from the front of
its queue, at most `wake_batch` consuming waiters at a time (BLPOP,
XREADGROUP: each retry is a log entry, and one LPUSH of one element should
not make ten thousand clients propose an LPOP); every non-consuming waiter
(XREAD) is woken, since each of them gets the data. A consuming waiter that
was served re-signals its keys (the key may hold more), which wakes the next
one; a waiter that was not served simply waits again and keeps its place.

One deviation from redis, by construction: redis serves blocked clients
inside the command that made the key ready, so a newcomer never sees the
element. Here the push and the blocked client's retry are separate log
entries, so a new BLPOP arriving in between can take the element first.

Timeouts count from the first block and are only enforced while waiting: a
retry already proposed is never abandoned (its element may be popped). The
same holds for CLIENT UNBLOCK (client_unblock): it ends the wait as a timeout
or with redis's -UNBLOCKED error, but a retry in flight that is served still
gets its reply.

Keys that vanish. A stream deleted, overwritten by another type or flushed is
signalled like a write (engine Keyspace._signal_gone), as redis's
signalDeletedKeyAsReady: a blocked XREADGROUP retries with the woken form and
fails with redis's -UNBLOCKED / NOGROUP text (engine xreadgroup_woken); a
blocked XREAD re-reads, finds nothing and waits on, as in redis 7.0, where a
key of another type is skipped rather than failed (so a WRONGTYPE on a retry
means "not a stream now": keep waiting).
"""
import asyncio
import itertools
from typing import Callable, Optional

from ..engine.errors import CommandError, WrongTypeError, wrong_arity
from ..engine.replies import WouldBlock
from ..engine.streamid import string2ll
from ..fsm.blocking import NOT_SERVED
from ..fsm.resolve import retry_request

DEFAULT_MAX_BLOCKED = 10_000
DEFAULT_WAKE_BATCH = 16


class TooManyBlocked(CommandError):
    def __init__(self, limit: int):
        super().__init__("ERR xraft: max number of blocked clients reached (%d)" % limit)


class WaiterClosed(Exception):
    """The client went away while blocked: nothing to reply to."""


UNBLOCKED_BY_CLIENT = "UNBLOCKED client unblocked via CLIENT UNBLOCK"


class Waiter:
    __slots__ = ("keys", "arrival", "consuming", "deadline", "in_flight", "signalled",
                 "blocked", "error", "timed_out", "_fut", "owner")

    def __init__(self, keys, arrival: int, consuming: bool, deadline: Optional[float], owner):
        self.keys = keys
        self.arrival = arrival
        self.consuming = consuming
        self.deadline = deadline          # loop.time() seconds; None = forever
        self.in_flight = True             # an attempt is running (the first one now)
        self.signalled = False            # a key was signalled: attempt (again)
        self.blocked = False              # has waited at least once (INFO blocked_clients)
        self.error = None                 # set by fail(): raised by wait()
        self.timed_out = False            # set by time_out() (CLIENT UNBLOCK): wait() returns False
        self._fut = None
        self.owner = owner

    @property
    def active(self) -> bool:
        return self.in_flight or self.signalled

    def _signal(self) -> None:
        self.signalled = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._signal()

    def time_out(self) -> None:
        """End the wait now, as if the timeout had passed."""
        self.timed_out = True
        self._signal()

    async def wait(self) -> bool:
        """True when woken (attempt again), False when the timeout passed;
        raises the error the waiter was failed with."""
        self.in_flight = False
        while True:
            if self.error is not None:
                raise self.error
            if self.timed_out:
                return False
            if self.signalled:
                self.signalled = False
                self.in_flight = True
                return True
            loop = asyncio.get_running_loop()
            timeout = None
            if self.deadline is not None:
                timeout = self.deadline - loop.time()
                if timeout <= 0:
                    return False
            self.blocked = True
            self._fut = loop.create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._fut
            except asyncio.TimeoutError:
                if not self.signalled and self.error is None:
                    return False
            finally:
                self._fut = None


class BlockingRegistry:
    """Waiters by key, in arrival order; limits; wake-ups; failing them all."""

    def __init__(self, max_blocked: int = DEFAULT_MAX_BLOCKED, wake_batch: int = DEFAULT_WAKE_BATCH):
        if max_blocked < 1 or wake_batch < 1:
            raise ValueError("blocking limits must be positive")
        self.max_blocked = max_blocked
        self.wake_batch = wake_batch
        self._by_key = {}                 # key -> {Waiter: None}, insertion (arrival) order
        self._waiters = {}                # Waiter -> None
        self._arrivals = itertools.count(1)

    def __len__(self) -> int:
        return len(self._waiters)

    @property
    def blocked_clients(self) -> int:
        return sum(1 for w in self._waiters if w.blocked)

    def register(self, keys, timeout_ms: int, consuming: bool, owner=None) -> Waiter:
        """A waiter on `keys` (unique, in order); timeout_ms 0 = forever."""
        if len(self._waiters) >= self.max_blocked:
            raise TooManyBlocked(self.max_blocked)
        deadline = None
        if timeout_ms > 0:
            deadline = asyncio.get_running_loop().time() + timeout_ms / 1000.0
        w = Waiter(tuple(keys), next(self._arrivals), consuming, deadline, owner)
        self._waiters[w] = None
        for k in w.keys:
            self._by_key.setdefault(k, {})[w] = None
        return w

    def unregister(self, w: Waiter) -> None:
        if w not in self._waiters:
            return
        del self._waiters[w]
        for k in w.keys:
            q = self._by_key.get(k)
            if q is not None:
                q.pop(w, None)
                if not q:
                    del self._by_key[k]

    def on_ready(self, keys, recheck_in_flight: bool = True) -> None:
        """The backend's ready listener: wake waiters on these keys.

        recheck_in_flight=False is the hint after a consuming waiter was
        served ("the key may hold more"): it wakes the next waiter but does
        not make attempts in flight look again, as no new write came."""
        for k in keys:
            q = self._by_key.get(k)
            if not q:
                continue
            room = self.wake_batch
            for w in q:
                if not w.consuming:
                    w._signal()
                elif w.active:
                    # An attempt in flight may have been applied before this
                    # key's write: make it look again (a second attempt).
                    if recheck_in_flight:
                        w.signalled = True
                    room -= 1
                elif room > 0:
                    w._signal()
                    room -= 1

    def fail_where(self, error_for: Callable[[Waiter], Optional[BaseException]]) -> None:
        for w in list(self._waiters):
            exc = error_for(w)
            if exc is not None:
                w.fail(exc)

    def fail_owner(self, owner, exc: BaseException) -> None:
        self.fail_where(lambda w: exc if w.owner is owner else None)

    def unblock(self, owner, error: bool) -> bool:
        """CLIENT UNBLOCK: end `owner`'s blocked command as a timeout, or with
        redis's -UNBLOCKED error. False if it is not blocked (not waiting yet,
        or already ended)."""
        found = False
        for w in list(self._waiters):
            if w.owner is owner and w.blocked and w.error is None and not w.timed_out:
                found = True
                if error:
                    w.fail(CommandError(UNBLOCKED_BY_CLIENT))
                else:
                    w.time_out()
        return found


def client_unblock(registry: BlockingRegistry, clients, argv):
    """CLIENT UNBLOCK <id> [TIMEOUT|ERROR], redis 7.0's checks in its order
    (networking.c clientCommand): the reason, then the id. `clients` maps
    client id -> the owner its blocked commands were registered with."""
    n = len(argv)
    if n < 3:
        return wrong_arity("client|unblock")
    if n > 4:
        return CommandError("ERR unknown subcommand or wrong number of arguments for '%s'. Try CLIENT HELP."
                            % bytes(argv[1])[:128].decode("utf-8", "replace"))
    error = False
    if n == 4:
        reason = bytes(argv[3]).lower()
        if reason not in (b"timeout", b"error"):
            return CommandError("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR")
        error = reason == b"error"
    client_id = string2ll(bytes(argv[2]))
    if client_id is None:
        return CommandError("ERR value is not an integer or out of range")
    target = clients.get(client_id)
    return int(target is not None and registry.unblock(target, error))


async def run_blocking_write(backend, registry: BlockingRegistry, resolved, owner=None):
    """A blocking write form (resolve_command returned a plan): its reply."""
    plan = resolved.plan
    w = registry.register(plan.keys, plan.timeout_ms, True, owner)
    try:
        result = (await backend.submit([resolved.request]))[0]
        while True:
            reply = plan.translate(result)
            if reply is not NOT_SERVED:
                registry.unregister(w)
                registry.on_ready(plan.keys, False)   # the key may hold more: the next waiter's turn
                return reply
            if not await w.wait():
                return plan.timeout_reply
            # The call's own request id: an attempt that pops is deduplicated, so a
            # resend after a lost reply gets its element (fsm/blocking.may_run_again).
            req = resolved.request
            result = (await backend.submit([retry_request(plan, req.client_id, req.seq)]))[0]
    finally:
        registry.unregister(w)


async def run_blocking_read(backend, registry: BlockingRegistry, argv, keys, timeout_ms: int,
                            linearizable: bool, owner=None):
    """XREAD BLOCK: the first read and every retry go through backend.read."""
    w = registry.register(keys, timeout_ms, False, owner)
    try:
        reply = await backend.read(argv, linearizable)
        while isinstance(reply, WouldBlock):
            timeout_reply, retry = reply.timeout_reply, reply.retry_argv
            if not await w.wait():
                return timeout_reply
            # retry_argv has `$` resolved to the IDs it meant when the client
            # blocked; a retry that finds nothing blocks again with the same argv.
            reply = await backend.read(retry, linearizable)
            if isinstance(reply, WrongTypeError):
                # A key became another type while we waited: redis serves a
                # woken XREAD only from streams and leaves it blocked.
                reply = WouldBlock(keys, timeout_ms, retry, timeout_reply)
            elif isinstance(reply, WouldBlock):
                reply = WouldBlock(reply.keys, reply.timeout_ms, retry, reply.timeout_reply)
        return reply
    finally:
        registry.unregister(w)
