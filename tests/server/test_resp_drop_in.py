"""What redis tools and test harnesses send on connect or between tests, against
a real redis-server 7.0: WATCH/UNWATCH with MULTI/EXEC, CONFIG SET/GET of the
persistence and limit settings, FUNCTION, CLIENT LIST/KILL/..., OBJECT, DEBUG.

Each script runs the same commands on the same connections (A, B ...) against
redis-server and against xraft (LocalBackend), and the raw reply bytes of every
step must be identical, in RESP2 and RESP3.
"""
import time

import pytest

from tests.redis_oracle import RedisOracle
from tests.server.slot_tags import one_slot
from tests.server.test_resp_server import raw_exchange, srv  # noqa: F401  (fixture)
from tests.server.test_resp_vs_redis import RawConn

pytestmark = pytest.mark.redis


def run_script(port, protocol, steps, conns="AB"):
    """[(conn, argv)] -> the raw reply bytes of each step. Keys are put in one
    slot (slot_tags.py): these scripts are about WATCH and MULTI, not routing."""
    open_ = {name: RawConn(port, protocol) for name in conns}
    try:
        return [open_[who].call(*[a.encode() if isinstance(a, str) else a for a in one_slot(argv)])
                for who, argv in steps]
    finally:
        for c in open_.values():
            c.close()


def assert_like_redis(redis, srv, steps, protocols=(2, 3), conns="AB"):
    for protocol in protocols:
        redis.call("FLUSHALL")
        srv.client().flushall()
        theirs = run_script(redis.port, protocol, steps, conns)
        ours = run_script(srv.port, protocol, steps, conns)
        for step, t, o in zip(steps, theirs, ours):
            assert o == t, (protocol, step, steps)


def S(*words):
    return tuple(words)


# -- WATCH ------------------------------------------------------------------------------

