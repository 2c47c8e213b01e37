"""The values commands return; `server/` turns them into RESP2, RESP3 or protobuf.

    bytes        bulk string                      $3\\r\\nfoo
    int          integer                          :42
    None         null bulk string (RESP2 $-1)      RESP3 '_'
    NULL_ARRAY   null array (RESP2 *-1)            RESP3 '_'
    list/tuple   array                            *n
    Status       simple string                    +OK
    dict         map (RESP3 '%'); RESP2 flattens it to an array k1 v1 k2 v2 ...
                 insertion order is the wire order; keys are bytes

Errors are not values: commands raise `errors.EngineError`.
"""


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
