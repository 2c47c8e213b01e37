"""The RESP wire codec: an incremental request parser and the reply encoders.

Requests (`RespParser`) follow redis-server 7.0's `processInputBuffer`
(src/networking.c) byte for byte:

* A command whose first byte is '*' is multibulk: `*<n>\\r\\n` then n times
  `$<len>\\r\\n<len bytes>\\r\\n`. Anything else is an inline command: one line
  up to '\\n' (a '\\r' before it is dropped) split by `sdssplitargs` rules.
  Empty commands (`*0`, `*-1`, blank inline lines) are skipped silently.
* Redis's quirks are kept on purpose, so that the same bytes mean the same
  thing here and there: the two bytes after a bulk's data are skipped without
  being checked, the byte after a length line's '\\r' need not be '\\n', and a
  NUL byte before a line's terminator hides the terminator (redis searches
  with strchr), so such a line only ends in "too big ..." once 64 KB pile up.
* Limits: a line without its terminator may hold 64 KB (PROTO_INLINE_MAX_SIZE);
  bulk lengths up to `proto_max_bulk_len` (512 MB); the multibulk count up to
  `max_multibulk_len` (1024*1024: redis 7.0 allows INT_MAX, but every argument
  costs a Python object; the error text is redis's); unread bytes up to
  `query_buffer_limit` (1 GB, `client-query-buffer-limit`). Unlike redis, the
  arguments already parsed for a command still in flight count against that
  limit too (redis leaves them to maxmemory-clients), so nothing is unbounded.
  Unauthenticated clients get redis's tighter limits (10 arguments, 16 KB
  bulks) when the server sets `parser.authenticated = False`.

Protocol errors raise `RespProtocolError` carrying redis's exact text. The
server MUST then do what redis does: reply `encode_error(e.message)` (after
the replies of the commands parsed before it), then close the connection and
read nothing more. `QueryBufferLimitError` is the exception: redis closes the
client without replying. The parser stays failed: every later call re-raises.

Replies (`encode_reply`) map the engine's value model (engine/replies.py) to
RESP2 or RESP3 exactly as redis's addReply* functions do.
"""
import math

from xraft.node.engine.errors import EngineError
from xraft.node.engine.replies import NULL_ARRAY, PairMap, Status

PROTO_INLINE_MAX_SIZE = 64 * 1024  # server.h
DEFAULT_PROTO_MAX_BULK_LEN = 512 * 1024 * 1024  # proto-max-bulk-len
DEFAULT_QUERY_BUFFER_LIMIT = 1024 * 1024 * 1024  # client-query-buffer-limit
DEFAULT_MAX_MULTIBULK_LEN = 1024 * 1024
UNAUTH_MAX_MULTIBULK_LEN = 10  # networking.c, when authRequired(c)
UNAUTH_MAX_BULK_LEN = 16384
_INT_MAX = 2**31 - 1
_LLONG_MAX = 2**63 - 1
_LLONG_MIN = -(2**63)
_LONG_STR_SIZE = 21  # string2ll rejects strings this long or longer

# Canonical decimal spellings of small lengths: a hit is a valid string2ll
# result, so the hot path skips validation with one dict lookup.
_SMALL = {str(i).encode(): i for i in range(4096)}

ERR_TOO_BIG_INLINE = "ERR Protocol error: too big inline request"
ERR_UNBALANCED = "ERR Protocol error: unbalanced quotes in request"
ERR_TOO_BIG_MBULK = "ERR Protocol error: too big mbulk count string"
ERR_INVALID_MBULK = "ERR Protocol error: invalid multibulk length"
ERR_UNAUTH_MBULK = "ERR Protocol error: unauthenticated multibulk length"
ERR_TOO_BIG_BULK = "ERR Protocol error: too big bulk count string"
ERR_INVALID_BULK = "ERR Protocol error: invalid bulk length"
ERR_UNAUTH_BULK = "ERR Protocol error: unauthenticated bulk length"
ERR_QUERY_BUFFER = "Closing client that reached max query buffer length"


class RespProtocolError(Exception):
    """The client broke the protocol: reply `encode_error(message)` (if `reply`),
    then close the connection."""

    reply = True

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class QueryBufferLimitError(RespProtocolError):
    """Too many unread bytes: redis logs it and closes the client without a reply."""

    reply = False


