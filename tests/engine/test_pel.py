"""PelMap (pel.py) against a model (a dict plus a sorted list of keys), and the
group snapshot built on it: dump -> load round trips, and the dump depends only
on the logical state, not on the history that chunked the PELs."""
from bisect import bisect_left, bisect_right

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.redis_oracle import engine_call
from xraft.node.engine import groups as g
from xraft.node.engine import pel as pel_mod
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.pel import PelMap
from xraft.node.engine.stream_codec import dump_stream, load_stream
from xraft.node.engine.errors import INVALID_STREAM_ID, CommandError
from xraft.node.engine.streamid import UINT64_MAX, StreamID, parse_strict_id, parse_strict_ids, string2ull


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of at most 4 keys, so a few dozen keys split, empty and drop chunks."""
    monkeypatch.setattr(pel_mod, "_CHUNK_MAX", 4)
    monkeypatch.setattr(pel_mod, "_HALF", 2)


# A small ID space (collisions, neighbours) plus the extremes of the uint64 halves.
ids = st.builds(StreamID, st.sampled_from([0, 1, 2, 3, 7, UINT64_MAX - 1, UINT64_MAX]),
                st.integers(0, 12) | st.sampled_from([UINT64_MAX]))

ops = st.lists(st.one_of(
    st.tuples(st.just("insert"), ids, st.integers()),
    st.tuples(st.just("remove"), ids),
    st.tuples(st.just("extend"), st.lists(st.integers(1, 3), min_size=0, max_size=12)),
    st.tuples(st.just("items"), ids | st.none(), st.booleans()),
    st.tuples(st.just("ceiling"), ids),
), max_size=120)


class Model:
    def __init__(self):
        self.d = {}
        self.keys = []           # sorted

    def insert(self, k, v):
        new = k not in self.d
        if new:
            self.keys.insert(bisect_left(self.keys, k), k)
        self.d[k] = v
        return new

    def remove(self, k):
        if k not in self.d:
            return False, None
        self.keys.remove(k)
        return True, self.d.pop(k)

    def items(self, start, reverse):
        if reverse:
            keys = self.keys[:len(self.keys) if start is None else bisect_right(self.keys, start)][::-1]
        else:
            keys = self.keys[0 if start is None else bisect_left(self.keys, start):]
        return [(k, self.d[k]) for k in keys]


def _run(ops_list):
    pm, model = PelMap(), Model()
    for op in ops_list:
        kind = op[0]
        if kind == "insert":
            assert pm.insert(op[1], op[2]) == model.insert(op[1], op[2])
        elif kind == "remove":
            assert pm.remove(op[1]) == model.remove(op[1])
        elif kind == "extend":
            # Strictly ascending keys past the present ones (a `>` delivery).
            last = model.keys[-1] if model.keys else StreamID(4, 0)
            keys, ms, seq = [], last.ms, last.seq
            for step in op[1]:
                seq += step
                if seq > UINT64_MAX:
                    break
                keys.append(StreamID(ms, seq))
            values = [("x", k) for k in keys]
            pm.extend_sorted(keys, values)
            for k, v in zip(keys, values):
                model.insert(k, v)
        elif kind == "items":
            assert list(pm.items(op[1], op[2])) == model.items(op[1], op[2])
        else:
            got = pm.ceiling(op[1])
            want = model.items(op[1], False)
            assert got == (want[0] if want else None)
        pm.check()
        assert len(pm) == pm.numele == len(model.d)
        assert pm.first() == ((model.keys[0], model.d[model.keys[0]]) if model.keys else None)
        assert pm.last() == ((model.keys[-1], model.d[model.keys[-1]]) if model.keys else None)
        for k in model.keys[:3]:
            assert k in pm and pm.find(k) == model.d[k]
    assert list(pm) == model.keys
    assert list(pm.items()) == model.items(None, False)
    assert list(pm.items(reverse=True)) == model.items(None, True)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_pelmap_matches_model_small_chunks(ops_list):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pel_mod, "_CHUNK_MAX", 4)
        mp.setattr(pel_mod, "_HALF", 2)
        _run(ops_list)


@settings(max_examples=100, deadline=None)
@given(ops)
def test_pelmap_matches_model_default_chunks(ops_list):
    _run(ops_list)


def test_large_in_order_then_scattered(small_chunks):
    pm, model = PelMap(), Model()
    keys = [StreamID(ms, seq) for ms in range(1, 40) for seq in range(3)]
    pm.extend_sorted(keys[:50], list(range(50)))
    for i, k in enumerate(keys[:50]):
        model.insert(k, i)
    for i, k in enumerate(keys[50:], 50):
        assert pm.insert(k, i) and model.insert(k, i)
    pm.check()
    for k in keys[::3] + keys[1::7]:                 # scattered removals, some twice
        assert pm.remove(k) == model.remove(k)
        pm.check()
    for k in reversed(keys[::5]):                    # re-inserts into the middle
        assert pm.insert(k, "again") == model.insert(k, "again")
        pm.check()
    assert list(pm.items()) == model.items(None, False)
    for start in keys[::4]:
        assert list(pm.items(start)) == model.items(start, False)
        assert list(pm.items(start, reverse=True)) == model.items(start, True)


def test_extend_sorted_refuses_bad_input():
    pm = PelMap()
    pm.insert(StreamID(5, 0), 1)
    with pytest.raises(AssertionError):
        pm.extend_sorted([StreamID(4, 0)], [1])      # not past the present keys
    with pytest.raises(AssertionError):
        pm.extend_sorted([StreamID(7, 0), StreamID(6, 0)], [1, 2])    # not ascending
    pm.check()


def test_iteration_over_a_changing_map_raises():
    pm = PelMap()
    for i in range(5):
        pm.insert(StreamID(1, i), i)
    it = pm.items()
    next(it)
    pm.insert(StreamID(1, 9), 9)
    with pytest.raises(RuntimeError):
        next(it)
    it = pm.items(reverse=True)
    assert next(it) == (StreamID(1, 9), 9)
    pm.insert(StreamID(1, 4), "overwrite")           # same key set: still valid
    assert next(it) == (StreamID(1, 4), "overwrite")
    pm.remove(StreamID(1, 0))
    with pytest.raises(RuntimeError):
        next(it)


def test_check_catches_damage():
    pm = PelMap()
    for i in range(3):
        pm.insert(StreamID(1, i), i)
    pm._chunks[0].reverse()
    with pytest.raises(AssertionError):
        pm.check()


# -- snapshots of groups with large, reshuffled PELs ------------------------------

NOW = 1_700_000_000_000


def _build(cmds):
    db = Keyspace()
    for i, argv in enumerate(cmds):
        engine_call(db, *argv, now_ms=NOW + i)
    return db


def _state(stream):
    out = []
    for name, grp in stream.cgroups.items():
        pel = [(k, n.delivery_time, n.delivery_count, n.consumer.name) for k, n in grp.pel.items()]
        consumers = [(cn, c.seen_time, [k for k, _ in c.pel.items()]) for cn, c in grp.consumers.items()]
        out.append((name, grp.last_id, grp.entries_read, pel, consumers))
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["read", "ack", "claim", "autoclaim", "delconsumer"]),
                          st.sampled_from(["a", "b", "c"]), st.integers(0, 1199), st.integers(1, 300)),
                max_size=25))
def test_dump_round_trip_with_big_pels(actions):
    cmds = [["XADD", "s", "%d-%d" % (1 + i // 4, i % 4), "f", str(i)] for i in range(1200)]
    cmds.append(["XGROUP", "CREATE", "s", "g", "0"])
    for kind, who, at, n in actions:
        sid = "%d-%d" % (1 + at // 4, at % 4)
        if kind == "read":
            cmds.append(["XREADGROUP", "GROUP", "g", who, "COUNT", str(n), "STREAMS", "s", ">"])
        elif kind == "ack":
            cmds.append(["XACK", "s", "g"] + ["%d-%d" % (1 + j // 4, j % 4) for j in range(at, min(at + n, 1200), 3)])
        elif kind == "claim":
            cmds.append(["XCLAIM", "s", "g", who, "0"] + ["%d-%d" % (1 + j // 4, j % 4)
                                                         for j in range(at, min(at + n, 1200), 7)])
        elif kind == "autoclaim":
            cmds.append(["XAUTOCLAIM", "s", "g", who, "0", sid, "COUNT", str(n)])
        else:
            cmds.append(["XGROUP", "DELCONSUMER", "s", "g", who])
    stream = _build(cmds).get(b"s")
    g.check_groups(stream)
    blob = dump_stream(stream)
    loaded = load_stream(blob)
    assert _state(loaded) == _state(stream)
    assert dump_stream(loaded) == blob
    for _, grp in loaded.cgroups.items():
        for key, nack in grp.pel.items():
            assert nack.consumer.pel.find(key) is nack


def test_dump_is_a_function_of_the_logical_state():
    """Two histories reach the same groups: one delivers in one big read, the
    other in small reads with acks and re-deliveries; chunk layouts differ,
    the bytes do not."""
    entries = [["XADD", "s", "%d-0" % i, "f", "v"] for i in range(1, 2001)]
    one = _build(entries + [["XGROUP", "CREATE", "s", "g", "0"],
                            ["XREADGROUP", "GROUP", "g", "a", "STREAMS", "s", ">"],
                            ["XACK", "s", "g"] + ["%d-0" % i for i in range(1, 2001, 2)]])
    steps = [["XGROUP", "CREATE", "s", "g", "0"]]
    for lo in range(1, 2001, 100):
        steps.append(["XREADGROUP", "GROUP", "g", "a", "COUNT", "100", "STREAMS", "s", ">"])
        steps.append(["XACK", "s", "g"] + ["%d-0" % i for i in range(lo, lo + 100, 2)])
    other = _build(entries + steps)
    # Same delivery times, counts and seen-times on both sides.
    for db in (one, other):
        engine_call(db, "XCLAIM", "s", "g", "a", "0", *["%d-0" % i for i in range(2, 2001, 2)],
                    "TIME", str(NOW), "RETRYCOUNT", "1", now_ms=NOW + 10_000)
        engine_call(db, "XGROUP", "SETID", "s", "g", "2000-0", "ENTRIESREAD", "2000", now_ms=NOW + 10_000)
    a, b = one.get(b"s"), other.get(b"s")
    assert a.cgroups.find(b"g").pel._chunks != b.cgroups.find(b"g").pel._chunks    # the histories differ
    assert dump_stream(a) == dump_stream(b)


# -- the ID parsing fast path XACK uses ----------------------------------------------

_digits = st.text(alphabet="0123456789", min_size=1, max_size=24).map(str.encode)
_id_args = (st.tuples(_digits, _digits).map(lambda p: p[0] + b"-" + p[1])
            | st.binary(max_size=8)
            | st.lists(st.sampled_from([b"0", b"7", b"-", b"+", b" ", b"*", b"00", b"\xb2",
                                        b"18446744073709551615", b"18446744073709551616"]),
                       max_size=5).map(b"".join))


def _outcome(fn, *args):
    try:
        return "ok", tuple(fn(*args))
    except CommandError as e:
        return "err", str(e)


@settings(max_examples=500, deadline=None)
@given(st.lists(_id_args, min_size=1, max_size=6))
def test_strict_id_fast_path_agrees_with_string2ull(args):
    for arg in args:
        got = _outcome(parse_strict_id, arg)
        assert _outcome(lambda a: parse_strict_ids([a])[0], arg) == got
        ms_part, dash, seq_part = arg.partition(b"-")
        if dash and ms_part.isdigit() and seq_part.isdigit():
            # The slow path's own pieces are the reference for the canonical form.
            ms, seq = string2ull(ms_part), string2ull(seq_part)
            want = ("ok", (ms, seq)) if ms is not None and seq is not None and len(arg) <= 127 \
                else ("err", INVALID_STREAM_ID)
            assert got == want
    ok = all(_outcome(parse_strict_id, a)[0] == "ok" for a in args)
    if ok:
        assert parse_strict_ids(args) == [parse_strict_id(a) for a in args]
