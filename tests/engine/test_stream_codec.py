"""stream_codec: dump -> load gives the same stream (entries, groups, consumers,
shared NACKs), commands then behave the same on both copies, and damaged or
inconsistent snapshots are refused with CorruptStreamState."""
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.redis_oracle import engine_call
from xraft.node.engine import groups as g
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.stream_codec import CorruptStreamState, dump_stream, load_stream
from xraft.node.engine.streamid import StreamID

NOW = 1_700_000_000_000


def build(cmds, now=NOW):
    db = Keyspace()
    for i, argv in enumerate(cmds):
        engine_call(db, *argv, now_ms=now + i)
    return db


def snapshot_state(stream):
    """Everything observable about a stream, as plain values."""
    groups = None
    if stream.cgroups is not None:
        groups = []
        for name, grp in stream.cgroups.items():
            pel = [(k, n.delivery_time, n.delivery_count, n.consumer.name) for k, n in grp.pel.items()]
            consumers = [(cn, c.seen_time, [k for k, _ in c.pel.items()]) for cn, c in grp.consumers.items()]
            groups.append((name, grp.last_id, grp.entries_read, pel, consumers))
    return (stream.length, stream.last_id, stream.first_id, stream.max_deleted_entry_id,
            stream.entries_added, list(stream.iter_range()), stream.rax.numele, stream.rax.numnodes, groups)


def reload(db, key=b"s"):
    copy = Keyspace()
    copy.set(key, load_stream(dump_stream(db.get(key))))
    return copy


BASE = (
    [["XADD", "s", "%d-%d" % (i // 3 + 1, i % 3), "f", "v%d" % i, "n", str(i)] for i in range(40)]
    + [["XGROUP", "CREATE", "s", "g1", "0"], ["XGROUP", "CREATE", "s", "g2", "$", "ENTRIESREAD", "7"],
       ["XGROUP", "CREATE", "s", "empty", "0"],
       ["XREADGROUP", "GROUP", "g1", "alice", "COUNT", "5", "STREAMS", "s", ">"],
       ["XREADGROUP", "GROUP", "g1", "bob", "COUNT", "7", "STREAMS", "s", ">"],
       ["XREADGROUP", "GROUP", "g1", "carol", "NOACK", "COUNT", "2", "STREAMS", "s", ">"],
       ["XGROUP", "CREATECONSUMER", "s", "g2", "idle"],
       ["XCLAIM", "s", "g1", "dave", "0", "1-1", "2-0", "IDLE", "5000", "RETRYCOUNT", "9"],
       ["XDEL", "s", "3-0", "4-1"], ["XACK", "s", "g1", "1-2"]]
)


def test_round_trip_keeps_everything():
    db = build(BASE)
    stream = db.get(b"s")
    grp = stream.cgroups.find(b"g1")
    assert grp.pel.numele == 11 and grp.consumers.numele == 4     # the state is not trivial
    loaded = load_stream(dump_stream(stream))
    assert snapshot_state(loaded) == snapshot_state(stream)
    g.check_groups(loaded)
    # The NACK objects are shared between the group PEL and the owner's PEL.
    grp = loaded.cgroups.find(b"g1")
    for key, nack in grp.pel.items():
        assert nack.consumer.pel.find(key) is nack
    # Dumping the copy gives the same bytes.
    assert dump_stream(loaded) == dump_stream(stream)


def test_a_loaded_consumer_pel_is_keyed_by_the_group_pels_own_ids():
    """One StreamID object per pending entry after a load (as XREADGROUP makes one and files
    it in both PELs), not a second one per consumer: fewer long-lived objects for the cyclic
    collector to scan (fsm/gc_pause.py) and less memory for a big PEL."""
    loaded = load_stream(dump_stream(build(BASE).get(b"s")))
    grp = loaded.cgroups.find(b"g1")
    own = {key: key for key, _ in grp.pel.items()}
    shared = 0
    for _, consumer in grp.consumers.items():
        for key, nack in consumer.pel.items():
            assert type(key) is StreamID and own[key] is key and grp.pel.find(key) is nack
            shared += 1
    assert shared == grp.pel.numele == 11


def test_stream_without_groups_and_empty_stream():
    db = build([["XADD", "s", "1-1", "a", "b"]])
    assert db.get(b"s").cgroups is None
    assert load_stream(dump_stream(db.get(b"s"))).cgroups is None
    db = build([["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"]])
    loaded = load_stream(dump_stream(db.get(b"s")))
    assert snapshot_state(loaded) == snapshot_state(db.get(b"s"))


FOLLOW_UPS = [
    ["XINFO", "STREAM", "s", "FULL", "COUNT", "0"], ["XINFO", "GROUPS", "s"], ["XINFO", "CONSUMERS", "s", "g1"],
    ["XPENDING", "s", "g1"], ["XPENDING", "s", "g1", "-", "+", "100"],
    ["XREADGROUP", "GROUP", "g1", "alice", "STREAMS", "s", "0"],
    ["XREADGROUP", "GROUP", "g2", "erin", "COUNT", "3", "STREAMS", "s", ">"],
    ["XAUTOCLAIM", "s", "g1", "frank", "0", "0", "COUNT", "4"],
    ["XCLAIM", "s", "g1", "alice", "0", "5-0", "5-1", "FORCE"],
    ["XACK", "s", "g1", "2-0", "2-1"], ["XGROUP", "DELCONSUMER", "s", "g1", "bob"],
    ["XADD", "s", "99-0", "x", "y"], ["XREADGROUP", "GROUP", "g1", "bob", "STREAMS", "s", ">"],
    ["XINFO", "STREAM", "s", "FULL", "COUNT", "0"], ["XINFO", "STREAM", "s"],
]


def test_same_replies_after_reload():
    db = build(BASE)
    copy = reload(db)
    for i, argv in enumerate(FOLLOW_UPS):
        now = NOW + 10_000 + i
        assert engine_call(copy, *argv, now_ms=now) == engine_call(db, *argv, now_ms=now), argv
    assert snapshot_state(copy.get(b"s")) == snapshot_state(db.get(b"s"))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["read", "noack", "claim", "ack", "del", "add", "setid", "autoclaim"]),
                          st.integers(0, 9), st.sampled_from(["a", "b", "c"])), max_size=25))
