"""Focused tests of the stream commands' edge cases: ID overflow, `<ms>-*`,
XSETID's rules, XREAD `$` and its WouldBlock, error paths that must change
nothing, and the command table entries. Where redis can answer too, the test
asks it as well, so the expected values are redis's, not ours."""
import pytest

from tests.redis_oracle import RedisReplyError, engine_call
from xraft.node.engine.commands import BLOCKING, READONLY, WRITE, lookup
from xraft.node.engine.errors import CommandError
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.replies import NULL_ARRAY, WouldBlock
from xraft.node.engine.stream import Stream
from xraft.node.engine.stream_args import (
    entries_reply, lookup_stream, parse_count, parse_interval, parse_range_id, parse_timeout_ms,
)
from xraft.node.engine.streamid import MAX_ID, StreamID

MAX = 18446744073709551615


def both(redis, db, *argv, now_ms=0):
    """Run argv on both sides; they must agree; return the reply."""
    expected = redis.call(*argv)
    got = engine_call(db, *argv, now_ms=now_ms)
    assert got == expected and type(got) is type(expected), (argv, expected, got)
    return got


def err(text):
    return RedisReplyError(text)


# -- XADD IDs -------------------------------------------------------------------

def test_auto_id_takes_now_ms_and_never_goes_back():
    db = Keyspace()
    assert engine_call(db, "XADD", "s", "*", "f", "v", now_ms=1000) == b"1000-0"
    assert engine_call(db, "XADD", "s", "*", "f", "v", now_ms=1000) == b"1000-1"
    assert engine_call(db, "XADD", "s", "*", "f", "v", now_ms=999) == b"1000-2"   # clock went back
    assert engine_call(db, "XADD", "s", "*", "f", "v", now_ms=1001) == b"1001-0"
    assert db.ready == {b"s"}


def test_auto_id_after_max_seq_moves_to_next_ms():
    db = Keyspace()
    assert engine_call(db, "XADD", "s", f"7-{MAX}", "f", "v") == f"7-{MAX}".encode()
    assert engine_call(db, "XADD", "s", "*", "f", "v", now_ms=3) == b"8-0"


def test_exhausted_stream(redis):
    db = Keyspace()
    both(redis, db, "XADD", "s", f"{MAX}-{MAX}", "f", "v")
    e = both(redis, db, "XADD", "s", "*", "f", "v", now_ms=5)
    assert e == err("ERR The stream has exhausted the last possible ID, unable to add more items")
    both(redis, db, "XADD", "s", f"{MAX}-*", "f", "v")
    assert both(redis, db, "XLEN", "s") == 1


def test_ms_star_ids(redis):
    db = Keyspace()
    assert both(redis, db, "XADD", "s", "5-3", "f", "v") == b"5-3"
    assert both(redis, db, "XADD", "s", "5-*", "f", "v") == b"5-4"
    assert both(redis, db, "XADD", "s", "6-*", "f", "v") == b"6-0"
    assert both(redis, db, "XADD", "s", "4-*", "f", "v") == err(
        "ERR The ID specified in XADD is equal or smaller than the target stream top item")
    assert both(redis, db, "XADD", "new", "0-*", "f", "v") == b"0-1"


def test_ms_star_with_exhausted_sequence_says_too_large(redis):
    # redis's streamAppendItem fails without setting errno = EDOM here.
    db = Keyspace()
    both(redis, db, "XADD", "s", f"5-{MAX}", "f", "v")
    assert both(redis, db, "XADD", "s", "5-*", "f", "v") == err("ERR Elements are too large to be stored")
    assert both(redis, db, "XADD", "s", "6-*", "f", "v") == b"6-0"


@pytest.mark.parametrize("argv", [
    ["XADD", "s", "0-0", "f", "v"],
    ["XADD", "s", "0", "f", "v"],
    ["XADD", "s", "MAXLEN", "-1", "*", "f", "v"],
    ["XADD", "s", "MAXLEN", "~", "x", "*", "f", "v"],
    ["XADD", "s", "MINID", "bad", "*", "f", "v"],
    ["XADD", "s", "MAXLEN", "1", "MINID", "1", "*", "f", "v"],
    ["XADD", "s", "LIMIT", "5", "*", "f", "v"],
    ["XADD", "s", "MAXLEN", "5", "LIMIT", "5", "*", "f", "v"],
    ["XADD", "s", "LIMIT", "-1", "*", "f", "v"],
    ["XADD", "s", "*", "f", "v", "odd"],
    ["XADD", "s", "NOMKSTREAM", "*", "f"],
    ["XADD", "s", "1-x", "f", "v"],
    ["XADD", "s", "+", "f", "v"],
    ["XADD", "s", "NOMKSTREAM", "*", "f", "v"],
])
def test_xadd_failures_do_not_create_the_key(redis, argv):
    db = Keyspace()
    reply = both(redis, db, *argv, now_ms=1)
    assert reply is None or isinstance(reply, RedisReplyError)
    assert redis.call("EXISTS", "s") == 0 and db.data == {}


