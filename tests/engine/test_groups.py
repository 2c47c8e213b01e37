"""Consumer groups on the engine alone: what a differential test cannot see
(blocking forms, exact use of now_ms, shared NACK objects, invariants, and
that a failing command changes nothing)."""
import pytest

from tests.redis_oracle import RedisReplyError, engine_call
from xraft.node.engine import groups as g
from xraft.node.engine.commands import execute
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.replies import NULL_ARRAY, WouldBlock
from xraft.node.engine.stream_codec import dump_stream
from xraft.node.engine.streamid import StreamID
from xraft.node.invariant import InvariantViolation

T0 = 1_000_000


def make(*cmds, now=T0):
    db = Keyspace()
    for argv in cmds:
        reply = engine_call(db, *argv, now_ms=now)
        assert not isinstance(reply, RedisReplyError), (argv, reply)
    return db


def populated():
    return make(["XADD", "s", "1-1", "f", "a"], ["XADD", "s", "2-1", "f", "b"], ["XADD", "s", "3-1", "f", "c"],
                ["XGROUP", "CREATE", "s", "g", "0"], ["XGROUP", "CREATE", "s", "h", "$"],
                ["XREADGROUP", "GROUP", "g", "alice", "COUNT", "2", "STREAMS", "s", ">"],
                ["XREADGROUP", "GROUP", "g", "bob", "STREAMS", "s", ">"],
                ["SET", "str", "x"])


def group(db, name=b"g", key=b"s"):
    return db.get(key).cgroups.find(name)


# -- blocking -------------------------------------------------------------------

def test_block_on_new_entries_then_retry_serves_them():
    db = make(["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"], ["XGROUP", "CREATE", "t", "g", "$", "MKSTREAM"])
    blocked = engine_call(db, "XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "s", "t", "s", ">", ">", ">",
                          now_ms=T0)
    assert isinstance(blocked, WouldBlock)
    assert blocked.keys == [b"s", b"t"] and blocked.timeout_ms == 0 and blocked.timeout_reply is NULL_ARRAY
    # Blocking is not being served: redis creates the consumer only when it serves.
    assert group(db).consumers.numele == 0
    assert b"COUNT" in blocked.retry_argv and b"BLOCK" in blocked.retry_argv

    db.pop_ready_keys()
    engine_call(db, "XADD", "t", "5-0", "k", "v", now_ms=T0 + 10)
    assert db.pop_ready_keys() == {b"t"}
    served = execute(db, blocked.retry_argv, T0 + 20)
    assert served == [[b"t", [[b"5-0", [b"k", b"v"]]]]]
    consumer = group(db, key=b"t").consumers.find(b"c")
    assert consumer.seen_time == T0 + 20
    assert consumer.pel.find(_key(5, 0)).delivery_time == T0 + 20


def test_retry_keeps_an_explicit_count_and_noack():
    db = make(["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"])
    blocked = engine_call(db, "XREADGROUP", "GROUP", "g", "c", "COUNT", "2", "NOACK", "BLOCK", "10",
                          "STREAMS", "s", ">", now_ms=T0)
    assert blocked.retry_argv.count(b"COUNT") == 1 and b"NOACK" in blocked.retry_argv
    for i in range(1, 5):
        engine_call(db, "XADD", "s", "%d-0" % i, "k", "v", now_ms=T0)
    served = execute(db, blocked.retry_argv, T0 + 1)
    assert [e[0] for e in served[0][1]] == [b"1-0", b"2-0"]
    assert group(db).pel.numele == 0              # NOACK: nothing pending


def test_history_reads_and_served_streams_never_block():
    db = populated()
    reply = engine_call(db, "XREADGROUP", "GROUP", "g", "alice", "BLOCK", "0", "STREAMS", "s", "0", now_ms=T0)
    assert reply == [[b"s", [[b"1-1", [b"f", b"a"]], [b"2-1", [b"f", b"b"]]]]]
    engine_call(db, "XADD", "s", "9-0", "f", "z", now_ms=T0)
    reply = engine_call(db, "XREADGROUP", "GROUP", "h", "x", "BLOCK", "0", "STREAMS", "s", ">", now_ms=T0)
    assert reply == [[b"s", [[b"9-0", [b"f", b"z"]]]]]


