"""The leader applies its own proposals without decoding them (issue 14): proof and effect.

RaftBackend proposes `encode_record(now, requests)` and hands the driver
`Record(now, requests)` along; the leader's fsm applies that object, the
followers decode the bytes. The states stay identical only if decoding the
bytes gives back exactly the object, type for type (a bytearray argument, an
IntEnum where decode gives an int, a list where it gives a tuple would change
what the engine stores or how it hashes). So:

* hypothesis, over every request kind as the code that makes them in the
  node builds them (resolve_command / resolve_transaction with and without
  WATCH / resolve_config_set / resolve_register / retry_request of blocking
  forms / the woken XREADGROUP / gRPC's xadd_batch with and without IDMP /
  SLOT_MOVE / NOOP), and from argument types the front ends may hand over
  (bytes, bytearray, memoryview): decode(encode(x)) is x, type for type;
* a 3-node in-process cluster (RaftBackend over MultiRaft, the driver's
  path) runs a mixed workload on its leader, and every node's fsm snapshot
  is then the same bytes.
"""
import asyncio
import dataclasses

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from xraft.node.engine.errors import EngineError
from xraft.node.fsm.blocking import woken_xreadgroup_request
from xraft.node.fsm.entry import Kind, Record, Request, decode_record, encode_record
from xraft.node.fsm.resolve import (resolve_command, resolve_config_set, resolve_register, resolve_transaction,
                                    resolve_xadd_batch, retry_request)
from xraft.node.fsm.slot_move_apply import move_argv
from xraft.node.fsm.slot_moves import MoveId
from xraft.node.server.grpc_convert import xadd_batch
from xraft.proto.v1 import client_pb2 as pb

U64 = 2**64 - 1
BLOB = st.binary(max_size=10)
ARG = st.one_of(BLOB, BLOB.map(bytearray), BLOB.map(memoryview))
KEY = st.sampled_from([b"s", b"{t}s", b"l", b"k\x00", b""])
CLIENT = st.one_of(st.just((0, 0)), st.tuples(st.integers(1, U64), st.integers(1, U64)))
INT_ARG = st.integers(-5, 10**6).map(lambda i: b"%d" % i)

# Write commands (and blocking forms, which resolve to their served form) with plausible arguments.
WRITES = st.one_of(
    st.tuples(st.just(b"XADD"), KEY, st.sampled_from([b"*", b"1-1", b"5-*", b"0-1"]), ARG, ARG),
    st.tuples(st.just(b"xadd"), KEY, st.just(b"MAXLEN"), st.just(b"~"), INT_ARG, st.just(b"*"), ARG, ARG),
    st.tuples(st.just(b"SET"), KEY, ARG),
    st.tuples(st.sampled_from([b"RPUSH", b"LPUSH"]), KEY, ARG, ARG),
    st.tuples(st.sampled_from([b"DEL", b"UNLINK"]), KEY, KEY),
    st.tuples(st.just(b"XTRIM"), KEY, st.just(b"MINID"), st.sampled_from([b"1-1", b"0"])),
    st.tuples(st.just(b"XGROUP"), st.just(b"CREATE"), KEY, ARG, st.just(b"$"), st.just(b"MKSTREAM")),
    st.tuples(st.just(b"XACK"), KEY, ARG, st.sampled_from([b"1-1", b"2-3"])),
    st.tuples(st.sampled_from([b"BLPOP", b"BRPOP"]), KEY, st.sampled_from([b"0", b"0.5", b"3"])),
    st.tuples(st.just(b"XREADGROUP"), st.just(b"GROUP"), ARG, ARG, st.just(b"BLOCK"), INT_ARG,
              st.just(b"STREAMS"), KEY, st.just(b">")),
    st.tuples(st.just(b"BLMOVE"), KEY, KEY, st.sampled_from([b"LEFT", b"RIGHT"]), st.just(b"LEFT"), st.just(b"0")),
).map(list)


