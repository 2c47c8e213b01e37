"""encode_reply / encode_error, and the wire error table."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.node.engine.errors import EngineError, WrongTypeError, BusyGroupError, NoGroupError
from xraft.node.engine.replies import NULL_ARRAY, OK, Status, WouldBlock
from xraft.node.server import wire_errors
from xraft.node.server.resp import MAX_REPLY_DEPTH, encode_error, encode_reply, format_double
from xraft.node.server.wire_errors import WireError, wire_for, wire_for_message


class ReplyReader:
    """Reads RESP2/RESP3 replies into the engine's value model (test helper;
    also used by test_resp_vs_redis). `_` reads as None."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def line(self) -> bytes:
        i = self.data.index(b"\r\n", self.pos)
        out = self.data[self.pos:i]
        self.pos = i + 2
        return out

    def read(self):
        line = self.line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return Status(rest.decode())
        if t == b"-":
            return EngineError(rest.decode("utf-8", "surrogateescape"))
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            out = self.data[self.pos:self.pos + n]
            assert self.data[self.pos + n:self.pos + n + 2] == b"\r\n"
            self.pos += n + 2
            return out
        if t == b"*":
            n = int(rest)
            return NULL_ARRAY if n < 0 else [self.read() for _ in range(n)]
        if t == b"%":
            out = {}
            for _ in range(int(rest)):
                k = self.read()
                out[k] = self.read()
            return out
        if t == b"_":
            return None
        if t == b"#":
            return {b"t": True, b"f": False}[rest]
        if t == b",":
            return float(rest)
        raise ValueError(f"unexpected reply line {line!r}")

    def read_all(self):
        out = []
        while self.pos < len(self.data):
            out.append(self.read())
        return out


def decode(data: bytes):
    r = ReplyReader(data)
    v = r.read()
    assert r.pos == len(data)
    return v


