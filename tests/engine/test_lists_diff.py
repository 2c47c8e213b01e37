"""List commands: xraft's engine against a real redis-server 7.0, command by command.

Hypothesis builds sequences over every list command (several keys, a string key
for WRONGTYPE, bad arguments, huge/negative indexes and counts, LPOS options,
LMPOP forms, blocking forms). A blocking form that xraft says would block is
re-sent to redis with a 10 ms timeout, which must then time out too.
`XRAFT_DIFF_EXAMPLES=N` raises the number of sequences for soaks.
"""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.redis_oracle import engine_call
from xraft.node.engine import replies
from xraft.node.engine.cmd_lists import parse_timeout_seconds
from xraft.node.engine.errors import CommandError
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.lists import ListValue

pytestmark = pytest.mark.redis

EXAMPLES = int(os.environ.get("XRAFT_DIFF_EXAMPLES", "200"))
NOW_MS = 1_700_000_000_000

LIST_KEYS = [b"l1", b"l2", b"l3"]
STRING_KEY = b"s1"
KEY = st.sampled_from(LIST_KEYS + [STRING_KEY, b"none"])
ELEMENT = st.one_of(
    st.sampled_from([b"a", b"b", b"c", b"", b"1", b"-1", b"007", b"12345678901234567890",
                     b"9223372036854775807", b"-9223372036854775808", b"x" * 70, b"y" * 5000]),
    st.binary(max_size=6),
)
INDEX = st.one_of(
    st.integers(-8, 8).map(lambda n: b"%d" % n),
    st.sampled_from([b"9223372036854775807", b"-9223372036854775808", b"9223372036854775808",
                     b"1.5", b"abc", b"", b" 1", b"+1", b"01"]),
)
COUNT = st.one_of(st.integers(-3, 12).map(lambda n: b"%d" % n),
                  st.sampled_from([b"9223372036854775807", b"x", b"-9223372036854775808"]))
WHERE = st.sampled_from([b"LEFT", b"right", b"Left", b"middle"])
TIMEOUT = st.sampled_from([b"0", b"0.01", b"1", b"1.5", b"-1", b"-0.0001", b"abc", b"1e300",
                           b"inf", b"nan", b"0x10", b" 1", b"1e-5000", b"", b".5"])


def _cmd(name, *parts):
    return st.tuples(st.just(name), *parts).map(list)


@st.composite
def lpos(draw):
    argv = [b"LPOS", draw(KEY), draw(ELEMENT)]
    for _ in range(draw(st.integers(0, 3))):
        opt = draw(st.sampled_from([b"RANK", b"COUNT", b"MAXLEN", b"rank", b"bogus"]))
        argv += [opt, draw(st.one_of(INDEX, COUNT))]
    if draw(st.booleans()) and len(argv) > 3:
        argv.pop()                     # an option without its value
    return argv


@st.composite
def mpop(draw, blocking: bool):
    argv = [b"BLMPOP", draw(TIMEOUT)] if blocking else [b"LMPOP"]
    keys = draw(st.lists(KEY, min_size=1, max_size=3))
    numkeys = draw(st.one_of(st.just(len(keys)), st.sampled_from([0, -1, 5]),
                             st.just(len(keys) + 1)))
    argv += [b"%d" % numkeys, *keys, draw(WHERE)]
    if draw(st.booleans()):
        argv += [draw(st.sampled_from([b"COUNT", b"count", b"LIMIT"])), draw(COUNT)]
    if draw(st.integers(0, 9)) == 0:
        argv.append(b"COUNT")
    return argv


