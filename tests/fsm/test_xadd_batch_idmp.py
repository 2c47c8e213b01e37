"""XADD_BATCH with IDMP (entry.py opts 0x20, and 0x40: consecutive hex ids as first +
count): the same results and state, byte for byte, as `XADD key ... IDMP pid iid * f v`
(IDMPAUTO for an entry without an iid) in one MULTI; the record round trip; its refusal
of malformed IDMP parts; and the table surviving a state-machine snapshot (restart /
snapshot install)."""
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fsm.test_xadd_batch import _forge, _head, _run, _xe
from xraft.node.engine.dump import dump_keyspace
from xraft.node.fsm.entry import Record, Request, XAddBatch, decode_record, encode_record
from xraft.node.fsm.errors import CorruptEntry
from xraft.node.fsm.state_machine import StateMachine
from xraft.node.invariant import InvariantViolation

NOW = 1_700_000_000_000


def _batch(iids, pid=b"p", key=b"s", fields=None, **trim):
    entries = [(0, 0, 0, fields or (b"f", b"%d" % i)) for i in range(len(iids))]
    return XAddBatch.build(key, entries, idmp_pid=pid, idmp_iids=iids, **trim)


def _seq_batch(first, n, pid=b"p", key=b"s", fields=None, **trim):
    """The IDMP_SEQ form: ids hex(first), hex(first + 1), .. carried as one number."""
    entries = [(0, 0, 0, fields or (b"f", b"%d" % i)) for i in range(n)]
    return XAddBatch.build(key, entries, idmp_pid=pid, idmp_first=first, **trim)


def _argvs(b: XAddBatch) -> list:
    out = []
    for (_, _, _, fields), iid in zip(b.entries, b.idmp_iids):
        mode = [b"IDMPAUTO", b.idmp_pid] if iid is None else [b"IDMP", b.idmp_pid, iid]
        out.append([b"XADD", b.key] + mode + [b"*"] + list(fields))
    return out


def _results(sm, req):
    return [r.message if hasattr(r, "message") else r for r in _run(sm, NOW, req)[0]]


@pytest.mark.parametrize("steps", [
    [[b"a", b"b", b"a"], [b"a", None, b"c"]],
    [[None, None], [None]],
    [[b"x" * 300], [b"x" * 300, b"y"]],
])
def test_same_as_a_multi_of_idmp_xadds(steps):
    fast, slow = StateMachine(), StateMachine()
    for iids in steps:
        b = _batch(iids, fields=(b"f", b"same"))
        got = _results(fast, Request.xadd_batch(0, 0, b))
        want = _results(slow, Request.multi(0, 0, _argvs(b)))
        assert got == want
    assert dump_keyspace(fast.keyspace) == dump_keyspace(slow.keyspace)
    info = fast.keyspace.get(b"s").idmp
    assert info.iids_duplicates > 0 or steps[0] == [b"x" * 300]


def test_round_trip_and_raw():
    b = _batch([b"a", None, b"\x00\xff"], pid=b"producer-1", strategy="maxlen", approx=True, threshold=5)
    data = encode_record(7, [Request.xadd_batch(3, 4, b)])
    back = decode_record(data)
    assert back == Record(7, (Request.xadd_batch(3, 4, b),))
    got = back.requests[0].xadd
    assert (got.idmp_pid, got.idmp_iids, got.raw) == (b"producer-1", (b"a", None, b"\x00\xff"), b.raw)
    assert encode_record(7, back.requests) == data


def test_seq_form_round_trip_and_size():
    b = _seq_batch(0xfe, 3, pid=b"producer-1", strategy="maxlen", approx=True, threshold=5)
    assert (b.idmp_first, b.idmp_iids) == (0xfe, (b"fe", b"ff", b"100"))
    data = encode_record(7, [Request.xadd_batch(3, 4, b)])
    back = decode_record(data)
    assert back == Record(7, (Request.xadd_batch(3, 4, b),))
    got = back.requests[0].xadd
    assert (got.idmp_pid, got.idmp_iids, got.idmp_first, got.raw) == (b"producer-1", b.idmp_iids, 0xfe, b.raw)
    assert encode_record(7, back.requests) == data
    # One u64 instead of | ilen u32 | iid | per entry.
    per_entry = _batch([b"fe", b"ff", b"100"], pid=b"producer-1", strategy="maxlen", approx=True, threshold=5)
    assert len(per_entry.raw) - len(b.raw) == 3 * 4 + 2 + 2 + 3 - 8


