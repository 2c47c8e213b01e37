"""ISSUE9 C2: a blocked SDK call whose serving attempt is applied but whose
reply is lost (the leader dies right after the pop) must not lose the
element. Every attempt of a blocking write carries the call's request id, so
the SDK's resend gets the element that attempt popped (fsm/blocking.
may_run_again): on the old code the wake-up retry was anonymous, the resend
found the first attempt's empty result, blocked again, and the popped
element was delivered to nobody.

Real grpc.aio server over a LocalBackend whose submit loses the answer of the
first serving attempt (as a leader killed after applying it would); the
real-process version with kill -9 is tests/cluster/test_blocking_failover_sdk.py."""
import asyncio

import pytest

from tests.client import run, serving
from xraft.client.aio import Client
from xraft.node.engine.replies import NULL_ARRAY
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.state_machine import StateMachine
from xraft.node.server.backend import LocalBackend, UnknownOutcome

GUARD = 15          # seconds: only a hang guard
BLOCK_MS = 3000     # on the old code the resend blocks again and times out with nothing


class _LosesServedReply(LocalBackend):
    """Applies every write; the answer of the first id-carrying attempt that
    served something (not the proposed form's empty reply) is lost."""
    lost = 0

    async def submit(self, requests):
        results = await super().submit(requests)
        for r, res in zip(requests, results):
            name = bytes(r.commands[0][0]).lower().removesuffix(b"-woken") if r.commands else b""
            if r.client_id and not self.lost and name in (b"lpop", b"lmove", b"xreadgroup") \
                    and res is not None and res is not NULL_ARRAY:
                self.lost += 1
                raise UnknownOutcome()
        return results


async def _blocked(service, n=1):
    while sum(1 for w in service.registry._waiters if w.blocked) < n:
        await asyncio.sleep(0.005)


async def _lost_served_reply(blocked_call, produce, check):
    """blocked_call(sdk) blocks; produce(producer) makes it servable; the served
    attempt's reply is lost once; check(result, producer) checks the outcome."""
    backend = _LosesServedReply()
    async with serving(backend) as (addr, _, service):
        async with Client([addr], timeout=10) as c, Client([addr], timeout=10) as producer:
            await producer.xgroup_create("s", "g", "$", mkstream=True)
            got = asyncio.ensure_future(blocked_call(c))
            await asyncio.wait_for(_blocked(service), GUARD)
            produced = await produce(producer)
            result = await asyncio.wait_for(got, GUARD)
            assert backend.lost == 1                       # the served reply was lost once
            await check(result, produced, producer)


def test_blpop_resend_after_a_lost_served_reply_gets_the_popped_element():
    async def check(result, _, producer):
        assert result == (b"l", b"a")
        assert await producer.lrange("l", 0, -1) == [b"b"]          # popped once
    run(lambda: _lost_served_reply(lambda c: c.blpop(["l"], block_ms=BLOCK_MS),
                                   lambda p: p.rpush("l", "a", "b"), check))


def test_blmove_resend_after_a_lost_served_reply_gets_the_moved_element_once():
    async def check(result, _, producer):
        assert result == b"a"
        assert await producer.lrange("{src}dst", 0, -1) == [b"a"]        # moved once
        assert await producer.lrange("src", 0, -1) == [b"b"]
    run(lambda: _lost_served_reply(lambda c: c.lmove("src", "{src}dst", block_ms=BLOCK_MS),
                                   lambda p: p.rpush("src", "a", "b"), check))


def test_xreadgroup_block_resend_after_a_lost_served_reply_gets_the_delivery():
    async def check(result, sid, producer):
        assert [e.id for e in result[b"s"]] == [sid]
        assert (await producer.xpending("s", "g")).count == 1         # delivered once, to w
    run(lambda: _lost_served_reply(lambda c: c.xreadgroup("g", "w", {"s": ">"}, block_ms=BLOCK_MS),
                                   lambda p: p.xadd("s", {"f": "v"}), check))


# -- the rule itself, at the state machine ---------------------------------------------------

def _apply(sm, *requests):
    return sm.apply(sm.applied_index + 1, encode_record(1000 + sm.applied_index, requests))


def _registered(client_id):
    """A state machine where client_id has a session (sessions.py: ids register first)."""
    sm = StateMachine()
    _apply(sm, Request.register(client_id))
    return sm


def test_an_empty_attempt_runs_again_and_a_served_one_is_deduplicated():
    sm = _registered(7)
    lpop = Request.command(7, 1, (b"LPOP", b"l"))
    assert _apply(sm, lpop) == [None]                              # nothing to serve: recorded empty
    _apply(sm, Request.command(0, 0, (b"RPUSH", b"l", b"a", b"b")))
    assert _apply(sm, lpop) == [b"a"]                              # same id runs again, serves
    assert _apply(sm, lpop) == [b"a"]                              # served: the recorded element
    assert sm.read([b"LRANGE", b"l", b"0", b"-1"], 2000) == [b"b"]
    # The replaced result survives a snapshot exactly (same table on every replica).
    other = StateMachine()
    other.restore(sm.snapshot())
    assert other.snapshot() == sm.snapshot()
    assert _apply(other, lpop) == [b"a"]


@pytest.mark.parametrize("argv,length", [((b"RPUSH", b"l", b"x"), (b"LLEN", b"l")),
                                         ((b"XADD", b"s", b"*", b"f", b"v"), (b"XLEN", b"s"))])
def test_other_writes_never_run_again(argv, length):
    sm = _registered(7)
    req = Request.command(7, 1, argv)
    first = _apply(sm, req)
    assert _apply(sm, req) == first                                # deduplicated as before
    assert sm.read(list(length), 2000) == 1
