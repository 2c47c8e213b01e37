"""The gRPC client API (service xraft.v1.XRaft) over the Backend protocol.

Every typed RPC is the redis command it names (grpc_convert.py builds the
argv), run the way the RESP server runs it:

    writes    fsm resolve_command -> backend.submit (one record); blocking
              forms (BLPOP, XREADGROUP BLOCK ...) via blocking.run_blocking_write
    reads     backend.read(argv, linearizable = not options.allow_follower_read);
              XREAD BLOCK via blocking.run_blocking_read
    batches   XAdd of N entries = one record of N requests (one result each);
              with a request id, one MULTI request (one at-most-once slot)
    streams   Subscribe = XREAD in a loop, woken by the backend's ready keys;
              Consume = XREADGROUP ">" through the log, acks in, bounded window

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

Execute also answers the server-level commands an operator's script sends
(they are not engine commands, so they would otherwise fail or cost a
ReadIndex round): PING [msg] answered here, INFO [section ...] built by
info.py exactly as the RESP server builds it (the node passes its RespServer
as `info_server`, so the numbers are the same; INFO raft is backend.raft_info()),
CLUSTER SLOTS/SHARDS/NODES/INFO/MYID/KEYSLOT (cluster_cmds) and COMMAND.

Deadlines: the gRPC deadline, or options.deadline_hint_ms when shorter.
Nothing is proposed after it passed (TIMEOUT); a write still waiting for its
result when it passes is UNKNOWN_OUTCOME; a blocking form is cut to it and
answers its empty reply, as a redis BLOCK timeout does.
"""
import asyncio
import collections
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

from ..engine.errors import EngineError, wrong_arity
from ..engine.replies import NULL_ARRAY
from ..engine.stream_args import parse_xread_args
from ..fsm.blocking import is_blocking_form
from ..fsm.errors import NotAWrite, StaleRequest
from ..fsm.resolve import Resolved, queue_check, resolve_command, resolve_transaction
from . import grpc_convert as cv
from .backend import BackendError, NotLeader, UnknownOutcome
from .blocking import BlockingRegistry, run_blocking_read, run_blocking_write
from .cluster_cmds import cluster_command
from .info import SERVER_COMMANDS, command_command, info_text
from .wire_errors import noauth_message, timeout_message, unknown_outcome_message, wire_for_message

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["XRaft"].full_name
REQUEST_ID_KEY = "xraft-request-id"
MAX_MESSAGE_BYTES = 16 << 20          # client.proto: every request and reply fits 16 MiB
MAX_CONCURRENT_RPCS = 4096            # beyond this grpc refuses calls (RESOURCE_EXHAUSTED)
MAX_DEADLINE_HINT_MS = 600_000
MAX_ARGV = 1 << 20
DEFAULT_MAX_UNACKED = 1000
MAX_UNACKED = 10_000
MAX_ACK_IDS = 10_000
MAX_CONSUME_KEYS = 100
READS_AHEAD = 4                       # Consume: XREADGROUP reads in flight at once (window permitting)
MAX_ACKS_PER_WRITE = 256              # Consume: acks written by one submit (one record)
MAX_QUEUED_ACKS = 1024                # Consume: acks read and not yet written (then reading pauses)
BLOCK_MARGIN_S = 0.05                 # a blocking form ends this much before the deadline
_ALREADY_APPLIED = re.compile(r"^ERR xraft: request \d+ of client \d+ was already applied")


class Timeout(BackendError):
    """The deadline passed before anything was proposed: nothing happened."""

    def __init__(self):
        super().__init__(timeout_message())


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


