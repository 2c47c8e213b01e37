"""Blocked clients over real sockets: woken by another client's write, timing out,
FIFO per key, served through the log before the reply, failed with a redirect
when leadership is lost, bounded, and forgotten when they disconnect."""
import socket
import threading
import time

import pytest
import redis as redispy

from tests.server.test_resp_encode import ReplyReader
from tests.server.test_resp_server import ServerThread, srv  # noqa: F401  (fixture)
from xraft.node.engine.slots import key_slot
from xraft.node.server.resp import encode_command
from xraft.node.server.resp_server import ServerLimits

pytestmark = pytest.mark.redis


class Raw:
    """A raw RESP connection: send a command, read exactly one reply's bytes."""

    def __init__(self, port, hello3=False):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        if hello3:
            self.call("HELLO", "3")

    def send(self, *argv):
        self.sock.sendall(encode_command(argv))

    def reply(self, timeout=10.0) -> bytes:
        self.sock.settimeout(timeout)
        while True:
            r = ReplyReader(self.buf)
            try:
                r.read()
                out, self.buf = self.buf[:r.pos], self.buf[r.pos:]
                return out
            except (ValueError, IndexError, AssertionError):
                pass
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk

    def silent(self, seconds=0.3) -> bool:
        """True if nothing arrives within `seconds` (still blocked)."""
        self.sock.settimeout(seconds)
        try:
            chunk = self.sock.recv(1 << 16)
        except socket.timeout:
            return True
        self.buf += chunk
        return False

    def call(self, *argv, timeout=10.0):
        self.send(*argv)
        return self.reply(timeout)

    def close(self):
        self.sock.close()


def blocked_clients(srv):
    return srv.call(lambda: srv.server.registry.blocked_clients)


def wait_blocked(srv, n, timeout=10):
    deadline = time.time() + timeout
    while blocked_clients(srv) != n:
        assert time.time() < deadline, "expected %d blocked clients, have %d" % (n, blocked_clients(srv))
        time.sleep(0.01)


@pytest.mark.parametrize("hello3", [False, True])
def test_blpop_woken_by_another_clients_push(srv, hello3):
    a, b = Raw(srv.port, hello3), Raw(srv.port)
    a.send("BLPOP", "{q2}1", "q2", "0")                 # one slot: keys across slots are CROSSSLOT
    wait_blocked(srv, 1)
    assert a.silent()
    assert b.call("RPUSH", "q2", "x", "y") == b":2\r\n"
    assert a.reply() == b"*2\r\n$2\r\nq2\r\n$1\r\nx\r\n"
    assert b.call("LRANGE", "q2", "0", "-1") == b"*1\r\n$1\r\ny\r\n"   # popped exactly once
    assert blocked_clients(srv) == 0


@pytest.mark.parametrize("hello3", [False, True])
def test_timeouts_reply_like_redis(srv, redis, hello3):
    cases = [("BLPOP", "e", "0.1"), ("BRPOP", "e", "{e}f", "0.1"), ("BLMOVE", "e", "{e}d", "LEFT", "RIGHT", "0.1"),
             ("BRPOPLPUSH", "e", "{e}d", "0.1"), ("BLMPOP", "0.1", "1", "e", "LEFT"),
             ("XREAD", "BLOCK", "100", "STREAMS", "s", "$")]
    for argv in cases:
        replies = []
        for port in (redis.port, srv.port):
            c = Raw(port, hello3)
            start = time.monotonic()
            replies.append(c.call(*argv))
            assert time.monotonic() - start >= 0.09, argv
            c.close()
        assert replies[1] == replies[0], argv
    c = Raw(srv.port, hello3)
    for port_conn in (Raw(redis.port, hello3), c):
        port_conn.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    theirs = Raw(redis.port, hello3).call("XREADGROUP", "GROUP", "g", "c", "BLOCK", "100", "STREAMS", "s", ">")
    assert c.call("XREADGROUP", "GROUP", "g", "c", "BLOCK", "100", "STREAMS", "s", ">") == theirs


