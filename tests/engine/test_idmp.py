"""XADD IDMP/IDMPAUTO and XCFGSET (Redis 8.6), as the idempotency docs page and
redis 8.6's tests/unit/type/stream.tcl describe them (no redis-server 8.6 on
this machine, so the expected values are those pages', written out here).
Also: the table in the stream snapshot (version 2, version 1 still read),
expiry by the record's time only, and XINFO STREAM of a stream that never
used IDMP staying redis 7.0's."""
import random
import struct
import zlib

import pytest

from tests.redis_oracle import RedisReplyError, engine_call
from xraft.node.engine import idmp as im
from xraft.node.engine.cmd_streams import ID_AUTO, ID_EXPLICIT, xadd_many
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.stream_codec import CorruptStreamState, dump_stream, load_stream


def call(db, *argv, now_ms=1000):
    return engine_call(db, *argv, now_ms=now_ms)


def info(db, key="s", *more):
    reply = call(db, "XINFO", "STREAM", key, *more)
    return dict(zip(reply[0::2], reply[1::2]))


def err(text):
    return RedisReplyError(text)


# -- syntax and errors ("XADD IDMP with invalid syntax", "XADD IDMPAUTO with invalid syntax") --------

@pytest.mark.parametrize("argv, error", [
    (("IDMP", "p1", "*", "f", "v"), "ERR Invalid stream ID specified as stream command argument"),
    (("IDMP", "p1", "iid1", "1-1", "f", "v"), im.ERR_AUTO_ID_ONLY),
    (("IDMPAUTO", "p1", "1-1", "f", "v"), im.ERR_AUTO_ID_ONLY),
    (("IDMP", "p1", "iid1", "IDMP", "p2", "iid2", "*", "f", "v"), im.ERR_TWICE),
    (("IDMPAUTO", "p1", "IDMP", "p2", "iid2", "*", "f", "v"), im.ERR_TWICE),
    (("IDMPAUTO", "p1", "IDMPAUTO", "p2", "*", "f", "v"), im.ERR_TWICE),
    (("IDMP", "p1", "iid1", "IDMPAUTO", "p2", "*", "f", "v"), im.ERR_TWICE),
    (("IDMP", "", "iid1", "*", "f", "v"), "ERR IDMP requires a non-empty producer ID"),
    (("IDMP", "p1", "", "*", "f", "v"), "ERR IDMP requires a non-empty idempotent ID"),
    (("IDMPAUTO", "", "*", "f", "v"), "ERR IDMPAUTO requires a non-empty producer ID"),
])
def test_invalid_syntax(argv, error):
    db = Keyspace()
    assert call(db, "XADD", "s", *argv) == err(error)
    assert db.get(b"s") is None


def test_duplicate_answers_first_id_and_keeps_first_fields():
    db = Keyspace()
    first = call(db, "XADD", "s", "IDMP", "p1", "payment-abc", "*", "amount", "100", now_ms=1000)
    again = call(db, "XADD", "s", "IDMP", "p1", "payment-abc", "*", "amount", "200", now_ms=2000)
    assert first == again == b"1000-0"
    assert call(db, "XRANGE", "s", "-", "+") == [[b"1000-0", [b"amount", b"100"]]]
    fields = info(db)
    assert (fields[b"iids-added"], fields[b"iids-duplicates"], fields[b"iids-tracked"],
            fields[b"pids-tracked"]) == (1, 1, 1, 1)


def test_options_in_any_order_and_with_trimming():
    db = Keyspace()
    a = call(db, "XADD", "s", "IDMP", "p1", "r1", "MAXLEN", "~", "100", "*", "f", "1")
    b = call(db, "XADD", "s", "MAXLEN", "~", "100", "IDMP", "p1", "r2", "*", "f", "2")
    c = call(db, "XADD", "s", "NOMKSTREAM", "IDMP", "p1", "r3", "MAXLEN", "~", "100", "*", "f", "3")
    assert len({a, b, c}) == 3
    assert call(db, "XADD", "s", "IDMP", "p1", "r1", "MAXLEN", "=", "1", "*", "f", "x") == a
    assert call(db, "XLEN", "s") == 3          # a duplicate does not trim either


def test_nomkstream_on_missing_key_is_nil():
    db = Keyspace()
    assert call(db, "XADD", "s", "NOMKSTREAM", "IDMP", "p1", "r", "*", "f", "v") is None
    assert call(db, "XADD", "s", "NOMKSTREAM", "IDMPAUTO", "p1", "*", "f", "v") is None
    assert db.get(b"s") is None


def test_wrongtype():
    db = Keyspace()
    call(db, "RPUSH", "s", "x")
    assert call(db, "XADD", "s", "IDMP", "p", "i", "*", "f", "v") == err(
        "WRONGTYPE Operation against a key holding the wrong kind of value")


