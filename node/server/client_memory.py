"""Client memory: the bytes a node holds for its clients' requests, bounded in
bytes node-wide (ISSUE9 C6), not only by counts of clients and requests.

What is counted (one ClientMemory per node, shared by both front ends):
  RESP  per connection: the bytes it may read next (its read grant), its
        unparsed input and the parsed arguments of a command still arriving
        (the query buffer), and the command being executed (until its reply
        is produced: a write waiting for its Raft commit keeps its bytes).
  gRPC  per unary call: the request message's size (ByteSize), from the
        handler's start to its end (a write waiting for its commit included).
Reading is granted before it happens (asyncio.BufferedProtocol: the socket
is read into a buffer of the granted size), so the counted bytes never exceed
`limit`, whatever the number of clients or the size of their requests.

Over the limit, the choice per front end:
  RESP  backpressure: a connection without a grant stops reading (the kernel
        and TCP flow control hold the rest) and resumes, in FIFO order, when
        bytes are given back. No error: redis clients do not expect one.
  gRPC  refusal: a call whose message does not fit is answered at once with
        `BUSY ...` (gRPC UNAVAILABLE, retriable, nothing was done); the SDK
        retries it with backoff. grpc-core has already received the message
        by then: refusing it frees it, waiting would hold it.
Not counted (bounded elsewhere): replies (the RESP output-buffer limits; gRPC
replies are built once per call), Subscribe/Consume streams (their windows),
and what grpc-core buffers before a handler runs (max_concurrent_rpcs x the
16 MiB message limit).

Per-client limits stay redis's: `client-query-buffer-limit` (1 GiB) and
`proto-max-bulk-len` (512 MB) in the RESP parser (ServerLimits); `limit` here
is the node-wide total, a plain attribute (CONFIG SET may change it: a lower
limit takes effect as bytes are given back).
"""
import asyncio
import collections

from ..invariant import invariant

DEFAULT_CLIENT_MEMORY_BYTES = 1 << 30     # node-wide; --client-memory-bytes
IDLE_GRANT = 16 << 10                     # what an idle RESP connection may read before asking again
READ_GRANT = 256 << 10                    # at most this much per socket read
SPARE = 1                                 # grant kept back for the read the loop may make after a pause


class ClientMemory:
    """A byte budget: grants are taken before the bytes are held, given back after."""

    def __init__(self, limit: int = DEFAULT_CLIENT_MEMORY_BYTES):
        if limit < 1:
            raise ValueError("client memory limit must be positive")
        self.limit = limit
        self.used = 0                     # Invariant: 0 <= used; used <= limit unless limit was lowered
        self.peak = 0                     # the largest `used` seen (INFO, tests)
        self.refused = 0                  # gRPC calls refused for room
        self.overdrafts = 0               # reads past a grant (MeteredReading.get_buffer); expected 0
        self._waiting = collections.OrderedDict()   # owner -> callback, FIFO: readers paused for room

    def available(self) -> int:
        return max(0, self.limit - self.used)

    def take(self, n: int) -> bool:
        """All n bytes, or nothing (False)."""
        invariant(n >= 0, "negative grant")
        if self.used + n > self.limit:
            return False
        self._add(n)
        return True

    def take_up_to(self, n: int) -> int:
        """As many of n bytes as fit (0 when none do)."""
        got = min(n, self.available())
        if got > 0:
            self._add(got)
        return got

    def _add(self, n: int) -> None:
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def give_back(self, n: int) -> None:
        invariant(0 <= n <= self.used, "give_back(%d) with %d used" % (n, self.used))
        self.used -= n
        while self._waiting and self.used < self.limit:
            _, callback = self._waiting.popitem(last=False)
            callback()

    def wait_for_room(self, owner, callback) -> None:
        """callback() once some bytes are given back (FIFO among waiters)."""
        self._waiting[owner] = callback

    def cancel_wait(self, owner) -> None:
        self._waiting.pop(owner, None)

    @property
    def readers_waiting(self) -> int:
        return len(self._waiting)


class MeteredReading:
    """The RESP connection's side (a mixin for an asyncio.BufferedProtocol that
    has `transport`, `parser`, `closed`, `_reading_paused` and data_received()).

    The connection reads only into granted bytes: `_grant` is granted and not
    yet read into; `_held` is everything it holds in the budget (the grant,
    its unparsed input and partial command, the command executing). Reading
    is on exactly when it has a grant and its own input is not too large
    (`_reading_paused`, the server's input_pause_bytes rule)."""

    _memory = None
    _held = 0
    _grant = 0
    _readbuf = None

    def _memory_start(self, memory: ClientMemory) -> None:
        self._memory = memory
        self._arm()
        # uvloop starts reading after connection_made whatever it was told there:
        # pause again (if still wanted) before the loop polls this socket.
        asyncio.get_running_loop().call_soon(self._sync_reading)

    def _arm(self) -> None:
        """Top the grant up (or wait for room), then set reading."""
        if self.closed or self._memory is None:
            return
        if self._grant <= SPARE:
            got = self._memory.take_up_to(IDLE_GRANT - self._grant)
            self._grant += got
            self._held += got
            if self._grant <= SPARE:
                self._memory.wait_for_room(self, self._arm)
        self._sync_reading()

    def _sync_reading(self) -> None:
        want = self._grant > SPARE and not self._reading_paused and not self.closed
        t = self.transport
        if t is not None and not t.is_closing() and want != t.is_reading():
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    # asyncio.BufferedProtocol
    def get_buffer(self, sizehint: int):
        if self._memory is None:          # refused at connect (max clients): closing, read nothing
            return bytearray(1)
        if self._grant < READ_GRANT:
            more = self._memory.take_up_to(READ_GRANT - self._grant)
            self._grant += more
            self._held += more
        if self._grant > SPARE:
            size = self._grant - SPARE    # the spare stays for a read that races a pause
        elif self._grant > 0:
            size = self._grant            # paused, and the loop reads once more: the spare
        else:
            # A second read racing the pause (not seen with uvloop or asyncio): one byte
            # over the grant, counted, rather than a failed transport.
            self._memory.overdrafts += 1
            self._memory._add(1)
            self._grant = 1
            self._held += 1
            size = 1
        self._readbuf = bytearray(size)
        return self._readbuf

    def buffer_updated(self, nbytes: int) -> None:
        if self._memory is None:
            return
        data = bytes(memoryview(self._readbuf)[:nbytes])
        self._readbuf = None
        self._grant -= nbytes             # now input: still held until its command ends
        if self._grant > IDLE_GRANT:
            extra = self._grant - IDLE_GRANT
            self._grant = IDLE_GRANT
            self._release(extra)
        self.data_received(data)
        self._arm()

    def _release(self, n: int) -> None:
        if n > 0:
            self._held -= n
            self._memory.give_back(n)

    def _memory_settle(self) -> None:
        """Give back what the connection no longer holds: called when no command
        is executing (its bytes go back once its reply is produced)."""
        if self._memory is None:
            return
        parser = self.parser
        holds = parser.buffered_bytes + parser.partial_bytes + self._grant
        if self._held > holds:
            self._release(self._held - holds)

    def _memory_end(self) -> None:
        if self._memory is None:
            return
        self._memory.cancel_wait(self)
        self._grant = 0
        self._release(self._held)
