"""Typed gRPC requests -> redis argv, and engine replies -> typed gRPC responses.

A typed request *is* the redis command it names (client.proto): each
`*_argv` function below builds exactly the argv a redis client would send,
so the engine parses, validates and fails it exactly as it does for RESP
(same error texts, same error order). The `*_response` functions read the
engine's reply values (engine/replies.py) into the response messages.

Bounds the proto sets on repeated fields (entries per XAdd, IDs per XAck,
...) are checked here and raise ArgumentError (INVALID_ARGUMENT, COMMAND_ERROR).
"""
from ..engine.errors import CommandError
from ..engine.replies import NULL_ARRAY
from ..fsm.entry import MAX_U64, MAXLEN, MINID, IdKind, XAddBatch
from xraft.proto.v1 import client_pb2 as pb

MAX_XADD_ENTRIES = 10_000
MAX_IDS = 100_000
MAX_STREAMS = 1_000
MAX_KEYS = 1_000
MAX_BATCH = 10_000
DEFAULT_BATCH = 100


class ArgumentError(CommandError):
    """A request the proto's own rules refuse before any command is built."""

    def __init__(self, text: str):
        super().__init__("ERR " + text)


def check_count(name: str, items, lo: int, hi: int) -> None:
    if not lo <= len(items) <= hi:
        raise ArgumentError(f"{name}: {len(items)} given, {lo}..{hi} allowed")


# -- IDs and bounds ------------------------------------------------------------------

def id_text(m: pb.StreamId) -> bytes:
    return b"%d-%d" % (m.ms, m.seq)


def parse_id(raw: bytes) -> pb.StreamId:
    ms, _, seq = raw.partition(b"-")
    return pb.StreamId(ms=int(ms), seq=int(seq or b"0"))


def bound_text(b: pb.RangeBound, lower: bool) -> bytes:
    kind = b.WhichOneof("bound")
    if kind is None:
        text = b"-" if lower else b"+"
    elif kind == "ms":
        text = b"%d" % b.ms
    else:
        text = id_text(b.id)
    # "(" on an open bound is left to the engine, which refuses it with redis's text.
    return b"(" + text if b.exclusive else text


def trim_args(t: pb.TrimOptions) -> list:
    kind = t.WhichOneof("threshold")
    if kind is None:
        raise ArgumentError("trim options need max_len or min_id")
    out = [b"MAXLEN" if kind == "max_len" else b"MINID"]
    if t.approximate:
        out.append(b"~")
    out.append(b"%d" % t.max_len if kind == "max_len" else id_text(t.min_id))
    if t.HasField("limit"):
        out += [b"LIMIT", b"%d" % t.limit]
    return out


def block_seconds(ms: int) -> bytes:
    """BLPOP & co take seconds as a double; 0 = forever."""
    return b"%d.%03d" % divmod(ms, 1000) if ms else b"0"


# -- stream commands -------------------------------------------------------------------

def xadd_trim(r: pb.XAddRequest):
    """XAdd's trim options as (strategy, approx, threshold, limit) (fsm entry.XAddBatch's terms)."""
    if not r.HasField("trim"):
        return None, False, 0, None
    t = r.trim
    kind = t.WhichOneof("threshold")
    if kind is None:
        raise ArgumentError("trim options need max_len or min_id")
    if kind == "max_len":
        strategy, threshold = MAXLEN, t.max_len
    else:
        strategy, threshold = MINID, (t.min_id.ms, t.min_id.seq)
    return strategy, t.approximate, threshold, (t.limit if t.HasField("limit") else None)


