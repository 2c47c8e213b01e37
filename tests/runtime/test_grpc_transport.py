"""GrpcTransport and the peer handshake: real grpc.aio servers on 127.0.0.1 (OS-picked ports), the real
Raft codec, raw gRPC clients/servers playing strangers, replayers and impostors, and 3 MultiRaft nodes
(DiskStorage in tmp dirs) replicating over it."""
import asyncio
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time

import grpc
import pytest

from xraft.node.raft.codec import encode_message
from xraft.node.raft.types import ConfState, Entry, Message, MessageType as MT, Snapshot, SnapshotMetadata
from xraft.node.runtime import peer_auth
from xraft.node.runtime.grpc_transport import GrpcTransport, TlsConfig, TransportError, TransportLimits, \
    server_options
from xraft.node.runtime.peer_auth import HelloRefused, PeerAuthenticator, RefusalCode, SecretError
from xraft.proto.v1 import peer_pb2, peer_pb2_grpc

SECRET = b"correct horse battery staple 42!"
CLUSTER = "xraft-test"
FAST = TransportLimits(backoff_initial_s=0.02, backoff_max_s=0.2, handshake_timeout_s=2.0)


@pytest.fixture
def run():
    import uvloop

    def _run(coro, timeout=60):
        return uvloop.run(asyncio.wait_for(coro, timeout))
    return _run


class Recorder:
    """A TransportHandler that keeps everything it is handed."""

    def __init__(self):
        self.got: list[tuple[int, list]] = []
        self.lost: list[tuple[int, list]] = []

    def deliver(self, from_node, batch):
        self.got.append((from_node, list(batch)))

    def unreachable(self, peer, lost):
        self.lost.append((peer, list(lost)))

    def messages(self, frm=None):
        return [m for f, b in self.got if frm in (None, f) for m in b]


