"""CONFIG SET and MULTI/EXEC through the fsm against a real redis-server 7.0."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.engine.replies import to_resp2_value
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.state_machine import StateMachine

pytestmark = pytest.mark.redis

NAMES = [b"stream-node-max-bytes", b"stream-node-max-entries", b"list-max-listpack-size",
         b"list-max-ziplist-size", b"list-compress-depth", b"STREAM-NODE-MAX-BYTES", b"nosuch"]
VALUES = st.one_of(
    st.sampled_from([b"0", b"1", b"-1", b"-0", b"007", b"+5", b" 5", b"5 ", b"", b"b", b"kb", b"4k",
                     b"4KB", b"1gb", b"1.5", b"0x10", b"1e3", b"9223372036854775807",
                     b"9223372036854775808", b"18446744073709551616", b"17179869184gb",
                     b"9999999999gb", b"2147483647", b"2147483648", b"-2147483648", b"-2147483649",
                     b"5\x00x"]),
    st.integers(-10, 5000).map(lambda n: b"%d" % n),
)
FIELDS = [("stream-node-max-bytes", "stream_node_max_bytes"),
          ("stream-node-max-entries", "stream_node_max_entries"),
          ("list-max-listpack-size", "list_max_listpack_size"),
          ("list-compress-depth", "list_compress_depth")]
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _apply(sm, req):
    if req.client_id and req.client_id not in sm.sessions.clients:     # a session first (sessions.py)
        sm.apply(sm.applied_index + 1, encode_record(1000, [Request.register(req.client_id)]))
    return sm.apply(sm.applied_index + 1, encode_record(1000, [req]))[0]


@SLOW
@given(st.lists(st.tuples(st.sampled_from(NAMES), VALUES), min_size=0, max_size=3), st.booleans())
def test_config_set_matches_redis(redis, pairs, odd):
    redis.reset()
    argv = [b"CONFIG", b"SET"] + [x for p in pairs for x in p] + ([b"stream-node-max-entries"] if odd else [])
    sm = StateMachine()
    want = redis.call(*argv)
    if len(argv) >= 4:
        got = _apply(sm, Request.config(1, 1, argv))
    else:
        from xraft.node.fsm.resolve import queue_check
        from xraft.node.engine.errors import EngineError
        with pytest.raises(EngineError) as e:
            queue_check(argv)
        got = e.value
    assert got == want
    for redis_name, field in FIELDS:
        [_, value] = redis.call(b"CONFIG", b"GET", redis_name.encode())
        assert int(value) == getattr(sm.keyspace.config, field), redis_name


TXN = [
    [b"RPUSH", b"l", b"a", b"b"], [b"BLPOP", b"none", b"0"], [b"BLPOP", b"l", b"0"],
    [b"BLMOVE", b"none", b"l", b"LEFT", b"LEFT", b"0"], [b"BLMPOP", b"0", b"1", b"none", b"LEFT"],
    [b"XADD", b"s", b"1-1", b"f", b"v"], [b"XGROUP", b"CREATE", b"s", b"g", b"$"],
    [b"XREADGROUP", b"GROUP", b"g", b"c", b"BLOCK", b"0", b"STREAMS", b"s", b">"],
    [b"XREAD", b"BLOCK", b"0", b"STREAMS", b"s", b"$"], [b"XREAD", b"BLOCK", b"0", b"STREAMS", b"s", b"0"],
    [b"LPUSH", b"s", b"x"], [b"GET", b"l"], [b"XADD", b"s", b"1-1", b"f", b"v"],
    [b"NOSUCH"], [b"XADD", b"s"], [b"CONFIG", b"SET", b"list-compress-depth", b"2"],
    [b"CONFIG", b"SET", b"list-compress-depth", b"x"],
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from(TXN), max_size=5), min_size=1, max_size=3))
def test_exec_matches_redis(redis, txns):
    redis.reset()                              # each example starts from an empty server
    sm = StateMachine()
    for cmds in txns:
        assert redis.call(b"MULTI") == "OK"
        for c in cmds:
            redis.call(*c)                     # QUEUED, or the queue-time error
        want = redis.call(b"EXEC")
        got = _apply(sm, Request.multi(1, sm.applied_index + 1, cmds))
        got = got if isinstance(got, Exception) else to_resp2_value(got)
        assert got == want, cmds
