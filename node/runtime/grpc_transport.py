"""GrpcTransport: the Transport (transport.py) between node processes, over gRPC Peer.Stream.

Streams. Each ordered node pair (a -> b) has ONE long-lived bidi Peer.Stream
dialled by `a` and carrying only a's batches to b (the response direction
carries b's Hello and nothing else). So a node dials every peer (its
outgoing links, `_Link`) and serves every peer's stream to it (inbound
streams). Both share nothing: a broken direction never stalls the other.

Handshake (peer_auth.py). The dialler sends its Hello, the acceptor checks it
(cluster id, known node id, HMAC proof) and answers with its own Hello bound to
the dialler's nonce, which the dialler checks (and the acceptor's incarnation);
the dialler confirms with a third Hello bound to the acceptor's nonce, which
the acceptor checks (and the dialler's incarnation). No clock is compared, but
each side keeps the other's clock reading from the handshake (peer_clock_skews(),
add_clock_listener(): the leader caps replicated time by the group's clocks).
Until all three passed, nothing is delivered and nothing is sent: a process
without the cluster's secret can never vote or append. A refusal ends
the call with the status named in peer.proto and is logged on both sides.

Sending. send() never blocks and never raises into the Raft loop:
  * refused (False) when the link is not up (never connected, or broken and
    waiting to reconnect), when a message is larger than the peer's envelope
    limit (it could never be delivered), or when the link's queue is full
    (max_queued_batches / max_queued_bytes): backpressure turns into
    report_unreachable instead of memory;
  * otherwise the messages are encoded at once (exact sizes for the limits)
    and queued; the link's writer coalesces queued batches into envelopes of
    at most the peer's max_envelope_bytes and max_batch_messages (a large
    batch is split over several envelopes).
A batch counts as delivered once gRPC accepted its last envelope (call.write
returned: the bytes are in HTTP/2 flow control). When a stream breaks, every
batch still queued or being written is handed back through
handler.unreachable(peer, lost) — one call with all of them — and the link
redials with capped exponential backoff (jittered; reset after a handshake).
Loss after write() (a crash of the receiver with bytes in its socket) is
silent, which Raft's retries absorb.

Receiving. Envelopes of one inbound stream are read one at a time and each
is delivered as one batch, in order. A newer stream from the same node (it
restarted, or redialled after a break) supersedes the older one, which stops
delivering before the new one starts: batches of a link are never reordered.
Every byte is checked: a frame other than RaftBatch after the Hello, a batch
of 0 or more than max_batch_messages messages, or a message whose sender or
receiver is not the stream's authenticated pair ends the stream
(INVALID_ARGUMENT) and is logged — except that a forwarded proposal, ReadIndex
or transfer request keeps its originator as sender (types.link_violation: a
node passing on a request it was forwarded must not cut its own link); a
message the codec cannot decode is dropped and counted (peer.proto: it does not end the stream, so one message
kind a newer peer speaks cannot cut a whole link). Envelopes over our
max_envelope_bytes are refused by gRPC itself (max_receive_message_length).
SnapshotChunk / SnapshotAck frames are not used: the Raft core already cuts
snapshots into bounded SNAP messages (max_snapshot_chunk_bytes), which travel
in RaftBatches like any other message; receiving one ends the stream.

Liveness. HTTP/2 keepalive pings on both sides notice a peer that vanished
without closing its socket (power loss, partition); a stuck receiver shows
as a full queue. The node's own server must allow those pings and set the
receive limit: build it with server_options() (or use serve() in tests).

TLS: TlsConfig gives standard grpc ssl credentials (server cert/key, the CA
that signs peers); the HMAC handshake runs inside it all the same. Client
certificates are required by default (mutual TLS). A node that serves its
client API on the same port turns that off (require_client_cert=False), so
SDK clients need only the CA: one gRPC port cannot ask some callers for a
certificate and not others. Trade-off: dialling peers still present their
certificate, but the server no longer asks for it, so a peer is authenticated
by the HMAC Hello alone (which already refuses anything without the secret)
instead of by both; the link stays encrypted and the dialler still verifies
the acceptor's certificate against the CA.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
import time
from collections import deque
from typing import Callable, Optional

import grpc
from google.protobuf.message import DecodeError

from ...proto.v1 import peer_pb2, peer_pb2_grpc
from ..cluster.slot_map import node_of_replica
from ..raft.codec import CodecError, decode_message, encode_message
from . import latency_trace
from ..raft.types import Message, link_violation
from .peer_auth import MAX_ENVELOPE_BYTES, MIN_ENVELOPE_BYTES, HelloRefused, PeerAuthenticator, \
    RefusalCode
from .grpc_transport_config import (LinkStats, TlsConfig, TransportError, TransportLimits,  # noqa: F401
                                    TransportStats, _channel_options, server_options)
from .transport import Batch, TransportHandler

log = logging.getLogger("xraft.grpc_transport")

STREAM_METHOD = "/xraft.v1.Peer/Stream"
# Protobuf framing around one GroupMessage inside a RaftBatch, at most: its own tag and
# length (1 + 5), group_id (1 + 10), message tag and length (1 + 5). The envelope adds
# the `raft` field's tag and length (1 + 5).
GROUP_MESSAGE_OVERHEAD = 23
ENVELOPE_OVERHEAD = 6


class _RateLimitedLog:
    """At most one record per key per interval: a peer sending garbage at line rate
    must not turn into a disk-filling log."""

    def __init__(self, interval_s: float = 10.0):
        self.interval_s = interval_s
        self._last: dict[object, tuple[float, int]] = {}

    def __call__(self, level: int, key: object, msg: str, *args) -> None:
        now = time.monotonic()
        last, suppressed = self._last.get(key, (-1e18, 0))
        if now - last < self.interval_s:
            self._last[key] = (last, suppressed + 1)
            return
        if len(self._last) > 1024:
            self._last.clear()
        self._last[key] = (now, 0)
        if suppressed:
            msg += f" ({suppressed} similar suppressed)"
        log.log(level, msg, *args)


# ---------------------------------------------------------------- outgoing links


class _LinkBroken(Exception):
    pass


def _wake(waiter: asyncio.Future, _task=None) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Item:
    """One accepted batch: the caller's messages (for `lost`) and their encodings."""

    __slots__ = ("batch", "encoded", "wire")

    def __init__(self, batch: Batch, encoded: list[tuple[int, bytes]], wire: int):
        self.batch = batch
        self.encoded = encoded
        self.wire = wire  # upper bound of its bytes inside an envelope


