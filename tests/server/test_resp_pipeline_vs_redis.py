"""Pipelines against a real cluster-enabled redis-server 7.0, byte for byte (issue 14).

xraft runs the plain writes of a pipeline that arrive together as one
submission (node/server/resp_pipeline.py); everything a client can see must
stay redis's: the replies and their order, errors in the middle (command
errors, apply-time errors, CROSSSLOT), MULTI/EXEC/DISCARD and WATCH,
blocking commands between writes, QUIT, a protocol error after complete
commands, inline commands, RESP3. Each pipeline is sent in one write to
redis (one node, --cluster-enabled, every slot: routing as xraft's), to a
RespServer over the local backend, and to a real one-node xraft process
(RaftBackend through Raft); the bytes back must be the same.

CLIENT REPLY is not here: xraft does not support it (it answers redis's
unknown-subcommand error, where redis goes quiet), pipelined or not.
"""
import re
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Module-scoped fixtures, one of each per module that imports them: a cluster-enabled redis,
# a RespServer over the local backend, a real one-node xraft process.
from tests.server.test_blocking_vs_redis import local_port, node_port  # noqa: F401
from tests.server.test_cluster_routing_vs_redis import cluster_redis  # noqa: F401
from tests.server.test_resp_encode import ReplyReader
from tests.server.test_resp_server import raw_exchange
from tests.server.test_resp_vs_redis import _complete, exchange
from xraft.node.server.resp import encode_command

pytestmark = pytest.mark.redis

S = "{t}s"                    # every key below shares the hash tag {t} unless a case wants CROSSSLOT
AUTO_ID = re.compile(rb"\$\d+\r\n\d{13}-\d+\r\n")   # a `*` ID, as a bulk string


def cmds(*lines) -> bytes:
    return b"".join(encode_command(line.split()) for line in lines)


def xadds(first: int, last: int, key: str = S) -> list:
    return ["XADD %s %d-1 f v" % (key, i) for i in range(first, last + 1)]


