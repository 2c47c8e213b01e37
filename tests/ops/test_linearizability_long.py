"""The linearizability checker on long register histories (issue 11): its reductions and
segments decide what the plain search could not, and give the same answers where it can.

Random histories linearizable by construction are accepted, with and without info ops;
the same histories with a planted stale read, lost write or read of a never-written
value are rejected; on small random histories (most not linearizable) the answer equals
the plain search's (the checker before issue 11); and a soak-shaped history of thousands
of ops the plain search leaves undecided is decided.
"""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.ops import linearizability as lin
from xraft.ops.linearizability import INFINITY, Op

from .lin_histories import Step, plant, simulate, soak_steps

VIOLATIONS = ("stale-read", "lost-write", "never-written")


def plain(ops, max_steps=2_000_000):
    """The checker before issue 11: no reductions, one search over the whole key."""
    return lin.check_partition(ops, max_steps=max_steps, reduce=False, split=False).linearizable


def decide(ops):
    return lin.check_partition(ops).linearizable


@st.composite
def steps(draw, max_ops=60, info=True):
    n = draw(st.integers(1, max_ops))
    clients = draw(st.integers(1, 4))
    out = []
    for _ in range(n):
        is_info = info and draw(st.integers(0, 9)) == 0
        duration = draw(st.integers(1, 30))
        if is_info:
            effect = draw(st.one_of(st.none(), st.integers(0, 200)))
        else:
            effect = draw(st.integers(0, duration))
        out.append(Step(draw(st.integers(0, clients - 1)), draw(st.sampled_from(["put", "get"])),
                        draw(st.integers(0, 20)), duration, is_info, effect))
    return out


@settings(max_examples=200, deadline=None)
@given(steps())
def test_linearizable_histories_are_accepted(ss):
    assert decide(simulate(ss))


@settings(max_examples=100, deadline=None)
@given(steps(info=False))
def test_linearizable_histories_without_info_ops_are_accepted(ss):
    assert decide(simulate(ss))


@settings(max_examples=200, deadline=None)
@given(steps(), st.sampled_from(VIOLATIONS), st.floats(0, 1), st.booleans())
def test_planted_violations_are_rejected(ss, violation, where, info):
    ops = simulate(ss if info else [s for s in ss if not s.info])
    times = sorted({op.call for op in ops} | {op.ret for op in ops if op.ret != INFINITY})
    at = times[int(where * (len(times) - 1))] + 0.5 if times else 0.0
    bad = plant(ops, violation, at)
    verdict = lin.check_partition(bad)
    assert not verdict.linearizable
    assert verdict.unlinearizable_until is not None and verdict.unlinearizable_until >= at


@st.composite
def small_histories(draw, kinds, max_ops, write_value, outputs):
    """Anything: random windows, info writes and gets, reads of any of `outputs` (most of
    these histories are not linearizable); write_value(draw, i) is the i-th op's value."""
    n = draw(st.integers(1, max_ops))
    times = draw(st.permutations(list(range(2 * n))))
    ops = []
    for i in range(n):
        a, b = sorted(times[2 * i: 2 * i + 2])
        kind = draw(st.sampled_from(kinds))
        info = draw(st.integers(0, 3)) == 0
        op = Op(i % 3, kind, "k", call=a, ret=INFINITY if info else b, indeterminate=info)
        if kind == "get":
            op.output = None if info else draw(st.sampled_from(outputs))
        else:
            op.value = write_value(draw, i)
        ops.append(op)
    return ops


REGISTER_VALUES = ["a", "b", "c", "d", "e", "f", "g", "h"]
# unique values mostly (the workload's), a repeated one sometimes
registers = small_histories(["get", "put"], len(REGISTER_VALUES),
                            lambda draw, i: REGISTER_VALUES[i] if draw(st.integers(0, 4)) else "a",
                            [None] + REGISTER_VALUES)
# the simulator's mix, where only info gets and info writes no read contains are reduced
appends = small_histories(["get", "put", "append"], 7, lambda draw, i: draw(st.sampled_from(["a;", "b;", "c;"])),
                          [None, "a;", "b;", "a;b;", "b;a;", "c;", "a;c;"])


@settings(max_examples=600, deadline=None)
@given(registers)
def test_agrees_with_the_plain_search(ops):
    assert decide(ops) == plain(ops)


@settings(max_examples=400, deadline=None)
@given(appends)
def test_agrees_with_the_plain_search_with_appends(ops):
    assert decide(ops) == plain(ops)


