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

Idempotent ids are kept as 16-byte keys (redis keeps an XXH128 of them):
an id of 1..15 bytes as itself, zero-padded, its length in the last byte
(the SDK's ids are a few hex digits: no hashing per entry); a longer one as
its BLAKE2b digest (a 64 KiB iid costs 16 bytes). A digest equals a padded
short id with probability 2**-128, the same odds as two digests colliding.
IDMPAUTO's iid is the digest of the entry's field/value pairs sorted (so
field order does not matter, as in redis), in another domain than IDMP's,
so both modes never collide. hashlib is deterministic across processes and
PYTHONHASHSEEDs. A snapshot written before short ids were kept padded (stream
record version < 5) holds their digests: `legacy_until_ms` then says until
when a short id not found padded is looked up by its digest too
(`find_manual`), so a retry across the upgrade is still answered as a
duplicate.

Limits: per producer at most `maxsize` ids (oldest evicted first, redis's
rule); per stream at most MAX_TRACKED_IIDS ids over all producers (xraft's
own bound on memory: redis has none; the oldest pair of any producer goes
first). A producer with no id left is forgotten (pids-tracked counts the
others).
"""
import hashlib
import re
import struct
from collections import OrderedDict, deque

from ..invariant import invariant
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


SHORT_IID = 16                   # ids shorter than this are kept as themselves (module doc)
SHORT_IID_PADS = tuple(b"\x00" * (15 - n) + bytes((n,)) for n in range(SHORT_IID))


def legacy_iid(iid: bytes) -> bytes:
    """The key every IDMP id had before short ids were kept padded: its digest."""
    return hashlib.blake2b(_IID_MANUAL + iid, digest_size=16).digest()


def manual_iid(iid: bytes, _pads=SHORT_IID_PADS) -> bytes:
    """The 16-byte key of IDMP's idempotent id (module doc)."""
    n = len(iid)
    if n < SHORT_IID:
        return iid + _pads[n]
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


class _Chunk:
    """Pairs of one producer recorded at one time (one XADD, or one XADD
    batch's): a queue item. keys[i] is live only while its producer's dict
    maps it to (sid, this very chunk, i): a key evicted and recorded again
    within one batch is in `keys` twice, and only its later place, where it
    now stands in time order, is live. `live` counts the live places, `first`
    is where the places not known dead begin."""

    __slots__ = ("added_ms", "pid", "keys", "live", "first", "is_runs")

    def __init__(self, added_ms: int, pid: bytes):
        self.added_ms = added_ms
        self.pid = pid
        self.keys: list = []
        self.live = 0
        self.first = 0
        # A chunk of a producer in run form (_Runs): `keys` holds its runs, not keys (a run
        # evicted whole stays there with count 0); `first` is unused. _to_dict turns it back.
        self.is_runs = False


# A run: [first number, count, ms, seq, its _Chunk]: the pairs (hex(first + k) as an IDMP
# id, StreamID(ms, seq + k)) for k < count, recorded in this order by one IDMP_SEQ batch.
RUN_NUM, RUN_COUNT, RUN_MS, RUN_SEQ, RUN_CHUNK = range(5)


class _Runs:
    """A producer's pairs while all of them came from IDMP_SEQ batches whose ids rose
    (the SDK producer's first + count form): a deque of runs, oldest first, their
    numbers ascending and disjoint. A batch of N such ids costs one run (or a few, where
    an entry failed or the ID's sequence wrapped) instead of N dict inserts and
    N evictions. Any other use of the producer (a lookup by id, a single XADD, a batch
    whose ids may be tracked already) first turns it into the dict form
    (IdmpState._to_dict), until an IDMP_SEQ batch finds its pairs rising hex ids below its
    own (IdmpState._to_runs turns it back): what is tracked, and what pairs() yields
    (so XINFO STREAM and the snapshot bytes), is the same in both forms."""

    __slots__ = ("runs", "total")

    def __init__(self):
        self.runs: deque = deque()
        self.total = 0                    # Invariant: the counts of `runs` summed, >= 1 once stored

    def __len__(self) -> int:
        return self.total

    def end(self) -> int:
        """One past the highest number tracked: a batch from here on holds no tracked id."""
        last = self.runs[-1]
        return last[RUN_NUM] + last[RUN_COUNT]


class IdmpState:
    """The IDMP table of one stream (None on a stream that never used IDMP or
    XCFGSET: such a stream answers XINFO STREAM exactly as redis 7.0 does).

    producers: pid -> OrderedDict(iid key -> (StreamID, its _Chunk, its place
    in the chunk's keys)), oldest
    first. queue: the _Chunks in the order they were recorded, so in time
    order (the replicated time never runs backwards); expiry pops its head.
    A batch of N pairs is one chunk: the per-entry work is one dict probe, one
    insert and, past maxsize, one popitem of the producer's oldest (whose
    chunk's live count drops). A chunk whose pairs are all gone leaves the
    head at once, or, behind a live head, at the next compaction (when queued
    keys outnumber twice the live ones plus 4096: `_compact`, which walks the
    chunks, not their keys, but for the partly live ones: at most one per
    producer, since each producer loses its pairs oldest first)."""

    __slots__ = ("duration_s", "maxsize", "iids_added", "iids_duplicates", "producers", "queue", "tracked",
                 "queued", "legacy_until_ms")

    def __init__(self, duration_s: int = DEFAULT_DURATION_S, maxsize: int = DEFAULT_MAXSIZE):
        self.duration_s = duration_s      # Invariant: 1 <= duration_s <= MAX_DURATION_S
        self.maxsize = maxsize            # Invariant: 1 <= maxsize <= MAX_MAXSIZE
        self.iids_added = 0               # lifetime: ids recorded (not reset by XCFGSET)
        self.iids_duplicates = 0          # lifetime: duplicates answered
        # Invariant: no producer's dict is empty; each holds at most maxsize ids.
        self.producers: dict = {}
        # Invariant: every recorded pair's chunk is in here.
        self.queue: deque = deque()
        self.tracked = 0                  # Invariant: the pairs in `producers`, all producers together
        self.queued = 0                   # keys in the queue's chunks, dead ones included
        # (tracked, queued and iids_added lag behind inside one xadd_many batch that records
        # inline: begin_batch .. end_batch; nothing reads them in between.)
        # 0, or the newest added_ms of pairs loaded from a record of version < 5,
        # whose short ids are digests (module doc). Invariant: >= 0; back to 0
        # once expiry has passed it (every such pair is gone by then).
        self.legacy_until_ms = 0

    def _drop(self, chunk: _Chunk, pos: int) -> bool:
        """Forget chunk.keys[pos] if it is live there; whether it was."""
        ids = self.producers.get(chunk.pid)
        # (callers turn a live run chunk to keys first; a key chunk of a producer now in
        # run form is dead: _to_runs took its live pairs)
        if ids is None or chunk.is_runs or ids.__class__ is _Runs:
            return False
        key = chunk.keys[pos]
        value = ids.get(key)
        if value is None or value[1] is not chunk or value[2] != pos:
            return False
        del ids[key]
        chunk.live -= 1
        self.tracked -= 1
        if not ids:
            del self.producers[chunk.pid]
        return True

    def _pop_head(self) -> _Chunk:
        chunk = self.queue.popleft()
        self.queued -= len(chunk.keys)
        return chunk

    def drop_dead_head(self) -> None:
        """Pop the chunks at the queue's head that hold no live pair."""
        queue = self.queue
        while queue and not queue[0].live:
            self._pop_head()

    def expire(self, now_ms: int) -> None:
        """Forget every pair older than the duration (added_ms + duration < now)."""
        horizon = now_ms - self.duration_s * 1000
        queue = self.queue
        while queue and queue[0].added_ms < horizon:
            chunk = self._pop_head()
            if chunk.live:
                if chunk.is_runs:
                    self._drop_runs(chunk)
                    continue
                for pos in range(chunk.first, len(chunk.keys)):
                    self._drop(chunk, pos)
        if self.legacy_until_ms and self.legacy_until_ms < horizon:
            self.legacy_until_ms = 0

    def _drop_runs(self, chunk: _Chunk) -> None:
        """Forget the live pairs of a run chunk leaving the queue's head: its producer's
        oldest runs (every older chunk of that producer has left the queue already)."""
        runs = self.producers[chunk.pid]
        queue = runs.runs
        dropped = 0
        while queue and queue[0][RUN_CHUNK] is chunk:
            run = queue.popleft()
            dropped += run[RUN_COUNT]
            run[RUN_COUNT] = 0
        invariant(dropped == chunk.live, "a run chunk's live pairs are its producer's oldest")
        chunk.live = 0
        runs.total -= dropped
        self.tracked -= dropped
        if not runs.total:
            del self.producers[chunk.pid]

    def ids_of(self, pid: bytes):
        """pid's dict (turned from the run form if it is in it), or None."""
        ids = self.producers.get(pid)
        if ids is not None and ids.__class__ is _Runs:
            ids = self._to_dict(pid, ids)
        return ids

    def _to_dict(self, pid: bytes, runs: _Runs) -> OrderedDict:
        """Turn pid's runs into the dict form: the same pairs in the same order, each run
        chunk's keys written out in the chunk's place in the queue."""
        ids = OrderedDict()
        for num, count, ms, seq, chunk in runs.runs:
            if chunk.is_runs:             # its first live run: the chunk restarts as keys
                self.queued -= len(chunk.keys)
                chunk.keys, chunk.first, chunk.is_runs = [], 0, False
            keys = chunk.keys
            for k in range(count):
                key = manual_iid(b"%x" % (num + k))
                ids[key] = (StreamID(ms, seq + k), chunk, len(keys))
                keys.append(key)
            self.queued += count
        self.producers[pid] = ids
        return ids

    def _to_runs(self, pid: bytes, ids: OrderedDict, first: int):
        """Turn pid's dict into the run form (_to_dict's inverse: the same pairs in the same
        order, each chunk's live keys written as its runs in their places in the queue) and
        return it, if every key is a padded hex id (_seq_number) rising in the dict's order
        and below `first`; else None, changing nothing."""
        runs = []
        last = None
        end = -1                          # one past the last number: numbers must rise
        for key, (sid, chunk, _) in ids.items():
            num = _seq_number(key)
            if num is None or num < end:
                return None
            ms, seq = sid
            if (last is not None and last[RUN_CHUNK] is chunk and num == end
                    and ms == last[RUN_MS] and seq == last[RUN_SEQ] + last[RUN_COUNT]):
                last[RUN_COUNT] += 1
            else:
                last = [num, 1, ms, seq, chunk]
                runs.append(last)
            end = num + 1
        if end > first:
            return None
        out = _Runs()
        for run in runs:                  # the dict's order is the queue's: chunks in order
            chunk = run[RUN_CHUNK]
            if not chunk.is_runs:         # its first run: the chunk restarts as runs
                self.queued -= len(chunk.keys)
                chunk.keys, chunk.first, chunk.is_runs = [], 0, True
            chunk.keys.append(run)
            self.queued += 1
            out.runs.append(run)
            out.total += run[RUN_COUNT]
        self.producers[pid] = out
        return out

    def find_manual(self, ids, raw_iid: bytes, key: bytes):
        """The value `ids` (a producer's dict) holds for an IDMP id whose key
        is `key` (manual_iid(raw_iid)), trying its old digest key while pairs
        from an older record may hold one; None if neither is there."""
        value = ids.get(key)
        if value is None and self.legacy_until_ms and len(raw_iid) < SHORT_IID:
            value = ids.get(legacy_iid(raw_iid))
        return value

    def lookup(self, pid: bytes, iid: bytes):
        """The StreamID recorded for (pid, iid), or None."""
        ids = self.ids_of(pid)
        if ids is None:
            return None
        value = ids.get(iid)
        return None if value is None else value[0]

    def record(self, pid: bytes, iid: bytes, sid: StreamID, now_ms: int) -> None:
        """Remember that (pid, iid) added `sid` at now_ms (a pair lookup did not
        find); evict the producer's oldest beyond maxsize and the stream's
        oldest beyond MAX_TRACKED_IIDS."""
        chunk = self.new_chunk(pid, now_ms)
        self.record_in(chunk, self.producer_ids(pid), iid, sid)

    def new_chunk(self, pid: bytes, now_ms: int) -> _Chunk:
        """An empty chunk at the queue's tail, for pairs of `pid` recorded at now_ms."""
        chunk = _Chunk(now_ms, pid)
        self.queue.append(chunk)
        return chunk

    def producer_ids(self, pid: bytes) -> OrderedDict:
        """pid's dict, made empty if pid has none: record_in must put a pair in it at once."""
        ids = self.ids_of(pid)
        if ids is None:
            ids = self.producers[pid] = OrderedDict()
        return ids

    def record_in(self, chunk: _Chunk, ids: OrderedDict, iid: bytes, sid: StreamID) -> None:
        """record() into `chunk` (new_chunk's, the newest in the queue) and
        `ids`, its producer's dict (producer_ids'). `ids` stays the producer's
        dict afterwards: the evictions below take oldest pairs first and never
        the one just recorded (maxsize and MAX_TRACKED_IIDS are >= 1)."""
        keys = chunk.keys
        ids[iid] = (sid, chunk, len(keys))
        keys.append(iid)
        chunk.live += 1
        self.queued += 1
        self.tracked += 1
        self.iids_added += 1
        if len(ids) > self.maxsize:
            evicted = ids.popitem(last=False)[1][1]
            evicted.live -= 1
            self.tracked -= 1
            if not evicted.live and evicted is self.queue[0]:
                self.drop_dead_head()
        if self.tracked > MAX_TRACKED_IIDS:
            self._evict_oldest()
        if self.queued > 2 * self.tracked + 4096:
            self._compact()

    def begin_batch(self, pid: bytes, now_ms: int, n: int) -> tuple:
        """(chunk, pid's dict, fast) for recording up to n pairs of one XADD
        batch. `fast`: the stream-wide MAX_TRACKED_IIDS cannot be reached by
        this batch, so the caller may record each pair inline (`xadd_many`:
        the dict insert, the chunk's keys and live count, and the eviction of
        the producer's oldest beyond maxsize, as record_in does it), and then
        settles the counters once with end_batch. Not fast: record_in per pair."""
        chunk = self.new_chunk(pid, now_ms)
        return chunk, self.producer_ids(pid), self.tracked + n <= MAX_TRACKED_IIDS

    def end_batch(self, recorded: int, evicted: int) -> None:
        """Settle the counters after `recorded` inline recordings that evicted
        `evicted` pairs (begin_batch); compact as record_in would have (a
        compaction only moves keys inside the queue: it may run late)."""
        self.queued += recorded
        self.tracked += recorded - evicted
        self.iids_added += recorded
        if self.queued > 2 * self.tracked + 4096:
            self._compact()

    def run_target(self, pid: bytes, first: int, n: int):
        """pid's _Runs (a new one if pid has no pair) to record an IDMP_SEQ batch of n ids
        from `first` in run form (end_run_batch), after expire(); None when the batch must
        take the dict path: pid is in the dict form, an id of the batch may be tracked,
        digests of an older record may be (legacy_until_ms), or MAX_TRACKED_IIDS may be
        reached by the batch."""
        if self.legacy_until_ms or self.tracked + n > MAX_TRACKED_IIDS:
            return None
        runs = self.producers.get(pid)
        if runs is None:
            return _Runs()                # stored by end_run_batch once it holds a pair
        if runs.__class__ is not _Runs:
            # A producer in the dict form (a new SDK client's first batches carry one id
            # per entry until a server answered idempotent_id_first_ok): back to runs if
            # its pairs are rising IDMP_SEQ ids below this batch's. The walk is bounded by
            # what the batch's dict path would cost (or the default table), so a producer
            # that cannot turn does not pay a long walk per batch.
            if len(runs) > max(n, DEFAULT_MAXSIZE):
                return None
            return self._to_runs(pid, runs, first)
        if first < runs.end():
            return None
        return runs

    def end_run_batch(self, pid: bytes, runs: _Runs, now_ms: int, pieces: list) -> None:
        """Record a batch's pairs in run form (run_target's `runs`): pieces are
        (first number, count, ms, seq), ascending, none empty; then evict pid's oldest
        beyond maxsize, as record_in's popitem does pair by pair."""
        chunk = self.new_chunk(pid, now_ms)
        chunk.is_runs = True
        added = 0
        for num, count, ms, seq in pieces:
            run = [num, count, ms, seq, chunk]
            chunk.keys.append(run)
            runs.runs.append(run)
            added += count
        chunk.live = added
        runs.total += added
        self.producers[pid] = runs
        self.queued += len(pieces)
        self.tracked += added
        self.iids_added += added
        over = runs.total - self.maxsize
        if over > 0:
            runs.total -= over
            self.tracked -= over
            queue, head = runs.runs, self.queue
            while over:
                run = queue[0]
                k = min(over, run[RUN_COUNT])
                over -= k
                if k == run[RUN_COUNT]:
                    queue.popleft()
                    run[RUN_COUNT] = 0
                else:
                    run[RUN_NUM] += k
                    run[RUN_SEQ] += k
                    run[RUN_COUNT] -= k
                evicted = run[RUN_CHUNK]
                evicted.live -= k
                if not evicted.live and evicted is head[0]:
                    self.drop_dead_head()
        if self.queued > 2 * self.tracked + 4096:
            self._compact()

    def _evict_oldest(self) -> None:
        """Drop the oldest pairs of any producer until MAX_TRACKED_IIDS hold."""
        queue = self.queue
        while self.tracked > MAX_TRACKED_IIDS:
            chunk = queue[0]
            if chunk.is_runs and chunk.live:
                self._to_dict(chunk.pid, self.producers[chunk.pid])
            keys = chunk.keys
            while chunk.first < len(keys) and self.tracked > MAX_TRACKED_IIDS:
                self._drop(chunk, chunk.first)
                chunk.first += 1
            if not chunk.live:
                self._pop_head()

    def _compact(self) -> None:
        """Leave out the dead chunks, and the dead keys of partly live ones."""
        kept = deque()
        queued = 0
        producers = self.producers
        for chunk in self.queue:
            if not chunk.live:
                continue
            # (a run chunk stays whole: its runs evicted whole, count 0, are at most the
            # few its batch made)
            if not chunk.is_runs and chunk.live != len(chunk.keys) - chunk.first:
                ids = producers[chunk.pid]
                keys = []
                for pos in range(chunk.first, len(chunk.keys)):
                    key = chunk.keys[pos]
                    value = ids.get(key)
                    if value is not None and value[1] is chunk and value[2] == pos:
                        ids[key] = (value[0], chunk, len(keys))     # its new place (the dict order stays)
                        keys.append(key)
                chunk.keys = keys
                chunk.first = 0
            queued += len(chunk.keys)
            kept.append(chunk)
        self.queue, self.queued = kept, queued

    def configure(self, duration_s, maxsize) -> None:
        """XCFGSET: a changed value clears every producer's history (the
        lifetime counters stay); setting the values it has changes nothing."""
        new_duration = self.duration_s if duration_s is None else duration_s
        new_maxsize = self.maxsize if maxsize is None else maxsize
        if (new_duration, new_maxsize) == (self.duration_s, self.maxsize):
            return
        self.duration_s, self.maxsize = new_duration, new_maxsize
        self.producers = {}
        self.queue = deque()
        self.tracked = self.queued = 0

    def info_fields(self) -> dict:
        """The XINFO STREAM fields, in redis 8.6's order."""
        return {b"idmp-duration": self.duration_s,
                b"idmp-maxsize": self.maxsize,
                b"pids-tracked": len(self.producers),
                b"iids-tracked": self.tracked,
                b"iids-added": self.iids_added,
                b"iids-duplicates": self.iids_duplicates}

    def pairs(self):
        """(pid, iid key, StreamID, added_ms) oldest first, each pair once, in
        the order recorded: what the snapshot keeps."""
        producers = self.producers
        for chunk in self.queue:
            if not chunk.live:
                continue
            if chunk.is_runs:
                for num, count, ms, seq, _ in chunk.keys:
                    for k in range(count):
                        yield chunk.pid, manual_iid(b"%x" % (num + k)), StreamID(ms, seq + k), chunk.added_ms
                continue
            ids = producers[chunk.pid]
            keys = chunk.keys
            for pos in range(chunk.first, len(keys)):
                value = ids.get(keys[pos])
                if value is not None and value[1] is chunk and value[2] == pos:
                    yield chunk.pid, keys[pos], value[0], chunk.added_ms

    def load_pair(self, pid: bytes, iid: bytes, sid: StreamID, added_ms: int) -> bool:
        """Put back one pair of pairs() (stream_codec); False if it is there already.
        Pairs of one producer and time join the queue's last chunk. A producer whose
        pairs are rising IDMP_SEQ ids comes back in run form (a restarted replica keeps
        recording the SDK's batches as runs); at its first other pair, the dict form."""
        ids = self.producers.get(pid)
        if ids is None or ids.__class__ is _Runs:
            if self._load_into_runs(pid, ids, iid, sid, added_ms):
                return True
            ids = self.ids_of(pid)
        if ids is None:
            ids = self.producers[pid] = OrderedDict()
        if iid in ids:
            return False
        queue = self.queue
        chunk = queue[-1] if queue else None
        if chunk is None or chunk.pid != pid or chunk.added_ms != added_ms:
            chunk = self.new_chunk(pid, added_ms)
        ids[iid] = (sid, chunk, len(chunk.keys))
        chunk.keys.append(iid)
        chunk.live += 1
        self.queued += 1
        self.tracked += 1
        return True

    def _load_into_runs(self, pid: bytes, runs, iid: bytes, sid: StreamID, added_ms: int) -> bool:
        """load_pair for pid in run form (runs) or without pairs (None): whether the pair
        joined its runs (a padded hex id above every number pid holds)."""
        num = _seq_number(iid)
        if num is None or (runs is not None and num < runs.end()):
            return False
        queue = self.queue
        chunk = queue[-1] if queue else None
        if chunk is None or chunk.pid != pid or chunk.added_ms != added_ms:
            chunk = self.new_chunk(pid, added_ms)
            chunk.is_runs = True
        invariant(chunk.is_runs, "a producer in run form has run chunks only")
        if runs is None:
            runs = self.producers[pid] = _Runs()
        last = runs.runs[-1] if runs.runs else None
        if (last is not None and last[RUN_CHUNK] is chunk and num == last[RUN_NUM] + last[RUN_COUNT]
                and sid == (last[RUN_MS], last[RUN_SEQ] + last[RUN_COUNT])):
            last[RUN_COUNT] += 1
        else:
            run = [num, 1, sid[0], sid[1], chunk]
            chunk.keys.append(run)
            runs.runs.append(run)
            self.queued += 1
        chunk.live += 1
        runs.total += 1
        self.tracked += 1
        return True


# The IDMP_SEQ form's ids: lowercase hex without leading zeros. Of 16 digits or more, the
# key is a digest (manual_iid), whose id cannot be read back: the dict form keeps those.
_SEQ_HEX = re.compile(rb"(?:0|[1-9a-f][0-9a-f]{0,14})\Z")


def _seq_number(key: bytes):
    """The number whose hex id is kept as `key` (a padded short id), or None."""
    if len(key) != SHORT_IID:
        return None
    n = key[-1]
    if n >= SHORT_IID or key[n:] != SHORT_IID_PADS[n] or not _SEQ_HEX.match(key, 0, n):
        return None
    return int(key[:n], 16)


def idmp_of(stream, create: bool):
    """The stream's IdmpState, made with the defaults when `create`."""
    state = stream.idmp
    if state is None and create:
        state = stream.idmp = IdmpState()
    return state
