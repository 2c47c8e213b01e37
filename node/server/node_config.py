"""CONFIG SET/GET of the settings that belong to one node, not to the replicated state.

redis clients and test harnesses set these on connect. Each is validated as
redis 7.0.15 does (config.c: same ranges, same "CONFIG SET failed" reasons,
checked together with the engine settings of fsm/config_set.py in one pass,
all or nothing), applied on the node that received it (as redis cluster
nodes are configured one by one), and read back by CONFIG GET.

    setting                     meaning in xraft
    proto-max-bulk-len          the RESP parser's bulk limit: new and connected clients
    client-query-buffer-limit   the RESP parser's query buffer limit: new and connected clients
    maxclients                  the connection limit
    save                        no-op: xraft writes no RDB file; durability is the Raft
                                log (WAL) and its snapshots, whatever `save` says
    appendonly                  no-op: the Raft WAL is always on
    appendfsync                 no-op: the WAL's fsync policy is the node's --fsync flag
    lazyfree-lazy-user-flush    no-op: FLUSHALL/FLUSHDB empty the keyspace at apply either way

Engine settings (stream/list node sizes) go through the log instead
(fsm/config_set.py); a CONFIG SET naming both kinds proposes the engine part
and, once it is applied, sets the node part.
"""
from ..engine.streamid import string2ll
from ..fsm.config_set import memtoull

_LONG_MAX = (1 << 63) - 1
_UINT_MAX = (1 << 32) - 1
_NOT_MEMORY = "argument must be a memory value"


def _memory_value(raw: bytes):
    return memtoull(raw.split(b"\0", 1)[0])      # a C string: a NUL ends it


def _ranged(read, not_read: str, lo: int, hi: int):
    """A numeric setting: read(raw) -> int or None (redis's `not_read` reason), in lo..hi."""
    def parse(raw: bytes) -> int:
        value = read(raw)
        if value is None:
            raise ValueError(not_read)
        if not lo <= value <= hi:
            raise ValueError("argument must be between %d and %d inclusive" % (lo, hi))
        return value
    return parse


def _yes_no(raw: bytes) -> bytes:
    value = raw.lower()
    if value not in (b"yes", b"no"):
        raise ValueError("argument must be 'yes' or 'no'")
    return value


def _enum(*names: bytes):
    def parse(raw: bytes) -> bytes:
        value = raw.lower()
        if value not in names:
            raise ValueError("argument(s) must be one of the following: %s"
                             % ", ".join(n.decode() for n in names))
        return value
    return parse


def _save(raw: bytes) -> bytes:
    """config.c setConfigSaveOption: "" or pairs <seconds >= 1> <changes >= 0>."""
    args = raw.split()
    if len(args) % 2:
        raise ValueError("Invalid save parameters")
    out = []
    for j, a in enumerate(args):
        try:
            v = int(a, 10)
        except ValueError:
            raise ValueError("Invalid save parameters") from None
        if not a.lstrip(b"+-").isdigit() or (j % 2 == 0 and v < 1) or (j % 2 == 1 and v < 0):
            raise ValueError("Invalid save parameters")
        out.append(b"%d" % v)
    return b" ".join(out)


PARSERS = {
    b"proto-max-bulk-len": _ranged(_memory_value, _NOT_MEMORY, 1 << 20, _LONG_MAX),
    b"client-query-buffer-limit": _ranged(_memory_value, _NOT_MEMORY, 1 << 20, _LONG_MAX),
    b"maxclients": _ranged(string2ll, "argument couldn't be parsed into an integer", 1, _UINT_MAX),
    b"save": _save,
    b"appendonly": _yes_no,
    b"appendfsync": _enum(b"everysec", b"always", b"no"),
    b"lazyfree-lazy-user-flush": _yes_no,
}

DEFAULTS = {b"save": b"", b"appendonly": b"no", b"appendfsync": b"everysec",
            b"lazyfree-lazy-user-flush": b"no"}


def _set_parser_limits(server) -> None:
    lim = server.limits
    for c in list(server.clients.values()):
        p = c.parser
        if p is None:
            continue
        p.proto_max_bulk_len = lim.proto_max_bulk_len
        p.query_buffer_limit = lim.query_buffer_limit
        p.authenticated = p.authenticated          # recomputes the effective limits


def apply_node_settings(server, pairs) -> None:
    """Set validated (name, value) pairs on this node."""
    lim = server.limits
    parser_changed = False
    for name, value in pairs:
        if name == b"proto-max-bulk-len":
            lim.proto_max_bulk_len = value
            parser_changed = True
        elif name == b"client-query-buffer-limit":
            lim.query_buffer_limit = value
            parser_changed = True
        elif name == b"maxclients":
            lim.max_clients = value
        else:
            server.node_settings[name] = value
    if parser_changed:
        _set_parser_limits(server)


def node_values(server) -> dict:
    lim = server.limits
    out = {b"proto-max-bulk-len": lim.proto_max_bulk_len,
           b"client-query-buffer-limit": lim.query_buffer_limit,
           b"maxclients": lim.max_clients}
    out.update(DEFAULTS)
    out.update(server.node_settings)
    return out