PUSH = st.sampled_from([b"LPUSH", b"RPUSH", b"LPUSHX", b"RPUSHX"])
COMMAND = st.one_of(
    st.tuples(PUSH, KEY, st.lists(ELEMENT, min_size=1, max_size=5)).map(lambda t: [t[0], t[1], *t[2]]),
    st.tuples(PUSH, KEY, st.lists(ELEMENT, min_size=1, max_size=5)).map(lambda t: [t[0], t[1], *t[2]]),
    _cmd(b"LPOP", KEY), _cmd(b"RPOP", KEY),
    _cmd(b"LPOP", KEY, COUNT), _cmd(b"RPOP", KEY, COUNT), _cmd(b"LPOP", KEY, COUNT, COUNT),
    _cmd(b"LLEN", KEY), _cmd(b"LRANGE", KEY, INDEX, INDEX), _cmd(b"LINDEX", KEY, INDEX),
    _cmd(b"LSET", KEY, INDEX, ELEMENT),
    _cmd(b"LINSERT", KEY, st.sampled_from([b"BEFORE", b"after", b"AFTER", b"inside"]), ELEMENT, ELEMENT),
    _cmd(b"LREM", KEY, COUNT, ELEMENT), _cmd(b"LTRIM", KEY, INDEX, INDEX), lpos(),
    _cmd(b"LMOVE", KEY, KEY, WHERE, WHERE), _cmd(b"RPOPLPUSH", KEY, KEY), mpop(False),
    st.tuples(st.sampled_from([b"BLPOP", b"BRPOP"]), st.lists(KEY, min_size=1, max_size=3), TIMEOUT)
    .map(lambda t: [t[0], *t[1], t[2]]),
    _cmd(b"BLMOVE", KEY, KEY, WHERE, WHERE, TIMEOUT), _cmd(b"BRPOPLPUSH", KEY, KEY, TIMEOUT),
    mpop(True),
    _cmd(b"SET", st.just(STRING_KEY), ELEMENT), _cmd(b"DEL", KEY),
)

_TIMEOUT_POS = {b"BLPOP": -1, b"BRPOP": -1, b"BLMOVE": 5, b"BRPOPLPUSH": 3, b"BLMPOP": 1}


def _run_both(db, redis, argv):
    mine = engine_call(db, *argv, now_ms=NOW_MS)
    if isinstance(mine, replies.WouldBlock):
        # redis must block as well: give it a 10 ms timeout and expect its timeout reply.
        probe = list(argv)
        probe[_TIMEOUT_POS[argv[0].upper()]] = b"0.01"
        theirs = redis.call(*probe)
        assert theirs == mine.timeout_reply, (argv, theirs)
        assert set(mine.keys) <= set(argv)
        assert mine.retry_argv == list(argv)
        return
    theirs = redis.call(*argv)
    assert mine == theirs, (argv, mine, theirs)


def _assert_same_state(db, redis):
    for key in LIST_KEYS + [STRING_KEY]:
        assert engine_call(db, b"TYPE", key) == redis.call(b"TYPE", key), key
        if db.type_name(key) == "list":
            lst = db.get(key)
            lst.check()
            assert len(lst) > 0
            assert engine_call(db, b"LRANGE", key, 0, -1) == redis.call(b"LRANGE", key, 0, -1)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(COMMAND, min_size=5, max_size=40),
       st.sampled_from([-2, -1, 1, 2, 5]))
def test_list_commands_match_redis(redis_oracle, commands, fill):
    redis_oracle.flush()
    redis_oracle.call(b"CONFIG", b"SET", b"list-max-listpack-size", b"%d" % fill)
    db = Keyspace()
    db.config.list_max_listpack_size = fill
    try:
        for argv in commands:
            _run_both(db, redis_oracle, argv)
        _assert_same_state(db, redis_oracle)
    finally:
        redis_oracle.call(b"CONFIG", b"SET", b"list-max-listpack-size", b"-2")


def test_pops_and_counts_reply_shapes(redis):
    db = Keyspace()
    script = [
        [b"LPOP", b"nokey"], [b"LPOP", b"nokey", b"0"], [b"LPOP", b"nokey", b"2"],
        [b"RPUSH", b"k", b"a", b"b", b"c"], [b"LPOP", b"k", b"0"], [b"RPOP", b"k", b"2"],
        [b"LPOP", b"k", b"5"], [b"EXISTS", b"k"], [b"LMPOP", b"1", b"k", b"LEFT"],
        [b"RPUSH", b"k", b"1", b"2", b"3"], [b"LMPOP", b"2", b"nokey", b"k", b"RIGHT", b"COUNT", b"2"],
        [b"LPOS", b"k", b"1", b"COUNT", b"0"], [b"LPOS", b"nokey", b"1", b"COUNT", b"0"], [b"LPOS", b"nokey", b"1"],
        [b"LRANGE", b"nokey", b"a", b"b"], [b"LINDEX", b"nokey", b"a"], [b"LSET", b"nokey", b"a", b"b"],
        [b"LSET", b"k", b"5", b"b"], [b"LTRIM", b"nokey", b"x", b"0"], [b"LPOP", b"k", b"1", b"2"],
    ]
    for argv in script:
        assert engine_call(db, *argv) == redis.call(*argv), argv


