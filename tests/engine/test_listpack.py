"""Listpack: exact bytes, round trips at every size-class boundary, navigation,
and edits against a Python-list model.

Expected bytes below are written by hand from the listpack layout in
redis 7.0 `src/listpack.c`, not produced by the code under test.
"""
import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.node.engine.listpack import (
    LP_HDR_SIZE,
    CorruptListpack,
    lp_append,
    lp_append_many,
    lp_bytes,
    lp_compare,
    lp_decode_all,
    lp_delete,
    lp_delete_range,
    lp_encode,
    lp_first,
    lp_get,
    lp_get_bytes,
    lp_get_int,
    lp_get_with_next,
    lp_insert,
    lp_iter,
    lp_last,
    lp_length,
    lp_new,
    lp_next,
    lp_prev,
    lp_replace,
    lp_replace_int,
    lp_safe_to_add,
    lp_seek,
    lp_validate,
)
from xraft.node.invariant import InvariantViolation

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_CANON_INT = re.compile(rb"0|-?[1-9][0-9]*")


def reference_value(ele):
    """What a listpack hands back for `ele`: redis stores a string as an
    integer iff it is a canonical decimal int64 of at most 20 bytes.
    (An implementation independent of the module under test.)"""
    if isinstance(ele, int):
        return ele
    if len(ele) <= 20 and _CANON_INT.fullmatch(ele):
        v = int(ele)
        if INT64_MIN <= v <= INT64_MAX:
            return v
    return ele


def as_text(v):
    return b"%d" % v if isinstance(v, int) else v


def build(elements):
    lp = lp_new()
    for e in elements:
        lp_append(lp, e)
    return lp


def header(lp):
    return struct.unpack_from("<IH", lp, 0)


# ---------------------------------------------------------------- exact bytes

def test_empty_listpack_bytes():
    lp = lp_new()
    assert isinstance(lp, bytearray)
    assert bytes(lp) == b"\x07\x00\x00\x00\x00\x00\xff"
    assert lp_bytes(lp) == 7 and lp_length(lp) == 0
    assert lp_first(lp) == -1 and lp_last(lp) == -1
    assert lp_seek(lp, 0) == -1 and lp_seek(lp, -1) == -1
    assert lp_decode_all(lp) == [] and list(lp_iter(lp)) == []
    lp_validate(lp)