def _string2ll(s: bytes):
    """redis util.c string2ll: canonical signed decimal, no sign '+', no leading
    zeros, no spaces, fits in a long long; None when invalid."""
    n = len(s)
    if n == 0 or n >= _LONG_STR_SIZE:
        return None
    if s == b"0":
        return 0
    digits = s[1:] if s[0] == 45 else s  # '-'
    if not digits or not 49 <= digits[0] <= 57 or not digits.isdigit():
        return None
    v = int(digits)
    if digits is not s:
        v = -v
    if v > _LLONG_MAX or v < _LLONG_MIN:
        return None
    return v


# -- sdssplitargs ------------------------------------------------------------
_ISSPACE = frozenset(b" \t\n\v\f\r")  # C isspace(): skips blanks between tokens
_TOKEN_END = frozenset(b" \n\r\t")  # ... but only these end an unquoted token
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}


def split_args(line: bytes) -> list:
    """Split an inline command as redis's sdssplitargs does. `line` holds no
    NUL and no terminator. Raises RespProtocolError on unbalanced quotes (and
    on a closing quote followed by anything but a space)."""
    if b'"' not in line and b"'" not in line and b"\v" not in line and b"\f" not in line:
        # Without quotes or \v\f, runs of " \t\r\n" separate tokens: exactly bytes.split().
        return line.split()
    n = len(line)

    def at(k):  # the C string is NUL-terminated: reading past the end sees 0
        return line[k] if k < n else 0

    out = []
    i = 0
    while True:
        while i < n and line[i] in _ISSPACE:
            i += 1
        if i >= n:
            return out
        cur = bytearray()
        inq = insq = done = False
        while not done:
            c = at(i)
            if inq:
                if c == 92 and at(i + 1) == 120 and at(i + 2) in _HEX and at(i + 3) in _HEX:
                    cur.append(int(line[i + 2:i + 4], 16))
                    i += 3
                elif c == 92 and at(i + 1):
                    i += 1
                    c = line[i]
                    cur.append(_ESCAPES.get(c, c))
                elif c == 34:  # closing '"' must be followed by a space or the end
                    nxt = at(i + 1)
                    if nxt and nxt not in _ISSPACE:
                        raise RespProtocolError(ERR_UNBALANCED)
                    done = True
                elif c == 0:
                    raise RespProtocolError(ERR_UNBALANCED)
                else:
                    cur.append(c)
            elif insq:
                if c == 92 and at(i + 1) == 39:
                    i += 1
                    cur.append(39)
                elif c == 39:
                    nxt = at(i + 1)
                    if nxt and nxt not in _ISSPACE:
                        raise RespProtocolError(ERR_UNBALANCED)
                    done = True
                elif c == 0:
                    raise RespProtocolError(ERR_UNBALANCED)
                else:
                    cur.append(c)
            elif c == 0 or c in _TOKEN_END:
                done = True
            elif c == 34:
                inq = True
            elif c == 39:
                insq = True
            else:
                cur.append(c)
            if i < n:
                i += 1
        out.append(bytes(cur))