def test_producers_are_isolated_and_iids_binary_safe():
    db = Keyspace()
    one = call(db, "XADD", "s", "IDMP", "producer1", "req-123", "*", "f", "1")
    two = call(db, "XADD", "s", "IDMP", "producer2", "req-123", "*", "f", "2")
    binary = call(db, "XADD", "s", "IDMP", b"\x00\x01", b"\x00\xff", "*", "f", "3")
    long_iid = call(db, "XADD", "s", "IDMP", "p", b"x" * 65536, "*", "f", "4")
    assert len({one, two, binary, long_iid}) == 4
    assert call(db, "XADD", "s", "IDMP", b"\x00\x01", b"\x00\xff", "*", "f", "dup") == binary
    assert call(db, "XADD", "s", "IDMP", "p", b"x" * 65536, "*", "f", "dup") == long_iid
    assert info(db)[b"pids-tracked"] == 4


def test_idmpauto_hashes_content_in_any_field_order():
    db = Keyspace()
    a = call(db, "XADD", "s", "IDMPAUTO", "p1", "*", "f1", "a", "f2", "b", "f3", "c")
    assert call(db, "XADD", "s", "IDMPAUTO", "p1", "*", "f2", "b", "f3", "c", "f1", "a") == a
    assert call(db, "XADD", "s", "IDMPAUTO", "p1", "*", "f3", "c", "f1", "x", "f2", "b") != a
    assert call(db, "XADD", "s", "IDMPAUTO", "p1", "*", "field1", "value") != call(
        db, "XADD", "s", "IDMPAUTO", "p1", "*", "field2", "value")
    # length-prefixed: moving bytes between field and value is another entry
    assert call(db, "XADD", "s", "IDMPAUTO", "p1", "*", "ab", "c") != call(
        db, "XADD", "s", "IDMPAUTO", "p1", "*", "a", "bc")
    assert call(db, "XADD", "s", "IDMPAUTO", "p2", "*", "f1", "a", "f2", "b", "f3", "c") != a
    # IDMP's iid space and IDMPAUTO's never meet
    assert im.manual_iid(b"x") != im.auto_iid([b"x", b""])


def test_maxsize_evicts_oldest_per_producer():
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "p1", "init", "*", "f", "init")
    assert call(db, "XCFGSET", "s", "IDMP-MAXSIZE", "3", "IDMP-DURATION", "60") == "OK"
    ids = [call(db, "XADD", "s", "IDMP", "p1", "req-%d" % i, "*", "f", "v") for i in (1, 2, 3)]
    p2 = [call(db, "XADD", "s", "IDMP", "p2", "req-%d" % i, "*", "f", "v") for i in (1, 2, 3)]
    assert [call(db, "XADD", "s", "IDMP", "p1", "req-%d" % i, "*", "f", "d") for i in (1, 2, 3)] == ids
    assert [call(db, "XADD", "s", "IDMP", "p2", "req-%d" % i, "*", "f", "d") for i in (1, 2, 3)] == p2
    call(db, "XADD", "s", "IDMP", "p1", "req-4", "*", "f", "v")          # evicts p1's req-1
    assert call(db, "XADD", "s", "IDMP", "p1", "req-1", "*", "f", "new") != ids[0]   # evicts req-2
    assert call(db, "XADD", "s", "IDMP", "p1", "req-3", "*", "f", "dup") == ids[2]
    fields = info(db)
    assert fields[b"iids-tracked"] == 6 and fields[b"pids-tracked"] == 2


def test_expiry_uses_the_records_time_only():
    db = Keyspace()
    first = call(db, "XADD", "s", "IDMP", "p1", "r", "*", "f", "v", now_ms=10_000)
    call(db, "XCFGSET", "s", "IDMP-DURATION", "1", now_ms=10_000)       # clears: record again
    first = call(db, "XADD", "s", "IDMP", "p1", "r", "*", "f", "v", now_ms=10_000)
    assert call(db, "XADD", "s", "IDMP", "p1", "r", "*", "f", "v", now_ms=11_000) == first   # 1 s: kept
    later = call(db, "XADD", "s", "IDMP", "p1", "r", "*", "f", "v", now_ms=11_001)           # past it
    assert later != first
    assert info(db)[b"iids-tracked"] == 1


def test_a_producer_with_nothing_left_is_not_tracked():
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "p1", "r", "*", "f", "v", now_ms=1000)
    call(db, "XADD", "s", "IDMP", "p2", "r", "*", "f", "v", now_ms=200_000)  # p1's pair expired
    fields = info(db)
    assert (fields[b"pids-tracked"], fields[b"iids-tracked"], fields[b"iids-added"]) == (1, 1, 2)


def test_deleted_entry_still_answers_its_id():
    db = Keyspace()
    sid = call(db, "XADD", "s", "IDMP", "p", "r", "*", "f", "v")
    call(db, "XDEL", "s", sid)
    assert call(db, "XADD", "s", "IDMP", "p", "r", "*", "f", "v") == sid
    assert call(db, "XLEN", "s") == 0


