"""CLUSTER SLOTS/SHARDS/NODES/MYID/KEYSLOT shapes, -MOVED from a follower, and
redis-py's RedisCluster following the leader (also across a leadership change)."""
import pytest
import redis as redispy
from redis.cluster import RedisCluster

from tests.server.test_resp_server import ServerThread, raw_exchange
from xraft.node.engine.slots import key_slot
from xraft.node.server.backend import LocalBackend, cluster_node_id

pytestmark = pytest.mark.redis


@pytest.fixture
def pair():
    """A "leader" and a follower that names it (two LocalBackends: no replication)."""
    leader = ServerThread()
    follower = ServerThread(lambda: LocalBackend(leader=False, leader_address=leader.address))
    yield leader, follower
    follower.stop()
    leader.stop()


def _node(port, node_id, meta):
    return b"*4\r\n$9\r\n127.0.0.1\r\n:%d\r\n$40\r\n%s\r\n%s" % (port, node_id.encode(), meta)


def test_cluster_slots_shapes(pair):
    leader, follower = pair
    lid, fid = cluster_node_id(leader.address), cluster_node_id(follower.address)
    data, _ = raw_exchange(leader.port, b"CLUSTER SLOTS\r\nHELLO 3\r\nCLUSTER SLOTS\r\n")
    resp2 = b"*1\r\n*3\r\n:0\r\n:16383\r\n" + _node(leader.port, lid, b"*0\r\n")
    resp3 = b"*1\r\n*3\r\n:0\r\n:16383\r\n" + _node(leader.port, lid, b"%0\r\n")
    assert data.startswith(resp2) and data.endswith(resp3)
    data, _ = raw_exchange(follower.port, b"CLUSTER SLOTS\r\n")
    assert data == (b"*1\r\n*4\r\n:0\r\n:16383\r\n" + _node(leader.port, lid, b"*0\r\n")
                    + _node(follower.port, fid, b"*0\r\n"))


def test_cluster_shards_nodes_myid_keyslot(pair):
    leader, follower = pair
    lid, fid = cluster_node_id(leader.address), cluster_node_id(follower.address)
    data, _ = raw_exchange(leader.port, b"CLUSTER SHARDS\r\n")
    assert data == (b"*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*14\r\n"
                    b"$2\r\nid\r\n$40\r\n" + lid.encode() + b"\r\n$4\r\nport\r\n:%d\r\n" % leader.port +
                    b"$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n"
                    b"$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n")
    c = follower.client()
    text = raw_exchange(follower.port, b"CLUSTER NODES\r\n")[0]
    body = ("%s 127.0.0.1:%d@%d master - 0 0 0 connected 0-16383\n"
            "%s 127.0.0.1:%d@%d myself,slave %s 0 0 0 connected\n" % (
                lid, leader.port, leader.port + 10000, fid, follower.port, follower.port + 10000, lid)).encode()
    assert text == b"$%d\r\n%s\r\n" % (len(body), body)
    text3 = raw_exchange(follower.port, b"HELLO 3\r\nCLUSTER NODES\r\n")[0]
    assert text3.endswith(b"=%d\r\ntxt:%s\r\n" % (len(body) + 4, body))
    assert raw_exchange(follower.port, b"CLUSTER MYID\r\n")[0] == b"$40\r\n%s\r\n" % fid.encode()
    assert c.cluster("KEYSLOT", "foo") == 12182 == key_slot(b"foo")
    assert raw_exchange(leader.port, b"CLUSTER KEYSLOT\r\nCLUSTER NOSUCH\r\n")[0] == (
        b"-ERR wrong number of arguments for 'cluster|keyslot' command\r\n"
        b"-ERR unknown subcommand 'NOSUCH'. Try CLUSTER HELP.\r\n")
    info = c.cluster("INFO")
    assert info["cluster_state"] == "ok" and int(info["cluster_slots_assigned"]) == 16384


def test_follower_replies_moved_for_key_commands(pair):
    leader, follower = pair
    data, closed = raw_exchange(follower.port, b"RPUSH {a}x 1\r\nGET foo\r\nXREAD STREAMS {s}1 {s}2 0 0\r\n"
                                b"XREAD STREAMS s1 s2 0 0\r\nPING\r\nFLUSHALL\r\nINFO replication\r\n")
    # Every key is hashed: one slot moves, keys in two slots are CROSSSLOT even on a replica.
    assert data.startswith(b"-MOVED %d %s\r\n-MOVED 12182 %s\r\n-MOVED %d %s\r\n"
                           b"-CROSSSLOT Keys in request don't hash to the same slot\r\n+PONG\r\n-NOTLEADER %s\r\n" % (
                               key_slot(b"a"), leader.address.encode(), leader.address.encode(), key_slot(b"s"),
                               leader.address.encode(), leader.address.encode()))
    assert b"role:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:%d\r\n" % leader.port in data
    # A queued key command redirected inside MULTI dooms the transaction, as in redis cluster.
    data, _ = raw_exchange(follower.port, b"MULTI\r\nRPUSH k 1\r\nEXEC\r\n")
    assert data == (b"+OK\r\n-MOVED %d %s\r\n-EXECABORT Transaction discarded because of previous errors.\r\n"
                    % (key_slot(b"k"), leader.address.encode()))
    # READONLY lets a follower serve reads (possibly stale); writes still move.
    data, _ = raw_exchange(follower.port, b"READONLY\r\nLLEN k\r\nRPUSH k 1\r\nREADWRITE\r\nLLEN k\r\n")
    assert data.startswith(b"+OK\r\n:0\r\n-MOVED ") and data.endswith(b"+OK\r\n-MOVED %d %s\r\n" % (
        key_slot(b"k"), leader.address.encode()))


def test_redis_cluster_client_follows_the_leader(pair):
    leader, follower = pair
    rc = RedisCluster(host="127.0.0.1", port=follower.port, socket_timeout=10)
    try:
        assert rc.rpush("rc-list", "a", "b") == 2
        assert rc.xadd("rc-stream", {"f": "v"}, id="1-1") == b"1-1"
        assert rc.lrange("rc-list", 0, -1) == [b"a", b"b"]
        assert rc.xread({"rc-stream": "0"}) == [[b"rc-stream", [(b"1-1", {b"f": b"v"})]]]
        # The writes landed on the leader, not on the follower it was pointed at.
        assert leader.client().llen("rc-list") == 2
        assert redispy.Redis(port=follower.port).execute_command("READONLY") in (True, b"OK")
        # Leadership moves to the other server: the old leader answers -MOVED and
        # the client follows it.
        follower.call(follower.backend.set_role, True, None)
        leader.call(leader.backend.set_role, False, follower.address)
        assert rc.rpush("rc-list", "c") == 1          # served by the new leader's (empty) state
        assert follower.client().lrange("rc-list", 0, -1) == [b"c"]
        # The old leader took no write (READONLY: it serves its own state).
        assert raw_exchange(leader.port, b"READONLY\r\nLLEN rc-list\r\n")[0] == b"+OK\r\n:2\r\n"
    finally:
        rc.close()