def test_reductions_drop_unseen_info_writes_and_close_seen_ones():
    ops = [
        Op(0, "put", "k", "a", call=0, ret=1),
        Op(1, "put", "k", "lost", call=2, indeterminate=True),     # nobody read it: dropped
        Op(1, "put", "k", "seen", call=3, indeterminate=True),     # read at 7..8 and 9..10: closed at 8
        Op(0, "get", "k", call=4, indeterminate=True),             # saw nothing: dropped
        Op(2, "get", "k", output="seen", call=7, ret=8),
        Op(2, "get", "k", output="seen", call=9, ret=10),
        Op(0, "put", "k", "acked", call=11, ret=12),               # acked, never read: kept
    ]
    reduced = lin.reduce_kv(ops)
    assert [(op.value or op.output, op.ret, op.indeterminate) for op in reduced] == [
        ("a", 1, False), ("seen", 8, False), ("seen", 8, False), ("seen", 10, False), ("acked", 12, False)]
    assert ops[2].ret == INFINITY and ops[2].indeterminate       # the caller's ops are untouched


def test_a_read_before_its_write_is_rejected_not_closed_backwards():
    ops = [Op(0, "get", "k", output="x", call=0, ret=1), Op(1, "put", "k", "x", call=2, indeterminate=True)]
    assert lin.reduce_kv(ops)[1].ret == INFINITY
    assert not decide(ops) and not plain(ops)


def test_a_repeated_value_is_not_closed_at_a_read():
    # The first read of "x" saw the acked write of "x"; the second, after "z" was acked,
    # can only have seen the info write landing late. Closed at the first read's return,
    # the info write would have to precede "z": a false alarm.
    ops = [Op(0, "put", "k", "x", call=0, indeterminate=True), Op(1, "put", "k", "y", call=1, ret=2),
           Op(2, "put", "k", "x", call=3, ret=4.5), Op(1, "get", "k", output="x", call=3.5, ret=4),
           Op(1, "put", "k", "z", call=5, ret=6), Op(1, "get", "k", output="x", call=7, ret=8)]
    assert lin.reduce_kv(ops)[0].ret == INFINITY
    assert decide(ops) and plain(ops)
    closed = [Op(0, "put", "k", "x", call=0, ret=4)] + ops[1:]
    assert not plain(closed)


def test_segments_cut_where_nothing_is_open():
    ops = [Op(0, "put", "k", "a", call=0, ret=2), Op(1, "get", "k", output="a", call=1, ret=3),
           Op(0, "put", "k", "b", call=3, ret=4),      # called when the get returns: concurrent, no cut
           Op(0, "get", "k", output="b", call=5, ret=6)]
    assert [[op.call for op in part] for part in lin.segments(ops)] == [[0, 1, 3], [5]]


def test_a_prefix_with_no_linearization_says_where():
    ops = [Op(0, "put", "k", "a", call=0, ret=1), Op(0, "put", "k", "b", call=2, ret=3),
           Op(1, "get", "k", output="a", call=4, ret=5), Op(0, "put", "k", "c", call=6, ret=7)]
    verdict = lin.check_partition(ops)
    assert not verdict.linearizable and verdict.unlinearizable_until == 5 and verdict.segments == 4


def test_the_budget_still_bounds_the_search():
    ops = simulate(soak_steps(random.Random(1), ops=300, outages=2))
    with pytest.raises(lin.CheckBudgetExceeded):
        lin.check_partition(ops, max_steps=10)


@pytest.fixture(scope="module")
def soak_history():
    """3,000 ops of one key, 3 outages of 40 info ops each (59 info writes, a third of them
    landing and some of those seen): the shape of a nemesis soak's register key."""
    return simulate(soak_steps(random.Random(11)))


def test_a_soak_shaped_history_the_plain_search_leaves_undecided(soak_history):
    info_writes = [op for op in soak_history if op.kind == "put" and op.indeterminate]
    assert len(soak_history) == 3000 and len(info_writes) == 59
    with pytest.raises(lin.CheckBudgetExceeded):
        plain(soak_history)          # the default budget, 2,000,000 steps (about a second)
    verdict = lin.check_partition(soak_history)
    assert verdict.linearizable and verdict.searched < len(soak_history) and verdict.segments > 100


@pytest.mark.parametrize("violation", VIOLATIONS)
def test_a_soak_shaped_history_with_a_planted_violation_is_rejected(soak_history, violation):
    middle = soak_history[len(soak_history) // 2].call + 0.0005
    verdict = lin.check_partition(plant(soak_history, violation, middle))
    assert not verdict.linearizable and verdict.unlinearizable_until > middle