def test_tracked_total_is_bounded(monkeypatch):
    monkeypatch.setattr(im, "MAX_TRACKED_IIDS", 5)
    db = Keyspace()
    ids = [call(db, "XADD", "s", "IDMP", "p%d" % i, "r", "*", "f", "v") for i in range(7)]
    assert info(db)[b"iids-tracked"] == 5
    assert call(db, "XADD", "s", "IDMP", "p0", "r", "*", "f", "v") != ids[0]     # oldest went first
    assert call(db, "XADD", "s", "IDMP", "p6", "r", "*", "f", "v") == ids[6]


# -- XCFGSET ---------------------------------------------------------------------------

@pytest.mark.parametrize("args, error", [
    ((), "ERR At least one parameter must be specified"),
    (("IDMP-DURATION",), "ERR syntax error"),
    (("IDMP-MAXSIZE",), "ERR syntax error"),
    (("INVALID",), "ERR syntax error"),
    (("IDMP-DURATION", "A"), "ERR value is not an integer or out of range"),
    (("IDMP-DURATION", "3.14"), "ERR value is not an integer or out of range"),
    (("IDMP-DURATION", "000000000"), "ERR value is not an integer or out of range"),
    (("IDMP-DURATION", "IDMP-DURATION"), "ERR value is not an integer or out of range"),
    (("IDMP-DURATION", "INVALID", "IDMP-MAXSIZE"), "ERR value is not an integer or out of range"),
    (("IDMP-MAXSIZE", "120-5"), "ERR value is not an integer or out of range"),
    (("IDMP-DURATION", "0"), "ERR IDMP-DURATION must be between 1 and 86400 seconds"),
    (("IDMP-DURATION", "-100"), "ERR IDMP-DURATION must be between 1 and 86400 seconds"),
    (("IDMP-DURATION", "86401"), "ERR IDMP-DURATION must be between 1 and 86400 seconds"),
    (("IDMP-MAXSIZE", "0"), "ERR IDMP-MAXSIZE must be between 1 and 10000 entries"),
    (("IDMP-MAXSIZE", "10001"), "ERR IDMP-MAXSIZE must be between 1 and 10000 entries"),
])
def test_xcfgset_errors_change_nothing(args, error):
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "p1", "r", "*", "f", "v")
    before = dump_stream(db.get(b"s"))
    assert call(db, "XCFGSET", "s", *args) == err(error)
    assert dump_stream(db.get(b"s")) == before


def test_xcfgset_missing_key_and_wrongtype():
    db = Keyspace()
    assert call(db, "XCFGSET", "s", "IDMP-DURATION", "5") == err("ERR no such key")
    call(db, "SET", "k", "v")
    assert call(db, "XCFGSET", "k", "IDMP-DURATION", "5") == err(
        "WRONGTYPE Operation against a key holding the wrong kind of value")


def test_xcfgset_sets_values_shown_by_xinfo_and_clears_history_on_change():
    db = Keyspace()
    sid = call(db, "XADD", "s", "IDMP", "p1", "r1", "*", "f", "v")
    call(db, "XADD", "s", "IDMP", "p1", "r1", "*", "f", "dup")
    assert {k: info(db)[k] for k in (b"idmp-duration", b"idmp-maxsize")} == {
        b"idmp-duration": 100, b"idmp-maxsize": 100}
    assert call(db, "XCFGSET", "s", "IDMP-DURATION", "100", "IDMP-MAXSIZE", "100") == "OK"   # same: kept
    assert call(db, "XADD", "s", "IDMP", "p1", "r1", "*", "f", "dup") == sid
    assert call(db, "XCFGSET", "s", "IDMP-DURATION", "86400") == "OK"
    fields = info(db)
    assert (fields[b"idmp-duration"], fields[b"idmp-maxsize"], fields[b"pids-tracked"],
            fields[b"iids-tracked"], fields[b"iids-added"], fields[b"iids-duplicates"]) == (86400, 100, 0, 0, 1, 2)
    assert call(db, "XADD", "s", "IDMP", "p1", "r1", "*", "f", "new") != sid
    full = call(db, "XINFO", "STREAM", "s", "FULL")
    assert dict(zip(full[0::2], full[1::2]))[b"iids-added"] == 2


def test_xinfo_of_a_stream_without_idmp_is_redis_7():
    db = Keyspace()
    call(db, "XADD", "s", "*", "f", "v")
    keys = list(info(db))
    assert b"idmp-duration" not in keys and keys.index(b"groups") == 7
    call(db, "XADD", "s", "IDMP", "p", "r", "*", "f", "v")
    keys = list(info(db))
    assert keys[7:14] == [b"idmp-duration", b"idmp-maxsize", b"pids-tracked", b"iids-tracked",
                          b"iids-added", b"iids-duplicates", b"groups"]