def test_block_zero_waits_forever_and_other_forms_wake(srv):
    a, b = Raw(srv.port), Raw(srv.port)
    a.send("BLMOVE", "src", "{src}dst", "RIGHT", "LEFT", "0")      # keys in one slot
    wait_blocked(srv, 1)
    assert a.silent(1.2)                          # longer than any default timeout would be
    b.call("RPUSH", "src", "1", "2")
    assert a.reply() == b"$1\r\n2\r\n"
    a.send("BRPOPLPUSH", "{src}2", "{src}dst", "0")
    wait_blocked(srv, 1)
    b.call("LPUSH", "{src}2", "z")
    assert a.reply() == b"$1\r\nz\r\n"
    a.send("BLMPOP", "0", "2", "{m2}1", "m2", "RIGHT", "COUNT", "5")
    wait_blocked(srv, 1)
    b.call("RPUSH", "m2", "a", "b", "c")
    assert a.reply() == b"*2\r\n$2\r\nm2\r\n*3\r\n$1\r\nc\r\n$1\r\nb\r\n$1\r\na\r\n"
    assert b.call("LRANGE", "{src}dst", "0", "-1") == b"*2\r\n$1\r\nz\r\n$1\r\n2\r\n"


def test_fifo_per_key(srv):
    clients = [Raw(srv.port) for _ in range(5)]
    for i, c in enumerate(clients):
        c.send("BLPOP", "fifo", "0")
        wait_blocked(srv, i + 1)                  # arrival order is known
    pusher = Raw(srv.port)
    pusher.call("RPUSH", "fifo", "e0", "e1", "e2")
    got = [c.reply() for c in clients[:3]]
    assert got == [b"*2\r\n$4\r\nfifo\r\n$2\r\ne%d\r\n" % i for i in range(3)]
    assert clients[3].silent() and clients[4].silent()
    pusher.call("RPUSH", "fifo", "e3")
    assert clients[3].reply() == b"*2\r\n$4\r\nfifo\r\n$2\r\ne3\r\n"
    assert clients[4].silent()
    assert blocked_clients(srv) == 1


def test_many_blocked_one_push_serves_one(srv):
    clients = [Raw(srv.port) for _ in range(40)]          # more than one wake batch
    for c in clients:
        c.send("BLPOP", "herd", "0")
    wait_blocked(srv, 40)
    pusher = Raw(srv.port)
    for i in range(40):
        pusher.call("LPUSH", "herd", "v%d" % i)
    got = sorted(c.reply() for c in clients)
    assert got == sorted(b"*2\r\n$4\r\nherd\r\n$%d\r\nv%d\r\n" % (len(str(i)) + 1, i) for i in range(40))
    assert pusher.call("LLEN", "herd") == b":0\r\n"


def test_xread_block_woken_by_xadd(srv):
    c = srv.client(protocol=3)
    other = srv.client()
    other.xadd("xs", {"old": "1"}, id="1-1")
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", c.xread({"xs": "$"}, block=0)))
    t.start()
    wait_blocked(srv, 1)
    other.xadd("xs", {"new": "2"}, id="2-1")
    t.join(10)
    assert out["r"] == {b"xs": [[(b"2-1", {b"new": b"2"})]]}
    # Two readers on one stream both get the entry (XREAD does not consume).
    r1, r2 = Raw(srv.port), Raw(srv.port)
    r1.send("XREAD", "BLOCK", "0", "STREAMS", "xs", "$")
    r2.send("XREAD", "BLOCK", "0", "STREAMS", "xs", "2-1")
    wait_blocked(srv, 2)
    other.xadd("xs", {"f": "v"}, id="3-1")
    expect = b"*1\r\n*2\r\n$2\r\nxs\r\n*1\r\n*2\r\n$3\r\n3-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"
    assert r1.reply() == expect and r2.reply() == expect