@pytest.mark.parametrize("ele, entry", [
    # 7-bit uint: 0xxxxxxx, backlen 1
    (0, b"\x00\x01"),
    (127, b"\x7f\x01"),
    (b"127", b"\x7f\x01"),
    # 13-bit int: 110vvvvv vvvvvvvv (two's complement over 13 bits), backlen 2
    (128, b"\xc0\x80\x02"),
    (-1, b"\xdf\xff\x02"),
    (4095, b"\xcf\xff\x02"),
    (-4096, b"\xd0\x00\x02"),
    (b"-4096", b"\xd0\x00\x02"),
    # 16-bit int: F1 + i16 LE, backlen 3
    (4096, b"\xf1\x00\x10\x03"),
    (-4097, b"\xf1\xff\xef\x03"),
    (32767, b"\xf1\xff\x7f\x03"),
    (-32768, b"\xf1\x00\x80\x03"),
    # 24-bit int: F2 + i24 LE, backlen 4
    (32768, b"\xf2\x00\x80\x00\x04"),
    (-32769, b"\xf2\xff\x7f\xff\x04"),
    (2 ** 23 - 1, b"\xf2\xff\xff\x7f\x04"),
    (-(2 ** 23), b"\xf2\x00\x00\x80\x04"),
    # 32-bit int: F3 + i32 LE, backlen 5
    (2 ** 23, b"\xf3\x00\x00\x80\x00\x05"),
    (2 ** 31 - 1, b"\xf3\xff\xff\xff\x7f\x05"),
    (-(2 ** 31), b"\xf3\x00\x00\x00\x80\x05"),
    # 64-bit int: F4 + i64 LE, backlen 9
    (2 ** 31, b"\xf4\x00\x00\x00\x80\x00\x00\x00\x00\x09"),
    (INT64_MAX, b"\xf4\xff\xff\xff\xff\xff\xff\xff\x7f\x09"),
    (INT64_MIN, b"\xf4\x00\x00\x00\x00\x00\x00\x00\x80\x09"),
    (b"-9223372036854775808", b"\xf4\x00\x00\x00\x00\x00\x00\x00\x80\x09"),
    # 6-bit string: 10LLLLLL + data, backlen = 1 + L
    (b"", b"\x80\x01"),
    (b"abc", b"\x83abc\x04"),
    (b"01", b"\x8201\x03"),
    (b"+1", b"\x82+1\x03"),
    (b"-0", b"\x82-0\x03"),
    (b" 1", b"\x82 1\x03"),
    (b"1 ", b"\x821 \x03"),
    (b"1.0", b"\x831.0\x04"),
    (b"-", b"\x81-\x02"),
    (b"9223372036854775808", b"\x939223372036854775808\x14"),
    (b"a" * 63, b"\xbf" + b"a" * 63 + b"\x40"),
    # 12-bit string: 1110LLLL LLLLLLLL + data; 66 <= 127 so backlen 1 byte
    (b"b" * 64, b"\xe0\x40" + b"b" * 64 + b"\x42"),
    # 202 = 1*128 + 74: backlen 0x01, 0x80|74
    (b"c" * 200, b"\xe0\xc8" + b"c" * 200 + b"\x01\xca"),
    # 4097 = 32*128 + 1
    (b"d" * 4095, b"\xef\xff" + b"d" * 4095 + b"\x20\x81"),
    # 32-bit string: F0 + u32 LE + data; 4101 = 32*128 + 5
    (b"e" * 4096, b"\xf0\x00\x10\x00\x00" + b"e" * 4096 + b"\x20\x85"),
])
def test_entry_bytes_by_hand(ele, entry):
    assert lp_encode(ele) == entry
    lp = lp_new()
    lp_append(lp, ele)
    expected = struct.pack("<IH", 7 + len(entry), 1) + entry + b"\xff"
    assert bytes(lp) == expected
    assert lp_get(lp, LP_HDR_SIZE) == reference_value(ele)
    lp_validate(lp)


@pytest.mark.parametrize("n, tail", [
    # Back-length sizes follow redis' thresholds: 2 bytes only below 16383,
    # 3 bytes below 2097151 (strict '<', so 16383 and 2097151 take one more).
    (16377, b"\x7f\xfe"),            # entry 16382
    (16378, b"\x00\xff\xff"),        # entry 16383
    (16379, b"\x01\x80\x80"),        # entry 16384
    (2097145, b"\x7f\xff\xfe"),      # entry 2097150
    (2097146, b"\x00\xff\xff\xff"),  # entry 2097151
])
def test_backlen_size_thresholds(n, tail):
    s = b"z" * n
    entry = lp_encode(s)
    assert entry == b"\xf0" + n.to_bytes(4, "little") + s + tail
    lp = lp_new()
    lp_append(lp, b"x")
    lp_append(lp, s)
    lp_append(lp, 7)
    lp_validate(lp)
    assert lp_decode_all(lp) == [b"x", s, 7]
    assert list(lp_iter(lp, reverse=True)) == [7, s, b"x"]
    assert lp_prev(lp, lp_last(lp)) == LP_HDR_SIZE + 3


def test_whole_listpack_by_hand():
    lp = lp_new()
    lp_append_many(lp, [b"hello", 1, b"-5", b"x" * 70])
    entries = (b"\x85hello\x06" + b"\x01\x01" + b"\xdf\xfb\x02"
               + b"\xe0\x46" + b"x" * 70 + b"\x48")
    assert bytes(lp) == struct.pack("<IH", 7 + len(entries), 4) + entries + b"\xff"
    assert lp_decode_all(lp) == [b"hello", 1, -5, b"x" * 70]


