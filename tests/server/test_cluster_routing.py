"""Routing per slot, as a node hosting several groups presents it: two in-process
servers each lead half of the slots (SplitBackend: a LocalBackend whose
redirect_for and shards() answer per slot, the Backend contract a multi-group
backend keeps), spoken to in raw RESP, through redis-py's RedisCluster, and
through the gRPC front end."""
import grpc
import pytest
import redis as redispy
from google.rpc import status_pb2
from redis.cluster import ClusterNode, RedisCluster

from tests.client import run, serving
from tests.server.test_resp_server import ServerThread, raw_exchange
from xraft.node.engine.slots import SLOT_COUNT, key_slot
from xraft.node.server.backend import LocalBackend, NodeInfo, Shard, cluster_node_id, split_address
from xraft.node.server.cluster_cmds import cluster_info
from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc

pytestmark = pytest.mark.redis

HALF = SLOT_COUNT // 2
CROSSSLOT = b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"


class SplitBackend(LocalBackend):
    """Leads slots [first, last]; `peer` (host:port) leads the others."""

    def __init__(self, first: int, last: int, address=None, peer=None):
        super().__init__(address=address)
        self.first, self.last = first, last
        self.peer = peer

    def _mine(self, slot: int) -> bool:
        return self.first <= slot <= self.last

    def redirect_for(self, slot: int):
        return None if self._mine(slot) else (self.peer or "")

    def hosts_slot(self, slot: int) -> bool:
        return self._mine(slot)

    def shards(self) -> list:
        host, port = split_address(self.address)
        mine = Shard(((self.first, self.last),), (NodeInfo(self.node_id, host, port, "master", myself=True),))
        if not self.peer:
            return [mine]
        others = tuple(r for r in ((0, self.first - 1), (self.last + 1, SLOT_COUNT - 1)) if r[0] <= r[1])
        phost, pport = split_address(self.peer)
        return [mine, Shard(others, (NodeInfo(cluster_node_id(self.peer), phost, pport, "master"),))]


def key_in(first: int, last: int, prefix: str = "k") -> str:
    """A key whose slot is in [first, last]."""
    i = 0
    while not first <= key_slot(b"%s%d" % (prefix.encode(), i)) <= last:
        i += 1
    return "%s%d" % (prefix, i)


@pytest.fixture
def split():
    a = ServerThread(lambda: SplitBackend(0, HALF - 1))
    b = ServerThread(lambda: SplitBackend(HALF, SLOT_COUNT - 1))
    a.call(setattr, a.backend, "peer", b.address)
    b.call(setattr, b.backend, "peer", a.address)
    yield a, b
    b.stop()
    a.stop()


def test_moved_is_decided_per_slot_and_crossslot_comes_first(split):
    a, b = split
    here, there = key_in(0, HALF - 1), key_in(HALF, SLOT_COUNT - 1)
    moved = b"-MOVED %d %s\r\n" % (key_slot(there.encode()), b.address.encode())
    data, _ = raw_exchange(a.port, ("SET %s 1\r\nSET %s 1\r\nGET %s\r\nDEL %s %s\r\nDEL %s {%s}x\r\n"
                                    % (here, there, there, here, there, there, there)).encode())
    assert data == b"+OK\r\n" + moved + moved + CROSSSLOT + moved
    # MULTI: a queued command of another group's slot is redirected and dooms EXEC.
    data, _ = raw_exchange(a.port, ("MULTI\r\nSET %s 2\r\nSET %s 2\r\nEXEC\r\nGET %s\r\n" % (here, there, here)).encode())
    assert data == b"+OK\r\n+QUEUED\r\n" + moved + b"-EXECABORT Transaction discarded because of previous errors.\r\n$1\r\n1\r\n"
    # WATCH of the other group's key moves too; READONLY serves no slot of another group.
    data, _ = raw_exchange(a.port, ("WATCH %s\r\nREADONLY\r\nGET %s\r\nGET %s\r\n" % (there, there, here)).encode())
    assert data == moved + b"+OK\r\n" + moved + b"$1\r\n1\r\n"