class RespParser:
    """Incremental request parser for one connection.

    `feed(data)` appends bytes read from the socket; `next_command()` returns
    the next complete command as a list of bytes (never empty), or None when
    more bytes are needed. Both raise RespProtocolError (see module doc).

    The buffer is an immutable `bytes` with a read offset: a command is parsed
    with `find` and slices, and bytes fed while a command is incomplete wait in
    a list until they can complete it (a 500 MB bulk is joined once, not per
    read), so parsing costs O(bytes) whatever the read sizes.
    """

    __slots__ = (
        "_buf", "_pos", "_chunks", "_chunks_len",
        "_args", "_left", "_args_bytes", "_args_counted",
        "_need", "_wait_term", "_wait_err", "_stuck", "_error",
        "proto_max_bulk_len", "query_buffer_limit", "max_multibulk_len",
        "_authenticated", "_mb_limit", "_bulk_limit",
    )

    def __init__(self, proto_max_bulk_len: int = DEFAULT_PROTO_MAX_BULK_LEN,
                 query_buffer_limit: int = DEFAULT_QUERY_BUFFER_LIMIT,
                 max_multibulk_len: int = DEFAULT_MAX_MULTIBULK_LEN,
                 authenticated: bool = True):
        if proto_max_bulk_len < 1 or query_buffer_limit < 1 or max_multibulk_len < 1:
            raise ValueError("parser limits must be positive")
        self.proto_max_bulk_len = proto_max_bulk_len
        self.query_buffer_limit = query_buffer_limit
        self.max_multibulk_len = min(max_multibulk_len, _INT_MAX)
        self._buf = b""
        self._pos = 0
        self._chunks = []  # fed but not yet joined into _buf
        self._chunks_len = 0
        self._args = None  # arguments of a multibulk command still in flight
        self._left = 0  # ... and how many it still lacks
        self._args_bytes = 0  # bytes held in _args[:_args_counted]
        self._args_counted = 0
        self._need = 0  # unread bytes needed before parsing can progress
        self._wait_term = None  # b"\r" / b"\n": a line waiting for its end
        self._wait_err = None  # the error if that line outgrows 64 KB
        self._stuck = False  # a NUL hides the awaited terminator for good
        self._error = None  # sticky: a failed connection stays failed
        self.authenticated = authenticated

    @property
    def authenticated(self) -> bool:
        return self._authenticated

    @authenticated.setter
    def authenticated(self, value: bool):
        # One combined bound per kind keeps the hot path to a single comparison.
        self._authenticated = bool(value)
        self._mb_limit = self.max_multibulk_len if value else min(self.max_multibulk_len, UNAUTH_MAX_MULTIBULK_LEN)
        self._bulk_limit = self.proto_max_bulk_len if value else min(self.proto_max_bulk_len, UNAUTH_MAX_BULK_LEN)

    @property
    def buffered_bytes(self) -> int:
        """Unread bytes (CLIENT LIST's qbuf)."""
        return len(self._buf) - self._pos + self._chunks_len

    @property
    def partial_bytes(self) -> int:
        """Bytes of the arguments already parsed for a command still arriving."""
        return self._args_bytes

    def _fail(self, exc):
        self._error = exc
        raise exc

    # -- input --------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        if not data:
            return
        if type(data) is not bytes:
            data = bytes(data)
        self._chunks.append(data)
        self._chunks_len += len(data)
        if self.buffered_bytes + self._args_bytes > self.query_buffer_limit:
            self._fail(QueryBufferLimitError(ERR_QUERY_BUFFER))
        term = self._wait_term
        if term is not None and not self._stuck:
            t = data.find(term)
            if data.find(b"\0", 0, t if t >= 0 else len(data)) >= 0:
                self._stuck = True  # redis's strchr stops at the NUL, forever
            elif t >= 0:
                self._wait_term = None

    def _absorb(self) -> bool:
        """Join fed chunks into the buffer if they can make progress."""
        if self._wait_term is not None:
            if self.buffered_bytes > PROTO_INLINE_MAX_SIZE:
                self._fail(RespProtocolError(self._wait_err))
            return False
        if self.buffered_bytes < self._need:
            return False
        rest = self._buf[self._pos:]
        chunks = self._chunks
        if not rest and len(chunks) == 1:
            self._buf = chunks[0]
        else:
            chunks.insert(0, rest)
            self._buf = b"".join(chunks)
        self._pos = 0
        self._chunks = []
        self._chunks_len = 0
        self._need = 0
        return True

    def _wait_line(self, pos, nl, term, err_text):
        """No usable terminator for the line at pos: wait for one (or fail
        as redis does once more than 64 KB are unread without it)."""
        buf = self._buf
        end = len(buf)
        self._pos = pos
        if nl >= 0 and buf.find(b"\0", pos, nl) < 0:
            # '\r' found but it is the last byte: one more byte completes the line
            self._need = nl - pos + 2
            return None
        if end - pos > PROTO_INLINE_MAX_SIZE:
            self._fail(RespProtocolError(err_text))
        self._stuck = nl >= 0 or buf.find(b"\0", pos) >= 0
        self._wait_term = term
        self._wait_err = err_text
        return None

    def _save_partial(self, args, left, pos):
        self._args = args
        self._left = left
        self._pos = pos
        new = args[self._args_counted:]
        if new:
            self._args_bytes += sum(map(len, new))
            self._args_counted = len(args)

    # -- parsing ------------------------------------------------------------
    def next_command(self):
        if self._error is not None:
            raise self._error
        if self._chunks and not self._absorb():
            return None
        buf = self._buf
        pos = self._pos
        end = len(buf)
        find = buf.find
        small = _SMALL
        while pos < end:
            args = self._args
            if args is None:
                if buf[pos] != 42:  # not '*': inline
                    args, pos = self._inline(buf, pos, end)
                    if pos < 0:
                        return None
                    self._pos = pos
                    if args:
                        return args
                    continue
                nl = find(b"\r", pos)
                if nl < 0 or nl + 1 >= end:
                    return self._wait_line(pos, nl, b"\r", ERR_TOO_BIG_MBULK)
                left = small.get(buf[pos + 1:nl])
                if left is None:
                    if find(b"\0", pos, nl) >= 0:
                        return self._wait_line(pos, -1, b"\r", ERR_TOO_BIG_MBULK)
                    left = _string2ll(buf[pos + 1:nl])
                    if left is None:
                        self._fail(RespProtocolError(ERR_INVALID_MBULK))
                if left > self._mb_limit:
                    if left > self.max_multibulk_len:
                        self._fail(RespProtocolError(ERR_INVALID_MBULK))
                    self._fail(RespProtocolError(ERR_UNAUTH_MBULK))
                pos = nl + 2
                if left <= 0:
                    continue
                args = []
            else:
                left = self._left
            blimit = self._bulk_limit
            append = args.append
            while left:
                nl = find(b"\r", pos)
                if nl < 0 or nl + 1 >= end:
                    self._save_partial(args, left, pos)
                    return self._wait_line(pos, nl, b"\r", ERR_TOO_BIG_BULK)
                ln = small.get(buf[pos + 1:nl])
                if ln is None or buf[pos] != 36:  # not '$'
                    ln = self._bulk_len_slow(buf, pos, nl)
                    if ln is None:  # a NUL hides the '\r'
                        self._save_partial(args, left, pos)
                        return self._wait_line(pos, -1, b"\r", ERR_TOO_BIG_BULK)
                if ln > blimit:
                    if ln > self.proto_max_bulk_len:
                        self._fail(RespProtocolError(ERR_INVALID_BULK))
                    self._fail(RespProtocolError(ERR_UNAUTH_BULK))
                start = nl + 2
                stop = start + ln
                if stop + 2 > end:
                    # Resume at the '$' line next time: re-reading it is cheaper
                    # than keeping one more piece of state.
                    self._save_partial(args, left, pos)
                    self._need = stop + 2 - pos
                    return None
                append(buf[start:stop])
                pos = stop + 2  # redis skips the two bytes after the data unchecked
                left -= 1
            if self._args is not None:
                self._args = None
                self._args_bytes = 0
                self._args_counted = 0
            self._pos = pos
            return args
        self._pos = pos
        return None

    def _bulk_len_slow(self, buf, pos, nl):
        """The checks of a '$' line the fast path skipped; None if a NUL hides the '\r'."""
        if buf.find(b"\0", pos, nl) >= 0:
            return None
        if buf[pos] != 36:
            got = buf[pos:pos + 1].decode("utf-8", "surrogateescape")
            self._fail(RespProtocolError(f"ERR Protocol error: expected '$', got '{got}'"))
        ln = _string2ll(buf[pos + 1:nl])
        if ln is None or ln < 0:
            self._fail(RespProtocolError(ERR_INVALID_BULK))
        return ln

    def _inline(self, buf, pos, end):
        """(args, next position), or (None, -1) after arranging to wait."""
        nl = buf.find(b"\n", pos)
        if nl < 0 or buf.find(b"\0", pos, nl) >= 0:
            self._wait_line(pos, -1, b"\n", ERR_TOO_BIG_INLINE)
            return None, -1
        stop = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
        try:
            args = split_args(buf[pos:stop])
        except RespProtocolError as e:
            self._fail(e)
        return args, nl + 1


