"""Regressions for the SDK bugs the cluster benchmark found, each against a
real grpc.aio server over a LocalBackend:

  1. overlapping ConsumerSession.ack() calls wrote to the bidi stream at once
     (grpc.aio forbids it); the error was swallowed and the ack lost;
  2. a stale refusal (StaleRequest -> UNKNOWN_OUTCOME) was retried until the
     deadline although a retry can never change the answer;
  3. only 8 id-carrying writes could be in flight per client, and a slow one
     could fall out of the server's dedup window while newer ones completed.

No timed assertions: waits are bounded only so a hang fails the test."""
import asyncio

import pytest

from tests.client import run, serving
from xraft.client import errors
from xraft.client.aio import DEDUP_WINDOW, MAX_TRACKED_WRITES, Client
from xraft.client.types import StreamID
from xraft.node.fsm.errors import StaleRequest
from xraft.node.fsm.results import encode_result
from xraft.node.fsm.sessions import (DEFAULT_MAX_RESULT_BYTES, DEFAULT_RESULTS_PER_CLIENT, ResultNotKept,
                                     Sessions)
from xraft.node.server.backend import LocalBackend, UnknownOutcome

GUARD = 15          # seconds: only a hang guard


# -- 1. lost acks ----------------------------------------------------------------------------

def test_overlapping_acks_are_all_written_and_confirmed():
    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                await c.xgroup_create("s", "g", "0", mkstream=True)
                n = 200
                await c.xadd_batch("s", [("1-%d" % i, {"n": i}) for i in range(1, n + 1)])
                async with c.consume(["s"], "g", "w", max_unacked=50) as session:
                    it = session.__aiter__()
                    acked = 0
                    while acked < n:
                        batch = [await asyncio.wait_for(it.__anext__(), GUARD)]
                        while not session._queue.empty():
                            batch.append(await it.__anext__())
                        # Every delivery of the batch acked at once: overlapping writes.
                        got = await asyncio.wait_for(asyncio.gather(*(d.ack() for d in batch)), GUARD)
                        assert got == [1] * len(batch)
                        acked += len(batch)
                    # Also many acks through session.ack at once, for IDs already acked.
                    again = await asyncio.wait_for(asyncio.gather(
                        *(session.ack("s", [StreamID(1, i)]) for i in range(1, 60))), GUARD)
                    assert again == [0] * 59
                assert (await c.xpending("s", "g")).count == 0
    run(body)


class _DropsAckWrite:
    """Wraps a Consume call: the first ack write fails the way a broken
    stream does, once."""

    def __init__(self, call):
        self.call = call
        self.failed = False

    def __getattr__(self, name):
        return getattr(self.call, name)

    def __aiter__(self):
        return self.call.__aiter__()

    async def write(self, msg):
        if msg.WhichOneof("body") == "ack" and not self.failed:
            self.failed = True
            self.call.cancel()             # the stream breaks under the write
            raise asyncio.InvalidStateError("write after the call ended")
        return await self.call.write(msg)


def test_a_failed_ack_write_is_resent_after_reconnecting_never_dropped():
    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                await c.xgroup_create("s", "g", "0", mkstream=True)
                await c.xadd_batch("s", [("1-%d" % i, {"n": i}) for i in range(1, 4)])
                node = c._node(addr)
                real = node.stub.Consume
                wrappers = []

                def consume(*a, **kw):
                    wrappers.append(_DropsAckWrite(real(*a, **kw)))
                    if len(wrappers) > 1:
                        wrappers[-1].failed = True
                    return wrappers[-1]
                node.stub.Consume = consume
                async with c.consume(["s"], "g", "w") as session:
                    first = await asyncio.wait_for(session.__anext__(), GUARD)
                    assert await asyncio.wait_for(first.ack(), GUARD) == 1
                    assert len(wrappers) >= 2 and wrappers[0].failed      # resent on a new stream
                assert (await c.xpending("s", "g")).count == 2
    run(body)


