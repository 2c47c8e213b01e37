"""The codec against a real redis-server 7.0: same bytes in, same verdict out.

Requests: raw bytes go to redis over a socket and through RespParser; the
commands redis ran (seen through their replies), the protocol error text and
whether the connection closed must agree. Replies: for commands run with
HELLO 2 and HELLO 3, decoding redis's bytes into the value model and encoding
them again must give redis's bytes back, and (where the reply does not depend
on the clock) the value read in one protocol must encode to redis's bytes in
the other.
"""
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.test_resp_encode import ReplyReader
from xraft.node.engine.errors import EngineError
from xraft.node.engine.replies import NULL_ARRAY
from xraft.node.server.resp import (
    PROTO_INLINE_MAX_SIZE, RespParser, RespProtocolError, encode_command, encode_error, encode_reply,
)

pytestmark = pytest.mark.redis


def _complete(buf: bytes):
    """Replies fully present in buf (a trailing partial one is left out)."""
    r = ReplyReader(buf)
    out = []
    while r.pos < len(buf):
        start = r.pos
        try:
            out.append(r.read())
        except (ValueError, IndexError, AssertionError, KeyError):
            r.pos = start
            break
    return out, buf[r.pos:]


def exchange(port: int, data: bytes, n_replies: int, quiet: float = 0.15):
    """Send raw bytes; read until redis closes, or n_replies arrived and then
    `quiet` seconds pass without more. Returns (raw reply bytes, closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        buf = b""
        while True:
            if len(_complete(buf)[0]) >= n_replies:
                s.settimeout(quiet)
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                return buf, False
            if not chunk:
                return buf, True
            buf += chunk


def parse(data: bytes):
    p = RespParser()
    cmds = []
    try:
        p.feed(data)
        while (c := p.next_command()) is not None:
            cmds.append(c)
    except RespProtocolError as e:
        return cmds, e.message
    return cmds, None


def expected_reply(cmd):
    """What redis answers to the PING/ECHO commands the request cases use."""
    name = cmd[0].upper()
    if name == b"PING" and len(cmd) == 1:
        return b"+PONG\r\n"
    if name in (b"PING", b"ECHO") and len(cmd) == 2:
        return encode_reply(cmd[1], 2)
    raise AssertionError(f"test case parsed to an unexpected command {cmd!r}")


PING = b"*1\r\n$4\r\nPING\r\n"
REQUESTS = [
    # multibulk counts
    b"*\r\n", b"*x\r\n", b"*+1\r\n", b"*-0\r\n", b"*01\r\n", b"* 1\r\n", b"*1 \r\n", b"*2147483648\r\n",
    b"*" + b"9" * 21 + b"\r\n", b"*99999999999999999999\r\n", PING + b"*0\r\n*-1\r\n*-5\r\n" + PING,
    # bulk lengths and the '$'
    b"*1\r\n$\r\n", b"*1\r\n$-1\r\n", b"*1\r\n$-0\r\n", b"*1\r\n$04\r\nPING\r\n", b"*1\r\n$4x\r\n",
    b"*1\r\n$536870913\r\n", b"*1\r\n$99999999999999999999\r\n", b"*1\r\nx\r\n", b"*1\r\n\r\n",
    b"*1\r\n\x80\r\n", b"*1\r\n:4\r\nPING\r\n", PING + b"*2\r\n$4\r\nECHO\r\n*1\r\n",
    # missing CRLFs: redis does not check the bytes it skips
    b"*1\r\n$4\r\nPINGxx" + PING, b"*1\rX$4\rXPING\r\n", b"*2\r\n$4\r\nECHO\r\n$2\r\nhi!!" + PING,
    # incomplete: redis waits, nothing is answered, the connection stays open
    b"*1\r\n$4\r\nPI", b"*1\r", b"*2\r\n$4\r\nECHO\r\n", b"*1\0\r\n$4\r\nPING\r\n", b"PING\0\r\n",
    b"*1\r\n$4\0\r\nPING\r\n",
    # too big lines
    b"*" + b"1" * (PROTO_INLINE_MAX_SIZE + 10), b"*1\r\n$" + b"1" * (PROTO_INLINE_MAX_SIZE + 10),
    b"PING" + b" " * (PROTO_INLINE_MAX_SIZE + 10),
    # inline
    b"PING\r\n\r\n\n  \r\nECHO   hello \r\nPING \"a b\"\n",
    b'ECHO "\\x41\\x4\\xzz\\n\\"q"\r\n', b"ECHO 'it\\'s'\r\n", b"ECHO a\vb\r\n", b"\v\fECHO \fb\r\n",
    b'ECHO ab"c d"\r\n', b'PING "a"b\r\n', b"PING 'a'b\r\n", b'ECHO "abc\r\n', b"ECHO 'abc\r\n",
    b'ECHO "a\\"\r\n', b"ECHO \xe9\xff\r\n", b"PING\r\nECHO \"\r\nPING\r\n",
]


@pytest.mark.parametrize("data", REQUESTS, ids=lambda d: repr(d[:40]))
def test_requests_like_redis(redis_oracle, data):
    cmds, err = parse(data)
    raw, closed = exchange(redis_oracle.port, data, len(cmds) + (err is not None))
    want = b"".join(expected_reply(c) for c in cmds)
    if err is not None:
        want += encode_error(err)
    assert raw == want
    assert closed == (err is not None)


_inline_alphabet = st.sampled_from([b"a", b"b", b"1", b"f", b"x", b"n", b"'", b'"', b"\\", b" ", b"\t", b"\r",
                                    b"\v", b"\f", b"\xff", b"\\x", b"\\n", b"\\'", b'\\"', b"\\x4f"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=st.lists(_inline_alphabet, max_size=14).map(b"".join))
def test_inline_splitting_like_redis(redis_oracle, line):
    """RPUSH the inline arguments, read them back with LRANGE: redis's split must equal ours."""
    redis_oracle.call("DEL", "inl")
    data = b"RPUSH inl " + line + b"\r\n"
    cmds, err = parse(data)
    raw, closed = exchange(redis_oracle.port, data, 1)
    if err is not None:
        assert (raw, closed) == (encode_error(err), True)
        return
    assert len(cmds) == 1 and not closed
    elements = cmds[0][2:]
    if not elements:
        assert raw == b"-ERR wrong number of arguments for 'rpush' command\r\n"
        return
    assert raw == b":%d\r\n" % len(elements)
    assert redis_oracle.call("LRANGE", "inl", 0, -1) == elements


