"""engine/_listpack_c check_stream_node (compiled) == engine/stream _check_node_reference (pure):
the same live count for every node the reference accepts, "not valid" (-1) for every node it
refuses (the reference then raises its own error). Nodes come from the engine (XADD with the
master's fields and others, XDEL) and are then damaged at random, or are element lists that
only look like stream nodes (strings where ints belong, counts that run off the end, ...)."""
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.redis_oracle import engine_call
from xraft.node.engine import stream as S
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.listpack import lp_append_many, lp_new

from .conftest import load_compiled

C = load_compiled("xraft.node.engine._listpack_c")
MAX = S._LP_MAX_BYTES


def reference(key: bytes, lp: bytes):
    try:
        return S._check_node_reference(key, lp)
    except S.CorruptStream:
        return -1


def assert_same(lp: bytes, max_bytes: int = MAX) -> int:
    want = reference(b"k" * 16, lp) if len(lp) <= max_bytes else -1
    assert C.check_stream_node(lp, max_bytes) == want, lp.hex()
    return want


def engine_nodes(seed: int) -> list:
    rng = random.Random(seed)
    db = Keyspace()
    n = rng.randint(1, 250)
    for i in range(1, n + 1):
        if rng.random() < 0.6:
            fields = ["f", "v%d" % i, "g", str(rng.randint(-2**63, 2**63 - 1))]
        else:
            fields = [x for j in range(rng.randint(1, 4)) for x in ("h%d" % j, "w" * rng.randint(0, 300))]
        engine_call(db, "XADD", "s", "%d-%d" % (i * rng.randint(1, 3), rng.randint(0, 2**40)), *fields, now_ms=1)
    for i in rng.sample(range(1, n + 1), rng.randint(0, n)):
        engine_call(db, "XDEL", "s", "%d-0" % i)
    stream = db.get(b"s")
    return [bytes(lp) for _k, lp in stream.rax.items()] if stream is not None else []


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32))
def test_engine_nodes_and_their_damaged_copies_get_the_references_answer(seed):
    rng = random.Random(seed)
    for lp in engine_nodes(seed):
        assert assert_same(lp) >= 0
        assert_same(lp, max_bytes=len(lp) - 1)          # over the size limit
        for _ in range(20):
            bad = bytearray(lp)
            kind = rng.random()
            if kind < 0.6:
                for _ in range(rng.randint(1, 3)):
                    bad[rng.randrange(len(bad))] = rng.randrange(256)
            elif kind < 0.8:
                del bad[rng.randrange(6, len(bad)):]
                bad[0:4] = len(bad).to_bytes(4, "little")  # a consistent total, a cut-off body
            else:
                bad[4:6] = rng.randrange(65536).to_bytes(2, "little")
            assert_same(bytes(bad))


ELEMENT = st.one_of(st.integers(-3, 8), st.integers(-2**63, 2**63 - 1), st.sampled_from([b"", b"0", b"1", b"x" * 70]),
                    st.binary(max_size=8))


@settings(max_examples=1500, deadline=None)
@given(st.lists(ELEMENT, max_size=40))
def test_element_lists_that_look_like_nodes_get_the_references_answer(elements):
    lp = lp_new()
    lp_append_many(lp, elements)
    assert_same(bytes(lp))


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 3), st.integers(0, 3), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), max_size=6),
       st.integers(-2, 2))
def test_well_shaped_nodes_with_counts_off_by_a_little_get_the_references_answer(nmf, deleted, entries, skew):
    """Master entry, then entries of flags/ms-delta/seq-delta, fields and lp-count, built right
    and then with the counters or one lp-count skewed: the layout checks' edges."""
    live = sum(1 for f, _ in entries if not f & 1)
    dead = len(entries) - live
    els = [live + (skew if deleted == 0 else 0), dead + (skew if deleted == 1 else 0), nmf,
           *[b"f%d" % i for i in range(nmf)], 0]
    for n, (flags, extra) in enumerate(entries):
        ms, seq = (0, 0) if n == 0 else (n, extra)
        if flags & 2:
            els += [flags, ms, seq, *[b"v"] * nmf, 3 + nmf + (skew if deleted == 2 else 0)]
        else:
            nf = 1 + extra
            els += [flags, ms, seq, nf, *[b"x", b"y"] * nf, 4 + 2 * nf]
    lp = lp_new()
    lp_append_many(lp, els)
    assert_same(bytes(lp))


def test_not_exact_bytes_go_to_the_reference():
    lp = engine_nodes(7)[0]
    assert C.check_stream_node(bytearray(lp), MAX) == -1
    assert C.check_stream_node(memoryview(lp), MAX) == -1
