"""The command methods of the async client: arguments -> request, response -> typed result.

A mixin over `aio.Client._unary(rpc, request, write=..., timeout=..., keys=...)`, which
owns routing, retries and errors. Each method is the redis command it names,
with redis's argument names; results are the dataclasses of types.py.
"""
import asyncio

from xraft.proto.v1 import client_pb2 as pb

from .crossshard import xread_fanout
from .errors import XRaftError, from_detail
from .types import (AutoClaimResult, ClaimResult, ConsumerInfo, PendingEntry, PendingSummary, StreamID,
                    bound_to_pb, end_to_pb, entry_from_pb, fields_to_pb, group_info_from_pb, group_start_to_pb,
                    stream_info_from_pb, streams_from_pb, to_bytes, trim_to_pb, value_from_pb, xadd_entry_to_pb)

# Commands whose argv[1] is not a key (execute() routes the others by argv[1]).
KEYLESS_COMMANDS = frozenset(c.encode() for c in (
    "AUTH", "HELLO", "PING", "ECHO", "SELECT", "INFO", "CONFIG", "CLIENT", "CLUSTER", "COMMAND", "DBSIZE",
    "FLUSHALL", "FLUSHDB", "KEYS", "SCAN", "RANDOMKEY", "TIME", "MULTI", "EXEC", "DISCARD", "WATCH", "SCRIPT",
    "FUNCTION", "EVAL", "EVALSHA", "FCALL", "XRAFT.REGISTER", "XREAD", "XREADGROUP", "READONLY", "READWRITE",
    "ASKING", "WAIT", "DEBUG", "OBJECT", "MEMORY", "LATENCY", "SLOWLOG", "ACL", "SHUTDOWN", "SAVE", "BGSAVE",
    "LASTSAVE", "ROLE", "MONITOR", "SUBSCRIBE", "PSUBSCRIBE", "PUBLISH", "PUBSUB", "SWAPDB", "LMPOP", "BLMPOP",
    "ZMPOP", "BZMPOP", "SINTERCARD", "ZINTERCARD", "ZDIFF", "ZINTER", "ZUNION"))
# A blocking call's gRPC deadline is its block time plus this much slack, so
# that "nothing arrived" comes back as the command's empty reply, not a timeout.
BLOCK_SLACK_S = 2.0


def _ids(ids) -> list:
    return [StreamID.parse(i).to_pb() for i in ids]


def _id_texts(ids) -> list:
    return [str(StreamID.parse(i)) for i in ids]


def _block_timeout(block_ms, timeout):
    """The call's timeout for a blocking form: BLOCK 0 waits as long as the
    caller allows (None = no deadline)."""
    if timeout is not None or block_ms is None:
        return timeout
    return None if block_ms == 0 else block_ms / 1000 + BLOCK_SLACK_S