def strictly_equal(a, b) -> bool:
    """a == b, and every part has the same type (== alone takes bytearray for bytes,
    1 for True, an IntEnum for its int). Request.route_slot is not in the record
    (routing only; the fsm never reads it): skipped."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(strictly_equal(getattr(a, f.name), getattr(b, f.name))
                   for f in dataclasses.fields(a) if f.name != "route_slot")
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(strictly_equal(x, y) for x, y in zip(a, b))
    return a == b


@st.composite
def commands(draw):
    cid, seq = draw(CLIENT)
    try:
        resolved = resolve_command(cid, seq, draw(WRITES))
    except EngineError:
        assume(False)
    if resolved.plan is not None and draw(st.booleans()):
        return retry_request(resolved.plan, cid, seq)          # a parked client's retry
    return resolved.request


@st.composite
def transactions(draw):
    cid, seq = draw(CLIENT)
    argvs = draw(st.lists(WRITES, max_size=4))
    watched = draw(st.lists(st.tuples(KEY, st.integers(0, 2**63 - 1)), max_size=3))   # log indexes
    try:
        return resolve_transaction(cid, seq, argvs, watched)
    except EngineError:
        assume(False)


@st.composite
def grpc_batches(draw):
    """What the gRPC XAdd builds (grpc_convert.xadd_batch), IDMP included."""
    idmp = draw(st.booleans())
    entries = []
    for _ in range(draw(st.integers(1, 4))):
        fields = [pb.Field(name=draw(BLOB), value=draw(BLOB)) for _ in range(draw(st.integers(1, 3)))]
        e = pb.XAddEntry(fields=fields)
        kind = "auto" if idmp else draw(st.sampled_from(["auto", "seq", "explicit"]))
        if kind == "seq":
            e.auto_seq_ms = draw(st.integers(0, U64))
        elif kind == "explicit":
            e.explicit_id.ms, e.explicit_id.seq = draw(st.integers(0, U64)), draw(st.integers(0, U64))
        if idmp:
            e.idempotent_id = draw(BLOB)
        entries.append(e)
    r = pb.XAddRequest(key=draw(BLOB), entries=entries, no_mkstream=draw(st.booleans()))
    if idmp:
        r.producer_id = draw(st.binary(min_size=1, max_size=8))
    trim = draw(st.sampled_from([None, "max_len", "min_id"]))
    if trim == "max_len":
        r.trim.max_len = draw(st.integers(0, U64))
    elif trim == "min_id":
        r.trim.min_id.ms, r.trim.min_id.seq = draw(st.integers(0, U64)), draw(st.integers(0, U64))
    if trim is not None:
        r.trim.approximate = draw(st.booleans())
        if draw(st.booleans()):
            r.trim.limit = draw(st.integers(0, U64))
    batch, _ = xadd_batch(r)
    cid, seq = draw(CLIENT)
    return resolve_xadd_batch(cid, seq, batch)


@st.composite
def others(draw):
    which = draw(st.sampled_from(["noop", "register", "config", "slot_move", "woken"]))
    if which == "noop":
        return Request.noop()
    if which == "register":
        slot = draw(st.one_of(st.none(), st.integers(0, 16383)))
        argv = [b"XRAFT.REGISTER", b"%d" % draw(st.integers(1, U64))] + ([] if slot is None else [b"SLOT",
                                                                                               b"%d" % slot])
        return resolve_register(argv)
    if which == "config":
        name = draw(st.sampled_from([b"stream-node-max-entries", b"stream-node-max-bytes", b"list-max-listpack-size"]))
        cid, seq = draw(CLIENT)
        try:
            return resolve_config_set(cid, seq, [b"CONFIG", b"SET", name, draw(INT_ARG)])
        except EngineError:
            assume(False)
    if which == "slot_move":
        m = MoveId(draw(st.integers(0, 100)), draw(st.integers(100, 16383)), draw(st.integers(1, 9)))
        op = draw(st.sampled_from(["SEAL", "UNSEAL", "RELEASE", "PURGE"]))
        return Request(0, 0, Kind.SLOT_MOVE, (move_argv(op, m),))
    cid, seq = draw(CLIENT)
    return woken_xreadgroup_request(cid, seq, [b"XREADGROUP", b"GROUP", b"g", b"c", b"STREAMS", draw(KEY), b">"])


REQUESTS = st.one_of(commands(), transactions(), grpc_batches(), others())


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**63 - 1), st.lists(REQUESTS, min_size=1, max_size=6))
def test_decode_of_encode_is_the_leaders_record_type_for_type(now, requests):
    record = Record(now, tuple(requests))
    back = decode_record(encode_record(now, requests))
    assert strictly_equal(back, record), (back, record)


def test_leader_and_followers_end_with_the_same_snapshot_bytes(tmp_path):
    """A mixed workload through the leader's RaftBackend (group-committed: several submits
    per record), then every replica's fsm snapshot is the same bytes, and the leader applied
    its records from its own objects (the followers decoded theirs)."""
    import uvloop

    from tests.server.test_raft_backend import IDS, Cluster

    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.writable_leader()
            await leader.submit([resolve_register([b"XRAFT.REGISTER", b"7"])])
            for round_ in range(3):
                subs = []
                for i in range(40):
                    argv = [[b"XADD", b"{t}s", b"*", b"f", b"%d" % i], [b"XADD", b"{t}s", b"%d-1" % i, b"f", b"v"],
                            [b"RPUSH", b"{t}l", b"x%d" % i], [b"SET", b"{t}k%d" % (i % 5), b"v"],
                            [b"XTRIM", b"{t}s", b"MAXLEN", b"~", b"50"], [b"LPOP", b"{t}l"],
                            [b"BLPOP", b"{t}l", b"0"]][i % 7]
                    subs.append([resolve_command(0, 0, argv).request])
                subs.append([resolve_transaction(7, round_ * 3 + 1, [[b"XGROUP", b"CREATE", b"{t}s", b"g", b"0"],
                                                                     [b"XREADGROUP", b"GROUP", b"g", b"c",
                                                                      b"COUNT", b"3", b"STREAMS", b"{t}s", b">"]],
                                                 [(b"{t}s", leader.sm.applied_index)])])
                batch, _ = xadd_batch(pb.XAddRequest(key=b"{t}b", producer_id=b"p", entries=[
                    pb.XAddEntry(fields=[pb.Field(name=b"n", value=b"%d" % j)], idempotent_id=b"%d" % j)
                    for j in range(round_, round_ + 5)]))
                subs.append([resolve_xadd_batch(7, round_ * 3 + 2, batch)])
                subs.append([resolve_config_set(0, 0, [b"CONFIG", b"SET", b"stream-node-max-entries", b"7"])])
                subs.append([woken_xreadgroup_request(7, round_ * 3 + 3, [b"XREADGROUP", b"GROUP", b"g", b"c",
                                                                          b"STREAMS", b"{t}s", b">"])])
                await asyncio.gather(*(leader.submit(reqs) for reqs in subs))
            await c.converged()
            snaps = {n: c.b[n].sm.snapshot() for n in IDS}
            assert len(set(snaps.values())) == 1
            assert leader.machine.applied_as_proposed >= 3
            assert all(c.b[n].machine.applied_as_proposed == 0 for n in IDS if c.b[n] is not leader)
        finally:
            await c.close()

    uvloop.run(asyncio.wait_for(main(), 120))
