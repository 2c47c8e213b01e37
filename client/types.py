"""Typed results of the xraft client, and the conversions to and from protobuf.

Results are frozen dataclasses; IDs are `StreamID(ms, seq)` (a NamedTuple,
so it sorts and compares like redis IDs and prints as "ms-seq"). Every
protobuf message the SDK reads or writes goes through this module once.
"""
from dataclasses import dataclass, field
from typing import NamedTuple

from xraft.proto.v1 import client_pb2 as pb

MAX_U64 = (1 << 64) - 1


class StreamID(NamedTuple):
    ms: int
    seq: int

    def __str__(self):
        return f"{self.ms}-{self.seq}"

    @classmethod
    def parse(cls, text) -> "StreamID":
        """"1-2", b"1-2", "5" (= 5-0), (1, 2) or a StreamID."""
        if isinstance(text, StreamID):
            return text
        if isinstance(text, tuple):
            return cls(int(text[0]), int(text[1]))
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("ascii")
        ms, _, seq = str(text).partition("-")
        sid = cls(int(ms), int(seq) if seq else 0)
        if not (0 <= sid.ms <= MAX_U64 and 0 <= sid.seq <= MAX_U64):
            raise ValueError(f"stream ID out of range: {text!r}")
        return sid

    def to_pb(self) -> pb.StreamId:
        return pb.StreamId(ms=self.ms, seq=self.seq)

    @classmethod
    def from_pb(cls, m: pb.StreamId) -> "StreamID":
        return cls(m.ms, m.seq)


Fields = tuple  # of (name: bytes, value: bytes) pairs, in XADD order, duplicates kept


@dataclass(frozen=True)
class StreamEntry:
    id: StreamID
    fields: Fields = ()
    deleted: bool = False      # XREADGROUP history: delivered, then XDELeted

    @property
    def fields_dict(self) -> dict:
        """fields as a dict (a repeated name keeps its last value)."""
        return dict(self.fields)


@dataclass(frozen=True)
class PendingSummary:
    count: int
    min_id: StreamID | None
    max_id: StreamID | None
    consumers: dict            # consumer name -> pending count


@dataclass(frozen=True)
class PendingEntry:
    id: StreamID
    consumer: bytes
    idle_ms: int
    delivery_count: int


@dataclass(frozen=True)
class ClaimResult:
    entries: list              # of StreamEntry (without JUSTID)
    ids: list                  # of StreamID (with JUSTID)


@dataclass(frozen=True)
class AutoClaimResult:
    next_start: StreamID       # 0-0 when the scan is complete
    entries: list
    ids: list
    deleted_ids: list


@dataclass(frozen=True)
class PelEntry:
    id: StreamID
    consumer: bytes            # empty inside a consumer's own PEL
    delivery_time_ms: int
    delivery_count: int


@dataclass(frozen=True)
class ConsumerFull:
    name: bytes
    seen_time_ms: int
    pel_count: int
    pel: list


@dataclass(frozen=True)
class GroupFull:
    name: bytes
    last_delivered_id: StreamID
    entries_read: int | None
    lag: int | None
    pel_count: int
    pel: list
    consumers: list


@dataclass(frozen=True)
class StreamInfo:
    length: int
    radix_tree_keys: int
    radix_tree_nodes: int
    last_generated_id: StreamID
    max_deleted_entry_id: StreamID
    entries_added: int
    groups: int                               # without FULL
    first_entry: StreamEntry | None = None    # without FULL
    last_entry: StreamEntry | None = None
    entries: list = field(default_factory=list)      # FULL
    groups_full: list = field(default_factory=list)  # FULL: GroupFull


@dataclass(frozen=True)
class GroupInfo:
    name: bytes
    consumers: int
    pending: int
    last_delivered_id: StreamID
    entries_read: int | None
    lag: int | None
    max_deliveries: int = 0             # dead-letter policy (XRAFT.GROUPCFG); 0 = none
    dead_letter_key: bytes | None = None
    dead_lettered: int = 0              # entries moved to the dead-letter stream so far


@dataclass(frozen=True)
class ConsumerInfo:
    name: bytes
    pending: int
    idle_ms: int


# -- protobuf -> results -------------------------------------------------------------

def entry_from_pb(m: pb.StreamEntry) -> StreamEntry:
    return StreamEntry(StreamID(m.id.ms, m.id.seq), tuple((f.name, f.value) for f in m.fields), m.deleted)


def streams_from_pb(streams) -> dict:
    """repeated StreamEntries -> {key: [StreamEntry]} in reply order."""
    return {s.key: [entry_from_pb(e) for e in s.entries] for s in streams}


def _opt(m, name):
    return getattr(m, name) if m.HasField(name) else None


