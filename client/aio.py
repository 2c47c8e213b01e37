"""The async xraft client over grpc.aio: routing, retries, streaming.

    client = Client(seeds=["10.0.0.1:7100", "10.0.0.2:7100"], token="...")
    sid = await client.xadd("orders", {"item": "book"})
    async for key, entries in client.subscribe({"orders": "$"}): ...
    async for d in client.consume(["orders"], "billing", "worker-1"): ...; await d.ack()

Routing (router.py, routing.py): the first call fetches the cluster layout
(ClusterLayout) from a seed. Every keyed call then goes to the leader of the
Raft group owning its key's slot (CRC16 with {hash tags}, slots.py); calls to
different groups share nothing but the channel, so they run in parallel. A
NOT_LEADER or MOVED error names the leader to use at once and starts a
background refresh of the layout (rate-limited); so do connection failures
and CLUSTERDOWN. Keyless calls (and every call, against nodes from before
sharding, which answer ClusterLayout with UNIMPLEMENTED) go to the one known
leader, else to the seeds in turn, following NOT_LEADER redirects.
Multi-key calls: see `_slot_of` (keys in different slots are a CrossSlotError,
raised before anything is sent, when the cluster is sharded).
Retries: NOT_LEADER / MOVED / UNAVAILABLE / TIMEOUT / TRYAGAIN / CLUSTERDOWN
(nothing was applied) are retried with exponential backoff and jitter until the
call's overall deadline.

Sessions are per Raft group on a sharded cluster: before the first
id-carrying write to a group the client registers its id there
(`XRAFT.REGISTER <id> SLOT <slot>`, the slot being the write's), once per
(client id, group); a new client id (after SESSION_EXPIRED) registers again,
group by group, as writes reach them.

Writes and unknown outcomes: a write whose fate is unknown (the server says
UNKNOWN_OUTCOME, the connection broke) is retried only when it carries a
request id the server deduplicates (`request_ids=True`, the default): the
server's at-most-once table answers a retry of an applied request with its
first result. Without request ids the SDK raises UnknownOutcomeError and
never resends. Two UNKNOWN_OUTCOME answers are final and raised at once,
never retried (a resend would get the same answer): SessionExpiredError
(the server's session for this client id expired; resent transparently under
a new id only when no earlier attempt may have applied), StaleRequestError (the
request id fell out of the window; the server cannot tell) and
ReplyNotKeptError (applied, reply too large to keep). WriteDeadlineError
(the deadline passed after sending) is final too.

Blocking writes (blpop, brpop, blmpop, lmove/brpoplpush with block_ms,
xreadgroup with block_ms): every attempt the server makes for the call (the
first and each wake-up retry) carries the call's request id, and an attempt
that served nothing may run again under it (node/fsm/blocking.py
may_run_again), so the one attempt that pops or delivers is deduplicated: a
resend after a failover gets that element, never a second one, and never
leaves one popped for nobody. What the SDK cannot settle is raised as an
UnknownOutcomeError subclass, never as "nothing arrived": WriteDeadlineError
(the deadline passed after an attempt was sent), ReplyNotKeptError (an
XREADGROUP served with a reply too large for the server to keep: the
entries are in this consumer's PEL, read them back with ID 0), or
UnknownOutcomeError with request_ids=False.

The dedup window: the server keeps the last DEDUP_WINDOW (1024) results per
client id (node/fsm/sessions.py DEFAULT_RESULTS_PER_CLIENT; a test compares
the two). The SDK issues request ids so that every id in flight is below
L + MAX_TRACKED_WRITES (256), L being the oldest id whose call has not
returned: then at most 2 * 256 - 1 distinct ids can be recorded while L is
outstanding, fewer than 1024, so L (applied or not) never leaves the window
however slow it is, and the other half of the window is slack for
abandoned attempts still in the log. The cost: a write waits while the
oldest one in flight is 256 ids behind (head-of-line, never a stale refusal).
Remaining limit: the server does not know L (the request id carries only
<client_id>:<seq>, and the log record has no field for it), so it still
evicts by count, not by the client's acknowledgement; a caller that cancels
many id-carrying writes whose attempts are still in the log (each may be
recorded late) eats into that slack. Sending `lowest_unacked_seq` (Raft
thesis 6.3) needs a metadata/record format change in grpc_service, resolve
and entry.py.

The sync client (sync.py) runs this one on a private loop thread.
"""
import asyncio
import collections
import random
import secrets
from dataclasses import dataclass