def test_seq_form_at_the_u64_edge():
    top = 2**64 - 1
    assert _seq_batch(top - 1, 2).idmp_iids == (b"fffffffffffffffe", b"ffffffffffffffff")
    with pytest.raises(InvariantViolation):
        _seq_batch(top, 2)
    body = _head(opts=0x20 | 0x40) + _u32s(1) + b"p" + struct.pack(">Q", top) + _xe() + _xe()
    forged = _forge(struct.pack(">2sBBQI", b"XE", 1, 0, 0, 1) + struct.pack(">QQBI", 0, 0, 5, 2) + body)
    with pytest.raises(CorruptEntry, match="past 2"):
        decode_record(forged)


def test_every_truncation_is_rejected():
    data = encode_record(7, [Request.xadd_batch(0, 0, _batch([b"a", None]))])
    for n in range(len(data)):
        with pytest.raises(CorruptEntry):
            decode_record(data[:n])


def _record(payload: bytes) -> bytes:
    return _forge(struct.pack(">2sBBQI", b"XE", 1, 0, 0, 1) + struct.pack(">QQBI", 0, 0, 5, 1) + payload)


def _u32s(*values) -> bytes:
    return struct.pack(">%dI" % len(values), *values)


@pytest.mark.parametrize("payload, why", [
    (_head(opts=0x20) + _u32s(0) + _u32s(1) + b"i" + _xe(), "empty producer"),
    (_head(opts=0x20) + _u32s(9) + b"p", "producer past the end"),
    (_head(opts=0x20) + _u32s(1) + b"p" + _u32s(50) + b"i" + _xe(), "iid past the end"),
    (_head(opts=0x20) + _u32s(1) + b"p" + _u32s(1) + b"i" + _xe(kind=2, ids=struct.pack(">QQ", 1, 1)),
     "IDMP with an explicit ID"),
    (_head(opts=0x40) + _xe(), "IDMP_SEQ without IDMP"),
    (_head(opts=0x80) + _xe(), "unknown option bit"),
    (_head(opts=0x60) + _u32s(1) + b"p" + b"\0" * 7, "first id past the end"),
    (_head(opts=0x60) + _u32s(1) + b"p" + struct.pack(">Q", 1) + _xe(kind=1, ids=struct.pack(">Q", 1)),
     "IDMP_SEQ with an AUTO_SEQ ID"),
])
def test_malformed_idmp_parts_refused(payload, why):
    good = _record(_head(opts=0x20) + _u32s(1) + b"p" + _u32s(1) + b"i" + _xe())
    assert decode_record(good).requests[0].xadd.idmp_iids == (b"i",)
    with pytest.raises(CorruptEntry):
        decode_record(_record(payload))


def test_build_refuses_what_the_record_cannot_say():
    with pytest.raises(InvariantViolation):
        XAddBatch.build(b"s", [(2, 1, 1, (b"f", b"v"))], idmp_pid=b"p", idmp_iids=[b"i"])
    with pytest.raises(InvariantViolation):
        XAddBatch.build(b"s", [(0, 0, 0, (b"f", b"v"))], idmp_pid=b"", idmp_iids=[b"i"])
    with pytest.raises(InvariantViolation):
        XAddBatch.build(b"s", [(0, 0, 0, (b"f", b"v"))], idmp_pid=b"p", idmp_iids=[b""])
    with pytest.raises(InvariantViolation):
        XAddBatch.build(b"s", [(0, 0, 0, (b"f", b"v"))], idmp_iids=[b"i"])
    with pytest.raises(InvariantViolation):
        XAddBatch.build(b"s", [(2, 1, 1, (b"f", b"v"))], idmp_pid=b"p", idmp_first=1)
    with pytest.raises(InvariantViolation):
        XAddBatch.build(b"s", [(0, 0, 0, (b"f", b"v"))], idmp_first=1)
    with pytest.raises(InvariantViolation):
        XAddBatch.build(b"s", [(0, 0, 0, (b"f", b"v"))], idmp_pid=b"p", idmp_iids=[b"i"], idmp_first=1)


