"""ISSUE9 C3: group commit packs records only up to what the Raft driver accepts.

The old packer filled records up to the codec's 64 MiB while the driver refuses
proposals over max_proposal_bytes (8 MiB): two concurrent 5 MiB XADDs became
one 10 MiB record, both failed with a retriable UNAVAILABLE, and the SDK
resent them into the same record again (a livelock). Now the packer takes its
limit from the driver's options, and a single request over it is refused at
once with a non-retriable error naming the limit.

Real MultiRaft nodes (tests/server/test_raft_backend.Cluster: LocalTransport,
DiskStorage in tmp dirs) and a real grpc.aio server + SDK for the wire side."""
import asyncio

import pytest

from tests.server.test_raft_backend import Cluster, run, xadd  # noqa: F401 - run is a fixture
from xraft.client import errors
from xraft.client.aio import Client
from xraft.node.fsm.errors import EntryTooLarge
from xraft.node.server.grpc_service import start_server

MIB = 1 << 20


def test_two_concurrent_5mib_xadds_both_apply(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.writable_leader()
            got = await asyncio.gather(leader.submit([xadd(b"s", b"1-1", f="a" * (5 * MIB))]),
                                       leader.submit([xadd(b"s", b"1-2", f="b" * (5 * MIB))]))
            assert [r[0] for r in got] == [b"1-1", b"1-2"]
            limit = leader.driver.options.max_proposal_bytes
            assert leader.max_record_bytes == limit == 8 * MIB          # taken from the driver
            assert leader.sm.read([b"XLEN", b"s"], leader.now_ms()) == 2
            await c.converged()
        finally:
            await c.close()
    run(main())


def test_one_request_over_the_proposal_limit_is_refused_naming_it(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            leader = await c.writable_leader()
            before = leader.records
            with pytest.raises(EntryTooLarge) as e:
                await leader.submit([xadd(b"s", f="x" * (9 * MIB))])
            assert "max_proposal_bytes %d" % (8 * MIB) in e.value.message
            assert e.value.message.startswith("ERR ")
            assert leader.records == before                              # nothing was proposed
        finally:
            await c.close()
    run(main())


def test_the_sdk_gets_a_final_error_for_an_oversized_xadd_and_two_5mib_xadds_succeed(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        server = None
        try:
            leader = await c.writable_leader()
            server, port, _ = await start_server(leader)
            async with Client(["127.0.0.1:%d" % port], timeout=10) as sdk:
                ids = await asyncio.gather(sdk.xadd("s", {"f": "a" * (5 * MIB)}),
                                           sdk.xadd("s", {"f": "b" * (5 * MIB)}))
                assert len(set(ids)) == 2 and await sdk.xlen("s") == 2
                records = leader.records
                with pytest.raises(errors.XRaftError) as e:
                    await sdk.xadd("s", {"f": "x" * (9 * MIB)})
                # Final at once: not retried until the deadline (DeadlineExceededError on the old code).
                assert not isinstance(e.value, errors.DeadlineExceededError)
                assert not e.value.retriable
                assert "max_proposal_bytes" in e.value.message
                assert leader.records == records and await sdk.xlen("s") == 2
        finally:
            if server is not None:
                await server.stop(None)
            await c.close()
    run(main())


def test_resp_gets_an_err_reply_naming_the_limit_for_an_oversized_xadd(tmp_path, run):
    async def main():
        from xraft.node.server.resp import encode_command
        from xraft.node.server.resp_server import RespServer
        c = await Cluster(tmp_path).start()
        server = None
        try:
            leader = await c.writable_leader()
            server = await RespServer(leader, "127.0.0.1", 0).start()
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(encode_command([b"XADD", b"s", b"*", b"f", b"x" * (9 * MIB)]))
            w.write(encode_command([b"XLEN", b"s"]))
            line = await r.readline()
            assert line.startswith(b"-ERR ") and b"max_proposal_bytes %d" % (8 * MIB) in line
            assert await r.readline() == b":0\r\n"              # nothing applied, connection still usable
            w.close()
        finally:
            if server is not None:
                await server.close()
            await c.close()
    run(main())
