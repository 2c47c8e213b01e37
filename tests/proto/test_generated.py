"""xraft.proto.v1: the generated modules import, carry what the API promises,
serve real gRPC calls of every kind, and are regenerated when a .proto changes."""
import asyncio
import os
import re
import shutil
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from grpc_status import rpc_status

from xraft.node.raft.codec import decode_message, encode_message
from xraft.node.raft.types import Entry, Message, MessageType
from xraft.proto import codegen
from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc
from xraft.proto.v1 import peer_pb2, peer_pb2_grpc

TIMEOUT = 10  # seconds for any one call: a hang fails the test instead of the suite


# ------------------------------------------------------------------ the modules


def test_generated_modules_are_fresh_and_complete():
    assert codegen.stale_reason() is None
    v1 = Path(pb.__file__).parent
    for name in ("client_pb2.pyi", "peer_pb2.pyi"):
        stub = (v1 / name).read_text()
        assert "class XAddRequest" in stub or "class PeerEnvelope" in stub
    # The staging trick: the gRPC modules import their messages from xraft.proto.v1.
    for mod in (pb_grpc, peer_pb2_grpc):
        text = Path(mod.__file__).read_text()
        assert re.search(r"^from xraft\.proto\.v1 import \w+_pb2 as", text, re.M), mod.__name__
        assert not re.search(r"^\s*(from|import) xraft\.v1\b", text, re.M)
    # protobuf package stays xraft.v1: what other languages' clients see.
    assert pb.DESCRIPTOR.package == "xraft.v1" and peer_pb2.DESCRIPTOR.package == "xraft.v1"
    assert pb.XAddRequest.DESCRIPTOR.full_name == "xraft.v1.XAddRequest"


def test_every_request_has_options_as_field_15():
    for name, msg in pb.DESCRIPTOR.message_types_by_name.items():
        if name.endswith("Request") and name != "ConsumeRequest":
            field = msg.fields_by_name.get("options")
            assert field is not None and field.number == 15, name
            assert field.message_type.name == "RequestOptions", name


def test_service_covers_every_command_family():
    methods = {m.name: m for m in pb.DESCRIPTOR.services_by_name["XRaft"].methods}
    for name in ("XAdd", "XRange", "XRevRange", "XRead", "XReadGroup", "XAck", "XPending", "XPendingExtended",
                 "XClaim", "XAutoClaim", "XGroupCreate", "XGroupSetId", "XGroupDestroy", "XGroupCreateConsumer",
                 "XGroupDelConsumer", "XDel", "XTrim", "XLen", "XInfoStream", "XInfoGroups", "XInfoConsumers",
                 "XSetId", "ListPush", "ListPop", "ListRange", "ListIndex", "ListSet", "ListInsert", "ListRem",
                 "ListTrim", "ListPos", "ListMove", "ListMPop", "ListLen", "Execute"):
        assert not methods[name].client_streaming and not methods[name].server_streaming, name
    assert methods["Subscribe"].server_streaming and not methods["Subscribe"].client_streaming
    assert methods["Consume"].server_streaming and methods["Consume"].client_streaming
    stream = peer_pb2.DESCRIPTOR.services_by_name["Peer"].methods_by_name["Stream"]
    assert stream.client_streaming and stream.server_streaming


# ------------------------------------------------------------------ round trips


def test_xadd_round_trip_keeps_oneofs_presence_and_bytes():
    req = pb.XAddRequest(
        key=b"s\x00\xff",
        entries=[
            pb.XAddEntry(fields=[pb.Field(name=b"f", value=b"v"), pb.Field(name=b"f", value=b"")]),
            pb.XAddEntry(explicit_id=pb.StreamId(ms=2**64 - 1, seq=2**64 - 1), fields=[pb.Field(name=b"a", value=b"1")]),
            pb.XAddEntry(auto_seq_ms=0, fields=[pb.Field(name=b"a", value=b"2")]),
        ],
        no_mkstream=True,
        trim=pb.TrimOptions(max_len=0, approximate=True, limit=0),
        options=pb.RequestOptions(allow_follower_read=True, deadline_hint_ms=250),
    )
    back = pb.XAddRequest.FromString(req.SerializeToString())
    assert back == req
    assert [e.WhichOneof("id") for e in back.entries] == [None, "explicit_id", "auto_seq_ms"]
    assert back.entries[1].explicit_id.ms == 2**64 - 1
    # Zero values survive where presence matters: MAXLEN 0 and LIMIT 0 are real arguments.
    assert back.trim.WhichOneof("threshold") == "max_len" and back.trim.HasField("limit")
    assert not pb.TrimOptions().HasField("limit")
    assert [(f.name, f.value) for f in back.entries[0].fields] == [(b"f", b"v"), (b"f", b"")]