class XRaftService(pb_grpc.XRaftServicer):
    def __init__(self, backend, *, registry: BlockingRegistry | None = None, token: str | None = None,
                 grpc_address_of=None, info_server=None):
        """`grpc_address_of(addr)`: the gRPC address of the node whose RESP
        address the backend names as leader (identity by default).
        `info_server`: the node's RespServer, whose figures INFO reports."""
        self.backend = backend
        self._token = token
        self._grpc_address_of = grpc_address_of or (lambda a: a)
        if registry is None:              # a shared registry is already wired by its owner
            registry = BlockingRegistry()
            backend.add_ready_listener(registry.on_ready)
        self.registry = registry
        self.info_server = info_server or _InfoView(backend, registry)
        backend.add_role_listener(self._on_role_change)

    # -- plumbing -----------------------------------------------------------------------

    def _on_role_change(self) -> None:
        """Deposed: blocked writes and linearizable reads end with NOT_LEADER
        (never a silent empty reply); follower reads keep waiting."""
        if self.backend.is_leader():
            return
        error = NotLeader(self.backend.leader_address())
        self.registry.fail_where(
            lambda w: error if isinstance(w.owner, _Call) and (w.owner.write or w.owner.linearizable) else None)

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
            leader = self._grpc_address_of(exc.leader_address) if exc.leader_address else None
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
        parts = message.split(" ")
        if row.reason in ("MOVED", "ASK") and len(parts) == 3 and parts[1].isdigit():
            detail.slot = int(parts[1])
            detail.leader_address = parts[2][:256]
        return grpc.StatusCode[row.grpc_status], detail

    async def _abort(self, context, exc: BaseException, call: _Call | None):
        code, detail = self._detail(exc, call)
        packed = any_pb2.Any()
        packed.Pack(detail)
        status = status_pb2.Status(code=code.value[0], message=detail.message, details=[packed])
        await context.abort_with_status(rpc_status.to_status(status))

    async def _handle(self, request, context, body):
        """Run one unary RPC: body(call) -> response; any failure -> status."""
        call = None
        try:
            call = self._begin(request.options, context)
            return await body(call)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - every failure becomes a status, the unforeseen ones too
            await self._abort(context, e, call)

    # -- the command paths ----------------------------------------------------------------

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

    async def _read(self, call: _Call, argv):
        left = call.remaining()
        if left is not None and left <= 0:
            raise Timeout()
        result = await self.backend.read(argv, call.linearizable)
        return _ok(result)

    async def _write(self, call: _Call, argv):
        """A write command (blocking forms included): its reply."""
        resolved = resolve_command(call.client_id, call.seq, argv)
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
        return _ok(await run_blocking_read(self.backend, self.registry, argv, list(dict.fromkeys(keys)),
                                           call.block_ms(timeout_ms), call.linearizable, call))

    async def _execute(self, call: _Call, argv):
        name = bytes(argv[0]).lower()
        if name in _SERVER_EXECUTE:
            return await _SERVER_EXECUTE[name](self, argv)
        try:
            return await self._write(call, argv)
        except NotAWrite:
            pass
        if is_blocking_form(argv):        # XREAD BLOCK: the only blocking read
            args = parse_xread_args(argv, False)
            return await self._xread(call, argv, args.keys, args.timeout_ms)
        return await self._read(call, argv)

    # -- server-level commands for Execute (module doc) -------------------------------------

    async def _server_ping(self, argv):
        if len(argv) > 2:
            raise wrong_arity("ping")
        return "PONG" if len(argv) == 1 else bytes(argv[1])

    async def _server_info(self, argv):
        sections = [bytes(a).decode("latin-1").lower() for a in argv[1:]]
        dbsize = await self.backend.read([b"DBSIZE"], False)     # this replica's, as RESP's INFO
        return info_text(self.info_server, sections, dbsize if isinstance(dbsize, int) else 0)

    async def _server_cluster(self, argv):
        _check_arity("cluster", argv)
        return cluster_command(self.backend, argv, 3)

    async def _server_command(self, argv):
        return command_command(argv)

    # -- streams ---------------------------------------------------------------------------

    async def XAdd(self, request, context):
        async def body(call):
            argvs = cv.xadd_argvs(request)
            results = [None] * len(argvs)
            ok = []                            # indexes that passed the queue-time checks
            verdicts = {}                      # argc -> None or its error: every argv is XADD ...,
            for i, argv in enumerate(argvs):   # so the check reads nothing but the length
                n = len(argv)
                if n not in verdicts:
                    try:
                        queue_check(argv)      # arity: that entry fails alone, as it would alone
                        verdicts[n] = None
                    except EngineError as e:
                        verdicts[n] = e
                err = verdicts[n]
                if err is None:
                    ok.append(i)
                else:
                    results[i] = err
            if ok and call.client_id:
                # One at-most-once slot for the whole batch: a MULTI whose
                # per-command errors stay per entry (none undoes the others).
                txn = resolve_transaction(call.client_id, call.seq, [argvs[i] for i in ok])
                [replies] = await self._submit(call, [txn])
                replies = _ok(replies)
            elif ok:
                requests = [resolve_command(0, 0, argvs[i]).request for i in ok]
                replies = await self._submit(call, requests)
            for i, reply in zip(ok, replies if ok else ()):
                results[i] = reply
            out = pb.XAddResponse()
            add = out.results.add
            for r in results:
                if type(r) is bytes:
                    ms, _, seq = r.partition(b"-")    # cv.parse_id, set in place
                    sid = add().id
                    sid.ms = int(ms)
                    sid.seq = int(seq or b"0")
                elif isinstance(r, EngineError):
                    add(error=self._detail(r, call)[1])
                elif r is None:
                    add(skipped=True)
                else:
                    add(id=cv.parse_id(r))
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

    # -- streaming ---------------------------------------------------------------------------

    async def Subscribe(self, request, context):
        """XREAD in a loop, resumed after the last ID sent; between reads it
        waits on the backend's ready keys (no polling)."""
        call = waiter = None
        try:
            call = self._begin(request.options, context)
            call.deadline = None              # a subscription lives until cancelled
            call.client_id = call.seq = 0     # many reads, no one request id
            cv.check_count("streams", request.streams, 1, cv.MAX_STREAMS)
            batch = min(request.max_batch or cv.DEFAULT_BATCH, cv.MAX_BATCH)
            keys = [s.key for s in request.streams]
            if len(set(keys)) != len(keys):
                raise cv.ArgumentError("streams: keys must be distinct")
            # Registered before the first read, so a write during it is not missed.
            waiter = self.registry.register(keys, 0, False, call)
            after = await self._positions(call, request.streams)
            while True:
                argv = [b"XREAD", b"COUNT", b"%d" % batch, b"STREAMS"] + keys + [after[k] for k in keys]
                reply = await self._read(call, argv)
                streams = cv.streams_pb(reply)
                if streams:
                    for s in streams:
                        after[s.key] = cv.id_text(s.entries[-1].id)
                    yield pb.SubscribeResponse(streams=streams)
                    continue
                await waiter.wait()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            await self._abort(context, e, call)
        finally:
            if waiter is not None:
                self.registry.unregister(waiter)

    async def _positions(self, call: _Call, streams) -> dict:
        """Each stream's resume position. "$" becomes the stream's last entry
        ID (0-0 if none): every later entry is above it, exactly as above
        its last_id, and nothing at or below it is ever served."""
        out = {}
        for s in streams:
            if s.WhichOneof("from") == "new_entries_only":
                last = await self._read(call, [b"XREVRANGE", s.key, b"+", b"-", b"COUNT", b"1"])
                out[s.key] = last[0][0] if last else b"0-0"
            else:
                out[s.key] = cv.id_text(s.after)
        return out

    async def Consume(self, request_iterator, context):
        """A consumer group's deliveries out, acks in. The first message is
        `start`; then a delivery task reads ">" (XREADGROUP through the log,
        several reads in flight) while fewer than max_unacked entries are out,
        and an ack task writes the ConsumeAcks as XACKs (those that arrive
        together in one record). Both feed one queue this generator drains:
        grpc allows one writer per call. A client's half-close ends the call
        once the acks it sent are confirmed."""
        call = None
        tasks = []
        try:
            first = await request_iterator.__anext__()
            if first.WhichOneof("body") != "start":
                raise cv.ArgumentError("the first Consume message must be start")
            start = first.start
            call = self._begin(start.options, context)
            call.deadline = None              # lives until cancelled
            call.client_id = call.seq = 0     # many writes: a request id would dedup them into one
            session = _ConsumeSession(self, call, start)
            tasks = [asyncio.ensure_future(session.deliver()), asyncio.ensure_future(session.take_acks(request_iterator))]
            while True:
                item = await session.out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        except asyncio.CancelledError:
            raise
        except StopAsyncIteration:
            return
        except Exception as e:  # noqa: BLE001
            await self._abort(context, e, call)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                try:
                    await t
                except BaseException:  # noqa: BLE001 - cancelled or already reported through the queue
                    pass