CASES = {
    "xadds then reads": cmds(*xadds(1, 30), "XLEN " + S, "XRANGE %s - + COUNT 3" % S, "XADD %s 31-1 f v" % S,
                             "XREVRANGE %s + - COUNT 2" % S),
    "errors in the middle": cmds(
        "XADD %s 1-1 f v" % S, "XADD %s 1-1 f v" % S, "XADD " + S, "NOSUCH x", "SET {t}k x",
        "XADD {t}k 1-1 f v", "XADD %s 2-1 f v" % S, "RPUSH {t}k x", "RPUSH {t}n x", "RPUSH {t}n x",
        "XADD %s 0-0 f v" % S,
        "XADD %s NOMKSTREAM 9-1 f" % S, "XADD {t}none NOMKSTREAM 1-1 f v", "XLEN " + S, "LRANGE {t}n 0 -1",
        "XADD %s 3-1 f v" % S),
    "crossslot in the middle": cmds(
        "XADD %s 1-1 f v" % S, "DEL a b", "XADD %s 2-1 f v" % S, "RENAME a b", "XADD %s 3-1 f v" % S,
        "RENAME {t}a {t}b", "XLEN " + S, "EXISTS a", "EXISTS {t}a {t}b"),
    "multi exec discard": cmds(
        "XADD %s 1-1 f v" % S, "MULTI", "XADD %s 2-1 f v" % S, "XADD %s 1-1 f v" % S, "RPUSH {t}n x", "EXEC",
        "XADD %s 3-1 f v" % S, "MULTI", "XADD %s 4-1 f v" % S, "NOSUCH", "EXEC", "XLEN " + S,
        "MULTI", "XADD %s 5-1 f v" % S, "DISCARD", "XLEN " + S, "EXEC", "DISCARD", "XADD %s 6-1 f v" % S,
        "MULTI", "MULTI", "XADD %s 7-1 f v" % S, "EXEC", "XLEN " + S),
    "watch": cmds(
        "WATCH " + S, "XADD %s 1-1 f v" % S, "MULTI", "XADD %s 2-1 f v" % S, "EXEC", "XLEN " + S,
        "XADD %s 3-1 f v" % S, "WATCH " + S, "MULTI", "XADD %s 4-1 f v" % S, "EXEC", "XADD %s 5-1 f v" % S,
        "WATCH {t}other", "XADD %s 6-1 f v" % S, "MULTI", "RPUSH {t}n x", "EXEC", "UNWATCH", "XLEN " + S),
    "blocking between writes": cmds(
        "RPUSH {t}l a", "XADD %s 1-1 f v" % S, "BLPOP {t}l 0", "XADD %s 2-1 f v" % S,
        "XREAD BLOCK 0 STREAMS %s 0" % S, "XREAD COUNT 1 BLOCK 50 STREAMS %s $" % S, "XADD %s 3-1 f v" % S,
        "BLPOP {t}l 0.05", "XGROUP CREATE %s g 0" % S, "XREADGROUP GROUP g c COUNT 2 BLOCK 0 STREAMS %s >" % S,
        "XADD %s 4-1 f v" % S, "XREADGROUP GROUP g c BLOCK 0 STREAMS %s >" % S, "XACK %s g 1-1 2-1" % S,
        "XPENDING %s g" % S, "XLEN " + S),
    "other writes between xadds": cmds(
        "XADD {t}a 1-1 f v", "XADD {t}b 1-1 f v", "SET {t}c 1", "RPUSH {t}c x", "XADD {t}a 2-1 f v", "GET {t}c",
        "SET {t}c 2",
        "RPUSH {t}l x y", "XADD {t}b 2-1 f v", "DEL {t}a", "XLEN {t}a", "XLEN {t}b", "LPOP {t}l",
        "XTRIM {t}b MAXLEN 1", "XLEN {t}b", "PING", "ECHO hi", "XADD {t}a 3-1 f v"),
    "quit in the middle": cmds("XADD %s 1-1 f v" % S, "XADD %s 2-1 f v" % S, "QUIT", "XADD %s 3-1 f v" % S),
    "protocol error after writes": cmds("XADD %s 1-1 f v" % S, "XADD %s 2-1 f v" % S) + b"*1\r\n$x\r\n"
                                   + cmds("XADD %s 3-1 f v" % S),
    "inline": b"XADD {t}s 1-1 f v\r\nXADD {t}s 2-1 f v\r\nXADD {t}s 1-1 f v\r\nXLEN {t}s\r\n",
    "long pipeline over several batches": cmds(*[
        line for i in range(1, 2501) for line in
        (["XADD %s %d-1 f v" % (S, i)] + (["RPUSH {t}n x", "XLEN " + S] if i % 500 == 0 else []))]),
    "resp3": cmds("HELLO 3", *xadds(1, 5), "XRANGE %s - + COUNT 2" % S, "XADD %s 1-1 f v" % S,
                  "XREAD STREAMS %s 0" % S),
    # Runs of `XADD key [NOMKSTREAM] * f v ..` to one key go as one XADD batch request (resp_pipeline.py).
    "xadd run over a key of the wrong type": cmds(
        "SET {t}k x", *["XADD {t}k * f %d" % i for i in range(4)], *["XADD %s * f %d" % (S, i) for i in range(4)],
        "XADD {t}k NOMKSTREAM * f v", "XADD {t}k NOMKSTREAM * f v", "GET {t}k", "XRANGE %s - +" % S),
    "xadd run mixing nomkstream on a missing key": cmds(
        "XADD {t}m NOMKSTREAM * f 1", "XADD {t}m NOMKSTREAM * f 2", "XADD {t}m * f 3", "XADD {t}m * f 4 g 4",
        "XADD {t}m NOMKSTREAM * f 5", "XADD {t}m nomkstream * f 6", "XADD {t}m * f 7", "EXISTS {t}m",
        "XADD {t}z nomkstream * f 1", "XADD {t}z nomkstream * f 2", "EXISTS {t}z", "XRANGE {t}m - +"),
    "xadd run interrupted by other commands": cmds(
        *["XADD %s * f %d" % (S, i) for i in range(3)], "RPUSH {t}n x", "XADD %s * f 3" % S, "XADD {t}o * f 0",
        "XADD %s * f 4" % S, "XADD %s * f 5" % S, "XLEN " + S, "XADD %s * f 6" % S, "XADD %s * f 7" % S,
        "XADD %s 1-1 f v" % S, "XADD %s * f 8" % S, "XADD %s MAXLEN 100 * f 9" % S, "XADD %s * f 10" % S,
        "XRANGE %s - +" % S, "XRANGE {t}o - +"),
    "xadd run with a syntax error in the middle": cmds(
        "XADD %s * f 1" % S, "XADD %s * f 2" % S, "XADD %s * f" % S, "XADD %s * f 3" % S,
        "XADD %s * f 4 g" % S, "XADD %s MAXLEN x * f v" % S, "XADD %s * f 5" % S, "XADD %s NOSUCH f v" % S,
        "XADD %s * f 6" % S, "XADD %s NOMKSTREAM NOMKSTREAM * f 7" % S, "XADD %s *" % S, "XADD %s * f 8" % S,
        "XRANGE %s - +" % S),
    "auto ids": cmds(*["XADD %s * f v" % S] * 20, "XLEN " + S, "XADD %s MAXLEN 5 * f v" % S, "XLEN " + S),
}


