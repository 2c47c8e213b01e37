"""RespParser: every branch, chunking invariance and limits (speed: bench/resp.py)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.server.resp import (
    ERR_INVALID_BULK, ERR_INVALID_MBULK, ERR_TOO_BIG_BULK, ERR_TOO_BIG_INLINE, ERR_TOO_BIG_MBULK,
    ERR_UNAUTH_BULK, ERR_UNAUTH_MBULK, ERR_UNBALANCED, PROTO_INLINE_MAX_SIZE, QueryBufferLimitError,
    RespParser, RespProtocolError, encode_command, encode_error, split_args,
)


def parse(data: bytes, chunk: int = 0, **limits):
    """(commands, error text or None, parser) feeding `data` in `chunk`-byte pieces (0 = whole)."""
    p = RespParser(**limits)
    cmds = []
    pieces = [data] if chunk <= 0 else [data[i:i + chunk] for i in range(0, len(data), chunk)]
    try:
        for piece in pieces:
            p.feed(piece)
            while (c := p.next_command()) is not None:
                cmds.append(c)
    except RespProtocolError as e:
        return cmds, e.message, p
    return cmds, None, p


def parse_splits(data: bytes, splits):
    """Feed data cut at the given offsets; returns (commands, error)."""
    p = RespParser()
    cmds = []
    bounds = [0, *sorted(set(s for s in splits if 0 < s < len(data))), len(data)]
    try:
        for a, b in zip(bounds, bounds[1:]):
            p.feed(data[a:b])
            while (c := p.next_command()) is not None:
                cmds.append(c)
    except RespProtocolError as e:
        return cmds, e.message
    return cmds, None


# -- multibulk ---------------------------------------------------------------
def test_multibulk_pipeline_and_binary_args():
    argv = [b"SET", b"k\r\nwith\0crlf", b"", b"\xff" * 5000]
    data = encode_command(argv) + encode_command([b"PING"]) + b"*0\r\n*-1\r\n*-9223372036854775808\r\n"
    data += encode_command(["XADD", "s", 7])
    cmds, err, p = parse(data)
    assert err is None
    assert cmds == [argv, [b"PING"], [b"XADD", b"s", b"7"]]
    assert p.buffered_bytes == 0 and p.next_command() is None


def test_every_byte_boundary_single_split_and_bytewise():
    data = (encode_command([b"XADD", b"s", b"*", b"f", b"v" * 300]) + b"PING a 'b c'\r\n"
            + b"*0\r\n" + encode_command([b"x" * 4100]) + b"\n\r\n")
    want, err, _ = parse(data)
    assert err is None and len(want) == 3
    for cut in range(1, len(data)):
        assert parse_splits(data, [cut]) == (want, None), cut
    assert parse(data, chunk=1)[:2] == (want, None)


def test_redis_quirks_unchecked_crlf():
    # redis skips the two bytes after bulk data, and the byte after a length's '\r'.
    cmds, err, _ = parse(b"*2\r\n$4\r\nECHOxy$2\rZhi!!*1\rQ$4\rQPING\r\n")
    assert (cmds, err) == ([[b"ECHO", b"hi"], [b"PING"]], None)


def test_cr_as_last_byte_waits_for_one_more():
    p = RespParser()
    p.feed(b"*1\r")
    assert p.next_command() is None
    p.feed(b"\n$4\r")
    assert p.next_command() is None
    p.feed(b"\nPING\r")
    assert p.next_command() is None
    p.feed(b"\n")
    assert p.next_command() == [b"PING"]


@pytest.mark.parametrize("data, err", [
    (b"*\r\n", ERR_INVALID_MBULK),
    (b"*x\r\n", ERR_INVALID_MBULK),
    (b"*+1\r\n", ERR_INVALID_MBULK),
    (b"*-0\r\n", ERR_INVALID_MBULK),
    (b"*01\r\n", ERR_INVALID_MBULK),
    (b"* 1\r\n", ERR_INVALID_MBULK),
    (b"*1 \r\n", ERR_INVALID_MBULK),
    (b"*2147483648\r\n", ERR_INVALID_MBULK),
    (b"*" + b"1" * 21 + b"\r\n", ERR_INVALID_MBULK),
    (b"*99999999999999999999\r\n", ERR_INVALID_MBULK),  # overflows a long long
    (b"*1048577\r\n", ERR_INVALID_MBULK),  # above max_multibulk_len
    (b"*1\r\nx\r\n", "ERR Protocol error: expected '$', got 'x'"),
    (b"*1\r\n\r\n", "ERR Protocol error: expected '$', got '\r'"),
    (b"*1\r\n\x80\r\n", "ERR Protocol error: expected '$', got '\udc80'"),
    (b"*2\r\n$4\r\nECHO\r\n*1\r\n", "ERR Protocol error: expected '$', got '*'"),
    (b"*1\r\n$\r\n", ERR_INVALID_BULK),
    (b"*1\r\n$-1\r\n", ERR_INVALID_BULK),
    (b"*1\r\n$-0\r\n", ERR_INVALID_BULK),
    (b"*1\r\n$04\r\n", ERR_INVALID_BULK),
    (b"*1\r\n$4x\r\n", ERR_INVALID_BULK),
    (b"*1\r\n$536870913\r\n", ERR_INVALID_BULK),  # proto-max-bulk-len + 1
    (b"*1\r\n$99999999999999999999\r\n", ERR_INVALID_BULK),
])
def test_multibulk_errors(data, err):
    cmds, got, _ = parse(data)
    assert (cmds, got) == ([], err)


def test_expected_dollar_error_encodes_the_raw_byte():
    _, err, _ = parse(b"*1\r\n\xe9\r\n")
    assert encode_error(err) == b"-ERR Protocol error: expected '$', got '\xe9'\r\n"
    _, err, _ = parse(b"*1\r\n\r\n")
    assert encode_error(err) == b"-ERR Protocol error: expected '$', got ' '\r\n"


def test_configurable_limits():
    assert parse(b"*1\r\n$2000000\r\n", proto_max_bulk_len=1024 * 1024)[1] == ERR_INVALID_BULK
    assert parse(b"*1\r\n$1048576\r\n", proto_max_bulk_len=1024 * 1024)[1] is None
    assert parse(b"*4\r\n", max_multibulk_len=3)[1] == ERR_INVALID_MBULK
    assert parse(b"*3\r\n", max_multibulk_len=3)[1] is None
    with pytest.raises(ValueError):
        RespParser(proto_max_bulk_len=0)
    p = RespParser(max_multibulk_len=2**40)
    assert p.max_multibulk_len == 2**31 - 1  # redis's INT_MAX at most


def test_unauthenticated_limits_and_toggle():
    assert parse(b"*11\r\n", authenticated=False)[1] == ERR_UNAUTH_MBULK
    assert parse(b"*2147483648\r\n", authenticated=False)[1] == ERR_INVALID_MBULK
    assert parse(b"*1\r\n$16385\r\n", authenticated=False)[1] == ERR_UNAUTH_BULK
    assert parse(b"*1\r\n$-2\r\n", authenticated=False)[1] == ERR_INVALID_BULK
    assert parse(b"*1\r\n$536870913\r\n", authenticated=False)[1] == ERR_INVALID_BULK
    ok = encode_command([b"AUTH", b"x" * 16384])
    assert parse(ok, authenticated=False)[:2] == ([[b"AUTH", b"x" * 16384]], None)
    p = RespParser(authenticated=False)
    p.authenticated = True
    assert p.authenticated
    p.feed(encode_command([b"x"] * 11))
    assert p.next_command() == [b"x"] * 11


def test_too_big_count_strings():
    assert parse(b"*" + b"1" * (PROTO_INLINE_MAX_SIZE - 1))[1] is None  # exactly 64 KB: still waiting
    assert parse(b"*" + b"1" * PROTO_INLINE_MAX_SIZE)[1] == ERR_TOO_BIG_MBULK
    assert parse(b"*1\r\n$" + b"1" * (PROTO_INLINE_MAX_SIZE + 1))[1] == ERR_TOO_BIG_BULK
    # once a '\r' arrives the line is just an invalid number, however long
    assert parse(b"*" + b"1" * 70000 + b"\r\n")[1] == ERR_INVALID_MBULK
    # the overflow is noticed while waiting too, in small pieces
    assert parse(b"*1\r\n$" + b"1" * 70000, chunk=1000)[1] == ERR_TOO_BIG_BULK
    assert parse(b"x" * 70000, chunk=999)[1] == ERR_TOO_BIG_INLINE


def test_nul_hides_terminators_like_strchr():
    # redis searches lines with strchr: a NUL before the terminator means "not found yet"
    for data in (b"*1\0\r\n", b"*1\r\n$1\0\r\nx\r\n", b"*1\r\n\0\r\n", b"PING\0\r\n", b"PI\0NG\n"):
        cmds, err, p = parse(data)
        assert (cmds, err) == ([], None), data
        p.feed(b"\r\n" * 10)
        assert p.next_command() is None
        with pytest.raises(RespProtocolError):
            p.feed(b"a" * PROTO_INLINE_MAX_SIZE)
            p.next_command()
    assert parse(b"*1\0" + b"\r" * PROTO_INLINE_MAX_SIZE)[1] == ERR_TOO_BIG_MBULK
    assert parse(b"*1\r\n$1\0" + b"\r" * PROTO_INLINE_MAX_SIZE, chunk=7)[1] == ERR_TOO_BIG_BULK
    assert parse(b"GET \0" + b"\n" * PROTO_INLINE_MAX_SIZE)[1] == ERR_TOO_BIG_INLINE
    # a NUL that arrives in a later chunk also hides the terminator
    p = RespParser()
    p.feed(b"*1\r\n$1")
    assert p.next_command() is None
    p.feed(b"\0\r\n")
    assert p.next_command() is None
    # a NUL inside bulk data is data
    assert parse(b"*1\r\n$3\r\n\0\0\0\r\n")[0] == [[b"\0\0\0"]]


def test_big_bulk_in_small_pieces_is_joined_once():
    payload = bytes(range(256)) * 8192  # 2 MB
    data = encode_command([b"SET", b"k", payload]) + b"PING\r\n"
    p = RespParser()
    got = []
    for i in range(0, len(data), 4096):
        p.feed(data[i:i + 4096])
        while (c := p.next_command()) is not None:
            got.append(c)
        if i < len(payload) - 8192:
            assert len(p._buf) < 8192 + 4096  # pieces wait unjoined until the bulk is whole
    assert got == [[b"SET", b"k", payload], [b"PING"]]


# -- inline ------------------------------------------------------------------
@pytest.mark.parametrize("line, argv", [
    (b"PING", [b"PING"]),
    (b"  SET  k \t v  ", [b"SET", b"k", b"v"]),
    (b"a\rb", [b"a", b"b"]),
    (b'ECHO "a b\\n\\r\\t\\b\\a\\\\\\"\\q"', [b"ECHO", b'a b\n\r\t\b\a\\"q']),
    (b'ECHO "\\x41\\x4\\xzz\\xFf"', [b"ECHO", b"Ax4xzz\xff"]),
    (b"ECHO 'it\\'s \\n'", [b"ECHO", b"it's \\n"]),
    (b'ECHO ""', [b"ECHO", b""]),
    (b"ECHO ''\v", [b"ECHO", b""]),
    (b'ab"cd ef" x', [b"abcd ef", b"x"]),
    (b"a'b c'", [b"ab c"]),
    (b"a\vb \fc", [b"a\vb", b"c"]),
    (b"\v\fa\v \v", [b"a\v"]),
    (b"\xe9t\xe9", [b"\xe9t\xe9"]),
])
def test_split_args(line, argv):
    assert split_args(line) == argv
    assert parse(line + b"\r\n")[:2] == ([argv], None)
    assert parse(line + b"\n")[:2] == ([argv], None)


@pytest.mark.parametrize("line", [
    b'"abc', b"'abc", b'"abc"x', b"'abc'x", b'"a\\"', b"'a\\'", b'x "a', b'"\\', b'"a"\'b\'',
])
def test_unbalanced_quotes(line):
    with pytest.raises(RespProtocolError) as ei:
        split_args(line)
    assert ei.value.message == ERR_UNBALANCED
    assert parse(b"PING\r\n" + line + b"\r\nPING\r\n")[:2] == ([[b"PING"]], ERR_UNBALANCED)


def test_inline_empty_lines_and_cr_handling():
    cmds, err, _ = parse(b"\r\n\n   \r\n\t\nPING\r\r\nECHO x\r\n")
    assert (cmds, err) == ([[b"PING"], [b"ECHO", b"x"]], None)
    # a long inline line is fine as long as its '\n' has arrived
    long = b"ECHO " + b"y" * 100000 + b"\n"
    assert parse(long)[0] == [[b"ECHO", b"y" * 100000]]


# -- limits, failure ---------------------------------------------------------
def test_query_buffer_limit_closes_without_reply():
    p = RespParser(query_buffer_limit=100)
    p.feed(b"*1\r\n$200\r\n" + b"x" * 80)
    assert p.next_command() is None
    with pytest.raises(QueryBufferLimitError) as ei:
        p.feed(b"x" * 20)
    assert ei.value.reply is False and RespParser().feed(b"") is None
    with pytest.raises(QueryBufferLimitError):
        p.next_command()  # sticky


def test_parsed_args_of_a_command_in_flight_count_against_the_limit():
    p = RespParser(query_buffer_limit=1000)
    p.feed(b"*100\r\n")
    for i in range(100):
        try:
            p.feed(b"$20\r\n" + b"a" * 20 + b"\r\n")  # 26 bytes, 20 kept as an argument
            assert p.next_command() is None
        except QueryBufferLimitError:
            # i arguments already parsed (20 bytes each) + this piece's 26 bytes
            assert i * 20 + 26 > 1000 >= (i - 1) * 20 + 26
            return
    pytest.fail("the arguments in flight were not counted")


def test_error_is_sticky():
    p = RespParser()
    p.feed(b"*1\r\nx\r\n")
    with pytest.raises(RespProtocolError) as e1:
        p.next_command()
    with pytest.raises(RespProtocolError) as e2:
        p.feed(b"PING\r\n")
    assert e1.value is e2.value and e1.value.reply is True


# -- properties --------------------------------------------------------------
_arg = st.binary(max_size=40) | st.sampled_from([b"", b"\r\n", b"$3\r\n", b"*1\r\n", b"\0"])
_cmd = st.lists(_arg, min_size=1, max_size=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cmds=st.lists(_cmd, min_size=1, max_size=6), splits=st.lists(st.integers(0, 2000), max_size=12))
def test_roundtrip_any_split(cmds, splits):
    data = b"".join(encode_command(c) for c in cmds)
    assert parse_splits(data, splits) == (cmds, None)


def _inline_quote(arg: bytes) -> bytes:
    """sdscatrepr, the inverse of sdssplitargs."""
    out = bytearray(b'"')
    for c in arg:
        if c in b'\\"':
            out += b"\\" + bytes([c])
        elif c in b"\n\r\t\a\b":
            out += {10: b"\\n", 13: b"\\r", 9: b"\\t", 7: b"\\a", 8: b"\\b"}[c]
        elif 32 <= c < 127:
            out.append(c)
        else:
            out += b"\\x%02x" % c
    return bytes(out + b'"')


@settings(max_examples=150, deadline=None)
@given(cmds=st.lists(_cmd, min_size=1, max_size=5), splits=st.lists(st.integers(0, 600), max_size=8))
def test_inline_roundtrip_any_split(cmds, splits):
    data = b"".join(b" ".join(_inline_quote(a) for a in c) + b"\r\n" for c in cmds)
    assert parse_splits(data, splits) == (cmds, None)


_garbage = st.lists(st.sampled_from([b"*", b"$", b"\r", b"\n", b"\r\n", b"1", b"0", b"-", b"3", b"x", b'"',
                                     b"'", b"\\", b" ", b"\0", b"\xff", b"*2\r\n", b"$1\r\n", b"\v"]),
                    max_size=60).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(data=_garbage | st.binary(max_size=200), splits=st.lists(st.integers(0, 300), max_size=10))
def test_garbage_only_protocol_errors_and_split_invariant(data, splits):
    whole = parse_splits(data, [])  # raises nothing but RespProtocolError
    assert parse_splits(data, splits) == whole
    assert parse_splits(data, range(len(data))) == whole


def test_large_pipelined_burst_in_64k_reads():
    """50,000 pipelined commands fed in 64 KiB reads (commands cut across reads) all come out
    whole and in order. (Speed is measured by bench/resp.py, not asserted here.)"""
    cmds = [[b"XADD", b"stream:%d" % (i % 7), b"*", b"field", b"value%d" % i] for i in range(50000)]
    data = b"".join(encode_command(c) for c in cmds)
    p = RespParser()
    out = []
    for i in range(0, len(data), 65536):
        p.feed(data[i:i + 65536])
        while (cmd := p.next_command()) is not None:
            out.append(cmd)
    assert out == cmds
