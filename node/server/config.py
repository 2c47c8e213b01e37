"""xraft-node's configuration: command-line flags, optionally over a TOML file.

    xraft-node --id N --cluster-id ID --data-dir DIR --grpc HOST:PORT --resp HOST:PORT
               --peers 1=GRPCHOST:PORT,2=...,3=...      gRPC addresses of all initial voters, self included
               [--resp-peers 1=HOST:PORT,...]           RESP addresses (for -MOVED / CLUSTER SLOTS)
               [--secret-file F]                        else $XRAFT_CLUSTER_SECRET; no secret, no start
               [--initial-cluster-state new|existing]   `new` only on a founding node's first start
               [--config node.toml]                     same keys as the flags; flags override
               [--fsync always|batch|never] [--requirepass P --token-file F]
               [--tls-cert F --tls-key F --tls-ca F [--tls-require-client-cert]]
               [--tick-ms 100] [--election-ticks 10] [--snapshot-entries 10000]
               [--log-level warning] [--log-json]
               [--groups 1]                             data Raft groups the 16384 slots are split over
               [--metrics HOST:PORT]                    Prometheus metrics at /metrics (server/metrics.py)
               [--move-timeout-s 60] [--pause-moves]     slot moves this node drives as metadata leader
               [--join SEED_GRPC]                       a NEW node of a running cluster (instead of --peers):
                                                        the map comes from the seed; it waits to be added
                                                        (`xraftctl node add`); docs/sharding.md "Membership"
               [--no-quiesce]                           idle groups keep heartbeating (node/raft/quiesce.py)

TOML keys are the flag names without the dashes, `-` or `_` alike
(`cluster-id` or `cluster_id`). `peers` / `resp-peers` take the flag's string
form or a table (`[peers]` with `1 = "127.0.0.1:7001"`).

Bootstrapping (--initial-cluster-state, as etcd's flag of that name): a
node founds a cluster, i.e. writes --peers as the first voters into an empty
data dir, only when started with `new`. With `existing` (the default) an
empty data dir is refused: a node that lost its disk must not come back as
a voter with no log (it would forget votes and committed entries). `new` on
a data dir that already holds this node's state is ignored, so a supervisor
may keep passing it; see node/server/data_dir.py.

Authentication: --requirepass (RESP AUTH) needs --token-file (the gRPC client
API's bearer token) too. Execute over gRPC runs the same commands as RESP,
CONFIG SET included, on the port peers must reach, so a password on RESP alone
would leave the same commands open next to it. A node refuses to start with
one and not the other rather than inventing a token the operator never sees.
Without either, both APIs are open, and node_main says so at WARNING.

Precedence: built-in defaults < TOML < flags. Everything is validated here,
before a single file is opened, so a typo is one clear line on stderr and
exit status 2 instead of a half-started node.

TLS: one port serves the client API and the peers, so by default callers need
only the CA (SDK clients have no certificate) and peers are authenticated by
the HMAC Hello of the shared secret; --tls-require-client-cert makes the port
mutual TLS (every SDK client then needs a CA-signed certificate too). See
grpc_transport's module doc for the trade-off.
"""
from __future__ import annotations

import argparse
import ipaddress
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from typing import Optional

from ..cluster.slot_map import MAX_NODE_ID

FSYNC_MODES = ("always", "batch", "never")
CLUSTER_STATES = ("new", "existing")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
MAX_NODES = 64                 # voters in one group; Raft beyond ~7 is unusual, 64 is a sanity bound
MAX_GROUPS = 1024             # data groups per cluster (each holds a WAL and a driver on every replica)
MAX_CONFIG_BYTES = 1 << 20     # a node.toml larger than this is not a config file


class ConfigError(ValueError):
    """The configuration is unusable; the message says which setting and why."""


@dataclass(frozen=True)
class NodeAddresses:
    """Where clients reach one node: its gRPC and RESP listeners."""
    grpc: str
    resp: Optional[str] = None


