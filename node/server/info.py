"""Introspection replies: INFO, COMMAND (COUNT/INFO/DOCS/GETKEYS/LIST) and CONFIG GET.

INFO prints redis 7.0's text layout ("# Section\\r\\nname:value\\r\\n",
sections separated by an empty line; RESP3 sends it as a verbatim "txt"
string) with the sections a client or an operator reads: server, clients
(blocked_clients included), replication (a follower is a replica of the
leader), keyspace, cluster, and "# Raft" filled by the backend.

COMMAND describes every command this server answers in redis 7.0's ten-field
shape (name, arity, flags, first key, last key, step, ACL categories, tips,
key specs, subcommands). redis-py's RedisCluster reads the key positions and
the `movablekeys` flag from it (and asks COMMAND GETKEYS for those), so the
positions must be right; ACL categories, tips and key specs are left empty.
"""
import os
import platform
import time

from ..engine.commands import BLOCKING, COMMANDS, READONLY, WRITE, _load_families
from ..engine.errors import CommandError, wrong_arity
from ..engine.cmd_keys import glob_match
from . import gc_policy
from .cluster_cmds import MOVABLE, getkeys
from .node_config import node_values

REDIS_VERSION = "7.0.15"        # what clients see: the redis semantics we implement

# Commands the server itself answers (not in the engine table): arity and flags.
SERVER_COMMANDS = {
    "auth": (-2, ("noscript", "loading", "stale", "fast", "no_auth", "allow_busy")),
    "hello": (-1, ("noscript", "loading", "stale", "fast", "no_auth", "allow_busy")),
    "client": (-2, ("noscript", "loading", "stale")),
    "select": (2, ("loading", "stale", "fast")),
    "quit": (-1, ("noscript", "loading", "stale", "fast", "no_auth", "allow_busy")),
    "reset": (1, ("noscript", "loading", "stale", "fast", "no_auth", "allow_busy")),
    "multi": (1, ("noscript", "loading", "stale", "fast", "allow_busy")),
    "exec": (1, ("noscript", "loading", "stale", "skip_slowlog")),
    "discard": (1, ("noscript", "loading", "stale", "fast", "allow_busy")),
    "watch": (-2, ("noscript", "loading", "stale", "fast", "allow_busy")),
    "unwatch": (1, ("noscript", "loading", "stale", "fast", "allow_busy")),
    "info": (-1, ("loading", "stale")),
    "config": (-2, ("admin", "noscript", "loading", "stale")),
    "command": (-1, ("loading", "stale")),
    "cluster": (-2, ()),
    "asking": (1, ("fast",)),
    "readonly": (1, ("loading", "stale", "fast")),
    "readwrite": (1, ("loading", "stale", "fast")),
    "function": (-2, ()),
    "debug": (-2, ("admin", "noscript", "loading", "stale")),
}

_GROUPS = {
    "connection": ("auth", "hello", "client", "select", "quit", "reset", "ping", "echo"),
    "transactions": ("multi", "exec", "discard", "watch", "unwatch"),
    "server": ("info", "config", "command", "dbsize", "flushall", "flushdb", "debug"),
    "scripting": ("function",),
    "cluster": ("asking", "cluster", "readonly", "readwrite"),
    "string": ("get", "set"),
    "generic": ("del", "exists", "keys", "object", "rename", "renamenx", "scan", "type", "unlink"),
}
_GROUP_OF = {name: group for group, names in _GROUPS.items() for name in names}


def _group(name: str) -> str:
    if name in _GROUP_OF:
        return _GROUP_OF[name]
    return "stream" if name.startswith("x") else "list"


def _entry(name: str) -> list:
    spec = COMMANDS.get(name)
    if spec is None:
        arity, flags = SERVER_COMMANDS[name]
        return [name.encode(), arity, [f.encode() for f in flags], 0, 0, 0, [], [], [], []]
    flags = []
    if WRITE in spec.flags:
        flags.append(b"write")
    if READONLY in spec.flags:
        flags.append(b"readonly")
    if BLOCKING in spec.flags:
        flags.append(b"blocking")
    first, last, step = spec.first_key, spec.last_key, spec.step
    if name in MOVABLE:
        flags.append(b"movablekeys")
        first = last = step = 0
    return [name.encode(), spec.arity, flags, first, last, step, [], [], [], []]


def all_names() -> list:
    _load_families()
    return sorted(set(COMMANDS) | set(SERVER_COMMANDS))


