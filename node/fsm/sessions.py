"""The at-most-once table (Raft thesis 6.3): client sessions and, per client,
request id -> result for its last requests.

A client that does not hear back (leader change, timeout) retries the same
request id. If the first attempt was applied, applying the retry would apply
the write twice (two XADDs, two deliveries); instead apply returns the
result it recorded the first time. The table is replicated state: every
replica builds it from the same log, it is in the snapshot, and its
expirations happen at the same log position everywhere.

Sessions: registered explicitly, expired by replicated time.

  * A client chooses a random 63-bit id and registers it with a REGISTER
    request (entry.Kind.REGISTER; the command `XRAFT.REGISTER <id>`) before
    its first request that carries the id. REGISTER creates the session, or
    refreshes it if it exists: applying it twice is harmless, so the client
    retries it freely.
  * A request whose client id has no session is refused with SessionExpired
    and changes nothing. Not a second apply: the id was registered once, so
    "no session" means it expired (or never existed), and whether an earlier
    attempt was applied before that can no longer be told. The client must
    register a new id; that request's outcome is unknown unless this was
    its first attempt (then it was never applied).
  * Expiry is a pure function of replicated time: at the start of every
    record, every session whose last activity (`last_ms`, the time of the
    last record that registered it or carried one of its requests) is more
    than `session_timeout_ms` before the record's time is dropped. Same log,
    same drops, on every replica. Replicated time never runs backwards, so
    the table is kept in last-activity order and expiry pops from its front.
  * Why explicit registration and not "a new id starts a session": with
    implicit sessions an expired client's retry is indistinguishable from a
    new client's first request, and is applied again (the bug this table had
    with LRU eviction). A re-registration of an id after it expired could
    reopen that gap, which is why a client never registers an id twice once
    it sent requests with it (client/aio.py picks a fresh id); a delayed
    REGISTER attempt cannot be applied that late either, because nothing is
    proposed after its call's deadline (grpc_service) and deadlines are far
    below the timeout.

Bounds (all written in the snapshot; the snapshot's values win):
  max_clients         sessions held. REGISTER of a new id when the table is
                      full (after expiring what the time allows) is refused
                      with SessionsFull, a retriable error: live sessions are
                      never evicted early, since that would turn their
                      retries into SESSION_EXPIRED for no reason
  session_timeout_ms  inactivity after which a session expires (1 hour, as
                      LogCabin; far above any client call deadline)
  results_per_client  results kept per client, oldest evicted first. 1024 by
                      default: the SDK keeps the seqs of its writes in flight
                      within a span of 1024 // 4 (client/aio.py
                      MAX_TRACKED_WRITES), so none of them leaves the window
  max_result_bytes    a larger result is kept as a ResultNotKept marker: a retry
                      learns the request was applied, not its reply
Derived (not in the snapshot, a function of the bounds):
  client_byte_budget  max(16 * max_result_bytes, results_per_client * 256): the
                      bytes one client's results may hold. Over it, the oldest
                      results larger than their marker are replaced by the
                      marker (a retry of those learns "applied", not the reply).
                      So the table holds at most max_clients * budget bytes
                      (+ ~40 bytes per session): 256 MiB by default.

Guarantees and their limits:
  * a retry of a request still in its client's window gets the original result;
  * a consuming attempt that served nothing (fsm/blocking.may_run_again: a
    blocked client's attempts all carry its one id) runs again under its id,
    and its new result replaces the empty one (record(again=True));
  * a retry of a request that fell out of the window (seq <= floor) gets
    StaleRequest and changes nothing: never applied twice;
  * a retry from a client whose session expired gets SessionExpired and
    changes nothing: never applied twice;
  * the timeout runs on the leader-stamped time, so a leader clock that jumps
    ahead would expire sessions early; resolve.TimeStamper bounds that jump.

Encoding (big-endian), version 2:

    +---------+---------+------------------+-------------------------+------------------------+
    | "XS" 2s | ver u16 | max_clients u32  | results_per_client u32  | max_result_bytes u32   |
    +---------+---------+------------------+-------------------------+------------------------+
    | session_timeout_ms u64 | nclients u32 | nclients x client, least recently active first  |
    +------------------------+--------------+-------------------------------------------------+
    client: | client_id u64 | floor u64 | last_ms u64 | nres u32 | nres x ( seq u64 | len u32 | result ) |
      Invariant: client_id > 0 and unique; last_ms non-decreasing along the
      table and <= the snapshot's time; nres <= results_per_client; seqs
      unique, > floor, in apply order; result = results.encode_result bytes,
      len <= max_result_bytes.
Version 1 (no "XS" header, no timeout, no last_ms; snapshots before sessions
expired) still decodes: its clients count as registered and active at the
snapshot's time (`decode(buf, now_ms)`), so they keep their results for one
timeout.
"""
import struct
from collections import OrderedDict, deque

