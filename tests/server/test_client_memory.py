"""ISSUE9 C6 (memory): the bytes a node holds for its clients' requests are
bounded node-wide in bytes (node/server/client_memory.py), not only by counts.

Many clients send 1 MiB writes while the backend holds every write (a commit
that does not come yet): on the old code every request was read and held
(N MiB); now RESP connections stop reading once the node's client memory is
granted away, and gRPC calls that do not fit are refused with a retriable
BUSY that the SDK retries. The bytes really held are measured from outside
the accounting: the parsers' buffers plus the requests waiting in the
backend. When the backend lets the writes through, every one completes.

Real RESP server / grpc.aio server and SDK over a LocalBackend; the hold is
the backend's only difference."""
import asyncio

from tests.client import run, serving
from xraft.client.aio import Client
from xraft.node.fsm.entry import Kind, request_size
from xraft.node.server.backend import LocalBackend
from xraft.node.server.client_memory import ClientMemory
from xraft.node.server.resp import encode_command
from xraft.node.server.resp_server import RespServer

MIB = 1 << 20
LIMIT = 4 * MIB
CLIENTS = 12
GUARD = 15          # seconds: only a hang guard


class _HoldsWrites(LocalBackend):
    """Every submit waits for `release` before it is applied; `held` is the
    bytes of the requests waiting, `max_held` the most ever."""

    def __init__(self):
        super().__init__()
        self.release = asyncio.Event()
        self.held = self.max_held = self.waiting = 0

    async def submit(self, requests):
        if all(r.kind == Kind.REGISTER for r in requests):
            return await super().submit(requests)     # SDK session registrations pass at once
        size = sum(request_size(r) for r in requests)
        self.held += size
        self.waiting += 1
        self.max_held = max(self.max_held, self.held)
        try:
            await self.release.wait()
            return await super().submit(requests)
        finally:
            self.held -= size
            self.waiting -= 1


async def _until(cond):
    while not cond():
        await asyncio.sleep(0.002)


def test_resp_clients_sending_large_writes_stay_within_the_node_bound():
    async def body():
        backend = _HoldsWrites()
        memory = ClientMemory(LIMIT)
        server = RespServer(backend, "127.0.0.1", 0)
        server.client_memory = memory          # as node_main shares one with the gRPC service
        await server.start()
        worst = 0

        def in_flight():
            nonlocal worst
            parsers = sum(c.parser.buffered_bytes + getattr(c.parser, "partial_bytes", 0)
                          for c in server.clients.values() if c.parser is not None)
            worst = max(worst, parsers + backend.held)
            return worst

        async def sample(stop):
            while not stop.is_set():
                in_flight()
                await asyncio.sleep(0.001)

        stop = asyncio.Event()
        sampler = asyncio.ensure_future(sample(stop))
        conns = []
        try:
            for i in range(CLIENTS):
                r, w = await asyncio.open_connection("127.0.0.1", server.port)
                w.write(encode_command([b"SET", b"k%d" % i, b"v" * MIB]))
                conns.append((r, w))
            # Everything read and held (old code), or readers waiting for room (now).
            await asyncio.wait_for(_until(lambda: backend.waiting == CLIENTS or memory.readers_waiting), GUARD)
            await asyncio.sleep(0.05)          # more reads would land now if reading went on
            in_flight()
            backend.release.set()
            for r, w in conns:
                assert await asyncio.wait_for(r.readline(), GUARD) == b"+OK\r\n"
            assert await backend.read([b"DBSIZE"]) == CLIENTS
            assert worst <= LIMIT, "held %d bytes, bound %d" % (worst, LIMIT)
            assert memory.peak <= LIMIT, (memory.peak, memory.overdrafts)
        finally:
            stop.set()
            await sampler
            for _, w in conns:
                w.close()
            await server.close()
        # Every grant given back once the connections are gone.
        await asyncio.wait_for(_until(lambda: memory.used == 0), GUARD)
    run(body)


def test_grpc_calls_beyond_the_node_bound_are_refused_retriably_and_then_succeed():
    async def body():
        backend = _HoldsWrites()
        memory = ClientMemory(LIMIT)
        async with serving(backend) as (addr, _, service):
            service.client_memory = memory
            clients = [Client([addr], timeout=GUARD, backoff_max=0.05) for _ in range(CLIENTS)]
            try:
                calls = [asyncio.ensure_future(c.xadd("s", {"f": "v" * MIB})) for c in clients]
                await asyncio.wait_for(_until(lambda: backend.waiting == CLIENTS or memory.refused), GUARD)
                backend.release.set()
                ids = await asyncio.wait_for(asyncio.gather(*calls), GUARD)
                assert len(set(ids)) == CLIENTS
                assert await backend.read([b"XLEN", b"s"]) == CLIENTS
                assert backend.max_held <= LIMIT, "held %d bytes, bound %d" % (backend.max_held, LIMIT)
                assert memory.peak <= LIMIT and memory.refused > 0
            finally:
                for c in clients:
                    await c.close()
        assert memory.used == 0
    run(body)
