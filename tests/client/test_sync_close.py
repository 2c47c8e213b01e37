"""The blocking client's close() leaves nothing behind: no pending Task on its loop (a
consumer session the caller never closed holds a grpc call), no loop thread. A pending
Task freed later by another thread's garbage collection can block there on grpc's poller
thread: issue 11's hung xdist worker after an in-process nemesis run."""
import asyncio

from tests.client import ThreadServer
from xraft.client.sync import Client


def test_close_cancels_a_consumer_session_left_open():
    with ThreadServer() as (addr, _backend):
        c = Client([addr], timeout=5)
        c.xgroup_create("s", "g", "0", mkstream=True)
        c.xadd("s", {"n": 1}, "1-1")
        session = c.consume(["s"], "g", "w")
        deliveries = iter(session)
        assert str(next(deliveries).id) == "1-1"     # its reader task now waits on the stream
        loop = c._loop
        assert [t for t in asyncio.all_tasks(loop) if not t.done()]
        c.close()
        assert loop.is_closed() and not c._thread.is_alive()
        assert [t for t in asyncio.all_tasks(loop) if not t.done()] == []
        c.close()                                     # twice is harmless