from ..engine.errors import CommandError
from ..invariant import invariant
from .errors import SessionExpired, SessionsFull, StaleRequest
from .results import CorruptResult, decode_result, encode_result

DEFAULT_MAX_CLIENTS = 1024
DEFAULT_RESULTS_PER_CLIENT = 1024   # = client/aio.py DEDUP_WINDOW (tests/client compares them)
DEFAULT_MAX_RESULT_BYTES = 16 << 10
DEFAULT_SESSION_TIMEOUT_MS = 3_600_000
MAX_SESSION_TIMEOUT_MS = 1 << 40     # ~35 years: anything above is not a timeout (snapshot sanity)
LIMIT_CAP = 1 << 24                  # no bound may exceed this (snapshot sanity)
MIN_RESULT_BYTES = 256               # room for the ResultNotKept marker of any request id
BUDGET_RESULTS = 16                  # client_byte_budget: this many results of max_result_bytes
MAX_CLIENT_ID = (1 << 64) - 1

MAGIC = b"XS"
VERSION = 2
_HEAD = struct.Struct(">2sHIIIQI")   # magic, version, 3 bounds, timeout, nclients
_HEAD_V1 = struct.Struct(">IIII")    # 3 bounds, nclients
_CLIENT = struct.Struct(">QQQI")     # client_id, floor, last_ms, nres
_CLIENT_V1 = struct.Struct(">QQI")   # client_id, floor, nres
_RES = struct.Struct(">QI")


class CorruptSessions(ValueError):
    pass


class ResultNotKept(CommandError):
    def __init__(self, client_id: int, seq: int):
        super().__init__("ERR xraft: request %d of client %d was already applied; its reply was "
                         "too large to keep for retries" % (seq, client_id))


def _marker(client_id: int, seq: int) -> bytes:
    return encode_result(ResultNotKept(client_id, seq))


_SMALLEST_MARKER = len(_marker(1, 1))


def _demotable(client_id: int, seq: int, raw: bytes) -> bool:
    """Whether `raw` is larger than its marker (so replacing it saves bytes).
    A function of its arguments alone: the live table and a decoded one agree."""
    if len(raw) <= _SMALLEST_MARKER:
        return False
    return len(raw) > MIN_RESULT_BYTES or len(raw) > len(_marker(client_id, seq))


class _Client:
    __slots__ = ("floor", "last_ms", "results", "nbytes", "big")

    def __init__(self, last_ms: int, floor: int = 0):
        self.floor = floor                   # Invariant: every evicted seq <= floor
        self.last_ms = last_ms               # Invariant: time of its last activity; <= the applied time
        self.results = OrderedDict()         # seq -> encoded result, in apply order
        self.nbytes = 0                      # Invariant: sum of len(results values)
        self.big = deque()                   # seqs whose result is _demotable, in apply order

    def forget(self, seq: int) -> None:
        """Drop seq's result (an empty one that is about to be replaced)."""
        raw = self.results.pop(seq)
        invariant(len(raw) <= _SMALLEST_MARKER, "only an empty result is replaced (never in big)")
        self.nbytes -= len(raw)

    def add(self, client_id: int, seq: int, raw: bytes) -> None:
        self.results[seq] = raw
        self.nbytes += len(raw)
        if _demotable(client_id, seq, raw):
            self.big.append(seq)


