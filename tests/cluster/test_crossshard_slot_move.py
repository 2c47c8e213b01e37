"""Issue 13 part 4 against real node processes (3 nodes, 3 data groups): one SDK
cross-shard consume() over three streams, one per group, while one stream's slot is
moved to another group with `xraftctl slots move` (the real move code, driven by the
metadata leader) and producers write to every stream during the move.

Checked at the end: every entry in each stream was delivered, each stream's first
deliveries came in ID order, no entry was delivered again once its ack was confirmed,
and every PEL is empty (no ack lost, each one reached the group owning its stream then).
"""
import asyncio

from tests.cluster.conftest import cluster_factory  # noqa: F401 - a fixture
from tests.cluster.test_crossshard_dlq import retrying, run
from tests.cluster.test_slot_move import GROUPS, _move, _owner, _start
from xraft.client.aio import Client
from xraft.client.slots import key_slot

PER_STREAM_BEFORE = 40
PRODUCER_PAUSE_S = 0.01
DRAIN_TIMEOUT_S = 90


def _one_stream_per_group(cluster) -> dict:
    """{group: stream key} with one `{csN}` key in each data group's slots."""
    keys = {}
    for i in range(10_000):
        key = "{cs%d}s" % i
        owner = _owner(cluster, key_slot(key.encode()))
        keys.setdefault(owner, key.encode())
        if len(keys) == GROUPS:
            return keys
    raise AssertionError("no key for every group")


def streams_and_move(cluster) -> tuple:
    """(keys: one stream per group, the first one's group, that stream, its slot, the
    group its slot moves to)."""
    by_group = _one_stream_per_group(cluster)
    source = next(iter(by_group))
    moving = by_group[source]
    return list(by_group.values()), source, moving, key_slot(moving), source % GROUPS + 1


async def group_and_entries(client, keys, n: int) -> None:
    """Group "g" from the start of each stream, then n entries in each."""
    for k in keys:
        await client.xgroup_create(k, "g", "0", mkstream=True)
        await client.xadd_batch(k, [{"n": str(i)} for i in range(n)], raise_errors=True)


async def produce(client, key, moved: asyncio.Event, written) -> None:
    """XADDs to `key` all through a move (MOVED/TRYAGAIN/failovers are retried), and 10
    after it; written(key) after each one."""
    after = 0
    while after < 10:
        await retrying(client.xadd, key, {"n": "during"})
        written(key)
        if moved.is_set():
            after += 1
        await asyncio.sleep(PRODUCER_PAUSE_S)


async def half_confirmed(consumer, confirmed: set, n: int) -> None:
    """Until half of the n entries written before have their ack confirmed (where the move starts)."""
    while len(confirmed) < n // 2:
        assert not consumer.done(), consumer
        await asyncio.sleep(0.05)


async def drain(client, keys, consumer, confirmed: set) -> set:
    """Every (key, id) now in `keys`, once all of them are in `confirmed` (acks
    confirmed); then the consumer task is stopped. Fails if it ended or stalled."""
    want = set()
    for k in keys:
        want |= {(k, e.id) for e in await retrying(client.xrange, k)}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_TIMEOUT_S
    while not want <= confirmed:
        assert not consumer.done(), consumer
        assert loop.time() < deadline, sorted(want - confirmed)[:5]
        await asyncio.sleep(0.05)
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    return want


def test_crossshard_consume_across_a_slot_move(cluster_factory, tmp_path_factory):  # noqa: F811
    cluster = _start(cluster_factory, tmp_path_factory)
    keys, source, moving, slot, target = streams_and_move(cluster)

    async def body():
        async with Client([n.grpc for n in cluster.nodes.values()], timeout=30) as client:
            await group_and_entries(client, keys, PER_STREAM_BEFORE)
            delivered = {k: [] for k in keys}       # first deliveries, in order
            confirmed, again_after_ack = set(), []
            moving_now, moved = asyncio.Event(), asyncio.Event()
            written_during_move = {k: 0 for k in keys}

            async def consume(session):
                async for d in session:
                    if (d.key, d.id) in confirmed:
                        again_after_ack.append((d.key, d.id))
                    if d.id not in delivered[d.key]:
                        delivered[d.key].append(d.id)
                    await d.ack()
                    confirmed.add((d.key, d.id))

            def during_move(key):
                if moving_now.is_set() and not moved.is_set():
                    written_during_move[key] += 1

            async with client.consume(keys, "g", "c1", max_batch=8, max_unacked=32) as session:
                consumer = asyncio.ensure_future(consume(session))
                producers = [asyncio.ensure_future(produce(client, k, moved, during_move)) for k in keys]
                await half_confirmed(consumer, confirmed, len(keys) * PER_STREAM_BEFORE)
                moving_now.set()
                result = await asyncio.to_thread(_move, cluster, slot, slot, target)
                moved.set()
                await asyncio.gather(*producers)
                want = await drain(client, keys, consumer, confirmed)
            assert result["owner"] == target and _owner(cluster, slot) == target
            assert written_during_move[moving] > 0, "no write while the slot moved"
            assert not again_after_ack, again_after_ack[:5]
            for k in keys:
                assert delivered[k] == sorted(delivered[k]), k                  # per-stream order
                assert {(k, i) for i in delivered[k]} == {w for w in want if w[0] == k}
                assert (await retrying(client.xpending, k, "g")).count == 0     # every ack in its group
    try:
        run(body)
    finally:
        cluster.kill_all()
