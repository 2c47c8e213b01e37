"""Consumer-group streaming for the async client: one Consume call per session.

`Client.consume(...)` returns a ConsumerSession; iterating it yields Delivery
objects, `await d.ack()` acknowledges (see ConsumerSession for how acks travel
and what happens on a failover).
"""
import asyncio
import collections
from dataclasses import dataclass, field

import grpc

from xraft.proto.v1 import client_pb2 as pb

from .errors import UnavailableError, UnknownOutcomeError, XRaftError, detail_of, from_rpc_error
from .types import StreamEntry, StreamID, to_bytes

MAX_ACK_IDS = 10_000                       # IDs in one ConsumeAck message (the server's limit)
MAX_ACKS_IN_FLIGHT = 1024                  # unconfirmed acks per consumer session before ack() waits


@dataclass(slots=True)
class Delivery:
    """One entry delivered to this consumer; ack() it once processed."""
    key: bytes
    entry: StreamEntry
    session: "ConsumerSession" = field(repr=False)

    @property
    def id(self) -> StreamID:
        return self.entry.id

    async def ack(self) -> int:
        return await self.session.ack(self.key, [self.entry.id])

    async def delivery_count(self) -> int:
        """How many times the group has delivered this entry so far (XPENDING
        of its ID; 0 once it is acked, dead-lettered or was read with NOACK).
        With a dead-letter policy (XRAFT.GROUPCFG) an entry is delivered at
        most `max_deliveries` times."""
        client, start = self.session._client, self.session._start
        entries = await client.xpending_range(self.key, start.group, self.entry.id, self.entry.id, 1)
        return entries[0].delivery_count if entries else 0