class Sessions:
    def __init__(self, max_clients: int = DEFAULT_MAX_CLIENTS,
                 results_per_client: int = DEFAULT_RESULTS_PER_CLIENT,
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                 session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS):
        for v in (max_clients, results_per_client, max_result_bytes):
            invariant(type(v) is int and 1 <= v <= LIMIT_CAP, "session bound out of range")
        invariant(max_result_bytes >= MIN_RESULT_BYTES, "max_result_bytes below the marker size")
        invariant(type(session_timeout_ms) is int and 1 <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS,
                  "session timeout out of range")
        self.max_clients = max_clients
        self.results_per_client = results_per_client
        self.max_result_bytes = max_result_bytes
        self.session_timeout_ms = session_timeout_ms
        # client_id -> _Client, least recently active first.
        # Invariant: len <= max_clients; last_ms non-decreasing front to back.
        self.clients = OrderedDict()

    @property
    def client_byte_budget(self) -> int:
        return max(BUDGET_RESULTS * self.max_result_bytes, self.results_per_client * MIN_RESULT_BYTES)

    def __len__(self):
        return len(self.clients)

    def expire(self, now_ms: int) -> int:
        """Drop the sessions idle for more than the timeout at replicated time
        `now_ms` (called once per record, before its requests). How many went."""
        clients, cutoff, n = self.clients, now_ms - self.session_timeout_ms, 0
        while clients:
            first = next(iter(clients.values()))
            if first.last_ms >= cutoff:
                break
            clients.popitem(last=False)
            n += 1
        return n

    def _touch(self, client_id: int, client: _Client, now_ms: int) -> None:
        invariant(now_ms >= client.last_ms, "replicated time ran backwards")
        client.last_ms = now_ms
        self.clients.move_to_end(client_id)

    def register(self, client_id: int, now_ms: int):
        """REGISTER: open the session (or refresh it: idempotent). Returns
        None, or SessionsFull (a result) when a new session does not fit."""
        invariant(0 < client_id <= MAX_CLIENT_ID, "client id out of range")
        client = self.clients.get(client_id)
        if client is not None:
            self._touch(client_id, client, now_ms)
            return None
        if len(self.clients) >= self.max_clients:
            return SessionsFull(self.max_clients)
        self.clients[client_id] = _Client(now_ms)
        return None

    def lookup(self, client_id: int, seq: int, now_ms: int):
        """(True, result) if the request must not be applied (its recorded
        result, StaleRequest, or SessionExpired), (False, None) if it is new.
        Marks the client active at `now_ms`."""
        invariant(client_id > 0 and seq > 0, "anonymous requests have no session")
        client = self.clients.get(client_id)
        if client is None:
            return True, SessionExpired(client_id, seq)
        self._touch(client_id, client, now_ms)
        raw = client.results.get(seq)
        if raw is not None:
            return True, decode_result(raw)
        if seq <= client.floor:
            return True, StaleRequest(client_id, seq)
        return False, None

    def record(self, client_id: int, seq: int, result, again: bool = False) -> None:
        """Remember the result of a request just applied (lookup said new, or
        again=True: an attempt that ran again (fsm/blocking.may_run_again)
        replaces the empty result its id recorded, at the end of the order)."""
        invariant(client_id > 0 and seq > 0, "anonymous requests have no session")
        client = self.clients.get(client_id)
        invariant(client is not None, "a request recorded without a session")
        if again:
            client.forget(seq)
        invariant(seq not in client.results and seq > client.floor, "a request recorded twice")
        raw = encode_result(result)
        if len(raw) > self.max_result_bytes:
            raw = _marker(client_id, seq)
            invariant(len(raw) <= self.max_result_bytes, "the marker fits MIN_RESULT_BYTES")
        client.add(client_id, seq, raw)
        self._trim(client_id, client)

    def _trim(self, client_id: int, client: _Client) -> None:
        """Evict the oldest results over the count, then demote large ones over the budget."""
        while len(client.results) > self.results_per_client:
            old, old_raw = client.results.popitem(last=False)
            client.nbytes -= len(old_raw)
            if client.big and client.big[0] == old:
                client.big.popleft()
            client.floor = max(client.floor, old)
        budget = self.client_byte_budget
        while client.nbytes > budget and client.big:
            # The oldest large reply gives way (the newest are the likeliest retried).
            old = client.big.popleft()
            marker = _marker(client_id, old)
            client.nbytes += len(marker) - len(client.results[old])
            client.results[old] = marker

    def merge(self, other: "Sessions", now_ms: int) -> None:
        """Take the results of `other` (a slot move's source group's table) that this table
        lacks: a (client id, seq) is applied by one group only, so a retry that reaches this
        group after a move is answered with the source's result, never applied again. A client
        this table lacks is added, active at now_ms (if there is room); floors take the max."""
        for client_id, theirs in other.clients.items():
            mine = self.clients.get(client_id)
            if mine is None:
                if len(self.clients) >= self.max_clients:
                    continue
                mine = self.clients[client_id] = _Client(now_ms)
                self._touch(client_id, mine, now_ms)
            # Rebuilt in seq order (imported seqs interleave with ours), so eviction takes the
            # smallest seqs first and the floor never passes a result that is kept.
            results = dict(mine.results)
            for seq, raw in theirs.results.items():
                if seq not in results and len(raw) <= self.max_result_bytes:
                    results[seq] = raw
            floor = max(mine.floor, theirs.floor)
            fresh = _Client(mine.last_ms, floor)
            for seq in sorted(results):
                if seq > floor:
                    fresh.add(client_id, seq, results[seq])
            self.clients[client_id] = fresh
            self._trim(client_id, fresh)

    def newest(self, max_bytes: int) -> "Sessions":
        """A copy holding the most recently active clients whose encoding fits max_bytes."""
        out = Sessions(self.max_clients, self.results_per_client, self.max_result_bytes, self.session_timeout_ms)
        size, picked = _HEAD.size, []
        for client_id in reversed(self.clients):
            c = self.clients[client_id]
            size += _CLIENT.size + sum(_RES.size + len(r) for r in c.results.values())
            if size > max_bytes:
                break
            picked.append((client_id, c))
        for client_id, c in reversed(picked):
            out.clients[client_id] = c
        return out

    # -- snapshot form -----------------------------------------------------------

    def encode(self) -> bytes:
        out = [_HEAD.pack(MAGIC, VERSION, self.max_clients, self.results_per_client, self.max_result_bytes,
                          self.session_timeout_ms, len(self.clients))]
        for client_id, client in self.clients.items():
            out.append(_CLIENT.pack(client_id, client.floor, client.last_ms, len(client.results)))
            for seq, raw in client.results.items():
                out += [_RES.pack(seq, len(raw)), raw]
        return b"".join(out)

    @classmethod
    def decode(cls, buf: bytes, now_ms: int) -> "Sessions":
        """The table `encode` wrote (or a version 1 table), in a snapshot taken
        at replicated time `now_ms`; CorruptSessions on anything else."""
        if buf[:2] == MAGIC:
            if len(buf) < _HEAD.size:
                raise CorruptSessions("sessions header runs past the end")
            _, version, max_clients, per_client, max_bytes, timeout, nclients = _HEAD.unpack_from(buf, 0)
            if version != VERSION:
                raise CorruptSessions("unsupported sessions version %d" % version)
            if not 1 <= timeout <= MAX_SESSION_TIMEOUT_MS:
                raise CorruptSessions("session timeout %d out of range" % timeout)
            pos, client_struct = _HEAD.size, _CLIENT
        else:                                # version 1: no magic, no timeout, no last_ms
            if len(buf) < _HEAD_V1.size:
                raise CorruptSessions("sessions header runs past the end")
            max_clients, per_client, max_bytes, nclients = _HEAD_V1.unpack_from(buf, 0)
            timeout = DEFAULT_SESSION_TIMEOUT_MS
            pos, client_struct = _HEAD_V1.size, _CLIENT_V1
        for v in (max_clients, per_client, max_bytes):
            if not 1 <= v <= LIMIT_CAP:
                raise CorruptSessions("session bound %d out of range" % v)
        if max_bytes < MIN_RESULT_BYTES:
            raise CorruptSessions("max_result_bytes %d below %d" % (max_bytes, MIN_RESULT_BYTES))
        if nclients > max_clients or nclients * client_struct.size > len(buf) - pos:
            raise CorruptSessions("bad client count %d" % nclients)
        table = cls(max_clients, per_client, max_bytes, timeout)
        last_seen = 0
        for _ in range(nclients):
            if len(buf) - pos < client_struct.size:
                raise CorruptSessions("client runs past the end")
            if client_struct is _CLIENT:
                client_id, floor, last_ms, nres = _CLIENT.unpack_from(buf, pos)
            else:
                client_id, floor, nres = _CLIENT_V1.unpack_from(buf, pos)
                last_ms = now_ms
            pos += client_struct.size
            if client_id == 0 or client_id in table.clients:
                raise CorruptSessions("client id %d zero or repeated" % client_id)
            if not last_seen <= last_ms <= now_ms:
                raise CorruptSessions("client %d active at %d: out of order or after %d"
                                      % (client_id, last_ms, now_ms))
            last_seen = last_ms
            if nres > per_client or nres * _RES.size > len(buf) - pos:
                raise CorruptSessions("bad result count %d" % nres)
            client = table.clients[client_id] = _Client(last_ms, floor)
            for _ in range(nres):
                if len(buf) - pos < _RES.size:
                    raise CorruptSessions("result header runs past the end")
                seq, n = _RES.unpack_from(buf, pos)
                pos += _RES.size
                if seq <= floor or seq in client.results:
                    raise CorruptSessions("seq %d at or below the floor, or repeated" % seq)
                if n > max_bytes or n > len(buf) - pos:
                    raise CorruptSessions("result of %d bytes" % n)
                raw = buf[pos:pos + n]
                pos += n
                try:
                    decode_result(raw)
                except CorruptResult as e:
                    raise CorruptSessions("client %d seq %d: %s" % (client_id, seq, e)) from None
                client.add(client_id, seq, raw)
        if pos != len(buf):
            raise CorruptSessions("%d trailing bytes" % (len(buf) - pos))
        return table
