"""Blocked clients against the real redis-server 7.0: the same scenario, the same bytes.

Each scenario runs on redis-server and on xraft (a RespServer on the local
backend, and a real single-node xraft process through Raft): one connection
blocks (XREADGROUP / XREAD / BLPOP / BLMOVE ...), a second one changes the
world (deletes the key, changes its type with SET or inside MULTI/EXEC,
flushes, destroys the group, CLIENT UNBLOCK ...), and the transcript - every
reply of both connections, and whether the blocked one is still blocked - must
be byte for byte redis's.

"Still blocked" is judged by 0.3 s of silence; xraft is only held to it where
redis stayed blocked, and is given ample time wherever redis replied, so a busy
machine cannot turn a slow reply into a false difference.
"""
import tempfile
import time
from dataclasses import dataclass, fields, replace

import pytest

from tests.cluster.conftest import Cluster
from tests.redis_oracle import RedisOracle
from tests.server.test_resp_server import ServerThread
from tests.server.slot_tags import one_slot
from tests.server.test_resp_server_blocking import Raw

pytestmark = pytest.mark.redis

STILL_BLOCKED = b"<still blocked>"
SILENCE_S = 0.3
REPLY_WAIT_S = 20.0


@dataclass(frozen=True)
class Scenario:
    name: str
    setup: tuple                 # commands on the second connection before blocking
    block: tuple                 # the blocking command (first connection)
    trigger: tuple               # commands on the second connection while it blocks ("{id}": its client id)
    after: tuple = ()            # if still blocked: more commands, then its reply again
    waits: bool = True           # False: the command ends by itself (tiny timeouts)
    block2: tuple = ()           # a second connection's blocking command, blocked after the first
    final: tuple = ()            # commands once every blocked reply is in (state a retry may still change)
    resp3: bool = False          # the blocked connection speaks RESP3 (HELLO 3)


def c(text):
    return tuple(text.split())


GROUP = (c("XADD s 1-1 f v"), c("XGROUP CREATE s g $"))
XRG = c("XREADGROUP GROUP g alice BLOCK 0 STREAMS s >")
XREAD = c("XREAD BLOCK 0 STREAMS s $")

