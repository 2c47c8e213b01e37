"""The gRPC client API's two streaming RPCs (grpc_service.XRaftService's
Subscribe and Consume are these functions, with the service as first argument).

    Subscribe   XREAD in a loop, woken by the backend's ready keys
    Consume     XREADGROUP ">" through the log, acks in, bounded window
                (_ConsumeSession)
"""
import asyncio
import collections
from typing import NamedTuple

from xraft.proto.v1 import client_pb2 as pb

from ..engine.errors import EngineError
from ..engine.replies import NULL_ARRAY
from ..fsm.blocking import woken_xreadgroup_request
from ..fsm.resolve import resolve_command
from . import grpc_convert as cv

DEFAULT_MAX_UNACKED = 1000
MAX_UNACKED = 10_000
MAX_ACK_IDS = 10_000
MAX_CONSUME_KEYS = 100
READS_AHEAD = 8                       # Consume: XREADGROUP reads in flight at once (window permitting)
MAX_ACKS_PER_WRITE = 256              # Consume: acks written by one submit (one record)
MAX_ACK_WRITES = 8                    # Consume: ack submits in flight at once
# Deliveries say this server takes ConsumeAck.run_lengths (tests turn it off to be a
# server from before them: the client must then send one message per ack).
ACK_RUNS = True
MAX_QUEUED_ACKS = 1024                # Consume: acks read and not yet written (then reading pauses)


def _nonempty(reply) -> list:
    """An XREAD/XREADGROUP reply's streams that have entries ([] for NULL_ARRAY)."""
    if reply is NULL_ARRAY or reply is None:
        return []
    return [s for s in reply if s[1]]


def _ok(result):
    """A command's result, or its EngineError raised."""
    if isinstance(result, EngineError):
        raise result
    return result


async def subscribe(service, request, context):
    """XREAD in a loop, resumed after the last ID sent; between reads it
    waits on the backend's ready keys (no polling)."""
    call = waiter = None
    try:
        call = service._begin(request.options, context)
        call.deadline = None              # a subscription lives until cancelled
        call.client_id = call.seq = 0     # many reads, no one request id
        cv.check_count("streams", request.streams, 1, cv.MAX_STREAMS)
        batch = min(request.max_batch or cv.DEFAULT_BATCH, cv.MAX_BATCH)
        keys = [s.key for s in request.streams]
        if len(set(keys)) != len(keys):
            raise cv.ArgumentError("streams: keys must be distinct")
        # Registered before the first read, so a write during it is not missed.
        waiter = service.registry.register(keys, 0, False, call)
        after = await _positions(service, call, request.streams)
        while True:
            argv = [b"XREAD", b"COUNT", b"%d" % batch, b"STREAMS"] + keys + [after[k] for k in keys]
            reply = _nonempty(await service._read(call, argv))
            if reply:
                for key, entries in reply:
                    after[key] = entries[-1][0]
                resp = pb.SubscribeResponse()
                cv.fill_streams(resp.streams, reply)
                yield resp
                continue
            await waiter.wait()
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001
        await service._abort(context, e, call)
    finally:
        if waiter is not None:
            service.registry.unregister(waiter)


async def _positions(service, call, streams) -> dict:
    """Each stream's resume position. "$" becomes the stream's last entry
    ID (0-0 if none): every later entry is above it, exactly as above
    its last_id, and nothing at or below it is ever served."""
    out = {}
    for s in streams:
        if s.WhichOneof("from") == "new_entries_only":
            last = await service._read(call, [b"XREVRANGE", s.key, b"+", b"-", b"COUNT", b"1"])
            out[s.key] = last[0][0] if last else b"0-0"
        else:
            out[s.key] = cv.id_text(s.after)
    return out