def test_inside_multi_a_duplicate_sees_the_earlier_command():
    db = Keyspace()
    # xadd_many is the gRPC batch: the same as XADD ... in one MULTI
    entries = [(ID_AUTO, 0, 0, (b"f", b"1")), (ID_AUTO, 0, 0, (b"f", b"2")), (ID_AUTO, 0, 0, (b"f", b"1")),
               (ID_EXPLICIT, 5, 0, (b"f", b"3"))]
    out = xadd_many(db, b"s", entries, 1000, idmp_pid=b"p", idmp_iids=(b"a", b"b", b"a", b"c"))
    assert out[:3] == [b"1000-0", b"1000-1", b"1000-0"]
    assert out[3].message == im.ERR_AUTO_ID_ONLY
    auto = xadd_many(db, b"s", entries[:3], 1000, idmp_pid=b"q", idmp_iids=(None, None, None))
    assert auto == [b"1000-2", b"1000-3", b"1000-2"]
    db2 = Keyspace()
    for iid, (_, _, _, fields) in zip((b"a", b"b", b"a"), entries[:3]):
        call(db2, "XADD", "s", "IDMP", "p", iid, "*", *fields)
    for _, _, _, fields in entries[:3]:
        call(db2, "XADD", "s", "IDMPAUTO", "q", "*", *fields)
    assert dump_stream(db.get(b"s")) == dump_stream(db2.get(b"s"))


# -- snapshot --------------------------------------------------------------------------

def _state(db):
    st = db.get(b"s").idmp
    return (st.duration_s, st.maxsize, st.iids_added, st.iids_duplicates, list(st.pairs()))


def test_snapshot_round_trip_keeps_the_table():
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "p1", "r1", "*", "f", "v", now_ms=1000)
    call(db, "XCFGSET", "s", "IDMP-MAXSIZE", "2", "IDMP-DURATION", "50")
    for i, (pid, iid) in enumerate([("p1", "a"), ("p2", "a"), ("p1", "b"), ("p1", "c"), ("p1", "c")]):
        call(db, "XADD", "s", "IDMP", pid, iid, "*", "f", "v", now_ms=2000 + i)
    buf = dump_stream(db.get(b"s"))
    loaded = load_stream(buf)
    db2 = Keyspace()
    db2.set(b"s", loaded)
    assert _state(db2) == _state(db)
    assert dump_stream(loaded) == buf
    # same replies afterwards, duplicates and evictions included
    for pid, iid in [("p1", "a"), ("p1", "b"), ("p2", "a"), ("p1", "c"), ("p3", "z")]:
        assert call(db, "XADD", "s", "IDMP", pid, iid, "*", "f", "v", now_ms=3000) == call(
            db2, "XADD", "s", "IDMP", pid, iid, "*", "f", "v", now_ms=3000)
    assert dump_stream(db.get(b"s")) == dump_stream(db2.get(b"s"))


def test_version_1_snapshot_still_loads():
    db = Keyspace()
    call(db, "XADD", "s", "*", "f", "v")
    call(db, "XGROUP", "CREATE", "s", "g", "0")
    v4 = dump_stream(db.get(b"s"))
    # drop group g's dead-letter policy (version 4: u64 u64 u32, the group's last 20 bytes),
    # the idmp section (b"\0": none), retention and the CRC
    body = bytearray(v4[:-4 - 2 - 20])
    body[4] = 1
    v1 = bytes(body) + struct.pack(">I", zlib.crc32(bytes(body)))
    loaded = load_stream(v1)
    assert loaded.idmp is None and dump_stream(loaded) == v4


def _older_version(v5: bytes, version: int) -> bytes:
    """A version-5 record with an idmp table (and no groups) as `version` (2-4) wrote it:
    without legacy_until_ms (8 bytes before the retention byte), and for 2 without retention."""
    body = bytearray(v5[:-4 - 1 - 8] + (v5[-5:-4] if version >= 3 else b""))
    body[4] = version
    return _refit(bytes(body))


def test_version_2_snapshot_still_loads():
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "p", "r", "*", "f", "v")
    v5 = dump_stream(db.get(b"s"))
    loaded = load_stream(_older_version(v5, 2))
    assert loaded.retention is None
    # a version-2 table's short ids may be digests: looked up both ways until they expire
    assert loaded.idmp.legacy_until_ms == 1000
    loaded.idmp.legacy_until_ms = 0
    assert dump_stream(loaded) == v5


@pytest.mark.parametrize("version", [2, 3, 4])
def test_short_ids_digested_by_an_older_version_are_still_duplicates(version):
    # Versions < 5 kept every IDMP id as its digest; a retry after the upgrade must
    # still be answered with the first entry's ID, by both XADD paths.
    db = Keyspace()
    first = call(db, "XADD", "s", "IDMPAUTO", "x", "*", "f", "v", now_ms=1000)
    stream = db.get(b"s")
    sid = stream.last_id
    stream.idmp.record(b"p", im.legacy_iid(b"r1"), sid, 1000)       # as the old code recorded it
    stream.idmp.record(b"p", im.legacy_iid(b"r2"), sid, 1000)
    old = _older_version(dump_stream(stream), version)
    db2 = Keyspace()
    db2.set(b"s", load_stream(old))
    assert db2.get(b"s").idmp.legacy_until_ms == 1000
    assert call(db2, "XADD", "s", "IDMP", "p", "r1", "*", "f", "v", now_ms=2000) == first
    out = xadd_many(db2, b"s", [(ID_AUTO, 0, 0, [b"f", b"v"])] * 2, 2000, idmp_pid=b"p",
                    idmp_iids=(b"r2", b"r3"))
    assert out[0] == first and out[1] != first
    assert call(db2, "XADD", "s", "IDMP", "p", "r3", "*", "f", "v", now_ms=2000) == out[1]
    # the snapshot keeps the window; past the duration it closes and the pairs are gone
    assert load_stream(dump_stream(db2.get(b"s"))).idmp.legacy_until_ms == 1000
    call(db2, "XADD", "s", "IDMP", "p", "r9", "*", "f", "v", now_ms=1000 + 101_000)
    assert db2.get(b"s").idmp.legacy_until_ms == 0


