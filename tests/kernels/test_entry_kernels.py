"""fsm/_entry_c (compiled) == fsm/entry (pure) on XADD batch decoding: the same XAddBatch,
or the same CorruptEntry text, on valid batches and on batches damaged every way the bytes
from disk or a peer can be (the record's CRC is not in the way: the kernel is called directly)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.node import accel
from xraft.node.fsm import entry as E
from xraft.node.fsm.entry import MAXLEN, MINID, XAddBatch

from .conftest import load_compiled

C = load_compiled("xraft.node.fsm._entry_c")
PURE = E.PURE_KERNELS["_decode_xadd_batch"]
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
    idmp = draw(st.booleans())
    entries = draw(st.lists(AUTO_ENTRY if idmp else ENTRY, min_size=1, max_size=4))
    kwargs = {}
    if idmp:
        kwargs = dict(idmp_pid=draw(st.binary(min_size=1, max_size=4)),
                      idmp_iids=draw(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=4)),
                                              min_size=len(entries), max_size=len(entries))))
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


def test_every_truncation_and_bit_flip_alike():
    batch = XAddBatch.build(b"k", [(0, 0, 0, (b"f", b"1")), (2, 7, 9, (b"", b"x") * 3)],
                            strategy=MINID, approx=True, threshold=(3, 4), limit=10)
    data, n = batch.raw, 2
    for end in range(len(data) + 1):
        assert outcome(C.decode_xadd_batch, data[:end], 0, end, n) == outcome(PURE, data[:end], 0, end, n)
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            bad = bytes(bad)
            assert outcome(C.decode_xadd_batch, bad, 0, len(bad), n) == outcome(PURE, bad, 0, len(bad), n)


def test_the_running_code_is_what_accel_says():
    assert E._decode_xadd_batch is (PURE if accel.PURE else C.decode_xadd_batch)