async def consume(service, request_iterator, context):
    """A consumer group's deliveries out, acks in. The first message is
    `start`; then a delivery task reads ">" (XREADGROUP through the log,
    several reads in flight) while fewer than max_unacked entries are out,
    and an ack task writes the ConsumeAcks as XACKs (those that arrive
    together in one record). Both feed one queue this generator drains:
    grpc allows one writer per call. A client's half-close ends the call
    once the acks it sent are confirmed."""
    call = None
    tasks = []
    try:
        first = await request_iterator.__anext__()
        if first.WhichOneof("body") != "start":
            raise cv.ArgumentError("the first Consume message must be start")
        start = first.start
        call = service._begin(start.options, context)
        call.deadline = None              # lives until cancelled
        call.client_id = call.seq = 0     # many writes: a request id would dedup them into one
        session = _ConsumeSession(service, call, start)
        tasks = [asyncio.ensure_future(session.deliver()), asyncio.ensure_future(session.take_acks(request_iterator))]
        while True:
            item = await session.out.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    except asyncio.CancelledError:
        raise
    except StopAsyncIteration:
        return
    except Exception as e:  # noqa: BLE001
        await service._abort(context, e, call)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except BaseException:  # noqa: BLE001 - cancelled or already reported through the queue
                pass


class _AckRun(NamedTuple):
    """One ack of a ConsumeAck carrying several (run_lengths): what write_acks and
    confirm_acks read of a ConsumeAck."""
    key: bytes
    ids: list
    ack_seq: int


def _ack_runs(ack) -> list:
    """The acks one ConsumeAck carries: itself, or one _AckRun per run_lengths entry
    (ack_seq, ack_seq + 1, ...). A client sends runs so that acks made together
    arrive together: one submit, one record, not a record for the first and
    another for the rest."""
    lengths = ack.run_lengths
    if not lengths:
        return [ack]
    if any(n == 0 for n in lengths) or sum(lengths) != len(ack.ids) or ack.ack_seq + len(lengths) > 1 << 64:
        raise cv.ArgumentError("run_lengths: each >= 1, summing to the number of ids")
    ids, key, seq = list(ack.ids), ack.key, ack.ack_seq
    out, at = [], 0
    for i, n in enumerate(lengths):
        out.append(_AckRun(key, ids[at:at + n], seq + i))
        at += n
    return out