@dataclass(frozen=True)
class NodeConfig:
    id: int
    cluster_id: str
    data_dir: str
    grpc: str                                  # listen address of the gRPC server (clients + peers)
    resp: str                                  # listen address of the RESP server
    peers: dict = field(default_factory=dict)  # node id -> gRPC address, self included
    resp_peers: dict = field(default_factory=dict)  # node id -> RESP address (may omit nodes)
    secret_file: Optional[str] = None
    initial_cluster_state: str = "existing"    # "new": may bootstrap an empty data dir (module doc)
    fsync: str = "always"
    requirepass: Optional[str] = None
    token_file: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_require_client_cert: bool = False      # mutual TLS on the shared gRPC port (module doc)
    tick_ms: int = 100
    election_ticks: int = 10
    snapshot_entries: int = 10_000
    client_memory_bytes: int = 1 << 30         # node-wide bytes of client requests (server/client_memory.py)
    log_level: str = "warning"
    log_json: bool = False
    # Data groups of a new cluster (placement.initial_layout): fixed at the founding start and
    # kept in DATA/slot-map.json; a later start with another value is refused (slot_map_store.py).
    groups: int = 1
    # Prometheus metrics listen address (server/metrics.py); None: no metrics endpoint.
    metrics: Optional[str] = None
    # Slot moves (move_reconciler.py): a move not decided within this many seconds of the
    # metadata leader first seeing it is aborted; pause_moves: this node drives none.
    move_timeout_s: int = 60
    pause_moves: bool = False
    # A node joining a running cluster: the seed's gRPC address (node_join.py); None: a founding node.
    join: Optional[str] = None
    # Idle groups stop ticking and heartbeating (node/raft/quiesce.py, runtime/liveness.py);
    # no_quiesce keeps every group heartbeating every tick, as before.
    no_quiesce: bool = False

    def addresses(self) -> dict:
        """node id -> NodeAddresses, for redirects and CLUSTER SLOTS. This
        node's RESP address is its --resp unless --resp-peers names another
        (an advertised address, e.g. when listening on 0.0.0.0)."""
        out = {}
        for nid, grpc in self.peers.items():
            resp = self.resp_peers.get(nid)
            if resp is None and nid == self.id:
                resp = self.resp
            out[nid] = NodeAddresses(grpc, resp)
        return out

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


_DEFAULTS = {f.name: (None if f.default is MISSING else f.default) for f in fields(NodeConfig)}
_REQUIRED = ("id", "cluster_id", "data_dir", "grpc", "resp", "peers")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xraft-node",
        description="One xraft node: Redis Streams replicated by Raft (gRPC + RESP front ends).")
    # Every default is None: "not given", so the TOML value (or the built-in default) shows through.
    p.add_argument("--config", metavar="FILE", help="TOML file with the same keys as the flags")
    p.add_argument("--id", type=int, help="this node's id (> 0), one of --peers")
    p.add_argument("--cluster-id", help="the cluster's name; peers of another cluster are refused")
    p.add_argument("--data-dir", help="WAL and snapshots; created on first start")
    p.add_argument("--grpc", metavar="HOST:PORT", help="gRPC listen address (client API + peers)")
    p.add_argument("--resp", metavar="HOST:PORT", help="RESP (redis protocol) listen address")
    p.add_argument("--peers", metavar="1=HOST:PORT,...", help="gRPC addresses of all initial voters")
    p.add_argument("--resp-peers", metavar="1=HOST:PORT,...", help="RESP addresses of the voters")
    p.add_argument("--secret-file", metavar="FILE", help="shared peer secret (else $XRAFT_CLUSTER_SECRET)")
    p.add_argument("--initial-cluster-state", choices=CLUSTER_STATES,
                   help="'new': this is a founding node of a new cluster; on its first start it writes "
                        "--peers as the initial voters into its empty data dir (ignored when the dir "
                        "already holds this node's state). 'existing' (default): the data dir must hold "
                        "this node's state; an empty one is refused, since a node that lost its disk must "
                        "rejoin through a membership change, not vote with no log")
    p.add_argument("--fsync", choices=FSYNC_MODES,
                   help="WAL fsync policy (default always). always: fsync before any write is "
                        "acknowledged (durable). batch: fsync at most every 10 ms (or per 1 MiB); "
                        "writes are acknowledged before their fsync, so a power cut can lose the "
                        "last ~10 ms (a process crash loses nothing). never: no fsync at all "
                        "(tests, benchmarks)")
    p.add_argument("--requirepass", metavar="P",
                   help="RESP password (AUTH); needs --token-file too, or the gRPC client API "
                        "would serve the same commands without it")
    p.add_argument("--token-file", metavar="FILE", help="bearer token file for the gRPC client API")
    p.add_argument("--tls-cert", metavar="FILE")
    p.add_argument("--tls-key", metavar="FILE")
    p.add_argument("--tls-ca", metavar="FILE")
    p.add_argument("--tls-require-client-cert", action="store_true", default=None,
                   help="mutual TLS: every gRPC caller (SDK clients too) needs a certificate "
                        "signed by --tls-ca (default: only the CA is needed; peers are "
                        "authenticated by the shared secret)")
    p.add_argument("--tick-ms", type=int, help="Raft tick interval (default 100)")
    p.add_argument("--election-ticks", type=int, help="ticks without a leader before an election (default 10)")
    p.add_argument("--snapshot-entries", type=int, help="applied entries between snapshots (default 10000)")
    p.add_argument("--client-memory-bytes", type=int,
                   help="bytes of client requests held at once, node-wide (default 1 GiB): RESP stops "
                        "reading, gRPC answers BUSY (retriable) beyond it")
    p.add_argument("--groups", type=int,
                   help="data Raft groups the 16384 slots are split over (default 1). Fixed when the "
                        "cluster is founded: every founding node must get the same value, and a later "
                        "start with another one is refused")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (default: none)")
    p.add_argument("--move-timeout-s", type=int,
                   help="a slot move not decided within this many seconds is aborted (default 60)")
    p.add_argument("--pause-moves", action="store_true", default=None,
                   help="while this node leads the metadata group it drives no slot move (a move waits "
                        "in the map until another leader drives it or an operator aborts it)")
    p.add_argument("--join", metavar="SEED_GRPC",
                   help="join a running cluster through this node (instead of --peers): fetch its slot map "
                        "and wait to be added with `xraftctl node add`")
    p.add_argument("--no-quiesce", action="store_true", default=None,
                   help="idle Raft groups keep heartbeating every tick instead of going quiet "
                        "(default: they quiesce; followers then watch the leader's node)")
    p.add_argument("--log-level", choices=LOG_LEVELS, help="default warning: quiet")
    p.add_argument("--log-json", action="store_true", default=None, help="one JSON object per log line")
    return p


