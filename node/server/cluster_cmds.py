"""Redis Cluster's view of the node's Raft groups: CLUSTER SLOTS/SHARDS/NODES/MYID/
KEYSLOT/INFO/COUNTKEYSINSLOT/GETKEYSINSLOT, and COMMAND GETKEYS.

A redis cluster client (redis-py's RedisCluster, redis-cli -c) learns the
topology from CLUSTER SLOTS and follows -MOVED. We describe each group as one
shard: its slots, the leader as the master and the other members as replicas
(addresses and ids from the backend). A follower answers key commands with
`-MOVED <slot> <leader host:port>`, so the client's next try lands on the
leader; a follower that knows no leader answers -CLUSTERDOWN, which cluster
clients treat as "refresh the topology and retry", unlike an unknown prefix.

Reply shapes are redis 7.0.15's, checked against a cluster-enabled
redis-server (cluster.c clusterReplyMultiBulkSlots, addShardReplyForClusterShards,
clusterGenNodesDescription):

    CLUSTER SLOTS   [[start, end, [ip, port, id, {}], [replica...]...], ...]
                    (the empty metadata is *0 in RESP2, %0 in RESP3)
    CLUSTER SHARDS  [{slots: [start, end, ...], nodes: [{id, port, ip, endpoint,
                      role, replication-offset, health}, ...]}, ...]
    CLUSTER NODES   "<id> <ip>:<port>@<cport> <flags> <master|-> 0 0 0 connected <slots>\\n"...
                    (bulk in RESP2, verbatim "txt" in RESP3)
"""
from ..engine.cmd_slots import COUNT_KEYS_IN_SLOT, GET_KEYS_IN_SLOT
from ..engine.command_keys import MOVABLE, command_keys  # noqa: F401 (re-exported)
from ..engine.commands import lookup
from ..engine.errors import CommandError, EngineError, not_integer, wrong_arity
from ..engine.slots import SLOT_COUNT, key_slot
from ..engine.streamid import string2ll
from .routing import follower_read_allowed, redirect, redirect_slot  # noqa: F401 (redirect re-exported)


class Verbatim(bytes):
    """A verbatim string reply: RESP3 `=<len>\\r\\ntxt:<data>`, RESP2 a bulk (INFO, CLUSTER NODES)."""


def encode_verbatim(data: bytes, protocol: int) -> bytes:
    if protocol == 3:
        return b"=%d\r\ntxt:%b\r\n" % (len(data) + 4, data)
    return b"$%d\r\n%b\r\n" % (len(data), data)


# -- keys -------------------------------------------------------------------------
# The routing of keys (CROSSSLOT, MOVED) lives in routing.py; `redirect` is re-exported.

def getkeys(argv) -> list:
    """COMMAND GETKEYS <command> <args...>, with redis 7.0's errors."""
    try:
        spec = lookup(argv)
    except EngineError as e:
        if e.message.startswith("ERR wrong number"):
            raise CommandError("ERR Invalid number of arguments specified for command") from None
        raise CommandError("ERR Invalid command specified") from None
    keys = command_keys(spec, argv)
    if not keys:
        raise CommandError("ERR The command has no key arguments")
    return keys


# -- CLUSTER -------------------------------------------------------------------------

_ARITY = {b"slots": 2, b"shards": 2, b"nodes": 2, b"myid": 2, b"info": 2, b"keyslot": 3,
          b"countkeysinslot": 3, b"getkeysinslot": 4}


def _subcommand(argv) -> bytes:
    """CLUSTER's subcommand, lower case, after redis's unknown-subcommand and arity checks."""
    if len(argv) < 2:
        raise wrong_arity("cluster")
    sub = bytes(argv[1]).lower()
    arity = _ARITY.get(sub)
    if arity is None:
        raise CommandError("ERR unknown subcommand '%s'. Try CLUSTER HELP."
                           % bytes(argv[1])[:128].decode("utf-8", "replace"))
    if len(argv) != arity:
        raise wrong_arity("cluster|" + sub.decode())
    return sub


def _long_long(raw) -> int:
    n = string2ll(bytes(raw))
    if n is None:
        raise not_integer()
    return n


def slot_read(argv):
    """(slot, the engine's internal read argv) for COUNTKEYSINSLOT/GETKEYSINSLOT,
    checked in redis's order and with its texts (cluster.c clusterCommand); None
    for the other subcommands."""
    sub = _subcommand(argv)
    if sub == b"countkeysinslot":
        slot = _long_long(argv[2])
        if not 0 <= slot < SLOT_COUNT:
            raise CommandError("ERR Invalid slot")
        return slot, [COUNT_KEYS_IN_SLOT, b"%d" % slot]
    if sub == b"getkeysinslot":
        slot = _long_long(argv[2])
        count = _long_long(argv[3])
        if not 0 <= slot < SLOT_COUNT or count < 0:
            raise CommandError("ERR Invalid slot or number of keys")
        return slot, [GET_KEYS_IN_SLOT, b"%d" % slot, b"%d" % count]
    return None