def test_a_session_that_ends_fails_its_unconfirmed_acks():
    async def body():
        async with serving() as (addr, backend, _s):
            async with Client([addr], timeout=5) as c:
                await c.xgroup_create("s", "g", "0", mkstream=True)
                await c.xadd("s", {"n": 1}, "1-1")
                async with c.consume(["s"], "g", "w") as session:
                    d = await asyncio.wait_for(session.__anext__(), GUARD)
                    await c.execute("XGROUP", "DESTROY", "s", "g")   # the next XACK fails NOGROUP
                    with pytest.raises(errors.NoGroupError):
                        await asyncio.wait_for(d.ack(), GUARD)
    run(body)


# -- 2. stale refusals -----------------------------------------------------------------------

class _HoldsFirst(LocalBackend):
    """The first attempt of request `seq` waits until `others` other
    id-carrying writes were applied, then fails unapplied (UNKNOWN_OUTCOME):
    the SDK must resend it. Records the other request ids submitted before
    the request was finally applied."""

    def __init__(self, seq=1, others=1, **kw):
        super().__init__(**kw)
        self.seq, self.others = seq, others
        self.applied = 0
        self.attempts = 0
        self.seen_while_held = []
        self.enough = asyncio.Event()
        self.held = True

    async def submit(self, requests):
        mine = [r for r in requests if r.client_id and r.seq == self.seq]
        if mine:
            self.attempts += 1
            if self.attempts == 1:
                await self.enough.wait()
                raise UnknownOutcome()
        elif self.held:
            self.seen_while_held += [r.seq for r in requests if r.seq]      # (REGISTER: seq 0)
        results = await super().submit(requests)
        if mine:
            self.held = False
        else:
            self.applied += sum(1 for r in requests if r.seq)
            if self.applied >= self.others:
                self.enough.set()
        return results


def test_a_stale_refusal_surfaces_at_once_and_is_not_retried():
    async def body():
        backend = _HoldsFirst(seq=1, others=3)
        backend.sm.sessions = Sessions(results_per_client=2)    # seqs 2..4 push seq 1 below the floor
        async with serving(backend) as (addr, _, _s):
            async with Client([addr], timeout=3) as c:
                slow = asyncio.ensure_future(c.rpush("l", "slow"))
                await asyncio.wait_for(asyncio.gather(*(c.rpush("l", "x%d" % i) for i in range(3))), GUARD)
                with pytest.raises(errors.StaleRequestError) as e:
                    await asyncio.wait_for(slow, GUARD)
                assert isinstance(e.value, errors.UnknownOutcomeError) and not e.value.retriable
                assert not isinstance(e.value, errors.WriteDeadlineError)     # not retried to the deadline
                assert backend.attempts == 2                                   # the first, one resend
                assert "too old to tell" in e.value.message
                assert await c.llen("l") == 3                                   # never applied
    run(body)


class _KeepsNoReply(LocalBackend):
    """Applies every write; the first answer to an LPOP is lost (UNKNOWN_OUTCOME)."""
    lost = 0

    async def submit(self, requests):
        results = await super().submit(requests)
        if any(r.seq and r.commands[0][0] == b"LPOP" for r in requests) and not self.lost:
            self.lost += 1
            raise UnknownOutcome()
        return results


def test_an_applied_reply_not_kept_surfaces_at_once():
    async def body():
        backend = _KeepsNoReply()
        backend.sm.sessions = Sessions(max_result_bytes=256)
        async with serving(backend) as (addr, _, _s):
            async with Client([addr], timeout=3) as c:
                await c.rpush("l", "v" * 400, "w")
                with pytest.raises(errors.ReplyNotKeptError) as e:
                    await c.lpop("l")                  # its resend gets the marker: applied, reply too large
                assert isinstance(e.value, errors.UnknownOutcomeError) and not e.value.retriable
                assert backend.lost == 1 and await c.lrange("l", 0, -1) == [b"w"]
    run(body)