def test_split_reads_of_one_request_like_redis(redis_oracle):
    """A command cut anywhere still runs once in redis and parses once here."""
    data = encode_command([b"ECHO", b"x\r\ny" * 3]) + b"ECHO 'q r'\r\n"
    for cut in range(1, len(data), 3):
        with socket.create_connection(("127.0.0.1", redis_oracle.port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(data[:cut])
            p = RespParser()
            p.feed(data[:cut])
            got = []
            while (c := p.next_command()) is not None:
                got.append(c)
            s.sendall(data[cut:])
            p.feed(data[cut:])
            while (c := p.next_command()) is not None:
                got.append(c)
            want = b"".join(expected_reply(c) for c in got)
            buf = b""
            while len(buf) < len(want):
                buf += s.recv(1 << 16)
            assert buf == want and len(got) == 2


# -- replies -----------------------------------------------------------------
class RawConn:
    def __init__(self, port, protocol):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        hello = self.call(b"HELLO", str(protocol).encode())
        assert b"proto" in hello

    def call(self, *argv) -> bytes:
        """The raw bytes of one reply."""
        self.sock.sendall(encode_command(argv))
        while True:
            done, _ = _complete(self.buf)
            if done:
                r = ReplyReader(self.buf)
                r.read()
                raw, self.buf = self.buf[:r.pos], self.buf[r.pos:]
                return raw
            chunk = self.sock.recv(1 << 16)
            assert chunk, "redis closed the connection"
            self.buf += chunk

    def close(self):
        self.sock.close()


def _decode(raw: bytes):
    r = ReplyReader(raw)
    v = r.read()
    assert r.pos == len(raw)
    return v


# (argv, cross-check): "3to2" = the RESP3 value encodes to redis's RESP2 bytes,
# "2to3" = the RESP2 value encodes to redis's RESP3 bytes (replies with null
# arrays, which RESP3 cannot tell from null bulks), None = clock-dependent reply.
REPLY_CASES = [
    ((b"XRANGE", b"s", b"-", b"+"), "3to2"),
    ((b"XREVRANGE", b"s", b"+", b"-", b"COUNT", b"1"), "3to2"),
    # a map in RESP3 but an array of [key, entries] pairs in RESP2, not a flattened map
    ((b"XREAD", b"COUNT", b"2", b"STREAMS", b"s", b"t", b"0", b"0"), None),
    ((b"XREAD", b"STREAMS", b"s", b"$"), "2to3"),  # null array
    ((b"XREADGROUP", b"GROUP", b"g2", b"c2", b"STREAMS", b"s", b">"), "2to3"),
    ((b"XINFO", b"STREAM", b"s"), "3to2"),
    ((b"XINFO", b"STREAM", b"s", b"FULL"), "3to2"),
    ((b"XINFO", b"GROUPS", b"s"), "3to2"),
    ((b"XINFO", b"CONSUMERS", b"s", b"g"), None),
    ((b"XPENDING", b"s", b"g"), "3to2"),
    ((b"XPENDING", b"s", b"g", b"-", b"+", b"10"), None),
    ((b"XAUTOCLAIM", b"s", b"g", b"c", b"0", b"0-0", b"COUNT", b"5", b"JUSTID"), "3to2"),
    ((b"XLEN", b"s"), "3to2"),
    ((b"GET", b"missing"), "3to2"),
    ((b"XADD", b"z", b"*", b"f", b"v"), "3to2"),  # WRONGTYPE error
    ((b"XGROUP", b"CREATE", b"s", b"g", b"$"), "3to2"),  # BUSYGROUP error
    ((b"ZSCORE", b"z", b"a"), "3to2"),  # a double
    ((b"ZRANGE", b"z", b"0", b"-1", b"WITHSCORES"), None),  # pairs in RESP3, flat in RESP2
    ((b"ZINCRBY", b"z", b"0", b"inf"), "3to2"),
    ((b"EVAL", b"redis.setresp(3); return {true, false, 1.5}", b"0"), "3to2"),
    ((b"CONFIG", b"GET", b"maxmemory-policy"), "3to2"),
    ((b"SET", b"k", b"v"), "3to2"),
]


@pytest.fixture(scope="module")
def reply_conns(redis_oracle):
    o = redis_oracle
    o.reset()
    for i in range(5):
        o.call("XADD", "s", f"{i + 1}-0", "field", f"v{i}", "n", str(i))
    o.call("XADD", "t", "1-1", "a", "b")
    o.call("XGROUP", "CREATE", "s", "g", "0")
    o.call("XREADGROUP", "GROUP", "g", "c", "COUNT", "2", "STREAMS", "s", ">")
    o.call("XGROUP", "CREATE", "s", "g2", "$")
    o.call("XREADGROUP", "GROUP", "g2", "c2", "STREAMS", "s", ">")
    o.call("ZADD", "z", "0.1", "a", "1.5", "b", "-3e20", "c")
    conns = {2: RawConn(o.port, 2), 3: RawConn(o.port, 3)}
    yield conns
    for c in conns.values():
        c.close()
    o.reset()


@pytest.mark.parametrize("argv, cross", REPLY_CASES, ids=lambda x: b" ".join(x[:3]).decode()
                         if isinstance(x, tuple) else str(x))
def test_replies_like_redis(reply_conns, argv, cross):
    raw2 = reply_conns[2].call(*argv)
    raw3 = reply_conns[3].call(*argv)
    v2, v3 = _decode(raw2), _decode(raw3)
    assert encode_reply(v2, 2) == raw2
    assert encode_reply(v3, 3) == raw3
    if cross == "3to2":
        assert encode_reply(v3, 2) == raw2
    elif cross == "2to3":
        assert encode_reply(v2, 3) == raw3
    if isinstance(v3, EngineError):
        assert encode_error(v3.message) == raw3


def test_reply_shapes_are_what_the_engine_model_says(reply_conns):
    """The decoded values really exercise maps, doubles, booleans and both nulls."""
    v = _decode(reply_conns[3].call(b"XINFO", b"STREAM", b"s"))
    assert isinstance(v, dict) and v[b"length"] == 5
    assert _decode(reply_conns[2].call(b"XREAD", b"STREAMS", b"s", b"$")) is NULL_ARRAY
    assert _decode(reply_conns[3].call(b"XREAD", b"STREAMS", b"s", b"$")) is None
    assert _decode(reply_conns[3].call(b"ZSCORE", b"z", b"a")) == 0.1
    assert _decode(reply_conns[3].call(b"EVAL", b"redis.setresp(3); return true", b"0")) is True
    assert _decode(reply_conns[2].call(b"GET", b"missing")) is None
    # XREAD: a map in RESP3, but [key, entries] pairs (not a flat map) in RESP2
    argv = (b"XREAD", b"STREAMS", b"s", b"t", b"4", b"0")
    pairs, m = _decode(reply_conns[2].call(*argv)), _decode(reply_conns[3].call(*argv))
    assert list(m) == [b"s", b"t"] and pairs == [[k, x] for k, x in m.items()]


def test_engine_xread_replies_encode_like_redis_in_both_protocols(reply_conns):
    """XREAD/XREADGROUP are PairMaps in the engine: RESP3 map, RESP2 [key, entries] pairs."""
    from xraft.node.engine.commands import execute
    from xraft.node.engine.keyspace import Keyspace

    db = Keyspace()
    for i in range(5):
        execute(db, [b"XADD", b"s", b"%d-0" % (i + 1), b"field", b"v%d" % i, b"n", b"%d" % i], 0)
    execute(db, [b"XADD", b"t", b"1-1", b"a", b"b"], 0)
    argv = [b"XREAD", b"STREAMS", b"s", b"t", b"4", b"0"]
    reply = execute(db, argv, 0)
    assert encode_reply(reply, 2) == reply_conns[2].call(*argv)
    assert encode_reply(reply, 3) == reply_conns[3].call(*argv)
    execute(db, [b"XGROUP", b"CREATE", b"s", b"gx", b"0"], 0)
    reply_conns[2].call(b"XGROUP", b"CREATE", b"s", b"gx", b"0")
    reply_conns[2].call(b"XGROUP", b"CREATE", b"s", b"gy", b"0")
    execute(db, [b"XGROUP", b"CREATE", b"s", b"gy", b"0"], 0)
    for proto, group in ((2, b"gx"), (3, b"gy")):
        argv = [b"XREADGROUP", b"GROUP", group, b"c", b"COUNT", b"2", b"STREAMS", b"s", b">"]
        reply = execute(db, argv, 0)
        assert encode_reply(reply, proto) == reply_conns[proto].call(*argv)
