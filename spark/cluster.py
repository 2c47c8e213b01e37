"""What the data source asks of the cluster, through the SDK (xraft.client.sync).

Every call goes through the SDK, which routes by slot to the leader of the
key's Raft group and retries NOT_LEADER / MOVED / UNAVAILABLE / TRYAGAIN /
CLUSTERDOWN until its deadline (the `timeout` option): a leader failover or a
slot move during a query is absorbed here, not seen by Spark. An error the SDK
cannot absorb (deadline passed, wrong type, no such group) is raised as the
SDK's typed XRaftError and fails the Spark task with it.
"""
import fnmatch

from xraft.client import sync
from xraft.client.errors import NotSupportedError, XRaftError
from xraft.client.slots import key_slot
from xraft.client.types import MAX_U64, StreamID

from .options import MAX_STREAMS, Conn

SCAN_COUNT = 1000                    # SCAN's COUNT hint per call
MAX_ROUTE_PROBES = 1 << 20           # candidate keys tried to find one in a group's slots
MAX_ID = StreamID(MAX_U64, MAX_U64)


class TooManyStreamsError(XRaftError):
    """A pattern matched more streams than one query reads (MAX_STREAMS)."""


def open_client(conn: Conn) -> sync.Client:
    return sync.Client(list(conn.seeds), token=conn.token, timeout=conn.timeout,
                       follower_reads=conn.follower_reads)


def routing_keys(client) -> list:
    """One key per Raft group (any key in the group's slots), so a keyless
    command can be sent to each group's leader; [None] on a cluster without
    ClusterLayout (one group: the SDK sends keyless calls to its leader)."""
    try:
        layout = client.cluster_layout()
    except NotSupportedError:
        return [None]
    owner = {}
    for g in layout.groups:
        for lo, hi in g.slots:
            owner[(lo, hi)] = g.id
    keys, wanted = {}, {g.id for g in layout.groups}
    for i in range(MAX_ROUTE_PROBES):
        if len(keys) == len(wanted):
            break
        key = b"xraft-spark-route-%d" % i
        slot = key_slot(key)
        gid = next(g for (lo, hi), g in owner.items() if lo <= slot <= hi)
        keys.setdefault(gid, key)
    return list(keys.values())


def scan_streams(client, pattern: str) -> set:
    """Stream keys matching a glob `pattern`, over every Raft group: SCAN
    MATCH ... TYPE stream at each group's leader (a node answers SCAN for the
    groups it leads; a key seen twice is counted once)."""
    found = set()
    for route in routing_keys(client):
        cursor = b"0"
        while True:
            reply = client.execute("SCAN", cursor, "MATCH", pattern, "COUNT", str(SCAN_COUNT), "TYPE", "stream",
                                   write=False, key=route)
            cursor, keys = reply[0], reply[1]
            found.update(k.decode() if isinstance(k, bytes) else k for k in keys)
            if len(found) > MAX_STREAMS:
                raise TooManyStreamsError(f"pattern {pattern!r} matches more than {MAX_STREAMS} streams")
            if cursor in (b"0", "0", 0):
                break
    return {k for k in found if fnmatch.fnmatchcase(k, pattern)}


def resolve_streams(client, names, patterns) -> list:
    """The streams a query reads, sorted: the names given, and every stream
    matching one of the patterns now."""
    out = set(names)
    for p in patterns:
        out |= scan_streams(client, p)
    return sorted(out)


def id_bounds(client, stream: str):
    """(first ID, last ID, length) of a stream; None if it is empty or missing."""
    try:
        info = client.xinfo_stream(stream)
    except XRaftError as e:
        if "no such key" in str(e).lower():
            return None
        raise
    if not info.length or info.first_entry is None:
        return None
    return info.first_entry.id, info.last_entry.id, info.length


def last_id(client, stream: str) -> StreamID | None:
    """The ID of a stream's last entry; None if it is empty or missing."""
    entries = client.xrevrange(stream, "+", "-", count=1)
    return entries[0].id if entries else None


def read_range(client, stream: str, lo: StreamID, hi: StreamID, page: int):
    """Pages of the entries lo <= id <= hi, in order (XRANGE ... COUNT page)."""
    start = str(lo)
    while True:
        entries = client.xrange(stream, start, str(hi), count=page)
        if entries:
            yield entries
        if len(entries) < page:
            return
        start = "(" + str(entries[-1].id)


def slot_of(stream: str) -> int:
    return key_slot(stream.encode())