SCENARIOS = [
    # A blocked XREADGROUP whose key goes away or changes type: -UNBLOCKED.
    Scenario("xreadgroup-del", GROUP, XRG, (c("DEL s"),)),
    Scenario("xreadgroup-unlink", GROUP, XRG, (c("UNLINK s"),)),
    Scenario("xreadgroup-set", GROUP, XRG, (c("SET s x"),)),
    Scenario("xreadgroup-multi-del-set", GROUP, XRG, (c("MULTI"), c("DEL s"), c("SET s x"), c("EXEC"))),
    Scenario("xreadgroup-multi-xadd-set", GROUP, XRG, (c("MULTI"), c("XADD s 5-1 a b"), c("SET s x"), c("EXEC"))),
    Scenario("xreadgroup-rename-away", GROUP, XRG, (c("RENAME s t"),)),
    Scenario("xreadgroup-rename-string-onto", GROUP + (c("SET t x"),), XRG, (c("RENAME t s"),)),
    Scenario("xreadgroup-flushdb", GROUP, XRG, (c("FLUSHDB"),)),
    Scenario("xreadgroup-flushall", GROUP, XRG, (c("FLUSHALL"),)),
    Scenario("xreadgroup-two-keys-second-deleted",
             GROUP + (c("XADD s2 1-1 f v"), c("XGROUP CREATE s2 g $")),
             c("XREADGROUP GROUP g alice COUNT 5 BLOCK 0 STREAMS s s2 > >"), (c("DEL s2"),)),
    # ... or loses its group: NOGROUP, with the blocked reader's text.
    Scenario("xreadgroup-group-destroyed", GROUP, XRG, (c("XGROUP DESTROY s g"),)),
    Scenario("xreadgroup-recreated-without-group", GROUP, XRG,
             (c("MULTI"), c("DEL s"), c("XADD s 2-1 f v"), c("EXEC"))),
    # A blocked XREAD is not failed: it waits on and is served by the next entry.
    Scenario("xread-set", GROUP, XREAD, (c("SET s x"),), (c("DEL s"), c("XADD s 9-1 f v"))),
    Scenario("xread-multi-xadd-set", GROUP, XREAD, (c("MULTI"), c("XADD s 5-1 a b"), c("SET s x"), c("EXEC")),
             (c("DEL s"), c("XADD s 9-1 f v"))),
    Scenario("xread-del", GROUP, XREAD, (c("DEL s"),), (c("XADD s 9-1 f v"),)),
    Scenario("xread-flushdb", GROUP, XREAD, (c("FLUSHDB"),), (c("XADD s 9-1 f v"),)),
    # A blocked pop or move is served from lists only: a key that changed type
    # while it waited is skipped (not WRONGTYPE); a destination of another type fails the move.
    Scenario("blpop-multi-push-then-set", (), c("BLPOP l 0"),
             (c("MULTI"), c("LPUSH l a"), c("DEL l"), c("SET l x"), c("EXEC")), (c("DEL l"), c("RPUSH l b"))),
    Scenario("blpop-two-keys-first-becomes-string", (), c("BLPOP a b 0"), (c("SET a x"), c("RPUSH b v"))),
    Scenario("blmpop-two-keys-first-becomes-string", (), c("BLMPOP 0 2 a b LEFT COUNT 2"),
             (c("SET a x"), c("RPUSH b v w"))),
    Scenario("blmove-multi-push-then-set", (), c("BLMOVE l m LEFT LEFT 0"),
             (c("MULTI"), c("RPUSH l a"), c("SET l x"), c("EXEC")), (c("DEL l"), c("RPUSH l b"))),
    Scenario("brpoplpush-multi-push-then-set", (), c("BRPOPLPUSH l m 0"),
             (c("MULTI"), c("RPUSH l a"), c("SET l x"), c("EXEC")), (c("DEL l"), c("RPUSH l b"))),
    Scenario("blmove-destination-string", (c("SET m x"),), c("BLMOVE l m LEFT LEFT 0"),
             (c("RPUSH l a"), c("LRANGE l 0 -1"))),
    # CLIENT UNBLOCK: as a timeout (the default) or with redis's error.
    Scenario("unblock-blpop-timeout", (), c("BLPOP l 0"), (c("CLIENT UNBLOCK {id} TIMEOUT"),)),
    Scenario("unblock-blpop-default", (), c("BLPOP l 0"), (c("CLIENT UNBLOCK {id}"),)),
    Scenario("unblock-blpop-error", (), c("BLPOP l 0"), (c("CLIENT UNBLOCK {id} ERROR"),)),
    Scenario("unblock-blmove-timeout", (), c("BLMOVE l m LEFT RIGHT 0"), (c("CLIENT UNBLOCK {id} timeout"),)),
    Scenario("unblock-blmpop-error", (), c("BLMPOP 0 2 l m LEFT"), (c("CLIENT UNBLOCK {id} error"),)),
    Scenario("unblock-xreadgroup-timeout", GROUP, XRG, (c("CLIENT UNBLOCK {id} TIMEOUT"), c("XPENDING s g"))),
    Scenario("unblock-xreadgroup-error", GROUP, XRG, (c("CLIENT UNBLOCK {id} ERROR"),)),
    Scenario("unblock-xread-error", GROUP, XREAD, (c("CLIENT UNBLOCK {id} ERROR"),)),
    Scenario("unblock-twice", (), c("BLPOP l 0"),
             (c("CLIENT UNBLOCK {id} ERROR"), c("CLIENT UNBLOCK {id} ERROR"))),
    # Timeouts below 10 ms end (a timeout rounded down to 0 would mean forever).
    Scenario("blpop-1ms", (), c("BLPOP l 0.001"), (), waits=False),
    Scenario("brpop-tiny", (), c("BRPOP l 0.0001"), (), waits=False),
    Scenario("blmove-1ms", (), c("BLMOVE l m LEFT LEFT 0.001"), (), waits=False),
    Scenario("blmpop-1ms", (), c("BLMPOP 0.001 1 l LEFT"), (), waits=False),
    Scenario("xread-block-1", GROUP, c("XREAD BLOCK 1 STREAMS s $"), (), waits=False),
    Scenario("xreadgroup-block-1", GROUP, c("XREADGROUP GROUP g a BLOCK 1 STREAMS s >"), (), waits=False),
    # Circular BLMOVE / BRPOPLPUSH (source = destination) while blocked: the
    # element is served and rotated into the same list.
    Scenario("blmove-circular-right-left", (), c("BLMOVE l l RIGHT LEFT 0"), (c("RPUSH l a b c"),),
             final=(c("LRANGE l 0 -1"),)),
    Scenario("blmove-circular-left-right", (), c("BLMOVE l l LEFT RIGHT 0"), (c("RPUSH l a b c"),),
             final=(c("LRANGE l 0 -1"),)),
    Scenario("brpoplpush-circular", (), c("BRPOPLPUSH l l 0"), (c("LPUSH l a b"),), final=(c("LRANGE l 0 -1"),)),
    # Two clients moving in a circle, and a rotation that feeds a second waiter
    # (redis's "circular BRPOPLPUSH" / "BRPOPLPUSH with a client BLPOPing the target list").
    Scenario("brpoplpush-two-lists-circular", (), c("BRPOPLPUSH list1 list2 0"), (c("RPUSH list1 foo"),),
             block2=c("BRPOPLPUSH list2 list1 0"), final=(c("LRANGE list1 0 -1"), c("LRANGE list2 0 -1"))),
    Scenario("blmove-two-lists-circular", (), c("BLMOVE list1 list2 RIGHT LEFT 0"), (c("RPUSH list1 foo"),),
             block2=c("BLMOVE list2 list1 LEFT RIGHT 0"), final=(c("LRANGE list1 0 -1"), c("LRANGE list2 0 -1"))),
    # The same endings in RESP3 (null, error and map replies).
    Scenario("resp3-xreadgroup-del", GROUP, XRG, (c("DEL s"),), resp3=True),
    Scenario("resp3-xreadgroup-served", GROUP, XRG, (c("XADD s 2-1 a b"),), resp3=True),
    Scenario("resp3-unblock-blpop-timeout", (), c("BLPOP l 0"), (c("CLIENT UNBLOCK {id}"),), resp3=True),
    Scenario("resp3-unblock-blmove-timeout", (), c("BLMOVE l m LEFT LEFT 0"), (c("CLIENT UNBLOCK {id}"),),
             resp3=True),
    Scenario("resp3-blpop-1ms", (), c("BLPOP l 0.001"), (), waits=False, resp3=True),
    Scenario("resp3-xread-block-1", GROUP, c("XREAD BLOCK 1 STREAMS s $"), (), waits=False, resp3=True),
    Scenario("blmove-self-then-blpop", (), c("BLMOVE l l RIGHT LEFT 0"), (c("RPUSH l foo"),), block2=c("BLPOP l 0"),
             final=(c("LRANGE l 0 -1"),)),
]


