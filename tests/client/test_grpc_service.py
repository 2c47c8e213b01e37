"""The XRaft gRPC service over a real LocalBackend, through raw stubs: wire
shapes, ErrorDetail in status details, request-id dedup, deadlines, auth,
health checking and reflection."""
import asyncio

import grpc
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.client import run, serving
from xraft.node.engine.errors import EngineError
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.resolve import queue_check
from xraft.node.fsm.state_machine import StateMachine
from xraft.node.server import grpc_convert as cv
from xraft.node.server import wire_errors
from xraft.node.server.backend import LocalBackend, UnknownOutcome
from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc


def _detail(err: grpc.aio.AioRpcError) -> pb.ErrorDetail:
    [raw] = [v for k, v in err.trailing_metadata() if k == "grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    assert status.code == err.code().value[0] and len(status.details) == 1
    detail = pb.ErrorDetail()
    assert status.details[0].Unpack(detail)
    return detail


async def _fails(coro) -> grpc.aio.AioRpcError:
    try:
        await coro
    except grpc.aio.AioRpcError as e:
        return e
    raise AssertionError("the call succeeded")


def _fields(**kw):
    return [pb.Field(name=k.encode(), value=v.encode()) for k, v in kw.items()]


def test_xadd_batch_is_one_record_with_a_result_per_entry():
    async def body():
        async with serving() as (addr, backend, _):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                entries = [pb.XAddEntry(explicit_id=pb.StreamId(ms=5, seq=i), fields=_fields(n=str(i)))
                           for i in range(1, 4)]
                entries.insert(1, pb.XAddEntry(explicit_id=pb.StreamId(ms=1, seq=1), fields=_fields(x="y")))
                entries.append(pb.XAddEntry(fields=[]))          # arity error, alone
                before = backend.records
                resp = await stub.XAdd(pb.XAddRequest(key=b"s", entries=entries), timeout=5)
                assert backend.records == before + 1
                kinds = [r.WhichOneof("outcome") for r in resp.results]
                assert kinds == ["id", "error", "id", "id", "error"]
                assert [(r.id.ms, r.id.seq) for r in resp.results if r.HasField("id")] == [(5, 1), (5, 2), (5, 3)]
                err = resp.results[1].error
                assert err.reason == "COMMAND_ERROR" and "equal or smaller" in err.message and not err.retriable
                assert "wrong number of arguments" in resp.results[4].error.message
                skipped = await stub.XAdd(pb.XAddRequest(key=b"none", no_mkstream=True,
                                                         entries=[pb.XAddEntry(fields=_fields(a="b"))]), timeout=5)
                assert skipped.results[0].skipped
                e = await _fails(stub.XAdd(pb.XAddRequest(key=b"s"), timeout=5))
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and _detail(e).reason == "COMMAND_ERROR"
    run(body)


def _xadd_argvs(r: pb.XAddRequest) -> list:
    """One XADD argv per entry: the old XAdd conversion, kept here as the reference."""
    cv.check_count("entries", r.entries, 1, cv.MAX_XADD_ENTRIES)
    head = [b"XADD", r.key]
    if r.no_mkstream:
        head.append(b"NOMKSTREAM")
    if r.HasField("trim"):
        head += cv.trim_args(r.trim)
    out = []
    for e in r.entries:
        kind = e.WhichOneof("id")
        if kind == "explicit_id":
            sid = cv.id_text(e.explicit_id)
        elif kind == "auto_seq_ms":
            sid = b"%d-*" % e.auto_seq_ms
        else:
            sid = b"*"
        argv = head + [sid]
        for f in e.fields:
            argv += [f.name, f.value]
        out.append(argv)
    return out


def _xadd_reference(sm, req, now):
    """What XAdd answered before XADD_BATCH: each entry's argv (_xadd_argvs) checked as
    MULTI queues it, the rest run in one MULTI, on `sm` at `now`."""
    argvs = _xadd_argvs(req)
    want, ok = [None] * len(argvs), []
    for i, argv in enumerate(argvs):
        try:
            queue_check(argv)
            ok.append(i)
        except EngineError as e:
            want[i] = e
    if ok:
        [replies] = sm.apply(sm.applied_index + 1, encode_record(now, [Request.multi(0, 0, [argvs[i] for i in ok])]))
        for i, r in zip(ok, replies):
            want[i] = r
    return want


def test_xadd_answers_what_the_xadds_it_stands_for_answer():
    now = 1_700_000_000_000
    f = _fields(a="1", b="2")
    trims = [None, pb.TrimOptions(max_len=2, approximate=True, limit=1), pb.TrimOptions(max_len=1),
             pb.TrimOptions(min_id=pb.StreamId(ms=now, seq=1)), pb.TrimOptions(min_id=pb.StreamId(ms=5), limit=3),
             pb.TrimOptions(max_len=2**64 - 1)]
    entries = [pb.XAddEntry(fields=f), pb.XAddEntry(auto_seq_ms=now, fields=f), pb.XAddEntry(fields=[]),
               pb.XAddEntry(explicit_id=pb.StreamId(ms=3, seq=3), fields=f), pb.XAddEntry(fields=f[:1]),
               pb.XAddEntry(explicit_id=pb.StreamId(), fields=f), pb.XAddEntry(auto_seq_ms=now + 1, fields=f)]

    async def body():
        async with serving(LocalBackend(clock=lambda: now)) as (addr, backend, _):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                await stub.ListPush(pb.ListPushRequest(key=b"list", values=[b"x"]), timeout=5)
                for key in (b"s", b"list", b"none"):
                    for trim in trims:
                        for no_mk in (False, True):
                            for picked in (entries, entries[2:3], entries[::-1]):
                                req = pb.XAddRequest(key=key, entries=picked, no_mkstream=no_mk)
                                if trim is not None:
                                    req.trim.CopyFrom(trim)
                                ref = StateMachine()
                                ref.restore(backend.sm.snapshot())
                                want = _xadd_reference(ref, req, now)
                                resp = await stub.XAdd(req, timeout=5)
                                got = []
                                for r in resp.results:
                                    kind = r.WhichOneof("outcome")
                                    got.append(b"%d-%d" % (r.id.ms, r.id.seq) if kind == "id" else
                                               None if kind == "skipped" else r.error.message)
                                assert got == [w.message if isinstance(w, EngineError) else w for w in want]
                                assert backend.sm.snapshot()[22:-4] == ref.snapshot()[22:-4]
    run(body)


def test_request_id_dedups_a_resent_write():
    async def body():
        async with serving() as (addr, backend, _):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                await stub.Execute(pb.ExecuteRequest(argv=[b"XRAFT.REGISTER", b"77"]), timeout=5)   # the session
                md = (("xraft-request-id", "77:1"),)
                req = pb.XAddRequest(key=b"s", entries=[pb.XAddEntry(fields=_fields(a="1"))] * 3)
                first = await stub.XAdd(req, metadata=md, timeout=5)
                again = await stub.XAdd(req, metadata=md, timeout=5)
                assert first == again
                assert (await stub.XLen(pb.XLenRequest(key=b"s"), timeout=5)).length == 3
                e = await _fails(stub.XLen(pb.XLenRequest(key=b"s"), metadata=(("xraft-request-id", "x"),), timeout=5))
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    run(body)


def test_errors_carry_the_table_row_and_the_leader_address():
    async def body():
        follower = LocalBackend(leader=False, leader_address="10.0.0.9:7000")
        async with serving(follower, grpc_address_of=lambda a: a.replace("7000", "7100")) as (addr, _, _s):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                e = await _fails(stub.XLen(pb.XLenRequest(key=b"s"), timeout=5))
                row = wire_errors.wire_for("NOTLEADER")
                assert e.code() == grpc.StatusCode[row.grpc_status]
                d = _detail(e)
                assert (d.reason, d.retriable, d.leader_address) == ("NOT_LEADER", True, "10.0.0.9:7100")
                # A follower read is served locally.
                opts = pb.RequestOptions(allow_follower_read=True)
                assert (await stub.XLen(pb.XLenRequest(key=b"s", options=opts), timeout=5)).length == 0
        async with serving() as (addr, _, _s):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                await stub.ListPush(pb.ListPushRequest(key=b"l", values=[b"x"]), timeout=5)
                e = await _fails(stub.XLen(pb.XLenRequest(key=b"l"), timeout=5))
                assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert _detail(e).reason == "WRONG_TYPE" and _detail(e).message.startswith("WRONGTYPE ")
                e = await _fails(stub.XPending(pb.XPendingRequest(key=b"l", group=b"g"), timeout=5))
                assert _detail(e).reason == "WRONG_TYPE"
                e = await _fails(stub.XAck(pb.XAckRequest(key=b"s", group=b"g"), timeout=5))
                assert _detail(e).reason == "COMMAND_ERROR"                   # no IDs: the proto's bound
    run(body)


class _LosesAfterApplying(LocalBackend):
    """A leader that applies the write and then loses track of it, as a
    deposed Raft leader would: the fate is unknown to the caller."""

    async def submit(self, requests):
        await super().submit(requests)
        raise UnknownOutcome()


def test_unknown_outcome_is_reported_as_such():
    async def body():
        async with serving(_LosesAfterApplying()) as (addr, _, _s):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                e = await _fails(stub.XAdd(pb.XAddRequest(key=b"s", entries=[pb.XAddEntry(fields=_fields(a="b"))]),
                                           timeout=5))
                assert e.code() == grpc.StatusCode.UNKNOWN
                d = _detail(e)
                assert d.reason == "UNKNOWN_OUTCOME" and not d.retriable
                assert (await stub.XLen(pb.XLenRequest(key=b"s"), timeout=5)).length == 1   # it was applied
    run(body)


def test_deadline_hint_cuts_a_blocking_read_and_refuses_late_writes():
    async def body():
        async with serving() as (addr, _, _s):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                req = pb.XReadRequest(streams=[pb.XReadStream(key=b"s", new_entries_only=True)], block_ms=0,
                                      options=pb.RequestOptions(deadline_hint_ms=300))
                resp = await stub.XRead(req, timeout=5)
                assert list(resp.streams) == [] and 0.2 < loop.time() - t0 < 2
                # BLPOP with a timeout: the engine's timeout reply (nil), in time.
                resp = await stub.ListPop(pb.ListPopRequest(keys=[b"{l}1", b"{l}2"], block_ms=100), timeout=5)
                assert resp.nil
    run(body)


def test_execute_returns_the_value_tree():
    async def body():
        async with serving() as (addr, _, _s):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)

                async def ex(*argv):
                    return (await stub.Execute(pb.ExecuteRequest(argv=[a.encode() for a in argv]), timeout=5)).reply
                assert (await ex("XADD", "s", "1-1", "f", "v")).bulk == b"1-1"
                assert (await ex("XLEN", "s")).integer == 1
                assert (await ex("PING")).status == "PONG"
                nil = await ex("XREAD", "STREAMS", "s", "1-1")
                assert nil.WhichOneof("kind") == "null" and nil.null == pb.NULL_KIND_ARRAY
                assert (await ex("LINDEX", "nolist", "0")).null == pb.NULL_KIND_BULK
                info = await ex("XINFO", "STREAM", "s")
                assert info.map.entries[0].key.bulk == b"length" and info.map.entries[0].value.integer == 1
                rng = await ex("XRANGE", "s", "-", "+")
                assert rng.array.items[0].array.items[0].bulk == b"1-1"
                e = await _fails(ex("NOSUCHCMD"))
                assert _detail(e).reason == "COMMAND_ERROR" and "unknown command" in _detail(e).message
                # XREAD BLOCK through Execute parks and is woken by a write.
                waiting = asyncio.ensure_future(ex("XREAD", "BLOCK", "0", "STREAMS", "s", "$"))
                await asyncio.sleep(0.1)
                await ex("XADD", "s", "2-1", "g", "w")
                got = await waiting
                assert got.array.items[0].array.items[1].array.items[0].array.items[0].bulk == b"2-1"
    run(body)


