"""Redis Cluster's view of a Raft group: CLUSTER SLOTS/SHARDS/NODES/MYID/KEYSLOT/INFO,
key extraction, and the -MOVED redirect.

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
from ..engine.command_keys import MOVABLE, command_keys  # noqa: F401 (re-exported)
from ..engine.commands import lookup
from ..engine.errors import CommandError, EngineError, wrong_arity
from ..engine.slots import key_slot
from .wire_errors import cluster_down_message, moved_message


class Verbatim(bytes):
    """A verbatim string reply: RESP3 `=<len>\\r\\ntxt:<data>`, RESP2 a bulk (INFO, CLUSTER NODES)."""


def encode_verbatim(data: bytes, protocol: int) -> bytes:
    if protocol == 3:
        return b"=%d\r\ntxt:%b\r\n" % (len(data) + 4, data)
    return b"$%d\r\n%b\r\n" % (len(data), data)


# -- keys -------------------------------------------------------------------------

def redirect(backend, keys):
    """The -MOVED/-CLUSTERDOWN text if this node does not serve keys[0]'s slot, else None.
    One group serves every slot, so the first key decides for all of them."""
    if not keys:
        return None
    slot = key_slot(bytes(keys[0]))
    target = backend.redirect_for(slot)
    if target is None:
        return None
    return moved_message(slot, target) if target else cluster_down_message()


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

_ARITY = {b"slots": 2, b"shards": 2, b"nodes": 2, b"myid": 2, b"info": 2, b"keyslot": 3}


def cluster_command(backend, argv, protocol: int):
    """The reply to CLUSTER <sub> ...; raises EngineError with redis's texts."""
    if len(argv) < 2:
        raise wrong_arity("cluster")
    sub = bytes(argv[1]).lower()
    arity = _ARITY.get(sub)
    if arity is None:
        raise CommandError("ERR unknown subcommand '%s'. Try CLUSTER HELP."
                           % bytes(argv[1])[:128].decode("utf-8", "replace"))
    if len(argv) != arity:
        raise wrong_arity("cluster|" + sub.decode())
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
            head = "%s %s:%d@%d %s %s 0 0 0 connected" % (
                n.node_id, n.host, n.port, n.port + 10000, flags,
                "-" if n.role == "master" else master.node_id)
            lines.append(head + (" " + ranges if n.role == "master" and ranges else "") + "\n")
    return "".join(lines).encode()


def cluster_info(backend) -> bytes:
    shards = backend.shards()
    assigned = sum(b - a + 1 for s in shards for a, b in s.slot_ranges)
    known = sum(len(s.nodes) for s in shards)
    fields = [
        ("cluster_state", "ok" if assigned == 16384 else "fail"),
        ("cluster_slots_assigned", assigned),
        ("cluster_slots_ok", assigned),
        ("cluster_slots_pfail", 0),
        ("cluster_slots_fail", 0),
        ("cluster_known_nodes", known),
        ("cluster_size", len(shards)),
        ("cluster_current_epoch", 0),
        ("cluster_my_epoch", 0),
    ]
    return "".join("%s:%s\r\n" % kv for kv in fields).encode()
