"""An ack a ConsumerSession already wrote to its stream may have been applied:
when the session ends before the ack's result arrives (close(), or a retriable
error it gave up on), ack() must raise UnknownOutcomeError, never a
"nothing was applied" error such as UnavailableError.

Found by the nemesis run (issue 11, seed 11): the workload closed its Consume
session while an XACK was in flight; the SDK raised UnavailableError('consumer
closed'), the workload recorded the XACK as failed, yet the server had applied
it, and the groups checker reported the entry neither acked nor pending."""
import asyncio

import pytest

from tests.client import run, serving
from xraft.client import errors
from xraft.client.aio import Client

GUARD = 15          # seconds: only a hang guard


class _AckWrittenNoResult:
    """Wraps a Consume call: ack writes reach the server, but the reader never
    sees another message after the first ack was written (its result is lost
    with the session)."""

    def __init__(self, call):
        self.call = call
        self.ack_written = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.call, name)

    def __aiter__(self):
        return self._messages()

    async def _messages(self):
        async for msg in self.call:
            if self.ack_written.is_set():
                await asyncio.Event().wait()          # held until the session is closed
            yield msg

    async def write(self, msg):
        await self.call.write(msg)
        if msg.WhichOneof("body") == "ack":
            self.ack_written.set()


def with_one_delivery(test, wrap=None):
    """Run test(client, session, delivery) against a real server: one entry, delivered to
    consumer w of group g by a Consume session (whose calls `wrap` wraps, if given)."""
    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                await c.xgroup_create("s", "g", "0", mkstream=True)
                await c.xadd("s", {"n": 1}, "1-1")
                if wrap is not None:
                    node = c._node(addr)
                    real = node.stub.Consume
                    node.stub.Consume = lambda *a, **kw: wrap(real(*a, **kw))
                session = c.consume(["s"], "g", "w")
                d = await asyncio.wait_for(session.__anext__(), GUARD)
                await test(c, session, d)
    run(body)


def test_an_ack_written_before_the_session_closed_has_an_unknown_outcome():
    wrappers = []

    def wrap(call):
        wrappers.append(_AckWrittenNoResult(call))
        return wrappers[-1]

    async def test(c, session, d):
        ack = asyncio.ensure_future(d.ack())
        await asyncio.wait_for(wrappers[0].ack_written.wait(), GUARD)
        # The server applies the ack (its PEL empties) ...
        for _ in range(GUARD * 100):
            if (await c.xpending("s", "g")).count == 0:
                break
            await asyncio.sleep(0.01)
        assert (await c.xpending("s", "g")).count == 0
        await session.close()
        # ... so the ack that never saw its result says "unknown", not "nothing happened".
        with pytest.raises(errors.UnknownOutcomeError) as e:
            await asyncio.wait_for(ack, GUARD)
        assert not isinstance(e.value, errors.UnavailableError)
    with_one_delivery(test, wrap)


def test_an_ack_never_written_before_the_session_closed_still_says_unavailable():
    async def test(c, session, d):
        await session.close()
        with pytest.raises(errors.UnavailableError):
            await asyncio.wait_for(d.ack(), GUARD)
        assert (await c.xpending("s", "g")).count == 1
    with_one_delivery(test)