def test_xreadgroup_block_served_through_the_log_before_reply(srv):
    c, other = srv.client(), srv.client()
    other.xgroup_create("gs", "g", id="$", mkstream=True)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "r", c.xreadgroup("g", "alice", {"gs": ">"}, block=5000)))
    t.start()
    wait_blocked(srv, 1)
    applied = srv.call(lambda: srv.backend.sm.applied_index)
    other.xadd("gs", {"k": "v"}, id="7-1")
    t.join(10)
    assert out["r"] == [[b"gs", [(b"7-1", {b"k": b"v"})]]]
    # The XADD and the woken XREADGROUP (non-blocking form) are both in the log.
    assert srv.call(lambda: srv.backend.sm.applied_index) == applied + 2
    pending = other.xpending("gs", "g")
    assert pending["pending"] == 1 and pending["consumers"] == [{"name": b"alice", "pending": 1}]


def test_leadership_loss_fails_blocked_clients_with_moved(srv):
    a, x = Raw(srv.port), Raw(srv.port)
    a.send("BLPOP", "lost", "0")
    x.send("XREAD", "BLOCK", "0", "STREAMS", "lostx", "$")
    wait_blocked(srv, 2)
    srv.call(srv.backend.set_role, False, "127.0.0.1:7001")
    assert a.reply() == b"-MOVED %d 127.0.0.1:7001\r\n" % key_slot(b"lost")
    assert x.reply().startswith(b"-MOVED ")
    assert blocked_clients(srv) == 0
    # No leader known at all: CLUSTERDOWN (cluster clients refresh and retry).
    srv.call(srv.backend.set_role, True, None)
    a.send("BLPOP", "lost", "0")
    wait_blocked(srv, 1)
    srv.call(srv.backend.set_role, False, None)
    assert a.reply() == b"-CLUSTERDOWN The cluster is down\r\n"


def test_blocked_clients_limit():
    s = ServerThread(limits=ServerLimits(max_blocked_clients=2))
    try:
        a, b, c = Raw(s.port), Raw(s.port), Raw(s.port)
        a.send("BLPOP", "k", "0")
        b.send("BLPOP", "k", "0")
        wait_blocked(s, 2)
        assert c.call("BLPOP", "k", "0") == b"-ERR xraft: max number of blocked clients reached (2)\r\n"
        assert c.call("RPUSH", "k", "1") == b":1\r\n"
        assert a.reply() == b"*2\r\n$1\r\nk\r\n$1\r\n1\r\n"
    finally:
        s.stop()


def test_disconnected_blocked_client_takes_nothing(srv):
    a, b = Raw(srv.port), Raw(srv.port)
    a.send("BLPOP", "gone", "0")
    b.send("BLPOP", "gone", "0")
    wait_blocked(srv, 2)
    a.close()
    wait_blocked(srv, 1)
    c = srv.client()
    c.rpush("gone", "only")
    assert b.reply() == b"*2\r\n$4\r\ngone\r\n$4\r\nonly\r\n"
    assert c.info("clients")["blocked_clients"] == 0


def test_info_blocked_clients(srv):
    a = Raw(srv.port)
    a.send("BLPOP", "ib", "0")
    wait_blocked(srv, 1)
    assert srv.client().info("clients")["blocked_clients"] == 1
    srv.client().rpush("ib", "v")
    a.reply()
    assert srv.client().info("clients")["blocked_clients"] == 0


def test_blocking_forms_inside_multi_do_not_block(srv, redis):
    replies = []
    for port in (redis.port, srv.port):
        c = Raw(port)
        replies.append([c.call(*argv) for argv in [("MULTI",), ("BLPOP", "mq", "0"), ("BLMOVE", "mq", "{mq}d", "LEFT",
                        "LEFT", "0"), ("XREAD", "BLOCK", "0", "STREAMS", "{mq}x", "$"), ("EXEC",)]])
    assert replies[1] == replies[0]


def test_pipelined_replies_before_a_blocking_command_are_not_held(srv):
    a = Raw(srv.port)
    a.sock.sendall(encode_command(["RPUSH", "pre", "1"]) + encode_command(["BLPOP", "never", "0"]))
    assert a.reply() == b":1\r\n"                # written before BLPOP blocks
    wait_blocked(srv, 1)
    r = redispy.Redis(port=srv.port)
    r.rpush("never", "x")
    assert a.reply() == b"*2\r\n$5\r\nnever\r\n$1\r\nx\r\n"


