"""Tests for node/engine/rax.py.

Three kinds of evidence:
  * node counts derived by hand from rax.c's insert/remove algorithms for
    small trees (including keys that are prefixes of each other, which the
    redis differential test below cannot reach).  These counts, and 3000
    random variable-length-key insert/remove sequences, were also checked
    once against redis 7.0.15's rax.c compiled into a throwaway C driver;
    that oracle is not part of the suite (it needs the C sources);
  * a hypothesis state machine against a SortedDict model (contents, order,
    every seek operator, next/prev stepping, iterator invalidation), with
    Rax.check() verifying structure and both counters after every step;
  * differential runs against redis-server 7.0: with stream-node-max-entries
    1 every stream entry is its own rax key, and XINFO STREAM reports
    radix-tree-keys / radix-tree-nodes, which must equal numele / numnodes.
"""
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sortedcontainers import SortedDict

from xraft.node.engine.rax import Rax
from xraft.node.engine.streamid import StreamID


def build(*keys):
    r = Rax()
    for k in keys:
        assert r.insert(k, k)
    r.check()
    return r


# -- node counts derived by hand from rax.c ----------------------------------

def test_empty_tree_has_only_the_head():
    r = Rax()
    assert (r.numele, r.numnodes, len(r)) == (0, 1, 0)
    assert r.first() is None and r.last() is None
    assert list(r.items()) == [] and list(r.items(reverse=True)) == []
    r.check()


def test_empty_key_lives_in_the_head():
    r = Rax()
    assert r.insert(b"", "e")
    assert (r.numele, r.numnodes) == (1, 1)
    assert r.find(b"") == "e" and b"" in r
    assert r.insert(b"x", 1)          # head gains a branch byte: one new node
    assert (r.numele, r.numnodes) == (2, 2)
    assert r.remove(b"") == (True, "e")
    assert (r.numele, r.numnodes) == (1, 2)
    assert list(r.items()) == [(b"x", 1)]
    r.check()


def test_annibale_annientare_anni():
    # "annibale": the head becomes the run "annibale" plus the key leaf.
    r = build(b"annibale")
    assert r.numnodes == 2
    # ALGO 1 split at 'b'/'e': trimmed "anni", branch "be", postfix "ale",
    # then "ntare" below 'e' and its leaf: 6 nodes.
    r.insert(b"annientare")
    assert (r.numele, r.numnodes) == (2, 6)
    # "anni" ends exactly at the branch node: only a key flag is set.
    r.insert(b"anni")
    assert (r.numele, r.numnodes) == (3, 6)
    r.check()
    assert [k for k, _ in r.items()] == [b"anni", b"annibale", b"annientare"]


def test_algo2_key_ending_inside_a_run():
    r = build(b"annibale", b"ann")   # "ann" -> [K]"ibale" -> [K]
    assert (r.numele, r.numnodes) == (2, 3)
    r = build(b"annibale", b"annibal")  # run cut one byte from its end
    assert (r.numele, r.numnodes) == (2, 3)


def test_algo1_split_at_first_and_last_run_byte():
    # Split at j=0: the run node itself becomes the branch; postfix "bc".
    r = build(b"abc", b"x")
    assert r.numnodes == 4          # head branch "ax", "bc", leaf, leaf
    # Split at the last byte: no postfix node, the branch points at the leaf.
    r = build(b"abc", b"abx")       # "ab" -> branch "cx" -> leaf, leaf
    assert r.numnodes == 4
    r.check()


def test_docstring_example():
    r = build(b"a", b"ab", b"abcd", b"abxy", b"b")
    assert (r.numele, r.numnodes) == (5, 8)


def test_remove_key_above_a_run_does_not_recompress():
    # rax.c only recompresses when the node that lost its key has exactly one
    # child *byte*; a run below "FOO" has size 3, so nothing is merged.
    r = build(b"FOO", b"FOOBAR")
    assert r.numnodes == 3
    assert r.remove(b"FOO") == (True, b"FOO")
    assert (r.numele, r.numnodes) == (1, 3)
    r.check()


def test_remove_key_with_single_byte_child_recompresses():
    # "FOO" -> branch "B" [K FOO] -> leaf: removing FOO merges "FOO"+"B".
    r = build(b"FOO", b"FOOB")
    assert r.numnodes == 3
    r.remove(b"FOO")
    assert (r.numele, r.numnodes) == (1, 2)
    r.check()