def test_destroy_wakes_blocked_readers_with_nogroup():
    db = make(["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"])
    blocked = engine_call(db, "XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "s", ">", now_ms=T0)
    db.pop_ready_keys()
    assert engine_call(db, "XGROUP", "DESTROY", "s", "g", now_ms=T0) == 1
    assert db.pop_ready_keys() == {b"s"}
    retry = engine_call(db, *blocked.retry_argv, now_ms=T0)
    assert isinstance(retry, RedisReplyError) and retry.message.startswith("NOGROUP")


# -- now_ms is the only clock ---------------------------------------------------

def test_times_come_from_now_ms():
    db = populated()
    grp = group(db)
    assert all(n.delivery_time == T0 and n.delivery_count == 1 for _, n in grp.pel.items())
    assert engine_call(db, "XPENDING", "s", "g", "-", "+", "10", now_ms=T0 + 1234) == [
        [b"1-1", b"alice", 1234, 1], [b"2-1", b"alice", 1234, 1], [b"3-1", b"bob", 1234, 1]]
    # A clock that went backwards shows idle 0, never negative.
    assert engine_call(db, "XPENDING", "s", "g", "-", "+", "1", now_ms=T0 - 50)[0][2] == 0
    assert engine_call(db, "XINFO", "CONSUMERS", "s", "g", now_ms=T0 + 7) == [
        [b"name", b"alice", b"pending", 2, b"idle", 7], [b"name", b"bob", b"pending", 1, b"idle", 7]]
    engine_call(db, "XCLAIM", "s", "g", "carol", "0", "1-1", "IDLE", "500", now_ms=T0 + 1000)
    assert grp.pel.find(_key(1, 1)).delivery_time == T0 + 500
    engine_call(db, "XCLAIM", "s", "g", "carol", "0", "2-1", "TIME", str(T0 + 99999), now_ms=T0 + 1000)
    assert grp.pel.find(_key(2, 1)).delivery_time == T0 + 1000     # future TIME means now
    assert grp.consumers.find(b"carol").seen_time == T0 + 1000
    engine_call(db, "XREADGROUP", "GROUP", "g", "alice", "STREAMS", "s", "0", now_ms=T0 + 3000)
    assert grp.consumers.find(b"alice").seen_time == T0 + 3000


def _key(ms, seq):
    """A PEL key: PELs are keyed by StreamID (pel.py)."""
    return StreamID(ms, seq)


# -- shared NACKs and invariants -------------------------------------------------

def test_nacks_are_shared_and_move_with_ownership():
    db = populated()
    grp = group(db)
    for key, nack in grp.pel.items():
        assert nack.consumer.pel.find(key) is nack
    nack = grp.pel.find(_key(1, 1))
    engine_call(db, "XCLAIM", "s", "g", "bob", "0", "1-1", now_ms=T0)
    assert grp.pel.find(_key(1, 1)) is nack and nack.consumer.name == b"bob"
    assert grp.consumers.find(b"bob").pel.find(_key(1, 1)) is nack
    assert grp.consumers.find(b"alice").pel.find(_key(1, 1)) is None
    # SETID backwards: a `>` read re-delivers pending entries to the reader, count reset.
    engine_call(db, "XGROUP", "SETID", "s", "g", "0", now_ms=T0)
    engine_call(db, "XREADGROUP", "GROUP", "g", "dan", "STREAMS", "s", ">", now_ms=T0 + 5)
    dan = grp.consumers.find(b"dan")
    assert dan.pel.numele == 3 and grp.pel.numele == 3
    assert all(n.consumer is dan and n.delivery_count == 1 and n.delivery_time == T0 + 5 for _, n in grp.pel.items())
    g.check_group(grp)


def test_delconsumer_drops_its_pending_entries():
    db = populated()
    assert engine_call(db, "XGROUP", "DELCONSUMER", "s", "g", "alice", now_ms=T0) == 2
    grp = group(db)
    assert [k for k, _ in grp.pel.items()] == [_key(3, 1)]
    g.check_group(grp)


def test_invariant_catches_a_broken_pel():
    db = populated()
    grp = group(db)
    grp.consumers.find(b"bob").pel.remove(_key(3, 1))
    with pytest.raises(InvariantViolation):
        g.check_group(grp)
    db = populated()
    grp = group(db)
    nack = grp.pel.find(_key(1, 1))
    grp.pel.insert(_key(1, 1), g.NACK(nack.delivery_time, nack.delivery_count, nack.consumer))   # not shared
    with pytest.raises(InvariantViolation):
        g.check_group(grp)


# -- errors change nothing --------------------------------------------------------

BAD = [
    ["XGROUP", "CREATE", "s", "g", "$"], ["XGROUP", "CREATE", "s", "new", "bad"],
    ["XGROUP", "CREATE", "nokey", "new", "$", "ENTRIESREAD", "-3", "MKSTREAM"],
    ["XGROUP", "CREATE", "nokey", "new", "x", "MKSTREAM"], ["XGROUP", "SETID", "s", "g", "x"],
    ["XGROUP", "SETID", "s", "g", "0", "ENTRIESREAD", "x"], ["XGROUP", "SETID", "s", "nog", "0"],
    ["XGROUP", "CREATECONSUMER", "s", "nog", "c"], ["XGROUP", "CREATECONSUMER", "str", "g", "c"],
    ["XREADGROUP", "GROUP", "g", "newc", "STREAMS", "s", "s", ">", "$"],
    ["XREADGROUP", "GROUP", "g", "newc", "STREAMS", "s", "str", ">", ">"],
    ["XREADGROUP", "GROUP", "g", "newc", "STREAMS", "s", "nokey", ">", ">"],
    ["XREADGROUP", "GROUP", "g", "newc", "STREAMS", "s", "s", ">", "bad"],
    ["XACK", "s", "g", "1-1", "bad"], ["XCLAIM", "s", "g", "newc", "0", "1-1", "LASTID", "9-9", "BOGUS"],
    ["XCLAIM", "s", "g", "newc", "0", "1-1", "FORCE", "IDLE", "x"], ["XCLAIM", "s", "g", "newc", "x", "1-1"],
    ["XAUTOCLAIM", "s", "g", "newc", "0", "0", "COUNT", "0"], ["XAUTOCLAIM", "s", "g", "newc", "0", "0", "BOGUS"],
    ["XAUTOCLAIM", "s", "nog", "newc", "0", "0"],
]


@pytest.mark.parametrize("argv", BAD, ids=lambda a: " ".join(a))
def test_errors_change_nothing(argv):
    db = populated()
    before = dump_stream(db.get(b"s"))
    keys = set(db.data)
    reply = engine_call(db, *argv, now_ms=T0 + 777)
    assert isinstance(reply, RedisReplyError), reply
    assert dump_stream(db.get(b"s")) == before
    assert set(db.data) == keys