def xadd_batch(r: pb.XAddRequest):
    """(XAddBatch of the entries that have fields, or None if none has;
    indexes of the entries without fields). The batch means exactly the
    XADD argvs of those entries, as the RESP path would run them
    (fsm/xadd_batch.py); it is built straight from the message, with no argv
    per entry."""
    check_count("entries", r.entries, 1, MAX_XADD_ENTRIES)
    strategy, approx, threshold, limit = xadd_trim(r)
    without = []
    items = []
    add = items.append
    pid = r.producer_id or None
    first = _idempotent_id_first(r, pid)
    iids = [] if pid is not None and first is None else None
    for i, e in enumerate(r.entries):
        fields = e.fields
        if not fields:
            without.append(i)
            continue
        flat = []
        put = flat.append
        for f in fields:
            put(f.name)
            put(f.value)
        kind = e.WhichOneof("id")
        if iids is not None:
            if kind is not None:
                raise ArgumentError("ERR IDMP/IDMPAUTO can be used only with auto-generated IDs")
            iids.append(e.idempotent_id or None)
        elif first is not None:
            if kind is not None:
                raise ArgumentError("ERR IDMP/IDMPAUTO can be used only with auto-generated IDs")
            if e.idempotent_id:
                raise ArgumentError("idempotent_id_first with per-entry idempotent ids")
        if kind is None:
            add((IdKind.AUTO, 0, 0, flat))
        elif kind == "auto_seq_ms":
            add((IdKind.AUTO_SEQ, e.auto_seq_ms, 0, flat))
        else:
            sid = e.explicit_id
            add((IdKind.EXPLICIT, sid.ms, sid.seq, flat))
    if not items:
        return None, without
    if first is not None and without:
        # Entries without fields leave the batch: its ids are no longer consecutive.
        skipped = set(without)
        iids = [b"%x" % (first + i) for i in range(len(r.entries)) if i not in skipped]
        first = None
    return XAddBatch.build(r.key, items, no_mkstream=r.no_mkstream, strategy=strategy, approx=approx,
                           threshold=threshold, limit=limit, idmp_pid=pid, idmp_iids=iids,
                           idmp_first=first), without


def _idempotent_id_first(r: pb.XAddRequest, pid):
    """XAddRequest.idempotent_id_first, checked (client.proto), or None if not given."""
    if not r.HasField("idempotent_id_first"):
        return None
    first = r.idempotent_id_first
    if pid is None:
        raise ArgumentError("idempotent_id_first needs producer_id")
    if first + len(r.entries) - 1 > MAX_U64:
        raise ArgumentError("idempotent_id_first: ids past 2**64-1")
    return first


def xrange_argv(r: pb.XRangeRequest, reverse: bool) -> list:
    lo, hi = bound_text(r.min, True), bound_text(r.max, False)
    argv = [b"XREVRANGE", r.key, hi, lo] if reverse else [b"XRANGE", r.key, lo, hi]
    if r.HasField("count"):
        argv += [b"COUNT", b"%d" % r.count]
    return argv


def xread_argv(streams, count, block_ms) -> list:
    """XREAD over XReadStream messages; block_ms None = no BLOCK."""
    check_count("streams", streams, 1, MAX_STREAMS)
    argv = [b"XREAD"]
    if count is not None:
        argv += [b"COUNT", b"%d" % count]
    if block_ms is not None:
        argv += [b"BLOCK", b"%d" % block_ms]
    ids = [b"$" if s.WhichOneof("from") == "new_entries_only" else id_text(s.after) for s in streams]
    return argv + [b"STREAMS"] + [s.key for s in streams] + ids


def xreadgroup_argv(group, consumer, keys, ids, count, block_ms, no_ack) -> list:
    argv = [b"XREADGROUP", b"GROUP", group, consumer]
    if count is not None:
        argv += [b"COUNT", b"%d" % count]
    if block_ms is not None:
        argv += [b"BLOCK", b"%d" % block_ms]
    if no_ack:
        argv.append(b"NOACK")
    return argv + [b"STREAMS"] + list(keys) + list(ids)


def xreadgroup_request_argv(r: pb.XReadGroupRequest, block_ms) -> list:
    check_count("streams", r.streams, 1, MAX_STREAMS)
    ids = [b">" if s.WhichOneof("from") != "after" else id_text(s.after) for s in r.streams]
    return xreadgroup_argv(r.group, r.consumer, [s.key for s in r.streams], ids,
                           r.count if r.HasField("count") else None, block_ms, r.no_ack)


