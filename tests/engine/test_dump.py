"""Keyspace dump/load: identity (same replies, same bytes) and corrupt dumps rejected."""
import os
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.redis_oracle import engine_call
from xraft.node.engine.dump import TAG_LIST, TAG_STRING, CorruptDump, dump_keyspace, load_keyspace
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.listpack import lp_append, lp_new

EXAMPLES = int(os.environ.get("XRAFT_DIFF_EXAMPLES", "60"))
NOW = 1_700_000_000_000


def _populated(fill: int = -2) -> Keyspace:
    db = Keyspace()
    db.config.list_max_listpack_size = fill
    engine_call(db, b"SET", b"str", b"hello")
    engine_call(db, b"SET", b"", b"")
    engine_call(db, b"RPUSH", b"small", b"a", b"1", b"-7", b"")
    for i in range(300):
        engine_call(db, b"LPUSH" if i % 3 else b"RPUSH", b"big", b"item-%d" % i, b"%d" % (i * 1000003))
    engine_call(db, b"RPUSH", b"huge", b"x" * 20000, b"y")
    for i in range(30):
        engine_call(db, b"XADD", b"stream", b"%d-1" % (i + 1), b"temp", b"%d" % i, now_ms=NOW)
    engine_call(db, b"XGROUP", b"CREATE", b"stream", b"g", b"0", now_ms=NOW)
    engine_call(db, b"XREADGROUP", b"GROUP", b"g", b"alice", b"COUNT", b"5", b"STREAMS", b"stream", b">", now_ms=NOW)
    engine_call(db, b"XACK", b"stream", b"g", b"2-1", now_ms=NOW)
    return db


READS = [
    [b"KEYS", b"*"], [b"DBSIZE"], [b"GET", b"str"], [b"GET", b""], [b"TYPE", b"big"],
    [b"LRANGE", b"small", b"0", b"-1"], [b"LRANGE", b"big", b"0", b"-1"], [b"LRANGE", b"huge", b"0", b"-1"],
    [b"XRANGE", b"stream", b"-", b"+"], [b"XPENDING", b"stream", b"g", b"-", b"+", b"10"],
    [b"XINFO", b"STREAM", b"stream"], [b"XINFO", b"GROUPS", b"stream"],
]


@pytest.mark.parametrize("fill", [-2, -1, 3])
def test_dump_load_identity(fill):
    db = _populated(fill)
    blob = dump_keyspace(db)
    loaded = load_keyspace(blob)
    assert loaded.config == db.config
    for argv in READS:
        mine = engine_call(loaded, *argv, now_ms=NOW)
        assert mine == engine_call(db, *argv, now_ms=NOW), argv
    assert sorted(engine_call(loaded, b"KEYS", b"*")) == [b"", b"big", b"huge", b"small", b"str", b"stream"]
    assert dump_keyspace(loaded) == blob
    # The loaded keyspace keeps working like the original.
    for argv in ([b"LPOP", b"big", b"7"], [b"LINSERT", b"big", b"AFTER", b"item-5", b"new"],
                 [b"XADD", b"stream", b"*", b"k", b"v"], [b"RPOP", b"small", b"9"], [b"LSET", b"huge", b"0", b"z"]):
        assert engine_call(loaded, *argv, now_ms=NOW + 5) == engine_call(db, *argv, now_ms=NOW + 5)
    assert dump_keyspace(loaded) == dump_keyspace(db)


def test_dump_is_deterministic_and_independent_of_insertion_order():
    a, b = Keyspace(), Keyspace()
    for k in [b"x", b"a", b"m"]:
        engine_call(a, b"SET", k, k)
    for k in [b"m", b"x", b"a"]:
        engine_call(b, b"SET", k, k)
    assert dump_keyspace(a) == dump_keyspace(b)
    assert dump_keyspace(Keyspace()) == dump_keyspace(load_keyspace(dump_keyspace(Keyspace())))


def test_every_flipped_byte_and_truncation_is_rejected():
    db = Keyspace()
    engine_call(db, b"SET", b"k", b"v")
    engine_call(db, b"RPUSH", b"l", b"a", b"12")
    blob = dump_keyspace(db)
    for i in range(len(blob)):
        for bit in (0x01, 0x80):
            bad = bytearray(blob)
            bad[i] ^= bit
            with pytest.raises(CorruptDump):
                load_keyspace(bytes(bad))
    for n in range(len(blob)):
        with pytest.raises(CorruptDump):
            load_keyspace(blob[:n])
    with pytest.raises(CorruptDump):
        load_keyspace(blob + b"\0")
    with pytest.raises(CorruptDump):
        load_keyspace("not bytes")


# -- crafted dumps with valid checksums: content validation ----------------------

def _prefix() -> bytes:
    """Header and config of a dump, up to (not including) nkeys."""
    return dump_keyspace(Keyspace())[:-8]


def _record(tag: int, key: bytes, payload: bytes) -> bytes:
    rec = bytes([tag]) + struct.pack(">I", len(key)) + key + struct.pack(">I", len(payload)) + payload
    return rec + struct.pack(">I", zlib.crc32(rec))


