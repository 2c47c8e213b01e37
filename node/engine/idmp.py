"""Idempotent producers (Redis 8.6 IDMP): the per-stream table of recent
(producer id, idempotent id) pairs and the ID each one was added under.

Followed, page by page:
  https://redis.io/docs/latest/develop/data-types/streams/idempotency/  (modes, limits, expiry,
      "XCFGSET clears all existing tracking data", the XINFO STREAM fields)
  https://redis.io/docs/latest/commands/xadd/      (IDMP pid iid | IDMPAUTO pid, only with `*`)
  https://redis.io/docs/latest/commands/xcfgset/   (IDMP-DURATION 1..86400 s, IDMP-MAXSIZE 1..10000)
  redis tests/unit/type/stream.tcl of 8.6 (error texts, counters, eviction order, same-value
  XCFGSET keeps the history, a duplicate answers the first ID and adds nothing).

Unlike redis (where the table lives on one node and is lost with it on an
async failover), the table is part of the stream value: it is replicated by
the log, saved in the snapshot (stream_codec.py) and moves with the key. Its
clock is the record's replicated `now_ms` (never a clock read at apply), so
every replica expires the same pairs at the same log position.

Idempotent ids are kept as a 16-byte BLAKE2b digest (redis keeps an XXH128 of
them): a 64 KiB iid costs 16 bytes. IDMPAUTO's iid is the digest of the
entry's field/value pairs sorted (so field order does not matter, as in
redis), in another domain than IDMP's, so both modes never collide. hashlib
is deterministic across processes and PYTHONHASHSEEDs.

Limits: per producer at most `maxsize` ids (oldest evicted first, redis's
rule); per stream at most MAX_TRACKED_IIDS ids over all producers (xraft's
own bound on memory: redis has none; the oldest pair of any producer goes
first). A producer with no id left is forgotten (pids-tracked counts the
others).
"""
import hashlib
import struct
from collections import OrderedDict

from .errors import CommandError
from .streamid import StreamID

DEFAULT_DURATION_S = 100          # redis stream-idmp-duration default
DEFAULT_MAXSIZE = 100             # redis stream-idmp-maxsize default
MAX_DURATION_S = 86400
MAX_MAXSIZE = 10000
MAX_TRACKED_IIDS = 1_000_000      # xraft's bound per stream (all producers together)
MAX_PID_BYTES = 512 << 20         # a producer id is an argument: proto-max-bulk-len

ERR_TWICE = "ERR IDMP/IDMPAUTO specified multiple times"
ERR_AUTO_ID_ONLY = "ERR IDMP/IDMPAUTO can be used only with auto-generated IDs"
ERR_IDMP_EMPTY_PID = "ERR IDMP requires a non-empty producer ID"
ERR_IDMP_EMPTY_IID = "ERR IDMP requires a non-empty idempotent ID"
ERR_AUTO_EMPTY_PID = "ERR IDMPAUTO requires a non-empty producer ID"
ERR_DURATION_RANGE = "ERR IDMP-DURATION must be between 1 and %d seconds" % MAX_DURATION_S
ERR_MAXSIZE_RANGE = "ERR IDMP-MAXSIZE must be between 1 and %d entries" % MAX_MAXSIZE
ERR_CFG_EMPTY = "ERR At least one parameter must be specified"

_IID_MANUAL = b"\x01"             # digest domains: IDMP's iid, IDMPAUTO's content
_IID_AUTO = b"\x02"
_U32 = struct.Struct(">I")


def manual_iid(iid: bytes) -> bytes:
    """The 16-byte key of IDMP's idempotent id."""
    return hashlib.blake2b(_IID_MANUAL + iid, digest_size=16).digest()


def auto_iid(fields) -> bytes:
    """The 16-byte key IDMPAUTO derives from an entry's flat f1 v1 f2 v2 ...:
    the same pairs in any order give the same key; each string is
    length-prefixed so (b"ab", b"c") and (b"a", b"bc") differ."""
    h = hashlib.blake2b(_IID_AUTO, digest_size=16)
    pack = _U32.pack
    for f, v in sorted(zip(fields[0::2], fields[1::2])):
        h.update(pack(len(f)))
        h.update(f)
        h.update(pack(len(v)))
        h.update(v)
    return h.digest()


