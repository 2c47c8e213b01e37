"""The log record codec: round trips, every truncation and bit flip, limits, shapes."""
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.node.fsm import entry as E
from xraft.node.fsm.entry import (Kind, Record, Request, decode_record, encode_record, peek_now_ms,
                                  request_size)
from xraft.node.fsm.errors import CorruptEntry, EntryTooLarge
from xraft.node.invariant import InvariantViolation

from .test_xadd_batch import any_batches

ARG = st.binary(max_size=12)
ARGV = st.lists(ARG, min_size=1, max_size=5).map(tuple)
CLIENT = st.one_of(st.just((0, 0)), st.tuples(st.integers(1, 2**64 - 1), st.integers(1, 2**64 - 1)))


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(list(Kind)))
    if kind == Kind.NOOP:
        return Request.noop()
    if kind == Kind.REGISTER:
        return Request.register(draw(st.integers(1, 2**64 - 1)))
    cid, seq = draw(CLIENT)
    if kind == Kind.COMMAND:
        return Request.command(cid, seq, draw(ARGV))
    if kind == Kind.MULTI:
        return Request.multi(cid, seq, draw(st.lists(ARGV, max_size=4)))
    if kind == Kind.XADD_BATCH:
        return Request.xadd_batch(cid, seq, draw(any_batches()))
    rest = draw(st.lists(ARG, min_size=2, max_size=4))
    return Request.config(cid, seq, (draw(st.sampled_from([b"CONFIG", b"config"])), b"SeT", *rest))


RECORDS = st.tuples(st.integers(0, 2**63 - 1), st.lists(requests(), min_size=1, max_size=4))


@settings(max_examples=200, deadline=None)
@given(RECORDS)
def test_round_trip_and_sizes(rec):
    now, reqs = rec
    data = encode_record(now, reqs)
    assert decode_record(data) == Record(now, tuple(reqs))
    assert peek_now_ms(data) == now
    assert len(data) == E.RECORD_OVERHEAD + sum(request_size(r) for r in reqs)
    assert encode_record(now, reqs) == data                      # deterministic


def _sample_records():
    return [
        encode_record(0, [Request.noop()]),
        encode_record(1_700_000_000_000, [Request.command(7, 1, [b"XADD", b"s", b"*", b"f", b"v"])]),
        encode_record(5, [Request.multi(3, 9, [[b"SET", b"a", b""], [b"GET", b"a"]]),
                          Request.config(0, 0, [b"CONFIG", b"SET", b"list-compress-depth", b"1"]),
                          Request.multi(0, 0, [])]),
    ]


@pytest.mark.parametrize("data", _sample_records())
def test_every_truncation_and_bit_flip_is_rejected(data):
    for n in range(len(data)):
        with pytest.raises(CorruptEntry):
            decode_record(data[:n])
    with pytest.raises(CorruptEntry):
        decode_record(data + b"\0")
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptEntry):
                decode_record(bytes(bad))
            with pytest.raises(CorruptEntry):
                peek_now_ms(bytes(bad))


def _forge(body: bytes) -> bytes:
    """A record with a valid checksum around arbitrary bytes: tests the checks behind the CRC."""
    return body + struct.pack(">I", zlib.crc32(body))


def _head(now=0, nreq=1, magic=b"XE", version=1, flags=0):
    return struct.pack(">2sBBQI", magic, version, flags, now, nreq)


def _req(cid=0, seq=0, kind=1, ncmd=1):
    return struct.pack(">QQBI", cid, seq, kind, ncmd)


def _cmd(*args):
    return struct.pack(">I", len(args)) + b"".join(struct.pack(">I", len(a)) + a for a in args)


GOOD = _head() + _req() + _cmd(b"PING")