def test_value_tree_round_trip():
    reply = pb.Value(array=pb.ValueList(items=[
        pb.Value(bulk=b"x"),
        pb.Value(integer=-(2**63)),
        pb.Value(status="OK"),
        pb.Value(null=pb.NULL_KIND_ARRAY),
        pb.Value(null=pb.NULL_KIND_BULK),
        pb.Value(map=pb.ValueMap(entries=[pb.ValueMapEntry(key=pb.Value(bulk=b"k"), value=pb.Value(integer=1))])),
    ]))
    back = pb.Value.FromString(reply.SerializeToString())
    assert back == reply
    kinds = [v.WhichOneof("kind") for v in back.array.items]
    assert kinds == ["bulk", "integer", "status", "null", "null", "map"]
    # NULL_KIND_BULK is the zero value, yet the oneof still says a null was sent.
    assert back.array.items[4].HasField("null") and back.array.items[4].null == pb.NULL_KIND_BULK


def test_peer_envelope_carries_raft_codec_bytes():
    msgs = [
        Message(type=MessageType.APP, to=2, frm=1, term=7, log_term=6, index=41, commit=40,
                entries=(Entry(term=7, index=42, data=b"XADD s * f v"),)),
        Message(type=MessageType.HEARTBEAT_RESP, to=1, frm=3, term=7),
    ]
    env = peer_pb2.PeerEnvelope(raft=peer_pb2.RaftBatch(messages=[
        peer_pb2.GroupMessage(group_id=g, message=encode_message(m)) for g, m in zip((5, 9), msgs)
    ]))
    back = peer_pb2.PeerEnvelope.FromString(env.SerializeToString())
    assert back.WhichOneof("body") == "raft"
    assert [(gm.group_id, decode_message(gm.message)) for gm in back.raft.messages] == list(zip((5, 9), msgs))


# ------------------------------------------------------------------ a real server


def _error_status(reason, code, message, **detail):
    any_detail = any_pb2.Any()
    any_detail.Pack(pb.ErrorDetail(reason=reason, message=message, **detail))
    return rpc_status.to_status(status_pb2.Status(code=code, message=message, details=[any_detail]))


class _Servicer(pb_grpc.XRaftServicer):
    """Just enough to exercise each call kind; not the real server."""

    async def XLen(self, request, context):  # unary
        return pb.XLenResponse(length=len(request.key))

    async def XAdd(self, request, context):  # unary that fails with an ErrorDetail
        await context.abort_with_status(_error_status(
            "NOT_LEADER", code_pb2.UNAVAILABLE, "NOT_LEADER leader is 3",
            retriable=True, leader_id=3, leader_address="127.0.0.1:7003", slot=1234, group_id=2))

    async def Subscribe(self, request, context):  # server streaming
        start = request.streams[0].after.seq
        for seq in range(start + 1, start + 4):
            yield pb.SubscribeResponse(streams=[pb.StreamEntries(
                key=request.streams[0].key, entries=[pb.StreamEntry(id=pb.StreamId(ms=1, seq=seq))])])

    async def Consume(self, request_iterator, context):  # bidi: deliver on start, confirm each ack
        async for req in request_iterator:
            if req.WhichOneof("body") == "start":
                entries = [pb.StreamEntry(id=pb.StreamId(ms=1, seq=s)) for s in range(req.start.max_batch)]
                yield pb.ConsumeResponse(delivery=pb.ConsumeDelivery(
                    streams=[pb.StreamEntries(key=req.start.keys[0], entries=entries)]))
            else:
                yield pb.ConsumeResponse(ack_result=pb.ConsumeAckResult(ack_seq=req.ack.ack_seq,
                                                                        acked=len(req.ack.ids)))


class _Peer(peer_pb2_grpc.PeerServicer):
    async def Stream(self, request_iterator, context):  # answers hello with hello, echoes raft batches
        async for env in request_iterator:
            if env.WhichOneof("body") == "hello":
                yield peer_pb2.PeerEnvelope(hello=peer_pb2.Hello(
                    protocol_version=1, cluster_id=env.hello.cluster_id, node_id=env.hello.peer_node_id,
                    peer_node_id=env.hello.node_id, reply_to_nonce=env.hello.nonce))
            else:
                yield env


async def _with_server(body):
    server = grpc.aio.server()
    pb_grpc.add_XRaftServicer_to_server(_Servicer(), server)
    peer_pb2_grpc.add_PeerServicer_to_server(_Peer(), server)
    port = server.add_insecure_port("127.0.0.1:0")  # 0: the OS picks a free port
    assert port > 0
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(body(channel), TIMEOUT)
    finally:
        await server.stop(grace=None)