_DOWN, _CONNECTING, _UP = "down", "connecting", "up"


class _Link:
    def __init__(self, peer: int, address: str, stats: LinkStats):
        self.peer = peer
        self.address = address
        self.stats = stats
        self.state = _DOWN
        self.queue: deque[_Item] = deque()
        self.queued_bytes = 0
        self.waiter: Optional[asyncio.Future] = None  # the idle writer's wake-up (see _pump)
        self.envelope_limit = MIN_ENVELOPE_BYTES  # the peer's, learnt from its Hello
        self.task: Optional[asyncio.Task] = None
        self.last_error = ""

    def drain(self) -> list[tuple[int, Message]]:
        lost: list[tuple[int, Message]] = []
        for it in self.queue:
            lost.extend(it.batch)
        self.stats.batches_lost += len(self.queue)
        self.queue.clear()
        self.queued_bytes = 0
        return lost


class _Inbound:
    """An authenticated inbound stream's handler task, and why we are ending it (if we are)."""

    __slots__ = ("task", "stop_reason")

    def __init__(self, task: asyncio.Task):
        self.task = task
        self.stop_reason: Optional[tuple[grpc.StatusCode, str]] = None

    def stop(self, code: grpc.StatusCode, reason: str) -> None:
        self.stop_reason = (code, reason)
        self.task.cancel()


class _PeerServicer(peer_pb2_grpc.PeerServicer):
    def __init__(self, transport: "GrpcTransport"):
        self._t = transport

    async def Stream(self, request_iterator, context):
        # context.read()/write() instead of the iterator: the handshake is sequential
        # code and a refusal is one abort().
        await self._t._serve_inbound(context)


_REFUSAL_STATUS = {
    RefusalCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    RefusalCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    RefusalCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    RefusalCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# A dial refused with one of these is a configuration problem, not a hiccup: log it loudly.
_CONFIG_STATUSES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION,
                              grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                              grpc.StatusCode.UNIMPLEMENTED})