import grpc

from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc

from . import admin
from . import router as routing_modes
from .commands import Commands
from .consumer import MAX_ACKS_IN_FLIGHT, ConsumerSession, Delivery  # noqa: F401 - this module's API
from .crossshard import CrossShardSession
from .dead_letters import DeadLetterCommands
from .reliable import ReliableConsumer
from .errors import (ClusterDownError, CrossSlotError, DeadlineExceededError, MovedError, NotLeaderError,
                     ReplyNotKeptError, SessionExpiredError, StaleRequestError, TryAgainError, UnavailableError,
                     UnknownOutcomeError, WriteDeadlineError, XRaftError, from_rpc_error)
from .router import Router
from .routing import Layout
from .slots import key_slot
from .types import StreamEntry, StreamID, to_bytes

REQUEST_ID_KEY = "xraft-request-id"       # metadata: "<client_id>:<seq>" (the server dedups on it)
DEDUP_WINDOW = 1024                        # = fsm sessions DEFAULT_RESULTS_PER_CLIENT (tests compare them)
MAX_TRACKED_WRITES = DEDUP_WINDOW // 4     # seq span of id-carrying writes in flight (module doc)
MAX_MESSAGE_BYTES = 16 << 20               # the server's gRPC message limit (client.proto)
MAX_REDIRECTS = 8                          # NOT_LEADER / MOVED hops per attempt before backing off
MAX_REGISTER_TRIES = 5                     # XRAFT.REGISTER attempts with an unknown outcome
SLOT_CACHE_KEYS = 4096                     # keys whose slot is remembered (cleared when full)


@dataclass
class _Node:
    channel: grpc.aio.Channel
    stub: pb_grpc.XRaftStub