async def cluster_reply(backend, argv, protocol: int, follower_read: bool = False):
    """The reply to CLUSTER <sub> ...; raises EngineError with redis's texts.
    COUNTKEYSINSLOT/GETKEYSINSLOT read the keys of the slot where its group
    applies them (a ReadIndex read; -MOVED when another node serves the slot,
    unless `follower_read`: READONLY, served here, maybe stale)."""
    read = slot_read(argv)
    if read is None:
        return cluster_command(backend, argv, protocol)
    slot, read_argv = read
    moved = redirect_slot(backend, slot)
    if moved is not None and not (follower_read and follower_read_allowed(backend, slot)):
        raise CommandError(moved)
    return await backend.read(read_argv, moved is None)


def cluster_command(backend, argv, protocol: int):
    """The reply to the CLUSTER subcommands answered from the topology (not the
    keys); raises EngineError with redis's texts."""
    sub = _subcommand(argv)
    if sub in (b"countkeysinslot", b"getkeysinslot"):
        raise CommandError("ERR xraft: CLUSTER %s reads keys: use cluster_reply" % sub.decode().upper())
    if sub == b"keyslot":
        return key_slot(bytes(argv[2]))
    if sub == b"myid":
        return backend.node_id.encode()
    if sub == b"slots":
        return cluster_slots(backend)
    if sub == b"shards":
        return cluster_shards(backend)
    if sub == b"nodes":
        return Verbatim(cluster_nodes(backend))
    return Verbatim(cluster_info(backend))


def _node_entry(node) -> list:
    return [node.host.encode(), node.port, node.node_id.encode(), {}]


def cluster_slots(backend) -> list:
    out = []
    for shard in backend.shards():
        nodes = [_node_entry(n) for n in shard.nodes]
        for first, last in shard.slot_ranges:
            out.append([first, last] + nodes)
    return out


def cluster_shards(backend) -> list:
    out = []
    for shard in backend.shards():
        slots = []
        for first, last in shard.slot_ranges:
            slots += [first, last]
        nodes = [{
            b"id": n.node_id.encode(),
            b"port": n.port,
            b"ip": n.host.encode(),
            b"endpoint": n.host.encode(),
            b"role": b"master" if n.role == "master" else b"replica",
            b"replication-offset": n.replication_offset,
            b"health": b"online" if n.healthy else b"fail",
        } for n in shard.nodes]
        out.append({b"slots": slots, b"nodes": nodes})
    return out


def cluster_nodes(backend) -> bytes:
    lines = []
    for shard in backend.shards():
        master = shard.nodes[0]
        ranges = " ".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in shard.slot_ranges)
        for n in shard.nodes:
            flags = ("myself," if n.myself else "") + n.role
            if not n.healthy:
                flags += ",fail"
            # config-epoch: the slot map's epoch (every shard of one map shares it)
            head = "%s %s:%d@%d %s %s 0 0 %d connected" % (
                n.node_id, n.host, n.port, n.port + 10000, flags,
                "-" if n.role == "master" else master.node_id, shard.epoch)
            lines.append(head + (" " + ranges if n.role == "master" and ranges else "") + "\n")
    return "".join(lines).encode()


def cluster_info(backend) -> bytes:
    """CLUSTER INFO's fields (redis 7.0 clusterGenNodesSlotsInfo/clusterCommand "info"),
    every figure counted from backend.shards(), so they hold for any number of
    groups: a node in several groups is one known node; cluster_size counts the
    distinct masters serving a slot, as redis does; slots of a shard whose master
    is unhealthy are "fail". Epochs: a shard's `epoch` (the slot map's, once the
    backend gives one; 0 until then, as a fresh redis cluster node has)."""
    shards = backend.shards()
    assigned = ok = failed = 0
    known, masters = set(), set()
    current_epoch = my_epoch = 0
    for shard in shards:
        count = sum(b - a + 1 for a, b in shard.slot_ranges)
        assigned += count
        master = shard.nodes[0] if shard.nodes else None
        if master is not None and master.healthy:
            ok += count
        else:
            failed += count
        if master is not None and count:
            masters.add(master.node_id)
        known.update(n.node_id for n in shard.nodes)
        epoch = getattr(shard, "epoch", 0)
        current_epoch = max(current_epoch, epoch)
        if any(n.myself for n in shard.nodes):
            my_epoch = max(my_epoch, epoch)
    fields = [
        ("cluster_state", "ok" if ok == SLOT_COUNT else "fail"),
        ("cluster_slots_assigned", assigned),
        ("cluster_slots_ok", ok),
        ("cluster_slots_pfail", 0),
        ("cluster_slots_fail", failed),
        ("cluster_known_nodes", max(len(known), 1)),        # redis always knows itself
        ("cluster_size", len(masters)),
        ("cluster_current_epoch", current_epoch),
        ("cluster_my_epoch", my_epoch),
        ("cluster_stats_messages_sent", 0),
        ("cluster_stats_messages_received", 0),
        ("total_cluster_links_buffer_limit_exceeded", 0),
    ]
    return "".join("%s:%s\r\n" % kv for kv in fields).encode()