def masked(raw: bytes) -> bytes:
    """Replies with HELLO 3's server description (name, version, id) and `*` IDs (which
    differ by clock) masked."""
    if raw.startswith(b"%7\r\n"):
        r = ReplyReader(raw)
        r.read()
        raw = b"<hello>" + raw[r.pos:]
    return AUTO_ID.sub(b"<id>", raw)


def redis_answer(port: int, data: bytes):
    raw, closed = raw_exchange(port, data, quiet=0.5)
    return raw, closed, len(_complete(raw)[0])


def flush(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(cmds("FLUSHALL"))
        assert s.recv(64) == b"+OK\r\n"


def assert_pipeline_like_redis(redis_port: int, port: int, data: bytes) -> None:
    flush(redis_port)
    want, want_closed, n = redis_answer(redis_port, data)
    flush(port)
    # xraft gets all the time it needs for redis's n replies, then 0.5 s to show an extra one.
    got, got_closed = exchange(port, data, n, quiet=0.5)
    assert masked(got) == masked(want)
    assert got_closed == want_closed


@pytest.mark.parametrize("target", ["local", "node"])
@pytest.mark.parametrize("name", list(CASES))
def test_pipeline_like_redis(request, cluster_redis, name, target):
    assert_pipeline_like_redis(cluster_redis.port, request.getfixturevalue(target + "_port"), CASES[name])


@pytest.mark.parametrize("target", ["local", "node"])
def test_quit_and_protocol_error_run_nothing_after(request, cluster_redis, target):
    """What follows QUIT or a protocol error is not run (the stream keeps 2 entries), as in redis."""
    port = request.getfixturevalue(target + "_port")
    for data in (CASES["quit in the middle"], CASES["protocol error after writes"]):
        for p in (cluster_redis.port, port):
            flush(p)
            raw_exchange(p, data, quiet=0.5) if p == cluster_redis.port else exchange(p, data, 3, quiet=0.5)
            assert raw_exchange(p, cmds("XLEN " + S), quiet=0.5)[0] == b":2\r\n", p


def raft_counter(port: int, name: str) -> int:
    raw, _ = exchange(port, cmds("INFO raft"), 1)
    return int(re.search(rb"%s:(\d+)" % name.encode(), raw).group(1))


@pytest.mark.parametrize("target", ["local", "node"])
def test_a_pipeline_of_writes_shares_records(request, target):
    """200 XADDs sent in one write: without batching each would be its own record (one
    client, one command at a time); batched, the commands of each read share one."""
    port = request.getfixturevalue(target + "_port")
    before = raft_counter(port, "raft_records")
    got, _ = exchange(port, cmds(*xadds(1, 200, "{t}batched")), 200)
    assert len(_complete(got)[0]) == 200
    assert raft_counter(port, "raft_records") - before <= 100


OPS = st.sampled_from([
    "XADD {t}s * f v", "XADD {t}s 5-1 f v", "XADD {t}s MAXLEN 3 * f v", "XADD {t}s", "XLEN {t}s",
    "XADD {t}k * f v", "SET {t}k x", "RPUSH {t}n x", "RPUSH {t}k x", "DEL {t}s", "DEL a b", "RENAME a b",
    "MULTI", "EXEC", "DISCARD", "WATCH {t}s", "NOSUCH", "PING", "LRANGE {t}n 0 -1",
    "XTRIM {t}s MAXLEN 1", "XREAD BLOCK 0 STREAMS {t}s 0", "XGROUP CREATE {t}s g 0",
    "XREADGROUP GROUP g c COUNT 1 STREAMS {t}s >", "XACK {t}s g 0-1", "LPUSH {t}l a", "BLPOP {t}l 0.01",
])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(OPS, min_size=1, max_size=40))
def test_random_pipelines_like_redis(cluster_redis, local_port, lines):
    """Random mixes of the ops above, each pipeline in one write (local backend). UNWATCH is
    left out: inside MULTI redis queues it and xraft refuses it (a difference older than
    pipelining, with or without it)."""
    assert_pipeline_like_redis(cluster_redis.port, local_port, cmds(*lines))