def test_xadd_failure_on_existing_stream_changes_nothing(redis):
    db = Keyspace()
    both(redis, db, "XADD", "s", "3-0", "f", "v")
    before = both(redis, db, "XRANGE", "s", "-", "+")
    both(redis, db, "XADD", "s", "MAXLEN", "0", "3-0", "f", "v")           # equal to top item
    both(redis, db, "XADD", "s", "MAXLEN", "0", "LIMIT", "1", "4-0", "f", "v")
    assert both(redis, db, "XRANGE", "s", "-", "+") == before
    assert db.data[b"s"].entries_added == 1


def test_xadd_trim_may_remove_the_new_entry(redis):
    db = Keyspace()
    both(redis, db, "XADD", "s", "1-0", "f", "v")
    assert both(redis, db, "XADD", "s", "MAXLEN", "0", "2-0", "f", "v") == b"2-0"
    assert both(redis, db, "XLEN", "s") == 0
    assert db.data[b"s"].last_id == StreamID(2, 0)


# -- XRANGE ---------------------------------------------------------------------

def test_range_bound_errors(redis):
    db = Keyspace()
    both(redis, db, "XADD", "s", "1-1", "f", "v")
    assert both(redis, db, "XRANGE", "s", f"({MAX}-{MAX}", "+") == err("ERR invalid start ID for the interval")
    assert both(redis, db, "XRANGE", "s", "-", "(0-0") == err("ERR invalid end ID for the interval")
    assert both(redis, db, "XRANGE", "s", "(-", "+") == err(
        "ERR Invalid stream ID specified as stream command argument")
    assert both(redis, db, "XRANGE", "s", "(1", "+") == [[b"1-1", [b"f", b"v"]]]
    assert both(redis, db, "XRANGE", "s", "(1-1", "+") == []
    assert both(redis, db, "XRANGE", "s", "-", "+", "COUNT", "0") is NULL_ARRAY
    assert both(redis, db, "XRANGE", "missing", "-", "+", "COUNT", "0") == []
    assert both(redis, db, "XRANGE", "s", "-", "+", "COUNT") == err("ERR syntax error")


def test_interval_helpers():
    assert parse_range_id(b"(5", 0) == (StreamID(5, 0), True)
    assert parse_range_id(b"5", MAX) == (StreamID(5, MAX), False)
    with pytest.raises(CommandError):
        parse_range_id(b"(", 0)       # a lone "(" is read as an ID, and is not one
    assert parse_interval(b"(1-5", b"(2-0") == (StreamID(1, 6), StreamID(1, MAX))
    assert parse_interval(b"(1", b"(2") == (StreamID(1, 1), StreamID(2, MAX - 1))   # <ms> end: seq MAX first
    assert parse_count(b"-4") == 0 and parse_count(b"7") == 7
    assert parse_timeout_ms(b"0") == 0


# -- XDEL / XTRIM ---------------------------------------------------------------

def test_xdel_bookkeeping(redis):
    db = Keyspace()
    for i in range(1, 5):
        both(redis, db, "XADD", "s", f"{i}-0", "f", "v")
    assert both(redis, db, "XDEL", "s", "1-0", "3-0", "9-0") == 2
    s = db.data[b"s"]
    assert s.max_deleted_entry_id == StreamID(3, 0)   # 9-0 did not exist
    assert s.first_id == StreamID(2, 0)
    assert both(redis, db, "XDEL", "s", "2-0", "bad") == err(
        "ERR Invalid stream ID specified as stream command argument")
    assert both(redis, db, "XLEN", "s") == 2                # nothing deleted
    assert both(redis, db, "XDEL", "missing", "bad") == 0   # key checked before IDs
    assert both(redis, db, "XDEL", "s", "2-0", "4-0") == 2
    assert s.first_id == StreamID(0, 0) and s.length == 0
    assert both(redis, db, "XADD", "s", "4-0", "f", "v") == err(
        "ERR The ID specified in XADD is equal or smaller than the target stream top item")


def test_xtrim_argument_errors(redis):
    db = Keyspace()
    both(redis, db, "XADD", "s", "1-0", "f", "v")
    for argv in (["XTRIM", "s", "LIMIT", "1"], ["XTRIM", "s", "FOO", "1"], ["XTRIM", "s", "MAXLEN", "=", "1", "LIMIT", "1"],
                 ["XTRIM", "s", "MAXLEN", "~"], ["XTRIM", "s", "MINID", "-"], ["XTRIM", "s", "NOMKSTREAM", "MAXLEN", "1"],
                 ["XTRIM", "s", "MAXLEN", "1", "LIMIT", "0"], ["XTRIM", "s", "MAXLEN", "~", "0", "LIMIT", "0"]):
        both(redis, db, *argv)
    assert both(redis, db, "XLEN", "s") == 0   # the last one trims (LIMIT 0 = unlimited)


