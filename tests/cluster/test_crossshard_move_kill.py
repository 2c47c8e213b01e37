"""Issue 13 part 4's last proof on real node processes (3 nodes, 3 data groups): one SDK
cross-shard consume() over three streams, one per group, while one stream's slot moves
to another group (`xraftctl slots move`) AND the source group's leader gets SIGKILL in
the middle of the move: right after it applied the move's SEAL (the slot is frozen,
nothing copied yet), through the node's own failpoint (XRAFT_FAILPOINT=after_seal_1,
slot_move_steps.py), armed on that node only. A watcher restarts it (without the
failpoint); producers write to every stream all along; acks are sent concurrently, so
some are in flight when the leader dies.

Checked at the end:
  * the move finished (the target owns the slot) and the failpoint did fire;
  * no entry lost: every entry of every stream was delivered and its ack confirmed;
  * no entry delivered twice: nothing here claims, and one consumer session skips the
    replay of what it already holds, so each entry is delivered exactly once;
  * each stream's deliveries came in ID order;
  * every ack landed in the group owning its stream: every PEL is empty.
"""
import asyncio
import signal

from tests.cluster.conftest import cluster_factory  # noqa: F401 - a fixture
from tests.cluster.test_crossshard_dlq import leader_of_group, retrying, run
from tests.cluster.test_crossshard_slot_move import (drain, group_and_entries, half_confirmed, produce,
                                                     streams_and_move)
from tests.cluster.test_slot_move import Restarter, _move, _owner, _start
from tests.cluster.sharded_util import wait_settled
from xraft.client.aio import Client

PER_STREAM_BEFORE = 150
ACKS_IN_FLIGHT = 16
FAILPOINT = "after_seal_1"


def _arm_source_leader(cluster, source: int):
    """Restart the source group's leader with the SEAL failpoint armed (that node only),
    and wait until every group is led by its preferred node again: that node leads the
    source group when the move seals it. The node."""
    node = cluster.nodes[leader_of_group(cluster, source)]
    node.signal(signal.SIGTERM)
    node.wait_exit()
    plain_env = dict(cluster.env)
    cluster.env["XRAFT_FAILPOINT"] = FAILPOINT
    try:
        node.start()
    finally:
        cluster.env.clear()
        cluster.env.update(plain_env)            # later (re)starts: no failpoint
    node.wait_ready()
    wait_settled(cluster)
    assert leader_of_group(cluster, source) == node.id
    return node


def test_crossshard_consume_across_a_slot_move_with_the_source_leader_killed(cluster_factory,  # noqa: F811
                                                                             tmp_path_factory):
    cluster = _start(cluster_factory, tmp_path_factory)
    keys, source, _, slot, target = streams_and_move(cluster)
    armed = _arm_source_leader(cluster, source)
    armed_proc = armed.proc                      # the Restarter replaces armed.proc

    async def body():
        async with Client([n.grpc for n in cluster.nodes.values()], timeout=30) as client:
            await group_and_entries(client, keys, PER_STREAM_BEFORE)
            delivered = {k: [] for k in keys}       # every delivery, in order
            confirmed = set()
            moved = asyncio.Event()
            written_after_kill = {k: 0 for k in keys}
            room = asyncio.Semaphore(ACKS_IN_FLIGHT)
            acking = set()

            async def ack(d):
                try:
                    await d.ack()                   # raises if the ack could not be delivered
                    confirmed.add((d.key, d.id))
                finally:
                    room.release()

            async def consume(session):
                async for d in session:
                    delivered[d.key].append(d.id)
                    await room.acquire()
                    t = asyncio.ensure_future(ack(d))
                    acking.add(t)
                    t.add_done_callback(acking.discard)

            def after_kill(key):
                if armed_proc.poll() is not None:          # the armed process died (SIGKILL)
                    written_after_kill[key] += 1

            async with client.consume(keys, "g", "c1", max_batch=8, max_unacked=64) as session:
                consumer = asyncio.ensure_future(consume(session))
                producers = [asyncio.ensure_future(produce(client, k, moved, after_kill)) for k in keys]
                await half_confirmed(consumer, confirmed, len(keys) * PER_STREAM_BEFORE)
                watcher = Restarter(cluster)
                watcher.start()
                try:
                    result = await asyncio.to_thread(_move, cluster, slot, slot, target)
                finally:
                    moved.set()
                    await asyncio.gather(*producers, return_exceptions=True)
                    watcher.stop.set()
                    await asyncio.to_thread(watcher.join, 60)
                assert watcher.error is None, watcher.error
                for p in producers:
                    p.result()
                want = await drain(client, keys, consumer, confirmed)
                await asyncio.gather(*acking)
            assert armed_proc.returncode == -signal.SIGKILL and watcher.restarts >= 1
            assert f"failpoint {FAILPOINT}" in armed.log_text(since_start=False)
            assert result["owner"] == target and _owner(cluster, slot) == target
            assert sum(written_after_kill.values()) > 0, "no write after the kill"
            for k in keys:
                assert delivered[k] == sorted(set(delivered[k])), k             # once each, in ID order
                assert {(k, i) for i in delivered[k]} == {w for w in want if w[0] == k}
                assert (await retrying(client.xpending, k, "g")).count == 0     # every ack in its group
    try:
        run(body)
    finally:
        cluster.kill_all()