def test_table_survives_a_state_machine_snapshot():
    sm = StateMachine()
    first = _results(sm, Request.xadd_batch(0, 0, _batch([b"a", b"b"])))
    restored = StateMachine()
    restored.restore(sm.snapshot())
    again = _results(restored, Request.xadd_batch(0, 0, _batch([b"a", b"b"])))
    assert again == first
    assert restored.keyspace.get(b"s").length == 2


_IIDS = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", None, b"L" * 20, b"M" * 20])


@settings(max_examples=300, deadline=None)
@given(maxsize=st.integers(1, 6), duration_s=st.integers(1, 3),
       steps=st.lists(st.tuples(st.sampled_from([b"p", b"q"]), st.integers(0, 2500),
                                st.lists(_IIDS, min_size=1, max_size=12)), min_size=1, max_size=8))
def test_batches_with_evictions_same_as_multis(maxsize, duration_s, steps):
    """Batches larger than IDMP-MAXSIZE (the producer's oldest evicted within the
    batch, ids resent after their eviction in the same batch, expiry between
    batches): cmd_streams.xadd_many records the pairs inline and settles the
    table's counters once per batch; results, XINFO STREAM's counters and the
    snapshot bytes are those of the MULTIs of single XADDs."""
    fast, slow = StateMachine(), StateMachine()
    cfg = [b"XCFGSET", b"s", b"IDMP-MAXSIZE", b"%d" % maxsize, b"IDMP-DURATION", b"%d" % duration_s]
    now = NOW
    for sm in (fast, slow):
        _run(sm, now, Request.command(0, 0, [b"XADD", b"s", b"*", b"f", b"v"]))
        _run(sm, now, Request.command(0, 0, cfg))
    for pid, pause_ms, iids in steps:
        now += pause_ms
        b = _batch(iids, pid=pid, fields=(b"f", b"same"))
        got = [r.message if hasattr(r, "message") else r for r in _run(fast, now, Request.xadd_batch(0, 0, b))[0]]
        want = [r.message if hasattr(r, "message") else r for r in _run(slow, now, Request.multi(0, 0, _argvs(b)))[0]]
        assert got == want
    info = [b"XINFO", b"STREAM", b"s"]
    assert _run(fast, now, Request.command(0, 0, info)) == _run(slow, now, Request.command(0, 0, info))
    assert fast.snapshot() == slow.snapshot()



def _configured_pair(maxsize: int, duration_s: int) -> tuple:
    """Two state machines holding stream s (one entry) with these IDMP settings. (XCFGSET
    needs the key: on a missing one it answers "no such key" and sets nothing.)"""
    pair = StateMachine(), StateMachine()
    cfg = [b"XCFGSET", b"s", b"IDMP-MAXSIZE", b"%d" % maxsize, b"IDMP-DURATION", b"%d" % duration_s]
    for sm in pair:
        _run(sm, NOW, Request.command(0, 0, [b"XADD", b"s", b"*", b"f", b"v"]))
        assert _run(sm, NOW, Request.command(0, 0, cfg)) == ["OK"]
    return pair

