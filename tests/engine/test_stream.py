"""Stream storage (node/engine/stream.py): against a sorted-dict model under
hypothesis, against real redis-server 7.0 node for node, and dump/load."""
import random
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.engine.keyspace import Keyspace
from xraft.node.invariant import InvariantViolation
from xraft.node.engine.listpack import lp_decode_all
from xraft.node.engine.stream import CorruptStream, Stream
from xraft.node.engine.streamid import MAX_ID, MIN_ID, UINT64_MAX, StreamID, format_id

# ----------------------------------------------------------------------------- model

FIELD_POOL = [b"a", b"b", b"10", b"-5", b"temperature"]
VALUE_POOL = [b"x", b"123", b"-7", b"", b"9223372036854775808", b"long" * 20, b"01", b"19.8",
              b"-4096", b"4095", b"70000", b"2147483648", b"y" * 70]


class Model:
    """The obvious stream: a sorted dict id -> fields, plus redis' counters."""

    def __init__(self):
        self.entries = {}
        self.last_id = MIN_ID
        self.max_deleted = MIN_ID
        self.added = 0

    def ids(self):
        return sorted(self.entries)

    def first_id(self):
        return min(self.entries) if self.entries else MIN_ID

    def range(self, start, end, reverse=False):
        out = [(i, self.entries[i]) for i in self.ids() if start <= i <= end]
        return out[::-1] if reverse else out


def node_layouts(s: Stream):
    """[(key, count, deleted)] of every node, decoded independently."""
    out = []
    for key, lp in s.rax.items():
        els = lp_decode_all(lp)
        out.append((key, els[0], els[1]))
    return out


def check_against_model(s: Stream, m: Model, rng: random.Random, max_entries: int):
    assert s.length == len(m.entries)
    assert s.last_id == m.last_id
    assert s.first_id == m.first_id()
    assert s.max_deleted_entry_id == m.max_deleted
    assert s.entries_added == m.added
    assert list(s.iter_range()) == m.range(MIN_ID, MAX_ID)
    assert list(s.iter_range(MIN_ID, MAX_ID, reverse=True)) == m.range(MIN_ID, MAX_ID, True)
    ids = m.ids()
    assert s.first_entry() == (m.range(MIN_ID, MAX_ID)[:1] or [None])[0]
    assert s.last_entry() == (m.range(MIN_ID, MAX_ID, True)[:1] or [None])[0]
    probes = ids[:2] + ids[-2:] + [MIN_ID, MAX_ID, StreamID(1, 0)]
    for _ in range(4):
        if ids:
            i = rng.choice(ids)
            probes += [i, i.incr() or i, i.decr() or i]
    last_node = [None, None]            # get()'s one-node cache, kept across the probes (any order)
    for a in probes:
        assert s.get(a) == m.entries.get(a)
        assert s.get(a, last_node) == m.entries.get(a)
        b = rng.choice(probes)
        lo, hi = min(a, b), max(a, b)
        assert list(s.iter_range(lo, hi)) == m.range(lo, hi)
        assert list(s.iter_range(lo, hi, reverse=True)) == m.range(lo, hi, True)
    total = 0
    for _key, count, deleted in node_layouts(s):
        assert count + deleted >= 1
        if max_entries:
            assert count + deleted <= max_entries
        total += count
    assert total == s.length
    s.rax.check()
    s.check()


field_lists = st.lists(st.tuples(st.sampled_from(FIELD_POOL), st.sampled_from(VALUE_POOL)),
                       min_size=1, max_size=3).map(lambda pairs: [x for p in pairs for x in p])

ops_strategy = st.lists(st.one_of(
    # append: ms step (0 = same ms), seq step, fields (None: repeat the previous fields)
    st.tuples(st.just("add"), st.sampled_from([0, 0, 1, 2, 1000, 1 << 63]), st.integers(0, 3),
              st.one_of(st.none(), field_lists)),
    st.tuples(st.just("del"), st.integers(0, 1 << 16), st.booleans()),
    st.tuples(st.just("trim"), st.sampled_from(["maxlen", "minid"]), st.integers(0, 1 << 16),
              st.booleans(), st.sampled_from([0, 0, 1, 3, 10])),
), max_size=70)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy,
       max_entries=st.sampled_from([0, 1, 2, 3, 5, 100]),
       max_bytes=st.sampled_from([0, 1, 40, 60, 120, 300, 4096]),
       start_ms=st.sampled_from([0, 5, UINT64_MAX - (1 << 62)]),
       seed=st.integers(0, 1000))
