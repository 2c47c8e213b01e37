"""The blocking xraft client: a thin shell over `aio.Client`.

It owns a private event loop on a daemon thread and runs the async client's
coroutines there (`run_coroutine_threadsafe`). Every public method of the
async client exists here with the same signature and result, generated from
the async class, so there is one implementation of routing, retries and
conversions, never two.

    with Client(["127.0.0.1:7100"]) as c:
        c.xadd("s", {"f": "v"})
        for key, entries in c.subscribe({"s": "0-0"}): ...
        for d in c.consume(["s"], "g", "c1"): d.ack()
"""
import asyncio
import functools
import inspect
import threading

from . import aio


class Client:
    def __init__(self, seeds, **kwargs):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="xraft-sync-client", daemon=True)
        self._thread.start()

        async def make():                 # built inside its loop, like every aio object
            return aio.Client(seeds, **kwargs)

        self._aio = self._run(make())

    def _run(self, coro):
        if threading.current_thread() is self._thread:
            raise RuntimeError("the sync client cannot be called from its own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, aiter, wrap=lambda x: x):
        """A blocking iterator over an async iterator that lives on the loop."""
        try:
            while True:
                try:
                    item = self._run(aiter.__anext__())
                except StopAsyncIteration:
                    return
                yield wrap(item)
        finally:
            close = getattr(aiter, "aclose", None) or getattr(aiter, "close", None)
            if close is not None and self._loop.is_running():
                self._run(close())

    @property
    def leader(self):
        return self._aio.leader

    @property
    def client_id(self) -> int:
        return self._aio.client_id

    @property
    def routing_mode(self) -> str:
        return self._aio.routing_mode

    @property
    def redirects(self) -> int:
        return self._aio.redirects

    @property
    def layout_fetches(self) -> int:
        return self._aio.layout_fetches

    def leader_for(self, key):
        return self._aio.leader_for(key)

    def subscribe(self, streams: dict, **kwargs):
        return self._iterate(self._aio.subscribe(streams, **kwargs))

    def dead_letters(self, dead_letter_key, **kwargs):
        """aio.Client.dead_letters as a blocking iterator of DeadLetter."""
        return self._iterate(self._aio.dead_letters(dead_letter_key, **kwargs))

    def consume(self, keys, group, consumer, **kwargs) -> "ConsumerSession":
        async def make():
            return self._aio.consume(keys, group, consumer, **kwargs)
        return ConsumerSession(self, self._run(make()))

    def close(self) -> None:
        """Close the channels, cancel and await every task still on the loop (a consumer
        session or iterator the caller left open), then stop and close the loop: nothing
        of this client (a pending Task holding a grpc call, the loop thread) outlives it.
        A Task left pending is freed later by whichever thread's garbage collection finds
        it, and freeing a grpc aio call there can block on grpc's poller thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    async def _shutdown(self) -> None:
        try:
            await self._aio.close()
        finally:
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            await asyncio.get_running_loop().shutdown_asyncgens()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Delivery:
    def __init__(self, client: Client, delivery: aio.Delivery):
        self._client = client
        self._delivery = delivery
        self.key, self.entry = delivery.key, delivery.entry

    @property
    def id(self):
        return self.entry.id

    def ack(self) -> int:
        return self._client._run(self._delivery.ack())

    def delivery_count(self) -> int:
        return self._client._run(self._delivery.delivery_count())

    def __repr__(self):
        return f"Delivery(key={self.key!r}, entry={self.entry!r})"


class ConsumerSession:
    def __init__(self, client: Client, session: aio.ConsumerSession):
        self._client = client
        self._session = session

    def __iter__(self):
        return self._client._iterate(self._session, lambda d: Delivery(self._client, d))

    def ack(self, key, ids) -> int:
        return self._client._run(self._session.ack(key, ids))

    def close(self) -> None:
        self._client._run(self._session.close())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _shell(name, fn):
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        return self._run(getattr(self._aio, name)(*args, **kwargs))
    return method


# Every public coroutine method of the async client, as a blocking method.
for _name, _fn in inspect.getmembers(aio.Client, inspect.iscoroutinefunction):
    if not _name.startswith("_") and _name not in vars(Client):
        setattr(Client, _name, _shell(_name, _fn))