def stream_info_from_pb(m: pb.XInfoStreamResponse) -> StreamInfo:
    def pel(items):
        return [PelEntry(StreamID.from_pb(p.id), p.consumer, p.delivery_time_ms, p.delivery_count) for p in items]

    groups_full = [GroupFull(g.name, StreamID.from_pb(g.last_delivered_id), _opt(g, "entries_read"), _opt(g, "lag"),
                             g.pel_count, pel(g.pel),
                             [ConsumerFull(c.name, c.seen_time_ms, c.pel_count, pel(c.pel)) for c in g.consumers])
                   for g in m.groups_full]
    return StreamInfo(
        m.length, m.radix_tree_keys, m.radix_tree_nodes, StreamID.from_pb(m.last_generated_id),
        StreamID.from_pb(m.max_deleted_entry_id), m.entries_added, m.groups,
        entry_from_pb(m.first_entry) if m.HasField("first_entry") else None,
        entry_from_pb(m.last_entry) if m.HasField("last_entry") else None,
        [entry_from_pb(e) for e in m.entries], groups_full)


def group_info_from_pb(g: pb.GroupInfo) -> GroupInfo:
    return GroupInfo(g.name, g.consumers, g.pending, StreamID.from_pb(g.last_delivered_id),
                     _opt(g, "entries_read"), _opt(g, "lag"),
                     g.max_deliveries, g.dead_letter_key or None, g.dead_lettered)


def value_from_pb(v: pb.Value):
    """An Execute reply tree as python values: bytes, int, str (status), None,
    list, dict (RESP3 maps)."""
    kind = v.WhichOneof("kind")
    if kind == "bulk":
        return v.bulk
    if kind == "integer":
        return v.integer
    if kind == "status":
        return v.status
    if kind == "null" or kind is None:
        return None
    if kind == "array":
        return [value_from_pb(x) for x in v.array.items]
    return {value_from_pb(e.key): value_from_pb(e.value) for e in v.map.entries}


# -- arguments -> protobuf -------------------------------------------------------------

def to_bytes(x) -> bytes:
    """redis arguments are binary strings: bytes as is, str as UTF-8, numbers in decimal."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return str(x).encode()
    raise TypeError(f"not a redis string: {type(x).__name__}")


def fields_to_pb(fields) -> list:
    """A dict or an iterable of (name, value) pairs -> [Field]."""
    items = fields.items() if isinstance(fields, dict) else fields
    return [pb.Field(name=to_bytes(k), value=to_bytes(v)) for k, v in items]


def xadd_entry_to_pb(fields, id="*") -> pb.XAddEntry:
    """id: "*" (server-generated), "<ms>-*", or an exact ID."""
    entry = pb.XAddEntry(fields=fields_to_pb(fields))
    text = id.decode() if isinstance(id, (bytes, bytearray)) else id
    if isinstance(text, str) and text == "*":
        return entry
    if isinstance(text, str) and text.endswith("-*"):
        entry.auto_seq_ms = int(text[:-2])
        return entry
    entry.explicit_id.CopyFrom(StreamID.parse(text).to_pb())
    return entry


def bound_to_pb(b, lower: bool) -> pb.RangeBound:
    """"-", "+", "(1-2" (exclusive), "5" (an incomplete ID), "1-2", StreamID."""
    out = pb.RangeBound()
    if isinstance(b, (bytes, bytearray)):
        b = bytes(b).decode("ascii")
    if isinstance(b, str):
        if b in ("-", "+"):
            return out
        if b.startswith("("):
            out.exclusive = True
            b = b[1:]
        if "-" not in b:
            out.ms = int(b)
            return out
    out.id.CopyFrom(StreamID.parse(b).to_pb())
    return out


def trim_to_pb(maxlen=None, minid=None, approximate=False, limit=None) -> pb.TrimOptions | None:
    if maxlen is None and minid is None:
        return None
    if maxlen is not None and minid is not None:
        raise ValueError("give maxlen or minid, not both")
    trim = pb.TrimOptions(approximate=approximate)
    if maxlen is not None:
        trim.max_len = maxlen
    else:
        trim.min_id.CopyFrom(StreamID.parse(minid).to_pb())
    if limit is not None:
        trim.limit = limit
    return trim


def group_start_to_pb(id) -> pb.GroupStart:
    if id in ("$", b"$"):
        return pb.GroupStart(last=True)
    return pb.GroupStart(id=StreamID.parse(id).to_pb())


def end_to_pb(end) -> int:
    text = end.decode() if isinstance(end, (bytes, bytearray)) else str(end)
    if text.upper() in ("LEFT", "L"):
        return pb.LIST_END_LEFT
    if text.upper() in ("RIGHT", "R"):
        return pb.LIST_END_RIGHT
    raise ValueError(f"list end must be LEFT or RIGHT, not {end!r}")
