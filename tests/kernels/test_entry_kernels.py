"""fsm/_entry_c (compiled) == fsm/entry (pure) on XADD batches.

Decoding: the same XAddBatch, or the same CorruptEntry text, on valid batches and on batches
damaged every way the bytes from disk or a peer can be (the record's CRC is not in the way:
the kernel is called directly). Encoding (XAddBatch.build's entries): the same bytes and
entries, or the same error (invariant, EntryTooLarge), on good and on malformed entries."""
import enum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.node import accel
from xraft.node.fsm import entry as E
from xraft.node.fsm.entry import MAXLEN, MINID, IdKind, XAddBatch
from xraft.node.fsm.errors import EntryTooLarge

from .conftest import load_compiled

C = load_compiled("xraft.node.fsm._entry_c")
PURE = E.PURE_KERNELS["_decode_xadd_batch"]
PURE_ENCODE = E.PURE_KERNELS["_encode_xentries"]
U64 = 2**64 - 1

FIELD = st.one_of(st.binary(max_size=6), st.sampled_from([b"sensor-id", b"1234", b"temperature", b"19.8"]))
PAIRS = st.lists(st.tuples(FIELD, FIELD), min_size=1, max_size=4).map(lambda ps: tuple(x for p in ps for x in p))
ENTRY = st.one_of(st.tuples(st.just(0), st.just(0), st.just(0), PAIRS),
                  st.tuples(st.just(1), st.integers(0, U64), st.just(0), PAIRS),
                  st.tuples(st.just(2), st.integers(0, U64), st.integers(0, U64), PAIRS))
AUTO_ENTRY = st.tuples(st.just(0), st.just(0), st.just(0), PAIRS)


@st.composite
def batches(draw):
    strategy = draw(st.sampled_from([None, MAXLEN, MINID]))
    approx, limit, threshold = False, None, 0
    if strategy is not None:
        approx = draw(st.booleans())
        limit = draw(st.one_of(st.none(), st.integers(0, U64)))
        threshold = draw(st.integers(0, U64) if strategy == MAXLEN else st.tuples(st.integers(0, U64),
                                                                                   st.integers(0, U64)))
    idmp = draw(st.sampled_from([None, "iids", "seq"]))
    entries = draw(st.lists(AUTO_ENTRY if idmp else ENTRY, min_size=1, max_size=4))
    kwargs = {}
    if idmp == "iids":
        kwargs = dict(idmp_pid=draw(st.binary(min_size=1, max_size=4)),
                      idmp_iids=draw(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=4)),
                                              min_size=len(entries), max_size=len(entries))))
    elif idmp == "seq":     # the IDMP_SEQ form: first id + count, up to the u64 edge
        kwargs = dict(idmp_pid=draw(st.binary(min_size=1, max_size=4)),
                      idmp_first=draw(st.one_of(st.integers(0, 300), st.integers(U64 - 10, U64 - len(entries) + 1))))
    return XAddBatch.build(draw(st.binary(max_size=5)), entries, no_mkstream=draw(st.booleans()),
                           strategy=strategy, approx=approx, threshold=threshold, limit=limit, **kwargs)


def outcome(fn, data, pos, end, n):
    try:
        batch, after = fn(data, pos, end, n)
    except Exception as e:  # the exact type and text must match
        return (type(e), str(e))
    # XAddBatch's == leaves `raw` out; the kernels must agree on it too.
    return ("ok", batch, batch.raw, [tuple(map(type, e[3])) for e in batch.entries], after)


@st.composite
def damaged(draw):
    """(record-like bytes, pos, end, n): a batch behind some prefix, then damaged."""
    batch = draw(batches())
    prefix = draw(st.binary(max_size=3))
    suffix = draw(st.binary(max_size=3))
    data = bytearray(prefix + batch.raw + suffix)
    n = len(batch.entries)
    for _ in range(draw(st.integers(0, 3))):
        what = draw(st.sampled_from(["flip", "byte", "u32", "cut", "n"]))
        if what == "n":
            n = draw(st.one_of(st.integers(0, 6), st.sampled_from([65536, 65537, 2**32 - 1])))
        elif not data:
            continue
        elif what == "cut":
            del data[draw(st.integers(0, len(data) - 1)):]
        else:
            i = draw(st.integers(0, len(data) - 1))
            if what == "flip":
                data[i] ^= 1 << draw(st.integers(0, 7))
            elif what == "byte":
                data[i] = draw(st.sampled_from([0, 1, 2, 3, 0x20, 0x3F, 0x40, 0xFF]))
            else:  # a length or count word: small, huge, or just past what is left
                word = draw(st.sampled_from([0, 1, 2, 3, 7, 2**19, 2**20, 2**29, 2**29 + 1, 2**32 - 1]))
                data[i:i + 4] = word.to_bytes(4, "big")
    pos = min(len(prefix), len(data))
    end = draw(st.sampled_from([len(data), max(pos, len(data) - len(suffix))]))
    return bytes(data), pos, end, n


@settings(max_examples=500, deadline=None)
@given(batches(), st.binary(max_size=3))
def test_valid_batches_decode_alike(batch, prefix):
    data = prefix + batch.raw
    got = outcome(C.decode_xadd_batch, data, len(prefix), len(data), len(batch.entries))
    assert got == outcome(PURE, data, len(prefix), len(data), len(batch.entries))
    assert got[0] == "ok" and got[1] == batch and got[2] == batch.raw


@settings(max_examples=2500, deadline=None)
@given(damaged())
def test_damaged_batches_fail_alike(args):
    assert outcome(C.decode_xadd_batch, *args) == outcome(PURE, *args)