def test_stream_matches_model(ops, max_entries, max_bytes, start_ms, seed):
    rng = random.Random(seed)
    s, m = Stream(), Model()
    prev_fields = [b"a", b"1"]
    nxt = StreamID(start_ms, 1)
    for op in ops:
        if op[0] == "add":
            _, ms_step, seq_step, fields = op
            fields = prev_fields if fields is None else fields
            prev_fields = fields
            if ms_step:
                if m.last_id.ms + ms_step > UINT64_MAX:
                    continue
                nxt = StreamID(m.last_id.ms + ms_step, seq_step)
            else:
                if m.last_id.seq + 1 + seq_step > UINT64_MAX:
                    continue
                nxt = StreamID(m.last_id.ms, m.last_id.seq + 1 + seq_step)
            if nxt <= m.last_id:
                continue
            s.append(nxt, list(fields), max_bytes, max_entries)
            m.entries[nxt] = list(fields)
            m.last_id = nxt
            m.added += 1
        elif op[0] == "del":
            _, pick, existing = op
            ids = m.ids()
            if existing and ids:
                victim = ids[pick % len(ids)]
            else:
                victim = StreamID(m.last_id.ms, pick) if pick % 2 else StreamID(pick, 0)
            removed = s.delete(victim)
            assert removed == (victim in m.entries)
            if removed:
                del m.entries[victim]
                m.max_deleted = max(m.max_deleted, victim)
        else:
            _, strategy, arg, approx, limit = op
            ids = m.ids()
            if strategy == "maxlen":
                threshold = arg % (len(ids) + 2)
                want = max(0, len(ids) - threshold)
            else:
                threshold = ids[arg % len(ids)] if ids and arg % 3 else StreamID(arg, 0)
                want = sum(1 for i in ids if i < threshold)
            removed = s.trim(strategy, threshold, approx, limit)
            assert 0 <= removed <= want
            if not approx and not limit:
                assert removed == want
            if limit:
                assert removed <= limit
            for i in ids[:removed]:        # trimming always takes the oldest entries
                del m.entries[i]
    check_against_model(s, m, rng, max_entries)
    # dump -> load gives the same stream, byte for byte, and it keeps working
    blob = s.dump_entries()
    t = Stream.load_entries(blob)
    assert t.dump_entries() == blob
    assert list(t.iter_range()) == list(s.iter_range())
    assert (t.length, t.last_id, t.first_id, t.max_deleted_entry_id, t.entries_added) == \
           (s.length, s.last_id, s.first_id, s.max_deleted_entry_id, s.entries_added)
    if s.last_id.incr() is not None:
        more = s.last_id.incr()
        s.append(more, [b"a", b"z"], max_bytes, max_entries)
        t.append(more, [b"a", b"z"], max_bytes, max_entries)
        assert t.dump_entries() == s.dump_entries()


# ----------------------------------------------------------------------------- unit checks

def test_type_registered_and_ids():
    db = Keyspace()
    db.set(b"s", Stream())
    assert db.type_name(b"s") == "stream"
    assert db.get_typed(b"s", Stream) is not None
    s = Stream()
    assert s.next_auto_id(5) == StreamID(5, 0)
    s.append(StreamID(10, 3), [b"f", b"v"], 4096, 100)
    assert s.next_auto_id(5) == StreamID(10, 4)        # clock behind: never backwards
    assert s.next_auto_id(10) == StreamID(10, 4)
    assert s.next_auto_id(11) == StreamID(11, 0)
    with pytest.raises(InvariantViolation):
        s.append(StreamID(10, 3), [b"f", b"v"], 4096, 100)        # not above last_id: a caller bug
    with pytest.raises(InvariantViolation):
        s.append(StreamID(11, 0), [b"f"], 4096, 100)              # no value
    assert s.length == 1
    s.append(MAX_ID, [b"f", b"v"], 4096, 100)
    assert s.next_auto_id(UINT64_MAX) is None
    assert s.next_auto_id(0) is None