def test_random_states_round_trip(ops):
    db = build(BASE[:30] + [["XGROUP", "CREATE", "s", "g1", "0"]])
    for i, (op, n, who) in enumerate(ops):
        sid = "%d-%d" % (n + 1, n % 3)
        argv = {"read": ["XREADGROUP", "GROUP", "g1", who, "COUNT", str(n + 1), "STREAMS", "s", ">"],
                "noack": ["XREADGROUP", "GROUP", "g1", who, "NOACK", "COUNT", "2", "STREAMS", "s", ">"],
                "claim": ["XCLAIM", "s", "g1", who, "0", sid, "FORCE"],
                "ack": ["XACK", "s", "g1", sid],
                "del": ["XDEL", "s", sid],
                "add": ["XADD", "s", "%d-0" % (100 + i), "k", "v"],
                "setid": ["XGROUP", "SETID", "s", "g1", sid],
                "autoclaim": ["XAUTOCLAIM", "s", "g1", who, "0", "0", "COUNT", str(n + 1)]}[op]
        engine_call(db, *argv, now_ms=NOW + i)
    stream = db.get(b"s")
    loaded = load_stream(dump_stream(stream))
    assert snapshot_state(loaded) == snapshot_state(stream)
    assert dump_stream(loaded) == dump_stream(stream)


# -- corruption ------------------------------------------------------------------

def _refit(body: bytes) -> bytes:
    """A record with a valid CRC around a (tampered) body."""
    return body + struct.pack(">I", zlib.crc32(body))


def _good():
    return dump_stream(build(BASE).get(b"s"))


