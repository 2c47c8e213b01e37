"""The at-most-once table: request id -> result, for the last requests of each client.

A client that does not hear back (leader change, timeout) retries the same
request id. If the first attempt was applied, applying the retry would apply
the write twice (two XADDs, two deliveries); instead apply returns the
result it recorded the first time. The table is replicated state: every
replica builds it from the same log, it is in the snapshot, and its
evictions happen at the same log position everywhere.

Bounds (all three written in the snapshot; the snapshot's values win):
  max_clients         clients remembered; the least recently used is evicted
  results_per_client  results kept per client, oldest evicted first. 1024 by
                      default: the SDK keeps the seqs of its writes in flight
                      within a span of 1024 // 4 (client/aio.py
                      MAX_TRACKED_WRITES), so none of them leaves the window
  max_result_bytes    a larger result is kept as a ResultNotKept marker: a retry
                      learns the request was applied, not its reply
Derived (not in the snapshot, a function of the three):
  client_byte_budget  max(16 * max_result_bytes, results_per_client * 256): the
                      bytes one client's results may hold. Over it, the oldest
                      results larger than their marker are replaced by the
                      marker (a retry of those learns "applied", not the reply).
                      16 results of max_result_bytes is what a client could hold
                      when the window was 16, so the table's worst case stays
                      max_clients * 16 * max_result_bytes (256 MiB by default)

Guarantees and their limits:
  * a retry of a request still in its client's window gets the original result;
  * a consuming attempt that served nothing (fsm/blocking.may_run_again: a
    blocked client's attempts all carry its one id) runs again under its id,
    and its new result replaces the empty one (record(again=True));
  * a retry of a request that fell out of the window (seq <= floor) gets
    StaleRequest and changes nothing: never applied twice;
  * a client evicted as least recently used is forgotten with its floor: a
    retry arriving after max_clients other clients were served since its last
    request is applied as new. Clients should not retry for that long.

Encoding (big-endian):

    +------------------+-------------------------+------------------------+--------------+
    | max_clients u32  | results_per_client u32  | max_result_bytes u32   | nclients u32 |
    +------------------+-------------------------+------------------------+--------------+
    | nclients x client, least recently used first                                        |
    +-------------------------------------------------------------------------------------+
    client: | client_id u64 | floor u64 | nres u32 | nres x ( seq u64 | len u32 | result ) |
      Invariant: client_id > 0 and unique; nres <= results_per_client; seqs unique,
      > floor, in apply order; result = results.encode_result bytes, len <= max_result_bytes.
"""
import struct
from collections import OrderedDict, deque

from ..engine.errors import CommandError
from ..invariant import invariant
from .errors import StaleRequest
from .results import CorruptResult, decode_result, encode_result

DEFAULT_MAX_CLIENTS = 1024
DEFAULT_RESULTS_PER_CLIENT = 1024   # = client/aio.py DEDUP_WINDOW (tests/client compares them)
DEFAULT_MAX_RESULT_BYTES = 16 << 10
LIMIT_CAP = 1 << 24                  # no bound may exceed this (snapshot sanity)
MIN_RESULT_BYTES = 256               # room for the ResultNotKept marker of any request id
BUDGET_RESULTS = 16                  # client_byte_budget: this many results of max_result_bytes

_HEAD = struct.Struct(">IIII")
_CLIENT = struct.Struct(">QQI")
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
    __slots__ = ("floor", "results", "nbytes", "big")

    def __init__(self, floor: int = 0):
        self.floor = floor                   # Invariant: every evicted seq <= floor
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
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES):
        for v in (max_clients, results_per_client, max_result_bytes):
            invariant(type(v) is int and 1 <= v <= LIMIT_CAP, "session bound out of range")
        invariant(max_result_bytes >= MIN_RESULT_BYTES, "max_result_bytes below the marker size")
        self.max_clients = max_clients
        self.results_per_client = results_per_client
        self.max_result_bytes = max_result_bytes
        self.clients = OrderedDict()         # client_id -> _Client, least recently used first

    @property
    def client_byte_budget(self) -> int:
        return max(BUDGET_RESULTS * self.max_result_bytes, self.results_per_client * MIN_RESULT_BYTES)

    def __len__(self):
        return len(self.clients)

    def lookup(self, client_id: int, seq: int):
        """(True, result) if the request was seen (its result, or StaleRequest),
        (False, None) if it is new. Marks the client as recently used."""
        invariant(client_id > 0 and seq > 0, "anonymous requests have no session")
        client = self.clients.get(client_id)
        if client is None:
            return False, None
        self.clients.move_to_end(client_id)
        raw = client.results.get(seq)
        if raw is not None:
            return True, decode_result(raw)
        if seq <= client.floor:
            return True, StaleRequest(client_id, seq)
        return False, None

    def record(self, client_id: int, seq: int, result, again: bool = False) -> None:
        """Remember the result of a request just applied; evict over the bounds.
        again=True: an attempt that ran again (fsm/blocking.may_run_again)
        replaces the empty result its id recorded, and moves to the end."""
        invariant(client_id > 0 and seq > 0, "anonymous requests have no session")
        client = self.clients.get(client_id)
        if client is None:
            client = self.clients[client_id] = _Client()
        self.clients.move_to_end(client_id)
        if again:
            client.forget(seq)
        invariant(seq not in client.results and seq > client.floor, "a request recorded twice")
        raw = encode_result(result)
        if len(raw) > self.max_result_bytes:
            raw = _marker(client_id, seq)
            invariant(len(raw) <= self.max_result_bytes, "the marker fits MIN_RESULT_BYTES")
        client.add(client_id, seq, raw)
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
        while len(self.clients) > self.max_clients:
            self.clients.popitem(last=False)

    # -- snapshot form -----------------------------------------------------------

    def encode(self) -> bytes:
        out = [_HEAD.pack(self.max_clients, self.results_per_client, self.max_result_bytes, len(self.clients))]
        for client_id, client in self.clients.items():
            out.append(_CLIENT.pack(client_id, client.floor, len(client.results)))
            for seq, raw in client.results.items():
                out += [_RES.pack(seq, len(raw)), raw]
        return b"".join(out)

    @classmethod
    def decode(cls, buf: bytes) -> "Sessions":
        """The table `encode` wrote; CorruptSessions on anything else."""
        if len(buf) < _HEAD.size:
            raise CorruptSessions("sessions header runs past the end")
        max_clients, per_client, max_bytes, nclients = _HEAD.unpack_from(buf, 0)
        for v in (max_clients, per_client, max_bytes):
            if not 1 <= v <= LIMIT_CAP:
                raise CorruptSessions("session bound %d out of range" % v)
        if max_bytes < MIN_RESULT_BYTES:
            raise CorruptSessions("max_result_bytes %d below %d" % (max_bytes, MIN_RESULT_BYTES))
        if nclients > max_clients or nclients * _CLIENT.size > len(buf) - _HEAD.size:
            raise CorruptSessions("bad client count %d" % nclients)
        table = cls(max_clients, per_client, max_bytes)
        pos = _HEAD.size
        for _ in range(nclients):
            if len(buf) - pos < _CLIENT.size:
                raise CorruptSessions("client runs past the end")
            client_id, floor, nres = _CLIENT.unpack_from(buf, pos)
            pos += _CLIENT.size
            if client_id == 0 or client_id in table.clients:
                raise CorruptSessions("client id %d zero or repeated" % client_id)
            if nres > per_client or nres * _RES.size > len(buf) - pos:
                raise CorruptSessions("bad result count %d" % nres)
            client = table.clients[client_id] = _Client(floor)
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