# -- encode_reply ------------------------------------------------------------
@pytest.mark.parametrize("value, resp2, resp3", [
    (b"foo", b"$3\r\nfoo\r\n", b"$3\r\nfoo\r\n"),
    (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
    (bytearray(b"ab"), b"$2\r\nab\r\n", b"$2\r\nab\r\n"),
    (memoryview(b"ab"), b"$2\r\nab\r\n", b"$2\r\nab\r\n"),
    (42, b":42\r\n", b":42\r\n"),
    (-7, b":-7\r\n", b":-7\r\n"),
    (None, b"$-1\r\n", b"_\r\n"),
    (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
    (OK, b"+OK\r\n", b"+OK\r\n"),
    (Status("a\r\nb"), b"+a  b\r\n", b"+a  b\r\n"),
    ([], b"*0\r\n", b"*0\r\n"),
    ((b"a", 1), b"*2\r\n$1\r\na\r\n:1\r\n", b"*2\r\n$1\r\na\r\n:1\r\n"),
    ({}, b"*0\r\n", b"%0\r\n"),
    ({b"k": [b"v", None]}, b"*2\r\n$1\r\nk\r\n*2\r\n$1\r\nv\r\n$-1\r\n",
     b"%1\r\n$1\r\nk\r\n*2\r\n$1\r\nv\r\n_\r\n"),
    (True, b":1\r\n", b"#t\r\n"),
    (False, b":0\r\n", b"#f\r\n"),
    (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
    (0.1, b"$19\r\n0.10000000000000001\r\n", b",0.10000000000000001\r\n"),
    (math.inf, b"$3\r\ninf\r\n", b",inf\r\n"),
    (-math.inf, b"$4\r\n-inf\r\n", b",-inf\r\n"),
    (1e300, b"$23\r\n1.0000000000000001e+300\r\n", b",1.0000000000000001e+300\r\n"),
    ([WrongTypeError(), [NULL_ARRAY]],
     b"*2\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n*1\r\n*-1\r\n",
     b"*2\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n*1\r\n_\r\n"),
])
def test_encode_values(value, resp2, resp3):
    assert encode_reply(value, 2) == resp2
    assert encode_reply(value, 3) == resp3


def test_int_subclass_and_big_bulks():
    import enum

    class E(enum.IntEnum):
        A = 5

    assert encode_reply(E.A, 2) == b":5\r\n" and encode_reply([E.A], 3) == b"*1\r\n:5\r\n"
    big = b"z" * 100000
    assert encode_reply([big, b"s"], 2) == b"*2\r\n$100000\r\n" + big + b"\r\n$1\r\ns\r\n"
    assert encode_reply({b"k": big}, 3) == b"%1\r\n$1\r\nk\r\n$100000\r\n" + big + b"\r\n"


def test_nan_is_printed_like_glibc():
    assert format_double(math.nan) == b"nan"
    assert format_double(-math.nan) == b"-nan"
    assert encode_reply(math.nan, 3) == b",nan\r\n"


@pytest.mark.parametrize("bad", ["text", object(), WouldBlock([b"k"], 0, [b"XREAD"]), {1.5}])
def test_refuses_what_is_not_a_reply(bad):
    with pytest.raises(TypeError):
        encode_reply(bad, 2)
    with pytest.raises(TypeError):
        encode_reply([bad], 3)


def test_bad_protocol_and_depth_limit():
    with pytest.raises(ValueError):
        encode_reply(b"x", 1)
    deep = b"x"
    for _ in range(MAX_REPLY_DEPTH):  # MAX_REPLY_DEPTH nested arrays are fine
        deep = [deep]
    assert encode_reply(deep, 2).endswith(b"$1\r\nx\r\n")
    with pytest.raises(ValueError):
        encode_reply([deep], 2)
    with pytest.raises(ValueError):
        encode_reply({b"k": deep}, 3)


def test_encode_error():
    assert encode_error("ERR syntax error") == b"-ERR syntax error\r\n"
    assert encode_error("ERR a\r\nb\nc\r\n") == b"-ERR a  b c\r\n"  # trimmed at the ends, blanked inside
    assert encode_error("\r\nERR x") == b"-ERR x\r\n"
    assert encode_error("") == b"-ERR\r\n"
    assert encode_error(b"ERR \xff") == b"-ERR \xff\r\n"
    assert encode_error("ERR caf\u00e9") == "-ERR caf\u00e9\r\n".encode()
    assert encode_reply(BusyGroupError(), 3) == b"-BUSYGROUP Consumer Group name already exists\r\n"


_leaf = (st.binary(max_size=20) | st.integers(-2**63, 2**63 - 1) | st.none() | st.just(NULL_ARRAY)
         | st.sampled_from([OK, Status("PONG")]) | st.booleans()
         | st.floats(allow_nan=False).filter(lambda f: f != 0 or math.copysign(1, f) > 0))
_tree = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=5)
                     | st.dictionaries(st.binary(max_size=8), kids, max_size=4), max_leaves=30)


def _as_resp3_read(v):
    """What a RESP3 reader gets back: NULL_ARRAY reads as None (both are `_`)."""
    if v is NULL_ARRAY:
        return None
    if isinstance(v, list):
        return [_as_resp3_read(x) for x in v]
    if isinstance(v, dict):
        return {k: _as_resp3_read(x) for k, x in v.items()}
    return v


def _as_resp2_read(v):
    """What a RESP2 reader gets back: maps flattened, booleans as 1/0, doubles as bulk text."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        return format_double(v)
    if isinstance(v, list):
        return [_as_resp2_read(x) for x in v]
    if isinstance(v, dict):
        return [y for k, x in v.items() for y in (_as_resp2_read(k), _as_resp2_read(x))]
    return v


@settings(max_examples=300, deadline=None)
@given(_tree)
def test_random_trees_decode_back(v):
    assert decode(encode_reply(v, 3)) == _as_resp3_read(v)
    assert decode(encode_reply(v, 2)) == _as_resp2_read(v)


# -- wire error table --------------------------------------------------------
_GRPC_CODES = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
               "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
               "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
               "UNAUTHENTICATED"}

EXPECTED = {  # code: (grpc status, reason, retriable) -- every row, spelled out
    "ERR": ("INVALID_ARGUMENT", "COMMAND_ERROR", False),
    "WRONGTYPE": ("FAILED_PRECONDITION", "WRONG_TYPE", False),
    "NOGROUP": ("NOT_FOUND", "NO_GROUP", False),
    "BUSYGROUP": ("ALREADY_EXISTS", "BUSY_GROUP", False),
    "EXECABORT": ("ABORTED", "EXEC_ABORT", False),
    "NOSCRIPT": ("NOT_FOUND", "NO_SCRIPT", False),
    "NOPROTO": ("INVALID_ARGUMENT", "NO_PROTO", False),
    "UNBLOCKED": ("ABORTED", "UNBLOCKED", False),
    "OOM": ("RESOURCE_EXHAUSTED", "OUT_OF_MEMORY", False),
    "NOAUTH": ("UNAUTHENTICATED", "NO_AUTH", False),
    "WRONGPASS": ("UNAUTHENTICATED", "WRONG_PASS", False),
    "NOPERM": ("PERMISSION_DENIED", "NO_PERM", False),
    "MOVED": ("FAILED_PRECONDITION", "MOVED", True),
    "ASK": ("FAILED_PRECONDITION", "ASK", True),
    "CROSSSLOT": ("INVALID_ARGUMENT", "CROSS_SLOT", False),
    "TRYAGAIN": ("UNAVAILABLE", "TRY_AGAIN", True),
    "CLUSTERDOWN": ("UNAVAILABLE", "CLUSTER_DOWN", True),
    "BUSY": ("UNAVAILABLE", "BUSY", True),
    "LOADING": ("UNAVAILABLE", "LOADING", True),
    "NOTLEADER": ("FAILED_PRECONDITION", "NOT_LEADER", True),
    "UNKNOWNOUTCOME": ("UNKNOWN", "UNKNOWN_OUTCOME", False),
    "TIMEOUT": ("DEADLINE_EXCEEDED", "TIMEOUT", True),
    "UNAVAILABLE": ("UNAVAILABLE", "UNAVAILABLE", True),
    "SESSIONEXPIRED": ("FAILED_PRECONDITION", "SESSION_EXPIRED", False),
    "SESSIONSFULL": ("RESOURCE_EXHAUSTED", "SESSIONS_FULL", True),
}


@pytest.mark.parametrize("code", sorted(EXPECTED))
def test_every_table_row(code):
    grpc_status, reason, retriable = EXPECTED[code]
    row = wire_for(code)
    assert row == WireError(code, grpc_status, reason, retriable)
    assert wire_for(reason) is row  # reachable by reason too
    assert grpc_status in _GRPC_CODES
    assert code.isalpha() and code.isupper()  # one word: it is the RESP prefix


def test_table_has_no_unlisted_rows():
    assert set(wire_errors.TABLE) == set(EXPECTED)


def test_unknown_codes_default():
    row = wire_for("WEIRDO")
    assert row == WireError("WEIRDO", "UNKNOWN", "UNKNOWN_ERROR", False)
    assert wire_for("").code == "ERR"


def test_engine_errors_map_through_their_code():
    for exc, reason in [(WrongTypeError(), "WRONG_TYPE"), (BusyGroupError(), "BUSY_GROUP"),
                        (NoGroupError("NOGROUP No such key 's' or consumer group 'g'"), "NO_GROUP"),
                        (EngineError("ERR syntax error"), "COMMAND_ERROR")]:
        assert wire_for(exc.code).reason == reason
        assert wire_for_message(exc.message).reason == reason
        assert wire_for(exc.code).retriable is exc.retriable is False


def test_messages_of_node_errors():
    m = wire_errors
    cases = [
        (m.moved_message(3999, "127.0.0.1:6381"), "MOVED 3999 127.0.0.1:6381", "127.0.0.1:6381"),
        (m.ask_message(12, "10.0.0.2:7000"), "ASK 12 10.0.0.2:7000", "10.0.0.2:7000"),
        (m.not_leader_message("10.0.0.1:6379"), "NOTLEADER 10.0.0.1:6379", "10.0.0.1:6379"),
        (m.not_leader_message(None), "NOTLEADER no leader known", None),
        (m.unknown_outcome_message(), None, None),
        (m.timeout_message(), None, None),
        (m.unavailable_message(), "UNAVAILABLE no quorum", None),
        (m.try_again_message(), "TRYAGAIN Multiple keys request during rehashing of slot", None),
        (m.cluster_down_message(), "CLUSTERDOWN The cluster is down", None),
        (m.cross_slot_message(), "CROSSSLOT Keys in request don't hash to the same slot", None),
        (m.noauth_message(), "NOAUTH Authentication required.", None),
    ]
    for msg, text, leader in cases:
        if text is not None:
            assert msg == text
        assert wire_for_message(msg).code in wire_errors.TABLE  # every message has a row
        assert m.leader_from_message(msg) == leader
        assert encode_error(msg) == b"-" + msg.encode() + b"\r\n"
    assert wire_for_message(m.unknown_outcome_message()).reason == "UNKNOWN_OUTCOME"
    assert wire_for_message(m.timeout_message()).reason == "TIMEOUT"