# ---------------------------------------------------------------- round trips

INT_BOUNDARIES = [
    0, 1, 127, 128, -1, -4095, -4096, -4097, 4095, 4096, 32767, 32768, -32768,
    -32769, 2 ** 23 - 1, 2 ** 23, -(2 ** 23), -(2 ** 23) - 1, 2 ** 31 - 1,
    2 ** 31, -(2 ** 31), -(2 ** 31) - 1, INT64_MAX, INT64_MIN,
]
STR_LENGTHS = [0, 1, 63, 64, 125, 126, 4095, 4096, 70000]
# entry bytes (encoding + data + backlen) for each int size class
INT_ENTRY_SIZE = [(0, 127, 2), (-4096, 4095, 3), (-32768, 32767, 4),
                  (-(2 ** 23), 2 ** 23 - 1, 5), (-(2 ** 31), 2 ** 31 - 1, 6),
                  (INT64_MIN, INT64_MAX, 10)]


def expected_int_size(v):
    return next(size for lo, hi, size in INT_ENTRY_SIZE if lo <= v <= hi)


def expected_str_size(n):
    length = n + (1 if n < 64 else 2 if n < 4096 else 5)
    return length + (1 if length <= 127 else 2 if length < 16383 else 3)


def test_round_trip_every_boundary():
    elements = []
    for v in INT_BOUNDARIES:
        elements += [v, b"%d" % v]
    for n in STR_LENGTHS:
        elements.append(bytes((i * 7) % 251 for i in range(n)))
        elements.append(b"s" * n)
    lp = build(elements)
    lp_validate(lp)
    want = [reference_value(e) for e in elements]
    assert lp_length(lp) == len(elements)
    assert lp_decode_all(lp) == want
    assert lp_decode_all(bytes(lp)) == want
    assert list(lp_iter(lp)) == want
    assert list(lp_iter(lp, reverse=True)) == want[::-1]
    # every reader agrees, entry by entry
    p, i = lp_first(lp), 0
    while p != -1:
        v, q = lp_get_with_next(lp, p)
        assert v == want[i] == lp_get(lp, p)
        assert lp_get_bytes(lp, p) == as_text(want[i])
        assert lp_compare(lp, p, as_text(want[i]))
        assert not lp_compare(lp, p, as_text(want[i]) + b"0")
        if isinstance(want[i], int) and want[i] >= 0:
            assert not lp_compare(lp, p, b"+%d" % want[i])
        if isinstance(want[i], int):
            assert lp_get_int(lp, p) == want[i]
        assert q == lp_next(lp, p)
        assert lp_seek(lp, i) == p and lp_seek(lp, i - len(want)) == p
        p, i = q, i + 1
    assert i == len(want)


def test_entry_sizes_match_redis_size_classes():
    for v in INT_BOUNDARIES:
        assert len(lp_encode(v)) == expected_int_size(v), v
        assert len(lp_encode(b"%d" % v)) == expected_int_size(v), v
    for n in STR_LENGTHS + [16377, 16378]:
        assert len(lp_encode(b"q" * n)) == expected_str_size(n), n


def test_integer_looking_strings_follow_lpStringToInt64():
    as_int = [b"0", b"1", b"-1", b"1234", b"9223372036854775807", b"-9223372036854775808"]
    as_str = [b"", b"00", b"01", b"-0", b"+1", b" 1", b"1 ", b"1.0", b"1e3", b"0x10",
              b"-", b"--1", b"9223372036854775808", b"-9223372036854775809",
              b"1" * 20, b"1" * 21, b"\xd9\xa1", b"12\x00"]
    for s in as_int:
        assert lp_get(build([s]), LP_HDR_SIZE) == int(s), s
    for s in as_str:
        assert lp_get(build([s]), LP_HDR_SIZE) == s, s


