"""Fast paths of the consumer-group commands against the general code they
stand for: groups.new_entry_ids (IDs of a `>` delivery, no fields) and
cmd_groups._parse_ack_ids (XACK's IDs)."""
from itertools import islice

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.engine import groups as g
from xraft.node.engine.cmd_groups import _parse_ack_ids
from xraft.node.engine.errors import EngineError
from xraft.node.engine.stream import Stream
from xraft.node.engine.streamid import MAX_ID, StreamID, parse_strict_ids

HYP = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 4), st.integers(0, 3)),       # (field count, same-fields shape)
    st.tuples(st.just("del"), st.integers(0, 60), st.just(0)),
), min_size=0, max_size=80)


@HYP
@given(ops, st.integers(1, 6), st.integers(0, 70), st.integers(0, 3), st.integers(0, 12))
def test_new_entry_ids_are_iter_ranges_ids(script, node_max, start_ms, start_seq, count):
    s = Stream()
    added = []
    ms = 0
    for op, a, b in script:
        if op == "add":
            ms += 1
            names = [b"f", b"g", b"h", b"i"][:a] if b else [b"x%d" % k for k in range(a)]
            fields = []
            for n in names:
                fields += [n, b"%d" % ms]
            s.append(StreamID(ms, 0), fields, 4096, node_max)
            added.append(StreamID(ms, 0))
        elif added:
            s.delete(added[a % len(added)])
    start = StreamID(start_ms, start_seq)
    want = [sid for sid, _ in islice(s.iter_range(start, MAX_ID), count or None)]
    got = g.new_entry_ids(s, start, count)
    assert [sid for sid, _ in got] == want
    assert all(type(sid) is StreamID and fv is None for sid, fv in got)


@pytest.mark.parametrize("args", [
    [b"1-1", b"2-0", b"18446744073709551615-18446744073709551615"],
    [b"5", b"1-2"], [b"1-2", b"0"], [],
])
def test_parse_ack_ids_matches_parse_strict_ids(args):
    got = _parse_ack_ids(args)
    assert got == parse_strict_ids(args)
    assert all(type(sid) is StreamID for sid in got)


@pytest.mark.parametrize("args", [
    [b"1-1", b"x"], [b"1-1", b"-"], [b"18446744073709551616-0"], [b"1-1", b"1-+"], [b"1-1", b"*"],
])
def test_parse_ack_ids_errors_as_parse_strict_ids(args):
    with pytest.raises(EngineError) as a:
        parse_strict_ids(args)
    with pytest.raises(EngineError) as b:
        _parse_ack_ids(args)
    assert str(a.value) == str(b.value)