def test_remove_leaf_leaving_single_child_branch_recompresses():
    # rax.c's own example: FOOBAR + FOOTER, remove FOOTER -> "FOOBAR" -> [].
    r = build(b"FOOBAR", b"FOOTER")
    assert r.numnodes == 6          # "FOO", branch "BT", "AR", "ER", 2 leaves
    r.remove(b"FOOTER")
    assert (r.numele, r.numnodes) == (1, 2)
    assert r.first() == (b"FOOBAR", b"FOOBAR")
    r.check()


def test_remove_leaf_stops_at_key_ancestor():
    r = build(b"ab", b"abcdef")
    assert r.numnodes == 3
    r.remove(b"abcdef")             # run "cdef" and its leaf go; "ab" leaf stays
    assert (r.numele, r.numnodes) == (1, 2)
    r.remove(b"ab")
    assert (r.numele, r.numnodes) == (0, 1)
    r.check()


def test_key_node_left_with_one_child_is_not_merged():
    # "" and "a" are keys; "abc" makes "a" a run "bc", "ad" splits that run at
    # its first byte (branch "bd", postfix branch "c").  Removing "ad" leaves
    # the key node "a" with one child: rax.c never merges a key node.
    r = build(b"", b"a", b"abc", b"ad")
    assert (r.numele, r.numnodes) == (4, 5)
    r.remove(b"ad")
    assert (r.numele, r.numnodes) == (3, 4)
    r.check()


def test_split_run_then_merge_back_on_removals():
    r = build(b"ab", b"abcd")
    assert r.numnodes == 3              # "ab" -> [K]"cd" -> [K]
    r.insert(b"abce")                   # split at 'd': [K]"c" -> branch "de"
    assert r.numnodes == 5
    r.remove(b"ab")                     # "ab" + "c" merge into one run
    assert (r.numele, r.numnodes) == (2, 4)
    r.remove(b"abce")                   # branch drops to "d": "abc"+"d" merge
    assert (r.numele, r.numnodes) == (1, 2)
    assert list(r.items()) == [(b"abcd", b"abcd")]
    r.check()


def test_remove_absent_keys_changes_nothing():
    r = build(b"annibale", b"annientare")
    for k in (b"", b"ann", b"anni", b"annib", b"annibalex", b"b"):
        assert r.remove(k) == (False, None)
    assert (r.numele, r.numnodes) == (2, 6)


# -- basic API ---------------------------------------------------------------

def test_none_value_is_distinct_from_absent():
    r = Rax()
    assert r.insert(b"k", None)
    assert b"k" in r and b"j" not in r
    assert r.find(b"k", 7) is None and r.find(b"j", 7) == 7
    assert r.remove(b"k") == (True, None)
    assert b"k" not in r


def test_insert_overwrites_try_insert_does_not():
    r = Rax()
    assert r.try_insert(b"k", 1)
    assert not r.try_insert(b"k", 2) and r.find(b"k") == 1
    assert not r.insert(b"k", 3) and r.find(b"k") == 3
    assert (r.numele, r.numnodes) == (1, 2)


def test_items_with_inclusive_start():
    r = build(b"a", b"ab", b"abcd", b"abxy", b"b")
    keys = lambda **kw: [k for k, _ in r.items(**kw)]
    assert keys(start=b"ab") == [b"ab", b"abcd", b"abxy", b"b"]
    assert keys(start=b"abc") == [b"abcd", b"abxy", b"b"]
    assert keys(start=b"abc", reverse=True) == [b"ab", b"a"]
    assert keys(start=b"abxy", reverse=True) == [b"abxy", b"abcd", b"ab", b"a"]
    assert keys(start=b"c") == [] and keys(start=b"", reverse=True) == []
    assert list(r) == keys()


# -- iterator semantics ------------------------------------------------------

def test_first_step_after_seek_yields_the_sought_element_both_ways():
    r = build(b"a", b"b", b"c")
    it = r.iterator()
    assert it.seek(">=", b"b")
    assert it.prev() and it.key == b"b"      # the sought element itself
    assert it.prev() and it.key == b"a"
    assert not it.prev()
    assert not it.next()                     # EOF is sticky until re-seek
    assert it.seek("==", b"c") and it.next() and it.key == b"c" and not it.next()


def test_unseeked_and_failed_seek_iterators_are_at_eof():
    r = build(b"a")
    it = r.iterator()
    assert not it.next() and not it.prev()
    assert not it.seek(">", b"a") and not it.next()
    assert not it.seek("==", b"b")
    with pytest.raises(ValueError):
        it.seek("~", b"a")