def _refit(body: bytes) -> bytes:
    return body + struct.pack(">I", zlib.crc32(body))


def test_corrupt_idmp_sections_rejected():
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "p1", "r1", "*", "f", "v", now_ms=1000)
    call(db, "XADD", "s", "IDMP", "p1", "r2", "*", "f", "v", now_ms=2000)
    buf = dump_stream(db.get(b"s"))
    # the idmp pairs end before legacy_until_ms (version 5) and the retention byte
    body, legacy, retention = buf[:-13], buf[-13:-5], buf[-5:-4]
    pair = 4 + 2 + 16 + 16 + 8
    head = len(body) - 2 * pair - struct.calcsize(">IIQQI") - 1
    assert body[head] == 1
    cases = [
        body[:head] + b"\x02" + body[head + 1:],                                     # bad flag
        body[:head + 1] + struct.pack(">I", 0) + body[head + 5:],                   # duration 0
        body[:head + 1] + struct.pack(">I", 86401) + body[head + 5:],
        body[:head + 5] + struct.pack(">I", 10001) + body[head + 9:],               # maxsize
        body[:head + 5] + struct.pack(">I", 1) + body[head + 9:],                   # 2 pairs > maxsize 1
        body[:head + 9] + struct.pack(">Q", 1) + body[head + 17:],                  # added < tracked
        body[:head + 25] + struct.pack(">I", 3) + body[head + 29:],                 # count past the end
        body[:-pair] + body[-2 * pair:-pair],                                        # the same pair twice
        body[:-2 * pair] + body[-pair:] + body[-2 * pair:-pair],                     # out of time order
        body[:-2 * pair] + struct.pack(">I", 0) + body[-2 * pair + 4:-pair],         # empty producer
    ]
    cases.append(body + struct.pack(">q", -1) + retention)                        # negative legacy_until_ms
    cases.append(body + legacy + b"\x02")                                        # unknown retention
    for bad in cases[:-2]:
        with pytest.raises(CorruptStreamState):
            load_stream(_refit(bad + legacy + retention))
    with pytest.raises(CorruptStreamState):
        load_stream(_refit(cases[-2]))
    with pytest.raises(CorruptStreamState):
        load_stream(_refit(cases[-1]))
    for n in range(head, len(buf)):
        with pytest.raises(CorruptStreamState):
            load_stream(buf[:n])


def test_evicted_pairs_leave_a_bounded_queue_and_snapshot_once():
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "p", "first", "*", "f", "v", now_ms=1000)
    call(db, "XCFGSET", "s", "IDMP-MAXSIZE", "1")
    for i in range(10_000):                        # each one evicts the one before it
        call(db, "XADD", "s", "IDMP", "p", "r%d" % (i % 3), "*", "f", "v", now_ms=1000)
    st = db.get(b"s").idmp
    assert st.tracked == 1 and len(st.queue) <= 2 * st.tracked + 4096
    # r0 was evicted and recorded again within the same ms: one pair in the snapshot
    pairs = list(st.pairs())
    assert len(pairs) == 1
    loaded = load_stream(dump_stream(db.get(b"s")))
    assert list(loaded.idmp.pairs()) == pairs


# -- the table against a model (idmp.py's queue of chunks) ----------------------------------

class _Model:
    """The rules of the module doc, written plainly: pairs in the order recorded; expiry
    by time; maxsize per producer and MAX_TRACKED_IIDS over all, oldest first."""

    def __init__(self, duration_s, maxsize, max_tracked):
        self.duration_s, self.maxsize, self.max_tracked = duration_s, maxsize, max_tracked
        self.pairs = []                              # [pid, key, sid, added_ms], oldest first

    def xadd(self, pid, key, now_ms, new_sid):
        self.pairs = [p for p in self.pairs if p[3] >= now_ms - self.duration_s * 1000]
        for p in self.pairs:
            if p[:2] == [pid, key]:
                return p[2], False
        self.pairs.append([pid, key, new_sid, now_ms])
        mine = [p for p in self.pairs if p[0] == pid]
        if len(mine) > self.maxsize:
            self.pairs.remove(mine[0])
        if len(self.pairs) > self.max_tracked:
            del self.pairs[0]
        return new_sid, True



