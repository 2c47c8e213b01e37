"""The linearizability checker itself, tested before it judges the Raft simulator.

Hand-written histories with known answers, histories linearizable by construction,
and a brute-force oracle (every real-time-respecting permutation) on small histories.
"""
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.ops.linearizability import INFINITY, KV_MODEL, Op, check


def ok(ops):
    return check(ops)[0]


def test_sequential_read_sees_write():
    assert ok([Op(0, "put", "x", 1, call=0, ret=1), Op(1, "get", "x", output=1, call=2, ret=3)])
    assert not ok([Op(0, "put", "x", 1, call=0, ret=1), Op(1, "get", "x", output=2, call=2, ret=3)])
    assert not ok([Op(0, "put", "x", 1, call=0, ret=1), Op(1, "get", "x", output=None, call=2, ret=3)])


def test_concurrent_read_may_see_either():
    for out in (None, 1):
        assert ok([Op(0, "put", "x", 1, call=0, ret=10), Op(1, "get", "x", output=out, call=2, ret=3)])
    assert not ok([Op(0, "put", "x", 1, call=0, ret=10), Op(1, "get", "x", output=7, call=2, ret=3)])


def test_stale_read_after_newer_read_is_not_linearizable():
    # the classic split-brain symptom: a read returns the new value, a later read the old one
    ops = [
        Op(0, "put", "x", 1, call=0, ret=1),
        Op(0, "put", "x", 2, call=2, ret=10),
        Op(1, "get", "x", output=2, call=3, ret=4),
        Op(2, "get", "x", output=1, call=5, ret=6),
    ]
    assert not ok(ops)


def test_indeterminate_write_may_or_may_not_take_effect():
    base = [Op(0, "put", "x", 1, call=0, ret=1), Op(0, "put", "x", 2, call=2, indeterminate=True)]
    # it took effect before the first read
    assert ok(base + [Op(1, "get", "x", output=2, call=3, ret=4)])
    # it never took effect
    assert ok(base + [Op(1, "get", "x", output=1, call=3, ret=4)])
    # it took effect between the reads
    assert ok(base + [Op(1, "get", "x", output=1, call=3, ret=4), Op(1, "get", "x", output=2, call=5, ret=6)])
    # but it cannot be undone once seen
    assert not ok(base + [Op(1, "get", "x", output=2, call=3, ret=4), Op(1, "get", "x", output=1, call=5, ret=6)])


def test_appends_order_follows_real_time():
    a = Op(0, "append", "k", "a", call=0, ret=2)
    b = Op(1, "append", "k", "b", call=1, ret=3)
    for out in ("ab", "ba"):
        assert ok([a, b, Op(2, "get", "k", output=out, call=4, ret=5)])
    assert not ok([a, b, Op(2, "get", "k", output="a", call=4, ret=5)])
    # b strictly after a: only "ab"
    b2 = Op(1, "append", "k", "b", call=3, ret=4)
    assert not ok([a, b2, Op(2, "get", "k", output="ba", call=5, ret=6)])


def test_keys_are_independent():
    ops = [
        Op(0, "put", "x", 1, call=0, ret=1),
        Op(1, "put", "y", 2, call=2, ret=3),
        Op(2, "get", "x", output=1, call=4, ret=5),
        Op(2, "get", "y", output=None, call=6, ret=7),
    ]
    good, bad = check(ops)
    assert not good and all(op.key == "y" for op in bad)


def _brute_force(ops):
    """Every permutation that respects real time, replayed on the model."""
    n = len(ops)
    for perm in itertools.permutations(range(n)):
        pos = {op_i: k for k, op_i in enumerate(perm)}
        if any(ops[i].ret < ops[j].call and pos[i] > pos[j] for i in range(n) for j in range(n)):
            continue
        state, legal = KV_MODEL.init(), True
        for i in perm:
            legal, state = KV_MODEL.step(state, ops[i])
            if not legal:
                break
        if legal:
            return True
    return False


@st.composite
def small_histories(draw):
    n = draw(st.integers(1, 6))
    times = draw(st.permutations(list(range(2 * n))))
    ops = []
    for i in range(n):
        a, b = sorted(times[2 * i: 2 * i + 2])
        kind = draw(st.sampled_from(["get", "put", "append"]))
        indeterminate = kind != "get" and draw(st.booleans()) and draw(st.booleans())
        op = Op(i % 3, kind, "k", call=a, ret=INFINITY if indeterminate else b, indeterminate=indeterminate)
        if kind == "put":
            op.value = draw(st.sampled_from(["a", "b"]))
        elif kind == "append":
            op.value = draw(st.sampled_from(["a", "b"]))
        else:
            op.output = draw(st.sampled_from([None, "a", "b", "ab", "ba", "aa"]))
        ops.append(op)
    return ops


@settings(max_examples=300, deadline=None)
@given(small_histories())
def test_agrees_with_brute_force(ops):
    assert ok(ops) == _brute_force(ops)


@st.composite
def linearizable_by_construction(draw):
    """Execute ops at distinct linearization points, then widen each op's window around its point."""
    n = draw(st.integers(1, 40))
    state: dict = {}
    ops = []
    for point in range(n):
        key = draw(st.sampled_from("xyz"))
        kind = draw(st.sampled_from(["get", "put", "append"]))
        t = point * 10 + 5
        call = t - draw(st.integers(1, 30))
        ret = t + draw(st.integers(1, 30))
        op = Op(point % 4, kind, key, call=call + point / 1000, ret=ret + point / 1000 + 0.0001)
        if kind == "get":
            op.output = state.get(key)
        elif kind == "put":
            op.value = draw(st.sampled_from(["a", "b", "c"]))
            state[key] = op.value
        else:
            op.value = draw(st.sampled_from(["a", "b"]))
            state[key] = (state.get(key) or "") + op.value
        ops.append(op)
    return ops


@settings(max_examples=150, deadline=None)
@given(linearizable_by_construction())
def test_histories_linearizable_by_construction_pass(ops):
    assert ok(ops)
