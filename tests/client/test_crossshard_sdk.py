"""The SDK over streams in two slots owned by two real servers (LocalBackends,
a two-group layout in the router, as tests/client/test_routing_sdk.py):
consume() merges one Consume call per slot and routes acks back, XREAD BLOCK
fans out, the reliable consumer claims and acks in batches; and the
dead-letter SDK (xgroup_cfg, Delivery.delivery_count, dead_letters(),
XINFO GROUPS fields) against the real engine."""
import asyncio

from tests.client import run, serving
from tests.client.test_routing_sdk import HIGH, LOW, two_groups
from xraft.client.aio import Client
from xraft.client.crossshard import CrossShardSession, slot_batch
from xraft.client.dead_letters import dead_letter_from_entry
from xraft.proto.v1 import client_pb2 as pb


async def _fill(client, keys, n):
    for key in keys:
        await client.xgroup_create(key, "g", "0", mkstream=True)
        for i in range(n):
            await client.xadd(key, {"i": str(i)})


def test_consume_merges_slots_in_order_and_routes_acks():
    async def body():
        async with two_groups() as (client, low, high):
            await _fill(client, [LOW, HIGH], 30)
            seen = {LOW.encode(): [], HIGH.encode(): []}
            async with client.consume([LOW, HIGH], "g", "c", max_batch=7) as session:
                assert isinstance(session, CrossShardSession)
                async for d in session:
                    seen[d.key].append(int(d.entry.fields[0][1]))
                    assert await d.ack() == 1
                    if sum(map(len, seen.values())) == 60:
                        break
                assert len(session.sessions) == 2
            assert seen == {k: list(range(30)) for k in seen}          # per-stream order kept
            for key in (LOW, HIGH):
                assert (await client.xpending(key, "g")).count == 0    # every ack reached its group
    run(body)


def test_consume_of_one_slot_is_one_session():
    async def body():
        async with serving() as (addr, _b, _s):
            async with Client([addr], timeout=5) as client:
                await _fill(client, ["{t}a", "{t}b"], 3)
                async with client.consume(["{t}a", "{t}b"], "g", "c") as session:
                    got = [await session.__anext__() for _ in range(6)]
                    assert len(session.sessions) == 1
                    assert await session.ack(b"{t}a", [d.entry.id for d in got if d.key == b"{t}a"]) == 3
    run(body)


def test_xread_block_fans_out_across_slots():
    async def body():
        async with two_groups() as (client, low, high):
            await client.xadd(LOW, {"f": "old"})
            reader = asyncio.ensure_future(client.xread({LOW: "$", HIGH: "$"}, block_ms=5000))
            await asyncio.sleep(0.2)
            assert not reader.done()
            await client.xadd(HIGH, {"f": "new"})
            reply = await reader
            assert list(reply) == [HIGH.encode()] and reply[HIGH.encode()][0].fields == ((b"f", b"new"),)
            assert await client.xread({LOW: "$", HIGH: "$"}, block_ms=50) == {}        # times out: empty
            assert set(await client.xread({LOW: "0", HIGH: "0"}, block_ms=50)) == {LOW.encode(), HIGH.encode()}
    run(body)


def test_reliable_consumer_claims_dead_consumers_and_acks_in_batches():
    async def body():
        async with two_groups() as (client, low, high):
            await _fill(client, [LOW, HIGH], 20)
            # A consumer that died holding 5 entries of each stream.
            for key in (LOW, HIGH):
                await client.xreadgroup("g", "dead", {key: ">"}, count=5)
            handled, failed_once = [], set()

            async def handle(key, entry):
                if entry.id not in failed_once and int(entry.fields[0][1]) == 7:
                    failed_once.add(entry.id)
                    raise RuntimeError("poison once")              # left pending, claimed again
                handled.append((key, entry.id))

            worker = client.reliable_consumer([LOW, HIGH], "g", "live", handle, concurrency=4,
                                              claim_idle_ms=0, claim_interval_s=0.05, ack_batch=3)
            task = asyncio.ensure_future(worker.run())
            while len(set(handled)) < 40:
                await asyncio.sleep(0.02)
            await worker.stop()
            await task
            assert worker.claimed >= 10 and worker.failed == 2
            for key in (LOW, HIGH):
                assert (await client.xpending(key, "g")).count == 0
    run(body)


def test_dead_letters_through_the_sdk():
    async def body():
        async with serving() as (addr, _b, _s):
            async with Client([addr], timeout=5) as client:
                src, dlq = "{o}orders", "{o}orders:dead"
                await _fill(client, [src], 2)
                await client.xgroup_cfg(src, "g", 2, dlq)
                async with client.consume([src], "g", "c") as session:
                    first = await session.__anext__()
                    assert await first.delivery_count() == 1
                for _ in range(2):                                  # delivery 2, then the move
                    await client.xautoclaim(src, "g", "c2", 0, "0-0")
                letters = [d async for d in client.dead_letters(dlq, count=1)]      # paged one by one
                assert [(d.source_id, d.stream, d.group, d.deliveries) for d in letters] == [
                    (first.entry.id, src.encode(), b"g", 2), (letters[1].source_id, src.encode(), b"g", 2)]
                assert letters[0].fields == ((b"i", b"0"),)
                info = (await client.xinfo_groups(src))[0]
                assert (info.max_deliveries, info.dead_letter_key, info.dead_lettered, info.pending) == (
                    2, dlq.encode(), 2, 0)
                assert await first.delivery_count() == 0
                raw = await client.xrange(dlq)
                assert dead_letter_from_entry(raw[0]) == letters[0]
                await client.xgroup_cfg(src, "g", 0)
                assert (await client.xinfo_groups(src))[0].max_deliveries == 0
    run(body)


def test_dead_letters_through_the_sync_client():
    from tests.client import ThreadServer
    from xraft.client.sync import Client as SyncClient
    with ThreadServer() as (addr, _backend), SyncClient([addr], timeout=5) as c:
        c.xgroup_create("{o}s", "g", "0", mkstream=True)
        c.xadd("{o}s", {"f": "v"})
        c.xgroup_cfg("{o}s", "g", 1, "{o}dead")
        with c.consume(["{o}s"], "g", "c") as session:
            d = next(iter(session))
            assert d.delivery_count() == 1
        c.xautoclaim("{o}s", "g", "c2", 0)
        assert [(x.source_id, x.deliveries) for x in c.dead_letters("{o}dead")] == [(d.id, 1)]


def test_slot_sessions_read_max_batch_times_slots_within_the_window():
    """Each slot's session reads max_batch x slots entries at a time, at most the
    window (crossshard.slot_batch); the consumer still sees every entry once, in order."""
    async def body():
        async with two_groups() as (client, low, high):
            await _fill(client, [LOW, HIGH], 30)
            seen = {LOW.encode(): [], HIGH.encode(): []}
            async with client.consume([LOW, HIGH], "g", "c", max_batch=7, max_unacked=10) as session:
                async for d in session:
                    seen[d.key].append(int(d.entry.fields[0][1]))
                    await d.ack()
                    if sum(map(len, seen.values())) == 60:
                        break
                assert [s._start.max_batch for s in session.sessions] == [10, 10]     # min(7 x 2, 10)
            assert seen == {k: list(range(30)) for k in seen}
    run(body)
    start = pb.ConsumeStart(max_batch=0, max_unacked=0)
    assert (slot_batch(start, 1), slot_batch(start, 6), slot_batch(start, 20)) == (0, 600, 1000)
    start.no_ack = True
    assert slot_batch(start, 200) == 10_000
