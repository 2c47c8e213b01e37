"""Shared by the client tests: real grpc.aio servers (XRaftService over a
LocalBackend) on 127.0.0.1, in the test's loop or on a thread of their own
(for the sync client, which runs its own loop)."""
import asyncio
import contextlib
import threading

import uvloop

from xraft.node.server.backend import LocalBackend
from xraft.node.server.grpc_service import start_server

TIMEOUT = 20  # seconds for a whole async test body: a hang fails the test, not the suite


@contextlib.asynccontextmanager
async def serving(backend=None, **kwargs):
    """(address, backend, service) of a started server; stopped on exit."""
    backend = backend or LocalBackend()
    server, port, service = await start_server(backend, **kwargs)
    try:
        yield f"127.0.0.1:{port}", backend, service
    finally:
        await server.stop(None)


def run(body):
    """Run an async test body on uvloop, bounded by TIMEOUT."""
    async def bounded():
        await asyncio.wait_for(body(), TIMEOUT)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(bounded())


class ThreadServer:
    """A server on its own uvloop thread: `with ThreadServer() as (addr, backend): ...`."""

    def __init__(self, backend=None, **kwargs):
        self.backend = backend or LocalBackend()
        self.kwargs = kwargs
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        fut = asyncio.run_coroutine_threadsafe(start_server(self.backend, **self.kwargs), self.loop)
        self.server, port, self.service = fut.result(10)
        return f"127.0.0.1:{port}", self.backend

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.server.stop(None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
