"""The async xraft client over grpc.aio: routing, retries, streaming.

    client = Client(seeds=["10.0.0.1:7100", "10.0.0.2:7100"], token="...")
    sid = await client.xadd("orders", {"item": "book"})
    async for key, entries in client.subscribe({"orders": "$"}): ...
    async for d in client.consume(["orders"], "billing", "worker-1"): ...; await d.ack()

Routing: requests go to the known leader, else to the seeds in turn. A
NOT_LEADER error names the leader; the client switches to it at once.
Retries: NOT_LEADER / UNAVAILABLE / TIMEOUT (nothing was applied) are retried
with exponential backoff and jitter until the call's overall deadline.

Writes and unknown outcomes: a write whose fate is unknown (the server says
UNKNOWN_OUTCOME, the deadline passed after sending, the connection broke) is
retried only when it carries a request id the server deduplicates
(`request_ids=True`, the default): the server's at-most-once table answers a
retry of an applied request with its first result. Without request ids the
SDK raises UnknownOutcomeError and never resends. The server keeps the last
DEDUP_WINDOW results per client id, so at most MAX_TRACKED_WRITES id-carrying
writes are in flight at once: more could push an unapplied request below the
window, where a retry is refused as stale (safe, but a failure).

The sync client (sync.py) runs this one on a private loop thread.
"""
import asyncio
import random
import secrets
from dataclasses import dataclass, field

import grpc

from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc

from .commands import Commands
from .errors import (DeadlineExceededError, NotLeaderError, UnavailableError, UnknownOutcomeError, WriteDeadlineError,
                     XRaftError, from_rpc_error)
from .types import StreamEntry, StreamID, streams_from_pb, to_bytes

REQUEST_ID_KEY = "xraft-request-id"       # metadata: "<client_id>:<seq>" (the server dedups on it)
DEDUP_WINDOW = 16                          # the server's results kept per client (fsm sessions)
MAX_TRACKED_WRITES = DEDUP_WINDOW // 2
MAX_MESSAGE_BYTES = 16 << 20               # the server's gRPC message limit (client.proto)
MAX_REDIRECTS = 8                          # NOT_LEADER hops per attempt before backing off


@dataclass
class _Node:
    channel: grpc.aio.Channel
    stub: pb_grpc.XRaftStub