WATCH_SCRIPTS = {
    "modified by another client": [
        ("A", S("WATCH", "x")), ("B", S("SET", "x", "1")), ("A", S("MULTI")), ("A", S("SET", "y", "1")),
        ("A", S("EXEC")), ("A", S("GET", "y"))],
    "unmodified runs": [
        ("A", S("SET", "x", "0")), ("A", S("WATCH", "x", "nosuch")), ("B", S("GET", "x")),
        ("A", S("MULTI")), ("A", S("SET", "y", "1")), ("A", S("EXEC")), ("A", S("GET", "y"))],
    "unwatch clears": [
        ("A", S("WATCH", "x")), ("A", S("UNWATCH")), ("B", S("SET", "x", "2")), ("A", S("MULTI")),
        ("A", S("SET", "y", "2")), ("A", S("EXEC"))],
    "deleted, empty transaction": [
        ("A", S("SET", "y", "1")), ("A", S("WATCH", "y")), ("B", S("DEL", "y")), ("A", S("MULTI")),
        ("A", S("EXEC"))],
    "flush of an absent key does not abort": [
        ("A", S("WATCH", "nosuch")), ("B", S("FLUSHALL")), ("A", S("MULTI")), ("A", S("PING")),
        ("A", S("EXEC"))],
    "flush of a present key aborts": [
        ("A", S("RPUSH", "l", "a")), ("A", S("WATCH", "l")), ("B", S("FLUSHDB")), ("A", S("MULTI")),
        ("A", S("LLEN", "l")), ("A", S("EXEC"))],
    "watch inside multi is refused without flagging it, discard clears": [
        ("A", S("WATCH", "x")), ("A", S("MULTI")), ("A", S("WATCH", "y")), ("A", S("DISCARD")),
        ("B", S("SET", "x", "3")), ("A", S("MULTI")), ("A", S("SET", "x", "4")), ("A", S("WATCH", "x")),
        ("A", S("EXEC")), ("A", S("GET", "x"))],
    "stream appended": [
        ("A", S("WATCH", "s")), ("B", S("XADD", "s", "1-1", "f", "v")), ("A", S("MULTI")),
        ("A", S("XLEN", "s")), ("A", S("EXEC")), ("A", S("XLEN", "s"))],
    "no-op writes do not abort": [
        ("A", S("SET", "k", "1")), ("A", S("WATCH", "k", "s", "l")),
        ("B", S("SET", "k", "2", "NX")), ("B", S("XADD", "s", "NOMKSTREAM", "*", "f", "v")),
        ("B", S("LPOP", "l")), ("B", S("DEL", "l")), ("A", S("MULTI")), ("A", S("GET", "k")),
        ("A", S("EXEC"))],
    "own write aborts": [
        ("A", S("WATCH", "k")), ("A", S("SET", "k", "own")), ("A", S("MULTI")), ("A", S("GET", "k")),
        ("A", S("EXEC"))],
    "rename target": [
        ("A", S("SET", "r", "1")), ("A", S("WATCH", "r2")), ("B", S("RENAME", "r", "r2")),
        ("A", S("MULTI")), ("A", S("GET", "r2")), ("A", S("EXEC"))],
    "list pop and push": [
        ("A", S("RPUSH", "l", "a", "b")), ("A", S("WATCH", "l")), ("B", S("LMOVE", "l", "m", "LEFT", "LEFT")),
        ("A", S("MULTI")), ("A", S("LLEN", "l")), ("A", S("EXEC")), ("A", S("WATCH", "m")),
        ("B", S("LRANGE", "m", "0", "-1")), ("A", S("MULTI")), ("A", S("LLEN", "m")), ("A", S("EXEC"))],
    "queue error beats a dirty watch": [
        ("A", S("WATCH", "x")), ("B", S("SET", "x", "1")), ("A", S("MULTI")), ("A", S("NOSUCH")),
        ("A", S("EXEC")), ("A", S("MULTI")), ("A", S("EXEC"))],
    "arity and exec without multi": [
        ("A", S("WATCH")), ("A", S("UNWATCH", "x")), ("A", S("WATCH", "x")), ("A", S("EXEC")),
        ("B", S("SET", "x", "1")), ("A", S("MULTI")), ("A", S("EXEC"))],
    "consumer-group bookkeeping is no modification": [
        ("A", S("XADD", "s", "1-1", "f", "v")), ("A", S("XGROUP", "CREATE", "s", "g", "0")),
        ("A", S("WATCH", "s")), ("B", S("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">")),
        ("B", S("XACK", "s", "g", "1-1")), ("B", S("XCLAIM", "s", "g", "c2", "0", "1-1")),
        ("B", S("XGROUP", "CREATECONSUMER", "s", "g", "c9")), ("B", S("XSETID", "s", "5-5")),
        ("B", S("XDEL", "s", "9-9")), ("B", S("XTRIM", "s", "MAXLEN", "10")),
        ("A", S("MULTI")), ("A", S("XLEN", "s")), ("A", S("EXEC")),
        ("A", S("WATCH", "s", "s2")), ("B", S("XGROUP", "CREATE", "s2", "g", "$", "MKSTREAM")),
        ("A", S("MULTI")), ("A", S("EXEC"))],
    "list no-ops and real changes": [
        ("A", S("RPUSH", "l", "a", "b", "c")), ("A", S("WATCH", "l", "k")), ("B", S("LREM", "l", "0", "zz")),
        ("B", S("LINSERT", "l", "BEFORE", "zz", "x")), ("B", S("RPUSHX", "nol", "x")),
        ("B", S("RENAME", "l", "l")), ("A", S("MULTI")), ("A", S("EXEC")),
        ("A", S("WATCH", "l")), ("B", S("LSET", "l", "0", "a")), ("A", S("MULTI")), ("A", S("EXEC")),
        ("A", S("WATCH", "l")), ("B", S("LTRIM", "l", "0", "-1")), ("A", S("MULTI")), ("A", S("EXEC")),
        ("A", S("WATCH", "l")), ("B", S("RPOPLPUSH", "l", "l")), ("A", S("MULTI")), ("A", S("EXEC"))],
    # redis signals only the keys a multi-key write changed: DEL/UNLINK the keys it deleted,
    # LMPOP the key it popped from, RENAMENX onto an existing key nothing
    "multi-key writes touch only what they changed": [
        ("A", S("SET", "a1", "1")), ("A", S("SET", "a3", "1")), ("A", S("WATCH", "a2")),
        ("B", S("DEL", "a1", "a2")), ("B", S("UNLINK", "a3", "a2")), ("A", S("MULTI")),
        ("A", S("PING")), ("A", S("EXEC")),
        ("A", S("SET", "a1", "1")), ("A", S("WATCH", "a1")), ("B", S("DEL", "a2", "a1")),
        ("A", S("MULTI")), ("A", S("EXEC")),
        ("A", S("RPUSH", "l2", "x", "y")), ("A", S("WATCH", "l1")), ("B", S("LMPOP", "2", "l1", "l2", "LEFT")),
        ("A", S("MULTI")), ("A", S("EXEC")), ("A", S("WATCH", "l2")), ("B", S("LMPOP", "2", "l1", "l2", "LEFT")),
        ("A", S("MULTI")), ("A", S("EXEC")),
        ("A", S("SET", "r", "1")), ("A", S("SET", "r2", "2")), ("A", S("WATCH", "r", "r2")),
        ("B", S("RENAMENX", "r", "r2")), ("B", S("RENAME", "nor", "r2")), ("B", S("RENAMENX", "nor", "r3")),
        ("A", S("MULTI")), ("A", S("EXEC"))],
    "blocking pops inside multi touch only what they popped": [
        ("A", S("RPUSH", "l2", "x", "y", "z")), ("A", S("WATCH", "l1", "l3")),
        ("B", S("MULTI")), ("B", S("BLPOP", "l1", "l2", "0")), ("B", S("BRPOP", "l1", "l2", "0")),
        ("B", S("BLMPOP", "0", "2", "l1", "l2", "LEFT")), ("B", S("BLPOP", "l3", "0")),
        ("B", S("BLMPOP", "0", "1", "l3", "RIGHT")), ("B", S("BLMOVE", "l3", "l1", "LEFT", "LEFT", "0")),
        ("B", S("EXEC")), ("A", S("MULTI")), ("A", S("EXEC")),
        ("A", S("RPUSH", "l2", "x")), ("A", S("WATCH", "l2")), ("B", S("MULTI")),
        ("B", S("BLPOP", "l1", "l2", "0")), ("B", S("EXEC")), ("A", S("MULTI")), ("A", S("EXEC"))],
}


@pytest.mark.parametrize("name", list(WATCH_SCRIPTS))
def test_watch_like_redis(srv, redis, name):
    assert_like_redis(redis, srv, WATCH_SCRIPTS[name])


def test_watch_reset_clears(srv):
    a = RawConn(srv.port, 2)
    b = RawConn(srv.port, 2)
    try:
        assert a.call(b"WATCH", b"x") == b"+OK\r\n"
        assert a.call(b"RESET") == b"+RESET\r\n"
        assert b.call(b"SET", b"x", b"1") == b"+OK\r\n"
        assert a.call(b"MULTI") == b"+OK\r\n" and a.call(b"EXEC") == b"*0\r\n"
    finally:
        a.close()
        b.close()


# -- CONFIG SET / GET --------------------------------------------------------------------

CONFIG_CASES = [
    S("CONFIG", "SET", "save", ""), S("CONFIG", "GET", "save"),
    S("CONFIG", "SET", "save", "3600 1 300 100"), S("CONFIG", "GET", "save"),
    S("CONFIG", "SET", "save", "3600 1 300"), S("CONFIG", "SET", "save", "0 1"),
    S("CONFIG", "SET", "save", "x 1"), S("CONFIG", "SET", "save", "10 -1"),
    S("CONFIG", "SET", "appendonly", "maybe"), S("CONFIG", "SET", "appendonly", "YES"),
    S("CONFIG", "GET", "appendonly"), S("CONFIG", "SET", "appendonly", "no"),
    S("CONFIG", "SET", "appendfsync", "sometimes"), S("CONFIG", "SET", "appendfsync", "Always"),
    S("CONFIG", "GET", "appendfsync"), S("CONFIG", "SET", "appendfsync", "everysec"),
    S("CONFIG", "SET", "proto-max-bulk-len", "10"), S("CONFIG", "SET", "proto-max-bulk-len", "10x"),
    S("CONFIG", "SET", "proto-max-bulk-len", "2mb"), S("CONFIG", "GET", "proto-max-bulk-len"),
    S("CONFIG", "SET", "client-query-buffer-limit", "1k"),
    S("CONFIG", "SET", "client-query-buffer-limit", "3mb"), S("CONFIG", "GET", "client-query-buffer-limit"),
    S("CONFIG", "SET", "maxclients", "0"), S("CONFIG", "SET", "maxclients", "x"),
    S("CONFIG", "SET", "lazyfree-lazy-user-flush", "yes"), S("CONFIG", "GET", "lazyfree-lazy-user-flush"),
    S("CONFIG", "SET", "lazyfree-lazy-user-flush", "no"),
    # all or nothing, redis's order of checks: unknown, duplicate, then each value in order
    S("CONFIG", "SET", "appendonly", "no", "stream-node-max-entries", "x"),
    S("CONFIG", "SET", "stream-node-max-entries", "7", "appendfsync", "bad"),
    S("CONFIG", "GET", "stream-node-max-entries"),
    S("CONFIG", "SET", "save", "", "nosuch", "1"), S("CONFIG", "SET", "save", "", "SAVE", "1 1"),
    S("CONFIG", "SET", "stream-node-max-entries", "50", "appendonly", "no"),
    S("CONFIG", "GET", "stream-node-max-entries"), S("CONFIG", "SET", "stream-node-max-entries", "100"),
    S("CONFIG", "GET", "appendonly", "appendf?ync", "sav*"), S("CONFIG", "GET", "proto-max-bulk-le?"),
    S("CONFIG", "GET", "client-query-buffer-[l]imit"),
    S("CONFIG", "SET", "proto-max-bulk-len", "512mb"), S("CONFIG", "SET", "client-query-buffer-limit", "1gb"),
]


def _as_map(raw: bytes):
    """CONFIG GET's order is redis's hash order: compare its pairs as a set."""
    from tests.server.test_resp_vs_redis import _decode
    v = _decode(raw)
    if isinstance(v, list):
        return sorted(zip(v[::2], v[1::2]))
    return sorted(v.items()) if isinstance(v, dict) else v


def test_config_set_get_like_redis(srv, redis):
    try:
        for protocol in (2, 3):
            theirs = run_script(redis.port, protocol, [("A", c) for c in CONFIG_CASES], "A")
            ours = run_script(srv.port, protocol, [("A", c) for c in CONFIG_CASES], "A")
            for argv, t, o in zip(CONFIG_CASES, theirs, ours):
                if argv[1] == "GET":
                    assert _as_map(o) == _as_map(t), argv
                else:
                    assert o == t, argv
    finally:
        redis.call("CONFIG", "SET", "save", "", "appendonly", "no", "appendfsync", "everysec",
                   "proto-max-bulk-len", "512mb", "client-query-buffer-limit", "1gb")


def _closed_after(port, data: bytes):
    return raw_exchange(port, data, quiet=2)


def test_config_limits_reach_the_parser(srv, redis):
    """proto-max-bulk-len and client-query-buffer-limit have their meaning: the
    parser of new and connected clients enforces them, as redis does."""
    big = 1024 * 1024 + 1
    bulk = b"*2\r\n$4\r\nECHO\r\n$%d\r\n" % big
    held = RawConn(srv.port, 2)                 # connected before the change
    try:
        for port in (redis.port, srv.port):
            c = RawConn(port, 2)
            assert c.call(b"CONFIG", b"SET", b"proto-max-bulk-len", b"1mb") == b"+OK\r\n"
            c.close()
        theirs = _closed_after(redis.port, bulk)
        ours = _closed_after(srv.port, bulk)
        assert ours == theirs == (b"-ERR Protocol error: invalid bulk length\r\n", True)
        held.sock.sendall(bulk)
        assert held.sock.recv(100) == b"-ERR Protocol error: invalid bulk length\r\n"
        # An unfinished command past the query buffer limit: redis closes without a reply.
        for port in (redis.port, srv.port):
            c = RawConn(port, 2)
            assert c.call(b"CONFIG", b"SET", b"proto-max-bulk-len", b"512mb",
                          b"client-query-buffer-limit", b"1mb") == b"+OK\r\n"
            c.close()
        partial = b"*2\r\n$4\r\nECHO\r\n$%d\r\n" % (4 * 1024 * 1024) + b"x" * (2 * 1024 * 1024)
        theirs = _closed_after(redis.port, partial)
        ours = _closed_after(srv.port, partial)
        assert ours == theirs == (b"", True)
    finally:
        held.close()
        redis.call("CONFIG", "SET", "proto-max-bulk-len", "512mb", "client-query-buffer-limit", "1gb")
        c = srv.client()
        c.config_set("proto-max-bulk-len", "512mb")
        c.config_set("client-query-buffer-limit", "1gb")


def test_node_settings_refused_inside_multi(srv):
    c = RawConn(srv.port, 2)
    try:
        assert c.call(b"MULTI") == b"+OK\r\n"
        assert c.call(b"CONFIG", b"SET", b"save", b"") == (
            b"-ERR xraft: CONFIG SET of node setting 'save' cannot be queued in MULTI\r\n")
        assert c.call(b"EXEC").startswith(b"-EXECABORT")
    finally:
        c.close()


# -- FUNCTION ---------------------------------------------------------------------------

FUNCTION_CASES = [
    S("FUNCTION", "FLUSH"), S("FUNCTION", "FLUSH", "ASYNC"), S("FUNCTION", "FLUSH", "sync"),
    S("FUNCTION", "FLUSH", "foo"), S("FUNCTION", "FLUSH", "async", "x"),
    S("FUNCTION", "LIST"), S("FUNCTION", "LIST", "WITHCODE"), S("FUNCTION", "LIST", "LIBRARYNAME", "x*"),
    S("FUNCTION", "LIST", "libraryname"), S("FUNCTION", "LIST", "withcode", "withcode"),
    S("FUNCTION", "LIST", "foo"), S("FUNCTION", "STATS"), S("FUNCTION", "STATS", "x"),
    S("FUNCTION", "DELETE", "lib"), S("FUNCTION", "DELETE"), S("FUNCTION", "KILL"),
    S("FUNCTION", "DUMP"), S("FUNCTION", "HELP"), S("FUNCTION", "NOSUCH"), S("FUNCTION"),
    S("FUNCTION", "RESTORE", "x", "y"), S("FUNCTION", "LOAD"),
]


def test_function_like_redis(srv, redis):
    steps = [("A", c) for c in FUNCTION_CASES]
    dump = run_script(redis.port, 2, [("A", S("FUNCTION", "DUMP"))], "A")[0]
    payload = dump.split(b"\r\n", 1)[1][:-2]
    steps.append(("A", (b"FUNCTION", b"RESTORE", payload)))
    steps.append(("A", (b"FUNCTION", b"RESTORE", payload, b"REPLACE")))
    assert_like_redis(redis, srv, steps, conns="A")


def test_function_load_refused_clearly(srv):
    c = RawConn(srv.port, 2)
    try:
        assert c.call(b"FUNCTION", b"LOAD", b"#!lua name=x\nredis.register_function('f', function() end)") == (
            b"-ERR xraft: functions are not supported (no scripting)\r\n")
    finally:
        c.close()


# -- OBJECT -----------------------------------------------------------------------------

OBJECT_SCRIPT = [
    S("SET", "i", "100"), S("SET", "big", "10000"), S("SET", "neg", "-5"), S("SET", "z", "007"),
    S("SET", "e", "x" * 44), S("SET", "r", "x" * 45), S("SET", "huge", "12345678901234567890"),
    S("RPUSH", "l", "a"), S("XADD", "s", "1-1", "f", "v"),
    *[S("OBJECT", sub, k) for sub in ("ENCODING", "REFCOUNT")
      for k in ("i", "big", "neg", "z", "e", "r", "huge", "l", "s", "nosuch")],
    S("OBJECT", "FREQ", "i"), S("OBJECT", "FREQ", "nosuch"), S("OBJECT", "IDLETIME", "nosuch"),
    S("OBJECT", "HELP"), S("OBJECT", "HELP", "x"), S("OBJECT", "ENCODING"), S("OBJECT", "FOO", "i"),
    S("OBJECT"), S("OBJECT", "REFCOUNT", "i", "j"),
]


def test_object_like_redis(srv, redis):
    assert_like_redis(redis, srv, [("A", c) for c in OBJECT_SCRIPT], conns="A")


def test_object_idletime_refused_clearly(srv):
    c = srv.client()
    c.set("k", "v")
    with pytest.raises(Exception, match="xraft keeps no per-key access time"):
        c.execute_command("OBJECT", "IDLETIME", "k")


# -- CLIENT -----------------------------------------------------------------------------

CLIENT_ERRORS = [
    S("CLIENT", "KILL"), S("CLIENT", "KILL", "1.2.3.4:5"), S("CLIENT", "KILL", "ID", "x"),
    S("CLIENT", "KILL", "ID", "0"), S("CLIENT", "KILL", "TYPE", "foo"), S("CLIENT", "KILL", "USER", "bob"),
    S("CLIENT", "KILL", "SKIPME", "maybe"), S("CLIENT", "KILL", "ID", "5", "foo"),
    S("CLIENT", "KILL", "foo", "bar"), S("CLIENT", "KILL", "ID", "99999"),
    S("CLIENT", "KILL", "ADDR", "1.1.1.1:1", "LADDR", "x"), S("CLIENT", "KILL", "TYPE", "pubsub"),
    S("CLIENT", "KILL", "USER", "default", "ADDR", "1.1.1.1:1"),
    S("CLIENT", "LIST", "TYPE", "foo"), S("CLIENT", "LIST", "ID", "x"), S("CLIENT", "LIST", "ID", "99999"),
    S("CLIENT", "LIST", "foo"), S("CLIENT", "LIST", "TYPE", "pubsub"), S("CLIENT", "SETNAME"),
    S("CLIENT", "SETNAME", "a b"), S("CLIENT", "GETNAME", "x"), S("CLIENT", "ID", "x"), S("CLIENT", "FOO"),
]


def test_client_errors_like_redis(srv, redis):
    # RESP2 only: the test reader does not take RESP3's empty verbatim string.
    assert_like_redis(redis, srv, [("A", c) for c in CLIENT_ERRORS], protocols=(2,), conns="A")


def _fields(line: bytes) -> list:
    return [kv.split(b"=", 1)[0] for kv in line.split()]


def test_client_list_fields_like_redis(srv, redis):
    lines = []
    for port in (redis.port, srv.port):
        c = RawConn(port, 2)
        c.call(b"CLIENT", b"SETNAME", b"me")
        raw = c.call(b"CLIENT", b"LIST", b"ID", b"%d" % int(c.call(b"CLIENT", b"ID")[1:-2]))
        c.close()
        lines.append(raw.split(b"\r\n", 1)[1].rstrip(b"\r\n"))
    theirs, ours = lines
    assert _fields(ours) == _fields(theirs)
    got = dict(kv.split(b"=", 1) for kv in ours.split())
    assert got[b"name"] == b"me" and got[b"flags"] == b"N" and got[b"cmd"] == b"client|list"
    assert int(got[b"fd"]) > 0 and got[b"laddr"] == b"127.0.0.1:%d" % srv.port


def test_client_kill_closes_connections(srv):
    a = RawConn(srv.port, 2)
    b = RawConn(srv.port, 2)
    c = RawConn(srv.port, 2)
    try:
        b_id = int(b.call(b"CLIENT", b"ID")[1:-2])
        assert a.call(b"CLIENT", b"KILL", b"ID", b"%d" % b_id) == b":1\r\n"
        b.sock.settimeout(5)
        assert b.sock.recv(10) == b""                       # closed by the server
        # The old form names an address and may kill the caller itself: +OK, then closed.
        info = c.call(b"CLIENT", b"INFO").decode()
        addr = [kv.split("=", 1)[1] for kv in info.split() if kv.startswith("addr=")][0]
        assert c.call(b"CLIENT", b"KILL", addr.encode()) == b"+OK\r\n"
        c.sock.settimeout(5)
        assert c.sock.recv(10) == b""
        # SKIPME yes (the default) spares the caller; SKIPME no does not.
        assert a.call(b"CLIENT", b"KILL", b"USER", b"default") == b":0\r\n"
        assert a.call(b"CLIENT", b"KILL", b"USER", b"default", b"SKIPME", b"no") == b":1\r\n"
        a.sock.settimeout(5)
        assert a.sock.recv(10) == b""
    finally:
        for x in (a, b, c):
            x.close()


def test_client_addresses_are_formatted_as_redis_does():
    """anetFormatAddr: IPv6 addresses in brackets, so CLIENT KILL ADDR can name them."""
    from xraft.node.server.client_cmds import format_addr
    assert format_addr(("127.0.0.1", 6379)) == "127.0.0.1:6379"
    assert format_addr(("::1", 6379, 0, 0)) == "[::1]:6379"
    assert format_addr(None) == ""


# -- DEBUG ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def debug_redis():
    o = RedisOracle(extra_config=["--enable-debug-command", "yes"])
    yield o
    o.close()


DEBUG_CASES = [
    S("DEBUG", "SLEEP", "0"), S("DEBUG", "SLEEP", "abc"), S("DEBUG", "SLEEP"), S("DEBUG", "SLEEP", "0", "1"),
    S("DEBUG", "JMAP"), S("DEBUG", "SET-ACTIVE-EXPIRE", "0"), S("DEBUG", "SET-ACTIVE-EXPIRE", "1"),
    S("DEBUG"),
]


def test_debug_like_redis(srv, debug_redis):
    assert_like_redis(debug_redis, srv, [("A", c) for c in DEBUG_CASES], conns="A")


def test_debug_refuses_what_it_does_not_serve(srv):
    c = RawConn(srv.port, 2)
    try:
        for sub in (b"RELOAD", b"OBJECT", b"DIGEST", b"POPULATE"):
            assert c.call(b"DEBUG", sub, b"x") == (
                b"-ERR xraft: DEBUG %s is not supported (served: SLEEP, SET-ACTIVE-EXPIRE, HELP)\r\n" % sub)
    finally:
        c.close()


def test_debug_sleep_sleeps_only_its_connection(srv):
    a = RawConn(srv.port, 2)
    b = RawConn(srv.port, 2)
    try:
        a.sock.sendall(b"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$1\r\n2\r\n")
        time.sleep(0.2)                                     # let the sleep start
        assert b.call(b"PING") == b"+PONG\r\n"              # served while A sleeps
        a.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            a.sock.recv(10)                                 # A's reply is not there yet
        a.sock.setblocking(True)
        a.sock.settimeout(30)
        assert a.sock.recv(10) == b"+OK\r\n"
    finally:
        a.close()
        b.close()


def test_client_list_flags_like_redis(srv, redis):
    """flags= of a blocked client (b) and of a client inside MULTI (x)."""
    flags = []
    for port in (redis.port, srv.port):
        blocked, multi, asker = RawConn(port, 2), RawConn(port, 2), RawConn(port, 2)
        try:
            ids = [int(c.call(b"CLIENT", b"ID")[1:-2]) for c in (blocked, multi)]
            blocked.sock.sendall(b"*3\r\n$5\r\nBLPOP\r\n$6\r\nnosuch\r\n$1\r\n0\r\n")
            multi.call(b"MULTI")
            got = {}
            for _ in range(100):                       # until the BLPOP is parked
                raw = asker.call(b"CLIENT", b"LIST", b"ID", *[b"%d" % i for i in ids])
                fields = [dict(kv.split(b"=", 1) for kv in line.split())
                          for line in raw.split(b"\r\n", 1)[1].splitlines() if line.startswith(b"id=")]
                got = {int(f[b"id"]): f[b"flags"] for f in fields}
                if got.get(ids[0]) == b"b":
                    break
                time.sleep(0.05)
            flags.append([got.get(i) for i in ids])
        finally:
            for c in (blocked, multi, asker):
                c.close()
    assert flags[1] == flags[0] == [b"b", b"x"]