def ids_argv(head: list, ids) -> list:
    check_count("ids", ids, 1, MAX_IDS)
    return head + [id_text(i) for i in ids]


def xpending_ext_argv(r: pb.XPendingExtendedRequest) -> list:
    argv = [b"XPENDING", r.key, r.group]
    if r.HasField("min_idle_ms"):
        argv += [b"IDLE", b"%d" % r.min_idle_ms]
    argv += [bound_text(r.min, True), bound_text(r.max, False), b"%d" % r.count]
    if r.HasField("consumer"):
        argv.append(r.consumer)
    return argv


def xclaim_argv(r: pb.XClaimRequest) -> list:
    argv = ids_argv([b"XCLAIM", r.key, r.group, r.consumer, b"%d" % r.min_idle_ms], r.ids)
    for name, opt in (("idle_ms", b"IDLE"), ("time_ms", b"TIME"), ("retry_count", b"RETRYCOUNT")):
        if r.HasField(name):
            argv += [opt, b"%d" % getattr(r, name)]
    if r.force:
        argv.append(b"FORCE")
    if r.just_id:
        argv.append(b"JUSTID")
    if r.HasField("last_id"):
        argv += [b"LASTID", id_text(r.last_id)]
    return argv


def xautoclaim_argv(r: pb.XAutoClaimRequest) -> list:
    argv = [b"XAUTOCLAIM", r.key, r.group, r.consumer, b"%d" % r.min_idle_ms, id_text(r.start)]
    if r.HasField("count"):
        argv += [b"COUNT", b"%d" % r.count]
    if r.just_id:
        argv.append(b"JUSTID")
    return argv


def group_start(start: pb.GroupStart) -> bytes:
    kind = start.WhichOneof("start")
    if kind is None:
        raise ArgumentError("start is required (an ID or last)")
    return b"$" if kind == "last" else id_text(start.id)


def xgroup_create_argv(r: pb.XGroupCreateRequest) -> list:
    argv = [b"XGROUP", b"CREATE", r.key, r.group, group_start(r.start)]
    if r.mkstream:
        argv.append(b"MKSTREAM")
    if r.HasField("entries_read"):
        argv += [b"ENTRIESREAD", b"%d" % r.entries_read]
    return argv


def xgroup_setid_argv(r: pb.XGroupSetIdRequest) -> list:
    argv = [b"XGROUP", b"SETID", r.key, r.group, group_start(r.start)]
    if r.HasField("entries_read"):
        argv += [b"ENTRIESREAD", b"%d" % r.entries_read]
    return argv


def xtrim_argv(r: pb.XTrimRequest) -> list:
    if not r.HasField("trim"):
        raise ArgumentError("trim is required")
    return [b"XTRIM", r.key] + trim_args(r.trim)


def xinfo_stream_argv(r: pb.XInfoStreamRequest) -> list:
    argv = [b"XINFO", b"STREAM", r.key]
    if r.full:
        argv.append(b"FULL")
        if r.HasField("count"):
            argv += [b"COUNT", b"%d" % r.count]
    return argv


def xsetid_argv(r: pb.XSetIdRequest) -> list:
    argv = [b"XSETID", r.key, id_text(r.last_id)]
    if r.HasField("entries_added"):
        argv += [b"ENTRIESADDED", b"%d" % r.entries_added]
    if r.HasField("max_deleted_id"):
        argv += [b"MAXDELETEDID", id_text(r.max_deleted_id)]
    return argv


# -- list commands -----------------------------------------------------------------------

def _end(end: int) -> bytes:
    return b"LEFT" if end == pb.LIST_END_LEFT else b"RIGHT"


def list_push_argv(r: pb.ListPushRequest) -> list:
    name = (b"L" if r.end == pb.LIST_END_LEFT else b"R") + b"PUSH" + (b"X" if r.only_if_exists else b"")
    return [name, r.key] + list(r.values)