def test_unary_server_streaming_and_bidi_calls():
    async def body(channel):
        stub = pb_grpc.XRaftStub(channel)
        assert (await stub.XLen(pb.XLenRequest(key=b"abcd"), timeout=TIMEOUT)).length == 4

        got = []
        sub = pb.SubscribeRequest(streams=[pb.XReadStream(key=b"s", after=pb.StreamId(ms=1, seq=10))])
        async for resp in stub.Subscribe(sub, timeout=TIMEOUT):
            got += [(s.key, e.id.seq) for s in resp.streams for e in s.entries]
        assert got == [(b"s", 11), (b"s", 12), (b"s", 13)]

        call = stub.Consume(timeout=TIMEOUT)
        await call.write(pb.ConsumeRequest(start=pb.ConsumeStart(keys=[b"s"], group=b"g", consumer=b"c",
                                                                 max_batch=3)))
        first = await call.read()
        ids = [e.id for e in first.delivery.streams[0].entries]
        assert [i.seq for i in ids] == [0, 1, 2]
        await call.write(pb.ConsumeRequest(ack=pb.ConsumeAck(key=b"s", ids=ids, ack_seq=77)))
        second = await call.read()
        assert second.WhichOneof("body") == "ack_result"
        assert (second.ack_result.ack_seq, second.ack_result.acked) == (77, 3)
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK

        peer = peer_pb2_grpc.PeerStub(channel).Stream(timeout=TIMEOUT)
        await peer.write(peer_pb2.PeerEnvelope(hello=peer_pb2.Hello(
            protocol_version=1, cluster_id="c", node_id=1, peer_node_id=2, nonce=b"n" * 16)))
        hello = (await peer.read()).hello
        assert (hello.node_id, hello.peer_node_id, hello.reply_to_nonce) == (2, 1, b"n" * 16)
        raft = Message(type=MessageType.VOTE, to=2, frm=1, term=4, log_term=3, index=9)
        await peer.write(peer_pb2.PeerEnvelope(raft=peer_pb2.RaftBatch(
            messages=[peer_pb2.GroupMessage(group_id=1, message=encode_message(raft))])))
        echoed = (await peer.read()).raft.messages[0]
        assert decode_message(echoed.message) == raft
        await peer.done_writing()
        assert await peer.read() == grpc.aio.EOF

    asyncio.run(_with_server(body))


def test_error_detail_travels_in_status_details():
    async def body(channel):
        stub = pb_grpc.XRaftStub(channel)
        call = stub.XAdd(pb.XAddRequest(key=b"s", entries=[pb.XAddEntry(fields=[pb.Field(name=b"f")])]),
                         timeout=TIMEOUT)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert err.value.details() == "NOT_LEADER leader is 3"
        status = await rpc_status.aio.from_call(call)
        assert status is not None and status.code == code_pb2.UNAVAILABLE and len(status.details) == 1
        detail = pb.ErrorDetail()
        assert status.details[0].Unpack(detail)
        assert (detail.reason, detail.retriable, detail.leader_id, detail.leader_address) == \
            ("NOT_LEADER", True, 3, "127.0.0.1:7003")
        assert detail.HasField("slot") and detail.slot == 1234 and detail.group_id == 2

    asyncio.run(_with_server(body))


# ------------------------------------------------------------------ staleness


@pytest.fixture
def scratch_tree(tmp_path):
    """A private copy of the sources and a fresh output package, so the test
    never touches the checkout's generated files."""
    src, out = tmp_path / "src", tmp_path / "out"
    shutil.copytree(codegen.SOURCE_DIR, src)
    codegen.generate(src, out)
    return src, out


def test_an_edited_proto_is_regenerated_not_masked(scratch_tree):
    src, out = scratch_tree
    assert codegen.stale_reason(src, out) is None
    before = (out / "peer_pb2.py").read_bytes()
    text = (src / "peer.proto").read_text()
    edited = text.replace("  string reason = 6;\n}", "  string reason = 6;\n  uint64 canary_field = 7;\n}")
    assert edited != text
    (src / "peer.proto").write_text(edited)
    # The mtime is set back to before generation: freshness must not depend on it.
    old = (out / "peer_pb2.py").stat().st_mtime - 100
    os.utime(src / "peer.proto", (old, old))
    assert codegen.stale_reason(src, out) == "the .proto files changed since the code was generated"
    codegen.ensure_fresh(src, out)
    assert codegen.stale_reason(src, out) is None
    after = (out / "peer_pb2.py").read_bytes()
    assert after != before  # the descriptor inside is escaped bytes; the stub names the field plainly
    assert "canary_field: int" in (out / "peer_pb2.pyi").read_text()


def test_missing_or_broken_outputs_are_detected(scratch_tree):
    src, out = scratch_tree
    (out / "client_pb2_grpc.py").unlink()
    assert "client_pb2_grpc.py" in codegen.stale_reason(src, out)
    codegen.ensure_fresh(src, out)
    assert codegen.stale_reason(src, out) is None
    # A broken .proto is reported as such, and the previous files stay as they were.
    stamp = (out / codegen.STAMP).read_bytes()
    (src / "client.proto").write_text((src / "client.proto").read_text() + "\nmessage Broken { nope }\n")
    with pytest.raises(ImportError, match="could not be regenerated"):
        codegen.ensure_fresh(src, out)
    assert (out / codegen.STAMP).read_bytes() == stamp
