"""XADD_BATCH requests (fsm/xadd_batch.py, entry.py "xadd batch"): the same results and the
same state, byte for byte, as the N `XADD key [NOMKSTREAM] [trim] <id> f v ..` commands run
in one MULTI; the record codec's round trips and its refusal of anything else; retries."""
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.engine import cmd_streams
from xraft.node.engine.dump import dump_keyspace
from xraft.node.engine.errors import EngineError
from xraft.node.engine.stream import Stream
from xraft.node.fsm import entry as E
from xraft.node.fsm.entry import (MAXLEN, MINID, Kind, Record, Request, XAddBatch, decode_record,
                                  encode_record, request_size)
from xraft.node.fsm.errors import CorruptEntry, EntryTooLarge, ExecAbort
from xraft.node.fsm.resolve import queue_check, resolve_xadd_batch
from xraft.node.fsm.sessions import ResultNotKept
from xraft.node.fsm.state_machine import StateMachine
from xraft.node.fsm.xadd_batch import error_without_fields
from xraft.node.invariant import InvariantViolation

NOW = 1_700_000_000_000
U64 = 2**64 - 1
I64 = 2**63 - 1

# -- the MULTI of XADDs a batch stands for -----------------------------------------------------


def trim_argv(strategy, approx, threshold, limit) -> list:
    """The options as server/grpc_convert.trim_args writes them."""
    if strategy is None:
        return []
    out = [b"MAXLEN" if strategy == MAXLEN else b"MINID"]
    if approx:
        out.append(b"~")
    out.append(b"%d" % threshold if strategy == MAXLEN else b"%d-%d" % threshold)
    if limit is not None:
        out += [b"LIMIT", b"%d" % limit]
    return out


def id_argv(kind, ms, seq) -> bytes:
    return (b"*", b"%d-*" % ms, b"%d-%d" % (ms, seq))[kind]


def xadd_argvs(b: XAddBatch) -> list:
    head = [b"XADD", b.key] + ([b"NOMKSTREAM"] if b.no_mkstream else [])
    head += trim_argv(b.strategy, b.approx, b.threshold, b.limit)
    return [head + [id_argv(kind, ms, seq)] + list(fields) for kind, ms, seq, fields in b.entries]


# -- strategies ---------------------------------------------------------------------------------

VALUE = st.sampled_from([b"f", b"g", b"1234", b"19.8", b"", b"-5", b"0", b"x" * 70, b"9223372036854775808"])
MS = st.sampled_from([0, 1, 2, 3, 4, NOW - 1, NOW, NOW, NOW + 1, NOW + 1, NOW + 2, U64 - 1, U64])
SEQ = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, U64 - 1, U64])
AUTO = st.just((0, 0, 0))
ID = st.one_of(AUTO, AUTO, AUTO, st.tuples(st.just(1), MS, st.just(0)), st.tuples(st.just(2), MS, SEQ))
FIELDS = st.lists(VALUE, min_size=1, max_size=3).flatmap(
    lambda names: st.tuples(*[st.tuples(st.just(n), VALUE) for n in names])).map(
    lambda pairs: tuple(x for p in pairs for x in p))
ENTRY = st.tuples(ID, FIELDS).map(lambda t: (*t[0], t[1]))
RARELY_BAD = [I64 + 1, U64]                 # refused by redis's parser: every entry gets the error


@st.composite
def trims(draw):
    """Mostly valid options (so entries get appended and trimmed), now and then not."""
    strategy = draw(st.sampled_from([None, None, MAXLEN, MAXLEN, MINID]))
    if strategy is None:
        return None, False, 0, None
    bad = draw(st.integers(0, 9)) == 0
    if strategy == MAXLEN:
        threshold = draw(st.sampled_from(RARELY_BAD) if bad else st.integers(0, 6))
    else:
        threshold = draw(st.tuples(st.one_of(st.integers(0, 4), st.sampled_from([NOW, NOW + 1])),
                                   st.integers(0, 3)))
    approx = draw(st.booleans())
    if approx or draw(st.integers(0, 9)) == 0:     # LIMIT without ~: refused, now and then
        limit = draw(st.one_of(st.none(), st.integers(0, 4), st.sampled_from(RARELY_BAD if bad else [I64])))
    else:
        limit = None
    return strategy, approx, threshold, limit


