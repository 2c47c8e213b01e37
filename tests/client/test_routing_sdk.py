"""The SDK's routing against real gRPC servers over LocalBackends.

Today's single-group servers answer ClusterLayout with UNIMPLEMENTED: the client
then routes as it always did (one leader), fetching the layout once. With a layout
installed in the router (what a sharded node would answer, as a real protobuf),
keyed calls go to the server of their slot's group and keys in different slots
are refused before anything is sent."""
import contextlib

import pytest

from tests.client import run, serving
from xraft.client import errors
from xraft.client.aio import Client
from xraft.client.routing import Layout
from xraft.client.slots import key_slot
from xraft.node.fsm.sessions import DEFAULT_SESSION_TIMEOUT_MS
from xraft.node.server.backend import LocalBackend
from xraft.proto.v1 import client_pb2 as pb

# Keys of the two halves of the slot space (checked below).
LOW, HIGH = "bar", "foo"            # slots 5061 and 12182


def two_group_layout(low_addr, high_addr) -> Layout:
    m = pb.ClusterLayoutResponse(epoch=3, node_id=1)
    m.nodes.add(id=1, grpc=low_addr, state="up")
    m.nodes.add(id=2, grpc=high_addr, state="up")
    m.groups.add(id=1, leader=1, term=1, voters=[1]).slots.add(first=0, last=8191)
    m.groups.add(id=2, leader=2, term=1, voters=[2]).slots.add(first=8192, last=16383)
    return Layout.from_pb(m)


@contextlib.asynccontextmanager
async def two_groups(low_backend=None, high_backend=None, request_ids=False):
    """(client, low address, high address): two real servers, and a client whose
    router holds two_group_layout over them."""
    async with serving(low_backend) as (low, _lb, _a), serving(high_backend) as (high, _hb, _b):
        async with Client([low], timeout=5, request_ids=request_ids) as client:
            client._router.install(two_group_layout(low, high))
            yield client, low, high


def test_keys_are_in_the_halves_they_are_named_for():
    assert key_slot(LOW.encode()) < 8192 <= key_slot(HIGH.encode())


def test_a_server_without_cluster_layout_keeps_the_one_leader_routing():
    async def body():
        async with serving() as (addr, backend, _s):
            async with Client([addr], timeout=5) as c:
                assert await c.rpush(LOW, "a") == 1
                assert await c.rpush(HIGH, "b") == 1
                assert c.routing_mode == "single" and c.layout_fetches == 1 and c.leader_for(LOW) is None
                # one group owns every slot, yet the server refuses keys in different slots
                # (redis cluster's rule, so applications keep working when slots move)
                with pytest.raises(errors.CrossSlotError):
                    await c.blpop([LOW, HIGH], block_ms=100)
                assert await c.blpop([LOW], block_ms=100) == (LOW.encode(), b"a")
                assert c.layout_fetches == 1                    # asked once, not per call
                with pytest.raises(errors.NotSupportedError, match="does not serve ClusterLayout"):
                    await c.cluster_layout()
    run(body)


def test_keyed_calls_go_to_the_server_of_their_group():
    async def body():
        async with two_groups() as (c, low, high):
            assert c.leader_for(LOW) == low and c.leader_for(HIGH) == high
            assert await c.rpush(LOW, "l1") == 1
            assert await c.rpush(HIGH, "h1") == 1
            assert await c.rpush(HIGH, "h2") == 2
            assert await c.lrange(HIGH, 0, -1) == [b"h1", b"h2"]
            assert await c.execute("LLEN", LOW) == 1            # execute routes by argv[1]
            assert c.redirects == 0
            async with Client([low], timeout=5) as direct_low, Client([high], timeout=5) as direct_high:
                assert await direct_low.lrange(LOW, 0, -1) == [b"l1"] and await direct_low.llen(HIGH) == 0
                assert await direct_high.lrange(HIGH, 0, -1) == [b"h1", b"h2"] and await direct_high.llen(LOW) == 0
    run(body)