class SessionProtocol:
    """`async with` (close() on exit) and `async for` over a consumer session."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def __aiter__(self):
        return self


class ConsumerSession(SessionProtocol):
    """One Consume call: a reader task routes deliveries to the iterator and
    ack results to the futures waiting for them, so acking inside the loop
    body never waits on the loop itself. On a retriable failure the session
    reconnects (to the leader the error names), first replaying this
    consumer's pending entries, and resends the acks not yet confirmed
    (XACK is idempotent). A replayed entry this session already delivered
    and has not seen an ack confirmed for is skipped (the application holds
    it, or its ack is in flight): within one session no entry is delivered
    twice; a new session (a restart) gets every pending entry again.

    Acks: grpc.aio allows one write at a time on a stream, so ack() never
    writes itself. It records the ack (unconfirmed until its AckResult
    arrives) and queues its number for the stream's one writer task, so any
    number of ack() calls may overlap (up to MAX_ACKS_IN_FLIGHT unconfirmed;
    beyond that ack() waits for room). A write that fails ends that stream:
    the session reconnects and resends every unconfirmed ack, in order. An
    ack is never dropped: it is confirmed, or its ack() raises the error that
    ended the session -- except that an ack already written to a stream may
    have been applied, so when a retriable error or close() ends the session
    its ack() raises UnknownOutcomeError, never a "nothing happened" error
    (UnavailableError says nothing was applied). Acks queued together are
    written as one ConsumeAck of runs when the server takes them (_write_acks):
    each run is still its own XACK with its own AckResult and count."""

    def __init__(self, client, start: pb.ConsumeStart):
        self._client = client
        self._start = start
        self._queue: asyncio.Queue = asyncio.Queue()  # lists of Delivery (one per message), then the end
        self._ready: collections.deque = collections.deque()   # the current list's Deliveries not yet yielded
        self._acks: dict[int, tuple] = {}          # ack_seq -> (key, ids, future), unconfirmed, in order
        self._sent: set[int] = set()               # ack_seqs of _acks handed to a stream's write at least once
        # key -> IDs delivered by this session (queued or yielded) whose ack is
        # not confirmed: a reconnect's replay of the PEL skips them, so the
        # application never sees an entry twice in one session (bounded by
        # max_unacked: the server delivers no more unacked entries than that).
        self._held: dict[bytes, set] = {}
        self._ack_seq = 0
        self._ack_room = None                      # semaphore of MAX_ACKS_IN_FLIGHT, made on first use
        self._ack_runs = False                     # the live stream's server takes ConsumeAck.run_lengths
        self._outbox: asyncio.Queue | None = None  # ack_seqs for the live stream's writer; None between streams
        self._broken: BaseException | None = None  # why the writer ended the live stream
        self._ended: BaseException | None = None   # why the session ended
        self._call = None
        self._task = None
        self._closed = False

    async def __anext__(self) -> Delivery:
        if self._ready:
            return self._ready.popleft()
        self._ready.extend(await self.next_batch())     # never empty
        return self._ready.popleft()

    async def next_batch(self) -> list:
        """The deliveries not yet yielded, or the next delivery message's (a
        non-empty list); StopAsyncIteration at the end. For a caller that
        merges sessions (crossshard.py): one hop per message, not per entry."""
        if self._ready:
            batch = list(self._ready)
            self._ready.clear()
            return batch
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)           # every later call sees it too
            if isinstance(item, _Closed):
                raise StopAsyncIteration
            raise item
        return item

    async def ack(self, key, ids) -> int:
        """XACK through the stream; the number of IDs that were pending.
        Safe to call concurrently (see the class doc)."""
        ids = [i if i.__class__ is StreamID else StreamID.parse(i) for i in ids]
        if self._ack_room is None:
            self._ack_room = asyncio.Semaphore(MAX_ACKS_IN_FLIGHT)
        async with self._ack_room:
            self._check_open()
            self._ack_seq += 1
            seq = self._ack_seq
            fut = asyncio.get_running_loop().create_future()
            self._acks[seq] = (to_bytes(key), ids, fut)
            if self._outbox is not None:
                self._outbox.put_nowait(seq)       # else sent when the next stream starts
            return await fut

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError("consumer closed")
        if self._ended is not None:
            if isinstance(self._ended, XRaftError):
                raise self._ended
            raise UnavailableError("consumer closed")

    async def _write_acks(self, call, outbox: asyncio.Queue) -> None:
        """The stream's only writer after `start`. Acks queued together go
        together: to a server whose deliveries say ack_runs, the consecutive
        ack_seqs of one stream go as one message of runs (each still its own
        XACK and AckResult), which the server writes as one record; a message
        per ack would give the first its own record and the rest the next one.
        Otherwise one message per ack."""
        carried = None                             # taken from the outbox, did not fit the last message
        while True:
            if carried is None:
                seq = await outbox.get()
            else:
                seq, carried = carried, None
            pending = self._acks.get(seq)
            if pending is None:
                continue                           # confirmed meanwhile
            key, ids, _ = pending
            req = pb.ConsumeRequest()
            ack = req.ack
            ack.key, ack.ack_seq = key, seq
            add = ack.ids.add
            for i in ids:
                add(ms=i.ms, seq=i.seq)
            seqs = [seq]
            if self._ack_runs and not outbox.empty():
                lengths, total = [len(ids)], len(ids)
                while not outbox.empty():
                    nxt = outbox.get_nowait()
                    more = self._acks.get(nxt)
                    if more is None or nxt != seqs[-1] + 1 or more[0] != key or total + len(more[1]) > MAX_ACK_IDS:
                        carried = nxt
                        break
                    for i in more[1]:
                        add(ms=i.ms, seq=i.seq)
                    seqs.append(nxt)
                    lengths.append(len(more[1]))
                    total += len(more[1])
                if len(seqs) > 1:
                    ack.run_lengths.extend(lengths)
            for seq in seqs:
                self._sent.add(seq)                # from here its outcome is unknown until confirmed
            try:
                await call.write(req)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the stream is unusable: end it, resend on the next
                self._broken = e
                call.cancel()
                return

    async def _run(self) -> None:
        client, loop = self._client, asyncio.get_running_loop()
        attempt, failing_since = 0, None
        start = self._start
        try:
            slot = await client._slot_of(list(start.keys), None)
        except XRaftError as e:
            self._finish(e)
            return
        while not self._closed:
            address = client._route(slot)
            self._call = call = client._node(address).stub.Consume(metadata=client._metadata(None))
            self._broken = None
            writer = None
            try:
                await call.write(pb.ConsumeRequest(start=start))
                # Every unconfirmed ack, in order, then the new ones as ack() queues them.
                self._outbox = outbox = asyncio.Queue()
                self._ack_runs = False             # until this stream's server says it takes runs
                for seq in self._acks:
                    outbox.put_nowait(seq)
                writer = asyncio.ensure_future(self._write_acks(call, outbox))
                async for resp in call:
                    attempt, failing_since = 0, None
                    if resp.WhichOneof("body") == "ack_result":
                        pending = self._acks.pop(resp.ack_result.ack_seq, None)
                        self._sent.discard(resp.ack_result.ack_seq)
                        if pending is not None:
                            held = self._held.get(pending[0])
                            if held is not None:
                                held.difference_update(pending[1])
                            if not pending[2].done():
                                pending[2].set_result(resp.ack_result.acked)
                        continue
                    self._ack_runs = resp.delivery.ack_runs
                    batch = self._deliveries(resp.delivery.streams)
                    if batch:
                        self._queue.put_nowait(batch)
                self._finish(_Closed())
                return
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e, write=False)
                if e.code() == grpc.StatusCode.INTERNAL and detail_of(e) is None:
                    # grpc-core's own status for a write that lost the race with
                    # the server's end of the call: the server's status is lost,
                    # so reconnect; the new stream reports it again if it stands.
                    err = UnavailableError(f"consume stream broken: {err.message}", grpc_code=e.code())
            except (asyncio.CancelledError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
                # The writer ended the stream (call.cancel()), or the start
                # write found it ended; a cancel of this task itself propagates.
                if self._closed or asyncio.current_task().cancelling():
                    raise
                cause = self._broken or e
                err = UnavailableError(f"consume stream broken: {type(cause).__name__}: {cause}")
            finally:
                self._outbox = None
                call.cancel()
                if writer is not None:
                    writer.cancel()
                    await asyncio.wait([writer])   # its own cancel is not raised here; ours is
            if self._closed:
                return
            now = loop.time()
            failing_since = failing_since or now
            if not err.retriable or now - failing_since > client.timeout:
                self._finish(err)
                return
            # Resume: this consumer's pending entries first, then new ones.
            start = pb.ConsumeStart()
            start.CopyFrom(self._start)
            start.replay_pending_after.CopyFrom(pb.StreamId())
            if not client._observe_failure(address, err, slot):
                await asyncio.sleep(client._sleep_for(attempt, err))
                attempt += 1

    def _deliveries(self, streams) -> list:
        """One delivery message's entries as Delivery objects, in order (what
        types.streams_from_pb builds, without the intermediate dict)."""
        # The hot path of a consumer: StreamID and the frozen StreamEntry are
        # built without their Python-level __new__/__init__ (the same objects:
        # a tuple subclass, and a dataclass instance's attribute dict).
        out = []
        append = out.append
        new_tuple, new_object = tuple.__new__, object.__new__
        sid_cls, entry_cls = StreamID, StreamEntry
        track = not self._start.no_ack
        for s in streams:
            key = s.key
            held = self._held.get(key) if track else None
            if held is None and track:
                held = self._held[key] = set()
            for m in s.entries:
                sid = m.id
                sid = new_tuple(sid_cls, (sid.ms, sid.seq))
                if track:
                    if sid in held:
                        continue                   # replayed after a reconnect, and still held here
                    held.add(sid)
                entry = new_object(entry_cls)
                d = entry.__dict__
                d["id"] = sid
                d["fields"] = tuple([(f.name, f.value) for f in m.fields])
                d["deleted"] = m.deleted
                append(Delivery(key, entry, self))
        return out

    def _finish(self, exc: BaseException) -> None:
        if self._ended is None:
            self._ended = exc
        self._queue.put_nowait(exc)
        final = isinstance(exc, XRaftError) and not exc.retriable    # the server's definite refusal
        for seq, (_, _, fut) in self._acks.items():
            if fut.done():
                continue
            if seq in self._sent and not final:
                fut.set_exception(UnknownOutcomeError(
                    f"ack sent, but the consumer session ended before its result ({exc!r}): it may have been applied"))
            else:
                fut.set_exception(exc if isinstance(exc, XRaftError) else UnavailableError("consumer closed"))
        self._acks.clear()
        self._sent.clear()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._call is not None:
            self._call.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self._finish(_Closed())


class _Closed(Exception):
    """The end of a consumer session (closed, or the server ended it)."""