@st.composite
def batches(draw, key=b"s", entries=st.lists(ENTRY, min_size=1, max_size=12)):
    strategy, approx, threshold, limit = draw(trims())
    return XAddBatch.build(key, draw(entries), no_mkstream=draw(st.booleans()), strategy=strategy,
                           approx=approx, threshold=threshold, limit=limit)


# Where the key starts: commands run on both replicas first.
SETUPS = {
    "missing": [],
    "stream": [[b"XADD", b"s", b"3-1", b"f", b"v"], [b"XADD", b"s", b"%d-5" % NOW, b"f", b"1234"]],
    "empty stream": [[b"XADD", b"s", b"5-5", b"f", b"v"], [b"XDEL", b"s", b"5-5"]],
    "top at ms max": [[b"XADD", b"s", b"1-1", b"f", b"v"], [b"XSETID", b"s", b"%d-%d" % (NOW, U64)]],
    "exhausted": [[b"XADD", b"s", b"1-1", b"f", b"v"], [b"XSETID", b"s", b"%d-%d" % (U64, U64)]],
    "wrong type": [[b"RPUSH", b"s", b"a"]],
}
CONFIGS = [[], [b"CONFIG", b"SET", b"stream-node-max-entries", b"3"],
           [b"CONFIG", b"SET", b"stream-node-max-entries", b"0", b"stream-node-max-bytes", b"60"],
           [b"CONFIG", b"SET", b"stream-node-max-entries", b"1"]]


def _run(sm, now, *reqs):
    new = [Request.register(r.client_id) for r in reqs if r.client_id and r.client_id not in sm.sessions.clients]
    if new:                                 # sessions first (sessions.py), in a record of their own
        sm.apply(sm.applied_index + 1, encode_record(now, new))
    return sm.apply(sm.applied_index + 1, encode_record(now, reqs))


def _pair(setup, config):
    """Two state machines in the same state: one gets batches, the other MULTIs."""
    out = []
    for _ in range(2):
        sm = StateMachine()
        if config:
            _run(sm, NOW, Request.config(0, 0, config))
        for argv in SETUPS[setup]:
            _run(sm, NOW, Request.command(0, 0, argv))
        out.append(sm)
    return out


def _norm(results):
    """Results as comparable values: errors by their text (that is what a reply carries)."""
    if isinstance(results, EngineError):
        return ("error", results.message)
    return [("error", r.message) if isinstance(r, EngineError) else r for r in results]


SLOW = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(st.sampled_from(sorted(SETUPS)), st.sampled_from(range(len(CONFIGS))),
       st.lists(st.tuples(batches(), st.sampled_from([NOW - 5, NOW, NOW, NOW + 1, NOW + 7]), st.booleans()),
                min_size=1, max_size=3))
def test_same_results_and_state_as_a_multi_of_xadds(setup, config, steps):
    fast, slow = _pair(setup, CONFIGS[config])
    for i, (batch, now, with_id) in enumerate(steps):
        cid, seq = (7, i + 1) if with_id else (0, 0)
        got = _run(fast, now, Request.xadd_batch(cid, seq, batch))
        want = _run(slow, now, Request.multi(cid, seq, xadd_argvs(batch)))
        assert not isinstance(want[0], ExecAbort)          # every XADD has fields: MULTI queues it
        assert _norm(got[0]) == _norm(want[0])
        assert len(got[0]) == len(batch.entries)
        assert fast.last_ready_keys == slow.last_ready_keys
        assert fast.snapshot() == slow.snapshot()           # data, sessions, index and time
        value = fast.keyspace.get(b"s")
        if isinstance(value, Stream):
            value.check()                                   # the tail cache too
        if with_id:                                         # a retry: the first result, nothing applied
            before = dump_keyspace(fast.keyspace)           # (the retry refreshes the session's time)
            assert _norm(_run(fast, now + 1, Request.xadd_batch(cid, seq, batch))[0]) == _norm(got[0])
            _run(slow, now + 1, Request.multi(cid, seq, xadd_argvs(batch)))
            assert dump_keyspace(fast.keyspace) == before