def encode_command(args) -> bytes:
    """A command as a multibulk request (what clients send)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = b"%d" % a
        parts.append(b"$%d\r\n%b\r\n" % (len(a), a))
    return b"".join(parts)


# -- replies -----------------------------------------------------------------
MAX_REPLY_DEPTH = 64  # engine replies nest a few levels; deeper means a bug
_BIG = 16 * 1024  # above this, bulk data is joined rather than %-formatted (one copy less)


def format_double(d: float) -> bytes:
    """A double as redis 7.0's addReplyDouble prints it: "%.17g", with inf/-inf
    spelled out and NaN as glibc prints it."""
    if d != d:
        return b"-nan" if math.copysign(1.0, d) < 0 else b"nan"
    if d == math.inf:
        return b"inf"
    if d == -math.inf:
        return b"-inf"
    return b"%.17g" % d


def _line_safe(text: str) -> bytes:
    # Like addReplyErrorFormat: trim CR/LF at the ends, blank them inside,
    # so a message can never break the framing.
    b = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
    if b"\r" in b or b"\n" in b:
        b = b.strip(b"\r\n").replace(b"\r", b" ").replace(b"\n", b" ")
    return b


def encode_error(message) -> bytes:
    """`-<message>\\r\\n`; message starts with its code ("ERR ...", "WRONGTYPE ...")."""
    b = _line_safe(message)
    return b"-" + (b or b"ERR") + b"\r\n"


def _encode(v, out, resp3, depth):
    t = type(v)
    if t is bytes:
        if len(v) < _BIG:
            out.append(b"$%d\r\n%b\r\n" % (len(v), v))
        else:
            out.append(b"$%d\r\n" % len(v))
            out.append(v)
            out.append(b"\r\n")
    elif t is list or t is tuple:
        if depth >= MAX_REPLY_DEPTH:
            raise ValueError("reply nested too deeply")
        out.append(b"*%d\r\n" % len(v))
        for x in v:
            if type(x) is bytes and len(x) < _BIG:
                out.append(b"$%d\r\n%b\r\n" % (len(x), x))
            else:
                _encode(x, out, resp3, depth + 1)
    elif t is int:
        out.append(b":%d\r\n" % v)
    elif v is None:
        out.append(b"_\r\n" if resp3 else b"$-1\r\n")
    elif v is NULL_ARRAY:
        out.append(b"_\r\n" if resp3 else b"*-1\r\n")
    elif t is Status:
        out.append(b"+" + _line_safe(v) + b"\r\n")
    elif t is dict:
        if depth >= MAX_REPLY_DEPTH:
            raise ValueError("reply nested too deeply")
        out.append((b"%%%d\r\n" if resp3 else b"*%d\r\n") % (len(v) if resp3 else 2 * len(v)))
        for k, x in v.items():
            _encode(k, out, resp3, depth + 1)
            _encode(x, out, resp3, depth + 1)
    elif t is PairMap:
        if depth >= MAX_REPLY_DEPTH:
            raise ValueError("reply nested too deeply")
        out.append((b"%%%d\r\n" if resp3 else b"*%d\r\n") % len(v))
        for k, x in v:
            if not resp3:
                out.append(b"*2\r\n")
            _encode(k, out, resp3, depth + 1)
            _encode(x, out, resp3, depth + 1)
    elif t is bool:  # addReplyBool: RESP2 has no boolean, it sends :1 / :0
        out.append((b"#t\r\n" if v else b"#f\r\n") if resp3 else (b":1\r\n" if v else b":0\r\n"))
    elif t is float:
        d = format_double(v)
        out.append(b",%b\r\n" % d if resp3 else b"$%d\r\n%b\r\n" % (len(d), d))
    elif isinstance(v, EngineError):  # an error inside an array (EXEC)
        out.append(encode_error(v.message))
    elif isinstance(v, (bytes, bytearray, memoryview)):
        _encode(bytes(v), out, resp3, depth)
    elif isinstance(v, int) and not isinstance(v, bool):
        out.append(b":%d\r\n" % v)
    else:
        # str is deliberately refused: a reply string must be bytes or Status.
        raise TypeError(f"cannot encode {t.__name__} as a RESP reply: {v!r}")


def encode_reply(value, protocol: int = 2) -> bytes:
    """The RESP bytes of a reply value for a client speaking `protocol` (2 or 3)."""
    if protocol != 2 and protocol != 3:
        raise ValueError(f"unknown RESP protocol {protocol}")
    t = type(value)
    if t is bytes:
        return b"$%d\r\n%b\r\n" % (len(value), value)
    if t is Status:
        return b"+" + _line_safe(value) + b"\r\n"
    if t is int:
        return b":%d\r\n" % value
    out = []
    _encode(value, out, protocol == 3, 0)
    return b"".join(out)