class Client(Commands):
    def __init__(self, seeds, *, token: str | None = None, timeout: float = 10.0, backoff_base: float = 0.02,
                 backoff_max: float = 1.0, request_ids: bool = True, follower_reads: bool = False,
                 max_in_flight: int = 1024, channel_options=()):
        if isinstance(seeds, str):
            seeds = [seeds]
        self._seeds = list(seeds)
        if not self._seeds:
            raise ValueError("at least one seed address")
        self._token = token
        self.timeout = timeout
        self._backoff = (backoff_base, backoff_max)
        self._request_ids = request_ids
        self._follower_reads = follower_reads
        self._max_in_flight = max_in_flight
        self._channel_options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                 ("grpc.keepalive_time_ms", 20000),
                                 ("grpc.keepalive_timeout_ms", 10000), *channel_options]
        self._nodes: dict[str, _Node] = {}
        self._leader: str | None = None
        self._seed_index = 0
        # Request ids: a random client id (the server's session key) and a counter.
        self.client_id = secrets.randbits(63) or 1
        self._seq = 0
        self._in_flight = None             # semaphores, made on first use inside the running loop
        self._tracked = None
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        self._closed = True
        nodes, self._nodes = self._nodes, {}
        for node in nodes.values():
            await node.channel.close()

    @property
    def leader(self) -> str | None:
        """The address the client currently sends requests to first."""
        return self._leader

    # -- routing ----------------------------------------------------------------------

    def _node(self, address: str) -> _Node:
        node = self._nodes.get(address)
        if node is None:
            channel = grpc.aio.insecure_channel(address, options=self._channel_options)
            node = self._nodes[address] = _Node(channel, pb_grpc.XRaftStub(channel))
        return node

    def _target(self) -> str:
        return self._leader or self._seeds[self._seed_index % len(self._seeds)]

    def _observe_failure(self, address: str, err: XRaftError) -> bool:
        """Update the routing after `err` from `address`; True if the next
        attempt goes straight to a named leader (no backoff needed)."""
        if isinstance(err, NotLeaderError) and err.leader_address and err.leader_address != address:
            self._leader = err.leader_address
            return True
        if address == self._leader:
            self._leader = None
        self._seed_index += 1
        return False

    def _metadata(self, rid):
        md = []
        if self._token:
            md.append(("authorization", f"Bearer {self._token}"))
        if rid is not None:
            md.append((REQUEST_ID_KEY, f"{self.client_id}:{rid}"))
        return tuple(md)

    def _sleep_for(self, attempt: int, err: XRaftError) -> float:
        base, cap = self._backoff
        delay = min(cap, base * (2 ** attempt)) * random.uniform(0.5, 1.0)
        return max(delay, err.retry_after_ms / 1000)

    def _limits(self):
        if self._in_flight is None:
            self._in_flight = asyncio.Semaphore(self._max_in_flight)
            self._tracked = asyncio.Semaphore(MAX_TRACKED_WRITES)

    # -- the one unary path -------------------------------------------------------------

    async def _unary(self, rpc: str, request, *, write: bool, timeout=None):
        """Send `request` to the leader, following redirects and retrying what
        is safe to retry, until `timeout` (default: the client's) runs out."""
        if self._closed:
            raise UnavailableError("client closed")
        self._limits()
        async with self._in_flight:
            if write and self._request_ids:
                async with self._tracked:
                    self._seq += 1
                    return await self._attempts(rpc, request, write, timeout, self._seq)
            return await self._attempts(rpc, request, write, timeout, None)

    async def _attempts(self, rpc, request, write, timeout, rid):
        loop = asyncio.get_running_loop()
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout == float("inf") or timeout is None else loop.time() + timeout
        metadata = self._metadata(rid)
        if self._follower_reads and not write:
            request.options.allow_follower_read = True
        attempt = redirects = 0
        last: XRaftError | None = None
        uncertain = False                  # some attempt may have been applied
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise _out_of_time(last, uncertain)
            if remaining is not None:
                # The server gives up (cleanly, before proposing if it can) a
                # little before the client does, so its answer gets back in time.
                request.options.deadline_hint_ms = max(1, min(600_000, int(remaining * 1000 * 0.9)))
            address = self._target()
            try:
                return await getattr(self._node(address).stub, rpc)(request, timeout=remaining, metadata=metadata)
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e, write=write)
            last = err
            uncertain = uncertain or isinstance(err, UnknownOutcomeError)
            if isinstance(err, UnknownOutcomeError):
                # Resending is safe only when the server dedups on the request id.
                if rid is None or isinstance(err, WriteDeadlineError):
                    raise err
            elif not err.retriable:
                raise err
            if self._observe_failure(address, err) and redirects < MAX_REDIRECTS:
                redirects += 1
                continue
            redirects = 0
            delay = self._sleep_for(attempt, err)
            attempt += 1
            if remaining is not None:
                delay = min(delay, max(0.0, deadline - loop.time()))
            await asyncio.sleep(delay)

    # -- streaming --------------------------------------------------------------------

    async def subscribe(self, streams: dict, *, max_batch: int = 0, follower_read: bool = False):
        """Tail streams: {key: id | "$"} -> yields (key, [StreamEntry]) as
        entries arrive, forever. On a leader change or a lost connection it
        resubscribes after the last ID it yielded per stream (no entry missed
        or repeated), giving up after `timeout` seconds without a success.
        ("$" not yet past its first entry is resolved again on resubscribe.)"""
        after = {to_bytes(k): v for k, v in streams.items()}
        failing_since = None
        attempt = 0
        loop = asyncio.get_running_loop()
        while True:
            req = pb.SubscribeRequest(max_batch=max_batch)
            req.options.allow_follower_read = follower_read or self._follower_reads
            for key, pos in after.items():
                s = req.streams.add(key=key)
                if pos in ("$", b"$"):
                    s.new_entries_only = True
                else:
                    s.after.CopyFrom(StreamID.parse(pos).to_pb())
            address = self._target()
            call = self._node(address).stub.Subscribe(req, metadata=self._metadata(None))
            try:
                async for resp in call:
                    failing_since, attempt = None, 0
                    for s in resp.streams:
                        entries = [StreamEntry(StreamID(e.id.ms, e.id.seq), tuple((f.name, f.value) for f in e.fields))
                                   for e in s.entries]
                        if entries:
                            after[s.key] = entries[-1].id
                            yield s.key, entries
                return                              # the server ended the stream cleanly
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e, write=False)
            finally:
                call.cancel()
            if not err.retriable:
                raise err
            now = loop.time()
            failing_since = failing_since or now
            if now - failing_since > self.timeout:
                raise err
            if not self._observe_failure(address, err):
                await asyncio.sleep(self._sleep_for(attempt, err))
                attempt += 1

    def consume(self, keys, group, consumer, *, max_unacked: int = 0, max_batch: int = 0, no_ack: bool = False,
                replay_pending_after=None) -> "ConsumerSession":
        """Consume a group over one bidirectional stream: `async for d in
        client.consume(...)` yields Delivery objects; `await d.ack()` (or
        session.ack(key, ids)) acknowledges. Use as `async with` to close it."""
        start = pb.ConsumeStart(keys=[to_bytes(k) for k in keys], group=to_bytes(group),
                                consumer=to_bytes(consumer), max_unacked=max_unacked, max_batch=max_batch,
                                no_ack=no_ack)
        if replay_pending_after is not None:
            start.replay_pending_after.CopyFrom(StreamID.parse(replay_pending_after).to_pb())
        return ConsumerSession(self, start)


