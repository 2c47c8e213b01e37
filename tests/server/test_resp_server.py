"""The RESP server over real sockets, spoken to by redis-py (RESP2 and RESP3).

The server runs with a LocalBackend on its own uvloop event loop in a
background thread (`ServerThread`); the other test_resp_server_*.py files
reuse that harness. Replies are compared with a real redis-server 7.0 (the
`redis` fixture) wherever the reply does not depend on the clock.
"""
import asyncio
import socket
import threading
import time

import pytest
import redis as redispy

from xraft.node.server.backend import LocalBackend
from xraft.node.server.resp_server import RespServer, ServerLimits
from tests.server.slot_tags import one_slot

pytestmark = pytest.mark.redis


class ServerThread:
    """A RespServer + LocalBackend on a uvloop loop in a daemon thread."""

    def __init__(self, backend_factory=LocalBackend, **server_kwargs):
        import uvloop
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start():
            self.backend = backend_factory()
            self.server = RespServer(self.backend, "127.0.0.1", 0, **server_kwargs)
            await self.server.start()

        self.run(start())
        self.port = self.server.port
        self.address = "127.0.0.1:%d" % self.port

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args):
        """fn(*args) on the server's loop; its result."""
        async def wrapper():
            return fn(*args)
        return self.run(wrapper())

    def client(self, protocol=2, **kw):
        return redispy.Redis(port=self.port, protocol=protocol, socket_timeout=20, **kw)

    def stop(self):
        try:
            self.run(self.server.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def srv():
    s = ServerThread()
    yield s
    s.stop()


def raw_exchange(port, data: bytes, quiet=0.3):
    """Send raw bytes; everything the server sends until it closes (closed=True)
    or stays quiet for `quiet` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.settimeout(quiet)
        buf = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                return buf, False
            except ConnectionResetError:
                return buf, True
            if not chunk:
                return buf, True
            buf += chunk


def both(redis_oracle_port, port, protocol, fn):
    """fn(client) against redis-server and against xraft: (redis's, ours),
    exceptions as values (type name and message)."""
    out = []
    for p in (redis_oracle_port, port):
        c = redispy.Redis(port=p, protocol=protocol, socket_timeout=20)
        try:
            out.append(fn(c))
        except redispy.RedisError as e:
            out.append((type(e).__name__, str(e)))
        finally:
            c.close()
    return out


# -- round trips against redis-server -------------------------------------------------

STREAM_SCRIPT = [
    ("XADD", "s", "1-1", "a", "1"),
    ("XADD", "s", "1-2", "b", "2", "c", "3"),
    ("XADD", "s", "2-0", "d", "4"),
    ("XLEN", "s"),
    ("XRANGE", "s", "-", "+"),
    ("XREVRANGE", "s", "+", "-", "COUNT", "2"),
    ("XREAD", "COUNT", "2", "STREAMS", "s", "0"),
    ("XGROUP", "CREATE", "s", "g", "0"),
    ("XREADGROUP", "GROUP", "g", "alice", "COUNT", "2", "STREAMS", "s", ">"),
    ("XACK", "s", "g", "1-1"),
    ("XDEL", "s", "1-2"),
    ("XTRIM", "s", "MAXLEN", "1"),
    ("XADD", "s", "1-0", "x", "y"),
    ("XADD", "s"),
    ("XREAD", "STREAMS", "s"),
    ("XGROUP", "CREATE", "s", "g", "0"),
    ("XREADGROUP", "GROUP", "nosuch", "c", "STREAMS", "s", ">"),
    ("TYPE", "s"),
    ("LPUSH", "s", "x"),
]
LIST_SCRIPT = [
    ("RPUSH", "l", "a", "b", "c", "d"),
    ("LPUSH", "l", "z"),
    ("LRANGE", "l", "0", "-1"),
    ("LPOP", "l"),
    ("RPOP", "l", "2"),
    ("LLEN", "l"),
    ("LINSERT", "l", "BEFORE", "b", "q"),
    ("LPOS", "l", "q"),
    ("LINDEX", "l", "0"),
    ("LSET", "l", "0", "w"),
    ("LMOVE", "l", "m", "LEFT", "RIGHT"),
    ("LMPOP", "2", "nosuch", "l", "LEFT", "COUNT", "5"),
    ("LMPOP", "1", "nosuch", "LEFT"),
    ("EXISTS", "l", "m"),
    ("DEL", "m"),
    ("SET", "k", "v"),
    ("GET", "k"),
    ("LPUSH", "k", "x"),
    ("RENAME", "nosuch", "x"),
    ("RPUSH", "l", "p", "q"),
    ("LTRIM", "l", "0", "0"),
    ("BLPOP", "nosuch", "l", "0"),
    ("BRPOP", "l", "0.01"),
    ("DBSIZE",),
]


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("script", [STREAM_SCRIPT, LIST_SCRIPT], ids=["streams", "lists"])
def test_commands_match_redis(srv, redis, protocol, script):
    for argv in script:
        argv = one_slot(argv)                 # multi-key commands (LMOVE l m) in one slot
        theirs, ours = both(redis.port, srv.port, protocol, lambda c: c.execute_command(*argv))
        assert ours == theirs, argv


def test_unknown_command_and_arity_keep_the_connection(srv, redis):
    for argv in [("NOSUCH", "a", "b"), ("GET",), ("XADD", "s"), ("CLIENT", "NOSUCH"), ("CONFIG", "GET"),
                 ("COMMAND", "COUNT", "x"), ("SELECT", "x"), ("ECHO",), ("PING", "a", "b"),
                 ("CLUSTER", "KEYSLOT"), ("HELLO", "4"), ("HELLO", "x"), ("HELLO", "2", "FOO"),
                 ("CLIENT", "SETNAME", "a b"), ("EXEC",), ("DISCARD",), ("AUTH", "a", "b", "c")]:
        theirs, ours = both(redis.port, srv.port, 2, lambda c: c.execute_command(*argv))
        assert ours == theirs, argv
    c = srv.client()
    with pytest.raises(redispy.ResponseError, match="unknown command 'NOSUCH'"):
        c.execute_command("NOSUCH")
    assert c.ping() is True


def test_select_only_db_zero(srv):
    c = srv.client()
    assert c.execute_command("SELECT", "0") is True
    with pytest.raises(redispy.ResponseError, match="^DB index is out of range$"):
        c.execute_command("SELECT", "1")


def test_pipelining_replies_in_order(srv):
    c = srv.client()
    p = c.pipeline(transaction=False)
    for i in range(500):
        p.rpush("pl", i)
        p.llen("pl")
    p.lrange("pl", 0, 2)
    p.xadd("ps", {"f": "v"}, id="5-1")
    p.xlen("ps")
    out = p.execute()
    assert out[:4] == [1, 1, 2, 2] and out[996:998] == [499, 499]
    assert out[1000:] == [[b"0", b"1", b"2"], b"5-1", 1]
    # Raw pipelined bytes in one write, inline and multibulk mixed.
    data, closed = raw_exchange(srv.port, b"PING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nLLEN pl\r\n")
    assert data == b"+PONG\r\n$2\r\nhi\r\n:500\r\n" and not closed


def test_group_commit_batches_concurrent_writers(srv):
    clients = [srv.client() for _ in range(20)]
    before = srv.call(lambda: srv.backend.records)
    threads = [threading.Thread(target=lambda c=c: [c.rpush("gc", 1) for _ in range(50)]) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = srv.call(lambda: srv.backend.records) - before
    assert clients[0].llen("gc") == 1000
    assert records < 1000                       # several writers shared records
    assert srv.call(lambda: srv.backend.max_batch) > 1


def test_multi_exec(srv, redis):
    def tx(c):
        p = c.pipeline(transaction=True)
        p.rpush("t", "a", "b")
        p.lpop("t")
        p.xadd("{t}s", {"f": "v"}, id="1-1")   # the slot of "t": EXEC routes every key
        p.set("t", "x")                       # runtime error inside EXEC is an element
        p.lpush("t", "y")
        return p.execute(raise_on_error=False)

    theirs, ours = both(redis.port, srv.port, 2, tx)
    assert [str(x) if isinstance(x, Exception) else x for x in ours] == \
        [str(x) if isinstance(x, Exception) else x for x in theirs]

    for port in (redis.port, srv.port):
        c = redispy.Redis(port=port)
        conn = c.connection_pool.get_connection()
        conn.send_command("MULTI")
        assert conn.read_response() == b"OK"
        conn.send_command("RPUSH", "q", "1")
        assert conn.read_response() == b"QUEUED"
        conn.send_command("MULTI")
        with pytest.raises(redispy.ResponseError, match="MULTI calls can not be nested"):
            conn.read_response()
        conn.send_command("NOSUCH")
        with pytest.raises(redispy.ResponseError, match="unknown command"):
            conn.read_response()
        conn.send_command("EXEC")
        with pytest.raises(redispy.ResponseError, match="^Transaction discarded because of previous errors.$"):
            conn.read_response()
        conn.send_command("LLEN", "q")
        assert conn.read_response() == 0      # nothing of the aborted transaction ran
        conn.send_command("MULTI")
        conn.read_response()
        conn.send_command("DISCARD")
        assert conn.read_response() == b"OK"
        c.connection_pool.release(conn)
        c.close()


def test_auth_and_requirepass(redis):
    s = ServerThread(requirepass="sekret")
    try:
        # Unknown command and arity come before NOAUTH, as in redis.
        data, closed = raw_exchange(s.port, b"NOSUCH\r\nGET\r\nGET k\r\nMULTI\r\nHELLO 3\r\n"
                                    b"AUTH wrong\r\nAUTH bob sekret\r\nAUTH sekret\r\nGET k\r\n"
                                    b"AUTH default sekret\r\nQUIT\r\nPING\r\n")
        assert data == (b"-ERR unknown command 'NOSUCH', with args beginning with: \r\n"
                        b"-ERR wrong number of arguments for 'get' command\r\n"
                        b"-NOAUTH Authentication required.\r\n"
                        b"-NOAUTH Authentication required.\r\n"
                        b"-NOAUTH HELLO must be called with the client already authenticated, otherwise the "
                        b"HELLO AUTH <user> <pass> option can be used to authenticate the client and select "
                        b"the RESP protocol version at the same time\r\n"
                        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
                        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
                        b"+OK\r\n$-1\r\n+OK\r\n+OK\r\n")
        assert closed                           # QUIT: +OK, then the connection closes
        # Unauthenticated clients get redis's tighter parser limits.
        data, closed = raw_exchange(s.port, b"*20\r\n")
        assert data == b"-ERR Protocol error: unauthenticated multibulk length\r\n" and closed
        for proto in (2, 3):
            ok = redispy.Redis(port=s.port, password="sekret", protocol=proto)
            assert ok.rpush("l%d" % proto, "a") == 1 and ok.lrange("l%d" % proto, 0, -1) == [b"a"]
            ok.close()
        data, _ = raw_exchange(s.port, b"HELLO 3 AUTH default nope\r\nHELLO 3 AUTH default sekret SETNAME x\r\n")
        assert data.startswith(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n%7\r\n")
    finally:
        s.stop()


def test_hello_maps(srv):
    c3 = srv.client(protocol=3)
    hello = c3.execute_command("HELLO", "3")
    assert list(hello) == [b"server", b"version", b"proto", b"id", b"mode", b"role", b"modules"]
    assert hello[b"server"] == b"redis" and hello[b"version"] == b"7.0.15" and hello[b"proto"] == 3
    assert hello[b"modules"] == [] and hello[b"role"] == b"master"
    assert hello[b"id"] == c3.client_id()
    # In RESP3 a map stays a map; XINFO-like dict replies and CONFIG GET come back as dicts.
    assert c3.config_get("stream-node-max-entries") == {"stream-node-max-entries": "100"}
    c2 = srv.client(protocol=2)
    assert c2.execute_command("HELLO", "2", "SETNAME", "me")[:2] == [b"server", b"redis"]
    assert c2.client_getname() == "me"
    data, _ = raw_exchange(srv.port, b"HELLO 3\r\nPING\r\nLPOP nosuch\r\nCLIENT GETNAME\r\nHELLO 2\r\nLPOP nosuch\r\n")
    assert data.startswith(b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n")
    assert data.endswith(b"+PONG\r\n_\r\n_\r\n*14\r\n" + data.split(b"*14\r\n", 1)[1].split(b"$-1")[0] + b"$-1\r\n")


def test_client_commands(srv):
    c = srv.client()
    cid = c.client_id()
    assert isinstance(cid, int) and cid > 0
    assert c.client_getname() is None
    assert c.client_setname("worker-1") is True
    assert c.client_getname() == "worker-1"
    with pytest.raises(redispy.ResponseError, match="cannot contain spaces"):
        c.client_setname("a b")
    info = c.client_info()
    assert info["id"] == cid and info["name"] == "worker-1"
    assert any(x["name"] == "worker-1" for x in c.client_list())


def test_config_get_and_set_through_the_log(srv, redis):
    c = srv.client()
    assert c.config_get("stream-node-*") == {"stream-node-max-bytes": "4096", "stream-node-max-entries": "100"}
    applied = srv.call(lambda: srv.backend.sm.applied_index)
    assert c.config_set("stream-node-max-entries", 7) is True
    assert srv.call(lambda: srv.backend.sm.applied_index) == applied + 1       # one log record
    assert c.config_get("stream-node-max-entries") == {"stream-node-max-entries": "7"}
    for argv in [("CONFIG", "SET", "stream-node-max-entries", "x"), ("CONFIG", "SET", "nosuch", "1"),
                 ("CONFIG", "SET", "list-compress-depth"), ("CONFIG", "GET", "nosuch"), ("CONFIG", "NOSUCH")]:
        theirs, ours = both(redis.port, srv.port, 2, lambda cl: cl.execute_command(*argv))
        assert ours == theirs, argv
    assert c.config_get("save") == {"save": ""}


def test_info_sections(srv):
    c = srv.client()
    c.rpush("a", 1)
    c.xadd("b", {"f": "v"})
    info = c.info("everything")
    assert info["redis_version"] == "7.0.15"
    assert info["role"] == "master" and info["cluster_enabled"] == 1
    assert info["db0"] == {"keys": 2, "expires": 0, "avg_ttl": 0}
    assert info["connected_clients"] >= 1 and info["blocked_clients"] == 0
    assert info["raft_role"] == "leader" and info["raft_applied_index"] >= 2
    assert set(c.info("clients")) >= {"connected_clients", "blocked_clients", "maxclients"}
    assert "redis_version" not in c.info("clients")
    data, _ = raw_exchange(srv.port, b"HELLO 3\r\nINFO server\r\n")
    text = data.split(b"\r\n=", 1)[1]
    n, body = text.split(b"\r\n", 1)
    assert body.startswith(b"txt:# Server\r\nredis_version:7.0.15\r\n")
    assert len(body) == int(n) + 2


def test_command_introspection(srv):
    c = srv.client()
    count = c.command_count()
    cmds = c.command()
    assert len(cmds) == count and {"xadd", "blpop", "multi", "cluster", "info"} <= set(cmds)
    assert cmds["xadd"]["first_key_pos"] == 1 and "write" in cmds["xadd"]["flags"]
    assert "movablekeys" in cmds["xread"]["flags"]
    assert c.command_getkeys("XREAD", "STREAMS", "a", "b", "0", "0") == ["a", "b"]
    assert c.command_getkeys("LMPOP", "2", "x", "y", "LEFT") == ["x", "y"]
    with pytest.raises(redispy.ResponseError, match="^Invalid number of arguments specified for command$"):
        c.command_getkeys("GET", "a", "b")
    data, _ = raw_exchange(srv.port, b"COMMAND INFO get nosuch\r\n")
    assert data == (b"*2\r\n*10\r\n$3\r\nget\r\n:2\r\n*1\r\n$8\r\nreadonly\r\n:1\r\n:1\r\n:1\r\n"
                    b"*0\r\n*0\r\n*0\r\n*0\r\n$-1\r\n")
    data, _ = raw_exchange(srv.port, b"COMMAND DOCS xadd nosuch\r\n")
    assert data.startswith(b"*2\r\n$4\r\nxadd\r\n*8\r\n$7\r\nsummary\r\n") and b"$6\r\nstream\r\n" in data


def test_protocol_error_replies_then_closes(srv):
    for bad, text in [(b"*1\r\n$x\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
                      (b"*abc\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
                      (b'SET "a\r\n', b"-ERR Protocol error: unbalanced quotes in request\r\n")]:
        data, closed = raw_exchange(srv.port, b"PING\r\n" + bad + b"PING\r\n")
        assert data == b"+PONG\r\n" + text and closed, bad
    c = srv.client()
    assert c.ping()                                 # the server itself is fine


def test_max_clients():
    s = ServerThread(limits=ServerLimits(max_clients=2))
    try:
        a, b = socket.create_connection(("127.0.0.1", s.port)), socket.create_connection(("127.0.0.1", s.port))
        a.sendall(b"PING\r\n"), b.sendall(b"PING\r\n")
        assert a.recv(100) == b"+PONG\r\n" and b.recv(100) == b"+PONG\r\n"
        data, closed = raw_exchange(s.port, b"PING\r\n")
        assert data == b"-ERR max number of clients reached\r\n" and closed
        a.close()
        deadline = time.time() + 5
        while True:                                 # the slot frees once the server saw the close
            data, closed = raw_exchange(s.port, b"PING\r\n", quiet=0.2)
            if data == b"+PONG\r\n" or time.time() > deadline:
                break
        assert data == b"+PONG\r\n"
        b.close()
    finally:
        s.stop()


def test_output_buffer_limit_closes_a_client_that_does_not_read():
    s = ServerThread(limits=ServerLimits(output_buffer_limit=1 << 20, output_soft_limit=1 << 20))
    try:
        c = s.client()
        c.rpush("big", *([b"x" * 1000] * 1000))          # LRANGE big = ~1 MB per reply
        c.close()
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        req = b"LRANGE big 0 -1\r\n" * 200
        sock.sendall(req)                                # and never read
        deadline = time.time() + 20
        while time.time() < deadline:
            n = s.call(lambda: len(s.server.clients))
            if n == 0:
                break
            time.sleep(0.05)
        assert s.call(lambda: len(s.server.clients)) == 0
        sock.close()
    finally:
        s.stop()