# -- XSETID ---------------------------------------------------------------------

def test_xsetid_rules(redis):
    db = Keyspace()
    assert both(redis, db, "XSETID", "s", "5-0") == err("ERR no such key")
    both(redis, db, "XADD", "s", "3-0", "f", "v")
    both(redis, db, "XADD", "s", "4-0", "f", "v")
    assert both(redis, db, "XSETID", "s", "3-5") == err(
        "ERR The ID specified in XSETID is smaller than the target stream top item")
    assert both(redis, db, "XSETID", "s", "9-0", "ENTRIESADDED", "1") == err(
        "ERR The entries_added specified in XSETID is smaller than the target stream length")
    assert both(redis, db, "XSETID", "s", "9-0", "ENTRIESADDED", "-1") == err("ERR entries_added must be positive")
    assert both(redis, db, "XSETID", "s", "9-0", "MAXDELETEDID", "9-1") == err(
        "ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id")
    assert both(redis, db, "XSETID", "s", "9-0", "ENTRIESADDED") == err("ERR syntax error")
    assert both(redis, db, "XSETID", "s", "9-0", "ENTRIESADDED", "7", "MAXDELETEDID", "2-0") == "OK"
    s = db.data[b"s"]
    assert (s.last_id, s.entries_added, s.max_deleted_entry_id) == (StreamID(9, 0), 7, StreamID(2, 0))
    assert both(redis, db, "XADD", "s", "9-*", "f", "v") == b"9-1"
    assert engine_call(Keyspace(), "XSETID", "s", "1") == err("ERR no such key")
    # An empty stream accepts any last ID, even a smaller one.
    both(redis, db, "XTRIM", "s", "MAXLEN", "0")
    assert both(redis, db, "XSETID", "s", "1-0") == "OK"
    assert both(redis, db, "XADD", "s", "1-*", "f", "v") == b"1-1"


# -- XREAD ----------------------------------------------------------------------

def test_xread_without_data():
    db = Keyspace()
    assert engine_call(db, "XREAD", "STREAMS", "s", "$") is NULL_ARRAY
    engine_call(db, "XADD", "s", "3-0", "f", "v")
    assert engine_call(db, "XREAD", "STREAMS", "s", "$") is NULL_ARRAY
    assert engine_call(db, "XREAD", "STREAMS", "s", "0") == [[b"s", [[b"3-0", [b"f", b"v"]]]]]


def test_xread_block_resolves_dollar():
    db = Keyspace()
    engine_call(db, "XADD", "a", "3-0", "f", "v")
    engine_call(db, "XADD", "a", "4-0", "f", "v")
    engine_call(db, "XDEL", "a", "4-0")          # $ is last_id (4-0), not the last entry
    reply = engine_call(db, "XREAD", "BLOCK", "1500", "STREAMS", "a", "b", "a", "$", "$", "3-0")
    assert isinstance(reply, WouldBlock)
    assert reply.keys == [b"a", b"b"]
    assert reply.timeout_ms == 1500 and reply.timeout_reply is NULL_ARRAY
    assert reply.retry_argv == [b"XREAD", b"BLOCK", b"1500", b"COUNT", b"1000", b"STREAMS",
                                b"a", b"b", b"a", b"4-0", b"0-0", b"3-0"]
    # The retry serves only what arrived after the block.
    engine_call(db, "XADD", "b", "1-0", "x", "y")
    engine_call(db, "XADD", "a", "5-0", "f", "w")
    from xraft.node.engine.commands import execute
    served = execute(db, reply.retry_argv, 0)
    assert served == [[b"a", [[b"5-0", [b"f", b"w"]]]], [b"b", [[b"1-0", [b"x", b"y"]]]],
                      [b"a", [[b"5-0", [b"f", b"w"]]]]]


def test_xread_block_keeps_given_count_and_serves_at_once_with_data(redis):
    db = Keyspace()
    reply = engine_call(db, "XREAD", "COUNT", "2", "BLOCK", "0", "STREAMS", "s", "0-0")
    assert isinstance(reply, WouldBlock) and reply.timeout_ms == 0
    assert reply.retry_argv == [b"XREAD", b"COUNT", b"2", b"BLOCK", b"0", b"STREAMS", b"s", b"0-0"]
    for i in range(1, 4):
        both(redis, db, "XADD", "s", f"{i}-0", "f", "v")
    got = both(redis, db, "XREAD", "COUNT", "2", "BLOCK", "0", "STREAMS", "s", "0-0")
    assert [e[0] for e in got[0][1]] == [b"1-0", b"2-0"]