def parse_args(argv=None) -> NodeConfig:
    """The validated config from the command line (and --config). Raises ConfigError."""
    ns = _parser().parse_args(argv)
    values = dict(_DEFAULTS)
    if ns.config:
        values.update(load_toml(ns.config))
    for name, value in vars(ns).items():
        if name != "config" and value is not None:
            values[name] = value
    return build(values)


def load_toml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path!r} is over {MAX_CONFIG_BYTES} bytes")
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path!r}: {exc}") from None
    known = {f.name for f in fields(NodeConfig)}
    out = {}
    for key, value in doc.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"config file {path!r}: unknown key {key!r}")
        out[name] = value
    return out


def build(values: dict) -> NodeConfig:
    if values.get("join") and values.get("peers") in (None, "", {}) and values.get("id") and values.get("grpc"):
        # A joining node knows only itself; the others come from the seed's map (node_join.py).
        values = {**values, "peers": {int(values["id"]): str(values["grpc"])}}
    missing = [n for n in _REQUIRED if values.get(n) in (None, "", {})]
    if missing:
        raise ConfigError("missing required setting(s): " + ", ".join("--" + n.replace("_", "-") for n in missing))
    v = dict(values)
    # A data group's replica ids keep the node id in their low bits (cluster/slot_map.py).
    v["id"] = _int(v["id"], "id", 1, MAX_NODE_ID)
    v["cluster_id"] = str(v["cluster_id"])
    if not 1 <= len(v["cluster_id"].encode()) <= 128 or "\x00" in v["cluster_id"]:
        raise ConfigError("--cluster-id must be 1..128 bytes without NUL")
    v["data_dir"] = str(v["data_dir"])
    v["grpc"] = check_address(v["grpc"], "--grpc")
    v["resp"] = check_address(v["resp"], "--resp")
    if v.get("join") is not None:
        v["join"] = check_address(v["join"], "--join")
        if v["initial_cluster_state"] == "new":
            raise ConfigError("--join adds a node to a running cluster; --initial-cluster-state new founds one")
    if v.get("metrics") is not None:
        v["metrics"] = check_address(v["metrics"], "--metrics")
    v["peers"] = parse_peers(v["peers"], "--peers")
    v["resp_peers"] = parse_peers(v.get("resp_peers") or {}, "--resp-peers")
    if v["id"] not in v["peers"]:
        raise ConfigError(f"--peers must include this node (id {v['id']})")
    extra = set(v["resp_peers"]) - set(v["peers"])
    if extra:
        raise ConfigError(f"--resp-peers names node(s) {sorted(extra)} that are not in --peers")
    if str(v["initial_cluster_state"]) not in CLUSTER_STATES:
        raise ConfigError(f"--initial-cluster-state must be one of {', '.join(CLUSTER_STATES)}")
    v["initial_cluster_state"] = str(v["initial_cluster_state"])
    if v.get("requirepass") is not None and v.get("token_file") is None:
        raise ConfigError("--requirepass protects RESP only: the gRPC client API on --grpc (whose Execute "
                          "runs the same commands, CONFIG SET included) would stay open without a "
                          "password. Give --token-file too (the bearer token gRPC clients send)")
    if str(v["fsync"]) not in FSYNC_MODES:
        raise ConfigError(f"--fsync must be one of {', '.join(FSYNC_MODES)}")
    if str(v["log_level"]).lower() not in LOG_LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    v["log_level"] = str(v["log_level"]).lower()
    v["log_json"] = bool(v["log_json"])
    v["tick_ms"] = _int(v["tick_ms"], "tick-ms", 1, 60_000)
    # Heartbeats go every tick; an election timeout of one tick would elect on every hiccup.
    v["election_ticks"] = _int(v["election_ticks"], "election-ticks", 3, 10_000)
    v["snapshot_entries"] = _int(v["snapshot_entries"], "snapshot-entries", 1, 1 << 40)
    v["groups"] = _int(v["groups"], "groups", 1, MAX_GROUPS)
    v["move_timeout_s"] = _int(v["move_timeout_s"], "move-timeout-s", 1, 86_400)
    if not isinstance(v["pause_moves"], bool):
        raise ConfigError("--pause-moves is a flag (true/false in TOML)")
    if not isinstance(v["no_quiesce"], bool):
        raise ConfigError("--no-quiesce is a flag (true/false in TOML)")
    v["client_memory_bytes"] = _int(v["client_memory_bytes"], "client-memory-bytes", 1 << 20, 1 << 50)
    tls = [v.get(k) for k in ("tls_cert", "tls_key", "tls_ca")]
    if any(tls) and not all(tls):
        raise ConfigError("--tls-cert, --tls-key and --tls-ca go together")
    if not isinstance(v["tls_require_client_cert"], bool):
        raise ConfigError("--tls-require-client-cert is a flag (true/false in TOML)")
    if v["tls_require_client_cert"] and not all(tls):
        raise ConfigError("--tls-require-client-cert needs --tls-cert, --tls-key and --tls-ca")
    for k in ("secret_file", "requirepass", "token_file", "tls_cert", "tls_key", "tls_ca"):
        if v.get(k) is not None:
            v[k] = str(v[k])
    return NodeConfig(**v)


