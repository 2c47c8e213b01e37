"""The gRPC client API (service xraft.v1.XRaft) over the Backend protocol.

Every typed RPC is the redis command it names (grpc_convert.py builds the
argv), run the way the RESP server runs it:

    writes    fsm resolve_command -> backend.submit (one record); blocking
              forms (BLPOP, XREADGROUP BLOCK ...) via blocking.run_blocking_write
    reads     backend.read(argv, linearizable = not options.allow_follower_read);
              XREAD BLOCK via blocking.run_blocking_read
    batches   XAdd of N entries = one XADD_BATCH request (fsm/xadd_batch.py),
              built straight from the message: N results, one at-most-once slot
    streams   Subscribe = XREAD in a loop, woken by the backend's ready keys;
              Consume = XREADGROUP ">" through the log, acks in, bounded window
              (both in grpc_streams.py)

Request ids: metadata `xraft-request-id: <client_id>:<seq>` makes a write an
at-most-once request (fsm sessions): a retry of an applied request gets the
first result instead of applying twice. That is what lets the SDK resend a
write whose outcome was unknown.

Errors: every failure is a gRPC status whose details hold one ErrorDetail,
both taken from wire_errors' one table (reason, status code, retriable).
NOTLEADER carries the leader's gRPC address. A write that reached
backend.submit and then failed in an unforeseen way is UNKNOWN_OUTCOME,
never a plain failure: it may have been applied. (Bugs before proposing are
INTERNAL, a row the table does not have: it is not a redis error.)

Routing (routing.py), before anything runs: keys of one request in different
slots answer CROSS_SLOT; a slot of a group this node has no replica of (routing.
own_group; for its own groups the backend answers NOT_LEADER, which the SDK
follows) answers MOVED with ErrorDetail.slot and that leader's gRPC address.
Subscribe and Consume (grpc_streams.py) are not routed yet.

Execute also answers the server-level commands an operator's script sends
(they are not engine commands, so they would otherwise fail or cost a
ReadIndex round): PING [msg] answered here, INFO [section ...] built by
info.py exactly as the RESP server builds it (the node passes its RespServer
as `info_server`, so the numbers are the same; INFO raft is backend.raft_info()),
CLUSTER SLOTS/SHARDS/NODES/INFO/MYID/KEYSLOT (cluster_cmds) and COMMAND.

ClusterLayout: the node's slot map (any node answers; the SDK routes by it) with
the leader and term this node knows for each group it hosts (0 for the others).
NOT_LEADER and MOVED errors name the leader of the KEY's group: ErrorDetail
leader_id, leader_address (its gRPC address), slot and group_id.

Deadlines: the gRPC deadline, or options.deadline_hint_ms when shorter.
Nothing is proposed after it passed (TIMEOUT); a write still waiting for its
result when it passes is UNKNOWN_OUTCOME; a blocking form is cut to it and
answers its empty reply, as a redis BLOCK timeout does.
"""
import asyncio
import dataclasses
import hmac
import re
import time
import types

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc

from ..engine.command_keys import command_keys
from ..engine.commands import lookup
from ..engine.errors import EngineError, wrong_arity
from ..engine.replies import NULL_ARRAY
from ..engine.slots import key_slot
from ..engine.stream_args import parse_xread_args
from ..fsm.blocking import is_blocking_form
from ..fsm.errors import NotAWrite, StaleRequest
from ..fsm.resolve import Resolved, resolve_command, resolve_xadd_batch
from ..fsm.xadd_batch import error_without_fields
from ..runtime import latency_trace
from . import grpc_convert as cv
from . import grpc_streams
from .backend import BackendError, NotLeader, UnknownOutcome
from .blocking import BlockingRegistry, run_blocking_read, run_blocking_write
from .client_memory import ClientMemory
from .grpc_admin import AdminRpcs, layout_pb  # noqa: F401 - layout_pb re-exported
from .cluster_cmds import cluster_command, slot_read
from .info import SERVER_COMMANDS, command_command, info_text
from .routing import common_slot, own_group
from .wire_errors import moved_message, noauth_message, timeout_message, unknown_outcome_message, \
    wire_for_message

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["XRaft"].full_name
REQUEST_ID_KEY = "xraft-request-id"
MAX_MESSAGE_BYTES = 16 << 20          # client.proto: every request and reply fits 16 MiB
MAX_CONCURRENT_RPCS = 4096            # beyond this grpc refuses calls (RESOURCE_EXHAUSTED)
MAX_DEADLINE_HINT_MS = 600_000
MAX_ARGV = 1 << 20
BLOCK_MARGIN_S = 0.05                 # a blocking form ends this much before the deadline
_ALREADY_APPLIED = re.compile(r"^ERR xraft: request \d+ of client \d+ was already applied")