def list_pop_argv(r: pb.ListPopRequest, block_ms) -> list:
    """LPOP/RPOP key [count], or BLPOP/BRPOP keys.. timeout when block_ms is not None."""
    side = b"L" if r.end == pb.LIST_END_LEFT else b"R"
    if block_ms is None:
        if len(r.keys) != 1:
            raise ArgumentError("keys: exactly one without block_ms")
        argv = [side + b"POP", r.keys[0]]
        if r.HasField("count"):
            argv.append(b"%d" % r.count)
        return argv
    check_count("keys", r.keys, 1, MAX_KEYS)
    if r.HasField("count"):
        raise ArgumentError("count is not allowed with block_ms")
    return [b"B" + side + b"POP"] + list(r.keys) + [block_seconds(block_ms)]


def list_pos_argv(r: pb.ListPosRequest) -> list:
    argv = [b"LPOS", r.key, r.value]
    for name, opt in (("rank", b"RANK"), ("count", b"COUNT"), ("max_len", b"MAXLEN")):
        if r.HasField(name):
            argv += [opt, b"%d" % getattr(r, name)]
    return argv


def list_move_argv(r: pb.ListMoveRequest, block_ms) -> list:
    ends = [_end(getattr(r, "from")), _end(r.to)]
    if block_ms is None:
        return [b"LMOVE", r.source, r.destination] + ends
    return [b"BLMOVE", r.source, r.destination] + ends + [block_seconds(block_ms)]


def list_mpop_argv(r: pb.ListMPopRequest, block_ms) -> list:
    check_count("keys", r.keys, 1, MAX_KEYS)
    body = [b"%d" % len(r.keys)] + list(r.keys) + [_end(r.end)]
    if r.HasField("count"):
        body += [b"COUNT", b"%d" % r.count]
    if block_ms is None:
        return [b"LMPOP"] + body
    return [b"BLMPOP", block_seconds(block_ms)] + body


# -- replies -> messages ------------------------------------------------------------------

def entry_pb(item) -> pb.StreamEntry:
    """[id, [f, v, ...]] or, from XREADGROUP history, [id, NULL_ARRAY] (deleted)."""
    raw_id, fields = item
    entry = pb.StreamEntry(id=parse_id(raw_id))
    if fields is NULL_ARRAY or fields is None:
        entry.deleted = True
        return entry
    entry.fields.extend(pb.Field(name=fields[i], value=fields[i + 1]) for i in range(0, len(fields), 2))
    return entry


def entries_pb(reply) -> list:
    return [] if reply is NULL_ARRAY or reply is None else [entry_pb(e) for e in reply]


def streams_pb(reply) -> list:
    """XREAD/XREADGROUP's [[key, entries], ...] (NULL_ARRAY: nothing)."""
    if reply is NULL_ARRAY or reply is None:
        return []
    return [pb.StreamEntries(key=key, entries=entries_pb(entries)) for key, entries in reply if entries]


def fill_streams(out, reply) -> None:
    """streams_pb(reply) added in place to `out`, a repeated StreamEntries field:
    the same messages, several times cheaper (no intermediate message objects
    to copy in; the streaming RPCs' hot path)."""
    if reply is NULL_ARRAY or reply is None:
        return
    for key, entries in reply:
        if not entries:
            continue
        add = out.add(key=key).entries.add
        for raw_id, fields in entries:
            entry = add()
            ms, _, seq = raw_id.partition(b"-")       # parse_id, set in place
            sid = entry.id
            sid.ms = int(ms)
            sid.seq = int(seq or b"0")
            if fields is NULL_ARRAY or fields is None:
                entry.deleted = True
                continue
            field = entry.fields.add
            n = len(fields)
            if n == 4:                                # the usual shapes without a range loop
                field(name=fields[0], value=fields[1])
                field(name=fields[2], value=fields[3])
            elif n == 2:
                field(name=fields[0], value=fields[1])
            else:
                for i in range(0, n, 2):
                    field(name=fields[i], value=fields[i + 1])