def _out_of_time(last: XRaftError | None, uncertain: bool) -> XRaftError:
    """The error for a call whose retries ran out of time: a write that may
    have been applied by any attempt stays an unknown outcome."""
    if uncertain:
        err = WriteDeadlineError(f"deadline exceeded; last attempt: {last.message}")
    else:
        err = DeadlineExceededError("deadline exceeded" + (f"; last error: {last.message}" if last else ""),
                                    retriable=False)
    err.__cause__ = last
    return err


@dataclass
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


class ConsumerSession:
    """One Consume call: a reader task routes deliveries to the iterator and
    ack results to the futures waiting for them, so acking inside the loop
    body never waits on the loop itself. On a retriable failure the session
    reconnects (to the leader the error names), first replaying this
    consumer's pending entries, and resends the acks not yet confirmed
    (XACK is idempotent): delivery is at least once."""

    def __init__(self, client: Client, start: pb.ConsumeStart):
        self._client = client
        self._start = start
        self._queue: asyncio.Queue = asyncio.Queue()
        self._acks: dict[int, tuple] = {}          # ack_seq -> (key, ids, future)
        self._ack_seq = 0
        self._call = None
        self._task = None
        self._closed = False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Delivery:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)           # every later __anext__ sees it too
            if isinstance(item, _Closed):
                raise StopAsyncIteration
            raise item
        return item

    async def ack(self, key, ids) -> int:
        """XACK through the stream; the number of IDs that were pending."""
        if self._closed:
            raise UnavailableError("consumer closed")
        self._ack_seq += 1
        ids = [StreamID.parse(i) for i in ids]
        fut = asyncio.get_running_loop().create_future()
        self._acks[self._ack_seq] = (to_bytes(key), ids, fut)
        if self._call is not None:
            await self._send_ack(self._ack_seq)
        return await fut

    async def _send_ack(self, seq: int) -> None:
        key, ids, _ = self._acks[seq]
        try:
            await self._call.write(pb.ConsumeRequest(ack=pb.ConsumeAck(key=key, ids=[i.to_pb() for i in ids],
                                                                       ack_seq=seq)))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            pass                                   # the reader sees the failure and resends after reconnecting

    async def _run(self) -> None:
        client, loop = self._client, asyncio.get_running_loop()
        attempt, failing_since = 0, None
        start = self._start
        while not self._closed:
            address = client._target()
            self._call = call = client._node(address).stub.Consume(metadata=client._metadata(None))
            try:
                await call.write(pb.ConsumeRequest(start=start))
                for seq in list(self._acks):
                    await self._send_ack(seq)
                async for resp in call:
                    attempt, failing_since = 0, None
                    if resp.WhichOneof("body") == "ack_result":
                        pending = self._acks.pop(resp.ack_result.ack_seq, None)
                        if pending is not None and not pending[2].done():
                            pending[2].set_result(resp.ack_result.acked)
                        continue
                    for key, entries in streams_from_pb(resp.delivery.streams).items():
                        for entry in entries:
                            self._queue.put_nowait(Delivery(key, entry, self))
                self._finish(_Closed())
                return
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e, write=False)
            finally:
                call.cancel()
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
            if not client._observe_failure(address, err):
                await asyncio.sleep(client._sleep_for(attempt, err))
                attempt += 1

    def _finish(self, exc: BaseException) -> None:
        self._queue.put_nowait(exc)
        for _, _, fut in self._acks.values():
            if not fut.done():
                fut.set_exception(exc if isinstance(exc, XRaftError) else UnavailableError("consumer closed"))
        self._acks.clear()

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