def test_iterator_is_invalid_after_modification_until_reseeked():
    r = build(b"a", b"b", b"c", b"d")
    it = r.iterator()
    assert it.seek("^") and it.next() and it.key == b"a"
    r.insert(b"a", "new value")              # overwrite: no node changes
    assert it.next() and it.key == b"b"
    r.remove(b"b")                           # structural change
    with pytest.raises(RuntimeError):
        it.next()
    assert it.seek(">=", b"b") and it.next() and it.key == b"c"   # t_stream.c pattern
    r.insert(b"bb", 0)
    with pytest.raises(RuntimeError):
        it.prev()
    gen = r.items()
    next(gen)
    r.remove(b"a")
    with pytest.raises(RuntimeError):
        next(gen)


# -- model-based state machine ---------------------------------------------------

# A tiny alphabet makes prefixes, shared runs and splits at every position common.
keys_st = st.binary(max_size=5).map(lambda b: bytes(x % 3 + 0x61 for x in b)) | st.sampled_from(
    [b"", b"a", b"ab", b"abc", b"abcabc", b"b", b"\x00", b"\xff", b"\xff\xff"])
values_st = st.none() | st.integers(0, 3)
SEEK_OPS = ["^", "$", "==", ">=", ">", "<=", "<"]


def expected_seek(model, op, key):
    """Index in the SortedDict `model` that seek(op, key) must land on, or None."""
    keys = model.keys()
    n = len(keys)
    if op == "^":
        i = 0
    elif op == "$":
        i = n - 1
    elif op == "==":
        i = model.bisect_left(key)
        return i if i < n and keys[i] == key else None
    elif op == ">=":
        i = model.bisect_left(key)
    elif op == ">":
        i = model.bisect_right(key)
    elif op == "<=":
        i = model.bisect_right(key) - 1
    else:
        i = model.bisect_left(key) - 1
    return i if 0 <= i < n else None


class RaxMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.rax = Rax()
        self.model = SortedDict()
        self.it = self.rax.iterator()
        self.it_state = "eof"    # eof | seeked | ready | stale
        self.it_key = None       # model key of the iterator position
        self.it_data = None      # data captured when the position was taken

    def _changed(self):
        if self.it_state != "eof":
            self.it_state = "stale"

    @rule(key=keys_st, value=values_st)
    def insert(self, key, value):
        new = key not in self.model
        assert self.rax.insert(key, value) == new
        self.model[key] = value
        if new:
            self._changed()

    @rule(key=keys_st, value=values_st)
    def try_insert(self, key, value):
        new = key not in self.model
        assert self.rax.try_insert(key, value) == new
        if new:
            self.model[key] = value
            self._changed()

    @rule(key=keys_st)
    def remove(self, key):
        if key in self.model:
            assert self.rax.remove(key) == (True, self.model.pop(key))
            self._changed()
        else:
            assert self.rax.remove(key) == (False, None)

    @rule(key=keys_st)
    def find(self, key):
        assert self.rax.find(key, "absent") == self.model.get(key, "absent")
        assert (key in self.rax) == (key in self.model)

    @rule(op=st.sampled_from(SEEK_OPS), key=keys_st)
    def seek(self, op, key):
        i = expected_seek(self.model, op, key)
        assert self.it.seek(op, key) == (i is not None)
        if i is None:
            self.it_state = "eof"
        else:
            self.it_state = "seeked"
            self.it_key = self.model.keys()[i]
            self.it_data = self.model[self.it_key]

    @rule(forward=st.booleans())
    def step(self, forward):
        step = self.it.next if forward else self.it.prev
        if self.it_state == "stale":
            with pytest.raises(RuntimeError):
                step()
            return
        if self.it_state == "eof":
            assert not step()
            return
        if self.it_state == "seeked":
            self.it_state = "ready"
        else:
            keys = self.model.keys()
            i = keys.index(self.it_key) + (1 if forward else -1)
            if not 0 <= i < len(keys):
                assert not step()
                self.it_state = "eof"
                return
            self.it_key = keys[i]
            self.it_data = self.model[self.it_key]
        assert step()
        assert (self.it.key, self.it.data) == (self.it_key, self.it_data)

    @rule(start=st.none() | keys_st, reverse=st.booleans())
    def items(self, start, reverse):
        got = list(self.rax.items(start, reverse))
        keys = self.model.keys()
        if reverse:
            hi = len(keys) if start is None else self.model.bisect_right(start)
            want = [(k, self.model[k]) for k in reversed(keys[:hi])]
        else:
            lo = 0 if start is None else self.model.bisect_left(start)
            want = [(k, self.model[k]) for k in keys[lo:]]
        assert got == want

    @precondition(lambda self: hasattr(self, "rax"))
    @invariant()
    def structure_and_ends(self):
        self.rax.check()
        assert len(self.rax) == len(self.model)
        if self.model:
            assert self.rax.first() == self.model.peekitem(0)
            assert self.rax.last() == self.model.peekitem(-1)
        else:
            assert self.rax.first() is None and self.rax.last() is None


RaxMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestRaxModel = RaxMachine.TestCase


# -- differential against redis-server 7.0 ---------------------------------------

def _tree_counts(redis):
    reply = redis.call("XINFO", "STREAM", "s")
    info = dict(zip(reply[::2], reply[1::2]))
    return info[b"radix-tree-keys"], info[b"radix-tree-nodes"]


class _StreamMirror:
    """A redis stream with one entry per listpack node next to a Rax with the
    same keys, inserted and removed in the same order."""

    def __init__(self, redis):
        self.redis = redis
        self.rax = Rax()
        self.live = []

    def add(self, ms, seq):
        assert self.redis.call("XADD", "s", b"%d-%d" % (ms, seq), "f", "v") == b"%d-%d" % (ms, seq)
        assert self.rax.insert(StreamID(ms, seq).encode(), (ms, seq))
        self.live.append((ms, seq))

    def delete(self, index):
        ms, seq = self.live.pop(index % len(self.live))
        assert self.redis.call("XDEL", "s", b"%d-%d" % (ms, seq)) == 1
        assert self.rax.remove(StreamID(ms, seq).encode()) == (True, (ms, seq))

    def compare(self):
        assert _tree_counts(self.redis) == (self.rax.numele, self.rax.numnodes)


@pytest.fixture
def one_entry_per_node(redis_oracle):
    redis_oracle.flush()
    redis_oracle.call("CONFIG", "SET", "stream-node-max-entries", "1")
    try:
        yield redis_oracle
    finally:
        redis_oracle.call("CONFIG", "SET", "stream-node-max-entries", "100")
        redis_oracle.flush()


# An "add" advances the last ID by a step of one of these shapes, so runs of
# IDs share long prefixes (same ms, small seq steps) or diverge early.
_STEP_KINDS = ["seq", "ms_near", "ms_far", "anywhere"]
ops_st = st.lists(
    st.tuples(st.sampled_from(["add", "add", "del"]), st.sampled_from(_STEP_KINDS), st.integers(0, 1 << 62)),
    min_size=1, max_size=60)


def _next_id(last, kind, r):
    ms, seq = last
    if kind == "seq":
        return ms, seq + 1 + r % 3
    if kind == "ms_near":
        return ms + 1 + r % 300, r % 4
    if kind == "ms_far":
        return ms + 1 + r % (1 << 24), 0
    return ms + 1 + r % (1 << 44), r >> (r % 64)


@pytest.mark.redis
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start_ms=st.sampled_from([0, 1, 1_700_000_000_000, (1 << 63) - 1]), ops=ops_st)
def test_node_counts_match_redis_for_random_xadd_xdel(one_entry_per_node, start_ms, ops):
    redis = one_entry_per_node
    redis.call("DEL", "s")
    m = _StreamMirror(redis)
    last = (start_ms, 0)
    for op, kind, r in ops:
        if op == "del" and m.live:
            m.delete(r)
        else:
            last = _next_id(last, kind, r)
            m.add(*last)
        m.compare()
    m.rax.check()


@pytest.mark.redis
def test_node_counts_match_redis_for_a_realistic_stream(one_entry_per_node):
    # Millisecond timestamps with bursts of several entries per ms, then half
    # of the entries deleted in random order, checking as we go.
    redis = one_entry_per_node
    rnd = random.Random(7)
    m = _StreamMirror(redis)
    ms = 1_700_000_000_000
    for _ in range(1500):
        ms += rnd.choice([0, 1, 1, 2, 17, 300])
        m.add(ms, 0) if not m.live or m.live[-1][0] != ms else m.add(ms, m.live[-1][1] + 1)
    m.compare()
    for n in range(750):
        m.delete(rnd.randrange(len(m.live)))
        if n % 50 == 0:
            m.compare()
    m.compare()
    m.rax.check()
    keys = [k for k, _ in m.rax.items()]
    assert keys == sorted(StreamID(*i).encode() for i in m.live)