class Timeout(BackendError):
    """The deadline passed before anything was proposed: nothing happened."""

    def __init__(self):
        super().__init__(timeout_message())


class NoClientMemory(BackendError):
    """The request does not fit the node's client memory now (client_memory.py): nothing was done."""

    def __init__(self, size: int, memory):
        super().__init__("BUSY xraft: client memory limit reached (a request of %d bytes, %d of %d bytes "
                         "in use); retry later" % (size, memory.used, memory.limit))


class Moved(BackendError):
    """The slot is served by another group's leader: nothing was done there."""

    def __init__(self, slot: int, grpc_address: str):
        super().__init__(moved_message(slot, grpc_address))


class Unauthenticated(BackendError):
    def __init__(self):
        super().__init__(noauth_message())


class _InfoView:
    """What info.info_text reads from a server, for a service with no RESP server
    beside it (tests, tools): this service's own blocked calls, no connections."""

    def __init__(self, backend, registry: BlockingRegistry):
        self.backend = backend
        self.registry = registry
        self.clients = {}
        self.limits = types.SimpleNamespace(max_clients=MAX_CONCURRENT_RPCS)
        self.port = 0
        self.started = time.monotonic()
        self.stats_connections = self.stats_rejected = 0


class _Call:
    """One RPC's routing and deadline, and whether it reached the log."""
    __slots__ = ("deadline", "linearizable", "client_id", "seq", "write", "proposed")

    def __init__(self, deadline, linearizable: bool, client_id: int, seq: int):
        self.deadline = deadline          # loop.time() seconds, None = none
        self.linearizable = linearizable
        self.client_id, self.seq = client_id, seq
        self.write = False
        self.proposed = False

    def remaining(self):
        return None if self.deadline is None else self.deadline - asyncio.get_running_loop().time()

    def block_ms(self, requested):
        """A blocking form's timeout in ms (0 = forever), cut to the deadline."""
        left = self.remaining()
        if left is None:
            return requested
        cap = max(1, int((left - BLOCK_MARGIN_S) * 1000))
        return cap if requested == 0 else min(requested, cap)


def _opt(msg, name):
    return getattr(msg, name) if msg.HasField(name) else None


_RPC_NAMES: dict = {}


def rpc_name(body) -> str:
    """The RPC a `body` closure belongs to ("XRaftService.XAdd.<locals>.body" -> "XAdd"),
    cached per code object: one entry per RPC method."""
    name = _RPC_NAMES.get(body.__code__)
    if name is None:
        parts = body.__qualname__.split(".")
        name = _RPC_NAMES[body.__code__] = parts[1] if len(parts) > 2 else parts[0]
    return name


def rpc_names() -> list:
    """Every unary RPC name of the XRaft service (the label values request stats allow)."""
    return list(pb.DESCRIPTOR.services_by_name["XRaft"].methods_by_name)