def _int(value, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"--{name} must be an integer")
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--{name} must be an integer, not {value!r}") from None
    if not lo <= n <= hi:
        raise ConfigError(f"--{name} must be in [{lo}, {hi}], not {n}")
    return n


def check_address(address, what: str) -> str:
    """"host:port" (IPv6 as [::1]:port): a non-empty host and a port in 1..65535
    (0 is refused: peers and clients must know the port in advance)."""
    address = str(address).strip()
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what}: {address!r} is not HOST:PORT")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ConfigError(f"{what}: {address!r} has an unterminated [IPv6] host")
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ConfigError(f"{what}: {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ConfigError(f"{what}: write IPv6 hosts as [addr]:port, not {address!r}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{what}: port {port!r} of {address!r} is not in 1..65535")
    return address


def parse_peers(value, what: str) -> dict:
    """"1=h:p,2=h:p" or a TOML table {1: "h:p"} -> {1: "h:p"}."""
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            nid, sep, addr = part.partition("=")
            if not sep:
                raise ConfigError(f"{what}: {part!r} is not ID=HOST:PORT")
            items.append((nid, addr))
    out = {}
    for nid, addr in items:
        n = _int(str(nid).strip(), what.lstrip("-") + " id", 1, (1 << 63) - 1)
        if n in out:
            raise ConfigError(f"{what}: node {n} is listed twice")
        out[n] = check_address(addr, f"{what} node {n}")
    if len(out) > MAX_NODES:
        raise ConfigError(f"{what}: {len(out)} nodes (limit {MAX_NODES})")
    addrs = list(out.values())
    if len(set(addrs)) != len(addrs):
        raise ConfigError(f"{what}: two nodes share an address")
    return out
