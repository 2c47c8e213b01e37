"""The SDK's consumer sends acks queued together as one ConsumeAck of runs when the
server's deliveries say it takes them (ack_runs), one message per ack otherwise
(a server from before runs); either way every ack() gets its own XACK count."""
import asyncio

import pytest

import xraft.node.server.grpc_streams as gs
from tests.client import run, serving
from xraft.client.aio import Client


@pytest.fixture
def messages(monkeypatch):
    """The ConsumeAck messages the server read: their run counts (1 for a plain ack)."""
    seen = []
    real = gs._ack_runs

    def counted(ack):
        runs = real(ack)
        seen.append(len(runs))
        return runs
    monkeypatch.setattr(gs, "_ack_runs", counted)
    return seen


async def _acks_made_together(n) -> list:
    """n entries delivered, then n + 1 ack() calls at once (one per entry, and the
    first entry again): their results."""
    async with serving() as (addr, _, _):
        async with Client([addr]) as c:
            await c.xgroup_create("s", "g", "0", mkstream=True)
            for i in range(n):
                await c.xadd("s", {"i": str(i)})
            async with c.consume(["s"], "g", "w", max_batch=n) as session:
                got = []
                async for d in session:
                    got.append(d)
                    if len(got) == n:
                        break
                results = await asyncio.gather(*(d.ack() for d in got + got[:1]))
            assert (await c.xpending("s", "g")).count == 0
    return results


def test_acks_made_together_go_as_one_message_of_runs(messages):
    async def body():
        assert await _acks_made_together(12) == [1] * 12 + [0]
    run(body)
    assert sum(messages) == 13 and len(messages) < 13     # merged (the first may go alone)


def test_a_server_without_runs_gets_one_message_per_ack(messages, monkeypatch):
    monkeypatch.setattr(gs, "ACK_RUNS", False)

    async def body():
        assert await _acks_made_together(12) == [1] * 12 + [0]
    run(body)
    assert messages == [1] * 13
