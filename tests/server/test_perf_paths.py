"""The leader's fast paths, checked by counting (never by timing): RaftBackend's group
commit gathers writes while the driver cannot take a proposal, and the gRPC Consume
session pipelines its XREADGROUP reads and writes acks that arrive together in one
record, within the unacked window. A test holds the leader's WAL sync (a threading
Event) to keep "the driver is busy" true for as long as it needs."""
import asyncio
import contextlib
import threading

import grpc
import pytest

from tests.server.test_raft_backend import Cluster, run, xadd  # noqa: F401  (run is a fixture)
from xraft.node.server import raft_backend
from xraft.node.server.backend import Unavailable
from xraft.node.server.grpc_service import start_server
from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc


class HeldSync:
    """Hold the leader's storage sync() (in the executor) until release()."""

    def __init__(self, backend):
        self.storage = backend.driver.storage
        self.gate = threading.Event()
        self.gate.set()
        self.entered = 0
        inner = self.storage.sync

        def sync(*a, **kw):
            self.entered += 1
            self.gate.wait(60)
            return inner(*a, **kw)
        self.storage.sync = sync

    def hold(self):
        self.gate.clear()

    def release(self):
        self.gate.set()


@contextlib.asynccontextmanager
async def first_record_in_sync(tmp_path, close_backends=True):
    """A cluster whose leader proposed one write (s 1-1) and is held in that record's sync.
    Yields (cluster, leader, held, records and requests before it, the write's future)."""
    c = await Cluster(tmp_path).start()
    held = None
    try:
        leader = await c.writable_leader()
        held = HeldSync(leader)
        held.hold()
        r0, q0 = leader.records, leader.requests
        first = asyncio.ensure_future(leader.submit([xadd(b"s", b"1-1", n="0")]))
        await until(lambda: leader.driver.busy and held.entered, "the first record's sync")
        yield c, leader, held, r0, q0, first
    finally:
        if held:
            held.release()
        if close_backends:
            await c.close()
        else:
            for mr in c.nodes.values():
                await mr.close()