def test_half_closed_client_gets_its_replies_then_is_closed(srv):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"RPUSH e 1\r\nLLEN e\r\nBLPOP nothing 0\r\nLLEN e\r\n")
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    # As redis: the commands before the blocking one run; the blocked one is dropped with the client.
    assert data == b":1\r\n:1\r\n"
    wait_blocked(srv, 0)
    c = srv.client()
    c.rpush("nothing", "x")
    assert c.llen("nothing") == 1


def test_wake_ups_cost_few_retries(srv):
    clients = [Raw(srv.port) for _ in range(40)]
    for c in clients:
        c.send("BLPOP", "cost", "0")
    wait_blocked(srv, 40)
    before = srv.call(lambda: srv.backend.requests)
    pusher = Raw(srv.port)
    pusher.call("RPUSH", "cost", *["v%d" % i for i in range(40)])
    for c in clients:
        c.reply()
    requests = srv.call(lambda: srv.backend.requests) - before
    # 1 push + 40 served pops + the retries that found the list empty (at most
    # a wake batch per drain, not one per waiter per element).
    assert requests <= 1 + 40 + 2 * srv.server.registry.wake_batch, requests


# -- the gRPC API: blocked reads that lose their key or group wake with redis's errors --

WAKE_S = 10          # a hung call fails the test instead of blocking it


def test_grpc_blocked_xreadgroup_wakes_with_redis_errors():
    """XReadGroup BLOCK 0 over gRPC: the key deleted -> UNBLOCKED, the group
    destroyed -> NOGROUP, both with the texts of a woken redis reader."""
    import asyncio

    from tests.client import run, serving
    from xraft.client import errors
    from xraft.client.aio import Client

    async def blocked_read(c, trigger):
        await c.execute("DEL", "s")
        await c.xgroup_create("s", "g", "$", mkstream=True)
        read = asyncio.ensure_future(c.xreadgroup("g", "alice", {"s": ">"}, block_ms=0))
        await asyncio.sleep(0.2)            # parked (if not, the trigger's error differs below)
        await c.execute(*trigger)
        return await asyncio.wait_for(read, WAKE_S)

    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=30) as c:
                with pytest.raises(errors.UnblockedError, match="^UNBLOCKED the stream key no longer exists$"):
                    await blocked_read(c, ("DEL", "s"))
                with pytest.raises(errors.UnblockedError, match="^UNBLOCKED the stream key no longer exists$"):
                    await blocked_read(c, ("SET", "s", "x"))
                with pytest.raises(errors.NoGroupError,
                                   match="^NOGROUP the consumer group this client was blocked on no longer exists$"):
                    await blocked_read(c, ("XGROUP", "DESTROY", "s", "g"))
    run(body)


def test_grpc_consume_ends_with_unblocked_when_its_stream_is_deleted():
    """A drained Consume session waits on its keys; the stream deleted ends it
    with redis's -UNBLOCKED rather than leaving it waiting forever."""
    import asyncio

    from tests.client import run, serving
    from xraft.client import errors
    from xraft.client.aio import Client

    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=30) as c:
                await c.xgroup_create("s", "g", "0", mkstream=True)
                await c.xadd("s", {"f": "v"}, "1-1")
                async with c.consume(["s"], "g", "w") as session:
                    it = session.__aiter__()
                    d = await asyncio.wait_for(it.__anext__(), WAKE_S)
                    assert await d.ack() == 1
                    nxt = asyncio.ensure_future(it.__anext__())
                    await asyncio.sleep(0.2)        # drained: waiting on s
                    assert await c.execute("DEL", "s") == 1
                    with pytest.raises(errors.UnblockedError, match="stream key no longer exists"):
                        await asyncio.wait_for(nxt, WAKE_S)
    run(body)