def test_keys_in_slot_are_read_where_the_slot_lives(split):
    a, b = split
    here, there = key_in(0, HALF - 1), key_in(HALF, SLOT_COUNT - 1)
    s_here, s_there = key_slot(here.encode()), key_slot(there.encode())
    raw_exchange(a.port, ("SET %s 1\r\nSET {%s}2 1\r\n" % (here, here)).encode())
    data, _ = raw_exchange(a.port, ("CLUSTER COUNTKEYSINSLOT %d\r\nCLUSTER GETKEYSINSLOT %d 5\r\n"
                                    "CLUSTER COUNTKEYSINSLOT %d\r\nREADONLY\r\nCLUSTER GETKEYSINSLOT %d 1\r\n"
                                    % (s_here, s_here, s_there, s_there)).encode())
    moved = b"-MOVED %d %s\r\n" % (s_there, b.address.encode())
    tagged = ("{%s}2" % here).encode()
    assert data == (b":2\r\n*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(tagged), tagged, len(here), here.encode())
                    + moved + b"+OK\r\n" + moved)


def test_asking_holds_for_the_next_command_or_through_multi(split):
    """No slot imports yet, so ASKING changes no reply: its flag's life is what redis's is."""
    a, _ = split
    conn = a.client()
    conn.ping()

    def flag():
        return a.call(lambda: [c.asking for c in a.server.clients.values()])

    assert flag() == [False]
    conn.execute_command("ASKING")
    assert flag() == [True]
    conn.execute_command("ASKING")                 # ASKING after ASKING keeps it
    assert flag() == [True]
    conn.ping()                                    # any other command uses it up
    assert flag() == [False]
    conn.execute_command("ASKING")
    conn.execute_command("MULTI")
    conn.execute_command("GET", "k")
    assert flag() == [True]                        # through a MULTI, until EXEC
    conn.execute_command("EXEC")
    assert flag() == [False]
    conn.execute_command("MULTI")
    conn.execute_command("ASKING")                 # queued: EXEC runs it
    assert flag() == [False]
    assert conn.execute_command("EXEC") == [b"OK"]
    assert flag() == [False]                       # EXEC itself ends it, as redis resetClient does


def test_cluster_info_counts_from_the_shards(split):
    a, b = split
    info = a.client().cluster("INFO")
    assert (info["cluster_state"], int(info["cluster_slots_assigned"]), int(info["cluster_known_nodes"]),
            int(info["cluster_size"])) == ("ok", SLOT_COUNT, 2, 2)
    # One node leading two groups is one known node and one master (redis counts nodes).
    two_groups = SplitBackend(0, HALF - 1, address="127.0.0.1:7000", peer="127.0.0.1:7000")
    text = cluster_info(two_groups).decode()
    assert "cluster_known_nodes:1\r\n" in text and "cluster_size:1\r\n" in text and "cluster_state:ok\r\n" in text
    # Half of the slots: assigned and ok count them, the state is fail.
    alone = SplitBackend(0, HALF - 1, address="127.0.0.1:7000")
    text = cluster_info(alone).decode()
    assert "cluster_state:fail\r\ncluster_slots_assigned:%d\r\ncluster_slots_ok:%d\r\n" % (HALF, HALF) in text


def test_redis_py_cluster_client_routes_every_slot(split):
    a, b = split
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", a.port)], socket_timeout=20)
    try:
        names = ["key%d" % i for i in range(40)]
        for n in names:
            rc.rpush(n, n)
        assert all(rc.lrange(n, 0, -1) == [n.encode()] for n in names)
        counts = [a.call(lambda: len(a.backend.sm.keyspace.data)), b.call(lambda: len(b.backend.sm.keyspace.data))]
        assert sum(counts) == 40 and min(counts) > 0           # both groups hold keys
        assert rc.delete(*names[:10]) == 10                    # redis-py splits a DEL per slot
        rc.xadd("{t}s", {"f": "v"}, id="1-1")
        rc.xadd("{t}u", {"f": "w"}, id="1-1")
        got = rc.xread({"{t}s": "0", "{t}u": "0"})
        assert [k for k, _ in got] == [b"{t}s", b"{t}u"]
        slot = key_slot(b"t")
        assert rc.cluster_countkeysinslot(slot) == 2
        keys = rc.cluster_get_keys_in_slot(slot, 10)           # redis-py decodes these itself
        assert [k.encode() if isinstance(k, str) else k for k in keys] == [b"{t}u", b"{t}s"]    # newest first
        with pytest.raises(redispy.exceptions.RedisClusterException):
            rc.execute_command("LMOVE", "{a}x", "{b}y", "LEFT", "LEFT")   # refused by the client itself
    finally:
        rc.close()


