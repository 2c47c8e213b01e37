"""Pipelines over in-process Raft backends (resp_pipeline.py's batches):

* a sharded node (ShardedBackend, test_sharded_backend.Node: groups 1 and 3 here, group 2
  elsewhere): plain writes batch per group only, a key of a group this node does not host
  answers -MOVED in its place, and the replies keep the pipeline's order;
* a RaftBackend whose proposals are capped below a batch's size: the batch falls back to
  one submission per command."""
import asyncio

from tests.server.test_sharded_backend import ADDRESSES, Node, key_in, run  # noqa: F401 - run is a fixture
from tests.server.test_resp_vs_redis import _complete
from xraft.node.engine.slots import key_slot
from xraft.node.server.resp import encode_command
from xraft.node.server.resp_server import RespServer


async def _pipeline(port: int, commands: list, n_replies: int) -> list:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(encode_command(c) for c in commands))
    buf = b""
    while len(_complete(buf)[0]) < n_replies:
        chunk = await reader.read(1 << 16)
        assert chunk, "the server closed the connection"
        buf += chunk
    writer.close()
    return _complete(buf)[0]


def test_pipeline_batches_per_group_and_redirects_per_command(tmp_path, run):
    k1, k2, k3 = key_in(1, "a"), key_in(2, "b"), key_in(3, "c")

    async def main():
        node = await Node().start(tmp_path)
        server = await RespServer(node.sb, "127.0.0.1", 0).start()
        try:
            records = {g: b.records for g, b in node.groups.items()}
            cmds = [[b"XADD", k1, b"1-1", b"f", b"v"], [b"XADD", k1, b"2-1", b"f", b"v"],
                    [b"XADD", k3, b"1-1", b"f", b"v"], [b"XADD", k2, b"1-1", b"f", b"v"],
                    [b"XADD", k1, b"3-1", b"f", b"v"], [b"XADD", k1, b"1-1", b"f", b"v"],
                    [b"XADD", k3, b"2-1", b"f", b"v"], [b"XADD", k3, b"3-1", b"f", b"v"],
                    [b"XLEN", k1], [b"XLEN", k3], [b"XLEN", k2]]
            replies = await _pipeline(server.port, cmds, len(cmds))
            moved = "MOVED %d %s" % (key_slot(k2), ADDRESSES[2].resp)
            assert [r.message if hasattr(r, "message") else r for r in replies] == [
                b"1-1", b"2-1", b"1-1", moved, b"3-1",
                "ERR The ID specified in XADD is equal or smaller than the target stream top item",
                b"2-1", b"3-1", 3, 3, moved]
            # Group 1's four writes came as [k1 k1] [k1 k1] around the others: at most 2 records;
            # group 3's as [k3] [k3 k3]: at most 2. One record per command would be 4 and 3.
            assert node.groups[1].records - records[1] <= 2
            assert node.groups[3].records - records[3] <= 2
        finally:
            await server.close()
            await node.close()
    run(main())


def test_a_batch_over_the_proposal_limit_runs_command_by_command(tmp_path, run):
    """max_proposal_bytes 64 KiB: 20 pipelined XADDs of 10 KiB fit one by one but not
    together; the batch is refused (nothing proposed) and sent again command by command:
    all apply, in order, and the one XADD over the limit alone gets the limit's error."""
    from tests.server.test_raft_backend import Cluster

    async def main():
        c = await Cluster(tmp_path, max_proposal_bytes=64 << 10).start()
        try:
            leader = await c.writable_leader()
            server = await RespServer(leader, "127.0.0.1", 0).start()
            try:
                cmds = [[b"XADD", b"s", b"%d-1" % i, b"f", b"x" * (10 << 10)] for i in range(1, 21)]
                cmds.insert(10, [b"XADD", b"s", b"99-1", b"f", b"x" * (100 << 10)])
                replies = await _pipeline(server.port, cmds + [[b"XLEN", b"s"]], len(cmds) + 1)
                assert replies[:10] + replies[11:-1] == [b"%d-1" % i for i in range(1, 21)]
                assert "max_proposal_bytes %d" % (64 << 10) in replies[10].message
                assert replies[-1] == 20
            finally:
                await server.close()
        finally:
            await c.close()
    run(main())