@pytest.mark.parametrize("body,why", [
    (_head(magic=b"XF") + _req() + _cmd(b"PING"), "magic"),
    (_head(version=2) + _req() + _cmd(b"PING"), "version"),
    (_head(flags=1) + _req() + _cmd(b"PING"), "flags"),
    (_head(now=2**63) + _req() + _cmd(b"PING"), "now_ms"),
    (_head(nreq=0), "request count"),
    (_head(nreq=2) + _req() + _cmd(b"PING"), "request count"),
    (_head(nreq=E.MAX_REQUESTS + 1) + (_req() + _cmd(b"P")) * 2, "request count"),
    (_head() + _req(kind=0) + _cmd(b"PING"), "kind"),
    (_head() + _req(kind=9) + _cmd(b"PING"), "kind"),
    (_head() + _req(kind=6) + _cmd(b"PING"), "REGISTER"),
    (_head() + _req(cid=0, seq=0, kind=6, ncmd=0), "REGISTER"),
    (_head() + _req(cid=5, seq=1, kind=6, ncmd=0), "REGISTER"),
    (_head() + _req(kind=7) + _cmd(b"PING"), "bad watch list"),
    (_head() + _req(kind=7) + _cmd(b"WATCH", b"k"), "bad watch list"),
    (_head() + _req(kind=7) + _cmd(b"WATCH", b"k", b"01"), "bad watched index"),
    (_head() + _req(kind=7) + _cmd(b"WATCH", b"k", b"9223372036854775808"), "bad watched index"),
    (_head() + _req(kind=7) + _cmd(b"WATCH", b"k", b"-1"), "bad watched index"),
    (_head() + _req(cid=1, seq=0) + _cmd(b"PING"), "seq"),
    (_head() + _req(cid=0, seq=1) + _cmd(b"PING"), "seq"),
    (_head() + _req(ncmd=2) + _cmd(b"PING") + _cmd(b"PING"), "COMMAND"),
    (_head() + _req(ncmd=0), "COMMAND"),
    (_head() + _req(kind=4, ncmd=1) + _cmd(b"PING"), "NOOP"),
    (_head() + _req(cid=1, seq=1, kind=4, ncmd=0), "NOOP"),
    (_head() + _req(kind=3) + _cmd(b"CONFIG", b"GET", b"x"), "CONFIG"),
    (_head() + _req(kind=3) + _cmd(b"CONFIG"), "CONFIG"),
    (_head() + _req(kind=2, ncmd=E.MAX_TXN_COMMANDS + 1) + _cmd(b"P"), "command count"),
    (_head() + _req() + struct.pack(">I", 0) + b"pad!", "argument count"),
    (_head() + _req() + struct.pack(">I", 3) + struct.pack(">I", 1) + b"P", "argument count"),
    (_head() + _req() + struct.pack(">II", 1, 100) + b"PING", "runs past"),
    (GOOD + b"x", "trailing"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_checks_behind_the_checksum(body, why):
    with pytest.raises(CorruptEntry, match=why):
        decode_record(_forge(body))


def test_forged_good_record_decodes():
    assert decode_record(_forge(GOOD)) == Record(0, (Request.command(0, 0, [b"PING"]),))


def test_not_bytes_and_oversize_rejected():
    with pytest.raises(CorruptEntry):
        decode_record("text")
    with pytest.raises(CorruptEntry):
        decode_record(b"")


def test_encode_limits(monkeypatch):
    with pytest.raises(EntryTooLarge):
        encode_record(0, [Request.command(1, 1, ())])
    monkeypatch.setattr(E, "MAX_ARG_BYTES", 8)
    with pytest.raises(EntryTooLarge, match="argument"):
        encode_record(0, [Request.command(1, 1, [b"SET", b"k", b"x" * 9])])
    monkeypatch.setattr(E, "MAX_ARGC", 3)
    with pytest.raises(EntryTooLarge, match="arguments"):
        request_size(Request.command(1, 1, [b"A", b"B", b"C", b"D"]))
    monkeypatch.setattr(E, "MAX_RECORD_BYTES", 100)
    one = Request.command(1, 1, [b"x" * 8, b"y" * 8])
    encode_record(0, [one])
    with pytest.raises(EntryTooLarge, match="entry"):
        encode_record(0, [one] * 3)                      # each fits, the batch does not
    monkeypatch.setattr(E, "MAX_TXN_COMMANDS", 2)
    with pytest.raises(EntryTooLarge, match="transaction"):
        encode_record(0, [Request.multi(1, 1, [[b"A"]] * 3)])
    monkeypatch.setattr(E, "MAX_REQUESTS", 1)
    with pytest.raises(EntryTooLarge, match="requests"):
        encode_record(0, [Request.noop(), Request.noop()])


def test_encode_refuses_malformed_requests():
    for bad in (Request(1, 0, Kind.COMMAND, ((b"PING",),)),
                Request(0, 0, Kind.NOOP, ((b"PING",),)),
                Request(0, 0, Kind.CONFIG, ((b"CONFIG", b"GET", b"x"),)),
                Request(0, 0, Kind.COMMAND, ((b"PING",), (b"PING",)))):
        with pytest.raises(InvariantViolation):
            encode_record(0, [bad])
    with pytest.raises(InvariantViolation):
        encode_record(-1, [Request.noop()])
    with pytest.raises(InvariantViolation):
        encode_record(0, [])
    with pytest.raises(InvariantViolation):
        encode_record(0, [Request.command(0, 0, ["text"])])