async def wait_until(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def app(frm, to, index, data=b"v", term=3):
    return Message(type=MT.APP, to=to, frm=frm, term=term, log_term=term, index=index - 1, commit=index - 1,
                   entries=(Entry(term=term, index=index, data=data),))


async def make_nodes(ids, secrets=None, clusters=None, limits=FAST, tls=None, ports=None, clocks=None):
    """Transports for `ids`, each on its own server, all knowing each other; started with Recorders."""
    ts = {}
    for i in ids:
        listen = f"127.0.0.1:{(ports or {}).get(i, 0)}"
        t = GrpcTransport(i, (clusters or {}).get(i, CLUSTER), (secrets or {}).get(i, SECRET), listen, {},
                          tls=(tls or {}).get(i), limits=limits, clocks=(clocks or {}).get(i))
        await t.serve()
        ts[i] = t
    for i, t in ts.items():
        for j, u in ts.items():
            if i != j:
                t.add_peer(j, f"127.0.0.1:{u.port}")
    recs = {i: Recorder() for i in ids}
    for i, t in ts.items():
        t.start(recs[i])
    return ts, recs


async def lone_node(limits=FAST):
    """Node 1 alone, knowing a node 2 that is not running: the test's raw streams play node 2."""
    t = GrpcTransport(1, CLUSTER, SECRET, "127.0.0.1:0", {2: "127.0.0.1:1"}, limits=limits)
    await t.serve()
    rec = Recorder()
    t.start(rec)
    return {1: t}, {1: rec}, PeerAuthenticator(2, CLUSTER, SECRET, known_node=lambda n: n == 1)


async def close_all(ts):
    for t in ts.values():
        await t.close()


# ------------------------------------------------------------------ peer_auth


def test_load_secret_from_file_or_environment(tmp_path):
    p = tmp_path / "secret"
    p.write_bytes(SECRET + b"\n")
    os.chmod(p, 0o600)
    assert peer_auth.load_secret(str(p)) == SECRET  # the trailing newline of `echo > file` is not key
    assert peer_auth.load_secret(env_var="X_S", environ={"X_S": SECRET.decode()}) == SECRET
    with pytest.raises(SecretError, match="set \\$X_S"):
        peer_auth.load_secret(env_var="X_S", environ={})
    with pytest.raises(SecretError, match="at least 16"):
        peer_auth.load_secret(env_var="X_S", environ={"X_S": "short"})
    with pytest.raises(SecretError, match="cannot read"):
        peer_auth.load_secret(str(tmp_path / "missing"))
    p.write_bytes(b"  \n")
    with pytest.raises(SecretError, match="0 bytes"):
        peer_auth.load_secret(str(p))
    with pytest.raises(SecretError):
        GrpcTransport(1, CLUSTER, b"too short", "127.0.0.1:0", {})


class Clock:
    def __init__(self, ms=1_700_000_000_000):
        self.ms = ms

    def __call__(self):
        return self.ms


def pair(clock=None, **kw):
    clock = clock or Clock()
    a = PeerAuthenticator(1, CLUSTER, SECRET, known_node=lambda n: n in (2, 3), clock_ms=clock, **kw)
    b = PeerAuthenticator(2, CLUSTER, SECRET, known_node=lambda n: n in (1, 3), clock_ms=clock, **kw)
    return a, b, clock


def test_handshake_accepts_the_secret_holder_both_ways():
    a, b, _ = pair()
    h = a.dialler_hello(2)
    b.check_dialler_hello(h)
    reply = b.acceptor_hello(h)
    a.check_acceptor_hello(reply, h)
    confirm = a.dialler_confirm(reply, h)
    b.check_dialler_confirm(confirm, h, reply)
    assert reply.reply_to_nonce == h.nonce and confirm.reply_to_nonce == reply.nonce and len(h.proof) == 32
    assert h.incarnation == confirm.incarnation == a.incarnation and len(a.incarnation) == 16


@pytest.mark.parametrize("skew_ms", [31_000, -31_000, 86_400_000, -1_700_000_000_000])
def test_skewed_clocks_do_not_stop_the_handshake(skew_ms):
    """Replay protection is challenge-response on nonces, not a clock window: a peer whose
    clock is off by more than 30 s (or a day, or reads 1970) still connects, both ways."""
    clock = Clock()
    skewed = Clock(clock.ms + skew_ms)
    a = PeerAuthenticator(1, CLUSTER, SECRET, known_node=lambda n: n == 2, clock_ms=skewed)
    b = PeerAuthenticator(2, CLUSTER, SECRET, known_node=lambda n: n == 1, clock_ms=clock)
    for dialler, acceptor in ((a, b), (b, a)):
        h = dialler.dialler_hello(acceptor.node_id)
        acceptor.check_dialler_hello(h)  # main refused here: "clock is ... ms off ours"
        reply = acceptor.acceptor_hello(h)
        dialler.check_acceptor_hello(reply, h)
        acceptor.check_dialler_confirm(dialler.dialler_confirm(reply, h), h, reply)


@pytest.mark.parametrize("field,value,code", [
    ("cluster_id", "other-cluster", RefusalCode.FAILED_PRECONDITION),
    ("node_id", 3, RefusalCode.UNAUTHENTICATED),  # a known node, but the proof was for node 1
    ("node_id", 9, RefusalCode.FAILED_PRECONDITION),  # not a peer at all
    ("peer_node_id", 3, RefusalCode.FAILED_PRECONDITION),
    ("unix_ms", 1, RefusalCode.UNAUTHENTICATED),
    ("nonce", b"n" * 32, RefusalCode.UNAUTHENTICATED),
    ("nonce", b"n" * 8, RefusalCode.INVALID_ARGUMENT),
    ("proof", b"\x00" * 32, RefusalCode.UNAUTHENTICATED),
    ("proof", b"\x00" * 31, RefusalCode.INVALID_ARGUMENT),
    ("protocol_version", 1, RefusalCode.FAILED_PRECONDITION),  # version 1 had the clock window
    ("incarnation", b"i" * 16, RefusalCode.UNAUTHENTICATED),
    ("incarnation", b"i" * 15, RefusalCode.INVALID_ARGUMENT),
    ("reply_to_nonce", b"r" * 32, RefusalCode.INVALID_ARGUMENT),  # a dialler's first Hello has none
    ("max_envelope_bytes", 1024, RefusalCode.INVALID_ARGUMENT),
])
def test_a_tampered_hello_is_refused(field, value, code):
    a, b, _ = pair()
    h = a.dialler_hello(2)
    setattr(h, field, value)
    with pytest.raises(HelloRefused) as err:
        b.check_dialler_hello(h)
    assert err.value.code == code, err.value


def test_wrong_secret_and_wrong_cluster_are_refused():
    clock = Clock()
    good = PeerAuthenticator(1, CLUSTER, SECRET, known_node=lambda n: True, clock_ms=clock)
    bad = PeerAuthenticator(2, CLUSTER, b"x" * 32, known_node=lambda n: True, clock_ms=clock)
    with pytest.raises(HelloRefused, match="bad proof") as err:
        good.check_dialler_hello(bad.dialler_hello(1))
    assert err.value.code == RefusalCode.UNAUTHENTICATED
    other = PeerAuthenticator(2, "elsewhere", SECRET, known_node=lambda n: True, clock_ms=clock)
    with pytest.raises(HelloRefused, match="cluster") as err:
        good.check_dialler_hello(other.dialler_hello(1))
    assert err.value.code == RefusalCode.FAILED_PRECONDITION
    # The acceptor side is checked just as hard: a node without the secret cannot pose as the peer.
    h = good.dialler_hello(2)
    with pytest.raises(HelloRefused, match="bad proof"):
        good.check_acceptor_hello(bad.acceptor_hello(h), h)


def test_replays_are_refused_on_both_sides():
    a, b, clock = pair()
    h = a.dialler_hello(2)
    b.check_dialler_hello(h)
    reply = b.acceptor_hello(h)
    a.check_acceptor_hello(reply, h)
    confirm = a.dialler_confirm(reply, h)
    b.check_dialler_confirm(confirm, h, reply)
    # An eavesdropper replays the dialler's two Hellos, now and a day later. Step 1 alone proves
    # nothing, so it gets an answer, but with a fresh nonce the old confirmation never signed.
    for later_ms in (0, 86_400_000):
        clock.ms += later_ms
        b.check_dialler_hello(h)
        fresh = b.acceptor_hello(h)
        assert fresh.nonce != reply.nonce
        with pytest.raises(HelloRefused, match="confirmation does not reply") as err:
            b.check_dialler_confirm(confirm, h, fresh)
        assert err.value.code == RefusalCode.UNAUTHENTICATED
    # A step-1 or step-2 proof cannot stand in for a confirmation (the role is signed).
    forged = peer_pb2.Hello()
    forged.CopyFrom(h)
    forged.reply_to_nonce = fresh.nonce
    with pytest.raises(HelloRefused, match="bad proof"):
        b.check_dialler_confirm(forged, h, fresh)
    # An acceptor's answer recorded from one handshake proves nothing in another.
    old_reply = b.acceptor_hello(h)
    again = a.dialler_hello(2)
    with pytest.raises(HelloRefused, match="nonce"):
        a.check_acceptor_hello(old_reply, again)


HOUR = 3_600_000


def test_the_handshake_reads_each_peers_clock_on_both_sides():
    """ISSUE9 C6: the acceptor's answer (dialler side) and the dialler's confirmation (acceptor
    side), both fresh, give each side the other's clock, kept against its monotonic clock."""
    wall1, wall2, mono1, mono2 = Clock(), Clock(Clock().ms - HOUR), Clock(500), Clock(9_000)
    a = PeerAuthenticator(1, CLUSTER, SECRET, known_node=lambda n: n == 2, clock_ms=wall1, mono_ms=mono1)
    b = PeerAuthenticator(2, CLUSTER, SECRET, known_node=lambda n: n == 1, clock_ms=wall2, mono_ms=mono2)
    h = a.dialler_hello(2)
    b.check_dialler_hello(h)
    assert b.peer_clock_skews() == {}               # step 1 may be a replay: not a reading
    reply = b.acceptor_hello(h)
    a.check_acceptor_hello(reply, h)
    assert a.peer_clock_skews() == {2: -HOUR}       # main: no readings at all
    b.check_dialler_confirm(a.dialler_confirm(reply, h), h, reply)
    assert b.peer_clock_skews() == {1: HOUR}
    for c in (wall1, wall2, mono1, mono2):          # time passes alike everywhere: same skews
        c.ms += 60_000
    assert a.peer_clock_skews() == {2: -HOUR} and b.peer_clock_skews() == {1: HOUR}
    wall1.ms -= HOUR // 2                           # node 1's own clock is stepped back after the
    assert a.peer_clock_skews() == {2: -HOUR // 2}  # reading: what node 2's clock reads is unchanged
    # A reconnect refreshes the reading (node 2's clock was set right meanwhile).
    wall2.ms = wall1.ms
    h = a.dialler_hello(2)
    b.check_dialler_hello(h)
    reply = b.acceptor_hello(h)
    a.check_acceptor_hello(reply, h)
    assert a.peer_clock_skews() == {2: 0}


def test_peer_clock_readings_are_one_per_peer_and_bounded():
    table = peer_auth.PeerClocks(limit=2)
    table.record(1, 1_000, 10)
    table.record(1, 2_000, 10)                      # a refresh replaces the peer's entry
    table.record(2, 3_000, 10)
    assert table.skews(1_000, 10) == {1: 1_000, 2: 2_000}
    table.record(3, 1_000, 10)                      # full: the oldest reading goes
    assert table.skews(1_000, 10) == {2: 2_000, 3: 0}
    table.forget(2)
    assert table.skews(1_000, 10) == {3: 0}


def test_transports_expose_their_peers_clock_skews(run):
    def skewed(ms):
        return {"clock_ms": lambda: time.time_ns() // 1_000_000 + ms}

    async def main():
        heard = []
        ts, _ = await make_nodes((1, 2, 3), clocks={1: skewed(HOUR), 2: skewed(0), 3: skewed(-HOUR)})
        ts[1].add_clock_listener(lambda: heard.append(ts[1].peer_clock_skews()))
        try:
            offset = {1: HOUR, 2: 0, 3: -HOUR}
            await wait_until(lambda: all(len(t.peer_clock_skews()) == 2 for t in ts.values()), 10, "readings")
            for i, t in ts.items():
                for j, d in t.peer_clock_skews().items():
                    # The reading is the peer's clock within one loopback round trip.
                    assert abs(d - (offset[j] - offset[i])) < 10_000, (i, j, d)
            # A new handshake (node 2 redialled) is a new reading, and the listener hears of it.
            ts[1].add_peer(2, f"127.0.0.1:{ts[2].port}")
            assert 2 not in ts[1].peer_clock_skews()
            await wait_until(lambda: 2 in ts[1].peer_clock_skews() and heard and 2 in heard[-1], 10, "refresh")
            ts[1].remove_peer(3)                    # no longer a peer: no longer a vote
            assert set(ts[1].peer_clock_skews()) == {2}
        finally:
            await close_all(ts)
    run(main())


def test_a_node_back_with_another_incarnation_is_refused_on_both_sides():
    seen: dict = {}

    def book(node_id, inc):
        if seen.setdefault(node_id, inc) != inc:
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION, f"node {node_id} came back")
    a = PeerAuthenticator(1, CLUSTER, SECRET, known_node=lambda n: n == 2, check_incarnation=book)
    old2 = PeerAuthenticator(2, CLUSTER, SECRET, known_node=lambda n: n == 1)
    h = old2.dialler_hello(1)
    a.check_dialler_hello(h)
    reply = a.acceptor_hello(h)
    a.check_dialler_confirm(old2.dialler_confirm(reply, h), h, reply)
    new2 = PeerAuthenticator(2, CLUSTER, SECRET, known_node=lambda n: n == 1)  # a wiped disk: a new draw
    h = new2.dialler_hello(1)
    a.check_dialler_hello(h)
    reply = a.acceptor_hello(h)
    with pytest.raises(HelloRefused, match="came back"):
        a.check_dialler_confirm(new2.dialler_confirm(reply, h), h, reply)
    mine = a.dialler_hello(2)
    with pytest.raises(HelloRefused, match="came back"):
        a.check_acceptor_hello(new2.acceptor_hello(mine), mine)


# ------------------------------------------------------------------ batches over real streams


def test_two_nodes_exchange_batches_in_order(run):
    async def main():
        ts, recs = await make_nodes((1, 2))
        try:
            await wait_until(lambda: ts[1].link_up(2) and ts[2].link_up(1), 10, "links up")
            sent = []
            for k in range(1, 301):
                batch = [(g, app(1, 2, k, b"%d/%d" % (g, k))) for g in (7, 2**40)]
                while not ts[1].send(2, batch):
                    await asyncio.sleep(0.001)
                sent += batch
                if k % 50 == 0:
                    await asyncio.sleep(0)
            assert ts[2].send(1, [(7, Message(type=MT.APP_RESP, to=1, frm=2, term=3, index=300))])
            await wait_until(lambda: len(recs[2].messages()) == len(sent) and recs[1].got, 10, "deliveries")
            # Fresh objects decoded from the wire, equal to what was sent, in send order.
            assert recs[2].messages(1) == sent
            assert recs[1].messages(2) == [(7, Message(type=MT.APP_RESP, to=1, frm=2, term=3, index=300))]
            assert not recs[1].lost and not recs[2].lost
            st = ts[1].stats.links[2]
            assert st.batches_accepted == 300 and st.messages_accepted == 600
            assert ts[2].stats.inbound.messages_delivered == 600
        finally:
            await close_all(ts)
    run(main())


def test_three_nodes_all_pairs(run):
    async def main():
        ts, recs = await make_nodes((1, 2, 3))
        try:
            await wait_until(lambda: all(t.link_up(p) for i, t in ts.items() for p in ts if p != i), 10, "links")
            for i in ts:
                for j in ts:
                    if i != j:
                        assert ts[i].send(j, [(1, Message(type=MT.HEARTBEAT, to=j, frm=i, term=2, commit=i))])
            await wait_until(lambda: all(len(r.got) == 2 for r in recs.values()), 10, "6 deliveries")
            for j, r in recs.items():
                assert sorted((f, b[0][1].frm, b[0][1].to) for f, b in r.got) == \
                    [(i, i, j) for i in sorted(ts) if i != j]
        finally:
            await close_all(ts)
    run(main())


def test_a_large_batch_is_split_and_an_oversized_message_refused(run):
    small = TransportLimits(max_envelope_bytes=2 << 20, backoff_initial_s=0.02, backoff_max_s=0.2)

    async def main():
        ts, recs = await make_nodes((1, 2), limits=small)
        try:
            await wait_until(lambda: ts[1].link_up(2), 10, "link")
            # 5 MiB in one batch: more than one 2 MiB envelope, still delivered whole and in order.
            big = [(1, app(1, 2, k, bytes([k]) * (256 << 10))) for k in range(1, 21)]
            assert ts[1].send(2, big)
            await wait_until(lambda: len(recs[2].messages()) == 20, 10, "split batch")
            assert recs[2].messages() == big
            assert ts[1].stats.links[2].envelopes_written >= 3
            # One message larger than the peer's envelope limit can never be delivered: refused on the spot.
            huge = [(1, app(1, 2, 99, b"x" * (2 << 20)))]
            assert not ts[1].send(2, huge)
            assert ts[1].stats.links[2].refused_oversize == 1
            assert ts[1].send(2, [(1, app(1, 2, 100))])  # the link is unharmed
            await wait_until(lambda: len(recs[2].messages()) == 21, 10, "after the refusal")
        finally:
            await close_all(ts)
    run(main())


# ------------------------------------------------------------------ strangers


@pytest.mark.parametrize("who", ["secret", "cluster"])
def test_a_peer_with_the_wrong_secret_or_cluster_is_refused(run, who, caplog):
    async def main():
        kw = {"secrets": {2: b"not the cluster's secret!!"}} if who == "secret" else {"clusters": {2: "rogue"}}
        ts, recs = await make_nodes((1, 2), **kw)
        try:
            await wait_until(lambda: ts[1].stats.inbound.hellos_refused >= 1
                             and ts[2].stats.inbound.hellos_refused >= 1, 10, "refusals")
            await asyncio.sleep(0.3)  # several redial rounds
            for i, j in ((1, 2), (2, 1)):
                assert not ts[i].link_up(j)
                assert not ts[i].send(j, [(1, Message(type=MT.VOTE, to=j, frm=i, term=9, index=5))])
                assert ts[i].stats.links[j].connects == 0
            assert not recs[1].got and not recs[2].got
            assert ts[1].stats.inbound.streams_accepted == 0
        finally:
            await close_all(ts)
        text = caplog.text
        assert "refused a peer stream" in text
        assert ("bad proof" in text) if who == "secret" else ("cluster 'rogue'" in text)
    with caplog.at_level(logging.INFO, logger="xraft"):
        run(main())


async def raw_stream(port, hello_env_bytes=None, hello=None):
    """A bare gRPC Peer.Stream call to `port` (a stranger's or replayer's view)."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.stream_stream("/xraft.v1.Peer/Stream", request_serializer=None,
                                 response_deserializer=peer_pb2.PeerEnvelope.FromString)(timeout=10)
    if hello is not None:
        hello_env_bytes = peer_pb2.PeerEnvelope(hello=hello).SerializeToString()
    if hello_env_bytes is not None:
        await call.write(hello_env_bytes)
    return channel, call


async def handshake(port, auth, peer=1):
    """A raw stream that went through all three Hellos as `auth`'s node: (channel, call, answer)."""
    mine = auth.dialler_hello(peer)
    channel, call = await raw_stream(port, hello=mine)
    answer = (await call.read()).hello
    auth.check_acceptor_hello(answer, mine)
    await call.write(peer_pb2.PeerEnvelope(hello=auth.dialler_confirm(answer, mine)).SerializeToString())
    return channel, call, answer


async def expect_refused(call, code):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while True:
            env = await call.read()
            assert env is not grpc.aio.EOF
    assert err.value.code() == code, err.value


def raft_frame(*msgs, gid=1):
    return peer_pb2.PeerEnvelope(raft=peer_pb2.RaftBatch(messages=[
        peer_pb2.GroupMessage(group_id=gid, message=m if isinstance(m, bytes) else encode_message(m))
        for m in msgs])).SerializeToString()


def test_a_replayed_hello_is_refused(run):
    async def main():
        ts, recs, auth2 = await lone_node()
        try:
            # What an eavesdropper captures: node 2's two Hellos to node 1, byte for byte.
            first = auth2.dialler_hello(1)
            ch1, call1 = await raw_stream(ts[1].port, hello=first)
            answer = (await call1.read()).hello
            assert answer.node_id == 1
            confirm = auth2.dialler_confirm(answer, first)
            await call1.write(peer_pb2.PeerEnvelope(hello=confirm).SerializeToString())
            await call1.write(raft_frame(Message(type=MT.HEARTBEAT, to=1, frm=2, term=49)))
            await wait_until(lambda: recs[1].messages(2), 5, "the original handshake went through")
            # Replayed on a new stream: node 1 answers with a fresh nonce the old confirmation never signed.
            ch2, call2 = await raw_stream(ts[1].port, hello=first)
            assert (await call2.read()).hello.nonce != answer.nonce
            await call2.write(peer_pb2.PeerEnvelope(hello=confirm).SerializeToString())
            # Nothing more is written on this call: a write racing node 1's refusal fails in the
            # client as INTERNAL ("Failed execute_batch") and can leave that, not node 1's status,
            # as the call's code (a fresh-clone CI run). Frames after a refused confirmation
            # cannot reach node 1 anyway: the refusal ends the stream (call5 below sends some
            # with no handshake at all).
            await expect_refused(call2, grpc.StatusCode.UNAUTHENTICATED)
            # A node whose clock is a minute behind ours is no replayer: it connects (main refused it).
            late = PeerAuthenticator(2, CLUSTER, SECRET, known_node=lambda n: True,
                                     clock_ms=lambda: time.time_ns() // 1_000_000 - 60_000)
            ch3, call3, _ = await handshake(ts[1].port, late)
            await call3.write(raft_frame(Message(type=MT.HEARTBEAT, to=1, frm=2, term=51)))
            await wait_until(lambda: any(m.term == 51 for _, m in recs[1].messages(2)), 5, "the late clock's frame")
            # An unknown node id, even holding the secret.
            nine = PeerAuthenticator(9, CLUSTER, SECRET, known_node=lambda n: True)
            ch4, call4 = await raw_stream(ts[1].port, hello=nine.dialler_hello(1))
            await expect_refused(call4, grpc.StatusCode.FAILED_PRECONDITION)
            # No Hello at all: raft frames first are refused.
            ch5, call5 = await raw_stream(ts[1].port, raft_frame(Message(type=MT.VOTE, to=1, frm=2, term=50)))
            await expect_refused(call5, grpc.StatusCode.FAILED_PRECONDITION)
            assert all(m.term != 50 for _, m in recs[1].messages())
            assert ts[1].stats.inbound.hellos_refused == 3
            for ch in (ch1, ch2, ch3, ch4, ch5):
                await ch.close()
        finally:
            await close_all(ts)
    run(main())


def test_bad_frames_from_an_authenticated_peer(run):
    async def main():
        ts, recs, auth2 = await lone_node()
        t1 = ts[1]
        try:
            ch, call, answer = await handshake(t1.port, auth2)
            assert answer.node_id == 1
            good = Message(type=MT.HEARTBEAT, to=1, frm=2, term=4)
            # An undecodable message is dropped and counted; the rest of the batch and stream live on.
            await call.write(raft_frame(b"\x01\x03garbage", good))
            await wait_until(lambda: recs[1].messages(2) == [(1, good)], 5, "good message")
            assert t1.stats.inbound.codec_errors == 1
            # A message claiming to come from node 3 on node 2's stream ends the stream.
            await call.write(raft_frame(Message(type=MT.VOTE, to=1, frm=3, term=5, index=1)))
            await expect_refused(call, grpc.StatusCode.INVALID_ARGUMENT)
            # So does a local-only message, and an empty batch.
            for frame in (raft_frame(Message(type=MT.HUP, to=1, frm=2)),
                          peer_pb2.PeerEnvelope(raft=peer_pb2.RaftBatch()).SerializeToString(),
                          peer_pb2.PeerEnvelope(hello=auth2.dialler_hello(1)).SerializeToString()):
                ch2, call2, _ = await handshake(t1.port, auth2)
                await call2.write(frame)
                await expect_refused(call2, grpc.StatusCode.INVALID_ARGUMENT)
                await ch2.close()
            # Bytes that are not a PeerEnvelope at all, after the Hello and instead of it.
            ch3, call3, _ = await handshake(t1.port, auth2)
            await call3.write(b"\xff\xff\xff\xff")
            await expect_refused(call3, grpc.StatusCode.INVALID_ARGUMENT)
            ch4, call4 = await raw_stream(t1.port, b"\xff\xff\xff\xff")
            await expect_refused(call4, grpc.StatusCode.INVALID_ARGUMENT)
            assert recs[1].messages(2) == [(1, good)]
            assert t1.stats.inbound.protocol_errors == 5 and t1.stats.inbound.hellos_refused == 1
            for c in (ch, ch3, ch4):
                await c.close()
        finally:
            await close_all(ts)
    run(main())


def test_doubly_forwarded_requests_keep_their_originator_and_the_link_survives(run):
    """Issue 9 C5: node 1 forwarded a proposal and a read to node 2 (a stale leader hint), and
    2 forwards them to 3: frm stays 1 (the leader answers the read to 1), on 2's link. The
    receiver used to end 2's whole stream (INVALID_ARGUMENT) for it: every message queued
    behind was lost and the link redialled."""
    async def main():
        ts, recs = await make_nodes((1, 2, 3))
        try:
            await wait_until(lambda: ts[2].link_up(3), 10, "link 2->3 up")
            forwarded = [
                Message(type=MT.PROP, to=3, frm=1, entries=(Entry(0, 0, data=b"from 1"),)),
                Message(type=MT.READ_INDEX, to=3, frm=1, context=b"read of 1"),
                Message(type=MT.TRANSFER_LEADER, to=3, frm=1),  # a transfer to 1, forwarded
                Message(type=MT.READ_INDEX, to=3, frm=3, context=b"back at its originator"),
            ]
            after = Message(type=MT.HEARTBEAT, to=3, frm=2, term=4, commit=1)
            assert ts[2].send(3, [(1, m) for m in forwarded] + [(1, after)])
            await wait_until(lambda: len(recs[3].messages(2)) == 5, 10, "the batch")
            assert recs[3].messages(2) == [(1, m) for m in forwarded] + [(1, after)]
            # The same stream carries on: no protocol error, no break, nothing reported lost.
            assert ts[2].send(3, [(1, after)])
            await wait_until(lambda: len(recs[3].messages(2)) == 6, 10, "the next batch")
            assert ts[3].stats.inbound.protocol_errors == 0 and ts[3].stats.inbound.streams_superseded == 0
            assert ts[2].stats.links[3].connects == 1 and ts[2].stats.links[3].disconnects == 0
            assert not recs[2].lost
        finally:
            await close_all(ts)
    run(main())


def test_only_forwardable_requests_may_name_another_sender(run):
    """Votes, appends, heartbeats, snapshots and responses from anyone but the stream's node end
    the stream; so does a forwarded request without a sender. Forwarded requests pass."""
    async def main():
        ts, recs, auth2 = await lone_node()
        t1 = ts[1]
        snap = Snapshot(SnapshotMetadata(index=5, term=2, conf_state=ConfState(voters=(1, 2, 3))), b"img")
        foreign = [
            Message(type=MT.APP, to=1, frm=3, term=4, log_term=4, index=5, commit=5),
            Message(type=MT.HEARTBEAT, to=1, frm=3, term=4),
            Message(type=MT.SNAP, to=1, frm=3, term=4, snapshot=snap, chunk_total=3),
            Message(type=MT.VOTE, to=1, frm=3, term=5, log_term=4, index=9),
            Message(type=MT.PRE_VOTE, to=1, frm=3, term=5, log_term=4, index=9),
            Message(type=MT.APP_RESP, to=1, frm=3, term=4, index=9),
            Message(type=MT.VOTE_RESP, to=1, frm=3, term=5),
            Message(type=MT.HEARTBEAT_RESP, to=1, frm=3, term=4),
            Message(type=MT.READ_INDEX_RESP, to=1, frm=3, term=4, index=5, context=b"c"),
            Message(type=MT.TIMEOUT_NOW, to=1, frm=3, term=4),
            Message(type=MT.SNAP_STATUS, to=1, frm=3, term=4, index=5, reject=True),
            Message(type=MT.PROP, to=1, frm=0, entries=(Entry(0, 0, data=b"x"),)),
            Message(type=MT.READ_INDEX, to=2, frm=3, context=b"c"),  # not addressed to us
        ]
        try:
            for m in foreign:
                ch, call, _ = await handshake(t1.port, auth2)
                await call.write(raft_frame(m))
                await expect_refused(call, grpc.StatusCode.INVALID_ARGUMENT)
                await ch.close()
            assert t1.stats.inbound.protocol_errors == len(foreign) and not recs[1].got
            ok = Message(type=MT.READ_INDEX, to=1, frm=3, context=b"c")
            ch, call, _ = await handshake(t1.port, auth2)
            await call.write(raft_frame(ok))
            await wait_until(lambda: recs[1].messages(2) == [(1, ok)], 5, "the forwarded read")
            await ch.close()
        finally:
            await close_all(ts)
    run(main())


def test_a_newer_stream_from_a_node_supersedes_the_older(run):
    async def main():
        ts, recs, auth2 = await lone_node()
        try:
            hb = lambda term: raft_frame(Message(type=MT.HEARTBEAT, to=1, frm=2, term=term))
            ch_a, a, _ = await handshake(ts[1].port, auth2)
            await a.write(hb(1))
            await wait_until(lambda: len(recs[1].got) == 1, 5, "first stream's batch")
            ch_b, b, _ = await handshake(ts[1].port, auth2)
            # The old stream is ended by the node, so nothing it carries lands after the new one's.
            await expect_refused(a, grpc.StatusCode.ABORTED)
            await b.write(hb(2))
            await wait_until(lambda: len(recs[1].got) == 2, 5, "second stream's batch")
            assert [m.term for _, m in recs[1].messages(2)] == [1, 2]
            st = ts[1].stats.inbound
            assert (st.streams_accepted, st.streams_superseded) == (2, 1)
            await ch_a.close()
            await ch_b.close()
        finally:
            await close_all(ts)
    run(main())


def test_an_oversized_envelope_is_refused_by_the_receiver(run):
    small = TransportLimits(max_envelope_bytes=2 << 20)

    async def main():
        ts, recs, auth2 = await lone_node(small)
        try:
            ch, call, answer = await handshake(ts[1].port, auth2)
            assert answer.max_envelope_bytes == 2 << 20  # announced to the dialler
            await call.write(raft_frame(app(2, 1, 5, b"z" * (3 << 20))))
            await expect_refused(call, grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert not recs[1].messages(2) or all(m.index != 4 for _, m in recs[1].messages(2))
            await ch.close()
        finally:
            await close_all(ts)
    run(main())


class _Impostor(peer_pb2_grpc.PeerServicer):
    """Listens where node 2 should be, without the secret: answers every Hello with a forged one."""

    def __init__(self):
        self.frames = []

    async def Stream(self, request_iterator, context):
        async for env in request_iterator:
            self.frames.append(env)
            if env.HasField("hello"):
                h = env.hello
                yield peer_pb2.PeerEnvelope(hello=peer_pb2.Hello(
                    protocol_version=peer_auth.PROTOCOL_VERSION, cluster_id=h.cluster_id, node_id=h.peer_node_id, peer_node_id=h.node_id,
                    unix_ms=h.unix_ms, nonce=os.urandom(32), reply_to_nonce=h.nonce, proof=os.urandom(32),
                    incarnation=os.urandom(16)))


def test_an_impostor_acceptor_gets_no_raft_traffic(run, caplog):
    async def main():
        server = grpc.aio.server()
        imp = _Impostor()
        peer_pb2_grpc.add_PeerServicer_to_server(imp, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        t = GrpcTransport(1, CLUSTER, SECRET, "127.0.0.1:0", {2: f"127.0.0.1:{port}"}, limits=FAST)
        rec = Recorder()
        t.start(rec)
        try:
            await wait_until(lambda: t.stats.links[2].handshake_failures >= 2, 10, "refused handshakes")
            assert not t.link_up(2)
            assert not t.send(2, [(1, Message(type=MT.APP, to=2, frm=1, term=1))])
            assert imp.frames and all(f.HasField("hello") for f in imp.frames)
        finally:
            await t.close()
            await server.stop(None)
    with caplog.at_level(logging.INFO, logger="xraft"):
        run(main())
    assert "its Hello was refused" in caplog.text and "bad proof" in caplog.text


# ------------------------------------------------------------------ breaks, restarts, backpressure


def test_a_restarted_peer_is_redialled_and_traffic_resumes(run):
    async def main():
        ts, recs = await make_nodes((1, 2))
        try:
            await wait_until(lambda: ts[1].link_up(2) and ts[2].link_up(1), 10, "links")
            assert ts[1].send(2, [(1, app(1, 2, 1))])
            await wait_until(lambda: len(recs[2].got) == 1, 5, "first batch")
            port2 = ts[2].port
            await ts[2].close()
            await wait_until(lambda: not ts[1].link_up(2), 10, "link 1->2 noticed the break")
            assert not ts[1].send(2, [(1, app(1, 2, 2))])  # refused while down, not queued
            assert ts[1].stats.links[2].refused_down >= 1
            # Node 2 comes back on the same address with a fresh process state.
            t2 = GrpcTransport(2, CLUSTER, SECRET, f"127.0.0.1:{port2}", {1: f"127.0.0.1:{ts[1].port}"},
                               limits=FAST)
            await t2.serve()
            rec2 = Recorder()
            t2.start(rec2)
            ts[2] = t2
            await wait_until(lambda: ts[1].link_up(2) and t2.link_up(1), 10, "links back")
            assert ts[1].send(2, [(1, app(1, 2, 3))])
            assert t2.send(1, [(1, Message(type=MT.APP_RESP, to=1, frm=2, term=3, index=3))])
            await wait_until(lambda: rec2.got and len(recs[1].got) >= 1, 10, "traffic after restart")
            assert rec2.messages() == [(1, app(1, 2, 3))]
            assert ts[1].stats.links[2].connects == 2 and ts[1].stats.links[2].disconnects == 1
            # Node 1 accepted node 2's new stream (the old one had ended or was superseded).
            assert ts[1].stats.inbound.streams_accepted == 2
        finally:
            await close_all(ts)
    run(main())


class _Stuck(peer_pb2_grpc.PeerServicer):
    """A genuine node-2 handshake, then it stops reading: a hung receiver."""

    def __init__(self, auth):
        self.auth = auth
        self.release = asyncio.Event()

    async def Stream(self, request_iterator, context):
        first = await context.read()
        self.auth.check_dialler_hello(first.hello)
        await context.write(peer_pb2.PeerEnvelope(hello=self.auth.acceptor_hello(first.hello)))
        await self.release.wait()


def test_a_full_queue_refuses_and_a_break_reports_what_was_not_delivered(run):
    limits = TransportLimits(max_queued_batches=50, max_queued_bytes=8 << 20, backoff_initial_s=0.05,
                             backoff_max_s=0.2)

    async def main():
        auth2 = PeerAuthenticator(2, CLUSTER, SECRET, known_node=lambda n: n == 1)
        server = grpc.aio.server(options=[("grpc.http2.bdp_probe", 0)])
        stuck = _Stuck(auth2)
        peer_pb2_grpc.add_PeerServicer_to_server(stuck, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        t = GrpcTransport(1, CLUSTER, SECRET, "127.0.0.1:0", {2: f"127.0.0.1:{port}"}, limits=limits)
        rec = Recorder()
        t.start(rec)
        try:
            await wait_until(lambda: t.link_up(2), 10, "link up")
            accepted = []
            k = 0
            # 64 KiB batches into a receiver that reads nothing: flow control stalls the writer,
            # the queue fills to its bound and send() starts refusing.
            while True:
                k += 1
                batch = [(1, app(1, 2, k, b"q" * (64 << 10)))]
                if not t.send(2, batch):
                    break
                accepted.append(batch[0])
                await asyncio.sleep(0)
                assert k < 5000, "the queue never filled"
            st = t.stats.links[2]
            assert st.refused_full == 1 and len(accepted) >= limits.max_queued_batches
            await server.stop(None)  # the stream breaks with batches still queued
            await wait_until(lambda: rec.lost, 10, "lost report")
            assert [p for p, _ in rec.lost] == [2]
            lost = rec.lost[0][1]
            # What comes back is exactly the tail of what was accepted that gRPC never took, in order
            # (gRPC may still have taken a few of the queued ones as the stream went down).
            assert len(lost) >= limits.max_queued_batches // 2 and lost == accepted[len(accepted) - len(lost):]
            assert st.batches_lost == len(lost) and not t.link_up(2)
            assert not t.send(2, [(1, app(1, 2, 1))])
        finally:
            stuck.release.set()
            await t.close()
            await server.stop(None)
    run(main())


# ------------------------------------------------------------------ TLS


def _make_certs(d):
    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
         "-subj", "/CN=xraft-test-ca")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:xraft-node\n")
    ossl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "node.pem", "-days", "2", "-extfile", "ext.cnf")
    return TlsConfig.from_files(str(d / "node.pem"), str(d / "node.key"), str(d / "ca.pem"))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
def test_tls_links_work_and_plaintext_dialers_get_nothing(run, tmp_path):
    tls = _make_certs(tmp_path)

    async def main():
        ts, recs = await make_nodes((1, 2), tls={1: tls, 2: tls})
        plain = GrpcTransport(3, CLUSTER, SECRET, "127.0.0.1:0", {1: f"127.0.0.1:{ts[1].port}"}, limits=FAST)
        ts[1].add_peer(3, "127.0.0.1:1")  # known to node 1, so only TLS keeps it out
        plain.start(Recorder())
        try:
            await wait_until(lambda: ts[1].link_up(2) and ts[2].link_up(1), 10, "TLS links")
            assert ts[1].send(2, [(1, app(1, 2, 1))])
            await wait_until(lambda: recs[2].messages() == [(1, app(1, 2, 1))], 5, "delivery over TLS")
            await wait_until(lambda: plain.stats.links[1].handshake_failures >= 2, 10, "plaintext failures")
            assert not plain.link_up(1) and ts[1].stats.inbound.streams_accepted == 1
        finally:
            await plain.close()
            await close_all(ts)
    run(main())
    with pytest.raises(TransportError, match="cannot read TLS file"):
        TlsConfig.from_files(str(tmp_path / "nope.pem"), "k", "c")


def test_limits_and_options_are_checked():
    with pytest.raises(TransportError):
        TransportLimits(max_envelope_bytes=1 << 20).validate()
    with pytest.raises(TransportError):
        TransportLimits(max_batch_messages=10_001).validate()
    with pytest.raises(TransportError):
        GrpcTransport(1, CLUSTER, SECRET, "127.0.0.1:0", {1: "127.0.0.1:1"})
    opts = dict(server_options(TransportLimits(max_envelope_bytes=4 << 20)))
    assert opts["grpc.max_receive_message_length"] == 4 << 20 and opts["grpc.so_reuseport"] == 0


# ------------------------------------------------------------------ MultiRaft over gRPC


class KV:
    """A tiny deterministic machine: `k=v` puts; a hash chain over everything applied."""

    def __init__(self):
        self.data = {}
        self.applied_index = 0
        self.chain = ""

    def apply(self, index, data):
        k, _, v = data.decode().partition("=")
        self.data[k] = v
        self.applied_index = index
        self.chain = hashlib.sha256(f"{self.chain}|{index}|{data.hex()}".encode()).hexdigest()
        return index

    def snapshot(self):
        return json.dumps([self.data, self.chain]).encode()

    def restore(self, data, index):
        self.data, self.chain = json.loads(data)
        self.applied_index = index


def test_three_multiraft_nodes_elect_and_replicate_over_grpc(run, tmp_path):
    from xraft.node.runtime.multiraft import MultiRaft, MultiRaftOptions
    from xraft.node.runtime.raft_driver import GroupOptions

    gids = (1, 2, 3)

    async def main():
        ts = {}
        for i in (1, 2, 3):
            ts[i] = GrpcTransport(i, CLUSTER, SECRET, "127.0.0.1:0", {}, limits=FAST)
            await ts[i].serve()
        for i, t in ts.items():
            for j, u in ts.items():
                if i != j:
                    t.add_peer(j, f"127.0.0.1:{u.port}")
        nodes, sms = {}, {}
        opts = MultiRaftOptions(tick_interval_s=0.02, group=GroupOptions(election_tick=10, heartbeat_tick=2))
        try:
            for i in (1, 2, 3):
                mr = nodes[i] = MultiRaft(i, ts[i], opts)
                await mr.start()
                for g in gids:
                    sms[(i, g)] = KV()
                    await mr.add_group(g, str(tmp_path / f"n{i}" / f"g{g}"), sms[(i, g)], bootstrap_voters=(1, 2, 3))

            def leaders():
                out = {}
                for g in gids:
                    ls = [i for i in nodes if nodes[i].group(g).is_leader()]
                    if len(ls) == 1:
                        out[g] = ls[0]
                return out
            await wait_until(lambda: len(leaders()) == len(gids), 20, "a leader per group")
            lead = leaders()
            res = await asyncio.gather(*(nodes[lead[g]].group(g).propose(b"k%d=%d" % (k, g), 10)
                                         for g in gids for k in range(40)))
            assert len(set(res)) == 40  # 40 distinct indexes per group, 3 groups
            await wait_until(lambda: all(sms[(i, g)].applied_index == sms[(lead[g], g)].applied_index
                                         for i in nodes for g in gids), 10, "followers caught up")
            for g in gids:
                assert len({sms[(i, g)].chain for i in nodes}) == 1
                assert sms[(1, g)].data == {f"k{k}": str(g) for k in range(40)}
            # One node stops: the other two still commit (over the links they keep).
            victim = lead[1]
            await nodes.pop(victim).close()
            rest = list(nodes)
            await wait_until(lambda: any(nodes[i].group(1).is_leader() for i in rest), 20, "leader of the rest")
            new_lead = next(i for i in rest if nodes[i].group(1).is_leader())
            idx = await nodes[new_lead].group(1).propose(b"after=1", 10)
            await wait_until(lambda: all(sms[(i, 1)].applied_index >= idx for i in rest), 10, "commit by two")
            assert sum(ts[i].stats.links[victim].refused_down for i in rest) > 0
            assert all(ts[i].stats.inbound.codec_errors == 0 and ts[i].stats.inbound.protocol_errors == 0
                       for i in ts)
        finally:
            for mr in nodes.values():
                await mr.close()
    run(main(), timeout=90)


# ------------------------------------------------------------------ throughput (one link)


def test_one_link_delivers_everything_under_load(run):
    """Every message of a sustained burst arrives (the figures printed are informative only:
    speed is never asserted in tests)."""
    async def measure(t1, rec2, make_batch, seconds):
        before, env0 = len(rec2.messages()), t1.stats.links[2].envelopes_written
        sent = msgs = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            b = make_batch(sent)
            if t1.send(2, b):
                sent += 1
                msgs += len(b)
            if not sent % 8:
                await asyncio.sleep(0)  # let the writer and the receiver run
        await wait_until(lambda: len(rec2.messages()) - before == msgs, 20, "drain")
        el = time.perf_counter() - t0
        return sent / el, msgs / el, (t1.stats.links[2].envelopes_written - env0) / el

    async def main():
        ts, recs = await make_nodes((1, 2))
        try:
            await wait_until(lambda: ts[1].link_up(2), 10, "link")
            hb = [(1, Message(type=MT.HEARTBEAT, to=2, frm=1, term=5, commit=9))]
            b1, m1, e1 = await measure(ts[1], recs[2], lambda k: hb, 1.5)
            apps = lambda k: [(g, app(1, 2, k + 2, b"e" * 128)) for g in range(64)]
            b64, m64, e64 = await measure(ts[1], recs[2], apps, 1.5)
            # One batch at a time, each waited for: the per-batch latency of the link.
            n, t0 = 300, time.perf_counter()
            for k in range(n):
                got = len(recs[2].got)
                assert ts[1].send(2, hb)
                while len(recs[2].got) == got:
                    await asyncio.sleep(0)
            lat = (time.perf_counter() - t0) / n
            print(f"\none link, sender and receiver in one process (uvloop), batches coalesced into envelopes: "
                  f"1-heartbeat batches {b1:,.0f}/s = {m1:,.0f} msgs/s in {e1:,.0f} envelopes/s; "
                  f"64 x MsgApp(128 B) batches {b64:,.0f}/s = {m64:,.0f} msgs/s in {e64:,.0f} envelopes/s; "
                  f"one batch at a time: {lat * 1e6:,.0f} us send-to-deliver ({1 / lat:,.0f} batches/s)")
        finally:
            await close_all(ts)
    run(main())