@pytest.mark.parametrize("config", range(len(CONFIGS)))
@pytest.mark.parametrize("trim", [(MAXLEN, False, 10, None), (MAXLEN, True, 10, None), (MAXLEN, True, 10, 3),
                                  (MAXLEN, False, 0, None), (MINID, False, (NOW, 50), None),
                                  (MINID, True, (NOW, 120), 7), (MINID, True, (NOW + 1, 0), None)])
def test_long_batches_trimmed_after_every_entry(config, trim):
    strategy, approx, threshold, limit = trim
    shapes = [(b"a", b"1"), (b"a", b"2"), (b"a", b"x", b"b", b"y"), (b"c", b"%d" % 10**15)]
    entries = [(0, 0, 0, shapes[(i * 7) % 5 % 4]) for i in range(300)]
    entries[100:100] = [(2, NOW, 150, (b"a", b"e")), (1, NOW, 0, (b"a", b"1")), (2, NOW, 3, (b"a", b"1"))]
    batch = XAddBatch.build(b"s", entries, strategy=strategy, approx=approx, threshold=threshold, limit=limit)
    fast, slow = _pair("stream", CONFIGS[config])
    for now in (NOW, NOW + 1):
        got = _run(fast, now, Request.xadd_batch(3, now, batch))
        want = _run(slow, now, Request.multi(3, now, xadd_argvs(batch)))
        assert _norm(got[0]) == _norm(want[0])
        assert fast.snapshot() == slow.snapshot()
        fast.keyspace.get(b"s").check()


def test_results_one_per_entry_in_order():
    sm = StateMachine()
    _run(sm, NOW, Request.command(0, 0, [b"RPUSH", b"l", b"x"]))
    f = (b"f", b"v")
    b = XAddBatch.build(b"s", [(0, 0, 0, f), (2, 5, 0, f), (1, NOW, 0, f), (2, 0, 0, f), (1, NOW + 3, 0, f)])
    [res] = _run(sm, NOW, Request.xadd_batch(0, 0, b))
    assert res[0] == b"%d-0" % NOW and res[2] == b"%d-1" % NOW and res[4] == b"%d-0" % (NOW + 3)
    assert res[1].message == "ERR The ID specified in XADD is equal or smaller than the target stream top item"
    assert res[3].message == "ERR The ID specified in XADD must be greater than 0-0"
    assert sm.last_ready_keys == {b"s"}
    [res] = _run(sm, NOW, Request.xadd_batch(0, 0, XAddBatch.build(b"l", [(0, 0, 0, f), (2, 0, 0, f)])))
    assert res[0].code == "WRONGTYPE" and res[1].message.endswith("greater than 0-0")
    assert sm.last_ready_keys == frozenset()                # nothing appended: nobody to wake
    [res] = _run(sm, NOW, Request.xadd_batch(0, 0, XAddBatch.build(b"none", [(0, 0, 0, f)] * 2, no_mkstream=True)))
    assert res == [None, None] and sm.keyspace.get(b"none") is None
    [res] = _run(sm, NOW, Request.xadd_batch(0, 0, XAddBatch.build(b"s", [(0, 0, 0, f)], strategy=MAXLEN,
                                                                  threshold=1, limit=5)))
    assert res[0].message == "ERR syntax error, LIMIT cannot be used without the special ~ option"