def test_keys_in_different_slots_are_refused_before_sending():
    async def body():
        async with two_groups() as (c, low, high):
            await c.rpush(LOW, "x")
            # (XREAD BLOCK and consume() across slots are split instead: test_crossshard_sdk.py)
            for call in (c.blpop([LOW, HIGH], block_ms=100), c.lmove(LOW, HIGH),
                         c.xreadgroup("g", "c", {LOW: ">", HIGH: ">"})):
                with pytest.raises(errors.CrossSlotError, match="CROSSSLOT"):
                    await call
            assert await c.lrange(LOW, 0, -1) == [b"x"]          # nothing popped or moved
            # the same slot through a hash tag is one call
            assert await c.lmove("{t}a", "{t}b") is None
    run(body)


def test_batches_of_independent_keys_are_split_per_group():
    async def body():
        async with two_groups() as (c, low, high):
            added = await c.xadd_multi({HIGH: [("1-1", {"f": "h"})], LOW: [("2-1", {"f": "l"}), {"f": "m"}],
                                        "{bar}2": [("0-0", {"f": "bad"})]})
            assert list(added) == [HIGH, LOW, "{bar}2"]
            assert added[HIGH] == [(1, 1)] and added[LOW][0] == (2, 1) and len(added[LOW]) == 2
            assert isinstance(added["{bar}2"][0], errors.CommandError)      # per entry, returned
            # a non-blocking XREAD over both groups is split and merged in request order
            reply = await c.xread({HIGH: "0-0", LOW: "2-1", "nothing": "0-0"})
            assert list(reply) == [HIGH.encode(), LOW.encode()]
            assert [e.id for e in reply[HIGH.encode()]] == [(1, 1)] and len(reply[LOW.encode()]) == 1
            async with Client([high], timeout=5) as direct:
                assert await direct.xlen(HIGH) == 1 and await direct.xlen(LOW) == 0
    run(body)


def test_a_subscription_to_streams_of_two_groups_is_split_and_merged():
    async def body():
        async with two_groups() as (c, low, high):
            await c.xadd(LOW, {"f": "l1"}, "1-1")
            await c.xadd(HIGH, {"f": "h1"}, "1-1")
            stream = c.subscribe({LOW: "0-0", HIGH: "0-0"})
            got = {}
            while len(got) < 2:
                key, entries = await stream.__anext__()
                got[key] = [e.fields_dict[b"f"] for e in entries]
            await c.xadd(HIGH, {"f": "h2"}, "2-1")
            assert await stream.__anext__() == (HIGH.encode(), [await _entry(c, HIGH, "2-1")])
            await stream.aclose()
            assert got == {LOW.encode(): [b"l1"], HIGH.encode(): [b"h1"]}
    run(body)


async def _entry(client, key, sid):
    [entry] = await client.xrange(key, sid, sid)
    return entry


class _Clocked(LocalBackend):
    """A LocalBackend whose wall clock the test moves (sessions expire by it)."""

    def __init__(self):
        self.now = 1_700_000_000_000
        super().__init__(clock=lambda: self.now)


def test_sessions_are_registered_per_group_and_renewed_lazily():
    async def body():
        low_backend, high_backend = _Clocked(), _Clocked()
        async with two_groups(low_backend, high_backend, request_ids=True) as (c, _low, _high):
            await c.rpush(LOW, "a")
            first = c.client_id
            assert list(low_backend.sm.sessions.clients) == [first]
            assert list(high_backend.sm.sessions.clients) == []        # nothing written there yet
            await c.rpush(HIGH, "b")
            await c.rpush(HIGH, "c")
            assert list(high_backend.sm.sessions.clients) == [first]   # once per group, not per write
            high_backend.now += DEFAULT_SESSION_TIMEOUT_MS + 1          # the high group's session expires
            await c.rpush(HIGH, "d")                                     # refused, resent under a new id
            second = c.client_id
            assert second != first and list(high_backend.sm.sessions.clients) == [second]
            assert list(low_backend.sm.sessions.clients) == [first]     # not re-registered eagerly...
            await c.rpush(LOW, "e")
            assert list(low_backend.sm.sessions.clients) == [first, second]   # ...but before its next write
            assert await c.lrange(HIGH, 0, -1) == [b"b", b"c", b"d"] and await c.lrange(LOW, 0, -1) == [b"a", b"e"]
    run(body)