class _ConsumeSession:
    """One Consume call's state. Deliveries are pipelined: up to READS_AHEAD
    XREADGROUP ">" reads are in flight at once (each counted against the
    window before it is issued, so delivered + requested never exceeds
    max_unacked), and their results go out in issue order. Reads run ahead only
    while the previous one came back full (the stream may hold more); a short
    or empty read means drained, and the session waits for the keys' next
    write. Acks are read as they arrive; those that arrive while a write of
    earlier acks is in flight are written together, one XACK request each, in
    ONE submit (one log record), and confirmed in arrival order with each
    XACK's own count. At-least-once is unchanged: an entry leaves the window
    only once its XACK is applied.

    Reads do not wait for the acks in flight to apply: the IDs those acks
    release count as room at once, so the next read joins the acks' record
    (one fsync round instead of two in a row). What such a read returns is
    held back until those ack writes have applied (they precede it in the log
    and finish first), so the client never holds more than max_unacked
    entries; if one of them fails the session ends and the held entries stay
    in the consumer's PEL (replay_pending_after), as any undelivered read."""

    def __init__(self, service: XRaftService, call: _Call, start: pb.ConsumeStart):
        cv.check_count("keys", start.keys, 1, MAX_CONSUME_KEYS)
        if len(set(start.keys)) != len(start.keys):
            raise cv.ArgumentError("keys must be distinct")
        if start.max_unacked > MAX_UNACKED:
            raise cv.ArgumentError(f"max_unacked: at most {MAX_UNACKED}")
        self.service, self.call, self.start = service, call, start
        self.keys = list(start.keys)
        self.window = start.max_unacked or DEFAULT_MAX_UNACKED
        self.batch = min(start.max_batch or cv.DEFAULT_BATCH, cv.MAX_BATCH)
        self.unacked = set()                 # (key, id bytes) delivered and not acked
        self.room = asyncio.Event()          # set when an ack may have opened the window
        self.out: asyncio.Queue = asyncio.Queue()
        self.acks: list = []                 # ConsumeAck read, not yet written
        self.acks_changed = asyncio.Event()  # acks queued, the input ended, or acks written
        self.acks_ended = False
        self.releasing = set()               # unacked (key, id) whose XACK is being written
        self.ack_writes_started = self.ack_writes_done = 0
        self.acks_applied = asyncio.Event()  # set when an ack write completes
        # Figures (tests): reads issued, XACK submits (records) and the acks they carried.
        self.reads = self.ack_writes = self.acks_written = 0

    async def _readgroup(self, ids, count):
        argv = cv.xreadgroup_argv(self.start.group, self.start.consumer, self.keys, ids, count, None,
                                  self.start.no_ack)
        self.reads += 1
        return cv.streams_pb(await self.service._write(self.call, argv))

    def _deliver(self, streams) -> None:
        if not self.start.no_ack:
            for s in streams:
                self.unacked.update((s.key, cv.id_text(e.id)) for e in s.entries)
        self.out.put_nowait(pb.ConsumeResponse(delivery=pb.ConsumeDelivery(streams=streams)))

    async def deliver(self) -> None:
        try:
            if self.start.HasField("replay_pending_after"):
                # This consumer's own history first (after a crash): it is
                # already in the PEL, so it does not count against the window.
                after = {k: cv.id_text(self.start.replay_pending_after) for k in self.keys}
                while True:
                    streams = await self._readgroup([after[k] for k in self.keys], self.batch)
                    streams = [s for s in streams if s.entries]
                    if not streams:
                        break
                    for s in streams:
                        after[s.key] = cv.id_text(s.entries[-1].id)
                    self.out.put_nowait(pb.ConsumeResponse(delivery=pb.ConsumeDelivery(streams=streams)))
            registry = self.service.registry
            waiter = registry.register(self.keys, 0, True, self.call)
            inflight = collections.deque()   # (read task, entries requested), in issue order
            try:
                await self._deliver_loop(registry, waiter, inflight)
            finally:
                registry.unregister(waiter)
                for t, _, _ in inflight:
                    t.cancel()
                for t, _, _ in inflight:
                    try:
                        await t
                    except BaseException:  # noqa: BLE001 - cancelled or failed: this session is ending
                        pass
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reported through the stream
            self.out.put_nowait(e)

    async def _deliver_loop(self, registry, waiter, inflight) -> None:
        ids = [b">"] * len(self.keys)
        reserved = 0                         # entries requested by reads in flight
        ahead = 1                            # reads allowed in flight: 1 until one comes back full
        while True:
            while len(inflight) < ahead:
                if self.start.no_ack:
                    room = self.batch
                else:
                    room = min(self.batch, self.window - len(self.unacked) + len(self.releasing) - reserved)
                if room <= 0:
                    break
                # A read counting on acks in flight is delivered only after they applied.
                after = self.ack_writes_started if self.releasing else 0
                inflight.append((asyncio.ensure_future(self._readgroup(ids, room)), room, after))
                reserved += room
            if not inflight:
                if ahead == 0:               # drained: wait for the keys' next write
                    await waiter.wait()
                    ahead = 1
                else:                        # window full: wait for an ack
                    self.room.clear()
                    if not self.start.no_ack and self.window - len(self.unacked) + len(self.releasing) <= 0:
                        await self.room.wait()
                continue
            task, room, after = inflight[0]
            try:
                streams = await task
                while self.ack_writes_done < after:   # the acks it counted on: applied first
                    self.acks_applied.clear()
                    await self.acks_applied.wait()
            finally:
                inflight.popleft()
                reserved -= room
            if any(s.entries for s in streams):
                self._deliver(streams)
                # More may be there: the next consuming waiter's turn (not a new write).
                registry.on_ready(self.keys, recheck_in_flight=False)
            if any(len(s.entries) >= room for s in streams):    # full: the stream may hold more
                ahead = READS_AHEAD
            elif ahead:
                ahead = 0                    # drained: let the reads in flight finish, then wait

    async def take_acks(self, request_iterator) -> None:
        """Reads acks as they come (bounded: MAX_QUEUED_ACKS waiting to be written);
        write_acks writes them."""
        writer = asyncio.ensure_future(self.write_acks())
        try:
            async for req in request_iterator:
                if req.WhichOneof("body") != "ack":
                    raise cv.ArgumentError("only acks after start")
                ack = req.ack
                cv.check_count("ids", ack.ids, 1, MAX_ACK_IDS)
                while len(self.acks) >= MAX_QUEUED_ACKS and not writer.done():
                    self.acks_changed.clear()
                    await self.acks_changed.wait()
                if writer.done():
                    break
                self.acks.append(ack)
                self.acks_changed.set()
            self.acks_ended = True
            self.acks_changed.set()
            await writer
        except asyncio.CancelledError:
            writer.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - reported through the stream
            writer.cancel()
            self.out.put_nowait(e)

    async def write_acks(self) -> None:
        """Every ack queued when the previous write completed, as one submit of one
        XACK per ack (one record); results in arrival order. Ends with None on the
        queue once the input ended and everything read is written."""
        try:
            group = self.start.group
            while True:
                if not self.acks:
                    if self.acks_ended:
                        self.out.put_nowait(None)
                        return
                    self.acks_changed.clear()
                    await self.acks_changed.wait()
                    continue
                take, size = 0, 0
                while take < len(self.acks) and (take == 0 or (take < MAX_ACKS_PER_WRITE
                                                               and size + len(self.acks[take].ids) <= MAX_ACK_IDS)):
                    size += len(self.acks[take].ids)
                    take += 1
                acks, self.acks = self.acks[:take], self.acks[take:]
                self.acks_changed.set()          # room for the reader
                ids = [[cv.id_text(i) for i in ack.ids] for ack in acks]
                requests = [resolve_command(0, 0, [b"XACK", ack.key, group] + i).request
                            for ack, i in zip(acks, ids)]
                self.ack_writes += 1
                self.acks_written += len(acks)
                unacked = self.unacked
                freeing = {(ack.key, x) for ack, i in zip(acks, ids) for x in i} & unacked
                freeing -= self.releasing
                self.releasing |= freeing
                self.ack_writes_started += 1
                # The room this opens lets the delivery task issue its next read now;
                # one loop pass lets that read reach the backend together with these
                # XACKs, so both go in one record (one fsync round, not two in a row).
                # Either order in the log is safe: the read's entries are delivered only
                # after this write completes (see deliver).
                if self.releasing:
                    self.room.set()
                    await asyncio.sleep(0)
                results = await self.service._submit(self.call, requests)
                for ack, i, acked in zip(acks, ids, results):
                    acked = _ok(acked)
                    unacked.difference_update((ack.key, x) for x in i)
                    self.out.put_nowait(pb.ConsumeResponse(ack_result=pb.ConsumeAckResult(ack_seq=ack.ack_seq,
                                                                                           acked=acked)))
                self.releasing -= freeing
                self.ack_writes_done += 1
                self.acks_applied.set()
                self.room.set()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reported through the stream
            self.out.put_nowait(e)


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
                       max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS):
    """A started grpc.aio server with XRaft, health checking and reflection.
    Returns (server, port, service); stop it with `await server.stop(grace)`."""
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
        maximum_concurrent_rpcs=max_concurrent_rpcs)
    service = XRaftService(backend, token=token, grpc_address_of=grpc_address_of, registry=registry)
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