@settings(max_examples=200, deadline=None)
@given(maxsize=st.integers(1, 6), duration_s=st.integers(1, 3),
       steps=st.lists(st.tuples(st.sampled_from([b"p", b"q"]), st.integers(0, 2500), st.booleans(),
                                st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=8))
def test_seq_form_same_as_multis(maxsize, duration_s, steps):
    """The IDMP_SEQ form (first + count; the SDK producer's) against the MULTIs of the
    single XADDs with those ids, the per-entry form mixed in: overlapping ranges resend
    ids (duplicates), batches above IDMP-MAXSIZE evict within the batch, and pauses
    expire pairs. Results, XINFO STREAM and the snapshot bytes must be the same."""
    fast, slow = _configured_pair(maxsize, duration_s)
    now = NOW
    for pid, pause_ms, seq_form, first, n in steps:
        now += pause_ms
        per_entry = _batch([b"%x" % v for v in range(first, first + n)], pid=pid, fields=(b"f", b"same"))
        b = _seq_batch(first, n, pid=pid, fields=(b"f", b"same")) if seq_form else per_entry
        # The record goes through encode and decode (the follower's path) before it applies.
        got = [r.message if hasattr(r, "message") else r for r in _run(fast, now, Request.xadd_batch(0, 0, b))[0]]
        want = [r.message if hasattr(r, "message") else r
                for r in _run(slow, now, Request.multi(0, 0, _argvs(per_entry)))[0]]
        assert got == want
    info = [b"XINFO", b"STREAM", b"s"]
    assert _run(fast, now, Request.command(0, 0, info)) == _run(slow, now, Request.command(0, 0, info))
    assert fast.snapshot() == slow.snapshot()


@settings(max_examples=300, deadline=None)
@given(maxsize=st.integers(1, 6), duration_s=st.integers(1, 3),
       steps=st.lists(st.tuples(st.sampled_from(["seq", "seq", "seq", "per-entry", "single", "auto", "restore"]),
                                st.sampled_from([b"p", b"q"]), st.integers(0, 2500), st.integers(0, 6),
                                st.integers(1, 9)), min_size=1, max_size=12))
def test_run_form_same_as_multis_step_by_step(maxsize, duration_s, steps):
    """The SDK's rising IDMP_SEQ batches keep a producer's pairs as runs (idmp.py _Runs);
    any other use turns them into the dict form. Seq batches whose ids mostly rise (each
    from the producer's next id, minus up to 6: resends), mixed with per-entry batches,
    single IDMP and IDMPAUTO XADDs of the same producers and restarts from a snapshot:
    after every step the results, XINFO STREAM and the snapshot bytes are those of the
    MULTIs of single XADDs."""
    fast, slow = _configured_pair(maxsize, duration_s)
    now = NOW
    next_id = {b"p": 0, b"q": 0x100}
    info = [b"XINFO", b"STREAM", b"s"]
    for kind, pid, pause_ms, back, n in steps:
        now += pause_ms
        if kind == "restore":
            restored = StateMachine()
            restored.restore(fast.snapshot())
            fast = restored
            continue
        first = max(0, next_id[pid] - back)
        next_id[pid] = max(next_id[pid], first + n)
        per_entry = _batch([b"%x" % v for v in range(first, first + n)], pid=pid, fields=(b"f", b"same"))
        if kind == "seq":
            req = Request.xadd_batch(0, 0, _seq_batch(first, n, pid=pid, fields=(b"f", b"same")))
        elif kind == "per-entry":
            req = Request.xadd_batch(0, 0, per_entry)
        elif kind == "single":
            per_entry = _batch([b"%x" % first], pid=pid, fields=(b"f", b"same"))
            req = Request.command(0, 0, _argvs(per_entry)[0])
        else:
            per_entry = _batch([None], pid=pid, fields=(b"f", b"%d" % (first % 3)))
            req = Request.command(0, 0, _argvs(per_entry)[0])
        got = _run(fast, now, req)[0]
        want = _run(slow, now, Request.multi(0, 0, _argvs(per_entry)))[0]
        if kind in ("single", "auto"):
            want = want[0]
        else:
            got = [r.message if hasattr(r, "message") else r for r in got]
            want = [r.message if hasattr(r, "message") else r for r in want]
        assert got == want
        assert _run(fast, now, Request.command(0, 0, info)) == _run(slow, now, Request.command(0, 0, info))
        assert fast.snapshot() == slow.snapshot()