def test_retry_returns_the_first_results_and_large_ones_are_kept_as_a_marker():
    sm = StateMachine(max_result_bytes=256)
    f = (b"f", b"v")
    small = XAddBatch.build(b"s", [(0, 0, 0, f), (2, 1, 1, f)])
    [first] = _run(sm, NOW, Request.xadd_batch(9, 1, small))
    assert first[0] == b"%d-0" % NOW and first[1].code == "ERR"
    [again] = _run(sm, NOW + 9, Request.xadd_batch(9, 1, small))
    assert _norm(again) == _norm(first)
    assert sm.keyspace.get(b"s").length == 1
    big = XAddBatch.build(b"s", [(0, 0, 0, f)] * 40)     # 40 IDs do not fit 256 bytes
    [many] = _run(sm, NOW, Request.xadd_batch(9, 2, big))
    assert len(many) == 40 and all(type(r) is bytes for r in many)
    [again] = _run(sm, NOW, Request.xadd_batch(9, 2, big))
    assert again == ResultNotKept(9, 2)
    assert sm.keyspace.get(b"s").length == 41
    # Through a snapshot: the table is replicated state.
    other = StateMachine()
    other.restore(sm.snapshot())
    [third] = _run(other, NOW + 20, Request.xadd_batch(9, 1, small))
    assert _norm(third) == _norm(first)
    assert other.keyspace.get(b"s").length == 41


@SLOW
@given(trims(), st.booleans())
def test_entries_without_fields_get_what_the_argv_path_gives(trim, no_mkstream):
    """The leader answers them alone: queue_check's arity error when MULTI would
    refuse the argv, else XADD's own answer (options first, then arity)."""
    strategy, approx, threshold, limit = trim
    argv = [b"XADD", b"s"] + ([b"NOMKSTREAM"] if no_mkstream else []) + trim_argv(*trim) + [b"*"]
    try:
        queue_check(argv)
    except EngineError as e:
        want = e
    else:
        [[want]] = _run(StateMachine(), NOW, Request.multi(0, 0, [argv]))
    assert error_without_fields(strategy, approx, threshold, limit) == want


@SLOW
@given(trims())
def test_trim_args_are_the_option_parsers(trim):
    strategy, approx, threshold, limit = trim
    argv = [b"XADD", b"s"] + trim_argv(*trim) + [b"*", b"f", b"v"]
    for node_entries in (0, 7, 100, 20000):
        try:
            want = cmd_streams.parse_add_or_trim_args(argv, True, node_entries)
        except EngineError as e:
            want = e
        try:
            got = cmd_streams.xadd_trim_args(strategy, approx, threshold, limit, node_entries)
        except EngineError as e:
            got = e
        if isinstance(want, EngineError):
            assert got == want
        else:
            assert (got.strategy, got.approx, got.limit, got.threshold) == \
                   (want.strategy, want.approx, want.limit, want.threshold)


# -- the record codec -----------------------------------------------------------------------------

ANY_ID = st.one_of(st.just((0, 0, 0)), st.tuples(st.just(1), st.integers(0, U64), st.just(0)),
                   st.tuples(st.just(2), st.integers(0, U64), st.integers(0, U64)))
ANY_FIELDS = st.lists(st.binary(max_size=9), min_size=1, max_size=4).map(
    lambda xs: tuple(xs + xs[:1]) if len(xs) % 2 else tuple(xs))          # an even count
ANY_ENTRY = st.tuples(ANY_ID, ANY_FIELDS).map(lambda t: (*t[0], t[1]))


@st.composite
def any_batches(draw):
    strategy = draw(st.sampled_from([None, MAXLEN, MINID]))
    approx, limit, threshold = False, None, 0
    if strategy is not None:
        approx = draw(st.booleans())
        limit = draw(st.one_of(st.none(), st.integers(0, U64)))
        threshold = draw(st.integers(0, U64) if strategy == MAXLEN else st.tuples(st.integers(0, U64),
                                                                                   st.integers(0, U64)))
    return XAddBatch.build(draw(st.binary(max_size=8)), draw(st.lists(ANY_ENTRY, min_size=1, max_size=5)),
                           no_mkstream=draw(st.booleans()), strategy=strategy, approx=approx,
                           threshold=threshold, limit=limit)