class XRaftService(AdminRpcs, pb_grpc.XRaftServicer):
    def __init__(self, backend, *, registry: BlockingRegistry | None = None, token: str | None = None,
                 grpc_address_of=None, info_server=None, client_memory: ClientMemory | None = None,
                 layout=None, admin=None, slot_moves=None, membership=None):
        """`grpc_address_of(addr)`: the gRPC address of the node whose RESP
        address the backend names as leader (identity by default).
        `info_server`: the node's RespServer, whose figures INFO reports.
        `layout()`: (SlotMap, {group id: (leader id, term)}, node id) for ClusterLayout
        (None: the RPC answers UNIMPLEMENTED).
        `admin`: admin_rpcs.AdminRpcs for TransferLeader and RebalancePlan (None: UNIMPLEMENTED).
        `slot_moves`: slot_move_steps.SlotMoveRpcs for SlotMoveStep (None: UNIMPLEMENTED)."""
        self.backend = backend
        self._slot_moves = slot_moves
        self._membership = membership     # membership.MembershipRpcs for GroupMembership (None: UNIMPLEMENTED)
        self._layout = layout
        self._admin = admin
        # Node-wide bytes of client requests (client_memory.py): the RESP server's, when there is one.
        if client_memory is None:
            client_memory = getattr(info_server, "client_memory", None) or ClientMemory()
        self.client_memory = client_memory
        self._token = token
        self._grpc_address_of = grpc_address_of or (lambda a: a)
        if registry is None:              # a shared registry is already wired by its owner
            registry = BlockingRegistry()
            backend.add_ready_listener(registry.on_ready)
        self.registry = registry
        self.info_server = info_server or _InfoView(backend, registry)
        self.request_stats = None         # request_stats.RequestStats when the node serves --metrics
        backend.add_role_listener(self._on_role_change)

    # -- plumbing -----------------------------------------------------------------------

    def _on_role_change(self) -> None:
        """Deposed: blocked writes and linearizable reads end with NOT_LEADER
        (never a silent empty reply); follower reads keep waiting."""
        backend = self.backend

        def deposed(w):
            if not (isinstance(w.owner, _Call) and (w.owner.write or w.owner.linearizable)) or not w.keys:
                return None
            # The group of the waiter's keys (one group serves them all: routing refused others).
            target = backend.redirect_for(key_slot(bytes(w.keys[0])))
            return None if target is None else NotLeader(target or None)
        self.registry.fail_where(deposed)

    def _begin(self, options, context) -> _Call:
        metadata = dict(context.invocation_metadata() or ())
        if self._token is not None:
            got = metadata.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {self._token}".encode()):
                raise Unauthenticated()
        loop = asyncio.get_running_loop()
        left = context.time_remaining()
        if options is not None and options.deadline_hint_ms:
            hint = min(options.deadline_hint_ms, MAX_DEADLINE_HINT_MS) / 1000
            left = hint if left is None else min(left, hint)
        client_id = seq = 0
        raw = metadata.get(REQUEST_ID_KEY)
        if raw is not None:
            try:
                client_id, seq = (int(x) for x in raw.split(":"))
            except ValueError:
                raise cv.ArgumentError(f"{REQUEST_ID_KEY} must be <client_id>:<seq>") from None
            if not (0 < client_id < 1 << 64 and 0 < seq < 1 << 64):
                raise cv.ArgumentError(f"{REQUEST_ID_KEY} out of range")
        follower = options is not None and options.allow_follower_read
        return _Call(None if left is None else loop.time() + left, not follower, client_id, seq)

    def _detail(self, exc: BaseException, call: _Call | None):
        """(grpc code, ErrorDetail) for any failure."""
        leader = None
        if isinstance(exc, NotLeader):
            message = exc.message
            leader = getattr(exc, "grpc_address", None) or (
                self._grpc_address_of(exc.leader_address) if exc.leader_address else None)
        elif isinstance(exc, StaleRequest) or (isinstance(exc, EngineError) and _ALREADY_APPLIED.match(exc.message)):
            # The request id's first attempt is too old to tell, or was applied
            # with a reply too large to keep: either way not a plain failure.
            message = "UNKNOWNOUTCOME " + exc.message
        elif isinstance(exc, (EngineError, BackendError)):
            message = exc.message
        elif call is not None and call.proposed:
            message = unknown_outcome_message() + f" (internal error after proposing: {type(exc).__name__})"
        else:
            detail = pb.ErrorDetail(reason="INTERNAL", message=f"internal error: {type(exc).__name__}: {exc}"[:4096])
            return grpc.StatusCode.INTERNAL, detail
        row = wire_for_message(message)
        detail = pb.ErrorDetail(reason=row.reason, message=message[:4096], retriable=row.retriable,
                                leader_address=(leader or "")[:256])
        if isinstance(exc, NotLeader):
            # The key's group (sharded_backend / raft_backend set these; absent: unknown).
            detail.leader_id = getattr(exc, "leader_id", 0) or 0
            detail.group_id = getattr(exc, "group_id", 0) or 0
            if getattr(exc, "slot", None) is not None:
                detail.slot = exc.slot
        parts = message.split(" ")
        if row.reason in ("MOVED", "ASK") and len(parts) == 3 and parts[1].isdigit():
            detail.slot = int(parts[1])
            detail.leader_address = (self._grpc_address_of(parts[2]) or parts[2])[:256]
        return grpc.StatusCode[row.grpc_status], detail

    async def _abort(self, context, exc: BaseException, call: _Call | None):
        code, detail = self._detail(exc, call)
        packed = any_pb2.Any()
        packed.Pack(detail)
        status = status_pb2.Status(code=code.value[0], message=detail.message, details=[packed])
        await context.abort_with_status(rpc_status.to_status(status))

    async def _handle(self, request, context, body):
        """Run one unary RPC: body(call) -> response; any failure -> status."""
        if latency_trace.ON:
            return await self._handle_traced(request, context, body)
        stats = self.request_stats
        if stats is None:
            return await self._handle_timed(request, context, body)
        t0 = time.perf_counter()
        try:
            return await self._handle_timed(request, context, body)
        finally:
            stats.observe(rpc_name(body), time.perf_counter() - t0)

    async def _handle_traced(self, request, context, body):
        latency_trace.mark("rpc_in")
        try:
            return await self._handle_timed(request, context, body)
        finally:
            latency_trace.mark("rpc_out")

    async def _handle_timed(self, request, context, body):
        call = None
        held = 0
        memory = self.client_memory
        try:
            call = self._begin(request.options, context)
            size = request.ByteSize()
            if not memory.take(size):
                memory.refused += 1
                raise NoClientMemory(size, memory)
            held = size
            return await body(call)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - every failure becomes a status, the unforeseen ones too
            await self._abort(context, e, call)
        finally:
            if held:
                memory.give_back(held)

    # -- the command paths ----------------------------------------------------------------

    def _route(self, argv) -> None:
        """CROSS_SLOT or MOVED for a command's keys (module doc); nothing when it is served here."""
        try:
            spec = lookup(argv)
        except EngineError:
            return                        # fails by itself, with redis's text
        self._route_slot(common_slot(command_keys(spec, argv)))

    def _route_slot(self, slot) -> None:
        if slot is None:
            return
        target = self.backend.redirect_for(slot)
        if not target or own_group(self.backend, slot):
            return      # this node's own group: the backend answers NOT_LEADER, or serves a follower read
        raise Moved(slot, self._grpc_address_of(target) or "")

    async def _submit(self, call: _Call, requests):
        left = call.remaining()
        if left is not None and left <= 0:
            raise Timeout()
        call.write = call.proposed = True
        if left is None:
            return await self.backend.submit(requests)
        try:
            async with asyncio.timeout(left):     # no task per call, unlike wait_for
                return await self.backend.submit(requests)
        except TimeoutError:
            raise UnknownOutcome() from None

    async def _read(self, call: _Call, argv, route: bool = True):
        if route:
            self._route(argv)
        left = call.remaining()
        if left is not None and left <= 0:
            raise Timeout()
        result = await self.backend.read(argv, call.linearizable)
        return _ok(result)

    async def _write(self, call: _Call, argv):
        """A write command (blocking forms included): its reply."""
        resolved = resolve_command(call.client_id, call.seq, argv)
        self._route(argv)
        if resolved.plan is None:
            return _ok((await self._submit(call, [resolved.request]))[0])
        plan = dataclasses.replace(resolved.plan, timeout_ms=call.block_ms(resolved.plan.timeout_ms))
        if call.remaining() is not None and call.remaining() <= 0:
            raise Timeout()
        call.write = call.proposed = True
        return _ok(await run_blocking_write(self.backend, self.registry, Resolved(resolved.request, plan), call))

    async def _xread(self, call: _Call, argv, keys, timeout_ms):
        if timeout_ms is None:
            return await self._read(call, argv)
        self._route(argv)
        return _ok(await run_blocking_read(self.backend, self.registry, argv, list(dict.fromkeys(keys)),
                                           call.block_ms(timeout_ms), call.linearizable, call))

    async def _execute(self, call: _Call, argv):
        name = bytes(argv[0]).lower()
        if name in _SERVER_EXECUTE:
            return await _SERVER_EXECUTE[name](self, call, argv)
        try:
            return await self._write(call, argv)
        except NotAWrite:
            pass
        if is_blocking_form(argv):        # XREAD BLOCK: the only blocking read
            args = parse_xread_args(argv, False)
            return await self._xread(call, argv, args.keys, args.timeout_ms)
        return await self._read(call, argv)

    # -- server-level commands for Execute (module doc) -------------------------------------

    async def _server_ping(self, call, argv):
        if len(argv) > 2:
            raise wrong_arity("ping")
        return "PONG" if len(argv) == 1 else bytes(argv[1])

    async def _server_info(self, call, argv):
        sections = [bytes(a).decode("latin-1").lower() for a in argv[1:]]
        dbsize = await self.backend.read([b"DBSIZE"], False)     # this replica's, as RESP's INFO
        return info_text(self.info_server, sections, dbsize if isinstance(dbsize, int) else 0)

    async def _server_cluster(self, call, argv):
        _check_arity("cluster", argv)
        read = slot_read(argv)            # COUNTKEYSINSLOT / GETKEYSINSLOT read the slot's keys
        if read is None:
            return cluster_command(self.backend, argv, 3)
        slot, read_argv = read
        self._route_slot(slot)
        return await self._read(call, read_argv, route=False)

    async def _server_command(self, call, argv):
        return command_command(argv)

    # -- streams ---------------------------------------------------------------------------

    async def XAdd(self, request, context):
        async def body(call):
            self._route_slot(key_slot(request.key))
            batch, without = cv.xadd_batch(request)
            results = []
            if batch is not None:
                # One XADD_BATCH request (fsm/xadd_batch.py): one at-most-once slot
                # for the whole batch, errors per entry (none undoes the others).
                [results] = await self._submit(call, [resolve_xadd_batch(call.client_id, call.seq, batch)])
                results = _ok(results)
            if without:
                # Entries without fields never reach the log: each fails alone, as it would alone.
                err = error_without_fields(*cv.xadd_trim(request))
                results = list(results)
                for i in without:               # ascending: each lands at its own index
                    results.insert(i, err)
            out = pb.XAddResponse()
            add = out.results.add
            for r in results:
                if type(r) is bytes:
                    ms, _, seq = r.partition(b"-")    # cv.parse_id, set in place
                    sid = add().id
                    sid.ms = int(ms)
                    sid.seq = int(seq)
                elif r is None:
                    add(skipped=True)
                else:
                    add(error=self._detail(r, call)[1])
            return out
        return await self._handle(request, context, body)

    async def XRange(self, request, context):
        return await self._handle(request, context, lambda call: self._range(call, request, False))

    async def XRevRange(self, request, context):
        return await self._handle(request, context, lambda call: self._range(call, request, True))

    async def _range(self, call, request, reverse):
        reply = await self._read(call, cv.xrange_argv(request, reverse))
        return pb.XRangeResponse(entries=cv.entries_pb(reply))

    async def XRead(self, request, context):
        async def body(call):
            block = _opt(request, "block_ms")
            argv = cv.xread_argv(request.streams, _opt(request, "count"), block)
            reply = await self._xread(call, argv, [s.key for s in request.streams], block)
            return pb.XReadResponse(streams=cv.streams_pb(reply))
        return await self._handle(request, context, body)

    async def XReadGroup(self, request, context):
        async def body(call):
            reply = await self._write(call, cv.xreadgroup_request_argv(request, _opt(request, "block_ms")))
            return pb.XReadGroupResponse(streams=cv.streams_pb(reply))
        return await self._handle(request, context, body)

    async def XAck(self, request, context):
        async def body(call):
            return pb.XAckResponse(acked=await self._write(
                call, cv.ids_argv([b"XACK", request.key, request.group], request.ids)))
        return await self._handle(request, context, body)

    async def XPending(self, request, context):
        async def body(call):
            return cv.xpending_pb(await self._read(call, [b"XPENDING", request.key, request.group]))
        return await self._handle(request, context, body)

    async def XPendingExtended(self, request, context):
        async def body(call):
            reply = await self._read(call, cv.xpending_ext_argv(request))
            return pb.XPendingExtendedResponse(entries=[
                pb.PendingEntry(id=cv.parse_id(i), consumer=c, idle_ms=idle, delivery_count=n)
                for i, c, idle, n in reply])
        return await self._handle(request, context, body)

    async def XClaim(self, request, context):
        async def body(call):
            reply = await self._write(call, cv.xclaim_argv(request))
            if request.just_id:
                return pb.XClaimResponse(ids=[cv.parse_id(i) for i in reply])
            return pb.XClaimResponse(entries=cv.entries_pb(reply))
        return await self._handle(request, context, body)

    async def XAutoClaim(self, request, context):
        async def body(call):
            nxt, claimed, deleted = await self._write(call, cv.xautoclaim_argv(request))
            out = pb.XAutoClaimResponse(next_start=cv.parse_id(nxt), deleted_ids=[cv.parse_id(i) for i in deleted])
            if request.just_id:
                out.ids.extend(cv.parse_id(i) for i in claimed)
            else:
                out.entries.extend(cv.entries_pb(claimed))
            return out
        return await self._handle(request, context, body)

    async def XGroupCreate(self, request, context):
        async def body(call):
            await self._write(call, cv.xgroup_create_argv(request))
            return pb.XGroupCreateResponse()
        return await self._handle(request, context, body)

    async def XGroupSetId(self, request, context):
        async def body(call):
            await self._write(call, cv.xgroup_setid_argv(request))
            return pb.XGroupSetIdResponse()
        return await self._handle(request, context, body)

    async def XGroupDestroy(self, request, context):
        async def body(call):
            n = await self._write(call, [b"XGROUP", b"DESTROY", request.key, request.group])
            return pb.XGroupDestroyResponse(destroyed=bool(n))
        return await self._handle(request, context, body)

    async def XGroupCreateConsumer(self, request, context):
        async def body(call):
            n = await self._write(call, [b"XGROUP", b"CREATECONSUMER", request.key, request.group, request.consumer])
            return pb.XGroupCreateConsumerResponse(created=bool(n))
        return await self._handle(request, context, body)

    async def XGroupDelConsumer(self, request, context):
        async def body(call):
            n = await self._write(call, [b"XGROUP", b"DELCONSUMER", request.key, request.group, request.consumer])
            return pb.XGroupDelConsumerResponse(pending_deleted=n)
        return await self._handle(request, context, body)

    async def XDel(self, request, context):
        async def body(call):
            return pb.XDelResponse(deleted=await self._write(call, cv.ids_argv([b"XDEL", request.key], request.ids)))
        return await self._handle(request, context, body)

    async def XTrim(self, request, context):
        async def body(call):
            return pb.XTrimResponse(trimmed=await self._write(call, cv.xtrim_argv(request)))
        return await self._handle(request, context, body)

    async def XLen(self, request, context):
        async def body(call):
            return pb.XLenResponse(length=await self._read(call, [b"XLEN", request.key]))
        return await self._handle(request, context, body)

    async def XInfoStream(self, request, context):
        async def body(call):
            return cv.xinfo_stream_pb(await self._read(call, cv.xinfo_stream_argv(request)))
        return await self._handle(request, context, body)

    async def XInfoGroups(self, request, context):
        async def body(call):
            reply = await self._read(call, [b"XINFO", b"GROUPS", request.key])
            return pb.XInfoGroupsResponse(groups=[cv.group_info_pb(g) for g in reply])
        return await self._handle(request, context, body)

    async def XInfoConsumers(self, request, context):
        async def body(call):
            reply = await self._read(call, [b"XINFO", b"CONSUMERS", request.key, request.group])
            return pb.XInfoConsumersResponse(consumers=[
                pb.ConsumerInfo(name=c[b"name"], pending=c[b"pending"], idle_ms=c[b"idle"]) for c in reply])
        return await self._handle(request, context, body)

    async def XSetId(self, request, context):
        async def body(call):
            await self._write(call, cv.xsetid_argv(request))
            return pb.XSetIdResponse()
        return await self._handle(request, context, body)

    # -- lists -----------------------------------------------------------------------------

    async def ListPush(self, request, context):
        async def body(call):
            return pb.ListPushResponse(length=await self._write(call, cv.list_push_argv(request)))
        return await self._handle(request, context, body)

    async def ListPop(self, request, context):
        async def body(call):
            block = _opt(request, "block_ms")
            reply = await self._write(call, cv.list_pop_argv(request, block))
            if reply is None or reply is NULL_ARRAY:
                return pb.ListPopResponse(nil=True)
            if block is not None:             # [key, element]
                return pb.ListPopResponse(key=reply[0], values=[reply[1]])
            values = reply if isinstance(reply, list) else [reply]
            return pb.ListPopResponse(key=request.keys[0], values=values)
        return await self._handle(request, context, body)

    async def ListRange(self, request, context):
        async def body(call):
            reply = await self._read(call, [b"LRANGE", request.key, b"%d" % request.start, b"%d" % request.stop])
            return pb.ListRangeResponse(values=reply)
        return await self._handle(request, context, body)

    async def ListIndex(self, request, context):
        async def body(call):
            reply = await self._read(call, [b"LINDEX", request.key, b"%d" % request.index])
            return pb.ListIndexResponse() if reply is None else pb.ListIndexResponse(value=reply)
        return await self._handle(request, context, body)

    async def ListSet(self, request, context):
        async def body(call):
            await self._write(call, [b"LSET", request.key, b"%d" % request.index, request.value])
            return pb.ListSetResponse()
        return await self._handle(request, context, body)

    async def ListInsert(self, request, context):
        async def body(call):
            where = b"BEFORE" if request.before else b"AFTER"
            n = await self._write(call, [b"LINSERT", request.key, where, request.pivot, request.value])
            return pb.ListInsertResponse(length=n)
        return await self._handle(request, context, body)

    async def ListRem(self, request, context):
        async def body(call):
            n = await self._write(call, [b"LREM", request.key, b"%d" % request.count, request.value])
            return pb.ListRemResponse(removed=n)
        return await self._handle(request, context, body)

    async def ListTrim(self, request, context):
        async def body(call):
            await self._write(call, [b"LTRIM", request.key, b"%d" % request.start, b"%d" % request.stop])
            return pb.ListTrimResponse()
        return await self._handle(request, context, body)

    async def ListPos(self, request, context):
        async def body(call):
            reply = await self._read(call, cv.list_pos_argv(request))
            positions = [] if reply is None else (reply if isinstance(reply, list) else [reply])
            return pb.ListPosResponse(positions=positions)
        return await self._handle(request, context, body)

    async def ListMove(self, request, context):
        async def body(call):
            reply = await self._write(call, cv.list_move_argv(request, _opt(request, "block_ms")))
            return pb.ListMoveResponse() if reply is None or reply is NULL_ARRAY else pb.ListMoveResponse(value=reply)
        return await self._handle(request, context, body)

    async def ListMPop(self, request, context):
        async def body(call):
            reply = await self._write(call, cv.list_mpop_argv(request, _opt(request, "block_ms")))
            if reply is None or reply is NULL_ARRAY:
                return pb.ListMPopResponse()
            return pb.ListMPopResponse(key=reply[0], values=reply[1])
        return await self._handle(request, context, body)

    async def ListLen(self, request, context):
        async def body(call):
            return pb.ListLenResponse(length=await self._read(call, [b"LLEN", request.key]))
        return await self._handle(request, context, body)

    async def Execute(self, request, context):
        async def body(call):
            cv.check_count("argv", request.argv, 1, MAX_ARGV)
            return pb.ExecuteResponse(reply=cv.value_pb(await self._execute(call, list(request.argv))))
        return await self._handle(request, context, body)

    # -- streaming (grpc_streams.py) ----------------------------------------------------------

    # Async generator functions taking (service, request, context): as class
    # attributes they are this servicer's methods, and grpc.aio sees them as
    # async generator handlers (a plain def returning one would run as sync).
    Subscribe = grpc_streams.subscribe
    Consume = grpc_streams.consume


_SERVER_EXECUTE = {b"ping": XRaftService._server_ping, b"info": XRaftService._server_info,
                   b"cluster": XRaftService._server_cluster, b"command": XRaftService._server_command}


def _check_arity(name: str, argv) -> None:
    arity = SERVER_COMMANDS[name][0]
    if (arity > 0 and len(argv) != arity) or (arity < 0 and len(argv) < -arity):
        raise wrong_arity(name)


def _ok(result):
    """A command's result, or its EngineError raised."""
    if isinstance(result, EngineError):
        raise result
    return result


# -- the server -------------------------------------------------------------------------------

async def start_server(backend, address: str = "127.0.0.1:0", *, token: str | None = None,
                       grpc_address_of=None, registry: BlockingRegistry | None = None,
                       max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS, client_memory: ClientMemory | None = None):
    """A started grpc.aio server with XRaft, health checking and reflection.
    Returns (server, port, service); stop it with `await server.stop(grace)`."""
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
        maximum_concurrent_rpcs=max_concurrent_rpcs)
    service = XRaftService(backend, token=token, grpc_address_of=grpc_address_of, registry=registry,
                           client_memory=client_memory)
    pb_grpc.add_XRaftServicer_to_server(service, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(address)
    if not port:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, service