def test_navigation_forward_backward_agree():
    elements = [b"a" * n for n in (0, 5, 100, 5000)] + INT_BOUNDARIES
    lp = build(elements)
    forward = []
    p = lp_first(lp)
    while p != -1:
        forward.append(p)
        p = lp_next(lp, p)
    backward = []
    p = lp_last(lp)
    while p != -1:
        backward.append(p)
        p = lp_prev(lp, p)
    assert forward == backward[::-1]
    assert len(forward) == len(elements)
    assert lp_prev(lp, len(lp) - 1) == forward[-1]
    assert lp_seek(lp, len(elements)) == -1 and lp_seek(lp, -len(elements) - 1) == -1
    assert list(lp_iter(lp, forward[3])) == [reference_value(e) for e in elements[3:]]
    assert list(lp_iter(lp, forward[3], reverse=True)) == [reference_value(e) for e in elements[3::-1]]


def test_count_becomes_unknown_at_65535_and_scans():
    lp = lp_new()
    lp_append_many(lp, [1] * 65534)
    assert header(lp)[1] == 65534
    lp_append(lp, b"x")
    assert header(lp)[1] == 65535 and lp_length(lp) == 65535
    lp_append(lp, 2)
    assert header(lp)[1] == 65535 and lp_length(lp) == 65536
    lp_validate(lp)
    # unknown count: seek scans, negative indexes walk from the tail
    assert lp_get(lp, lp_seek(lp, -1)) == 2 and lp_get(lp, lp_seek(lp, 65534)) == b"x"
    assert lp_seek(lp, 65536) == -1 and lp_seek(lp, -65537) == -1
    # deletes keep it unknown; lp_length writes the count back once it fits
    lp_delete(lp, lp_first(lp))
    lp_delete(lp, lp_first(lp))
    assert header(lp)[1] == 65535
    assert lp_length(lp) == 65534 and header(lp)[1] == 65534
    lp_validate(lp)
    lp2 = lp_new()
    lp_append_many(lp2, [0] * 70000)
    assert header(lp2)[1] == 65535 and lp_length(lp2) == 70000
    lp_delete_range(lp2, 0, 69990)
    assert header(lp2)[1] == 65535 and lp_length(lp2) == 10 and header(lp2)[1] == 10


# ---------------------------------------------------------------- editing

def test_insert_replace_delete_basics():
    lp = build([b"a", b"b"])
    p = lp_insert(lp, lp_first(lp), 10, after=True)
    assert lp_decode_all(lp) == [b"a", 10, b"b"] and lp_get(lp, p) == 10
    p = lp_insert(lp, lp_first(lp), b"z" * 5000, after=False)
    assert p == LP_HDR_SIZE and lp_decode_all(lp) == [b"z" * 5000, b"a", 10, b"b"]
    p = lp_insert(lp, len(lp) - 1, b"end", after=False)   # before the terminator
    assert lp_decode_all(lp)[-1] == b"end" and lp_next(lp, p) == -1
    lp_replace(lp, lp_seek(lp, 1), b"123456789")
    lp_replace_int(lp, lp_seek(lp, 0), -7)
    assert lp_decode_all(lp) == [-7, 123456789, 10, b"b", b"end"]
    nxt = lp_delete(lp, lp_seek(lp, 1))
    assert lp_get(lp, nxt) == 10
    assert lp_delete(lp, lp_last(lp)) == -1
    assert lp_decode_all(lp) == [-7, 10, b"b"]
    assert header(lp) == (len(lp), 3)
    lp_validate(lp)


def test_get_int_on_string_encoded_numbers():
    # redis never writes "123" as a string, but a reader must cope (lpGetInteger)
    entries = b"\x83123\x04" + b"\x83abc\x04"
    lp = bytearray(struct.pack("<IH", 7 + len(entries), 2) + entries + b"\xff")
    lp_validate(lp)
    assert lp_get(lp, 6) == b"123" and lp_get_int(lp, 6) == 123
    with pytest.raises(CorruptListpack):
        lp_get_int(lp, lp_next(lp, 6))