class _ConsumeSession:
    """One Consume call's state.

    Window: at most max_unacked entries are delivered and not acked; an entry
    leaves the window only once its XACK is applied, and every read counts
    against the window before it is issued (delivered + requested never
    exceeds max_unacked).

    Deliveries are pipelined: up to READS_AHEAD XREADGROUP ">" reads of at
    most max_batch entries are in flight at once, and their results go out in
    issue order (= log order), one delivery message each. Reads run ahead only
    while the previous one came back full (the stream may hold more); a short
    or empty read means drained, and the session waits for the keys' next
    write.

    Acks are read as they arrive and written at once, without waiting for the
    writes before them to apply (up to MAX_ACK_WRITES submits in flight; each
    takes every ack queued by then, one XACK request per ack): the backend's
    group commit puts what arrives while the log is busy into its next record.
    Results go out in arrival order, each with its XACK's own count.

    The IDs an ack write releases count as room at once, and the write
    carries the reads that room allows, in the same submit behind its XACKs:
    they land in the same record, after the XACKs, so acks and the reads they
    make room for cost one fsync round, not two in a row. A read the delivery
    task issues on such room is held back until the ack writes it counted on
    have applied (the log may order it before them), so the client never holds
    more than max_unacked entries. If a write fails the session ends and the
    entries read and not delivered stay in the consumer's PEL
    (replay_pending_after), as any undelivered read."""

    def __init__(self, service, call, start: pb.ConsumeStart):
        cv.check_count("keys", start.keys, 1, MAX_CONSUME_KEYS)
        if len(set(start.keys)) != len(start.keys):
            raise cv.ArgumentError("keys must be distinct")
        if start.max_unacked > MAX_UNACKED:
            raise cv.ArgumentError(f"max_unacked: at most {MAX_UNACKED}")
        self.service, self.call, self.start = service, call, start
        self.keys = list(start.keys)
        self.window = start.max_unacked or DEFAULT_MAX_UNACKED
        self.batch = min(start.max_batch or cv.DEFAULT_BATCH, cv.MAX_BATCH)
        self.out: asyncio.Queue = asyncio.Queue()
        # The window: key -> {id bytes} delivered and not acked (no empty sets), and
        # the part of it whose XACK is being written (in flight, not yet applied).
        self.unacked: dict = {}
        self.n_unacked = 0
        self.releasing: dict = {}
        self.n_releasing = 0
        self.room = asyncio.Event()          # set when an ack may have opened the window
        # Reads in flight, in issue order: (future of the reply, entries requested,
        # ack writes that must have applied before it is delivered).
        self.inflight = collections.deque()
        self.reserved = 0                    # entries requested by the reads in flight
        self.ahead = 1                       # reads allowed in flight: 1 until one comes back full
        self.woken = False                   # a ">" read has found the group: reads now use the woken form
        self.acks: list = []                 # ConsumeAck read, not yet written
        self.acks_changed = asyncio.Event()  # acks queued, the input ended, or acks taken
        self.acks_ended = False
        self.writes: asyncio.Queue = asyncio.Queue()   # ack writes in flight, in submit order; None: the end
        self.write_slots = asyncio.Semaphore(MAX_ACK_WRITES)
        self.ack_writes_started = self.ack_writes_done = 0
        self.acks_applied = asyncio.Event()  # set when an ack write completes
        # Figures (tests): reads issued (those carried by ack writes included), XACK submits,
        # the acks they carried, and the reads they carried.
        self.reads = self.ack_writes = self.acks_written = self.reads_with_acks = 0

    def _room(self) -> int:
        """Entries the next read may ask for."""
        if self.start.no_ack:
            return self.batch
        return min(self.batch, self.window - self.n_unacked + self.n_releasing - self.reserved)

    def _readgroup_request(self, ids, count):
        self.reads += 1
        argv = cv.xreadgroup_argv(self.start.group, self.start.consumer, self.keys, ids, count, None,
                                  self.start.no_ack)
        if self.woken:
            # Once a read found the group, a later one that finds the key
            # deleted, retyped or the group destroyed fails as a blocked
            # redis XREADGROUP is woken: -UNBLOCKED / NOGROUP (engine xreadgroup_woken).
            return woken_xreadgroup_request(0, 0, argv)
        return resolve_command(0, 0, argv).request

    async def _readgroup(self, ids, count):
        """XREADGROUP through the log: its reply, [[key, [[id, fields], ...]], ...] or NULL_ARRAY."""
        return _ok((await self.service._submit(self.call, [self._readgroup_request(ids, count)]))[0])

    def _deliver(self, reply, track: bool) -> None:
        """One delivery message of a read's entries (streams with entries only);
        with `track`, they count against the window until acked."""
        resp = pb.ConsumeResponse()
        cv.fill_streams(resp.delivery.streams, reply)
        resp.delivery.ack_runs = ACK_RUNS
        if track:
            unacked = self.unacked
            for key, entries in reply:
                ids = unacked.get(key)
                if ids is None:
                    ids = unacked[key] = set()
                n = len(ids)
                ids.update([e[0] for e in entries])
                self.n_unacked += len(ids) - n
        self.out.put_nowait(resp)

    async def deliver(self) -> None:
        try:
            if self.start.HasField("replay_pending_after"):
                # This consumer's own history first (after a crash): it is
                # already in the PEL, so it does not count against the window.
                after = {k: cv.id_text(self.start.replay_pending_after) for k in self.keys}
                while True:
                    reply = _nonempty(await self._readgroup([after[k] for k in self.keys], self.batch))
                    if not reply:
                        break
                    for key, entries in reply:
                        after[key] = entries[-1][0]
                    self._deliver(reply, False)
            registry = self.service.registry
            waiter = registry.register(self.keys, 0, True, self.call)
            try:
                await self._deliver_loop(registry, waiter)
            finally:
                registry.unregister(waiter)
                reads = [t for t, _, _ in self.inflight]
                for t in reads:
                    t.cancel()
                for t in reads:
                    try:
                        await t
                    except BaseException:  # noqa: BLE001 - cancelled or failed: this session is ending
                        pass
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reported through the stream
            self.out.put_nowait(e)

    async def _deliver_loop(self, registry, waiter) -> None:
        ids = [b">"] * len(self.keys)
        inflight = self.inflight
        no_ack = self.start.no_ack
        while True:
            while len(inflight) < self.ahead:
                room = self._room()
                if room <= 0:
                    break
                # A read counting on acks in flight is delivered only after they applied.
                after = self.ack_writes_started if self.n_releasing else 0
                inflight.append((asyncio.ensure_future(self._readgroup(ids, room)), room, after))
                self.reserved += room
            if not inflight:
                if self.ahead == 0:          # drained: wait for the keys' next write
                    await waiter.wait()
                    self.ahead = 1
                else:                        # window full: wait for an ack
                    self.room.clear()
                    if not no_ack and self.window - self.n_unacked + self.n_releasing <= 0:
                        await self.room.wait()
                continue
            read, room, after = inflight[0]
            try:
                reply = _nonempty(await read)
                self.woken = True
                while self.ack_writes_done < after:   # the acks it counted on: applied first
                    self.acks_applied.clear()
                    await self.acks_applied.wait()
            finally:
                inflight.popleft()
                self.reserved -= room
            if reply:
                self._deliver(reply, not no_ack)
                # More may be there: the next consuming waiter's turn (not a new write).
                registry.on_ready(self.keys, recheck_in_flight=False)
            if any(len(entries) >= room for _, entries in reply):    # full: the stream may hold more
                self.ahead = READS_AHEAD
            elif self.ahead:
                self.ahead = 0               # drained: let the reads in flight finish, then wait

    async def take_acks(self, request_iterator) -> None:
        """Reads acks as they come (bounded: MAX_QUEUED_ACKS waiting to be written);
        write_acks writes them."""
        writer = asyncio.ensure_future(self.write_acks())
        try:
            async for req in request_iterator:
                if req.WhichOneof("body") != "ack":
                    raise cv.ArgumentError("only acks after start")
                ack = req.ack
                cv.check_count("ids", ack.ids, 1, MAX_ACK_IDS)
                runs = _ack_runs(ack)
                while len(self.acks) >= MAX_QUEUED_ACKS and not writer.done():
                    self.acks_changed.clear()
                    await self.acks_changed.wait()
                if writer.done():
                    break
                self.acks.extend(runs)
                self.acks_changed.set()
            self.acks_ended = True
            self.acks_changed.set()
            await writer
        except asyncio.CancelledError:
            writer.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - reported through the stream
            writer.cancel()
            self.out.put_nowait(e)

    async def write_acks(self) -> None:
        """Submits the queued acks (all of them, up to MAX_ACKS_PER_WRITE /
        MAX_ACK_IDS) as soon as a write slot is free, with the reads the room
        they open allows; confirm_acks reports the results. Puts the end (None)
        on `writes` once the input ended and everything read is submitted."""
        confirmer = asyncio.ensure_future(self.confirm_acks())
        try:
            group = self.start.group
            while not confirmer.done():
                if not self.acks:
                    if self.acks_ended:
                        self.writes.put_nowait(None)
                        break
                    self.acks_changed.clear()
                    await self.acks_changed.wait()
                    continue
                await self.write_slots.acquire()
                take, size = 0, 0
                while take < len(self.acks) and (take == 0 or (take < MAX_ACKS_PER_WRITE
                                                               and size + len(self.acks[take].ids) <= MAX_ACK_IDS)):
                    size += len(self.acks[take].ids)
                    take += 1
                acks, self.acks = self.acks[:take], self.acks[take:]
                self.acks_changed.set()          # room for the reader
                requests, released = [], []
                for ack in acks:
                    ids = [b"%d-%d" % (i.ms, i.seq) for i in ack.ids]     # cv.id_text
                    requests.append(resolve_command(0, 0, [b"XACK", ack.key, group, *ids]).request)
                    released.extend(self._release(ack.key, ids))
                self.ack_writes += 1
                self.acks_written += len(acks)
                self.ack_writes_started += 1
                reads = self._reads_behind(requests) if released else []
                task = asyncio.ensure_future(self.service._submit(self.call, requests))
                self.writes.put_nowait((task, acks, released, reads))
                if released:
                    self.room.set()              # more room than those reads took: the delivery task's
            await confirmer
        except asyncio.CancelledError:
            confirmer.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - reported through the stream
            confirmer.cancel()
            self.out.put_nowait(e)

    def _release(self, key, ids) -> list:
        """[(key, {id})]: the delivered IDs among `ids` that no write in flight
        releases yet; from now on they are releasing."""
        pending = self.unacked.get(key)
        if not pending:
            return []
        free = pending.intersection(ids)
        releasing = self.releasing.get(key)
        if releasing is None:
            if not free:
                return []
            releasing = self.releasing[key] = set()
        else:
            free -= releasing
            if not free:
                return []
        releasing |= free
        self.n_releasing += len(free)
        return [(key, free)]

    def _reads_behind(self, requests) -> list:
        """The reads the window's room allows now, appended to an ack write's
        requests (so after its XACKs in the log): their reply futures, also in
        `inflight` (in issue order)."""
        reads = []
        loop = asyncio.get_running_loop()
        ids = [b">"] * len(self.keys)
        while len(self.inflight) < self.ahead and not self.start.no_ack:
            room = self._room()
            if room <= 0:
                break
            requests.append(self._readgroup_request(ids, room))
            read = loop.create_future()
            self.inflight.append((read, room, self.ack_writes_started))
            self.reserved += room
            reads.append(read)
        self.reads_with_acks += len(reads)
        return reads

    async def confirm_acks(self) -> None:
        """The ack writes' results in submit order: one AckResult per ack (each
        XACK's own count), the released IDs out of the window, the reads they
        carried to the delivery task. Ends the call (None) after the last."""
        try:
            while True:
                item = await self.writes.get()
                if item is None:
                    self.out.put_nowait(None)
                    return
                task, acks, released, reads = item
                try:
                    results = await task
                except BaseException as e:
                    for read in reads:
                        if not read.done():
                            if isinstance(e, Exception):
                                read.set_exception(e)
                            else:
                                read.cancel()
                    raise
                self.write_slots.release()
                put = self.out.put_nowait
                for ack, acked in zip(acks, results):
                    put(pb.ConsumeResponse(ack_result=pb.ConsumeAckResult(ack_seq=ack.ack_seq, acked=_ok(acked))))
                n = 0
                for key, free in released:         # applied: out of the window
                    n += len(free)
                    pending = self.unacked[key]
                    pending -= free
                    if not pending:
                        del self.unacked[key]
                    releasing = self.releasing[key]
                    releasing -= free
                    if not releasing:
                        del self.releasing[key]
                self.n_unacked -= n
                self.n_releasing -= n
                for read, reply in zip(reads, results[len(acks):]):
                    if not read.done():          # (cancelled: the session is ending)
                        if isinstance(reply, EngineError):
                            read.set_exception(reply)
                        else:
                            read.set_result(reply)
                self.ack_writes_done += 1
                self.acks_applied.set()
                self.room.set()
        except asyncio.CancelledError:
            self._cancel_writes()
            raise
        except Exception as e:  # noqa: BLE001 - reported through the stream
            self._cancel_writes()
            self.out.put_nowait(e)

    def _cancel_writes(self) -> None:
        """The session is ending: the writes not yet confirmed are dropped (their
        acks are resent by the client on its next stream)."""
        while not self.writes.empty():
            item = self.writes.get_nowait()
            if item is not None:
                item[0].cancel()
                for read in item[3]:
                    read.cancel()