def _model_setup(monkeypatch) -> tuple:
    """(db, model, now): stream s with maxsize 4, a 2 s duration, at most 9 pairs per stream."""
    monkeypatch.setattr(im, "MAX_TRACKED_IIDS", 9)
    db = Keyspace()
    now = 1_000_000
    call(db, "XADD", "s", "*", "f", "v", now_ms=now)
    call(db, "XCFGSET", "s", "IDMP-MAXSIZE", "4", "IDMP-DURATION", "2", now_ms=now)
    return db, _Model(2, 4, 9), now

@pytest.mark.parametrize("seed", range(6))
def test_batches_and_single_xadds_keep_the_tables_rules(seed, monkeypatch):
    """Random batches (xadd_many) and single XADDs of 3 producers, with ids repeated,
    maxsize 4, a 2 s duration and at most 9 pairs per stream: every reply and the
    table (pairs() in order) are the model's after each step; a snapshot of the
    stream gives the same table back; the queue stays bounded."""
    rnd = random.Random(seed)
    db, model, now = _model_setup(monkeypatch)
    prev_last = tuple(db.get(b"s").last_id)
    for _ in range(120):
        now += rnd.choice((0, 0, 1, 300, 1500))
        pid = rnd.choice((b"p1", b"p2", b"p3"))
        iids = [b"i%d" % rnd.randrange(12) if rnd.random() < 0.9 else b"L" * 20 + b"%d" % rnd.randrange(3)
                for _ in range(rnd.choice((1, 1, 3, 6, 10)))]
        if len(iids) == 1 and rnd.random() < 0.5:
            got = [call(db, "XADD", "s", "IDMP", pid, iids[0], "*", "f", "v", now_ms=now)]
        else:
            got = xadd_many(db, b"s", [(ID_AUTO, 0, 0, [b"f", b"v"])] * len(iids), now, idmp_pid=pid,
                            idmp_iids=iids)
        last = db.get(b"s").last_id
        for iid, reply in zip(iids, got):
            sid, new = model.xadd(pid, im.manual_iid(iid), now, reply)
            if new:
                made = tuple(int(x) for x in reply.split(b"-"))
                assert made > prev_last                 # a new entry
                prev_last = made
            else:
                assert reply == sid                     # a duplicate answers the first ID
        assert tuple(last) == prev_last
        st = db.get(b"s").idmp
        table = [(pid_, key, b"%d-%d" % sid_, ms) for pid_, key, sid_, ms in st.pairs()]
        assert table == [tuple(p) for p in model.pairs], (seed, now)
        assert st.tracked == len(model.pairs) and st.queued <= 2 * st.tracked + 4096
        assert sum(c.live for c in st.queue) == st.tracked
        loaded = load_stream(dump_stream(db.get(b"s")))
        assert list(loaded.idmp.pairs()) == list(st.pairs())


# -- the run form (idmp.py _Runs: IDMP_SEQ batches whose ids rise) -------------------------

def _seq_many(db, pid, first, n, now_ms, fields=(b"f", b"v")):
    return xadd_many(db, b"s", [(ID_AUTO, 0, 0, list(fields))] * n, now_ms, idmp_pid=pid,
                     idmp_iids=tuple(b"%x" % v for v in range(first, first + n)), idmp_first=first)


def _same_table(db, db2):
    st, st2 = db.get(b"s").idmp, db2.get(b"s").idmp
    assert list(st.pairs()) == list(st2.pairs()) and st.info_fields() == st2.info_fields()
    assert dump_stream(db.get(b"s")) == dump_stream(db2.get(b"s"))


def test_run_form_queue_stays_bounded():
    """A producer in run form under IDMP-MAXSIZE 1: its evicted runs' chunks leave the
    queue's head at once; behind another producer's live pair they are compacted away.
    The table is the dict form's (the same batches without idmp_first) all along."""
    db, db2 = Keyspace(), Keyspace()
    for d in (db, db2):
        call(d, "XADD", "s", "IDMP", "q", "first", "*", "f", "v", now_ms=1000)
        call(d, "XCFGSET", "s", "IDMP-MAXSIZE", "1")
    st = db.get(b"s").idmp
    call(db, "XADD", "s", "IDMP", "q", "first", "*", "f", "v", now_ms=1000)   # q: a pair again
    call(db2, "XADD", "s", "IDMP", "q", "first", "*", "f", "v", now_ms=1000)
    for i in range(6000):
        assert _seq_many(db, b"p", 2 * i, 2, 1000) == xadd_many(
            db2, b"s", [(ID_AUTO, 0, 0, [b"f", b"v"])] * 2, 1000, idmp_pid=b"p",
            idmp_iids=(b"%x" % (2 * i), b"%x" % (2 * i + 1)))
        assert len(st.queue) <= 2 * st.tracked + 4096 + 1
        assert st.queued == sum(len(c.keys) for c in st.queue)
    assert st.producers[b"p"].__class__ is im._Runs and st.tracked == 2
    _same_table(db, db2)
    # alone, the producer's dead chunks leave the head at once
    call(db, "XCFGSET", "s", "IDMP-MAXSIZE", "2")
    for i in range(50):
        _seq_many(db, b"p", 10_000 + 3 * i, 3, 1000)
        assert len(st.queue) == 1