def test_invalid_elements_are_invariant_violations():
    for bad in (INT64_MAX + 1, INT64_MIN - 1, "text", 1.5, None, True):
        with pytest.raises(InvariantViolation):
            lp_append(lp_new(), bad)
    lp = build([1])
    with pytest.raises(InvariantViolation):
        lp_delete(lp, len(lp) - 1)        # the terminator is not an entry
    with pytest.raises(InvariantViolation):
        lp_replace(lp, 2, b"x")           # inside the header


def test_safe_to_add():
    lp = lp_new()
    assert lp_safe_to_add(lp, (1 << 30) - 7)
    assert not lp_safe_to_add(lp, (1 << 30) - 6)
    assert lp_safe_to_add(None, 1 << 30)


_small_text = st.binary(max_size=12)
_digits = st.integers(INT64_MIN, INT64_MAX).map(lambda v: b"%d" % v)
_lengths = st.sampled_from([0, 1, 62, 63, 64, 65, 125, 126, 127, 4094, 4095, 4096, 4097])
ELEMENTS = st.one_of(
    st.integers(-5000, 5000),
    st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from(INT_BOUNDARIES),
    _small_text,
    _digits,
    st.sampled_from([b"01", b"+1", b" 1", b"-0", b"1.0", b"9223372036854775808"]),
    _lengths.map(lambda n: b"L" * n),
)

OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), ELEMENTS),
    st.tuples(st.just("append_many"), st.lists(ELEMENTS, max_size=5)),
    st.tuples(st.just("insert"), st.integers(0, 40), ELEMENTS, st.booleans()),
    st.tuples(st.just("replace"), st.integers(-40, 40), ELEMENTS),
    st.tuples(st.just("delete"), st.integers(-40, 40)),
    st.tuples(st.just("delete_range"), st.integers(-45, 45), st.integers(0, 6)),
), max_size=30)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_edits_match_list_model(ops):
    lp, model = lp_new(), []
    for op in ops:
        kind = op[0]
        if kind == "append":
            lp_append(lp, op[1])
            model.append(reference_value(op[1]))
        elif kind == "append_many":
            lp_append_many(lp, op[1])
            model += [reference_value(e) for e in op[1]]
        elif kind == "insert":
            _, i, ele, after = op
            if model:
                i %= len(model)
                q = lp_insert(lp, lp_seek(lp, i), ele, after)
                at = i + 1 if after else i
            else:
                q = lp_insert(lp, len(lp) - 1, ele, False)
                at = 0
            model.insert(at, reference_value(ele))
            assert lp_get(lp, q) == model[at] and lp_seek(lp, at) == q
        elif kind == "replace":
            _, i, ele = op
            p = lp_seek(lp, i)
            if -len(model) <= i < len(model):
                lp_replace(lp, p, ele)
                model[i] = reference_value(ele)
            else:
                assert p == -1
        elif kind == "delete":
            _, i = op
            p = lp_seek(lp, i)
            if -len(model) <= i < len(model):
                q = lp_delete(lp, p)
                j = i % len(model)
                del model[j]
                assert q == (lp_seek(lp, j) if j < len(model) else -1)
            else:
                assert p == -1
        else:
            _, i, n = op
            lp_delete_range(lp, i, n)
            if -len(model) <= i < len(model):
                j = i % len(model)
                del model[j:j + n]
        lp_validate(lp)
        assert header(lp) == (len(lp), len(model))
        assert lp_decode_all(lp) == model
    assert list(lp_iter(lp, reverse=True)) == model[::-1]
    assert [lp_get_bytes(lp, lp_seek(lp, i)) for i in range(len(model))] == [as_text(v) for v in model]
