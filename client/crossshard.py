"""Consumption across slots: what redis refuses with CROSSSLOT, split by the SDK.

`Client.consume(keys, ...)` over streams in several slots of a sharded
cluster returns a CrossShardSession: one ConsumerSession (one Consume call)
per slot, all running at once, their deliveries merged into one async
iterator as they arrive. Each stream lives in one slot, so in one session,
whose deliveries keep their order: per-stream order holds. A Delivery keeps
the session it came from, so `d.ack()` goes back to the group that owns its
stream. Failovers and redirects (NOT_LEADER, MOVED after a slot move) are
each session's own business (consumer.py): it reconnects where the error
points, replays its consumer's pending entries and resends unconfirmed acks,
so nothing is lost or acked twice; a delivery may repeat after a failover
(at least once), as on one slot.

`xread_fanout` is XREAD BLOCK across slots: one blocking XREAD per slot in
parallel; the first to answer with entries wins, the others are cancelled
(XREAD changes nothing, so a cancelled read loses nothing) and read again
without BLOCK, so the reply holds every stream that has entries then, in the
order of the request, as one XREAD would.
"""
import asyncio
import collections

from xraft.proto.v1 import client_pb2 as pb

from .consumer import ConsumerSession, SessionProtocol, _Closed
from .types import to_bytes

_END = object()      # a session's iterator ended cleanly


# ConsumeStart's defaults and limits (proto/xraft/v1/client.proto).
DEFAULT_BATCH = 100
MAX_BATCH = 10_000
DEFAULT_MAX_UNACKED = 1000


def slot_batch(start: pb.ConsumeStart, n_slots: int) -> int:
    """max_batch of each slot's session when `n_slots` sessions share one
    consumer: max_batch times n_slots, at most the window (max_unacked).
    Each slot's group carries 1/n_slots of the consumer's entries; with the
    caller's max_batch, its deliveries, and the acks that answer them, would
    each cover n_slots times fewer entries than one session's, and every
    record (a Raft round: append, fsync, replication, apply on each replica)
    would carry that much less. A delivery of max_batch * n_slots entries is
    answered by acks the application makes together, which go as one message
    (consumer.py, ack runs) and one record with the read they make room for.
    The application sees no difference: deliveries are yielded one entry at a
    time, each stream's in order, and each session's window is max_unacked."""
    if n_slots <= 1:
        return start.max_batch
    batch = start.max_batch or DEFAULT_BATCH
    window = MAX_BATCH if start.no_ack else (start.max_unacked or DEFAULT_MAX_UNACKED)
    return max(batch, min(batch * n_slots, window, MAX_BATCH))


class CrossShardSession(SessionProtocol):
    """One consumer over streams in any slots (module doc). Same interface as
    ConsumerSession: async iteration of Delivery, ack(key, ids), close()."""

    def __init__(self, client, start: pb.ConsumeStart):
        self._client = client
        self._start = start
        self._sessions: list = []          # ConsumerSession per slot, made on first use
        self._by_key: dict = {}            # stream key -> its session (ack routing)
        self._merged: asyncio.Queue | None = None   # lists of Deliveries from the pumps, _END, errors
        self._ready = collections.deque()          # the current list's Deliveries not yet yielded
        self._pumps: list = []
        self._running = 0                  # sessions whose iterator has not ended
        self._closed = False

    @property
    def sessions(self) -> list:
        """The per-slot ConsumerSessions (empty before the first delivery is asked for)."""
        return list(self._sessions)

    async def _open(self) -> None:
        keys = list(self._start.keys)
        parts = await self._client._split_by_slot(keys) or [keys]
        batch = slot_batch(self._start, len(parts))
        for part in parts:
            start = pb.ConsumeStart()
            start.CopyFrom(self._start)
            del start.keys[:]
            start.keys.extend(part)
            start.max_batch = batch
            session = ConsumerSession(self._client, start)
            self._sessions.append(session)
            for key in part:
                self._by_key[key] = session
        if len(self._sessions) > 1:
            # Bounded by the sessions' own max_unacked windows: each holds at
            # most that many unacked deliveries, so the queue cannot grow past them.
            self._merged = asyncio.Queue()
            self._running = len(self._sessions)
            self._pumps = [asyncio.ensure_future(self._pump(s)) for s in self._sessions]

    async def _pump(self, session) -> None:
        try:
            while True:
                try:
                    batch = await session.next_batch()
                except StopAsyncIteration:
                    break
                self._merged.put_nowait(batch)     # a list of Deliveries, in order
            self._merged.put_nowait(_END)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - handed to the reader, who raises it
            self._merged.put_nowait(e)

    async def __anext__(self):
        if not self._sessions:
            if self._closed:
                raise StopAsyncIteration
            await self._open()
        if self._merged is None:                   # one slot: no merging, no extra hop
            return await self._sessions[0].__anext__()
        if self._ready:
            return self._ready.popleft()
        while True:
            if self._running == 0:
                raise StopAsyncIteration
            item = await self._merged.get()
            if item is _END:
                self._running -= 1
                continue
            if isinstance(item, BaseException):
                self._merged.put_nowait(item)      # every later __anext__ raises it too
                raise item
            self._ready.extend(item)               # never empty
            return self._ready.popleft()

    async def ack(self, key, ids) -> int:
        """XACK through the session of the stream's slot."""
        if not self._sessions:
            await self._open()
        session = self._by_key.get(to_bytes(key))
        if session is None:
            raise KeyError(f"{key!r} is not one of this consumer's streams")
        return await session.ack(key, ids)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._pumps:
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await asyncio.gather(*(s.close() for s in self._sessions), return_exceptions=True)
        if self._merged is not None:
            self._merged.put_nowait(_Closed())
            self._running = 0


async def xread_fanout(client, parts: list, by_key: dict, count, block_ms, timeout) -> dict:
    """XREAD BLOCK over streams in several slots (module doc): {key: [StreamEntry]}."""
    tasks = [asyncio.ensure_future(client.xread({k: by_key[k] for k in part}, count, block_ms, timeout=timeout))
             for part in parts]
    replies = {}                                   # part index -> reply
    try:
        pending = set(tasks)
        while pending and not any(replies.values()):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                replies[tasks.index(task)] = task.result()      # an error ends the read: raised here
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # The parts whose blocking read was cancelled: what they hold now, without
    # blocking, as one XREAD over every stream would have answered.
    rest = [i for i in range(len(parts)) if i not in replies]
    if rest and any(replies.values()):
        now = await asyncio.gather(*(client.xread({k: by_key[k] for k in parts[i]}, count, timeout=timeout)
                                     for i in rest))
        replies.update(zip(rest, now))
    merged = {k: v for reply in replies.values() for k, v in reply.items()}
    return {k: merged[k] for k in by_key if k in merged}
