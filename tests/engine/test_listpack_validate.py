"""lp_validate: every malformed buffer is rejected with CorruptListpack and
nothing else, and every buffer it accepts is safe to read in both directions."""
import re
import struct

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from xraft.node.engine.listpack import (
    LP_HDR_SIZE,
    CorruptListpack,
    lp_append_many,
    lp_decode_all,
    lp_first,
    lp_get_bytes,
    lp_get_with_next,
    lp_iter,
    lp_last,
    lp_length,
    lp_new,
    lp_next,
    lp_prev,
    lp_seek,
    lp_validate,
)


def build(elements) -> bytes:
    lp = lp_new()
    lp_append_many(lp, elements)
    return bytes(lp)


SAMPLE = [b"hello", 7, -3, 300, 40000, -(2 ** 40), b"x" * 70, b"y" * 5000, b"", 2 ** 63 - 1]


def with_header(entries: bytes, count: int, total_adjust: int = 0) -> bytes:
    return struct.pack("<IH", 7 + len(entries) + total_adjust, count) + entries + b"\xff"


def read_everything(buf):
    """All readers over a buffer lp_validate accepted; they must agree."""
    forward = lp_decode_all(buf)
    assert list(lp_iter(buf)) == forward
    assert list(lp_iter(buf, reverse=True)) == forward[::-1]
    offsets = []
    p = lp_first(buf)
    while p != -1:
        offsets.append(p)
        v, q = lp_get_with_next(buf, p)
        assert v == forward[len(offsets) - 1] and q == lp_next(buf, p)
        lp_get_bytes(buf, p)
        p = q
    back = []
    p = lp_last(buf)
    while p != -1:
        back.append(p)
        p = lp_prev(buf, p)
    assert offsets == back[::-1]
    assert lp_length(buf) == len(forward)
    for i in range(len(forward)):
        assert lp_seek(buf, i) == offsets[i] == lp_seek(buf, i - len(forward))


def test_sample_is_valid():
    buf = build(SAMPLE)
    lp_validate(buf)
    lp_validate(bytearray(buf))
    lp_validate(memoryview(buf))
    read_everything(buf)


def test_every_truncation_rejected():
    buf = build(SAMPLE)
    for n in range(len(buf)):
        with pytest.raises(CorruptListpack):
            lp_validate(buf[:n])
        # even with the header and terminator patched to look consistent
        if n >= LP_HDR_SIZE + 1:
            cut = bytearray(buf[:n])
            cut[-1] = 0xFF
            struct.pack_into("<I", cut, 0, n)
            if n != len(buf):
                with pytest.raises(CorruptListpack):
                    lp_validate(bytes(cut))


@pytest.mark.parametrize("bad", [
    b"",
    b"\x07\x00\x00\x00\x00\x00",                       # no terminator byte at all
    b"\x07\x00\x00\x00\x00\x00\xfe",                   # wrong terminator
    b"\x08\x00\x00\x00\x00\x00\xff",                   # header total too large
    b"\x07\x00\x00\x00\x01\x00\xff",                   # count 1, no entries
    with_header(b"\x05\x01", 2),                        # count too large
    with_header(b"\x05\x01\x06\x01", 1),                # count too small
    with_header(b"\x05\x02", 1),                        # backlen says 2, entry is 1
    with_header(b"\x83abc\x03", 1),                     # backlen off by one
    with_header(b"\x83abc\x84", 1),                     # continuation bit, wrong value
    with_header(b"\xf5\x00", 1),                        # invalid encoding byte
    with_header(b"\xfe\x00", 1),
    with_header(b"\xff\x01", 1),                        # terminator in the middle
    with_header(b"\xe0", 1),                            # 12-bit length cut short
    with_header(b"\xf0\x00\x10", 1),                    # 32-bit length cut short
    with_header(b"\xf0\xff\xff\xff\xff" + b"a" * 10, 1),  # 32-bit length past the end
    with_header(b"\xf4\x00\x00\x00\x00", 1),            # int64 data cut short
    with_header(b"\x85abc", 1),                         # string data cut short
    with_header(b"\x05\x01\x06", 2),                    # last backlen missing
    # backlen value right (66) but spelled with a redundant 0x80 byte
    with_header(b"\xe0\x40" + b"b" * 63 + b"\x00\xc2", 1, 0),
])
def test_known_corruptions_rejected(bad):
    with pytest.raises(CorruptListpack):
        lp_validate(bad)


def test_header_checks_only_when_shallow():
    bad_entry = with_header(b"\x05\x02", 1)
    lp_validate(bad_entry, deep=False)
    with pytest.raises(CorruptListpack):
        lp_validate(bad_entry[:-1], deep=False)


def test_limits_and_types():
    buf = build(SAMPLE)
    with pytest.raises(CorruptListpack):
        lp_validate(buf, max_bytes=len(buf) - 1)
    lp_validate(buf, max_bytes=len(buf))
    for bad in (None, 12, "text", [1, 2], memoryview(b"\x07\x00\x00\x00\x00\x00\xff").cast("B", (7,))):
        if isinstance(bad, memoryview):
            lp_validate(bad)   # a shaped byte view is still bytes
            continue
        with pytest.raises(CorruptListpack):
            lp_validate(bad)


def test_unknown_count_accepted_when_scanning_agrees():
    buf = bytearray(build([1, 2, 3]))
    buf[4:6] = b"\xff\xff"
    lp_validate(bytes(buf))
    assert lp_length(bytes(buf)) == 3


_elements = st.lists(st.one_of(
    st.integers(-(2 ** 63), 2 ** 63 - 1),
    st.integers(-200, 200),
    st.binary(max_size=20),
    st.sampled_from([62, 63, 64, 125, 126, 127, 300]).map(lambda n: b"s" * n),
), max_size=12)


# Patch the header total and terminator most of the time, so most mutations
# reach the entry-by-entry checks instead of failing on the header.
_mostly_true = st.sampled_from([True, True, True, False])


def _mutated(draw_buf, flips, cut, extra, fix_total, fix_eof):
    buf = bytearray(draw_buf)
    for pos, xor in flips:
        buf[pos % len(buf)] ^= xor
    if cut:
        del buf[-(cut % len(buf)):]
    buf += extra
    if fix_total and len(buf) >= 4:
        struct.pack_into("<I", buf, 0, len(buf))
    if fix_eof and buf:
        buf[-1] = 0xFF
    return bytes(buf)


@settings(max_examples=300, deadline=None)
@given(_elements,
       st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(1, 255)), max_size=3),
       st.integers(0, 6), st.binary(max_size=4), _mostly_true, _mostly_true)
def test_fuzzed_buffers_never_raise_anything_else(elements, flips, cut, extra, fix_total, fix_eof):
    buf = _mutated(build(elements), flips, cut, extra, fix_total, fix_eof)
    try:
        lp_validate(buf)
    except CorruptListpack as exc:
        event("rejected: " + re.sub(r"0x[0-9a-f]+|\d+", "N", str(exc)))
        return
    event("accepted")
    read_everything(buf)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=60), st.booleans())
def test_random_bodies_never_raise_anything_else(body, count_known):
    count = 65535 if not count_known else 3
    buf = with_header(body, count)
    try:
        lp_validate(buf)
    except CorruptListpack as exc:
        event("rejected: " + re.sub(r"0x[0-9a-f]+|\d+", "N", str(exc)))
        return
    event("accepted")
    read_everything(buf)