def test_every_truncation_and_bit_flip_rejected():
    buf = _good()
    for n in range(0, len(buf), max(1, len(buf) // 200)):
        with pytest.raises(CorruptStreamState):
            load_stream(buf[:n])
    for pos in range(0, len(buf), max(1, len(buf) // 300)):
        bad = bytearray(buf)
        bad[pos] ^= 0x10
        with pytest.raises(CorruptStreamState):
            load_stream(bytes(bad))
    with pytest.raises(CorruptStreamState):
        load_stream(buf + b"\0")
    with pytest.raises(CorruptStreamState):
        load_stream("not bytes")


def _groups_offset(buf: bytes) -> int:
    entries_len = struct.unpack_from(">I", buf, 5)[0]
    return 9 + entries_len


def _one_group_record(name=b"g", last_id=b"\0" * 16, entries_read=-1, pel=(), consumers=(),
                      policy=(0, 0, b"")):
    """pel: [(id16, time, count)]; consumers: [(name, seen, [id16, ...])];
    policy: (max_deliveries, dead_lettered, dead-letter key) of a version-4
    record, None for an older record (no policy fields)."""
    out = [struct.pack(">I", len(name)), name, last_id, struct.pack(">q", entries_read), struct.pack(">I", len(pel))]
    for key, t, c in pel:
        out += [key, struct.pack(">qQ", t, c)]
    out.append(struct.pack(">I", len(consumers)))
    for cname, seen, keys in consumers:
        out += [struct.pack(">I", len(cname)), cname, struct.pack(">qI", seen, len(keys))] + list(keys)
    if policy is not None:
        max_deliveries, dead_lettered, dead_letter_key = policy
        out += [struct.pack(">QQI", max_deliveries, dead_lettered, len(dead_letter_key)), dead_letter_key]
    return b"".join(out)


def _with_groups(group_records, count=None, version=None):
    good = dump_stream(build([["XADD", "s", "1-1", "a", "b"], ["XADD", "s", "2-1", "a", "b"]]).get(b"s"))
    head = good[:_groups_offset(good)]
    if version is not None:
        head = head[:4] + bytes([version]) + head[5:]
    n = len(group_records) if count is None else count
    # no idmp table (version >= 2), no retention (version >= 3)
    tail = b"\x00\x00"[:max(0, min((version or 4) - 1, 2))]
    return _refit(head + struct.pack(">I", n) + b"".join(group_records) + tail)


ID1 = (1).to_bytes(8, "big") + (1).to_bytes(8, "big")
ID2 = (2).to_bytes(8, "big") + (1).to_bytes(8, "big")


def test_hand_built_record_loads():
    rec = _one_group_record(pel=[(ID1, 5, 1), (ID2, 6, 2)], consumers=[(b"a", 7, [ID1]), (b"b", 8, [ID2])])
    stream = load_stream(_with_groups([rec]))
    grp = stream.cgroups.find(b"g")
    assert grp.pel.find(StreamID(1, 1)).consumer.name == b"a" and grp.pel.find(StreamID(2, 1)).delivery_count == 2


@pytest.mark.parametrize("record, why", [
    (_one_group_record(pel=[(ID1, 5, 1)], consumers=[]), "NACK without owner"),
    (_one_group_record(pel=[(ID1, 5, 1)], consumers=[(b"a", 1, [ID1]), (b"b", 1, [ID1])]), "owned twice"),
    (_one_group_record(pel=[(ID1, 5, 1)], consumers=[(b"a", 1, [ID1, ID2])]), "consumer ID not in group PEL"),
    (_one_group_record(pel=[(ID2, 5, 1), (ID1, 5, 1)], consumers=[(b"a", 1, [ID1, ID2])]), "PEL out of order"),
    (_one_group_record(pel=[(ID1, 5, 1), (ID1, 5, 1)], consumers=[(b"a", 1, [ID1])]), "duplicate PEL ID"),
    (_one_group_record(pel=[(ID1, 5, 1), (ID2, 5, 1)], consumers=[(b"b", 1, [ID2]), (b"a", 1, [ID1])]),
     "consumers out of order"),
    (_one_group_record(pel=[(ID1, 5, 1)], consumers=[(b"a", 1, [ID1, ID1])]), "consumer PEL duplicate"),
    (_one_group_record(entries_read=-2), "entries_read below -1"),
])
def test_inconsistent_groups_rejected(record, why):
    with pytest.raises(CorruptStreamState):
        load_stream(_with_groups([record]))


def test_group_counts_and_order_checked():
    rec = _one_group_record()
    load_stream(_with_groups([rec]))                                     # sanity: valid
    with pytest.raises(CorruptStreamState):
        load_stream(_with_groups([rec, rec]))                            # duplicate group name
    with pytest.raises(CorruptStreamState):
        load_stream(_with_groups([rec], count=2))                        # count larger than data
    with pytest.raises(CorruptStreamState):
        load_stream(_with_groups([rec], count=0x7FFFFFFF))               # absurd count
    huge_name = struct.pack(">I", 0xFFFFFFF0) + b"x"
    with pytest.raises(CorruptStreamState):
        load_stream(_with_groups([huge_name]))                           # name longer than the data
    with pytest.raises(CorruptStreamState):
        load_stream(_with_groups([rec + b"\0"]))                         # trailing bytes


def test_bad_entries_section_rejected():
    buf = _good()
    body = bytearray(buf[:-4])
    body[9 + 20] ^= 0xFF                     # inside the entries dump (its own CRC now fails)
    with pytest.raises(CorruptStreamState):
        load_stream(_refit(bytes(body)))
    body = bytearray(buf[:-4])
    body[0:4] = b"XXXX"
    with pytest.raises(CorruptStreamState):
        load_stream(_refit(bytes(body)))


# -- version 4: dead-letter policies (dead_letters.py) ----------------------------

def test_older_records_still_load_without_policy():
    rec = _one_group_record(pel=[(ID1, 5, 1)], consumers=[(b"a", 7, [ID1])], policy=None)
    for version in (1, 2, 3):
        grp = load_stream(_with_groups([rec], version=version)).cgroups.find(b"g")
        assert (grp.max_deliveries, grp.dead_letter_key, grp.dead_lettered) == (0, None, 0)
    with pytest.raises(CorruptStreamState):         # a version-3 header with version-4 groups
        load_stream(_with_groups([_one_group_record()], version=3))
    with pytest.raises(CorruptStreamState):         # an unknown version
        load_stream(_with_groups([_one_group_record()], version=6))


def test_policy_round_trips():
    db = build([["XADD", "{s}a", "1-1", "f", "v"], ["XGROUP", "CREATE", "{s}a", "g", "0"],
                ["XRAFT.GROUPCFG", "{s}a", "g", "MAXDELIVERIES", "1", "DEADLETTER", "{s}dlq"],
                ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "{s}a", ">"],
                ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "{s}a", "0"]])
    grp = load_stream(dump_stream(db.get(b"{s}a"))).cgroups.find(b"g")
    assert (grp.max_deliveries, grp.dead_letter_key, grp.dead_lettered) == (1, b"{s}dlq", 1)
    hand = load_stream(_with_groups([_one_group_record(policy=(3, 9, b"dl"))])).cgroups.find(b"g")
    assert (hand.max_deliveries, hand.dead_letter_key, hand.dead_lettered) == (3, b"dl", 9)


@pytest.mark.parametrize("policy, why", [
    ((3, 0, b""), "a policy without a dead-letter key"),
    ((0, 0, b"dl"), "a dead-letter key without a policy"),
    ((1 << 63, 0, b"dl"), "max deliveries past the limit"),
    ((1, 1 << 63, b"dl"), "dead-lettered count past int64"),
])
def test_bad_policy_rejected(policy, why):
    with pytest.raises(CorruptStreamState):
        load_stream(_with_groups([_one_group_record(policy=policy)]))