CLIENT = st.one_of(st.just((0, 0)), st.tuples(st.integers(1, U64), st.integers(1, U64)))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**63 - 1), st.lists(st.tuples(CLIENT, any_batches()), min_size=1, max_size=3))
def test_round_trip(now, items):
    reqs = [Request.xadd_batch(cid, seq, b) for (cid, seq), b in items]
    reqs.insert(len(reqs) // 2, Request.command(0, 0, [b"PING"]))      # among the other kinds
    data = encode_record(now, reqs)
    back = decode_record(data)
    assert back == Record(now, tuple(reqs))
    for got, want in zip(back.requests, reqs):
        if want.kind == Kind.XADD_BATCH:
            assert got.xadd.raw == want.xadd.raw
            assert all(type(f) is bytes for e in got.xadd.entries for f in e[3])
    assert len(data) == E.RECORD_OVERHEAD + sum(request_size(r) for r in reqs)
    assert encode_record(now, back.requests) == data


def _sample():
    f = (b"sensor-id", b"1234", b"temperature", b"19.8")
    b = XAddBatch.build(b"k", [(0, 0, 0, f), (1, 7, 0, f[:2]), (2, 7, 9, (b"", b"x") * 3)],
                        no_mkstream=True, strategy=MINID, approx=True, threshold=(3, 4), limit=10)
    return encode_record(5, [Request.xadd_batch(2, 3, b)])


def test_every_truncation_and_bit_flip_is_rejected():
    data = _sample()
    for n in range(len(data)):
        with pytest.raises(CorruptEntry):
            decode_record(data[:n])
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptEntry):
                decode_record(bytes(bad))


def _forge(body: bytes) -> bytes:
    return body + struct.pack(">I", zlib.crc32(body))


def _record(payload: bytes, n=1, kind=5, cid=0, seq=0) -> bytes:
    return _forge(struct.pack(">2sBBQI", b"XE", 1, 0, 0, 1) + struct.pack(">QQBI", cid, seq, kind, n) + payload)


def _head(opts=0, a=0, b=0, limit=0, key=b"k", klen=None):
    return struct.pack(">BQQQI", opts, a, b, limit, len(key) if klen is None else klen) + key


def _xe(kind=0, ids=b"", npair=1, lens=(1, 1), data=b"fv"):
    return bytes([kind]) + ids + struct.pack(">I", npair) + struct.pack(">%dI" % len(lens), *lens) + data


GOOD = _head() + _xe()


@pytest.mark.parametrize("payload,n,why", [
    (_head(opts=0x80) + _xe(), 1, "option bits"),         # 0x20, 0x40: IDMP (test_xadd_batch_idmp.py)
    (_head(opts=0x40) + _xe(), 1, "IDMP_SEQ without IDMP"),
    (_head(opts=0x02 | 0x04) + _xe(), 1, "both MAXLEN and MINID"),
    (_head(opts=0x08) + _xe(), 1, "without a strategy"),
    (_head(opts=0x10) + _xe(), 1, "without a strategy"),
    (_head(a=1) + _xe(), 1, "without a strategy"),
    (_head(opts=0x02, b=1) + _xe(), 1, "second threshold"),
    (_head(opts=0x02, limit=1) + _xe(), 1, "limit without LIMIT"),
    (_head(klen=100) + _xe(), 1, "key of 100 bytes"),
    (GOOD, 0, "entry count 0"),
    (GOOD, 2, "entry count 2"),
    (GOOD + _xe(), 1, "trailing"),
    (_head() + _xe(kind=3), 1, "ID kind 3"),
    (_head() + _xe(kind=1, ids=b"\0" * 3, lens=(1,), data=b""), 1, "runs past"),
    (_head() + _xe(npair=0, lens=(1, 1), data=b"fv"), 1, "pair count 0"),
    (_head() + _xe(npair=2, lens=(1, 1), data=b"fv"), 1, "pair count 2"),
    (_head() + _xe(lens=(1, 2), data=b"fv"), 1, "run past the end"),
    (_head() + _xe(lens=(1, 0), data=b"fv"), 1, "trailing"),
    (_head() + _xe(), 1, None),                                       # the control: it decodes
], ids=lambda v: v if isinstance(v, str) else "")
def test_checks_behind_the_checksum(payload, n, why):
    data = _record(payload, n)
    if why is None:
        [req] = decode_record(data).requests
        assert req.xadd.entries == ((0, 0, 0, (b"f", b"v")),) and req.xadd.key == b"k"
        return
    with pytest.raises(CorruptEntry, match=why):
        decode_record(data)


