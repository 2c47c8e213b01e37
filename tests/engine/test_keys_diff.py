"""Keyspace and string commands: xraft's engine against a real redis-server 7.0.

KEYS replies are compared after sorting (dict order differs); SCAN is compared
by full iteration, as a set, and must return each key exactly once.
`XRAFT_DIFF_EXAMPLES=N` raises the number of examples for soaks.
"""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.redis_oracle import RedisReplyError, engine_call
from xraft.node.engine.cmd_keys import EXPIRY_UNSUPPORTED, glob_match
from xraft.node.engine.keyspace import Keyspace

pytestmark = pytest.mark.redis

EXAMPLES = int(os.environ.get("XRAFT_DIFF_EXAMPLES", "120"))
NOW_MS = 1_700_000_000_000

KEY = st.one_of(st.sampled_from([b"a", b"b", b"ab", b"abc", b"", b"k1", b"k2", b"\xff", b"a*"]),
                st.binary(max_size=4))
VALUE = st.one_of(st.sampled_from([b"v", b"", b"1", b"x" * 100]), st.binary(max_size=4))
SET_OPT = st.sampled_from([b"NX", b"XX", b"GET", b"nx", b"get", b"KEEPTTL", b"EX", b"PX", b"EXAT",
                           b"PXAT", b"bogus", b"10", b"0", b"-5", b"x", b"9223372036854775807"])
GLOB = st.lists(st.sampled_from([b"a", b"b", b"*", b"?", b"[", b"]", b"^", b"-", b"\\", b"\xff",
                                 b"\x80", b"\x00", b"k", b"1", b"[a-b]", b"[^a]", b"*a*"]),
                max_size=6).map(b"".join)


def _cmd(name, *parts):
    return st.tuples(st.just(name), *parts).map(list)


COMMAND = st.one_of(
    st.tuples(KEY, VALUE, st.lists(SET_OPT, max_size=3)).map(lambda t: [b"SET", t[0], t[1], *t[2]]),
    _cmd(b"SET", KEY, VALUE), _cmd(b"GET", KEY),
    st.lists(KEY, min_size=1, max_size=3).map(lambda ks: [b"DEL", *ks]),
    st.lists(KEY, min_size=1, max_size=3).map(lambda ks: [b"UNLINK", *ks]),
    st.lists(KEY, min_size=1, max_size=3).map(lambda ks: [b"EXISTS", *ks]),
    _cmd(b"TYPE", KEY), _cmd(b"RENAME", KEY, KEY), _cmd(b"RENAMENX", KEY, KEY),
    _cmd(b"RPUSH", KEY, VALUE), _cmd(b"LPOP", KEY), _cmd(b"DBSIZE"),
    _cmd(b"ECHO", VALUE), _cmd(b"PING"), _cmd(b"PING", VALUE), _cmd(b"PING", VALUE, VALUE),
    _cmd(b"FLUSHDB", st.sampled_from([b"ASYNC", b"sync", b"later"])),
)


def _full_scan(call, extra):
    """Every key a full SCAN iteration returns (a list: duplicates kept)."""
    cursor, seen, rounds = b"0", [], 0
    while True:
        reply = call(b"SCAN", cursor, *extra)
        if isinstance(reply, RedisReplyError):
            return reply
        cursor, keys = reply
        seen += keys
        rounds += 1
        assert rounds < 10_000
        if cursor == b"0":
            return seen


def _compare_listings(db, redis, pattern, count, type_name):
    mine = engine_call(db, b"KEYS", pattern)
    theirs = redis.call(b"KEYS", pattern)
    assert sorted(mine) == sorted(theirs), pattern
    extra = [b"MATCH", pattern, b"COUNT", count] + ([b"TYPE", type_name] if type_name else [])
    mine = _full_scan(lambda *a: engine_call(db, *a), extra)
    theirs = _full_scan(redis.call, extra)
    if isinstance(theirs, RedisReplyError):
        assert mine == theirs
        return
    assert len(mine) == len(set(mine)), "SCAN returned a key twice"
    assert set(mine) == set(theirs), (pattern, type_name)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(COMMAND, min_size=5, max_size=40), GLOB,
       st.sampled_from([b"1", b"3", b"10", b"1000"]), st.sampled_from([None, b"string", b"LIST", b"nosuch"]))
def test_key_commands_match_redis(redis_oracle, commands, pattern, count, type_name):
    redis_oracle.flush()
    db = Keyspace()
    for argv in commands:
        mine = engine_call(db, *argv, now_ms=NOW_MS)
        if mine == RedisReplyError(EXPIRY_UNSUPPORTED):
            # Our documented refusal (redis would set a TTL): nothing changed
            # here, so redis does not get the command either.
            continue
        theirs = redis_oracle.call(*argv)
        assert mine == theirs, (argv, mine, theirs)
    assert sorted(engine_call(db, b"KEYS", b"*")) == sorted(redis_oracle.call(b"KEYS", b"*"))
    _compare_listings(db, redis_oracle, pattern, count, type_name)


@settings(max_examples=EXAMPLES * 3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.binary(max_size=5) | GLOB, min_size=1, max_size=30, unique=True), st.lists(GLOB, max_size=8))
def test_glob_matches_redis_keys(redis_oracle, keys, patterns):
    redis_oracle.flush()
    db = Keyspace()
    for key in keys:
        engine_call(db, b"SET", key, b"v")
        redis_oracle.call(b"SET", key, b"v")
    for pattern in patterns:
        assert sorted(engine_call(db, b"KEYS", pattern)) == sorted(redis_oracle.call(b"KEYS", pattern)), pattern