def test_bearer_token_is_required_when_configured():
    async def body():
        async with serving(token="s3cret") as (addr, _, _s):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                e = await _fails(stub.XLen(pb.XLenRequest(key=b"s"), timeout=5))
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED and _detail(e).reason == "NO_AUTH"
                e = await _fails(stub.XLen(pb.XLenRequest(key=b"s"), metadata=(("authorization", "Bearer no"),),
                                           timeout=5))
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED
                ok = await stub.XLen(pb.XLenRequest(key=b"s"), metadata=(("authorization", "Bearer s3cret"),),
                                     timeout=5)
                assert ok.length == 0
    run(body)


def test_health_is_serving_and_reflection_lists_the_service():
    async def body():
        async with serving() as (addr, _, _s):
            async with grpc.aio.insecure_channel(addr) as ch:
                health = health_pb2_grpc.HealthStub(ch)
                for name in ("", "xraft.v1.XRaft"):
                    resp = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                    assert resp.status == health_pb2.HealthCheckResponse.SERVING
                refl = reflection_pb2_grpc.ServerReflectionStub(ch)
                call = refl.ServerReflectionInfo(timeout=5)
                await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
                resp = await call.read()
                names = {s.name for s in resp.list_services_response.service}
                assert {"xraft.v1.XRaft", "grpc.health.v1.Health"} <= names
                await call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol="xraft.v1.XRaft"))
                resp = await call.read()
                assert resp.file_descriptor_response.file_descriptor_proto
                await call.done_writing()
    run(body)
