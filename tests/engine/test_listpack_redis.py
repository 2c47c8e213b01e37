"""Differential: our listpack bytes against the ones redis-server 7.0 writes.

A small hash in redis 7.0 is one listpack (field, value, field, value, ...):
HSET of a new field is lpAppend x2, HSET of an existing field is lpReplace of
its value, HDEL is lpDeleteRangeWithEntry(field, 2).  DUMP with rdbcompression
off hands the listpack back verbatim, so we can compare byte for byte.
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.engine.listpack import (
    lp_append,
    lp_decode_all,
    lp_delete_range,
    lp_get_bytes,
    lp_iter,
    lp_length,
    lp_new,
    lp_replace,
    lp_seek,
    lp_validate,
)

pytestmark = pytest.mark.redis

RDB_TYPE_HASH_LISTPACK = 16
_CONFIG = {"rdbcompression": "no", "hash-max-listpack-value": "100000",
           "hash-max-listpack-entries": "100000"}


@pytest.fixture
def hash_redis(redis):
    """The oracle, configured so hashes stay listpacks and DUMP is uncompressed."""
    saved = {}
    for name, value in _CONFIG.items():
        saved[name] = redis.call("CONFIG", "GET", name)[1]
        redis.call("CONFIG", "SET", name, value)
    try:
        yield redis
    finally:
        for name, value in saved.items():
            redis.call("CONFIG", "SET", name, value)


def dumped_listpack(redis, key) -> bytes:
    """The raw listpack inside `DUMP key` (type byte, RDB string, version, CRC)."""
    payload = redis.call("DUMP", key)
    assert payload[0] == RDB_TYPE_HASH_LISTPACK, redis.call("OBJECT", "ENCODING", key)
    b = payload[1]
    if b >> 6 == 0:
        n, p = b & 0x3F, 2
    elif b >> 6 == 1:
        n, p = ((b & 0x3F) << 8) | payload[2], 3
    elif b == 0x80:
        n, p = int.from_bytes(payload[2:6], "big"), 6
    elif b == 0x81:
        n, p = int.from_bytes(payload[2:10], "big"), 10
    else:
        raise AssertionError("compressed or integer-encoded RDB string: 0x%02x" % b)
    assert p + n == len(payload) - 10     # 2-byte RDB version + 8-byte CRC64 follow
    return payload[p:p + n]


BOUNDARY_TEXT = [b"%d" % v for v in (
    0, 127, 128, -1, -4096, -4097, 4095, 4096, 32767, 32768, -32768, -32769,
    2 ** 23 - 1, 2 ** 23, -(2 ** 23), -(2 ** 23) - 1, 2 ** 31 - 1, 2 ** 31,
    -(2 ** 31), -(2 ** 31) - 1, 2 ** 63 - 1, -(2 ** 63))] + [
    b"9223372036854775808", b"-9223372036854775809", b"01", b"+1", b" 1", b"-0",
    b"1.0", b"", b"a" * 63, b"a" * 64, b"a" * 125, b"a" * 126, b"a" * 4095,
    b"a" * 4096, b"a" * 16378, b"a" * 70000]


def test_boundary_elements_match_redis(hash_redis):
    lp = lp_new()
    args = []
    for i, value in enumerate(BOUNDARY_TEXT):
        field = b"f%d" % i
        args += [field, value]
        lp_append(lp, field)
        lp_append(lp, value)
    hash_redis.call("HSET", "h", *args)
    theirs = dumped_listpack(hash_redis, "h")
    assert theirs == bytes(lp)
    lp_validate(theirs)
    assert [lp_get_bytes(theirs, lp_seek(theirs, i)) for i in range(len(args))] == args


def test_unknown_count_header_matches_redis(hash_redis):
    # 32768 fields -> 65536 elements: redis' header count saturates at 65535.
    lp = lp_new()
    args = []
    for i in range(32768):
        args += [b"%d" % i, b"v"]
        lp_append(lp, b"%d" % i)
        lp_append(lp, b"v")
    hash_redis.call("HSET", "big", *args)
    theirs = dumped_listpack(hash_redis, "big")
    assert theirs[4:6] == b"\xff\xff"
    assert theirs == bytes(lp)
    assert lp_length(theirs) == 65536
    lp_validate(theirs)


_text = st.one_of(
    st.binary(max_size=10),
    st.integers(-(2 ** 63), 2 ** 63 - 1).map(lambda v: b"%d" % v),
    st.integers(-70000, 70000).map(lambda v: b"%d" % v),
    st.sampled_from([0, 63, 64, 126, 4095, 4096]).map(lambda n: b"w" * n),
)
_ops = st.lists(st.one_of(
    st.tuples(st.just("HSET"), st.integers(0, 7), _text),
    st.tuples(st.just("HDEL"), st.integers(0, 7)),
), min_size=1, max_size=15)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_ops)
def test_hset_hdel_edits_match_redis(hash_redis, ops):
    hash_redis.call("DEL", "h")
    lp, fields = lp_new(), []          # fields: our model of the hash's field order
    for op in ops:
        field = b"field:%d" % op[1]
        if op[0] == "HSET":
            hash_redis.call("HSET", "h", field, op[2])
            if field in fields:
                i = fields.index(field)
                lp_replace(lp, lp_seek(lp, 2 * i + 1), op[2])
            else:
                fields.append(field)
                lp_append(lp, field)
                lp_append(lp, op[2])
        else:
            hash_redis.call("HDEL", "h", field)
            if field in fields:
                i = fields.index(field)
                del fields[i]
                lp_delete_range(lp, 2 * i, 2)
        if fields:
            assert dumped_listpack(hash_redis, "h") == bytes(lp)
        else:
            assert hash_redis.call("EXISTS", "h") == 0
    flat = hash_redis.call("HGETALL", "h") if fields else []
    assert [lp_get_bytes(lp, lp_seek(lp, i)) for i in range(len(flat))] == flat
    assert len(lp_decode_all(lp)) == len(list(lp_iter(lp, reverse=True))) == 2 * len(fields)