@pytest.mark.parametrize("pattern,string,expected", [
    (b"?*", b"", False), (b"**", b"", False), (b"a*", b"a", True), (b"[a-]", b"]", True),
    (b"[a-]", b"b", False), (b"[a-]", b"^", True), (b"[z-a]", b"m", True), (b"[^a]", b"a", False), (b"\\*", b"*", True),
    (b"[\\]]", b"]", True), (b"[abc", b"c", True), (b"*a*a*a*a*a*b", b"a" * 40, False),
    (b"*" * 3000 + b"x", b"y" * 50 + b"x", True), (b"[\x80-\xff]", b"\x90", True), (b"[\x00-\xff]", b"a", False),
])
def test_glob_quirks(redis, pattern, string, expected):
    assert glob_match(pattern, string) is expected
    redis.call(b"SET", string, b"v")
    assert (redis.call(b"KEYS", pattern) == [string]) is expected


def test_scan_is_exhaustive_on_a_bigger_keyspace(redis):
    db = Keyspace()
    for i in range(2000):
        engine_call(db, b"SET", b"key:%d" % i, b"v")
    for count in (b"1", b"7", b"100", b"5000"):
        keys = _full_scan(lambda *a: engine_call(db, *a), [b"COUNT", count])
        assert len(keys) == 2000 and len(set(keys)) == 2000


def test_scan_cursor_and_option_errors(redis):
    db = Keyspace()
    for argv in ([b"SCAN", b"x"], [b"SCAN", b" 1"], [b"SCAN", b"1 "], [b"SCAN", b"99999999999999999999999"],
                 [b"SCAN", b"0", b"COUNT", b"0"], [b"SCAN", b"0", b"COUNT", b"x"], [b"SCAN", b"0", b"MATCH"],
                 [b"SCAN", b"0", b"FOO", b"1"], [b"SCAN", b"0", b"TYPE"], [b"SCAN", b"-1", b"COUNT", b"-1"]):
        assert engine_call(db, *argv) == redis.call(*argv), argv
    for cursor in (b"", b"+0", b"-0", b"000"):
        assert engine_call(db, b"SCAN", cursor) == redis.call(b"SCAN", cursor) == [b"0", []]


def test_set_expiry_is_refused_after_redis_validation(redis):
    db = Keyspace()
    for argv in ([b"SET", b"k", b"v", b"EX", b"x"], [b"SET", b"k", b"v", b"EX", b"0"],
                 [b"SET", b"k", b"v", b"PX", b"-1"], [b"SET", b"k", b"v", b"EX", b"9223372036854775807"],
                 [b"SET", b"k", b"v", b"EX", b"1", b"PX", b"1"], [b"SET", b"k", b"v", b"KEEPTTL", b"PX", b"1"],
                 [b"SET", b"k", b"v", b"EX"]):
        assert engine_call(db, *argv, now_ms=NOW_MS) == redis.call(*argv), argv
    for argv in ([b"SET", b"k", b"v", b"EX", b"10"], [b"SET", b"k", b"v", b"PXAT", b"1"]):
        assert engine_call(db, *argv, now_ms=NOW_MS) == RedisReplyError(EXPIRY_UNSUPPORTED)
    assert engine_call(db, b"EXISTS", b"k") == 0
    assert engine_call(db, b"SET", b"k", b"v", b"KEEPTTL") == redis.call(b"SET", b"k", b"v", b"KEEPTTL")


def test_flush_and_wrongtype(redis):
    db = Keyspace()
    script = [[b"RPUSH", b"l", b"x"], [b"GET", b"l"], [b"SET", b"l", b"v", b"GET"], [b"SET", b"s", b"v"],
              [b"LPUSH", b"s", b"x"], [b"RENAME", b"l", b"s"], [b"TYPE", b"s"], [b"GET", b"s"],
              [b"RENAME", b"nokey", b"x"], [b"RENAMENX", b"s", b"s"], [b"RENAME", b"s", b"s"],
              [b"FLUSHALL", b"SYNC", b"x"], [b"FLUSHALL", b"ASYNC"], [b"DBSIZE"], [b"FLUSHDB"], [b"FLUSHALL"]]
    for argv in script:
        assert engine_call(db, *argv) == redis.call(*argv), argv


NUMERIC = st.one_of(st.integers(-2**64, 2**64).map(lambda n: b"%d" % n),
                    st.sampled_from([b"0", b"-0", b"007", b"+1", b" 1", b"1 ", b"9999", b"10000", b"-1",
                                     b"9223372036854775807", b"9223372036854775808", b"1.5", b"1e3"]))
OBJECT_VALUE = st.one_of(NUMERIC, VALUE, st.integers(40, 50).map(lambda n: b"y" * n))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from([b"SET", b"RPUSH", b"XADD"]), OBJECT_VALUE), min_size=1, max_size=8))
def test_object_matches_redis(redis_oracle, writes):
    """OBJECT ENCODING/REFCOUNT/FREQ of what the engine holds, in redis 7.0's words."""
    redis_oracle.flush()
    db = Keyspace()
    for i, (cmd, value) in enumerate(writes):
        key = b"k%d" % i
        argv = [cmd, key, value] if cmd != b"XADD" else [cmd, key, b"*", b"f", value]
        assert type(engine_call(db, *argv, now_ms=NOW_MS)) is type(redis_oracle.call(*argv))
        for sub in (b"ENCODING", b"REFCOUNT", b"FREQ"):
            argv = [b"OBJECT", sub, key]
            assert engine_call(db, *argv) == redis_oracle.call(*argv), (argv, value)