def test_xread_argument_errors(redis):
    db = Keyspace()
    redis.call("SET", "str", "x")
    db.data[b"str"] = b"x"
    for argv in (["XREAD", "STREAMS", "a", "b", "c"], ["XREAD", "COUNT", "1", "STREAMS"], ["XREAD", "FOO", "STREAMS", "a", "0"],
                 ["XREAD", "BLOCK", "-1", "STREAMS", "a", "0"], ["XREAD", "BLOCK", "x", "STREAMS", "a", "0"],
                 ["XREAD", "GROUP", "g", "c", "STREAMS", "a", ">"], ["XREAD", "NOACK", "STREAMS", "a", "0"],
                 ["XREAD", "STREAMS", "a", ">"], ["XREAD", "STREAMS", "str", "bad"], ["XREAD", "STREAMS", "a", "str", "bad", "0"],
                 ["XREAD", "COUNT", "1", "COUNT", "STREAMS", "a", "0"]):
        reply = both(redis, db, *argv)
        assert isinstance(reply, RedisReplyError), argv


# -- the command table and helpers ----------------------------------------------

@pytest.mark.parametrize("name", ["xadd", "xrange", "xrevrange", "xlen", "xdel", "xtrim", "xread", "xsetid"])
def test_command_table_matches_redis(redis, name):
    info = redis.call("COMMAND", "INFO", name)[0]
    spec = lookup([name.encode(), b"k", b"0", b"0", b"0", b"0"][: max(abs(info[1]), 2)])
    assert spec.arity == info[1]
    assert (spec.first_key, spec.last_key, spec.step) == (info[3], info[4], info[5])
    flags = set(info[2])
    assert (WRITE in spec.flags) == ("write" in flags)
    assert (READONLY in spec.flags) == ("readonly" in flags)
    assert (BLOCKING in spec.flags) == ("blocking" in flags)


def test_lookup_stream_and_entries_reply():
    db = Keyspace()
    assert lookup_stream(db, b"none") is None
    db.data[b"str"] = b"x"
    with pytest.raises(Exception) as e:
        lookup_stream(db, b"str")
    assert "WRONGTYPE" in str(e.value)
    engine_call(db, "XADD", "s", "1-2", "f", "v")
    assert isinstance(lookup_stream(db, b"s"), Stream)
    assert entries_reply([(StreamID(1, 2), [b"f", b"v"]), (MAX_ID, [])]) == [
        [b"1-2", [b"f", b"v"]], [f"{MAX}-{MAX}".encode(), []]]


# -- approximate trimming's default LIMIT ---------------------------------------

def _fill(redis, db, key, n):
    """XADD n entries (IDs 1-0 .. n-0) on both sides; redis pipelined."""
    for i in range(1, n + 1):
        redis.send("XADD", key, f"{i}-0", "f", "v")
    replies = [redis.read() for _ in range(n)]
    assert replies[-1] == f"{n}-0".encode()
    for i in range(1, n + 1):
        engine_call(db, "XADD", key, f"{i}-0", "f", "v")


@pytest.mark.parametrize("entries, nbytes, n, removed", [
    (1, 4096, 150, 100),      # LIMIT defaults to 100 * stream-node-max-entries
    (0, 1, 10050, 10000),     # ... and to 10000 when that is 0 (here one entry per node by bytes)
])
def test_approx_trim_default_limit(redis, entries, nbytes, n, removed):
    db = Keyspace()
    db.config.stream_node_max_entries, db.config.stream_node_max_bytes = entries, nbytes
    redis.call("CONFIG", "SET", "stream-node-max-entries", entries, "stream-node-max-bytes", nbytes)
    try:
        _fill(redis, db, "s", n)
        assert both(redis, db, "XTRIM", "s", "MAXLEN", "~", "0") == removed
        assert both(redis, db, "XLEN", "s") == n - removed
        assert both(redis, db, "XRANGE", "s", "-", "+", "COUNT", "3")[0][0] == f"{removed + 1}-0".encode()
    finally:
        redis.call("CONFIG", "SET", "stream-node-max-entries", 100, "stream-node-max-bytes", 4096)


def test_approx_limit_is_capped():
    from xraft.node.engine.cmd_streams import parse_add_or_trim_args
    argv = [b"XTRIM", b"s", b"MAXLEN", b"~", b"0"]
    assert parse_add_or_trim_args(argv, False, 20000).limit == 1000000
    assert parse_add_or_trim_args(argv, False, 7).limit == 700
    assert parse_add_or_trim_args([b"XTRIM", b"s", b"MAXLEN", b"0"], False, 7).limit == 0   # exact: unlimited
    assert parse_add_or_trim_args(argv + [b"LIMIT", b"3"], False, 7).limit == 3