class Client(Commands, DeadLetterCommands):
    """An xraft client over one gRPC channel per node it talks to.

    seeds: "host:port" addresses of some nodes' gRPC (client API) ports.
    token: the cluster's bearer token (a node started with one refuses calls
        without it); sent as `authorization: Bearer <token>` metadata on every
        call, over plaintext and TLS alike (use TLS to keep it off the wire).

    TLS (the node's --tls-cert/--tls-key/--tls-ca; all channels are then
    `grpc.aio.secure_channel`, plaintext otherwise):
    tls: True for TLS. Default None: TLS exactly when one of the options
        below is given; tls=False with any of them is a ValueError.
    root_certificates: PEM of the CA that signed the nodes' certificates
        (the node's --tls-ca); None: grpc's default trust roots.
    client_cert, client_key: PEM certificate chain and private key, both or
        neither; needed only by nodes run with --tls-require-client-cert.
    credentials: a ready `grpc.ChannelCredentials` instead of the three
        above (e.g. from a custom trust store); exclusive with them.
    server_name_override: the name checked in the nodes' certificates
        instead of the dialled host (when nodes are dialled by an IP or name
        that is not in their certificate). Applies to every node.
    A TLS mismatch (plaintext client and TLS node, or a certificate that is
    not trusted or not accepted) is a failed connection (UnavailableError,
    nothing sent), retried like any other until `timeout`, then raised as
    DeadlineExceededError with the UnavailableError as its __cause__.
    """

    def __init__(self, seeds, *, token: str | None = None, timeout: float = 10.0, backoff_base: float = 0.02,
                 backoff_max: float = 1.0, request_ids: bool = True, follower_reads: bool = False,
                 max_in_flight: int = 1024, channel_options=(), tls: bool | None = None,
                 root_certificates: bytes | None = None, client_cert: bytes | None = None,
                 client_key: bytes | None = None, credentials: grpc.ChannelCredentials | None = None,
                 server_name_override: str | None = None, producer_id: bytes | str | None = None,
                 idempotent_producer: bool = True):
        if isinstance(seeds, str):
            seeds = [seeds]
        self._seeds = list(seeds)
        if not self._seeds:
            raise ValueError("at least one seed address")
        self._credentials = _channel_credentials(tls, root_certificates, client_cert, client_key, credentials,
                                                 server_name_override)
        if server_name_override:
            channel_options = (("grpc.ssl_target_name_override", server_name_override), *channel_options)
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
        self._leader: str | None = None    # keyless calls and SINGLE mode (router.py)
        self._seed_index = 0
        self._router = Router(self._seeds, self._layout_rpc)
        self.redirects = 0                 # NOT_LEADER / MOVED answers followed (tests and stats)
        self._slots: dict[bytes, int] = {}  # key -> slot (_key_slot)
        # Request ids: a random client id (the server's session key) and a counter.
        # The session is registered (XRAFT.REGISTER) before the first write that
        # carries the id, and replaced by a new id when the server says it expired.
        self.client_id = secrets.randbits(63) or 1
        self._registered: set = set()      # (client id, group) registered; group None: unsharded / slot 0's
        self._registering: dict = {}       # group -> asyncio.Lock, while one call registers there
        self._window = _SeqWindow(MAX_TRACKED_WRITES)
        self._in_flight = None             # a semaphore, made on first use inside the running loop
        self._closed = False
        # Idempotent producer (Redis 8.6 IDMP, node/engine/idmp.py): every XAdd of
        # "*" entries carries this producer id and a fresh idempotent id per
        # entry, so a resend after an unknown outcome (even under a new session,
        # or with request_ids off) never adds an entry twice. Give a stable
        # producer_id to keep that across client restarts.
        self.idempotent_producer = idempotent_producer
        self.producer_id = (to_bytes(producer_id) if producer_id is not None
                            else b"sdk-" + secrets.token_hex(12).encode())
        self._next_iid = 0
        # Whether a server answered XAddResponse.idempotent_id_first_ok: from then on the
        # fresh ids go as one number (XAddRequest.idempotent_id_first), not one per entry.
        # (None: never, whatever the server says: bench/ab_issue13.py's A/B of the two forms.)
        self._idempotent_id_first_ok = False

    def _iids(self, n: int) -> range:
        """n fresh idempotent ids (numbers; the caller renders them)."""
        first = self._next_iid
        self._next_iid += n
        return range(first, first + n)

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        self._closed = True
        await self._router.close()
        nodes, self._nodes = self._nodes, {}
        for node in nodes.values():
            await node.channel.close()

    @property
    def leader(self) -> str | None:
        """The address keyless requests go to first (sharded: the leader of
        slot 0's group)."""
        table = self._router.table
        if table is not None:
            return table.address_for(0)
        return self._leader

    @property
    def routing_mode(self) -> str:
        """"layout" (routed by slot), "single" (a node without ClusterLayout:
        one leader) or "unknown" (no node answered yet)."""
        return self._router.mode

    @property
    def layout_fetches(self) -> int:
        """ClusterLayout RPCs sent so far."""
        return self._router.fetches

    async def cluster_layout(self, *, timeout=None) -> Layout:
        """The cluster layout, fetched now from the first node that answers
        (the known nodes, then the seeds); it also refreshes the routing.
        NotSupportedError from nodes without ClusterLayout."""
        if self._closed:
            raise UnavailableError("client closed")
        return await self._router.fetch(self.timeout if timeout is None else timeout)

    async def transfer_leader(self, group_id: int, to_node: int, *, timeout=None):
        """Make node `to_node` the leader of Raft group `group_id` (client/admin.py);
        returns the TransferLeaderResponse (group_id, leader, term) once it leads."""
        return await admin.transfer_leader(self, group_id, to_node, self.timeout if timeout is None else timeout)

    async def rebalance_plan(self, *, timeout=None):
        """The RebalancePlanResponse a node computes on its slot map (nothing is applied)."""
        return await admin.rebalance_plan(self, self.timeout if timeout is None else timeout)

    async def get_slot_map(self, *, timeout=None):
        """GetSlotMapResponse (epoch, slot_map canonical JSON, node_id, meta_leader) of the
        first node that answers (client/admin.py)."""
        return await admin.get_slot_map(self, self.timeout if timeout is None else timeout)

    async def propose_map_change(self, change: bytes, *, timeout=None):
        """Propose one encoded slot map change to the metadata group's leader; the
        ProposeMapChangeResponse says whether it applied or why it was refused."""
        return await admin.propose_map_change(self, bytes(change), self.timeout if timeout is None else timeout)

    async def group_membership(self, group_id: int, *, timeout=None):
        """GroupMembershipResponse of Raft group `group_id` (0: the metadata group) from its
        leader: voters, learners, the leader's last index and each replica's match index."""
        return await admin.group_membership(self, group_id, self.timeout if timeout is None else timeout)

    async def membership_plan(self, op: str, node_id: int, grpc_address: str = "", resp: str = "", *,
                              timeout=None):
        """MembershipPlanResponse: the changes that add ("add") or remove ("remove") a node."""
        return await admin.membership_plan(self, op, node_id, grpc_address, resp,
                                           self.timeout if timeout is None else timeout)

    def leader_for(self, key) -> str | None:
        """The address a call for `key` goes to first (None: unknown or unsharded)."""
        table = self._router.table
        return None if table is None else table.address_for(key_slot(to_bytes(key)))

    # -- routing ----------------------------------------------------------------------

    async def _layout_rpc(self, address: str, timeout: float):
        return await self._node(address).stub.ClusterLayout(pb.ClusterLayoutRequest(), timeout=timeout,
                                                           metadata=self._metadata(None))

    async def _slot_of(self, keys, timeout) -> int | None:
        """The slot a call for `keys` (bytes, or a list of bytes) routes by;
        None: route to the one leader (unsharded, or no key). On a sharded
        cluster keys in different slots raise CrossSlotError before anything
        is sent (redis cluster's rule: one slot per command), and a keyless
        call goes to slot 0's group."""
        router = self._router
        if router.mode is routing_modes.UNKNOWN:
            await router.ensure(timeout)
        if router.mode is not routing_modes.LAYOUT:
            return None
        if keys is None:
            return 0
        if keys.__class__ is bytes:
            return self._key_slot(keys)
        slots = {self._key_slot(k) for k in keys}
        if len(slots) > 1:
            raise CrossSlotError("CROSSSLOT Keys in request don't hash to the same slot (not sent; slots "
                                 + ", ".join(map(str, sorted(slots)[:8])) + ")")
        return slots.pop() if slots else 0

    def _key_slot(self, key: bytes) -> int:
        """key_slot, remembered for the keys used most recently (a producer
        writes to the same few keys; CRC16 in Python costs per byte)."""
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= SLOT_CACHE_KEYS:
                self._slots.clear()
            slot = self._slots[key] = key_slot(key)
        return slot

    async def _split_by_slot(self, keys: list) -> list | None:
        """`keys` grouped by slot (lists in first-seen order) when a sharded
        cluster needs more than one call for them; None otherwise."""
        if self._router.mode is routing_modes.UNKNOWN:
            await self._router.ensure(None)
        if self._router.mode is not routing_modes.LAYOUT:
            return None
        parts: dict[int, list] = {}
        for k in keys:
            parts.setdefault(self._key_slot(k), []).append(k)
        return list(parts.values()) if len(parts) > 1 else None

    def _route(self, slot: int | None) -> str:
        """The address for the next attempt of a call for `slot`."""
        table = self._router.table
        if slot is not None and table is not None:
            address = table.address_for(slot, self._seed_index)
            if address is not None:
                return address
        return self._target()

    def _node(self, address: str) -> _Node:
        node = self._nodes.get(address)
        if node is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=self._channel_options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, options=self._channel_options)
            node = self._nodes[address] = _Node(channel, pb_grpc.XRaftStub(channel))
        return node

    def _target(self) -> str:
        return self._leader or self._seeds[self._seed_index % len(self._seeds)]

    def _observe_failure(self, address: str, err: XRaftError, slot: int | None = None) -> bool:
        """Update the routing after `err` from `address`; True if the next
        attempt goes straight to a named leader (no backoff needed)."""
        redirect = isinstance(err, (NotLeaderError, MovedError))
        if redirect:
            self.redirects += 1
        table = self._router.table
        if slot is not None and table is not None:
            return self._observe_routed(table, address, err, slot, redirect)
        if isinstance(err, MovedError):
            self._router.reprobe()
        if redirect and err.leader_address and err.leader_address != address:
            self._leader = err.leader_address
            return True
        if address == self._leader:
            self._leader = None
        self._seed_index += 1
        return False

    def _observe_routed(self, table, address, err, slot, redirect) -> bool:
        """_observe_failure on a sharded cluster, for a call routed by `slot`."""
        if isinstance(err, TryAgainError):
            return False                   # the slot is being moved: same place, after a backoff
        self._router.refresh_soon()
        if redirect and err.leader_address and err.leader_address != address:
            if isinstance(err, MovedError):
                table.note_moved(slot, err.leader_address)
            else:
                table.note_leader(slot, err.leader_address, err.group_id)
            return True
        if not isinstance(err, ClusterDownError):
            table.forget(slot, address)    # unreachable, or no leader there: try another member
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

    @property
    def _seq(self) -> int:
        """The last request id (seq) issued."""
        return self._window.next - 1

    # -- the one unary path -------------------------------------------------------------

    async def _unary(self, rpc: str, request, *, write: bool, timeout=None, keys=None):
        """Send `request` to the leader of its keys' group (`keys`: bytes or a
        list of bytes; see _slot_of), following redirects and retrying what is
        safe to retry, until `timeout` (default: the client's) runs out."""
        if self._closed:
            raise UnavailableError("client closed")
        self._limits()
        slot = await self._slot_of(keys, timeout)
        async with self._in_flight:
            if write and self._request_ids:
                await self._session(timeout, slot)
                seq = await self._window.acquire()
                try:
                    return await self._attempts(rpc, request, write, timeout, seq, slot)
                finally:
                    self._window.release(seq)
            return await self._attempts(rpc, request, write, timeout, None, slot)

    async def _attempts(self, rpc, request, write, timeout, rid, slot=None):
        loop = asyncio.get_running_loop()
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout == float("inf") or timeout is None else loop.time() + timeout
        metadata = self._metadata(rid)
        if self._follower_reads and not write:
            request.options.allow_follower_read = True
        attempt = redirects = 0
        last: XRaftError | None = None
        uncertain = False                  # some attempt may have been applied
        # An XAdd with a producer id is idempotent on the server (IDMP): resending it is always safe.
        idempotent = rpc == "XAdd" and bool(request.producer_id)
        renewed = False                    # resent once under a new session already
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise _out_of_time(last, uncertain)
            if remaining is not None:
                # The server gives up (cleanly, before proposing if it can) a
                # little before the client does, so its answer gets back in time.
                request.options.deadline_hint_ms = max(1, min(600_000, int(remaining * 1000 * 0.9)))
            address = self._route(slot)
            try:
                return await getattr(self._node(address).stub, rpc)(request, timeout=remaining, metadata=metadata)
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e, write=write)
            last = err
            if isinstance(err, SessionExpiredError) and rid is not None and (idempotent or not uncertain) \
                    and not renewed:
                renewed = True
                # No attempt of this request can have been applied (this one was
                # refused, none before it was uncertain): resend under a new session.
                await self._renew_session(metadata, timeout, slot)
                metadata = self._metadata(rid)
                continue
            uncertain = uncertain or isinstance(err, UnknownOutcomeError)
            if isinstance(err, UnknownOutcomeError):
                # Resending is safe only when the server dedups on the request
                # id, and useful only when the answer is not final: a stale
                # refusal or "applied, reply not kept" would come back again.
                if not idempotent and (rid is None or isinstance(err, _FINAL_OUTCOMES)):
                    raise err
            elif not err.retriable:
                raise err
            if self._observe_failure(address, err, slot) and redirects < MAX_REDIRECTS:
                redirects += 1
                continue
            redirects = 0
            delay = self._sleep_for(attempt, err)
            attempt += 1
            if remaining is not None:
                delay = min(delay, max(0.0, deadline - loop.time()))
            await asyncio.sleep(delay)

    # -- sessions (server: node/fsm/sessions.py) ------------------------------------------

    async def _session(self, timeout, slot: int | None = None) -> None:
        """Register self.client_id with the server once per Raft group: the
        group owning `slot` (None: unsharded, one group). XRAFT.REGISTER is
        idempotent, so an attempt with an unknown outcome is simply resent."""
        table = self._router.table
        group = None if slot is None or table is None else table.group_of(slot)
        if (self.client_id, group) in self._registered:
            return
        lock = self._registering.get(group)
        if lock is None:
            lock = self._registering[group] = asyncio.Lock()
        async with lock:
            cid = self.client_id
            if (cid, group) in self._registered:
                return
            argv = [b"XRAFT.REGISTER", str(cid).encode()]
            if group is not None:
                argv += [b"SLOT", str(slot).encode()]
            req = pb.ExecuteRequest(argv=argv)
            loop = asyncio.get_running_loop()
            timeout = self.timeout if timeout is None else timeout
            deadline = None if timeout == float("inf") else loop.time() + timeout
            last = None
            for _ in range(MAX_REGISTER_TRIES):
                left = float("inf") if deadline is None else deadline - loop.time()
                if left <= 0:
                    break
                try:
                    await self._attempts("Execute", req, True, left, None, slot)
                    if cid == self.client_id:
                        self._registered.add((cid, group))
                    return
                except UnknownOutcomeError as e:
                    last = e
            # The caller's request was never sent: nothing changed.
            raise DeadlineExceededError(f"no client session registered in time; the request was not sent ({last})")

    async def _renew_session(self, old_metadata, timeout, slot=None) -> None:
        """The server expired our session: a new client id, registered (once
        for all the calls that saw the expiry with the same old id) in the
        group of `slot`; other groups register it when writes reach them."""
        if self._metadata_of_current(old_metadata):
            self.client_id = secrets.randbits(63) or 1
            self._registered = {pair for pair in self._registered if pair[0] == self.client_id}
        await self._session(timeout, slot)

    def _metadata_of_current(self, metadata) -> bool:
        prefix = f"{self.client_id}:"
        return any(k == REQUEST_ID_KEY and v.startswith(prefix) for k, v in metadata)

    # -- streaming --------------------------------------------------------------------

    async def subscribe(self, streams: dict, *, max_batch: int = 0, follower_read: bool = False):
        """Tail streams: {key: id | "$"} -> yields (key, [StreamEntry]) as
        entries arrive, forever. On a leader change or a lost connection it
        resubscribes after the last ID it yielded per stream (no entry missed
        or repeated), giving up after `timeout` seconds without a success.
        ("$" not yet past its first entry is resolved again on resubscribe.)
        Routed to the leader of the streams' group, and re-routed after a
        failover. Split on a sharded cluster: streams in different slots
        are tailed by one Subscribe call per slot, merged as they arrive
        (each stream's entries stay in order); the first call that fails
        for good ends them all with its error."""
        after = {to_bytes(k): v for k, v in streams.items()}
        parts = await self._split_by_slot(list(after))
        if parts is None:
            async for item in self._subscribe_slot(after, max_batch, follower_read):
                yield item
            return
        merged: asyncio.Queue = asyncio.Queue(maxsize=len(parts))   # bounded: a slow reader slows the calls
        done = object()

        async def feed(part):
            try:
                async for item in self._subscribe_slot({k: after[k] for k in part}, max_batch, follower_read):
                    await merged.put(item)
                await merged.put(done)
            except Exception as e:  # noqa: BLE001 - handed to the reader, who raises it
                await merged.put(e)

        feeders = [asyncio.ensure_future(feed(part)) for part in parts]
        try:
            running = len(feeders)
            while running:
                item = await merged.get()
                if item is done:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in feeders:
                task.cancel()
            await asyncio.gather(*feeders, return_exceptions=True)

    async def _subscribe_slot(self, after: dict, max_batch: int, follower_read: bool):
        """subscribe() for streams of one slot (or of an unsharded cluster)."""
        slot = await self._slot_of(list(after), None)
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
            address = self._route(slot)
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
            if not self._observe_failure(address, err, slot):
                await asyncio.sleep(self._sleep_for(attempt, err))
                attempt += 1

    def consume(self, keys, group, consumer, *, max_unacked: int = 0, max_batch: int = 0, no_ack: bool = False,
                replay_pending_after=None) -> "ConsumerSession | CrossShardSession":
        """Consume a group over one bidirectional stream: `async for d in
        client.consume(...)` yields Delivery objects; `await d.ack()` (or
        session.ack(key, ids)) acknowledges. Use as `async with` to close it.
        Routed to the leader of the keys' group, and re-routed after a
        failover. Keys in several slots of a sharded cluster: one Consume
        call per slot, merged (crossshard.CrossShardSession; acks go back
        to each stream's group)."""
        start = pb.ConsumeStart(keys=[to_bytes(k) for k in keys], group=to_bytes(group),
                                consumer=to_bytes(consumer), max_unacked=max_unacked, max_batch=max_batch,
                                no_ack=no_ack)
        if replay_pending_after is not None:
            start.replay_pending_after.CopyFrom(StreamID.parse(replay_pending_after).to_pb())
        if len(start.keys) > 1:
            return CrossShardSession(self, start)
        return ConsumerSession(self, start)

    def reliable_consumer(self, keys, group, consumer, handler, **options) -> ReliableConsumer:
        """A ReliableConsumer (reliable.py): consume() plus scheduled XAUTOCLAIM
        of dead consumers' idle entries, bounded concurrency, batched acks;
        `await rc.run()` until `await rc.stop()`."""
        return ReliableConsumer(self, keys, group, consumer, handler, **options)