def test_an_xadd_batch_request_is_nothing_else():
    with pytest.raises(CorruptEntry):                     # an argv body read as a batch
        decode_record(_record(struct.pack(">I", 1) + struct.pack(">I", 4) + b"PING"))
    with pytest.raises(CorruptEntry):                     # a batch body read as a command
        decode_record(_record(GOOD, kind=1))


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_mutated_payloads_are_refused_or_canonical(data):
    """Any bytes behind a valid checksum either fail to decode or are exactly what
    encoding the decoded record writes: no second spelling of a batch."""
    raw = bytearray(_sample()[:-4])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(16, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    forged = _forge(bytes(raw))
    try:
        rec = decode_record(forged)
    except CorruptEntry:
        return
    assert encode_record(rec.now_ms, rec.requests) == forged


def test_limits_and_malformed_batches(monkeypatch):
    f = (b"f", b"v")
    with pytest.raises(InvariantViolation):
        XAddBatch.build(b"k", [])
    for bad in [(0, 1, 0, f), (1, 5, 1, f), (2, -1, 0, f), (3, 0, 0, f), (0, 0, 0, ()), (0, 0, 0, (b"f",)),
                (0, 0, 0, ("f", "v")), (1, U64 + 1, 0, f)]:
        with pytest.raises(InvariantViolation):
            XAddBatch.build(b"k", [bad])
    for kw in [dict(approx=True), dict(limit=1), dict(threshold=3), dict(strategy="nope", threshold=1),
               dict(strategy=MAXLEN, threshold=-1), dict(strategy=MINID, threshold=(U64 + 1, 0)),
               dict(strategy=MAXLEN, threshold=1, limit=U64 + 1)]:
        with pytest.raises(InvariantViolation):
            XAddBatch.build(b"k", [(0, 0, 0, f)], **kw)
    with pytest.raises(InvariantViolation):               # only build makes a batch a request can carry
        encode_record(0, [Request.xadd_batch(0, 0, XAddBatch(b"k", False, None, False, 0, None, ((0, 0, 0, f),)))])
    with pytest.raises(InvariantViolation):
        encode_record(0, [Request(0, 0, Kind.COMMAND, ((b"PING",),), XAddBatch.build(b"k", [(0, 0, 0, f)]))])
    monkeypatch.setattr(E, "MAX_TXN_COMMANDS", 2)
    with pytest.raises(EntryTooLarge, match="3 entries"):
        resolve_xadd_batch(1, 1, XAddBatch.build(b"k", [(0, 0, 0, f)] * 3))
    monkeypatch.setattr(E, "MAX_RECORD_BYTES", 100)
    with pytest.raises(EntryTooLarge, match="larger than"):
        request_size(Request.xadd_batch(0, 0, XAddBatch.build(b"k", [(0, 0, 0, (b"x" * 80, b""))])))
    monkeypatch.setattr(E, "MAX_ARGC", 4)
    with pytest.raises(EntryTooLarge, match="pairs"):
        XAddBatch.build(b"k", [(0, 0, 0, f * 3)])