def test_node_bytes_exactly_as_redis_lays_them_out():
    s = Stream()
    s.append(StreamID(5, 5), [b"f", b"1", b"g", b"x"], 4096, 100)
    s.append(StreamID(7, 0), [b"f", b"2", b"g", b"y"], 4096, 100)       # SAMEFIELDS
    s.append(StreamID(8, 1), [b"h", b"3"], 4096, 100)                  # other fields
    (key, lp), = s.rax.items()
    assert key == StreamID(5, 5).encode()
    assert lp_decode_all(lp) == [
        3, 0, 2, b"f", b"g", 0,                       # master entry
        2, 0, 0, 1, b"x", 5,                          # SAMEFIELDS, diffs 0 0
        2, 2, -5, 2, b"y", 5,                         # seq diff 0 - 5 = -5
        0, 3, -4, 1, b"h", 3, 6,                      # NONE: num-fields, pairs
    ]
    assert s.delete(StreamID(7, 0))
    assert lp_decode_all(s.rax.first()[1])[:2] == [2, 1]
    assert lp_decode_all(s.rax.first()[1])[12] == 3   # DELETED | SAMEFIELDS


def test_id_deltas_wrap_like_uint64():
    s = Stream()
    s.append(StreamID(0, 9), [b"f", b"v"], 0, 0)
    s.append(StreamID(UINT64_MAX, 0), [b"f", b"w"], 0, 0)   # ms diff 2**64-1 stored as -1
    s.append(MAX_ID, [b"f", b"u"], 0, 0)
    assert [i for i, _ in s.iter_range()] == [StreamID(0, 9), StreamID(UINT64_MAX, 0), MAX_ID]
    assert s.get(StreamID(UINT64_MAX, 0)) == [b"f", b"w"]
    assert s.trim("minid", StreamID(UINT64_MAX, 0), False, 0) == 1
    assert s.first_id == StreamID(UINT64_MAX, 0)


def test_delete_last_live_entry_of_a_node_drops_the_node():
    s = Stream()
    for i in range(1, 7):
        s.append(StreamID(i, 0), [b"f", b"v"], 4096, 3)
    assert s.rax.numele == 2
    for i in (4, 5, 6):
        assert s.delete(StreamID(i, 0))
    assert s.rax.numele == 1 and s.length == 3
    s.append(StreamID(9, 0), [b"f", b"v"], 4096, 3)   # the tail node was dropped: a new one
    assert s.rax.numele == 2
    assert [i.ms for i, _ in s.iter_range()] == [1, 2, 3, 9]
    assert not s.delete(StreamID(4, 0))
    for i in (1, 2, 3, 9):
        assert s.delete(StreamID(i, 0))
    assert s.length == 0 and s.rax.numele == 0 and s.first_id == MIN_ID
    assert s.max_deleted_entry_id == StreamID(9, 0)


def test_iteration_survives_changes_between_items():
    """Callers may delete or append while walking (the rax is re-seeked per node)."""
    s = Stream()
    for i in range(1, 11):
        s.append(StreamID(i, 0), [b"f", b"%d" % i], 4096, 3)
    seen = []
    for sid, _fv in s.iter_range():
        seen.append(sid.ms)
        assert s.delete(sid)                      # empties and drops nodes under the walk
        if sid.ms == 5:
            s.append(StreamID(11, 0), [b"f", b"11"], 4096, 3)
    assert seen == list(range(1, 12))
    assert s.length == 0 and s.rax.numele == 0
    s.check()


# ----------------------------------------------------------------------------- dump / load

def sample_stream():
    s = Stream()
    for i in range(1, 40):
        s.append(StreamID(i, i % 3), [b"k", b"%d" % i, b"v" * (i % 4), b"z"], 120, 5)
    s.delete(StreamID(3, 0))
    s.delete(StreamID(17, 2))
    s.trim("maxlen", 30, False, 0)
    return s


def reframe(body: bytes) -> bytes:
    return body + struct.pack(">I", zlib.crc32(body))