def _one_slot(sc: Scenario) -> Scenario:
    """Every key of every command in one slot: multi-key commands across slots are
    -CROSSSLOT on xraft, as on a redis cluster (slot_tags.py)."""
    def tag(value):
        if not isinstance(value, tuple) or not value:
            return value
        if isinstance(value[0], tuple):
            return tuple(one_slot(cmd) for cmd in value)
        return one_slot(value)
    return replace(sc, **{f.name: tag(getattr(sc, f.name)) for f in fields(sc) if f.name != "name"})


SCENARIOS = [_one_slot(sc) for sc in SCENARIOS]


def _blocked(conn) -> int:
    info = conn.call("INFO", "clients").decode()
    return int(info.split("blocked_clients:", 1)[1].split("\r\n", 1)[0])


def _wait_blocked(conn, n: int, timeout: float = REPLY_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while (have := _blocked(conn)) != n:
        assert time.monotonic() < deadline, "expected %d blocked clients, have %d" % (n, have)
        time.sleep(0.01)


def _outcome(conn, expect) -> bytes:
    """The blocked connection's reply, or STILL_BLOCKED. With `expect` (redis's
    outcome) a reply is waited for as long as it takes, silence only as long as
    it must."""
    if expect is None:                       # redis: replies at once or never
        return STILL_BLOCKED if conn.silent(SILENCE_S) else conn.reply()
    if expect == STILL_BLOCKED:
        return STILL_BLOCKED if conn.silent(SILENCE_S) else conn.reply()
    return conn.reply(REPLY_WAIT_S)


def run(port: int, sc: Scenario, expect=None) -> list:
    """The transcript of `sc` on the server at `port`."""
    blocked, other, second = Raw(port), Raw(port), Raw(port)
    try:
        other.call("FLUSHALL")
        _wait_blocked(other, 0)              # a previous scenario's client is gone
        cid = blocked.call("CLIENT", "ID")[1:-2].decode()
        if sc.resp3:
            blocked.call("HELLO", "3")         # its reply names the server: not compared
        out = [("setup", other.call(*cmd)) for cmd in sc.setup]
        blocked.send(*sc.block)
        if sc.waits:
            _wait_blocked(other, 1)
        if sc.block2:
            second.send(*sc.block2)
            _wait_blocked(other, 2)
        for cmd in sc.trigger:
            out.append((" ".join(cmd), other.call(*(a.replace("{id}", cid) for a in cmd))))
        i = len(out)
        out.append(("blocked", _outcome(blocked, expect and expect[i][1])))
        if out[-1][1] == STILL_BLOCKED and sc.after:
            for cmd in sc.after:
                out.append((" ".join(cmd), other.call(*cmd)))
            out.append(("blocked, after", _outcome(blocked, expect and expect[len(out)][1])))
        if sc.block2:
            out.append(("second", _outcome(second, expect and expect[len(out)][1])))
        for cmd in sc.final:
            out.append((" ".join(cmd), other.call(*cmd)))
        return out
    finally:
        blocked.close()
        other.close()
        second.close()


@pytest.fixture(scope="module")
def redis_port():
    oracle = RedisOracle()
    yield oracle.port
    oracle.close()


@pytest.fixture(scope="module")
def local_port():
    s = ServerThread()
    yield s.port
    s.stop()


@pytest.fixture(scope="module")
def node_port():
    """A real xraft process (one voter): blocking through Raft and the RaftBackend."""
    cluster = Cluster(tempfile.mkdtemp(prefix="xraft-blocking-vs-redis-"), 1)
    try:
        cluster.start()
        cluster.wait_leader()
        yield cluster.nodes[1].resp_port
    finally:
        cluster.kill_all()


_redis_transcripts = {}


def _redis_transcript(redis_port, sc):
    if sc.name not in _redis_transcripts:
        _redis_transcripts[sc.name] = run(redis_port, sc)
    return _redis_transcripts[sc.name]


@pytest.mark.parametrize("target", ["local", "node"])
@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_blocked_client_as_redis(request, redis_port, sc, target):
    want = _redis_transcript(redis_port, sc)
    port = request.getfixturevalue(target + "_port")
    assert run(port, sc, want) == want


UNBLOCK_ARGS = [
    c("CLIENT UNBLOCK"),
    c("CLIENT UNBLOCK x"),
    c("CLIENT UNBLOCK x foo"),
    c("CLIENT UNBLOCK 1 foo"),
    c("CLIENT UNBLOCK 1 error extra"),
    c("CLIENT unblock 1 error extra"),
    c("CLIENT UNBLOCK 999999999"),
    c("CLIENT UNBLOCK -1 TIMEOUT"),
    c("CLIENT UNBLOCK 00 ERROR"),
]


def test_client_unblock_arguments_as_redis(redis_port, local_port):
    """Argument errors in redis's order, and 0 for a client that is not blocked
    (itself, or none with that id)."""
    r, x = Raw(redis_port), Raw(local_port)
    try:
        for cmd in UNBLOCK_ARGS:
            assert x.call(*cmd) == r.call(*cmd), cmd
        for conn in (r, x):
            cid = conn.call("CLIENT", "ID")[1:-2]
            assert conn.call("CLIENT", "UNBLOCK", cid) == b":0\r\n"
    finally:
        r.close()
        x.close()