class GrpcTransport:
    """One node's endpoint. Usage on a node:

        t = GrpcTransport(node_id, cluster_id, load_secret(...), "0.0.0.0:7000", {2: "h2:7000", ...})
        server = grpc.aio.server(options=server_options(t.limits))
        t.add_to_server(server); bind the port (t.server_credentials() when TLS); await server.start()
        t.start(multiraft)   # MultiRaft.start() does this

    Tests use `await t.serve()` for a server of its own on listen_addr.
    """

    def __init__(self, node_id: int, cluster_id: str, secret: bytes, listen_addr: str,
                 peers: dict[int, str], tls: Optional[TlsConfig] = None,
                 limits: TransportLimits = TransportLimits(), advertise_address: Optional[str] = None,
                 incarnation: Optional[bytes] = None,
                 check_incarnation: Optional[Callable[[int, bytes], None]] = None,
                 clocks: Optional[dict] = None):
        limits.validate()
        if node_id in peers:
            raise TransportError(f"node {node_id} lists itself as a peer")
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.listen_addr = listen_addr
        self.tls = tls
        self.limits = limits
        self.stats = TransportStats()
        # incarnation / check_incarnation: node_main passes the data dir's (incarnation.py);
        # without them this is a fresh incarnation that accepts any peer's (tests).
        # clocks: {"clock_ms": wall, "mono_ms": monotonic} for tests; the real ones otherwise.
        self.auth = PeerAuthenticator(node_id, cluster_id, secret, known_node=self._is_peer,
                                      incarnation=incarnation,
                                      max_envelope_bytes=limits.max_envelope_bytes,
                                      advertise_address=advertise_address or listen_addr,
                                      **({} if check_incarnation is None else
                                         {"check_incarnation": check_incarnation}), **(clocks or {}))
        self._clock_listeners: list[Callable[[], None]] = []
        self.handler: Optional[TransportHandler] = None
        # Called with a peer's id when it refuses our link for configuration (we are not, or no
        # longer, its peer): the node above may hold an old slot map (membership.py).
        self.on_config_refusal: Optional[Callable[[int], None]] = None
        self.port: Optional[int] = None  # bound by serve()
        self._server: Optional[grpc.aio.Server] = None
        self._links: dict[int, _Link] = {}
        self._inbound: dict[int, _Inbound] = {}  # node -> its current stream to us
        self._handshaking = 0
        self._closed = False
        self._rlog = _RateLimitedLog()
        for peer, addr in peers.items():
            self._new_link(peer, addr)

    # ------------------------------------------------ membership

    def _is_peer(self, node: int) -> bool:
        return node in self._links

    def _new_link(self, peer: int, address: str) -> _Link:
        if peer <= 0:
            raise TransportError(f"peer id {peer} must be > 0")
        st = self.stats.links.setdefault(peer, LinkStats())
        link = self._links[peer] = _Link(peer, address, st)
        return link

    def add_peer(self, peer: int, address: str) -> None:
        """A node joined (or moved): dial it. Replaces the link of a known peer."""
        if peer == self.node_id:
            raise TransportError("a node is not its own peer")
        self.remove_peer(peer)
        link = self._new_link(peer, address)
        if self.handler is not None and not self._closed:
            link.task = asyncio.get_running_loop().create_task(self._run_link(link), name=f"peer-link-{peer}")

    def remove_peer(self, peer: int) -> None:
        """A node left: stop dialling it and refuse its streams."""
        link = self._links.pop(peer, None)
        self.auth.peer_clocks.forget(peer)
        if link is not None and link.task is not None:
            link.task.cancel()
        entry = self._inbound.pop(peer, None)
        if entry is not None:
            entry.stop(grpc.StatusCode.PERMISSION_DENIED, f"node {peer} is no longer a peer")

    # ------------------------------------------------ life cycle

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the Peer service on the node's server (before server.start())."""
        peer_pb2_grpc.add_PeerServicer_to_server(_PeerServicer(self), server)

    def server_credentials(self) -> Optional[grpc.ServerCredentials]:
        return self.tls.server_credentials() if self.tls is not None else None

    async def serve(self) -> int:
        """Standalone server on listen_addr (tests, tools); returns the bound port."""
        if self._server is not None or self._closed:
            raise TransportError("serve() called twice or after close()")
        server = grpc.aio.server(options=server_options(self.limits))
        self.add_to_server(server)
        creds = self.server_credentials()
        try:
            port = server.add_secure_port(self.listen_addr, creds) if creds is not None \
                else server.add_insecure_port(self.listen_addr)
        except RuntimeError as exc:  # grpc raises RuntimeError when it cannot bind
            raise TransportError(f"cannot listen on {self.listen_addr}: {exc}") from exc
        await server.start()
        self._server, self.port = server, port
        return port

    def start(self, handler: TransportHandler) -> None:
        if self._closed:
            raise TransportError(f"transport of node {self.node_id} is closed")
        if self.handler is not None:
            raise TransportError("start() called twice")
        self.handler = handler
        loop = asyncio.get_running_loop()
        for link in self._links.values():
            link.task = loop.create_task(self._run_link(link), name=f"peer-link-{link.peer}")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.handler = None  # queued batches are dropped, not reported (Transport.close)
        tasks = [link.task for link in self._links.values() if link.task is not None]
        for t in tasks:
            t.cancel()
        for entry in self._inbound.values():
            entry.stop(grpc.StatusCode.UNAVAILABLE, "node shutting down")
            tasks.append(entry.task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(grace=None)

    def peer_clock_skews(self) -> dict[int, int]:
        """{peer: its clock minus ours (ms), now}, as read in its last handshake (peer_auth.PeerClocks)."""
        return {n: d for n, d in self.auth.peer_clock_skews().items() if self._is_peer(n)}

    def add_clock_listener(self, callback: Callable[[], None]) -> None:
        """callback() after every handshake that read a peer's clock (peer_clock_skews changed)."""
        self._clock_listeners.append(callback)

    def _clock_read(self) -> None:
        for cb in list(self._clock_listeners):
            try:
                cb()
            except Exception:
                log.exception("clock listener failed")

    def link_up(self, peer: int) -> bool:
        link = self._links.get(peer)
        return link is not None and link.state == _UP

    # ------------------------------------------------ sending

    def send(self, to_node: int, batch: Batch) -> bool:
        link = self._links.get(to_node)
        if link is None or self._closed or not batch:
            return False
        st = link.stats
        if link.state != _UP:
            st.refused_down += 1
            return False
        if len(link.queue) >= self.limits.max_queued_batches:
            st.refused_full += 1
            return False
        # Encode now: exact sizes for the limits, and an unencodable message is refused
        # here, in the caller's context, instead of killing the link's writer.
        fits = link.envelope_limit - ENVELOPE_OVERHEAD - GROUP_MESSAGE_OVERHEAD
        encoded = []
        wire = 0
        try:
            for gid, m in batch:
                b = encode_message(m)
                if len(b) > fits:
                    st.refused_oversize += 1
                    self._rlog(logging.WARNING, ("oversize", to_node),
                               "node %d: a %s message of %d bytes for node %d is over its envelope limit "
                               "(%d bytes); refused", self.node_id, m.type.name, len(b), to_node,
                               link.envelope_limit)
                    return False
                encoded.append((gid, b))
                wire += len(b) + GROUP_MESSAGE_OVERHEAD
        except (CodecError, ValueError, TypeError, AttributeError) as exc:
            self._rlog(logging.ERROR, ("encode", to_node), "node %d: cannot encode a batch for node %d: %r",
                       self.node_id, to_node, exc)
            return False
        if link.queued_bytes + wire > self.limits.max_queued_bytes:
            st.refused_full += 1
            return False
        if latency_trace.ON:
            latency_trace.mark_messages("queued", to_node, (m for _, m in batch))
        link.queue.append(_Item(batch, encoded, wire))
        link.queued_bytes += wire
        st.batches_accepted += 1
        st.messages_accepted += len(encoded)
        w = link.waiter
        if w is not None and not w.done():
            w.set_result(None)
        return True

    def _next_envelopes(self, link: _Link) -> tuple[int, list[bytes]]:
        """Envelopes for the first k queued items: as many whole batches as fit one
        envelope (fewer, larger writes under load), or one batch split over several."""
        limit = link.envelope_limit - ENVELOPE_OVERHEAD
        max_msgs = self.limits.max_batch_messages
        q = link.queue
        first = q[0]
        if first.wire <= limit and len(first.encoded) <= max_msgs:
            k, wire, count = 1, first.wire, len(first.encoded)
            for it in itertools.islice(q, 1, None):
                if wire + it.wire > limit or count + len(it.encoded) > max_msgs:
                    break
                k, wire, count = k + 1, wire + it.wire, count + len(it.encoded)
            chunks = [[gm for it in itertools.islice(q, 0, k) for gm in it.encoded]]
        else:
            k, chunks, cur, wire = 1, [], [], 0
            for gid, b in first.encoded:
                n = len(b) + GROUP_MESSAGE_OVERHEAD
                if cur and (wire + n > limit or len(cur) >= max_msgs):
                    chunks.append(cur)
                    cur, wire = [], 0
                cur.append((gid, b))
                wire += n
            chunks.append(cur)
        GM = peer_pb2.GroupMessage
        envs = [peer_pb2.PeerEnvelope(raft=peer_pb2.RaftBatch(
            messages=[GM(group_id=gid, message=b) for gid, b in chunk])).SerializeToString() for chunk in chunks]
        return k, envs

    async def _run_link(self, link: _Link) -> None:
        """Dial, handshake, pump; on any break report the unsent batches and redial."""
        backoff = self.limits.backoff_initial_s
        while not self._closed and self._links.get(link.peer) is link:
            link.state = _CONNECTING
            creds = self.tls.channel_credentials() if self.tls is not None else None
            opts = _channel_options(self.limits, self.tls)
            channel = grpc.aio.secure_channel(link.address, creds, options=opts) if creds is not None \
                else grpc.aio.insecure_channel(link.address, options=opts)
            call = None
            config_error = False
            try:
                call = channel.stream_stream(STREAM_METHOD, request_serializer=None,
                                             response_deserializer=peer_pb2.PeerEnvelope.FromString)()
                async with asyncio.timeout(self.limits.handshake_timeout_s):
                    theirs = await self._handshake(link, call)
                link.envelope_limit = min(PeerAuthenticator.envelope_limit(theirs), MAX_ENVELOPE_BYTES)
                link.state = _UP
                link.stats.connects += 1
                backoff = self.limits.backoff_initial_s
                log.info("node %d: link to node %d at %s is up", self.node_id, link.peer, link.address)
                link.last_error = ""
                await self._pump(link, call)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure of one link is that link's business only
                config_error = self._log_link_failure(link, exc)
                if config_error and self.on_config_refusal is not None:
                    try:
                        self.on_config_refusal(link.peer)
                    except Exception:
                        log.exception("node %d: on_config_refusal failed", self.node_id)
            finally:
                was_up = link.state == _UP
                link.state = _DOWN
                if was_up:
                    link.stats.disconnects += 1
                else:
                    link.stats.handshake_failures += 1
                lost = link.drain()
                if call is not None:
                    call.cancel()
                await channel.close(grace=None)
                handler = self.handler
                if lost and handler is not None and not self._closed:
                    try:
                        handler.unreachable(link.peer, lost)
                    except Exception:
                        log.exception("node %d: unreachable() handler failed", self.node_id)
            # A refusal for configuration (wrong secret, cluster) will not heal in 50 ms:
            # retry at the slowest pace instead of flooding both nodes' logs.
            delay = self.limits.backoff_max_s if config_error else backoff
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, self.limits.backoff_max_s)

    def _log_link_failure(self, link: _Link, exc: BaseException) -> bool:
        """Log one failed dial or broken stream; True if it looks like misconfiguration."""
        config = False
        level = logging.WARNING
        if isinstance(exc, grpc.aio.AioRpcError):
            config = exc.code() in _CONFIG_STATUSES
            what = f"{exc.code().name}: {exc.details()}"
            if config:
                level = logging.ERROR
            elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                level = logging.INFO  # the peer is down or restarting: routine in a cluster
        elif isinstance(exc, HelloRefused):
            config, level, what = True, logging.ERROR, f"its Hello was refused: {exc}"
        elif isinstance(exc, (asyncio.TimeoutError, _LinkBroken)):
            what = str(exc) or "handshake timed out"
        else:
            what = repr(exc)
        # The same failure every backoff round is logged once, then at debug level.
        if what != link.last_error:
            log.log(level, "node %d: link to node %d at %s: %s", self.node_id, link.peer, link.address, what)
            link.last_error = what
        else:
            log.debug("node %d: link to node %d still failing: %s", self.node_id, link.peer, what)
        return config

    async def _handshake(self, link: _Link, call) -> peer_pb2.Hello:
        mine = self.auth.dialler_hello(link.peer)
        await call.write(peer_pb2.PeerEnvelope(hello=mine).SerializeToString())
        env = await call.read()
        if env is grpc.aio.EOF:
            raise _LinkBroken("the peer ended the stream during the handshake")
        if env.WhichOneof("body") != "hello":
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION, f"answered with {env.WhichOneof('body')}")
        self.auth.check_acceptor_hello(env.hello, mine)
        self._clock_read()
        await call.write(peer_pb2.PeerEnvelope(hello=self.auth.dialler_confirm(env.hello, mine))
                         .SerializeToString())
        return env.hello

    async def _pump(self, link: _Link, call) -> None:
        """Write queued batches until the stream breaks; watch the response side meanwhile."""
        watch = asyncio.ensure_future(self._watch(call))
        try:
            q = link.queue
            st = link.stats
            while True:
                if not q:
                    # Idle: one plain future, resolved by send() or by the stream's end
                    # (no task and no asyncio.wait per idle spell: this runs per batch).
                    waiter = link.waiter = asyncio.get_running_loop().create_future()
                    wake = functools.partial(_wake, waiter)
                    watch.add_done_callback(wake)
                    try:
                        await waiter
                    finally:
                        link.waiter = None
                        watch.remove_done_callback(wake)
                    if watch.done():
                        watch.result()  # raises why the stream ended
                    continue
                k, envs = self._next_envelopes(link)
                if latency_trace.ON:  # before the writes: their awaits may end after the peer has read
                    for i in range(k):
                        latency_trace.mark_messages("write", link.peer, (m for _, m in q[i].batch))
                for env in envs:
                    if watch.done():
                        watch.result()
                    await call.write(env)
                    st.envelopes_written += 1
                    st.bytes_written += len(env)
                # Written: these k batches are the network's now.
                for _ in range(k):
                    link.queued_bytes -= q.popleft().wire
        finally:
            watch.cancel()
            if watch.done() and not watch.cancelled():
                watch.exception()  # retrieved: the stream's end was handled by our caller

    @staticmethod
    async def _watch(call) -> None:
        env = await call.read()
        if env is grpc.aio.EOF:
            raise _LinkBroken("the peer ended the stream")
        raise _LinkBroken(f"unexpected {env.WhichOneof('body')} frame from the acceptor")

    # ------------------------------------------------ receiving

    async def _refuse(self, context, code: grpc.StatusCode, why: str) -> None:
        self.stats.inbound.hellos_refused += 1
        # Keyed by host, not host:port: a stranger redialling gets one line per interval.
        self._rlog(logging.WARNING, ("refused", context.peer().rpartition(":")[0], code),
                   "node %d: refused a peer stream from %s: %s", self.node_id, context.peer(), why)
        await context.abort(code, why)

    async def _read_hello(self, context, which: str):
        """The next frame, which must be a Hello (`which`: "first" or "third"); grpc.aio.EOF if
        the dialler left. Anything else, or nothing in time, ends the call here."""
        try:
            async with asyncio.timeout(self.limits.handshake_timeout_s):
                frame = await context.read()
        except asyncio.TimeoutError:
            await self._refuse(context, grpc.StatusCode.DEADLINE_EXCEEDED, f"no {which} Hello in time")
        except DecodeError:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"{which} frame is not a PeerEnvelope")
        if frame is not grpc.aio.EOF and frame.WhichOneof("body") != "hello":
            await self._refuse(context, grpc.StatusCode.FAILED_PRECONDITION,
                               f"{which} frame is {frame.WhichOneof('body')}, not "
                               + ("a Hello" if which == "first" else "the confirming Hello"))
        return frame

    async def _check_confirm(self, context, first: peer_pb2.Hello, answer: peer_pb2.Hello) -> None:
        """Step 3: the dialler's signature over our nonce, or the call ends here."""
        confirm = await self._read_hello(context, "third")
        if confirm is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.CANCELLED, "the dialler left during the handshake")
        try:
            self.auth.check_dialler_confirm(confirm.hello, first, answer)
        except HelloRefused as exc:
            await self._refuse(context, _REFUSAL_STATUS[exc.code], exc.reason)
        self._clock_read()

    async def _serve_inbound(self, context) -> None:
        handler = self.handler
        if handler is None or self._closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "node not serving peers yet")
        if self._handshaking >= self.limits.max_pending_handshakes:
            await self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "too many pending handshakes")
        self._handshaking += 1
        try:
            first = await self._read_hello(context, "first")
            if first is grpc.aio.EOF:
                return
            try:
                self.auth.check_dialler_hello(first.hello)
            except HelloRefused as exc:
                await self._refuse(context, _REFUSAL_STATUS[exc.code], exc.reason)
            answer = self.auth.acceptor_hello(first.hello)
            await context.write(peer_pb2.PeerEnvelope(hello=answer))
            await self._check_confirm(context, first.hello, answer)
        finally:
            self._handshaking -= 1
        await self._receive(context, first.hello.node_id)

    async def _receive(self, context, frm: int) -> None:
        mine = _Inbound(asyncio.current_task())
        old = self._inbound.get(frm)
        self._inbound[frm] = mine
        ist = self.stats.inbound
        ist.streams_accepted += 1
        if old is not None:
            # The dialler redialled (restart, or it saw a break we did not): the old
            # stream must not deliver anything after the new one starts.
            ist.streams_superseded += 1
            old.stop(grpc.StatusCode.ABORTED, "superseded by a newer stream from the same node")
        log.info("node %d: accepted the stream of node %d from %s", self.node_id, frm, context.peer())
        me = self.node_id
        max_msgs = self.limits.max_batch_messages
        try:
            while True:
                try:
                    env = await context.read()
                except DecodeError:  # bytes that are not a PeerEnvelope: gRPC's parse runs in read()
                    await self._violation(context, frm, "a frame that is not a PeerEnvelope")
                if env is grpc.aio.EOF:
                    return
                if self._inbound.get(frm) is not mine:
                    return  # superseded or the peer was removed
                body = env.WhichOneof("body")
                if body != "raft":
                    await self._violation(context, frm, f"unexpected {body} frame")
                gms = env.raft.messages
                if not 1 <= len(gms) <= max_msgs:
                    await self._violation(context, frm, f"batch of {len(gms)} messages")
                batch: list[tuple[int, Message]] = []
                for gm in gms:
                    try:
                        m = decode_message(gm.message)
                    except CodecError as exc:
                        ist.codec_errors += 1
                        self._rlog(logging.WARNING, ("codec", frm), "node %d: dropped an undecodable message "
                                   "from node %d (group %d): %s", me, frm, gm.group_id, exc)
                        continue
                    # The authenticated pair must be the message's (a peer speaking for
                    # another node, or about local-only events, is broken or hostile), except
                    # for requests forwarded with their originator in frm: one rule, shared
                    # with the simulator's network (types.link_violation).
                    why = link_violation(m, frm, me, node_of_replica)
                    if why is not None:
                        await self._violation(context, frm, why)
                    batch.append((gm.group_id, m))
                if not batch:
                    continue
                handler = self.handler
                if handler is None:
                    return
                if latency_trace.ON:
                    latency_trace.mark_messages("in", frm, (m for _, m in batch))
                ist.batches_delivered += 1
                ist.messages_delivered += len(batch)
                try:
                    handler.deliver(frm, batch)
                except Exception:
                    log.exception("node %d: deliver() failed on a batch from node %d", me, frm)
                    await context.abort(grpc.StatusCode.INTERNAL, "receiver failed")
        except asyncio.CancelledError:
            # Our own stop(): end the RPC with a status. A cancelled handler alone leaves
            # gRPC's call open on the wire (until the dialler's deadline, and ours has none).
            if mine.stop_reason is not None:
                code, why = mine.stop_reason
                await context.abort(code, why)
            raise
        finally:
            if self._inbound.get(frm) is mine:
                del self._inbound[frm]

    async def _violation(self, context, frm: int, why: str) -> None:
        self.stats.inbound.protocol_errors += 1
        self._rlog(logging.ERROR, ("violation", frm), "node %d: closed the stream of node %d: %s",
                   self.node_id, frm, why)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