def test_the_clients_copy_of_the_refusal_texts_is_the_servers():
    stale = StaleRequest(123, 45).message
    assert errors.classify_unknown_outcome("UNKNOWNOUTCOME " + stale) is errors.StaleRequestError
    kept = ResultNotKept(123, 45).message
    assert errors.classify_unknown_outcome("UNKNOWNOUTCOME " + kept) is errors.ReplyNotKeptError
    assert errors.classify_unknown_outcome("UNKNOWNOUTCOME the write may or may not have been applied") \
        is errors.UnknownOutcomeError


# -- 3. the dedup window -----------------------------------------------------------------------

def test_window_constants_agree_on_both_sides():
    assert DEDUP_WINDOW == DEFAULT_RESULTS_PER_CLIENT == 1024
    assert MAX_TRACKED_WRITES == 256 and 2 * MAX_TRACKED_WRITES <= DEDUP_WINDOW


def test_many_writes_in_flight_and_a_slow_one_stays_in_the_window():
    """Request 1 is held while every other write the SDK lets through
    completes; then it fails unapplied and its resend must be applied (not
    refused as stale), once. While it is held the SDK issues no request id
    at or beyond 1 + MAX_TRACKED_WRITES, which is what keeps it in the window."""
    async def body():
        others = MAX_TRACKED_WRITES - 1
        backend = _HoldsFirst(seq=1, others=others)
        async with serving(backend) as (addr, _, _s):
            async with Client([addr], timeout=10) as c:
                slow = asyncio.ensure_future(c.rpush("l", "slow"))
                rest = [asyncio.ensure_future(c.rpush("l", "x")) for _ in range(others + 40)]
                assert await asyncio.wait_for(slow, GUARD) >= 1
                await asyncio.wait_for(asyncio.gather(*rest), GUARD)
                assert backend.attempts == 2
                assert len(backend.seen_while_held) >= others                 # > 8 in flight at once
                assert max(backend.seen_while_held) < 1 + MAX_TRACKED_WRITES
                assert await c.llen("l") == others + 41                        # each applied once
    run(body)


def test_sessions_keep_a_large_window_within_the_old_byte_bound():
    s = Sessions()
    s.register(9, 0)
    assert s.results_per_client == 1024
    budget = s.client_byte_budget
    assert budget == 16 * DEFAULT_MAX_RESULT_BYTES             # what 16 full results took before
    big = b"v" * 1000
    for seq in range(1, 2001):
        s.record(9, seq, big)
        assert s.clients[9].nbytes <= budget
    client = s.clients[9]
    assert len(client.results) == 1024 and client.floor == 976
    # The newest replies are kept whole; older ones were demoted to the marker.
    assert s.lookup(9, 2000, 0) == (True, big)
    seen, oldest = s.lookup(9, 977, 0)
    assert seen and oldest == ResultNotKept(9, 977)
    assert client.nbytes == sum(len(r) for r in client.results.values())
    # The snapshot form is unchanged and round-trips the byte count.
    again = Sessions.decode(s.encode(), 0)
    assert again.encode() == s.encode() and again.clients[9].nbytes == client.nbytes
    again.record(9, 2001, big)
    s.record(9, 2001, big)
    assert again.encode() == s.encode()


def test_old_bounds_from_a_snapshot_behave_as_before():
    old = Sessions(results_per_client=16)
    old.register(1, 0)
    assert old.client_byte_budget == 16 * DEFAULT_MAX_RESULT_BYTES
    full = b"x" * (DEFAULT_MAX_RESULT_BYTES - 64)
    for seq in range(1, 40):
        old.record(1, seq, full)
    assert all(r == encode_result(full) for r in old.clients[1].results.values())   # nothing demoted
    assert Sessions.decode(old.encode(), 0).encode() == old.encode()