def test_dump_rejects_flips_and_truncation():
    blob = sample_stream().dump_entries()
    rng = random.Random(7)
    for _ in range(200):
        bad = bytearray(blob)
        bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptStream):
            Stream.load_entries(bytes(bad))
    for cut in (0, 1, 10, len(blob) // 2, len(blob) - 1):
        with pytest.raises(CorruptStream):
            Stream.load_entries(blob[:cut])
    with pytest.raises(CorruptStream):
        Stream.load_entries(blob + b"\x00")
    with pytest.raises(CorruptStream):
        Stream.load_entries("not bytes")


def test_dump_with_valid_crc_but_bad_content_is_rejected_or_consistent():
    """Bit flips behind a recomputed CRC: deep validation must catch every
    inconsistency; the rare flip that leaves a valid stream must load into
    exactly what the bytes say."""
    blob = sample_stream().dump_entries()
    body = blob[:-4]
    rng = random.Random(11)
    rejected = 0
    for _ in range(400):
        bad = bytearray(body)
        bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        try:
            t = Stream.load_entries(reframe(bytes(bad)))
        except CorruptStream:
            rejected += 1
            continue
        assert t.dump_entries() == reframe(bytes(bad))
        list(t.iter_range())
        list(t.iter_range(reverse=True))
    assert rejected > 200


def _node_blob(s: Stream, index: int):
    """(offset of node `index`'s listpack in the dump body, its size)."""
    pos = struct.calcsize(">4sBQQQQQQQQI")
    for i, (_key, lp) in enumerate(s.rax.items()):
        pos += 20
        if i == index:
            return pos, len(lp)
        pos += len(lp)
    raise IndexError(index)


def _rewrite_node(s: Stream, index: int, edit) -> bytes:
    """A dump of `s` whose node `index` listpack is edit(list of elements)."""
    from xraft.node.engine.listpack import lp_append_many, lp_new
    body = s.dump_entries()[:-4]
    pos, size = _node_blob(s, index)
    els = edit(lp_decode_all(body[pos:pos + size]))
    lp = lp_new()
    lp_append_many(lp, els)
    body = body[:pos - 4] + struct.pack(">I", len(lp)) + bytes(lp) + body[pos + size:]
    return reframe(body)


@pytest.mark.parametrize("case", [
    "count", "deleted", "nmf0", "terminator", "flags", "first-diff", "lp-count", "numfields",
    "extra", "missing",
])
def test_semantic_corruption_is_rejected(case):
    s = sample_stream()

    def edit(els):
        nmf = els[2]
        first = 4 + nmf
        if case == "count":
            els[0] += 1
        elif case == "deleted":
            els[1] += 1
        elif case == "nmf0":
            els[2] = 0
        elif case == "terminator":
            els[3 + nmf] = 1
        elif case == "flags":
            els[first] = 4
        elif case == "first-diff":
            els[first + 1] = 1
        elif case == "lp-count":
            els[-1] += 1
        elif case == "numfields":
            assert els[first] & 2                  # a node's first entry is SAMEFIELDS
            els[first] = 0                         # claim NONE: num-fields/pairs do not fit
        elif case == "extra":
            els.append(7)
        elif case == "missing":
            del els[-1]
        return els
    with pytest.raises(CorruptStream):
        Stream.load_entries(_rewrite_node(s, 1, edit))


def test_meta_corruption_is_rejected():
    s = sample_stream()
    fmt = ">4sBQQQQQQQQI"
    hdr = list(struct.unpack_from(fmt, s.dump_entries(), 0))
    nodes = s.dump_entries()[struct.calcsize(fmt):-4]

    def with_header(**changes):
        h = list(hdr)
        names = ["magic", "version", "length", "last_ms", "last_seq", "first_ms", "first_seq",
                 "del_ms", "del_seq", "added", "nodes"]
        for k, v in changes.items():
            h[names.index(k)] = v
        return reframe(struct.pack(fmt, *h) + nodes)
    assert Stream.load_entries(with_header()).length == s.length
    for bad in (dict(magic=b"XSTN"), dict(version=2), dict(length=hdr[2] + 1),
                dict(first_seq=hdr[6] + 1), dict(last_ms=0, last_seq=0), dict(added=hdr[2] - 1),
                dict(nodes=hdr[10] + 1), dict(nodes=hdr[10] - 1), dict(nodes=1 << 31)):
        with pytest.raises(CorruptStream):
            Stream.load_entries(with_header(**bad))
    # node keys out of order
    items = list(s.rax.items())
    body = struct.pack(fmt, *hdr)
    for key, lp in [items[1], items[0]] + items[2:]:
        body += struct.pack(">16sI", key, len(lp)) + bytes(lp)
    with pytest.raises(CorruptStream):
        Stream.load_entries(reframe(body))


# ----------------------------------------------------------------------------- redis

def xinfo(redis, key):
    reply = redis.call("XINFO", "STREAM", key)
    return dict(zip(reply[0::2], reply[1::2]))


def ours_as_redis(s: Stream):
    def entry(e):
        return None if e is None else [format_id(e[0]), e[1]]
    return {
        b"length": s.length,
        b"radix-tree-keys": s.rax.numele,
        b"radix-tree-nodes": s.rax.numnodes,
        b"last-generated-id": format_id(s.last_id),
        b"max-deleted-entry-id": format_id(s.max_deleted_entry_id),
        b"entries-added": s.entries_added,
        b"recorded-first-entry-id": format_id(s.first_id),
        b"first-entry": entry(s.first_entry()),
        b"last-entry": entry(s.last_entry()),
    }


def compare(redis, key, s: Stream):
    s.check()
    info = xinfo(redis, key)
    info.pop(b"groups")
    assert info == ours_as_redis(s)
    want = redis.call("XRANGE", key, "-", "+")
    assert [[format_id(i), fv] for i, fv in s.iter_range()] == want
    assert [[format_id(i), fv] for i, fv in s.iter_range(reverse=True)] == \
        redis.call("XREVRANGE", key, "+", "-")


def pipelined(redis, commands):
    for argv in commands:
        redis.send(*argv)
    return [redis.read() for _ in commands]


@pytest.mark.redis
@pytest.mark.parametrize("max_entries,max_bytes,seed", [
    (100, 4096, 1), (5, 4096, 2), (7, 150, 3), (0, 200, 4), (3, 0, 5), (1, 4096, 6), (50, 60, 7),
])
def test_node_for_node_like_redis(redis, max_entries, max_bytes, seed):
    rng = random.Random(seed)
    old = [redis.call("CONFIG", "GET", n)[1] for n in ("stream-node-max-entries", "stream-node-max-bytes")]
    try:
        redis.call("CONFIG", "SET", "stream-node-max-entries", max_entries)
        redis.call("CONFIG", "SET", "stream-node-max-bytes", max_bytes)
        key = b"s%d" % seed
        s = Stream()
        ms, seq = rng.choice([(1, 0), (1700000000000, 5)])
        for _round in range(3):
            adds = []
            for _ in range(rng.randrange(80, 220)):
                if rng.random() < 0.5:
                    seq += rng.randrange(1, 3)
                else:
                    ms += rng.choice([1, 2, 300, 70000])
                    seq = rng.randrange(0, 3)
                if rng.random() < 0.7:
                    fields = [b"sensor-id", b"%d" % rng.randrange(5000), b"temperature", b"19.8"]
                else:
                    fields = []
                    for _ in range(rng.randrange(1, 4)):
                        fields += [rng.choice(FIELD_POOL), rng.choice(VALUE_POOL)]
                sid = StreamID(ms, seq)
                s.append(sid, fields, max_bytes, max_entries)
                adds.append([b"XADD", key, format_id(sid)] + fields)
            assert pipelined(redis, adds) == [a[2] for a in adds]
            compare(redis, key, s)
            ids = [i for i, _ in s.iter_range()]
            victims = rng.sample(ids, min(len(ids), rng.randrange(0, 25))) + [StreamID(ms + 1, 0)]
            for v in victims:
                assert redis.call("XDEL", key, format_id(v)) == int(s.delete(v))
            compare(redis, key, s)
            for _ in range(3):
                approx = rng.random() < 0.5
                limit = rng.choice([0, 0, 10, 1000]) if approx else 0
                op = [b"~" if approx else b"="]
                if rng.random() < 0.5:
                    n = max(0, s.length - rng.randrange(0, 60))
                    argv = [b"XTRIM", key, b"MAXLEN", *op, b"%d" % n]
                    args = ("maxlen", n)
                else:
                    ids = [i for i, _ in s.iter_range()] or [StreamID(ms, seq)]
                    t = ids[min(len(ids) - 1, rng.randrange(0, 60))]
                    argv = [b"XTRIM", key, b"MINID", *op, format_id(t)]
                    args = ("minid", t)
                if approx:
                    if limit:
                        argv += [b"LIMIT", b"%d" % limit]
                    else:                             # redis' default for '~'
                        limit = min(100 * max_entries, 1000000) if max_entries else 10000
                assert redis.call(*argv) == s.trim(args[0], args[1], approx, limit)
                compare(redis, key, s)
    finally:
        redis.call("CONFIG", "SET", "stream-node-max-entries", old[0])
        redis.call("CONFIG", "SET", "stream-node-max-bytes", old[1])


@pytest.mark.redis
def test_quirks_like_redis(redis):
    """States only XSETID / exact MINID trims reach: a node left with 0 live
    entries, appends behind a tombstone, and a new node keyed below the last."""
    old = [redis.call("CONFIG", "GET", n)[1] for n in ("stream-node-max-entries", "stream-node-max-bytes")]
    try:
        redis.call("CONFIG", "SET", "stream-node-max-entries", 5)
        redis.call("CONFIG", "SET", "stream-node-max-bytes", 4096)
        s = Stream()

        def add(ms, seq):
            s.append(StreamID(ms, seq), [b"f", b"%d" % ms], 4096, 5)
            assert redis.call("XADD", "q", "%d-%d" % (ms, seq), "f", ms) == b"%d-%d" % (ms, seq)

        def setid(ms, seq):
            assert redis.call("XSETID", "q", "%d-%d" % (ms, seq)) == "OK"
            s.last_id = StreamID(ms, seq)           # what XSETID does to the stream

        for ms in range(1, 6):
            add(ms, 0)
        assert redis.call("XDEL", "q", "5-0") == s.delete(StreamID(5, 0)) == 1
        # the node's last ID (a tombstone) is not below MINID: entries are
        # tombstoned one by one and the node stays with count 0
        assert redis.call("XTRIM", "q", "MINID", "=", "5-0") == s.trim("minid", StreamID(5, 0), False, 0) == 4
        compare(redis, "q", s)
        assert s.rax.numele == 1 and s.length == 0
        setid(0, 1)                                  # any ID goes on an empty stream
        add(0, 2)                                    # node full: a new node keyed below the old
        compare(redis, "q", s)
        add(0, 3)                                    # "$" is still the full old node: another
        compare(redis, "q", s)
        assert s.rax.numele == 3
        for ms in range(1, 3):
            add(10 + ms, 0)
        assert redis.call("XDEL", "q", "12-0") == s.delete(StreamID(12, 0)) == 1
        setid(11, 5)                                 # below the tombstone 12-0
        add(11, 6)                                   # appended behind it, out of order
        compare(redis, "q", s)
        for lo, hi in [("11-3", "+"), ("-", "11-5"), ("12-0", "+"), ("0-3", "11-0")]:
            want = redis.call("XRANGE", "q", lo, hi)
            a, b = (StreamID(*map(int, x.split("-"))) if x not in "-+" else None for x in (lo, hi))
            got = [[format_id(i), fv] for i, fv in s.iter_range(a or MIN_ID, b or MAX_ID)]
            assert got == want, (lo, hi)
            want = redis.call("XREVRANGE", "q", hi, lo)
            got = [[format_id(i), fv] for i, fv in s.iter_range(a or MIN_ID, b or MAX_ID, reverse=True)]
            assert got == want, (lo, hi)
        blob = s.dump_entries()
        assert Stream.load_entries(blob).dump_entries() == blob
        for trim in (("MAXLEN", "=", "1"), ("MINID", "~", "20-0")):
            args = ("maxlen", 1) if trim[0] == "MAXLEN" else ("minid", StreamID(20, 0))
            assert redis.call("XTRIM", "q", *trim) == s.trim(*args, trim[1] == "~", 500 if trim[1] == "~" else 0)
            compare(redis, "q", s)
    finally:
        redis.call("CONFIG", "SET", "stream-node-max-entries", old[0])
        redis.call("CONFIG", "SET", "stream-node-max-bytes", old[1])