def command_command(argv):
    """COMMAND [COUNT | INFO name... | DOCS [name...] | GETKEYS cmd args... | LIST]."""
    names = all_names()
    if len(argv) == 1:
        return [_entry(n) for n in names]
    sub = bytes(argv[1]).lower()
    if sub == b"count":
        if len(argv) != 2:
            raise wrong_arity("command|count")
        return len(names)
    if sub == b"list":
        # FILTERBY is not supported: the list is short.
        if len(argv) != 2:
            raise CommandError("ERR syntax error")
        return [n.encode() for n in names]
    if sub == b"info":
        known = set(names)
        wanted = [bytes(a).decode("latin-1").lower() for a in argv[2:]] or names
        return [_entry(n) if n in known else None for n in wanted]
    if sub == b"docs":
        known = set(names)
        wanted = [bytes(a).decode("latin-1").lower() for a in argv[2:]] or names
        return {n.encode(): {b"summary": b"", b"since": b"1.0.0", b"group": _group(n).encode(),
                             b"complexity": b""} for n in wanted if n in known}
    if sub == b"getkeys":
        if len(argv) < 3:
            raise wrong_arity("command|getkeys")
        return getkeys([bytes(a) for a in argv[2:]])
    raise CommandError("ERR unknown subcommand '%s'. Try COMMAND HELP."
                       % bytes(argv[1])[:128].decode("utf-8", "replace"))


# -- CONFIG GET -------------------------------------------------------------------

def config_values(server) -> dict:
    """Every parameter CONFIG GET can show: the engine's (replicated), the
    node's settable ones (node_config.py) and the server's read-only ones."""
    cfg = server.backend.engine_config()
    values = {
        b"stream-node-max-bytes": cfg.stream_node_max_bytes,
        b"stream-node-max-entries": cfg.stream_node_max_entries,
        b"list-max-listpack-size": cfg.list_max_listpack_size,
        b"list-max-ziplist-size": cfg.list_max_listpack_size,
        b"list-compress-depth": cfg.list_compress_depth,
        b"requirepass": server.requirepass or b"",
        b"port": server.port,
        b"bind": server.host.encode(),
        b"databases": 1,
        b"cluster-enabled": b"yes",
        b"client-output-buffer-limit": b"normal 0 %d 0 slave 0 0 0 pubsub 0 0 0"
                                       % server.limits.output_buffer_limit,
    }
    values.update(node_values(server))
    return values


def config_get(server, argv) -> dict:
    if len(argv) < 3:
        raise wrong_arity("config|get")
    values = config_values(server)
    out = {}
    for pattern in argv[2:]:
        pattern = bytes(pattern)
        for name, value in values.items():
            if name not in out and glob_match(pattern.lower(), name):
                out[name] = value if isinstance(value, bytes) else b"%d" % value
    return out


# -- INFO ----------------------------------------------------------------------------

DEFAULT_SECTIONS = ("server", "clients", "replication", "keyspace", "cluster", "raft")


def _section(title: str, fields) -> str:
    return "# %s\r\n" % title + "".join("%s:%s\r\n" % kv for kv in fields)


def info_text(server, sections, dbsize: int) -> bytes:
    """INFO's text for the requested sections (lower case; "all"/"everything"/"default")."""
    wanted = set(sections) or {"default"}
    if wanted & {"all", "everything", "default"}:
        wanted |= set(DEFAULT_SECTIONS)
    backend = server.backend
    uptime = int(time.monotonic() - server.started)
    out = []
    if "server" in wanted:
        out.append(_section("Server", [
            ("redis_version", REDIS_VERSION),
            ("redis_mode", "cluster"),
            ("xraft_node_id", backend.node_id),
            ("os", "%s %s %s" % (platform.system(), platform.release(), platform.machine())),
            ("arch_bits", 64),
            ("multiplexing_api", "asyncio"),
            ("process_id", os.getpid()),
            ("tcp_port", server.port),
            ("server_time_usec", time.time_ns() // 1000),
            ("uptime_in_seconds", uptime),
            ("uptime_in_days", uptime // 86400),
        ]))
    if "clients" in wanted:
        out.append(_section("Clients", [
            ("connected_clients", len(server.clients)),
            ("cluster_connections", 0),
            ("maxclients", server.limits.max_clients),
            ("client_recent_max_input_buffer", 0),
            ("client_recent_max_output_buffer", 0),
            ("blocked_clients", server.registry.blocked_clients),
            ("tracking_clients", 0),
            ("clients_in_timeout_table", server.registry.blocked_clients),
            ("total_connections_received", server.stats_connections),
            ("rejected_connections", server.stats_rejected),
        ]))
    if "replication" in wanted:
        fields = [("role", "master" if backend.is_leader() else "slave")]
        leader = backend.leader_address()
        if not backend.is_leader():
            host, _, port = (leader or ":").rpartition(":")
            fields += [("master_host", host), ("master_port", port),
                       ("master_link_status", "up" if leader else "down")]
        followers = [n for s in backend.shards() for n in s.nodes if n.role != "master"]
        fields.append(("connected_slaves", len(followers) if backend.is_leader() else 0))
        out.append(_section("Replication", fields))
    if "cluster" in wanted:
        out.append(_section("Cluster", [("cluster_enabled", 1)]))
    if "keyspace" in wanted:
        out.append(_section("Keyspace", [("db0", "keys=%d,expires=0,avg_ttl=0" % dbsize)] if dbsize else []))
    if "raft" in wanted:
        out.append(_section("Raft", list(backend.raft_info().items())))
    if "gc" in wanted or wanted & {"all", "everything"}:     # xraft's own section, not in the default
        out.append(_section("Gc", gc_policy.WATCH.info_fields()))
    return "\r\n".join(out).encode()