def xpending_pb(reply) -> pb.XPendingResponse:
    count, lo, hi, owners = reply
    out = pb.XPendingResponse(count=count)
    if lo is not None:
        out.min_id.CopyFrom(parse_id(lo))
        out.max_id.CopyFrom(parse_id(hi))
    if owners is not NULL_ARRAY:
        out.consumers.extend(pb.ConsumerPending(consumer=name, pending=int(n)) for name, n in owners)
    return out


def xinfo_stream_pb(info: dict) -> pb.XInfoStreamResponse:
    out = pb.XInfoStreamResponse(
        length=info[b"length"], radix_tree_keys=info[b"radix-tree-keys"], radix_tree_nodes=info[b"radix-tree-nodes"],
        last_generated_id=parse_id(info[b"last-generated-id"]),
        max_deleted_entry_id=parse_id(info[b"max-deleted-entry-id"]), entries_added=info[b"entries-added"])
    if b"entries" not in info:
        out.groups = info[b"groups"]
        for name in (b"first-entry", b"last-entry"):
            if info[name] is not None:
                getattr(out, name.decode().replace("-", "_")).CopyFrom(entry_pb(info[name]))
        return out
    out.entries.extend(entry_pb(e) for e in info[b"entries"])
    for g in info[b"groups"]:
        group = out.groups_full.add(name=g[b"name"], last_delivered_id=parse_id(g[b"last-delivered-id"]),
                                    pel_count=g[b"pel-count"])
        _set_optional(group, g)
        group.pel.extend(pb.XInfoPelEntry(id=parse_id(i), consumer=c, delivery_time_ms=t, delivery_count=n)
                         for i, c, t, n in g[b"pending"])
        for c in g[b"consumers"]:
            consumer = group.consumers.add(name=c[b"name"], seen_time_ms=c[b"seen-time"], pel_count=c[b"pel-count"])
            consumer.pel.extend(pb.XInfoPelEntry(id=parse_id(i), delivery_time_ms=t, delivery_count=n)
                                for i, t, n in c[b"pending"])
    return out


def _set_optional(msg, g: dict) -> None:
    if g[b"entries-read"] is not None:
        msg.entries_read = g[b"entries-read"]
    if g[b"lag"] is not None:
        msg.lag = g[b"lag"]


def group_info_pb(g: dict) -> pb.GroupInfo:
    out = pb.GroupInfo(name=g[b"name"], consumers=g[b"consumers"], pending=g[b"pending"],
                       last_delivered_id=parse_id(g[b"last-delivered-id"]))
    _set_optional(out, g)
    if b"max-deliveries" in g:          # a dead-letter policy (engine/dead_letters.py)
        out.max_deliveries = g[b"max-deliveries"]
        out.dead_letter_key = g[b"dead-letter-key"] or b""
        out.dead_lettered = g[b"dead-lettered"]
    return out


def value_pb(v, depth: int = 0) -> pb.Value:
    """An engine reply as an Execute Value tree (RESP3 shapes: maps stay maps)."""
    if depth > 32:
        raise ArgumentError("reply nested too deeply")
    if v is NULL_ARRAY:
        return pb.Value(null=pb.NULL_KIND_ARRAY)
    if v is None:
        return pb.Value(null=pb.NULL_KIND_BULK)
    if isinstance(v, str):                       # Status is a str
        return pb.Value(status=str(v))
    if isinstance(v, (bytes, bytearray)):
        return pb.Value(bulk=bytes(v))
    if isinstance(v, int):
        return pb.Value(integer=v)
    if isinstance(v, dict):
        return pb.Value(map=pb.ValueMap(entries=[pb.ValueMapEntry(key=value_pb(k, depth + 1),
                                                                  value=value_pb(x, depth + 1))
                                                 for k, x in v.items()]))
    if isinstance(v, (list, tuple)):
        return pb.Value(array=pb.ValueList(items=[value_pb(x, depth + 1) for x in v]))
    if isinstance(v, float):
        return pb.Value(bulk=repr(v).encode())
    raise TypeError(f"not a reply value: {type(v).__name__}")
