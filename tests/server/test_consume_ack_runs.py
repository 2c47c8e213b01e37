"""Consume's ack runs (ConsumeAck.run_lengths): several acks in one message, each
its own XACK with its own AckResult, written as one submit; deliveries say the
server takes them (ConsumeDelivery.ack_runs); malformed runs end the call."""
import contextlib

import grpc
import pytest

from tests.server.test_perf_paths import _consume_setup, _start, _teardown
from tests.server.test_raft_backend import Cluster, run  # noqa: F401  (run is a fixture)
from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc


def _runs(ids, lengths, seq):
    return pb.ConsumeRequest(ack=pb.ConsumeAck(key=b"s", ids=ids, ack_seq=seq, run_lengths=lengths))


@contextlib.asynccontextmanager
async def _consuming(tmp_path, n):
    """A Consume call (window 100, batch n) over n entries, all delivered:
    (leader, call, the server's sessions, the delivered IDs)."""
    c = await Cluster(tmp_path).start()
    torn = None
    try:
        leader, server, channel, sessions, patch = await _consume_setup(c, n)
        torn = (server, channel, patch)
        call = pb_grpc.XRaftStub(channel).Consume()
        await call.write(_start(100, n))
        got = []
        while len(got) < n:
            resp = await call.read()
            assert resp.WhichOneof("body") == "delivery" and resp.delivery.ack_runs
            got.extend(e.id for s in resp.delivery.streams for e in s.entries)
        yield leader, call, sessions, got
        call.cancel()
    finally:
        if torn:
            await _teardown(*torn)
        await c.close()


def test_runs_are_acks_of_their_own_in_one_write(tmp_path, run):
    """Runs of 10, 20 and 1 IDs (the last one already acked by the first run):
    three AckResults numbered from the message's ack_seq, each with its own
    XACK count (10, 20, 0), from one submit; every entry leaves the PEL."""
    async def main():
        async with _consuming(tmp_path, 30) as (leader, call, sessions, got):
            await call.write(_runs(got + got[:1], [10, 20, 1], 5))
            results = []
            while len(results) < 3:
                resp = await call.read()
                if resp.WhichOneof("body") == "ack_result":
                    results.append((resp.ack_result.ack_seq, resp.ack_result.acked))
            assert results == [(5, 10), (6, 20), (7, 0)]
            s = sessions[-1]
            assert s.ack_writes == 1 and s.acks_written == 3
            assert not s.unacked and not s.releasing and s.n_unacked == 0
            assert (await leader.read([b"XPENDING", b"s", b"g"]))[0] == 0
    run(main())


@pytest.mark.parametrize("lengths", [[10, 0, 20], [10, 19], [10, 21]])
def test_malformed_runs_end_the_call(tmp_path, run, lengths):
    async def main():
        async with _consuming(tmp_path, 30) as (leader, call, _, got):
            await call.write(_runs(got, lengths, 1))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while True:
                    resp = await call.read()
                    assert resp is not grpc.aio.EOF and resp.WhichOneof("body") != "ack_result"
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "run_lengths" in err.value.details()
            assert (await leader.read([b"XPENDING", b"s", b"g"]))[0] == 30     # nothing acked
    run(main())
