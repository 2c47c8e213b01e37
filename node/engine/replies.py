"""The values commands return; `server/` turns them into RESP2, RESP3 or protobuf.

    bytes        bulk string                      $3\\r\\nfoo
    int          integer                          :42
    None         null bulk string (RESP2 $-1)      RESP3 '_'
    NULL_ARRAY   null array (RESP2 *-1)            RESP3 '_'
    list/tuple   array                            *n
    PairMap      [k, v] pairs: RESP3 map '%'; RESP2 an array of 2-element arrays
    Status       simple string                    +OK
    dict         map (RESP3 '%'); RESP2 flattens it to an array k1 v1 k2 v2 ...
                 insertion order is the wire order; keys are bytes

Errors are not values: commands raise `errors.EngineError`.
"""


class PairMap(list):
    """[key, value] pairs that redis sends as a map in RESP3 and as an array of
    two-element arrays in RESP2 — XREAD and XREADGROUP reply this way (addReplyMapLen
    on a RESP2 client is not the flattened form a dict gets). Elements are [key, value]."""

    __slots__ = ()


class Status(str):
    """A simple-string reply such as +OK or +PONG."""

    __slots__ = ()


OK = Status("OK")


class _NullArray:
    """The null array: RESP2 `*-1` (e.g. XREAD with nothing to return)."""

    __slots__ = ()
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "NULL_ARRAY"

    def __reduce__(self):
        return (_NullArray, ())


NULL_ARRAY = _NullArray()


def to_resp2_value(reply):
    """Flatten maps to arrays as RESP2 does; the rest is unchanged (recursively)."""
    if isinstance(reply, dict):
        out = []
        for k, v in reply.items():
            out.append(to_resp2_value(k))
            out.append(to_resp2_value(v))
        return out
    if isinstance(reply, (list, tuple)):
        return [to_resp2_value(x) for x in reply]
    return reply


class WouldBlock:
    """Returned (not raised) by a blocking form (XREAD BLOCK, BLPOP, ...) that has
    nothing to serve now. The server parks the client on `keys` and, whenever one
    of them is signalled ready (Keyspace.pop_ready_keys), runs `retry_argv` again;
    after `timeout_ms` (0 = forever) it replies the command's timeout reply
    (`timeout_reply`, usually NULL_ARRAY).

    `retry_argv` is the original argv with every time-dependent or position-
    dependent argument resolved at blocking time (XREAD's `$` replaced by the
    stream's last ID), so that a retry serves only what arrived after the block.
    """

    __slots__ = ("keys", "timeout_ms", "retry_argv", "timeout_reply")

    def __init__(self, keys, timeout_ms: int, retry_argv, timeout_reply=NULL_ARRAY):
        self.keys = list(keys)
        self.timeout_ms = timeout_ms
        self.retry_argv = list(retry_argv)
        self.timeout_reply = timeout_reply

    def __repr__(self):
        return f"WouldBlock(keys={self.keys!r}, timeout_ms={self.timeout_ms}, retry_argv={self.retry_argv!r})"