def test_blocking_forms_serve_when_data_exists(redis):
    db = Keyspace()
    script = [
        [b"RPUSH", b"a", b"1", b"2", b"3", b"4", b"5"], [b"BLPOP", b"none", b"a", b"0"],
        [b"BRPOP", b"a", b"1.5"], [b"BLMOVE", b"a", b"b", b"LEFT", b"RIGHT", b"0"],
        [b"BRPOPLPUSH", b"a", b"b", b"0"], [b"BLMPOP", b"0", b"2", b"none", b"b", b"LEFT", b"COUNT", b"9"],
        [b"BLPOP", b"a", b"-1"], [b"BLMOVE", b"a", b"b", b"UP", b"LEFT", b"0"],
        [b"BLMPOP", b"x", b"1", b"a", b"LEFT"], [b"BLMPOP", b"0", b"0", b"a", b"LEFT"],
        [b"LRANGE", b"a", b"0", b"-1"], [b"LRANGE", b"b", b"0", b"-1"],
    ]
    for argv in script:
        assert engine_call(db, *argv) == redis.call(*argv), argv


def test_blocking_forms_return_would_block():
    db = Keyspace()
    wb = engine_call(db, b"BLPOP", b"a", b"b", b"1.5")
    assert isinstance(wb, replies.WouldBlock)
    assert (wb.keys, wb.timeout_ms, wb.timeout_reply) == ([b"a", b"b"], 1500, replies.NULL_ARRAY)
    wb = engine_call(db, b"BLMOVE", b"a", b"b", b"LEFT", b"RIGHT", b"0")
    assert (wb.keys, wb.timeout_ms, wb.timeout_reply) == ([b"a"], 0, replies.NULL_ARRAY)
    wb = engine_call(db, b"BLMPOP", b"0.0011", b"2", b"a", b"c", b"RIGHT")
    assert (wb.keys, wb.timeout_ms) == ([b"a", b"c"], 2)
    # A push signals the key so the server retries the blocked command.
    db.pop_ready_keys()
    engine_call(db, b"RPUSH", b"c", b"v")
    assert db.pop_ready_keys() == {b"c"}
    assert engine_call(db, *wb.retry_argv) == [b"c", [b"v"]]


@pytest.mark.parametrize("text,ms", [
    (b"0", 0), (b"1", 1000), (b"0.001", 1), (b"0.0011", 2), (b"-0.0001", 0), (b"0x1p3", 8000),
    (b"1e-4940", 1), (b".5", 500), (b"1.", 1000), (b"2\x00junk", 2000),
])
def test_timeout_parsing(text, ms):
    assert parse_timeout_seconds(text) == ms


@pytest.mark.parametrize("text,err", [
    (b"abc", "not a float"), (b" 1", "not a float"), (b"1e", "not a float"), (b"nan", "not a float"),
    (b"1e-5000", "not a float"), (b"1e5000", "not a float"), (b"", "not a float"),
    (b"-1", "negative"), (b"1e300", "negative"), (b"inf", "negative"), (b"-inf", "negative"),
])
def test_timeout_errors(text, err):
    with pytest.raises(CommandError, match=err):
        parse_timeout_seconds(text)


def test_timeouts_match_redis(redis):
    # Every timeout spelling against a list with data: the parse result decides
    # between an error and a served element, so replies must agree.
    db = Keyspace()
    for t in [b"0", b"1", b"-1", b"-0.0001", b"1e300", b"9223372036854775.807", b"9223372036854775.808",
              b"inf", b"-inf", b"nan", b"0x1p3", b"1e-5000", b"1e5000", b"1e-4940", b"", b" 1", b"1 ",
              b"+1", b"1e", b"0x", b".", b"1.5e3", b"INFINITY", b"infinit"]:
        for argv in ([b"RPUSH", b"k", b"v"], [b"BLPOP", b"k", t], [b"DEL", b"k"]):
            assert engine_call(db, *argv) == redis.call(*argv), argv


def test_node_structure_under_small_fill():
    db = Keyspace()
    db.config.list_max_listpack_size = 2
    for i in range(50):
        engine_call(db, b"RPUSH" if i % 2 else b"LPUSH", b"k", b"%d" % i)
    lst = db.get(b"k")
    lst.check()
    assert len(lst.nodes) == 25 and max(lst.counts) == 2
    engine_call(db, b"LINSERT", b"k", b"BEFORE", b"25", b"big" * 100)
    engine_call(db, b"LSET", b"k", b"0", b"z" * 9000)
    lst.check()
    assert engine_call(db, b"LINDEX", b"k", b"0") == b"z" * 9000
    assert isinstance(lst, ListValue)