def test_run_form_breaks_where_the_id_sequence_wraps():
    """The entries' IDs (ms, 2**64-1), (ms + 1, 0), (ms + 1, 1): two runs, each pair
    its own ID; the snapshot is the dict form's."""
    big = 5_000
    db, db2 = Keyspace(), Keyspace()
    for d in (db, db2):
        call(d, "XADD", "s", "%d-%d" % (big, 2**64 - 2), "f", "v")
    got = _seq_many(db, b"p", 7, 3, 1000)
    want = [call(db2, "XADD", "s", "IDMP", "p", "%x" % v, "*", "f", "v") for v in (7, 8, 9)]
    assert got == want == [b"%d-%d" % (big, 2**64 - 1), b"%d-0" % (big + 1), b"%d-1" % (big + 1)]
    assert [run[:4] for run in db.get(b"s").idmp.producers[b"p"].runs] == [
        [7, 1, big, 2**64 - 1], [8, 2, big + 1, 0]]
    _same_table(db, db2)
    assert _seq_many(db, b"p", 8, 1, 1000) == [want[1]]     # a resend: the dict form from here
    assert db.get(b"s").idmp.producers[b"p"].__class__ is not im._Runs


@pytest.mark.parametrize("seed", range(4))
def test_run_form_with_max_tracked_keeps_the_tables_rules(seed, monkeypatch):
    """Rising IDMP_SEQ batches (run form) of 3 producers, resends and single XADDs mixed
    in, at most 9 pairs per stream (the oldest run chunk turns to keys when a single
    XADD evicts from it): replies and pairs() are the model's after each step."""
    rnd = random.Random(seed)
    db, model, now = _model_setup(monkeypatch)
    next_id = {b"p1": 0, b"p2": 0, b"p3": 0}
    for _ in range(150):
        now += rnd.choice((0, 0, 1, 300, 1500))
        pid = rnd.choice(list(next_id))
        first = max(0, next_id[pid] - rnd.choice((0, 0, 0, 1, 5)))
        n = rnd.choice((1, 2, 3, 6))
        next_id[pid] = max(next_id[pid], first + n)
        if n == 1 and rnd.random() < 0.3:
            got = [call(db, "XADD", "s", "IDMP", pid, b"%x" % first, "*", "f", "v", now_ms=now)]
        else:
            got = _seq_many(db, pid, first, n, now)
        for v, reply in zip(range(first, first + n), got):
            sid, _ = model.xadd(pid, im.manual_iid(b"%x" % v), now, reply)
            assert reply == sid
        st = db.get(b"s").idmp
        table = [(pid_, key, b"%d-%d" % sid_, ms) for pid_, key, sid_, ms in st.pairs()]
        assert table == [tuple(p) for p in model.pairs], (seed, now)
        assert st.tracked == len(model.pairs) and sum(c.live for c in st.queue) == st.tracked
        assert st.queued == sum(len(c.keys) for c in st.queue)   # (what the compaction counts)
        loaded = load_stream(dump_stream(db.get(b"s")))
        assert list(loaded.idmp.pairs()) == list(st.pairs())


def test_run_form_comes_back_from_a_snapshot():
    """A producer whose pairs are rising hex ids loads in run form, the same runs; one with
    ids out of order, or of 16 hex digits (digests), in the dict form; both go on alike."""
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "q", "x", "*", "f", "v", now_ms=1000)
    for i in range(5):
        _seq_many(db, b"p", 10 * i, 10, 1000 + i)
    _seq_many(db, b"r", 0x10, 3, 1010)
    _seq_many(db, b"r", 0x5, 1, 1010)                        # below its ids: r in the dict form
    _seq_many(db, b"t", 0xfffffffffffffff0, 3, 1011)        # 16 hex digits: digest keys
    st = db.get(b"s").idmp
    assert [p for p in st.producers if st.producers[p].__class__ is im._Runs] == [b"p", b"t"]
    loaded = load_stream(dump_stream(db.get(b"s")))
    lst = loaded.idmp
    assert [p for p in lst.producers if lst.producers[p].__class__ is im._Runs] == [b"p"]
    assert [run[:4] for run in lst.producers[b"p"].runs] == [run[:4] for run in st.producers[b"p"].runs]
    assert lst.queued == sum(len(c.keys) for c in lst.queue)
    db2 = Keyspace()
    db2.set(b"s", loaded)
    _same_table(db, db2)
    replies = [_seq_many(d, b"p", 50, 60, 1020) + _seq_many(d, b"p", 105, 2, 1020) + _seq_many(d, b"t", 0, 2, 1020)
               for d in (db, db2)]
    assert replies[0] == replies[1] and replies[0][60] == replies[0][55]     # 105 resent: its first ID
    _same_table(db, db2)


def _per_entry_many(db, pid, iids, now_ms, fields=(b"f", b"v")):
    return xadd_many(db, b"s", [(ID_AUTO, 0, 0, list(fields))] * len(iids), now_ms, idmp_pid=pid,
                     idmp_iids=tuple(iids))


