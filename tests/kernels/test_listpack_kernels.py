"""engine/_listpack_c (compiled) == engine/listpack (pure): same bytes, same errors."""
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from xraft.node import accel
from xraft.node.engine import listpack as L
from xraft.node.invariant import InvariantViolation

from .conftest import load_compiled

C = load_compiled("xraft.node.engine._listpack_c")
PURE_ENCODE = L.PURE_KERNELS["lp_encode"]
PURE_APPEND = L.PURE_KERNELS["lp_append_entries"]

I64 = 2**63
# Strings near every branch: integers as text (canonical or not, at the int64 edges), 6-bit,
# 12-bit and 32-bit string lengths; ints at every encoding's edges and beyond int64.
EDGE_INTS = [0, 1, 127, 128, -1, -4096, -4097, 4095, 4096, 32767, 32768, -32768, -32769, 2**23 - 1, 2**23,
             -2**23, -2**23 - 1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, I64 - 1, -I64, I64, -I64 - 1, 2**64]
INT_TEXT = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-2**70, 2**70)).map(lambda v: b"%d" % v)
ODD_TEXT = st.sampled_from([b"", b"0", b"-0", b"00", b"01", b"+1", b" 1", b"1 ", b"-", b"--1", b"1a",
                            b"99999999999999999999", b"18446744073709551616", b"-9223372036854775809",
                            b"\xd9\xa1", b"1" * 21])
STRINGS = st.one_of(INT_TEXT, ODD_TEXT, st.binary(max_size=70),
                    st.integers(60, 5000).map(lambda n: b"s" * n), st.text(max_size=10).map(str.encode))
ELEMENTS = st.one_of(STRINGS, st.sampled_from(EDGE_INTS), st.integers(-2**65, 2**65),
                     # not exact bytes/int: the compiled kernel hands these to the reference
                     STRINGS.map(bytearray), STRINGS.map(memoryview), st.booleans(), st.none(),
                     st.just(1.5))


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as e:  # the exact type and text must match
        return (type(e), str(e))


@settings(max_examples=3000, deadline=None)
@given(ELEMENTS)
@example(b"4096")
@example(b"9223372036854775807")
@example(-9223372036854775808)
def test_lp_encode_matches(ele):
    assert outcome(C.lp_encode, ele) == outcome(PURE_ENCODE, ele)


def _listpack(draw):
    """A valid listpack with some entries, sometimes with the count at 65535 ("unknown")."""
    lp = L.lp_new()
    L.lp_append_many(lp, draw(st.lists(st.one_of(STRINGS, st.integers(-I64, I64 - 1)), max_size=6)))
    if draw(st.booleans()):
        lp[4:6] = draw(st.sampled_from([b"\xfe\xff", b"\xff\xff"]))
    return lp


@st.composite
def appends(draw):
    lp = _listpack(draw)
    head_ints = draw(st.lists(st.integers(-5000, 5000), max_size=4))
    tail_ints = draw(st.lists(st.integers(0, 300), max_size=2))
    eles = draw(st.lists(ELEMENTS, max_size=8))
    if draw(st.booleans()):
        eles = tuple(eles)
    start = draw(st.integers(0, 3))
    step = draw(st.integers(1, 3))
    exact = len(head_ints) + len(eles[start::step]) + len(tail_ints)
    added = draw(st.one_of(st.just(exact), st.integers(0, 70000)))
    head = b"".join(map(PURE_ENCODE, head_ints))
    tail = b"".join(map(PURE_ENCODE, tail_ints))
    return lp, head, eles, start, step, tail, added, added == exact


@settings(max_examples=2000, deadline=None)
@given(appends())
def test_lp_append_entries_matches(args):
    lp, head, eles, start, step, tail, added, exact = args
    lp_c, lp_py = bytearray(lp), bytearray(lp)
    got = outcome(C.lp_append_entries, lp_c, head, eles, start, step, tail, added)
    want = outcome(PURE_APPEND, lp_py, head, eles, start, step, tail, added)
    assert got == want
    assert lp_c == lp_py            # the same buffer afterwards, also when it raised
    if want[0] == "ok" and exact and lp[4:6] != b"\xfe\xff":     # (0xFFFE: forged, to reach the saturation)
        L.lp_validate(bytes(lp_c), deep=True)


def test_append_errors_leave_the_buffer_unchanged():
    lp = L.lp_new()
    L.lp_append_many(lp, [b"a", 1])
    before = bytes(lp)
    with pytest.raises(InvariantViolation, match="listpack element must be bytes or int"):
        C.lp_append_entries(lp, b"", [b"x", None], 0, 1, b"", 2)
    with pytest.raises(InvariantViolation, match="outside int64"):
        C.lp_append_entries(lp, b"", [b"x", 2**64], 0, 1, b"", 2)
    assert bytes(lp) == before


def test_the_running_code_is_what_accel_says():
    """CI runs the suite compiled and a part of it with XRAFT_PURE=1: each run must really
    run the code it claims to, or one of the two runs tests nothing new."""
    if accel.PURE:
        assert L.lp_encode is PURE_ENCODE and L.lp_append_entries is PURE_APPEND
        assert accel.mode() == "pure"
    else:
        assert L.lp_encode is C.lp_encode and L.lp_append_entries is C.lp_append_entries