def check_producer(pid: bytes, auto: bool) -> None:
    if not pid:
        raise CommandError(ERR_AUTO_EMPTY_PID if auto else ERR_IDMP_EMPTY_PID)


class IdmpState:
    """The IDMP table of one stream (None on a stream that never used IDMP or
    XCFGSET: such a stream answers XINFO STREAM exactly as redis 7.0 does)."""

    __slots__ = ("duration_s", "maxsize", "iids_added", "iids_duplicates", "producers", "order")

    def __init__(self, duration_s: int = DEFAULT_DURATION_S, maxsize: int = DEFAULT_MAXSIZE):
        self.duration_s = duration_s      # Invariant: 1 <= duration_s <= MAX_DURATION_S
        self.maxsize = maxsize            # Invariant: 1 <= maxsize <= MAX_MAXSIZE
        self.iids_added = 0               # lifetime: ids recorded (not reset by XCFGSET)
        self.iids_duplicates = 0          # lifetime: duplicates answered
        # pid -> OrderedDict(iid key -> StreamID), oldest first.
        # Invariant: no producer's dict is empty; each holds at most maxsize ids.
        self.producers: dict = {}
        # (pid, iid key) -> added_ms, in insertion order (so in time order: the
        # replicated time never runs backwards). Invariant: exactly the pairs
        # of `producers`.
        self.order: OrderedDict = OrderedDict()

    @property
    def tracked(self) -> int:
        return len(self.order)

    def expire(self, now_ms: int) -> None:
        """Forget every pair older than the duration (added_ms + duration < now)."""
        horizon = now_ms - self.duration_s * 1000
        order = self.order
        while order:
            (pid, iid), added_ms = next(iter(order.items()))
            if added_ms >= horizon:
                break
            self._forget(pid, iid)

    def _forget(self, pid: bytes, iid: bytes) -> None:
        del self.order[(pid, iid)]
        ids = self.producers[pid]
        del ids[iid]
        if not ids:
            del self.producers[pid]

    def lookup(self, pid: bytes, iid: bytes):
        """The StreamID recorded for (pid, iid), or None."""
        ids = self.producers.get(pid)
        return None if ids is None else ids.get(iid)

    def record(self, pid: bytes, iid: bytes, sid: StreamID, now_ms: int) -> None:
        """Remember that (pid, iid) added `sid` at now_ms; evict the producer's
        oldest beyond maxsize and the stream's oldest beyond MAX_TRACKED_IIDS."""
        ids = self.producers.get(pid)
        if ids is None:
            ids = self.producers[pid] = OrderedDict()
        ids[iid] = sid
        self.order[(pid, iid)] = now_ms
        self.iids_added += 1
        while len(ids) > self.maxsize:
            self._forget(pid, next(iter(ids)))
        while len(self.order) > MAX_TRACKED_IIDS:
            self._forget(*next(iter(self.order)))

    def configure(self, duration_s, maxsize) -> None:
        """XCFGSET: a changed value clears every producer's history (the
        lifetime counters stay); setting the values it has changes nothing."""
        new_duration = self.duration_s if duration_s is None else duration_s
        new_maxsize = self.maxsize if maxsize is None else maxsize
        if (new_duration, new_maxsize) == (self.duration_s, self.maxsize):
            return
        self.duration_s, self.maxsize = new_duration, new_maxsize
        self.producers = {}
        self.order = OrderedDict()

    def info_fields(self) -> dict:
        """The XINFO STREAM fields, in redis 8.6's order."""
        return {b"idmp-duration": self.duration_s,
                b"idmp-maxsize": self.maxsize,
                b"pids-tracked": len(self.producers),
                b"iids-tracked": len(self.order),
                b"iids-added": self.iids_added,
                b"iids-duplicates": self.iids_duplicates}

    def pairs(self):
        """(pid, iid key, StreamID, added_ms) oldest first: what the snapshot keeps."""
        producers = self.producers
        for (pid, iid), added_ms in self.order.items():
            yield pid, iid, producers[pid][iid], added_ms


def idmp_of(stream, create: bool):
    """The stream's IdmpState, made with the defaults when `create`."""
    state = stream.idmp
    if state is None and create:
        state = stream.idmp = IdmpState()
    return state