_FINAL_OUTCOMES = (WriteDeadlineError, StaleRequestError, ReplyNotKeptError, SessionExpiredError)


def _channel_credentials(tls, root_certificates, client_cert, client_key, credentials, server_name_override):
    """The channel credentials for Client's TLS options (its docstring); None: plaintext."""
    pems = {"root_certificates": root_certificates, "client_cert": client_cert, "client_key": client_key}
    for name, value in pems.items():
        if value is not None and not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"{name} must be PEM bytes, not {type(value).__name__}")
    given = [name for name, value in (*pems.items(), ("credentials", credentials),
                                      ("server_name_override", server_name_override)) if value is not None]
    if tls is None:
        tls = bool(given)
    if not tls:
        if given:
            raise ValueError(f"tls=False with TLS options: {', '.join(given)}")
        return None
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key go together")
    if credentials is not None:
        if any(v is not None for v in pems.values()):
            raise ValueError("credentials excludes root_certificates, client_cert and client_key")
        return credentials
    return grpc.ssl_channel_credentials(
        root_certificates=None if root_certificates is None else bytes(root_certificates),
        private_key=None if client_key is None else bytes(client_key),
        certificate_chain=None if client_cert is None else bytes(client_cert))


class _SeqWindow:
    """Request ids (seqs) of id-carrying writes, issued in order so that
    every seq in flight is below lowest + size, `lowest` being the oldest seq
    whose call has not returned. FIFO: a write waits for room behind earlier
    ones. A seq is released when its call returns (or is cancelled)."""

    def __init__(self, size: int):
        self.size = size
        self.next = 1                      # the next seq to issue
        self._issued = collections.deque()  # seqs issued and not yet retired, in order
        self._done = set()                 # released seqs not yet at the left of _issued
        self._waiters = collections.deque()

    def _lowest(self) -> int:
        return self._issued[0] if self._issued else self.next

    def _fits(self) -> bool:
        return self.next < self._lowest() + self.size

    def _take(self) -> int:
        seq, self.next = self.next, self.next + 1
        self._issued.append(seq)
        return seq

    async def acquire(self) -> int:
        if not self._waiters and self._fits():
            return self._take()
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())     # issued but never sent
            elif fut in self._waiters:
                self._waiters.remove(fut)
            raise

    def release(self, seq: int) -> None:
        self._done.add(seq)
        advanced = False
        while self._issued and self._issued[0] in self._done:
            self._done.discard(self._issued.popleft())
            advanced = True
        while advanced and self._waiters and self._fits():
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(self._take())


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
