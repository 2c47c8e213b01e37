"""What the engine tells the server about blocked clients' keys: a stream that
goes away (deleted, overwritten, renamed away, flushed) is signalled like a
write, so a blocked XREADGROUP is woken; the woken retries apply redis 7.0's
rules for a woken client."""
import pytest

from xraft.node.engine.commands import execute, lookup
from xraft.node.engine.errors import EngineError, NoGroupError, UnknownCommandError
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.replies import NULL_ARRAY


def run(db, text):
    return execute(db, [a.encode() for a in text.split()], 0)


def woken(db, *argv):
    """An internal (woken) command, as the fsm applies it."""
    argv = list(argv)
    return lookup(argv, internal=True).handler(db, argv, 0)


def signalled(db, text):
    db.pop_ready_keys()
    run(db, text)
    return db.pop_ready_keys()


@pytest.fixture
def db():
    d = Keyspace()
    run(d, "XADD s 1-1 f v")
    run(d, "XGROUP CREATE s g $")
    run(d, "RPUSH l a")
    run(d, "SET str x")
    return d


@pytest.mark.parametrize("cmd", ["DEL s", "UNLINK s", "SET s x", "RENAME s t", "RENAME str s", "FLUSHDB", "FLUSHALL"])
def test_a_stream_that_goes_away_is_signalled(db, cmd):
    assert b"s" in signalled(db, cmd)


@pytest.mark.parametrize("cmd", ["DEL l", "SET l x", "DEL str", "SET str y", "DEL missing", "FLUSHALL"])
def test_lists_and_strings_going_away_wake_no_one(db, cmd):
    assert not signalled(db, cmd) & {b"l", b"str", b"missing"}


@pytest.mark.parametrize("setup, error", [
    ("DEL s", "UNBLOCKED the stream key no longer exists"),
    ("SET s x", "UNBLOCKED the stream key no longer exists"),
    ("XGROUP DESTROY s g", "NOGROUP the consumer group this client was blocked on no longer exists"),
])
def test_a_woken_xreadgroup_fails_as_redis_wakes_it(db, setup, error):
    run(db, setup)
    with pytest.raises(EngineError) as e:
        woken(db, b"xreadgroup-woken", b"GROUP", b"g", b"c", b"STREAMS", b"s", b">")
    assert e.value.message == error
    assert isinstance(e.value, NoGroupError) == error.startswith("NOGROUP")


def test_a_woken_xreadgroup_serves_or_finds_nothing_as_xreadgroup(db):
    argv = [b"xreadgroup-woken", b"GROUP", b"g", b"c", b"STREAMS", b"s", b">"]
    assert woken(db, *argv) is NULL_ARRAY
    run(db, "XADD s 2-1 a b")
    assert woken(db, *argv) == [[b"s", [[b"2-1", [b"a", b"b"]]]]]


def test_woken_pops_skip_keys_that_are_not_lists(db):
    assert woken(db, b"lpop-woken", b"str") is None
    assert woken(db, b"lmpop-woken", b"2", b"str", b"l", b"LEFT") == [b"l", [b"a"]]
    run(db, "RPUSH l b")
    assert woken(db, b"lmove-woken", b"s", b"l", b"LEFT", b"LEFT") is None
    with pytest.raises(EngineError, match="WRONGTYPE"):      # a destination of another type fails
        woken(db, b"lmove-woken", b"l", b"str", b"LEFT", b"LEFT")
    assert run(db, "LRANGE l 0 -1") == [b"b"]


def test_internal_commands_are_unknown_unless_asked_for():
    with pytest.raises(UnknownCommandError):
        lookup([b"lpop-woken", b"l"])
    assert lookup([b"lpop-woken", b"l"], internal=True).name == "lpop-woken"