# -- gRPC ----------------------------------------------------------------------------------

def _detail(err: grpc.aio.AioRpcError) -> pb.ErrorDetail:
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            detail = pb.ErrorDetail()
            status.details[0].Unpack(detail)
            return detail
    raise AssertionError("no ErrorDetail")


def test_grpc_cross_slot_and_moved_with_the_slot():
    peer = "127.0.0.1:7002"
    backend = SplitBackend(0, HALF - 1, address="127.0.0.1:7001", peer=peer)
    here, there = key_in(0, HALF - 1), key_in(HALF, SLOT_COUNT - 1)

    async def body():
        async with serving(backend, grpc_address_of={peer: "127.0.0.1:9002"}.get) as (addr, _, _s):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)

                async def fails(call):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await call
                    return e.value.code(), _detail(e.value)

                await stub.Execute(pb.ExecuteRequest(argv=[b"RPUSH", here.encode(), b"1"]))
                # Keys in two slots: CROSS_SLOT, nothing run (the list keeps its element).
                other = key_in(0, HALF - 1, "o")                # this group's, another slot
                assert key_slot(other.encode()) != key_slot(here.encode())
                for call in (stub.Execute(pb.ExecuteRequest(argv=[b"DEL", here.encode(), other.encode()])),
                             stub.Execute(pb.ExecuteRequest(argv=[b"DEL", here.encode(), there.encode()])),
                             stub.ListMove(pb.ListMoveRequest(source=here.encode(), destination=other.encode())),
                             stub.XRead(pb.XReadRequest(streams=[pb.XReadStream(key=here.encode()),
                                                                 pb.XReadStream(key=other.encode())]))):
                    code, d = await fails(call)
                    assert (code, d.reason, d.retriable) == (grpc.StatusCode.INVALID_ARGUMENT, "CROSS_SLOT", False)
                assert (await stub.ListLen(pb.ListLenRequest(key=here.encode()))).length == 1
                # Another group's slot: MOVED, the slot and that leader's gRPC address.
                slot = key_slot(there.encode())
                for call in (stub.XAdd(pb.XAddRequest(key=there.encode(), entries=[
                                 pb.XAddEntry(fields=[pb.Field(name=b"f", value=b"v")])])),
                             stub.ListLen(pb.ListLenRequest(key=there.encode())),
                             stub.Execute(pb.ExecuteRequest(argv=[b"CLUSTER", b"COUNTKEYSINSLOT", b"%d" % slot]))):
                    code, d = await fails(call)
                    assert (code, d.reason, d.slot, d.leader_address, d.retriable) == (
                        grpc.StatusCode.FAILED_PRECONDITION, "MOVED", slot, "127.0.0.1:9002", True)
                reply = await stub.Execute(pb.ExecuteRequest(argv=[b"CLUSTER", b"COUNTKEYSINSLOT",
                                                                   b"%d" % key_slot(here.encode())]))
                assert reply.reply.integer == 1
    run(body)


class DeposedBackend(SplitBackend):
    """Routes its slots here, but its group has just lost leadership: every write fails as a
    ShardedBackend's does then (NotLeader naming the new leader, and the slot; nothing applied)."""

    async def submit(self, requests):
        from xraft.node.server.backend import NotLeader
        exc = NotLeader(self.peer)
        exc.slot = self.first
        raise exc


def test_a_write_whose_leader_moved_after_routing_is_moved_not_refused():
    """Leadership moved between routing and the write (nothing applied): the reply is the
    redirect routing would give now, -MOVED (-CLUSTERDOWN without a leader), which redis
    cluster clients follow; a bare -NOTLEADER is an error to them. Plain and pipelined."""
    a = ServerThread(lambda: DeposedBackend(0, HALF - 1, peer="127.0.0.1:7009"))
    try:
        here = key_in(0, HALF - 1)
        moved = b"-MOVED 0 127.0.0.1:7009\r\n"
        data, _ = raw_exchange(a.port, ("XADD %s * f v\r\nSET %s 1\r\nSET %s 2\r\n" % (here, here, here)).encode())
        assert data == moved * 3
        a.call(setattr, a.backend, "peer", None)
        data, _ = raw_exchange(a.port, ("SET %s 1\r\n" % here).encode())
        assert data == b"-CLUSTERDOWN The cluster is down\r\n"
    finally:
        a.stop()