async def until(cond, what, timeout=20.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        await asyncio.sleep(0.005)


def test_writes_arriving_while_the_driver_is_busy_become_one_record(tmp_path, run):
    async def main():
        async with first_record_in_sync(tmp_path) as (c, leader, held, r0, q0, first):
            assert leader.records == r0 + 1
            # 20 writes, each in a loop iteration of its own (as gRPC requests arrive):
            # the old flush-per-iteration made 20 records of them.
            later = []
            for i in range(2, 22):
                later.append(asyncio.ensure_future(leader.submit([xadd(b"s", b"1-%d" % i, n=str(i))])))
                await asyncio.sleep(0)
                await asyncio.sleep(0)
            assert leader.records == r0 + 1
            assert leader.raft_info()["raft_gathering_requests"] == 20
            held.release()
            assert await first == [b"1-1"]
            assert [(await f)[0] for f in later] == [b"1-%d" % i for i in range(2, 22)]
            assert leader.records == r0 + 2 and leader.requests == q0 + 21
            assert leader.max_batch >= 20
            await c.converged()
            for n in (1, 2, 3):
                assert await c.b[n].read([b"XLEN", b"s"], linearizable=False) == 21
    run(main())


def test_writes_arriving_while_a_record_is_in_flight_become_one_record(tmp_path, run):
    """The records-in-flight gate (max_records_in_flight, default 1): the leader's storage
    is free, but its record waits for the (slow) peers; what arrives meanwhile becomes
    ONE next record. With the gate opened wide the same writes go as records of their own."""
    async def main():
        c = await Cluster(tmp_path, election_tick=500).start()    # no election over slow hops
        try:
            leader = await c.writable_leader()
            assert leader.max_records_in_flight == 1
            c.net.latency_s = 0.2                 # each peer hop: 200 ms

            async def burst(first_value: int, n: int):
                r0 = leader.records
                first = asyncio.ensure_future(leader.submit([xadd(b"s", b"*", n=str(first_value))]))
                await until(lambda: leader.records == r0 + 1 and not leader.driver.busy
                            and not leader._untaken, "the first record appended and synced")
                later = []
                for i in range(n):            # each once the leader's storage is free again
                    later.append(asyncio.ensure_future(
                        leader.submit([xadd(b"s", b"*", n=str(first_value + 1 + i))])))
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
                    await until(lambda: not leader.driver.busy and not leader._untaken, "storage free")
                during = leader.records - r0
                await first
                for f in later:
                    await f
                return during, leader.records - r0

            during, total = await burst(0, 20)
            assert during == 1                    # all 20 gathered behind the first record
            assert total == 2                     # ... and went as one record
            leader.max_records_in_flight = 1000   # the gate open: no gathering behind it
            during, total = await burst(100, 20)
            assert during == 21                   # each went while the others were in flight
            c.net.latency_s = 0.0
            await c.converged()
            for n in (1, 2, 3):
                assert await c.b[n].read([b"XLEN", b"s"], linearizable=False) == 42
        finally:
            await c.close()
    run(main())


def test_full_records_go_at_once_while_gathering(tmp_path, run, monkeypatch):
    async def main():
        monkeypatch.setattr(raft_backend, "MAX_REQUESTS", 4)
        async with first_record_in_sync(tmp_path) as (c, leader, held, r0, _, first):
            later = []
            for i in range(2, 12):        # 10 writes: two full records of 4 go, 2 keep gathering
                later.append(asyncio.ensure_future(leader.submit([xadd(b"s", b"1-%d" % i, n=str(i))])))
                await asyncio.sleep(0)
                await asyncio.sleep(0)
            assert leader.records == r0 + 3
            assert leader.raft_info()["raft_gathering_requests"] == 2
            held.release()
            await first
            assert [(await f)[0] for f in later] == [b"1-%d" % i for i in range(2, 12)]
            assert leader.records == r0 + 4 and leader.max_batch == 4
    run(main())


def test_gathered_writes_fail_unproposed_on_close(tmp_path, run):
    async def main():
        async with first_record_in_sync(tmp_path, close_backends=False) as (c, leader, held, r0, _, first):
            waiting = asyncio.ensure_future(leader.submit([xadd(b"s", b"1-2", n="1")]))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert leader.records == r0 + 1
            await leader.close()
            with pytest.raises(Unavailable):
                await waiting
            held.release()
            assert await first == [b"1-1"]       # proposed before close: resolves
            assert leader.records == r0 + 1
    run(main())


# -- Consume --------------------------------------------------------------------------------

async def _consume_setup(c, n_entries):
    leader = await c.writable_leader()
    await leader.submit([xadd(b"s", b"1-%d" % i, n=str(i)) for i in range(1, n_entries + 1)])
    from xraft.node.fsm.resolve import resolve_command
    [ok] = await leader.submit([resolve_command(0, 0, [b"XGROUP", b"CREATE", b"s", b"g", b"0"]).request])
    assert ok in ("OK", b"OK")
    server, port, service = await start_server(leader)
    sessions = []
    import xraft.node.server.grpc_streams as gs
    orig = gs._ConsumeSession.__init__

    def init(self, *a, **kw):
        orig(self, *a, **kw)
        sessions.append(self)
    gs._ConsumeSession.__init__ = init
    channel = grpc.aio.insecure_channel("127.0.0.1:%d" % port)
    return leader, server, channel, sessions, (gs, orig)


async def _teardown(server, channel, patch):
    gs, orig = patch
    gs._ConsumeSession.__init__ = orig
    await channel.close()
    await server.stop(None)


def _start(window, batch):
    return pb.ConsumeRequest(start=pb.ConsumeStart(keys=[b"s"], group=b"g", consumer=b"w",
                                                   max_unacked=window, max_batch=batch))


def _ack(ids, seq):
    return pb.ConsumeRequest(ack=pb.ConsumeAck(key=b"s", ids=ids, ack_seq=seq))


def test_consume_pipelines_reads_within_the_window(tmp_path, run):
    """100 entries, window 25, batch 10: reads run ahead (fewer records than reads),
    yet the client never holds more than 25 unconfirmed entries; every entry comes
    once, in order; acks confirm with their own counts."""
    async def main():
        c = await Cluster(tmp_path).start()
        torn = None
        try:
            leader, server, channel, sessions, patch = await _consume_setup(c, 100)
            torn = (server, channel, patch)
            r0 = leader.records
            call = pb_grpc.XRaftStub(channel).Consume()
            await call.write(_start(25, 10))
            got, confirmed, sent, seq = [], 0, 0, 0
            while len(got) < 100 or confirmed < 100:
                resp = await call.read()
                if resp.WhichOneof("body") == "ack_result":
                    assert resp.ack_result.acked == 10
                    confirmed += resp.ack_result.acked
                    continue
                for s in resp.delivery.streams:
                    got.extend(e.id for e in s.entries)
                assert len(got) - confirmed <= 25         # the window, counting confirmed acks only
                while len(got) - sent >= 10:
                    seq += 1
                    await call.write(_ack(got[sent:sent + 10], seq))
                    sent += 10
            assert [(i.ms, i.seq) for i in got] == [(1, i) for i in range(1, 101)]
            s = sessions[-1]
            assert s.ack_writes <= s.acks_written == 10
            assert s.reads >= 10
            assert leader.records - r0 < s.reads + s.ack_writes     # reads and acks shared records
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF   # half-close: ends once the acks are confirmed
            assert not s.unacked and not s.releasing
            assert (await leader.read([b"XPENDING", b"s", b"g"]))[0] == 0
        finally:
            if torn:
                await _teardown(*torn)
            await c.close()
    run(main())


def test_consume_overlapping_acks_carry_the_next_reads(tmp_path, run):
    """The client acks each delivery at once, never waiting for results (many ack
    writes in flight): the acks' writes carry the reads the room they open allows,
    yet the client never holds more than the window of unconfirmed entries; every
    entry comes once, in order; every ack is confirmed with its own count, in order."""
    async def main():
        c = await Cluster(tmp_path).start()
        torn = None
        try:
            leader, server, channel, sessions, patch = await _consume_setup(c, 200)
            torn = (server, channel, patch)
            call = pb_grpc.XRaftStub(channel).Consume()
            await call.write(_start(30, 10))
            got, confirmed, seqs, seq = [], 0, [], 0
            while len(got) < 200 or confirmed < 200:
                resp = await call.read()
                if resp.WhichOneof("body") == "ack_result":
                    seqs.append(resp.ack_result.ack_seq)
                    confirmed += resp.ack_result.acked
                    continue
                ids = [e.id for s in resp.delivery.streams for e in s.entries]
                got.extend(ids)
                assert len(got) - confirmed <= 30         # the window, counting confirmed acks only
                seq += 1
                await call.write(_ack(ids, seq))          # at once: earlier acks may be unconfirmed
            assert [(i.ms, i.seq) for i in got] == [(1, i) for i in range(1, 201)]
            assert seqs == list(range(1, seq + 1))
            s = sessions[-1]
            assert s.reads_with_acks > 0                   # reads went out with the acks' XACKs
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            assert not s.unacked and not s.releasing and s.n_unacked == s.n_releasing == 0
            assert (await leader.read([b"XPENDING", b"s", b"g"]))[0] == 0
        finally:
            if torn:
                await _teardown(*torn)
            await c.close()
    run(main())


def test_consume_writes_acks_that_arrive_together_as_one_record(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        held = torn = None
        try:
            leader, server, channel, sessions, patch = await _consume_setup(c, 50)
            torn = (server, channel, patch)
            call = pb_grpc.XRaftStub(channel).Consume()
            await call.write(_start(1000, 10))
            got = []
            while len(got) < 50:
                resp = await call.read()
                assert resp.WhichOneof("body") == "delivery"
                for s in resp.delivery.streams:
                    got.extend(e.id for e in s.entries)
            s = sessions[-1]
            await until(lambda: leader.driver.status().inflight_proposals == 0 and not leader.driver.busy,
                        "the session's last read to resolve")
            held = HeldSync(leader)
            held.hold()
            w0, r0 = s.ack_writes, leader.records
            # The first ack's write is held in the WAL sync; the next four (one of them
            # acking IDs already acked) are submitted without waiting for it to apply,
            # and the backend's group commit makes them ONE record behind it.
            await call.write(_ack(got[0:10], 1))
            await until(lambda: s.ack_writes == w0 + 1 and held.entered, "the first ack's write")
            await call.write(_ack(got[10:20], 2))
            await call.write(_ack(got[5:25], 3))
            await call.write(_ack(got[25:50], 4))
            await call.write(_ack(got[0:1], 5))
            await until(lambda: s.acks_written == 5, "the other acks' writes")
            held.release()
            results = {}
            while len(results) < 5:
                resp = await call.read()
                assert resp.WhichOneof("body") == "ack_result"
                results[resp.ack_result.ack_seq] = resp.ack_result.acked
            assert results == {1: 10, 2: 10, 3: 5, 4: 25, 5: 0}    # each XACK's own count
            assert list(results) == [1, 2, 3, 4, 5]                 # in arrival order
            assert w0 + 2 <= s.ack_writes <= w0 + 5 and s.acks_written == 5
            assert leader.records == r0 + 2
            assert not s.unacked and not s.releasing
            call.cancel()
        finally:
            if held:
                held.release()
            if torn:
                await _teardown(*torn)
            await c.close()
    run(main())