@pytest.mark.parametrize("batch", [
    XAddBatch.build(b"k", [(0, 0, 0, (b"f", b"1")), (2, 7, 9, (b"", b"x") * 3)],
                    strategy=MINID, approx=True, threshold=(3, 4), limit=10),
    XAddBatch.build(b"k", [(0, 0, 0, (b"f", b"1")), (0, 0, 0, (b"", b"x") * 3)], idmp_pid=b"p",
                    idmp_first=U64 - 1)], ids=["minid", "idmp-seq"])
def test_every_truncation_and_bit_flip_alike(batch):
    data, n = batch.raw, 2
    for end in range(len(data) + 1):
        assert outcome(C.decode_xadd_batch, data[:end], 0, end, n) == outcome(PURE, data[:end], 0, end, n)
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            bad = bytes(bad)
            assert outcome(C.decode_xadd_batch, bad, 0, len(bad), n) == outcome(PURE, bad, 0, len(bad), n)


def encoded(fn, entries, iids):
    try:
        body, items = fn(entries, iids)
    except Exception as e:  # the exact type and text must match
        return (type(e), str(e))
    return ("ok", body, items, [tuple(map(type, e[3])) for e in items], [type(e[0]) for e in items])


class Odd(enum.IntEnum):
    THREE = 3


# Entries as callers pass them, and every way one can be wrong: IDs out of range or of the
# wrong type, numbers on an AUTO ID, odd or no fields, fields that are not exact bytes.
NUMBER = st.one_of(st.integers(0, U64), st.sampled_from([0, 1, U64, U64 + 1, -1, 0.0, 1.5, None, True, False]))
ANY_KIND = st.one_of(st.integers(-1, 3), st.sampled_from(list(IdKind) + [Odd.THREE, True, 1.0, None, "0"]))
ANY_FIELD = st.one_of(FIELD, FIELD.map(bytearray), st.just("str"), st.just(7), st.just(None))
ANY_FIELDS = st.one_of(PAIRS, PAIRS.map(list), st.lists(ANY_FIELD, max_size=5).map(tuple),
                       st.lists(FIELD, max_size=5), st.just(b"ab"))
ODD_ENTRY = st.one_of(st.tuples(ANY_KIND, NUMBER, NUMBER, ANY_FIELDS),
                      st.tuples(ANY_KIND, NUMBER, NUMBER, ANY_FIELDS).map(list),
                      st.tuples(ANY_KIND, NUMBER, NUMBER))


@st.composite
def entry_lists(draw):
    good = draw(st.booleans())
    entries = draw(st.lists(ENTRY if good else st.one_of(ENTRY, ODD_ENTRY), min_size=0 if not good else 1,
                            max_size=4))
    if draw(st.booleans()):
        entries = tuple(entries)
    iids = None
    if draw(st.booleans()):
        n = len(entries) + draw(st.sampled_from([0, 0, 0, -1, 1]))
        iids = tuple(draw(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=4),
                                             st.sampled_from([b"", "x", bytearray(b"y")])),
                                   min_size=max(n, 0), max_size=max(n, 0))))
    return entries, iids


@settings(max_examples=2000, deadline=None)
@given(entry_lists())
def test_encode_xentries_matches(args):
    entries, iids = args
    assert encoded(C.encode_xentries, entries, iids) == encoded(PURE_ENCODE, entries, iids)


def test_encode_too_many_pairs_is_the_same_error():
    entries = [(0, 0, 0, (b"f", b"v")), (0, 0, 0, (b"",) * (2 * (E.MAX_ARGC // 2 + 1)))]
    with pytest.raises(EntryTooLarge) as want:
        PURE_ENCODE(entries, None)
    with pytest.raises(EntryTooLarge) as got:
        C.encode_xentries(entries, None)
    assert str(got.value) == str(want.value)


@settings(max_examples=300, deadline=None)
@given(batches())
def test_build_then_decode_round_trips_through_both(batch):
    """A batch built by either encoder decodes, by either decoder, to itself."""
    iids = None if batch.idmp_first is not None else batch.idmp_iids    # IDMP_SEQ: no iid per entry
    body_c, items_c = C.encode_xentries(batch.entries, iids)
    assert (body_c, items_c) == PURE_ENCODE(batch.entries, iids)
    assert batch.raw.endswith(body_c)
    for decode in (C.decode_xadd_batch, PURE):
        assert decode(batch.raw, 0, len(batch.raw), len(batch.entries)) == (batch, len(batch.raw))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(0, 2**20), st.integers(U64 - 40, U64 + 2), st.integers(-3, -1),
                 st.just(1.0), st.just(True)), st.integers(0, 40))
def test_hex_iids_match(first, n):
    """The IDMP_SEQ form's ids: the same tuple, or the same error past 2**64-1 or for a non-int."""
    def run(fn):
        try:
            return fn(first, n)
        except Exception as e:  # the exact type and text must match
            return (type(e), str(e))
    got = run(C.hex_iids)
    assert got == run(E.PURE_KERNELS["_hex_iids"])
    assert type(got) is tuple and all(type(x) is bytes for x in got) or type(got[0]) is type


def test_the_running_code_is_what_accel_says():
    assert E._decode_xadd_batch is (PURE if accel.PURE else C.decode_xadd_batch)
    assert E._encode_xentries is (PURE_ENCODE if accel.PURE else C.encode_xentries)
    assert E._hex_iids is (E.PURE_KERNELS["_hex_iids"] if accel.PURE else C.hex_iids)