def _dump_of(records, nkeys=None) -> bytes:
    body = _prefix() + struct.pack(">I", len(records) if nkeys is None else nkeys) + b"".join(records)
    return body + struct.pack(">I", zlib.crc32(body))


def _list_payload(nodes, fill=-2) -> bytes:
    return struct.pack(">iI", fill, len(nodes)) + b"".join(struct.pack(">I", len(n)) + bytes(n) for n in nodes)


def _lp(*elements) -> bytearray:
    lp = lp_new()
    for e in elements:
        lp_append(lp, e)
    return lp


def test_crafted_valid_dump_loads():
    db = load_keyspace(_dump_of([_record(TAG_STRING, b"a", b"1"),
                                 _record(TAG_LIST, b"b", _list_payload([_lp(b"x", b"7"), _lp(b"y")]))]))
    assert engine_call(db, b"LRANGE", b"b", b"0", b"-1") == [b"x", b"7", b"y"]
    assert engine_call(db, b"GET", b"a") == b"1"


BAD_LP = bytearray(_lp(b"abc"))
BAD_LP[6] = 0x85                     # the string claims 5 bytes where 3 are
WRONG_COUNT_LP = bytearray(_lp(b"a", b"b"))
WRONG_COUNT_LP[4] = 3                # header says 3 elements


@pytest.mark.parametrize("records,nkeys", [
    ([_record(9, b"a", b"1")], None),                                          # unknown tag
    ([_record(TAG_STRING, b"b", b"1"), _record(TAG_STRING, b"a", b"1")], None),  # out of order
    ([_record(TAG_STRING, b"a", b"1"), _record(TAG_STRING, b"a", b"1")], None),  # repeated key
    ([_record(TAG_STRING, b"a", b"1")], 2),                                    # count too big
    ([_record(TAG_STRING, b"a", b"1")], 0),                                    # trailing record
    ([_record(TAG_LIST, b"l", _list_payload([]))], None),                      # no nodes
    ([_record(TAG_LIST, b"l", _list_payload([lp_new()]))], None),              # empty node
    ([_record(TAG_LIST, b"l", _list_payload([BAD_LP]))], None),                # deep listpack damage
    ([_record(TAG_LIST, b"l", _list_payload([WRONG_COUNT_LP]))], None),
    ([_record(TAG_LIST, b"l", _list_payload([_lp(b"a", b"b", b"c")], fill=2))], None),  # fill rule
    ([_record(TAG_LIST, b"l", _list_payload([_lp(b"a")], fill=-6))], None),   # fill out of range
    ([_record(TAG_LIST, b"l", _list_payload([_lp(b"a")]) + b"\0")], None),    # trailing payload
    ([_record(TAG_LIST, b"l", _list_payload([_lp(b"a")])[:-1])], None),       # short payload
    ([_record(3, b"s", b"garbage")], None),                                    # bad stream payload
])
def test_crafted_corrupt_dumps_are_rejected(records, nkeys):
    with pytest.raises(CorruptDump):
        load_keyspace(_dump_of(records, nkeys))


def test_bad_header_and_config_rejected():
    good = dump_keyspace(Keyspace())

    def resealed(body):
        return body + struct.pack(">I", zlib.crc32(body))

    with pytest.raises(CorruptDump, match="magic"):
        load_keyspace(resealed(b"XXXX" + good[4:-4]))
    with pytest.raises(CorruptDump, match="version"):
        load_keyspace(resealed(good[:4] + b"\x00\x09" + good[6:-4]))
    # Config value out of range: list_compress_depth = -1.
    body = bytearray(good[:-4])
    name = b"list_compress_depth"
    at = body.index(name) + len(name)
    body[at:at + 8] = struct.pack(">q", -1)
    with pytest.raises(CorruptDump, match="out of range"):
        load_keyspace(resealed(bytes(body)))
    body = bytearray(good[:-4])
    body[body.index(name)] ^= 0x20                       # unknown field name
    with pytest.raises(CorruptDump, match="config field"):
        load_keyspace(resealed(bytes(body)))


@settings(max_examples=EXAMPLES * 4, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_records_with_fixed_checksums_never_crash(data):
    """Damage inside a record, checksums recomputed: load either fails with
    CorruptDump or yields a keyspace whose lists are structurally sound."""
    payload = _list_payload([_lp(b"a", b"12", b"x" * 70), _lp(b"-5", b"")])
    rec = bytearray(_record(TAG_LIST, b"l", payload))[:-4]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(rec) - 1))
        rec[i] = data.draw(st.integers(0, 255))
    rec = bytes(rec) + struct.pack(">I", zlib.crc32(bytes(rec)))
    try:
        db = load_keyspace(_dump_of([rec]))
    except CorruptDump:
        return
    for key in db.data:
        if db.type_name(key) == "list":
            db.get(key).check()
            assert engine_call(db, b"LLEN", key) > 0


def test_engine_demo_runs(capsys):
    from xraft.node.runtime.engine_demo import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert "XAUTOCLAIM" in out and "identical replies" in out