class Commands:
    # -- streams: writes -------------------------------------------------------------

    async def xadd(self, key, fields, id="*", *, nomkstream=False, maxlen=None, minid=None,
                   approximate=False, limit=None, timeout=None, idempotent_id=None):
        """XADD: the new entry's StreamID, or None (NOMKSTREAM, no stream)."""
        [result] = await self.xadd_batch(key, [(id, fields)], nomkstream=nomkstream, maxlen=maxlen, minid=minid,
                                         approximate=approximate, limit=limit, timeout=timeout, raise_errors=True,
                                         idempotent_ids=None if idempotent_id is None else [idempotent_id])
        return result

    async def xadd_batch(self, key, entries, *, nomkstream=False, maxlen=None, minid=None, approximate=False,
                         limit=None, timeout=None, raise_errors=False, idempotent=None, idempotent_ids=None):
        """Append several entries in one log record. `entries`: field mappings
        (ID "*") or (id, fields) pairs. One result per entry: StreamID, None
        (NOMKSTREAM), or the entry's XRaftError (returned, not raised, unless
        `raise_errors`): one entry's failure does not undo the others.

        Idempotent producer (Redis 8.6 IDMP): when `idempotent` (default: the
        client's idempotent_producer) and every ID is "*", the request carries
        the client's producer_id and one idempotent id per entry
        (`idempotent_ids`, or fresh ones), so resending it never duplicates;
        an entry already added answers its first ID."""
        req = pb.XAddRequest(key=to_bytes(key), no_mkstream=nomkstream)
        trim = trim_to_pb(maxlen, minid, approximate, limit)
        if trim is not None:
            req.trim.CopyFrom(trim)
        # Entries are built in place in the request (a message passed to a
        # repeated field is copied), bytes as they are: this runs per entry.
        # The IDMP producer's fresh ids are set as each entry is made (a
        # second pass over the entries costs as much again as the ids).
        add = req.entries.add
        if entries.__class__ is not list and entries.__class__ is not tuple:
            entries = list(entries)
        idmp = idempotent_ids is not None or (self.idempotent_producer if idempotent is None else idempotent)
        fresh = self._iids(len(entries)) if idmp and idempotent_ids is None else None
        # A server that reads idempotent_id_first gets the fresh ids as that one number.
        per_entry = fresh if fresh is not None and not self._idempotent_id_first_ok else None
        explicit = False
        for i, e in enumerate(entries):
            if isinstance(e, tuple) and len(e) == 2 and not isinstance(e[1], (bytes, str)):
                id, fields = e[0], e[1]
            else:
                id, fields = "*", e
            if id != "*" and id != b"*":
                req.entries.append(xadd_entry_to_pb(fields, id))     # "<ms>-*" or an exact ID
                explicit = True
                continue
            put = (add(idempotent_id=b"%x" % per_entry[i]) if per_entry is not None else add()).fields.add
            for k, v in (fields.items() if isinstance(fields, dict) else fields):
                put(name=k if k.__class__ is bytes else to_bytes(k),
                    value=v if v.__class__ is bytes else to_bytes(v))
        if idmp:
            self._set_idempotent_ids(req, idempotent_ids, explicit)
            if fresh is not None and per_entry is None and not explicit:
                req.idempotent_id_first = fresh.start     # entry i's id: hex of start + i, as above
        resp = await self._unary("XAdd", req, write=True, timeout=timeout, keys=req.key)
        if resp.idempotent_id_first_ok and self._idempotent_id_first_ok is False:
            self._idempotent_id_first_ok = True
        out = []
        new_id = StreamID
        for r in resp.results:
            kind = r.WhichOneof("outcome")
            if kind == "id":
                sid = r.id
                out.append(new_id(sid.ms, sid.seq))
            elif kind == "skipped":
                out.append(None)
            else:
                err = from_detail(r.error)
                if raise_errors:
                    raise err
                out.append(err)
        return out

    def _set_idempotent_ids(self, req, idempotent_ids, explicit: bool) -> None:
        """IDMP producer_id + per-entry ids on an XAddRequest whose IDs are all
        "*" (`explicit`: some is not; then no IDMP). Without idempotent_ids the
        entries carry their fresh ids already (xadd_batch)."""
        if explicit:
            if idempotent_ids is not None:
                raise ValueError("idempotent ids need '*' IDs")
            for e in req.entries:
                e.ClearField("idempotent_id")
            return
        req.producer_id = self.producer_id
        if idempotent_ids is None:
            return
        if len(idempotent_ids) != len(req.entries):
            raise ValueError("one idempotent id per entry")
        for e, iid in zip(req.entries, idempotent_ids):
            e.idempotent_id = iid if iid.__class__ is bytes else to_bytes(iid)

    async def xadd_multi(self, batches: dict, *, timeout=None, **options) -> dict:
        """XADD to several streams at once: {key: entries} -> {key: results}.
        Split, not CROSSSLOT: each key's entries are one xadd_batch (one log
        record, `options` as xadd_batch's), all sent together, so keys of
        different Raft groups go to their own leaders in parallel. Keys are
        independent: `results` is xadd_batch's list, or the XRaftError that
        ended that key's call (returned, not raised; an UnknownOutcomeError
        means that key's entries may or may not have been added)."""
        keys = list(batches)
        outcomes = await asyncio.gather(*(self.xadd_batch(k, batches[k], timeout=timeout, **options) for k in keys),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, XRaftError):
                raise outcome
        return dict(zip(keys, outcomes))

    async def xdel(self, key, *ids, timeout=None) -> int:
        req = pb.XDelRequest(key=to_bytes(key), ids=_ids(ids))
        return (await self._unary("XDel", req, write=True, timeout=timeout, keys=req.key)).deleted

    async def xtrim(self, key, *, maxlen=None, minid=None, approximate=False, limit=None, timeout=None) -> int:
        trim = trim_to_pb(maxlen, minid, approximate, limit)
        if trim is None:
            raise ValueError("xtrim needs maxlen or minid")
        req = pb.XTrimRequest(key=to_bytes(key), trim=trim)
        return (await self._unary("XTrim", req, write=True, timeout=timeout, keys=req.key)).trimmed

    async def xsetid(self, key, last_id, *, entries_added=None, max_deleted_id=None, timeout=None) -> None:
        req = pb.XSetIdRequest(key=to_bytes(key), last_id=StreamID.parse(last_id).to_pb())
        if entries_added is not None:
            req.entries_added = entries_added
        if max_deleted_id is not None:
            req.max_deleted_id.CopyFrom(StreamID.parse(max_deleted_id).to_pb())
        await self._unary("XSetId", req, write=True, timeout=timeout, keys=req.key)

    # -- streams: reads --------------------------------------------------------------

    async def xrange(self, key, min="-", max="+", count=None, *, timeout=None) -> list:
        return await self._range("XRange", key, min, max, count, timeout)

    async def xrevrange(self, key, max="+", min="-", count=None, *, timeout=None) -> list:
        return await self._range("XRevRange", key, min, max, count, timeout)

    async def _range(self, rpc, key, lo, hi, count, timeout):
        req = pb.XRangeRequest(key=to_bytes(key), min=bound_to_pb(lo, True), max=bound_to_pb(hi, False))
        if count is not None:
            req.count = count
        resp = await self._unary(rpc, req, write=False, timeout=timeout, keys=req.key)
        return [entry_from_pb(e) for e in resp.entries]

    async def xlen(self, key, *, timeout=None) -> int:
        req = pb.XLenRequest(key=to_bytes(key))
        return (await self._unary("XLen", req, write=False, timeout=timeout, keys=req.key)).length

    async def xread(self, streams: dict, count=None, block_ms=None, *, timeout=None) -> dict:
        """XREAD: {key: id | "$"} -> {key: [StreamEntry]} (only streams with entries).
        On a sharded cluster, streams in different slots: the read is split
        (one XREAD per slot, in parallel; COUNT is per stream anyway, so the
        merged reply is the one XREAD would give); with block_ms the blocking
        reads are fanned out and the first to answer with entries ends the
        others (crossshard.xread_fanout)."""
        if len(streams) > 1:
            parts = await self._split_by_slot([to_bytes(k) for k in streams])
            if parts is not None:
                by_key = {to_bytes(k): v for k, v in streams.items()}
                if block_ms is not None:
                    return await xread_fanout(self, parts, by_key, count, block_ms, timeout)
                replies = await asyncio.gather(*(self.xread({k: by_key[k] for k in part}, count, timeout=timeout)
                                                 for part in parts))
                merged = {k: v for reply in replies for k, v in reply.items()}
                return {k: merged[k] for k in by_key if k in merged}     # request order, as one XREAD
        req = _stream_read_request(pb.XReadRequest(), streams, "$", "new_entries_only", count, block_ms)
        resp = await self._unary("XRead", req, write=False, timeout=_block_timeout(block_ms, timeout),
                                 keys=[s.key for s in req.streams])
        return streams_from_pb(resp.streams)

    async def xreadgroup(self, group, consumer, streams: dict, count=None, block_ms=None, noack=False, *,
                         timeout=None) -> dict:
        """XREADGROUP: {key: ">" | id} -> {key: [StreamEntry]} (history entries may be `deleted`).
        On a sharded cluster the streams must share a slot (CrossSlotError,
        nothing sent): it delivers, and a split whose one part failed would
        leave the other part's entries delivered and unreported."""
        req = _stream_read_request(pb.XReadGroupRequest(group=to_bytes(group), consumer=to_bytes(consumer),
                                                        no_ack=noack), streams, ">", "new_entries", count, block_ms)
        resp = await self._unary("XReadGroup", req, write=True, timeout=_block_timeout(block_ms, timeout),
                                 keys=[s.key for s in req.streams])
        return streams_from_pb(resp.streams)

    # -- consumer groups ---------------------------------------------------------------

    async def xack(self, key, group, *ids, timeout=None) -> int:
        req = pb.XAckRequest(key=to_bytes(key), group=to_bytes(group), ids=_ids(ids))
        return (await self._unary("XAck", req, write=True, timeout=timeout, keys=req.key)).acked

    async def xpending(self, key, group, *, timeout=None) -> PendingSummary:
        req = pb.XPendingRequest(key=to_bytes(key), group=to_bytes(group))
        resp = await self._unary("XPending", req, write=False, timeout=timeout, keys=req.key)
        return PendingSummary(resp.count,
                              StreamID.from_pb(resp.min_id) if resp.HasField("min_id") else None,
                              StreamID.from_pb(resp.max_id) if resp.HasField("max_id") else None,
                              {c.consumer: c.pending for c in resp.consumers})

    async def xpending_range(self, key, group, min="-", max="+", count=10, consumer=None, idle=None, *,
                             timeout=None) -> list:
        req = pb.XPendingExtendedRequest(key=to_bytes(key), group=to_bytes(group), min=bound_to_pb(min, True),
                                         max=bound_to_pb(max, False), count=count)
        if consumer is not None:
            req.consumer = to_bytes(consumer)
        if idle is not None:
            req.min_idle_ms = idle
        resp = await self._unary("XPendingExtended", req, write=False, timeout=timeout, keys=req.key)
        return [PendingEntry(StreamID.from_pb(e.id), e.consumer, e.idle_ms, e.delivery_count) for e in resp.entries]

    async def xclaim(self, key, group, consumer, min_idle_ms, ids, *, idle=None, time=None, retrycount=None,
                     force=False, justid=False, lastid=None, timeout=None) -> ClaimResult:
        req = pb.XClaimRequest(key=to_bytes(key), group=to_bytes(group), consumer=to_bytes(consumer),
                               min_idle_ms=min_idle_ms, ids=_ids(ids), force=force, just_id=justid)
        for name, value in (("idle_ms", idle), ("time_ms", time), ("retry_count", retrycount)):
            if value is not None:
                setattr(req, name, value)
        if lastid is not None:
            req.last_id.CopyFrom(StreamID.parse(lastid).to_pb())
        resp = await self._unary("XClaim", req, write=True, timeout=timeout, keys=req.key)
        return ClaimResult([entry_from_pb(e) for e in resp.entries], [StreamID.from_pb(i) for i in resp.ids])

    async def xautoclaim(self, key, group, consumer, min_idle_ms, start="0-0", count=None, justid=False, *,
                         timeout=None) -> AutoClaimResult:
        req = pb.XAutoClaimRequest(key=to_bytes(key), group=to_bytes(group), consumer=to_bytes(consumer),
                                   min_idle_ms=min_idle_ms, start=StreamID.parse(start).to_pb(), just_id=justid)
        if count is not None:
            req.count = count
        resp = await self._unary("XAutoClaim", req, write=True, timeout=timeout, keys=req.key)
        return AutoClaimResult(StreamID.from_pb(resp.next_start), [entry_from_pb(e) for e in resp.entries],
                               [StreamID.from_pb(i) for i in resp.ids],
                               [StreamID.from_pb(i) for i in resp.deleted_ids])

    async def xgroup_create(self, key, group, id="$", *, mkstream=False, entries_read=None, timeout=None) -> None:
        req = pb.XGroupCreateRequest(key=to_bytes(key), group=to_bytes(group), start=group_start_to_pb(id),
                                     mkstream=mkstream)
        if entries_read is not None:
            req.entries_read = entries_read
        await self._unary("XGroupCreate", req, write=True, timeout=timeout, keys=req.key)

    async def xgroup_setid(self, key, group, id="$", *, entries_read=None, timeout=None) -> None:
        req = pb.XGroupSetIdRequest(key=to_bytes(key), group=to_bytes(group), start=group_start_to_pb(id))
        if entries_read is not None:
            req.entries_read = entries_read
        await self._unary("XGroupSetId", req, write=True, timeout=timeout, keys=req.key)

    async def xgroup_destroy(self, key, group, *, timeout=None) -> bool:
        req = pb.XGroupDestroyRequest(key=to_bytes(key), group=to_bytes(group))
        return (await self._unary("XGroupDestroy", req, write=True, timeout=timeout, keys=req.key)).destroyed

    async def xgroup_createconsumer(self, key, group, consumer, *, timeout=None) -> bool:
        req = pb.XGroupCreateConsumerRequest(key=to_bytes(key), group=to_bytes(group), consumer=to_bytes(consumer))
        return (await self._unary("XGroupCreateConsumer", req, write=True, timeout=timeout, keys=req.key)).created

    async def xgroup_delconsumer(self, key, group, consumer, *, timeout=None) -> int:
        req = pb.XGroupDelConsumerRequest(key=to_bytes(key), group=to_bytes(group), consumer=to_bytes(consumer))
        return (await self._unary("XGroupDelConsumer", req, write=True, timeout=timeout,
                                  keys=req.key)).pending_deleted

    # -- XINFO -----------------------------------------------------------------------

    async def xinfo_stream(self, key, *, full=False, count=None, timeout=None):
        req = pb.XInfoStreamRequest(key=to_bytes(key), full=full)
        if count is not None:
            req.count = count
        return stream_info_from_pb(await self._unary("XInfoStream", req, write=False, timeout=timeout, keys=req.key))

    async def xinfo_groups(self, key, *, timeout=None) -> list:
        req = pb.XInfoGroupsRequest(key=to_bytes(key))
        resp = await self._unary("XInfoGroups", req, write=False, timeout=timeout, keys=req.key)
        return [group_info_from_pb(g) for g in resp.groups]

    async def xinfo_consumers(self, key, group, *, timeout=None) -> list:
        req = pb.XInfoConsumersRequest(key=to_bytes(key), group=to_bytes(group))
        resp = await self._unary("XInfoConsumers", req, write=False, timeout=timeout, keys=req.key)
        return [ConsumerInfo(c.name, c.pending, c.idle_ms) for c in resp.consumers]

    # -- lists -----------------------------------------------------------------------

    async def _push(self, key, values, end, only_if_exists, timeout) -> int:
        req = pb.ListPushRequest(key=to_bytes(key), values=[to_bytes(v) for v in values], end=end,
                                 only_if_exists=only_if_exists)
        return (await self._unary("ListPush", req, write=True, timeout=timeout, keys=req.key)).length

    async def lpush(self, key, *values, timeout=None) -> int:
        return await self._push(key, values, pb.LIST_END_LEFT, False, timeout)

    async def rpush(self, key, *values, timeout=None) -> int:
        return await self._push(key, values, pb.LIST_END_RIGHT, False, timeout)

    async def lpushx(self, key, *values, timeout=None) -> int:
        return await self._push(key, values, pb.LIST_END_LEFT, True, timeout)

    async def rpushx(self, key, *values, timeout=None) -> int:
        return await self._push(key, values, pb.LIST_END_RIGHT, True, timeout)

    async def _pop(self, keys, end, count, block_ms, timeout):
        req = pb.ListPopRequest(keys=[to_bytes(k) for k in keys], end=end)
        if count is not None:
            req.count = count
        if block_ms is not None:
            req.block_ms = block_ms
        return await self._unary("ListPop", req, write=True, timeout=_block_timeout(block_ms, timeout),
                                 keys=list(req.keys))

    async def lpop(self, key, count=None, *, timeout=None):
        """bytes | None without count; list (None: missing key) with it."""
        return self._pop_result(await self._pop([key], pb.LIST_END_LEFT, count, None, timeout), count)

    async def rpop(self, key, count=None, *, timeout=None):
        return self._pop_result(await self._pop([key], pb.LIST_END_RIGHT, count, None, timeout), count)

    @staticmethod
    def _pop_result(resp, count):
        if resp.nil:
            return None
        return list(resp.values) if count is not None else resp.values[0]

    async def blpop(self, keys, block_ms=0, *, timeout=None):
        """(key, value), or None when block_ms passed."""
        resp = await self._pop(keys, pb.LIST_END_LEFT, None, block_ms, timeout)
        return None if resp.nil else (resp.key, resp.values[0])

    async def brpop(self, keys, block_ms=0, *, timeout=None):
        resp = await self._pop(keys, pb.LIST_END_RIGHT, None, block_ms, timeout)
        return None if resp.nil else (resp.key, resp.values[0])

    async def lrange(self, key, start, stop, *, timeout=None) -> list:
        req = pb.ListRangeRequest(key=to_bytes(key), start=start, stop=stop)
        return list((await self._unary("ListRange", req, write=False, timeout=timeout, keys=req.key)).values)

    async def lindex(self, key, index, *, timeout=None):
        req = pb.ListIndexRequest(key=to_bytes(key), index=index)
        resp = await self._unary("ListIndex", req, write=False, timeout=timeout, keys=req.key)
        return resp.value if resp.HasField("value") else None

    async def lset(self, key, index, value, *, timeout=None) -> None:
        req = pb.ListSetRequest(key=to_bytes(key), index=index, value=to_bytes(value))
        await self._unary("ListSet", req, write=True, timeout=timeout, keys=req.key)

    async def linsert(self, key, where, pivot, value, *, timeout=None) -> int:
        before = str(where).upper() == "BEFORE"
        if not before and str(where).upper() != "AFTER":
            raise ValueError("where must be BEFORE or AFTER")
        req = pb.ListInsertRequest(key=to_bytes(key), before=before, pivot=to_bytes(pivot), value=to_bytes(value))
        return (await self._unary("ListInsert", req, write=True, timeout=timeout, keys=req.key)).length

    async def lrem(self, key, count, value, *, timeout=None) -> int:
        req = pb.ListRemRequest(key=to_bytes(key), count=count, value=to_bytes(value))
        return (await self._unary("ListRem", req, write=True, timeout=timeout, keys=req.key)).removed

    async def ltrim(self, key, start, stop, *, timeout=None) -> None:
        req = pb.ListTrimRequest(key=to_bytes(key), start=start, stop=stop)
        await self._unary("ListTrim", req, write=True, timeout=timeout, keys=req.key)

    async def lpos(self, key, value, *, rank=None, count=None, maxlen=None, timeout=None):
        """int | None without count; list of positions with it."""
        req = pb.ListPosRequest(key=to_bytes(key), value=to_bytes(value))
        for name, v in (("rank", rank), ("count", count), ("max_len", maxlen)):
            if v is not None:
                setattr(req, name, v)
        resp = await self._unary("ListPos", req, write=False, timeout=timeout, keys=req.key)
        if count is not None:
            return list(resp.positions)
        return resp.positions[0] if resp.positions else None

    async def lmove(self, source, destination, wherefrom="LEFT", whereto="RIGHT", *, block_ms=None, timeout=None):
        req = pb.ListMoveRequest(source=to_bytes(source), destination=to_bytes(destination),
                                 to=end_to_pb(whereto), **{"from": end_to_pb(wherefrom)})
        if block_ms is not None:
            req.block_ms = block_ms
        resp = await self._unary("ListMove", req, write=True, timeout=_block_timeout(block_ms, timeout),
                                 keys=[req.source, req.destination])
        return resp.value if resp.HasField("value") else None

    async def lmpop(self, keys, where="LEFT", count=None, *, block_ms=None, timeout=None):
        """(key, [values]) or None."""
        req = pb.ListMPopRequest(keys=[to_bytes(k) for k in keys], end=end_to_pb(where))
        if count is not None:
            req.count = count
        if block_ms is not None:
            req.block_ms = block_ms
        resp = await self._unary("ListMPop", req, write=True, timeout=_block_timeout(block_ms, timeout),
                                 keys=list(req.keys))
        return (resp.key, list(resp.values)) if resp.HasField("key") else None

    async def llen(self, key, *, timeout=None) -> int:
        req = pb.ListLenRequest(key=to_bytes(key))
        return (await self._unary("ListLen", req, write=False, timeout=timeout, keys=req.key)).length

    # -- Redis 8.x stream commands (through Execute; docs/streams-8x.md) -------------------

    async def xdelex(self, key, *ids, policy="KEEPREF", timeout=None) -> list:
        """XDELEX key KEEPREF|DELREF|ACKED IDS n id...: per ID 1 deleted, -1 absent, 2 kept (ACKED)."""
        return await self.execute("XDELEX", key, policy, "IDS", len(ids), *_id_texts(ids), timeout=timeout)

    async def xackdel(self, key, group, *ids, policy="KEEPREF", timeout=None) -> list:
        """XACKDEL key group KEEPREF|DELREF|ACKED IDS n id...: per ID 1, -1 or 2 (ACKED, kept)."""
        return await self.execute("XACKDEL", key, group, policy, "IDS", len(ids), *_id_texts(ids), timeout=timeout)

    async def xcfgset(self, key, *, idmp_duration=None, idmp_maxsize=None, retention=None, timeout=None) -> None:
        """XCFGSET key [IDMP-DURATION s] [IDMP-MAXSIZE n] [RETENTION ACKED|NONE]."""
        argv = ["XCFGSET", key]
        for name, value in (("IDMP-DURATION", idmp_duration), ("IDMP-MAXSIZE", idmp_maxsize),
                            ("RETENTION", retention)):
            if value is not None:
                argv += [name, value]
        await self.execute(*argv, timeout=timeout)

    # -- anything else -------------------------------------------------------------------

    async def execute(self, *argv, write=True, timeout=None, key=None):
        """Any command as redis argv; the reply as python values (bytes, int,
        str for a status, None, list, dict). `write=False` declares the
        command read-only, which lets a lost connection be retried.
        Routing on a sharded cluster: by `key` if given, else by argv[1]
        unless the command is keyless (KEYLESS_COMMANDS); a wrong guess costs
        one redirect, and the server checks every key (CROSSSLOT)."""
        req = pb.ExecuteRequest(argv=[to_bytes(a) for a in argv])
        if key is not None:
            keys = to_bytes(key)
        elif len(req.argv) > 1 and req.argv[0].upper() not in KEYLESS_COMMANDS:
            keys = req.argv[1]
        else:
            keys = None
        return value_from_pb((await self._unary("Execute", req, write=write, timeout=timeout, keys=keys)).reply)


def _stream_read_request(req, streams: dict, new_marker: str, new_field: str, count, block_ms):
    """Fill an XRead/XReadGroup request: one position per stream, where `new_marker`
    ("$" for XREAD, ">" for XREADGROUP) sets the request's `new_field` flag instead of an ID."""
    for key, after in streams.items():
        s = req.streams.add(key=to_bytes(key))
        if after in (new_marker, new_marker.encode()):
            setattr(s, new_field, True)
        else:
            s.after.CopyFrom(StreamID.parse(after).to_pb())
    if count is not None:
        req.count = count
    if block_ms is not None:
        req.block_ms = block_ms
    return req