def _form(db, pid):
    ids = db.get(b"s").idmp.producers[pid]
    return "runs" if ids.__class__ is im._Runs else "dict"


def test_dict_form_turns_back_to_runs():
    """A new SDK client sends its first batches with one id per entry (the dict form), then
    as first + count: the first such batch above the producer's ids turns it back into
    runs (the same pairs, chunks and queue places), and it stays there. db2 gets the same
    ids one per entry all along (the dict form): replies and tables are the same."""
    db, db2 = Keyspace(), Keyspace()
    for d in (db, db2):
        call(d, "XADD", "s", "IDMP", "q", "x", "*", "f", "v", now_ms=1000)
        call(d, "XCFGSET", "s", "IDMP-MAXSIZE", "7")
    now = 1000
    for b in range(3):                                   # per-entry batches of 3: 9 pairs, 7 kept
        iids = [b"%x" % v for v in range(3 * b, 3 * b + 3)]
        assert _per_entry_many(db, b"p", iids, now + b) == _per_entry_many(db2, b"p", iids, now + b)
    assert _form(db, b"p") == "dict"
    st = db.get(b"s").idmp
    pairs_before = list(st.pairs())
    assert _seq_many(db, b"p", 9, 2, 1003) == _per_entry_many(db2, b"p", [b"9", b"a"], 1003)
    assert _form(db, b"p") == "runs"
    # the 7 pairs before: 2..8 (5 evicted by the batch: 2..4 gone), in their chunks
    assert [run[:4] for run in st.producers[b"p"].runs][:2] == [[4, 2, 1001, 1], [6, 3, 1002, 0]]
    assert list(st.pairs())[:5] == pairs_before[-5:]
    assert st.queued == sum(len(c.keys) for c in st.queue) and sum(c.live for c in st.queue) == st.tracked
    _same_table(db, db2)
    for i in range(20):                                  # on in run form, expiry included
        now = 1003 + 40_000 * i
        first = 11 + 5 * i
        assert _seq_many(db, b"p", first, 5, now) == _per_entry_many(
            db2, b"p", [b"%x" % v for v in range(first, first + 5)], now)
        assert _form(db, b"p") == "runs"
        _same_table(db, db2)


@pytest.mark.parametrize("iids, first, why", [
    ([b"0", b"x", b"2"], 3, "an id that is no hex number"),
    ([b"0", b"2", b"1"], 3, "ids not rising"),
    ([b"01", b"2"], 3, "a leading zero (not the form's rendering)"),
    ([b"0", b"1", b"5"], 5, "the batch's first id is tracked"),
    ([b"0", b"1", b"5"], 4, "the batch's first id below the producer's"),
])
def test_dict_form_stays_when_the_pairs_are_no_runs(iids, first, why):
    """What cannot turn back keeps the dict form, and the batch answers as per-entry ids do."""
    db, db2 = Keyspace(), Keyspace()
    for d in (db, db2):
        _per_entry_many(d, b"p", iids, 1000)
    assert _seq_many(db, b"p", first, 3, 1001) == _per_entry_many(
        db2, b"p", [b"%x" % v for v in range(first, first + 3)], 1001), why
    assert _form(db, b"p") == "dict", why
    _same_table(db, db2)


def test_dict_form_too_long_to_walk_stays():
    """A producer holding more pairs than the batch and the default IDMP-MAXSIZE is not
    walked (the walk is bounded by the batch's own cost); a larger batch turns it."""
    db = Keyspace()
    call(db, "XADD", "s", "IDMP", "q", "x", "*", "f", "v", now_ms=1000)
    call(db, "XCFGSET", "s", "IDMP-MAXSIZE", "1000")
    _per_entry_many(db, b"p", [b"%x" % v for v in range(im.DEFAULT_MAXSIZE + 1)], 1000)
    _seq_many(db, b"p", 500, 3, 1001)
    assert _form(db, b"p") == "dict"
    _seq_many(db, b"p", 600, im.DEFAULT_MAXSIZE + 4, 1002)
    assert _form(db, b"p") == "runs"


def test_dict_form_turns_back_with_a_break_where_the_id_sequence_wraps():
    """Per-entry ids 7, 8, 9 added under (ms, 2**64-1), (ms + 1, 0), (ms + 1, 1): turned
    back to runs they are two runs, each pair its own ID, as the seq form records them."""
    big = 5_000
    db, db2 = Keyspace(), Keyspace()
    for d in (db, db2):
        call(d, "XADD", "s", "%d-%d" % (big, 2**64 - 2), "f", "v")
        _per_entry_many(d, b"p", [b"7", b"8", b"9"], 1000)
    assert _seq_many(db, b"p", 10, 1, 1000) == _per_entry_many(db2, b"p", [b"a"], 1000)
    assert [run[:4] for run in db.get(b"s").idmp.producers[b"p"].runs] == [
        [7, 1, big, 2**64 - 1], [8, 2, big + 1, 0], [10, 1, big + 1, 2]]
    _same_table(db, db2)
