"""Stream storage: redis 7.0's radix tree of listpack nodes (`t_stream.c`).

A stream is a rax keyed by each node's *master ID* (`StreamID.encode()`, 16
bytes big-endian, so key order is ID order); each value is one listpack
("node") holding up to stream-node-max-entries entries / stream-node-max-bytes
bytes.  The bytes of every node are exactly redis 7.0's, so node boundaries --
and with them XTRIM `~`, XINFO radix-tree-keys/nodes -- match redis.

One node (a listpack; every box is one listpack element):

    master entry
    +-------+---------+------------+---------+-----+---------+---+
    | count | deleted | num-fields | field_1 | ... | field_N | 0 |
    +-------+---------+------------+---------+-----+---------+---+
    then one or more entries, each either
    +-------+---------+----------+------------+---------+---------+-----+----------+
    | flags | ms-diff | seq-diff | num-fields | field_1 | value_1 | ... | lp-count |
    +-------+---------+----------+------------+---------+---------+-----+----------+
    or, with flags & SAMEFIELDS (its field names are the master fields):
    +-------+---------+----------+---------+-----+---------+----------+
    | flags | ms-diff | seq-diff | value_1 | ... | value_N | lp-count |
    +-------+---------+----------+---------+-----+---------+----------+

    count       Invariant: number of entries in the node without the DELETED
                flag (may be 0 only after an exact MINID trim left tombstones).
    deleted     Invariant: number of entries with the DELETED flag;
                count + deleted >= 1 (a node is never empty).
    num-fields  Invariant: >= 1 (XADD needs a field); master field names are
                those of the node's first entry.
    0           the master terminator: reading right to left, an lp-count of 0
                says "no entry before this point".
    flags       NONE 0, DELETED 1 (tombstone: skipped by readers), SAMEFIELDS 2.
    ms-diff,    ID minus the node's master ID, each half as uint64 arithmetic
    seq-diff    stored as int64 (so it may be negative; readers add mod 2**64).
                Invariant: the first entry of a node has diffs 0, 0 (the master
                ID is the ID of the entry that created the node).
    lp-count    Invariant: elements in this entry before lp-count:
                3 + N (SAMEFIELDS) or 3 + 1 + 2N.
    Integers are listpack integers; strings that spell an int64 are stored as
    integers (listpack.py) and come back rendered as decimal bytes.

A new node starts (redis streamAppendItem) when the tail node has
lp_bytes + (total field/value bytes) >= node_max_bytes (0 or > 1 GiB means
1 GiB), or when node_max_entries != 0 and count + deleted >= node_max_entries.

Dump (`dump_entries`), all integers big-endian:

    +------+---+--------+---------+----------+-------------+---------+-------+
    |"XSTM"| 1 | length | last_id | first_id | max_del_id  | entries | nodes |
    |  4   | 1 |  u64   | 2 x u64 | 2 x u64  |  2 x u64    | added   |  u32  |
    |      |   |        |         |          |             |  u64    |       |
    +------+---+--------+---------+----------+-------------+---------+-------+
    then `nodes` times:  | master key (16) | lp size u32 | listpack bytes |
    then                 | crc32 (zlib) of everything before, u32 |

In memory every node but the tail is an exact-size `bytes` (sealed when the
next node starts); the tail is a `bytearray` that XADD extends in place through
a cached reference, so appending needs no rax seek.  Readers decode a whole
node with one lp_decode_all pass and walk the element list.

Consumer groups (`cgroups`) belong to groups.py, the IDMP table (`idmp`) to
idmp.py and the retention policy (`retention`) to refs.py: this module only holds the references and neither dumps nor reads
them (stream_codec.py does).
"""
import struct
import zlib
from collections import OrderedDict
from bisect import bisect_left

from ..accel import compiled
from ..invariant import invariant
from .keyspace import register_type
from .listpack import (
    LP_HDR_SIZE, LP_SMALL_INT, CorruptListpack, lp_append_entries, lp_append_many, lp_decode_all, lp_encode,
    lp_first, lp_get_int, lp_get_with_next, lp_last, lp_new, lp_next, lp_prev, lp_replace_int, lp_validate,
)
from .rax import Rax
from .streamid import MAX_ID, MIN_ID, UINT64_MAX, StreamID

FLAG_NONE = 0
FLAG_DELETED = 1
FLAG_SAMEFIELDS = 2

# redis: no node may grow past 1 GiB whatever stream-node-max-bytes says, and
# XADD refuses entries whose field/value bytes add up to more than that.
STREAM_LISTPACK_MAX_SIZE = 1 << 30

_M64 = UINT64_MAX
_I64_MAX = (1 << 63) - 1
_I64_MIN = -(1 << 63)
_TWO64 = 1 << 64
_ZERO_KEY = bytes(16)
_new_id = tuple.__new__          # StreamID(ms, seq) without a Python-level __new__ frame

_DUMP_MAGIC = b"XSTM"
_DUMP_VERSION = 1
_DUMP_HEADER = struct.Struct(">4sBQQQQQQQQI")
_DUMP_NODE = struct.Struct(">16sI")
_DUMP_CRC = struct.Struct(">I")
_LP_MAX_BYTES = (1 << 32) - 1   # the listpack header's u32 size field
_MIN_NODE_LP = 7 + 2 * 9        # header+EOF and at least 9 two-byte elements


class CorruptStream(ValueError):
    """A stream dump (from disk or a peer) failed validation."""


def _diff(a: int, b: int) -> int:
    """(a - b) mod 2**64 as int64, as redis stores ID deltas."""
    d = (a - b) & _M64
    return d - _TWO64 if d > _I64_MAX else d


def _as_bytes(v) -> bytes:
    return v if v.__class__ is bytes else b"%d" % v


_ENC_SAMEFIELDS = lp_encode(FLAG_SAMEFIELDS)
_ENC_NONE = lp_encode(FLAG_NONE)


class _Master:
    """The master entry of one node, read with offsets (slow paths only)."""
    __slots__ = ("count", "deleted", "names", "first_entry")

    def __init__(self, lp):
        p = lp_first(lp)
        self.count = lp_get_int(lp, p)               # live entries
        p = lp_next(lp, p)
        self.deleted = lp_get_int(lp, p)             # tombstones
        p = lp_next(lp, p)
        nmf = lp_get_int(lp, p)
        names = []
        for _ in range(nmf):
            p = lp_next(lp, p)
            names.append(_as_bytes(lp_get_with_next(lp, p)[0]))
        self.names = names                           # master field names as bytes
        p = lp_next(lp, p)                           # the 0 terminator
        self.first_entry = lp_next(lp, p)            # offset of the first entry's flags


def _walk_offsets(lp, p: int, nmf: int):
    """Yield (flags offset, flags, ms-diff, seq-diff) of each entry from offset
    `p` (a node's first entry) on, by offsets: for edits in place."""
    while p != -1:
        fp = p
        flags, p = lp_get_with_next(lp, p)
        msd, p = lp_get_with_next(lp, p)
        seqd, p = lp_get_with_next(lp, p)
        if flags & FLAG_SAMEFIELDS:
            skip = nmf
        else:
            nf, p = lp_get_with_next(lp, p)
            skip = 2 * nf
        for _ in range(skip + 1):                    # values (and fields), lp-count
            p = lp_next(lp, p)
        yield fp, flags, msd, seqd


def _set_master_counts(lp: bytearray, count: int, deleted: int) -> None:
    p = lp_first(lp)
    lp_replace_int(lp, p, count)
    lp_replace_int(lp, lp_next(lp, p), deleted)


class Stream:
    """One stream value. See the module docstring for the bytes."""

    __slots__ = ("rax", "length", "last_id", "first_id", "max_deleted_entry_id",
                 "entries_added", "cgroups", "idmp", "retention",
                 "_tail", "_tail_key", "_tail_ms", "_tail_seq", "_tail_names", "_tail_items")

    def __init__(self):
        self.rax = Rax()                 # 16-byte master ID -> node (bytes; the tail is a bytearray)
        self.length = 0                  # Invariant: == sum of the nodes' count fields
        self.last_id = MIN_ID            # Invariant: >= every live entry's ID (XSETID may move it)
        self.first_id = MIN_ID           # Invariant: first live entry's ID; 0-0 when length == 0
        self.max_deleted_entry_id = MIN_ID  # largest ID XDEL removed (XSETID may set it)
        self.entries_added = 0           # Invariant: >= length; every entry ever added
        self.cgroups = None              # groups.py's rax of consumer groups, or None
        self.idmp = None                 # idmp.py's IdmpState, or None (never used IDMP/XCFGSET)
        self.retention = None            # refs.py: None, or "acked" (XCFGSET RETENTION ACKED)
        # Tail cache, so XADD needs no rax seek. Invariant: when _tail is not
        # None it is the very bytearray stored in rax under _tail_key, that key
        # is the rax's last, and the other fields describe its master entry.
        self._tail = None
        self._tail_key = b""
        self._tail_ms = 0
        self._tail_seq = 0
        self._tail_names = None          # master field names (bytes)
        self._tail_items = 0             # count + deleted of the tail node

    # ------------------------------------------------------------------ append

    def _load_tail(self):
        """Point the tail cache at the rax's last node (made a bytearray)."""
        last = self.rax.last()
        if last is None:
            return None
        key, lp = last
        if lp.__class__ is not bytearray:
            lp = bytearray(lp)
            self.rax.insert(key, lp)
        master = _Master(lp)
        self._tail, self._tail_key = lp, key
        self._tail_ms, self._tail_seq = StreamID.decode(key)
        self._tail_names = master.names
        self._tail_items = master.count + master.deleted
        return lp

    def _drop_tail(self, seal: bool) -> None:
        """Forget the tail cache; with seal, store the node as exact-size bytes."""
        if seal and self._tail is not None:
            self.rax.insert(self._tail_key, bytes(self._tail))
        self._tail = None

    def append(self, sid: StreamID, fields: list, node_max_bytes: int, node_max_entries: int) -> None:
        """Add entry `sid` (> last_id, checked by the caller) with flat field/value list `fields`."""
        ms, seq = sid
        if not (sid > self.last_id and ms <= _M64 and seq <= _M64):
            invariant(False, "append of %r after %r" % (sid, self.last_id))
        nfv = len(fields)
        if nfv < 2 or nfv & 1:
            invariant(False, "append needs field/value pairs, got %d items" % nfv)
        numfields = nfv >> 1
        totelelen = sum(map(len, fields))
        if totelelen > STREAM_LISTPACK_MAX_SIZE:
            invariant(False, "entry of %d bytes, redis refuses > 1 GiB" % totelelen)
        names = fields[0::2]

        lp = self._tail
        if lp is None:
            lp = self._load_tail()
        if lp is not None:
            max_bytes = node_max_bytes
            if max_bytes <= 0 or max_bytes > STREAM_LISTPACK_MAX_SIZE:
                max_bytes = STREAM_LISTPACK_MAX_SIZE
            if (len(lp) + totelelen >= max_bytes
                    or (node_max_entries and self._tail_items >= node_max_entries)):
                self._drop_tail(seal=True)
                lp = None

        if lp is None:
            # A new node: the master entry takes this entry's field names, and
            # the entry itself is SAMEFIELDS with diffs 0, 0.
            lp = lp_new()
            lp_append_many(lp, [1, 0, numfields, *names, 0, FLAG_SAMEFIELDS, 0, 0,
                                *fields[1::2], numfields + 3])
            key = sid.encode()
            self.rax.insert(key, lp)
            if self.rax.last()[0] == key:
                self._tail, self._tail_key = lp, key
                self._tail_ms, self._tail_seq = ms, seq
                self._tail_names = [_as_bytes(n) for n in names]
                self._tail_items = 1
            # else: only after XSETID moved last_id below an existing node; the
            # new node is not the last and redis keeps appending to the last ("$").
        else:
            # Bump the master count. Fast path: a 7-bit uint entry (the value
            # byte, then back-length 1) keeps its single byte below 127.
            c = lp[LP_HDR_SIZE]
            if c < 127:
                lp[LP_HDR_SIZE] = c + 1
            else:
                lp_replace_int(lp, LP_HDR_SIZE, lp_get_int(lp, LP_HDR_SIZE) + 1)
            msd = ms - self._tail_ms
            if msd > _I64_MAX or msd < _I64_MIN:      # only huge jumps wrap (uint64 deltas)
                msd = _diff(ms, self._tail_ms)
            seqd = seq - self._tail_seq
            if seqd > _I64_MAX or seqd < _I64_MIN:
                seqd = _diff(seq, self._tail_seq)
            # The diffs of a node's entries are small: their encodings come
            # from the table lp_encode itself would read, without the call.
            msd = LP_SMALL_INT[msd + 4096] if -4096 <= msd <= 4095 else lp_encode(msd)
            seqd = LP_SMALL_INT[seqd + 4096] if -4096 <= seqd <= 4095 else lp_encode(seqd)
            if names == self._tail_names:
                lp_count = LP_SMALL_INT[numfields + 4099] if numfields <= 4092 else lp_encode(numfields + 3)
                lp_append_entries(lp, _ENC_SAMEFIELDS + msd + seqd, fields, 1, 2, lp_count, numfields + 4)
            else:
                lp_append_entries(lp, b"".join((_ENC_NONE, msd, seqd, lp_encode(numfields))), fields, 0, 1,
                                  lp_encode(nfv + 4), nfv + 5)
            self._tail_items += 1
        self.length += 1
        self.entries_added += 1
        self.last_id = sid
        if self.length == 1:
            self.first_id = sid

    def next_auto_id(self, now_ms: int):
        """redis streamNextID for `*`: never behind last_id; None past the largest ID."""
        last = self.last_id
        if now_ms > last.ms:
            return StreamID(now_ms, 0)
        return last.incr()

    # ------------------------------------------------------------------ reading

    def _nodes(self, start_key: bytes, reverse: bool):
        """Yield (key, node) from where redis' streamIteratorStart seeks.

        The rax iterator is re-seeked for every node, so a caller may change
        the stream between two nodes without confusing the walk."""
        it = self.rax.iterator()
        found = ((start_key != _ZERO_KEY and it.seek("<=", start_key))
                 or it.seek("$" if reverse else "^"))
        op = "<" if reverse else ">"
        while found:
            key = it.key
            yield key, it.data
            found = it.seek(op, key)

    def iter_range(self, start: StreamID = MIN_ID, end: StreamID = MAX_ID, reverse: bool = False):
        """Yield (StreamID, [field, value, ...]) for live entries in [start, end].

        Same walk as redis' stream iterator: forward, the first live entry
        >= start that is > end ends the walk (reverse: the first <= end that
        is < start)."""
        smin = (start[0], start[1])
        smax = (end[0], end[1])
        seek_id = end if reverse else start
        first = not reverse
        for key, lp in self._nodes(StreamID(*seek_id).encode(), reverse):
            mms, mseq = int.from_bytes(key[:8], "big"), int.from_bytes(key[8:], "big")
            if first:
                # The seek lands on the node whose master is <= start; when all
                # of it is < start (an XREADGROUP `>` right after a node's last
                # entry: start = last + 1), skip it instead of decoding it whole.
                # Later nodes begin past start. Reading the last ID is ~1% of a decode.
                first = False
                if _node_last_id(lp, mms, mseq) < smin:
                    continue
            entries = _decode_node(lp, mms, mseq)
            if not reverse:
                for item in entries:
                    sid = item[0]
                    if sid >= smin:
                        if sid > smax:
                            return
                        yield item
            else:
                for item in reversed(entries):
                    sid = item[0]
                    if sid <= smax:
                        if sid < smin:
                            return
                        yield item

    def live_ids(self, start: StreamID, count: int = 0) -> list:
        """The IDs iter_range(start, MAX_ID) would yield, the first `count`
        (0 = all), decoding no field or value: iter_range's walk with the node
        layout read in place (see the layout at the top)."""
        smin = (start[0], start[1])
        out = []
        append = out.append
        new_id = tuple.__new__
        m64 = UINT64_MAX
        first = True
        for key, lp in self._nodes(StreamID(*smin).encode(), False):
            mms, mseq = int.from_bytes(key[:8], "big"), int.from_bytes(key[8:], "big")
            if first:
                first = False
                if _node_last_id(lp, mms, mseq) < smin:
                    continue                        # as in iter_range
            els = lp_decode_all(lp)
            nmf = els[2]
            n = len(els)
            i = 4 + nmf
            while i < n:
                flags = els[i]
                k = i + 3 + nmf if flags & FLAG_SAMEFIELDS else i + 4 + 2 * els[i + 3]
                if not flags & FLAG_DELETED:
                    sid = new_id(StreamID, ((mms + els[i + 1]) & m64, (mseq + els[i + 2]) & m64))
                    if sid >= smin:
                        append(sid)
                        if len(out) == count:
                            return out
                i = k + 1
        return out

    def get(self, sid: StreamID, last_node: list | None = None):
        """The field/value list of live entry `sid`, or None.

        `last_node`: a 2-item list [master key, entries] the caller keeps
        across lookups while the stream does not change (XCLAIM, XAUTOCLAIM, a
        history read), starting as [None, None]: it holds the last node
        decoded, so lookups in ID order decode each node once, not once per
        entry. Only one node is kept: holding every node a command touched
        costs more (GC) than it saves when the IDs are scattered. The entry
        `sid`, if any, is in the node with the greatest master key <= sid (a
        node's entries are >= its master ID and < the next node's)."""
        if last_node is None:
            for found, fv in self.iter_range(sid, sid):
                return fv if found == sid else None
            return None
        it = self.rax.iterator()
        if not it.seek("<=", sid[0].to_bytes(8, "big") + sid[1].to_bytes(8, "big")):
            return None
        key = it.key
        if last_node[0] == key:
            entries = last_node[1]
        else:
            entries = _decode_node(it.data, int.from_bytes(key[:8], "big"), int.from_bytes(key[8:], "big"))
            last_node[0] = key
            last_node[1] = entries
        # (sid,) sorts just before (sid, fields): bisect compares IDs only.
        i = bisect_left(entries, (sid,))
        if i < len(entries) and entries[i][0] == sid:
            return entries[i][1]
        return None

    def first_entry(self):
        for item in self.iter_range(MIN_ID, MAX_ID):
            return item
        return None

    def last_entry(self):
        for item in self.iter_range(MIN_ID, MAX_ID, reverse=True):
            return item
        return None

    def _first_live_id(self) -> StreamID:
        item = self.first_entry()
        return item[0] if item is not None else MAX_ID

    # ------------------------------------------------------------------ editing

    def _edit(self, key: bytes, lp, edit) -> None:
        """Apply `edit(bytearray)` to node `key`; sealed nodes stay exact-size bytes."""
        if lp.__class__ is bytearray:
            edit(lp)
        else:
            buf = bytearray(lp)
            edit(buf)
            self.rax.insert(key, bytes(buf))

    def _remove_node(self, key: bytes) -> None:
        removed, _old = self.rax.remove(key)
        invariant(removed, "stream node vanished from the rax")
        if self._tail is not None and key == self._tail_key:
            self._tail = None

    def delete(self, sid: StreamID) -> bool:
        """XDEL of one ID (redis streamDeleteItem + xdelCommand's bookkeeping).

        Marks the entry DELETED, drops the node when its last live entry goes,
        and updates length, first_id and max_deleted_entry_id."""
        target = (sid[0], sid[1])
        for key, lp in self._nodes(StreamID(*target).encode(), False):
            mms, mseq = StreamID.decode(key)
            master = _Master(lp)
            for fp, flags, msd, seqd in _walk_offsets(lp, master.first_entry, len(master.names)):
                if flags & FLAG_DELETED:
                    continue
                cur = ((mms + msd) & _M64, (mseq + seqd) & _M64)
                if cur < target:
                    continue
                if cur != target:
                    return False
                self._mark_deleted(key, lp, master, fp, flags)
                if target == self.first_id:
                    self.first_id = MIN_ID if self.length == 0 else self._first_live_id()
                elif self.length == 0:
                    self.first_id = MIN_ID
                if target > self.max_deleted_entry_id:
                    self.max_deleted_entry_id = StreamID(*target)
                return True
        return False

    def _mark_deleted(self, key: bytes, lp, master: _Master, fp: int, flags: int) -> None:
        if master.count == 1:
            self._remove_node(key)
        else:
            def edit(buf):
                lp_replace_int(buf, fp, flags | FLAG_DELETED)
                _set_master_counts(buf, master.count - 1, master.deleted + 1)
            self._edit(key, lp, edit)
        self.length -= 1

    def trim(self, strategy: str, threshold, approx: bool, limit: int) -> int:
        """redis streamTrim: MAXLEN (int) or MINID (StreamID); returns entries removed.

        approx: only whole nodes go. limit: at most this many entries go (0 = no limit)."""
        if strategy not in ("maxlen", "minid"):
            invariant(False, "unknown trim strategy %r" % (strategy,))
        invariant(limit >= 0, "negative trim limit")
        by_len = strategy == "maxlen"
        if by_len:
            maxlen = threshold
            invariant(maxlen >= 0, "negative MAXLEN")
            if self.length <= maxlen:                  # XADD MAXLEN's usual case: no seek
                return 0
        else:
            minid = (threshold[0], threshold[1])
        deleted = 0
        for key, lp in self._nodes(_ZERO_KEY, False):
            if by_len and self.length <= maxlen:
                break
            entries = lp_get_int(lp, LP_HDR_SIZE)      # the node's live count
            if limit and deleted + entries > limit:
                break
            mms, mseq = StreamID.decode(key)
            if by_len:
                remove_node = self.length - entries >= maxlen
            else:
                remove_node = _node_last_id(lp, mms, mseq) < minid
            if remove_node:
                self._remove_node(key)
                self.length -= entries
                deleted += entries
                continue
            if approx:
                break
            master = _Master(lp)
            marks = []                                 # flags offsets to tombstone
            for fp, flags, msd, seqd in _walk_offsets(lp, master.first_entry, len(master.names)):
                if by_len:
                    if self.length - len(marks) <= maxlen:
                        break
                elif ((mms + msd) & _M64, (mseq + seqd) & _M64) >= minid:
                    break
                if not flags & FLAG_DELETED:
                    marks.append((fp, flags | FLAG_DELETED))
            if marks:
                def edit(buf):
                    for fp, fl in marks:               # flags 0..3 keep their 2 bytes
                        lp_replace_int(buf, fp, fl)
                    _set_master_counts(buf, entries - len(marks), master.deleted + len(marks))
                self._edit(key, lp, edit)
                self.length -= len(marks)
                deleted += len(marks)
            break
        if self.length == 0:
            self.first_id = MIN_ID
        elif deleted:
            self.first_id = self._first_live_id()
        return deleted

    def check(self) -> None:
        """Verify every node and counter (O(stream); tests and debugging).
        Raises InvariantViolation: unlike a dump, a live Stream is our own doing."""
        try:
            total = 0
            for key, lp in self.rax.items():
                total += _check_node(key, lp)
        except CorruptStream as exc:
            invariant(False, "stream node broken: %s" % exc)
        invariant(total == self.length, "length %d, nodes hold %d" % (self.length, total))
        invariant(self.entries_added >= self.length, "entries_added below length")
        if self.length == 0:
            invariant(self.first_id == MIN_ID, "empty stream with first_id %r" % (self.first_id,))
        else:
            invariant(self.first_id == self._first_live_id(), "first_id is not the first entry")
            invariant(self.last_id >= self.last_entry()[0], "last_id below the last entry")
        if self._tail is not None:
            last = self.rax.last()
            invariant(last is not None and last[0] == self._tail_key and last[1] is self._tail,
                      "tail cache is not the rax's last node")
            master = _Master(self._tail)
            invariant(master.names == self._tail_names
                      and master.count + master.deleted == self._tail_items
                      and StreamID.decode(self._tail_key) == (self._tail_ms, self._tail_seq),
                      "tail cache disagrees with the tail node")

    # ------------------------------------------------------------------ dump / load

    def dump_entries(self) -> bytes:
        parts = [_DUMP_HEADER.pack(_DUMP_MAGIC, _DUMP_VERSION, self.length,
                                   self.last_id.ms, self.last_id.seq,
                                   self.first_id.ms, self.first_id.seq,
                                   self.max_deleted_entry_id.ms, self.max_deleted_entry_id.seq,
                                   self.entries_added, self.rax.numele)]
        for key, lp in self.rax.items():
            parts.append(_DUMP_NODE.pack(key, len(lp)))
            parts.append(bytes(lp))
        body = b"".join(parts)
        return body + _DUMP_CRC.pack(zlib.crc32(body))

    @staticmethod
    def load_entries(buf: bytes) -> "Stream":
        """Rebuild a Stream from dump_entries() output; CorruptStream unless all of it checks out."""
        return _load(buf)


def _decode_node(lp, mms: int, mseq: int) -> list:
    """[(StreamID, [field, value, ...])] of a node's live entries, in order.

    One lp_decode_all pass, then a walk over the element list (the XRANGE hot
    path: no per-entry generator or comprehension frames)."""
    els = lp_decode_all(lp)
    nmf = els[2]
    names = [v if v.__class__ is bytes else b"%d" % v for v in els[3:3 + nmf]]
    if nmf == 1:
        name0 = names[0]
    elif nmf == 2:
        name0, name1 = names
    n = len(els)
    i = 4 + nmf
    out = []
    append = out.append
    new_id = _new_id
    sid_cls = StreamID
    m64 = _M64
    while i < n:
        flags = els[i]
        if flags & FLAG_SAMEFIELDS:
            k = i + 3 + nmf
            if not flags & FLAG_DELETED:
                if nmf == 2:
                    v0 = els[i + 3]
                    v1 = els[i + 4]
                    fv = [name0, v0 if v0.__class__ is bytes else b"%d" % v0,
                          name1, v1 if v1.__class__ is bytes else b"%d" % v1]
                elif nmf == 1:
                    v0 = els[i + 3]
                    fv = [name0, v0 if v0.__class__ is bytes else b"%d" % v0]
                else:
                    fv = [None] * (2 * nmf)
                    fv[0::2] = names
                    fv[1::2] = [v if v.__class__ is bytes else b"%d" % v for v in els[i + 3:k]]
                append((new_id(sid_cls, ((mms + els[i + 1]) & m64, (mseq + els[i + 2]) & m64)), fv))
        else:
            k = i + 4 + 2 * els[i + 3]
            if not flags & FLAG_DELETED:
                fv = [v if v.__class__ is bytes else b"%d" % v for v in els[i + 4:k]]
                append((new_id(sid_cls, ((mms + els[i + 1]) & m64, (mseq + els[i + 2]) & m64)), fv))
        i = k + 1
    return out


def _node_last_id(lp, mms: int, mseq: int):
    """redis lpGetEdgeStreamID(first=0): the last entry's ID, tombstones included."""
    p = lp_last(lp)
    lp_count = lp_get_int(lp, p)
    invariant(lp_count > 0, "stream node without entries")
    for _ in range(lp_count):
        p = lp_prev(lp, p)
    p = lp_next(lp, p)                                 # past flags to ms-diff
    msd, p = lp_get_with_next(lp, p)
    seqd = lp_get_with_next(lp, p)[0]
    return ((mms + msd) & _M64, (mseq + seqd) & _M64)


# ---------------------------------------------------------------------- loading

# Nodes this process has already validated: (master key, listpack bytes) -> live count.
# _check_node is a pure function of those bytes, so a hit answers exactly what the check
# would (replicas stay deterministic; only the time differs). It is what makes a slot
# move's sealed phase short: the target validates a big stream's nodes when the pre-copy
# arrives, and the rebuilt record (STAGE) and the activation meet them again here.
# Bounded by the bytes it holds; least recently used first out.
NODE_CACHE_BYTES = 64 << 20
_checked_nodes: "OrderedDict[tuple, int]" = OrderedDict()
_checked_bytes = 0


def _check_node_cached(key: bytes, lp: bytes) -> int:
    # Snapshots load in executor threads (a group opening) while the loop thread loads
    # records, and this layer takes no locks: each OrderedDict call is atomic under the
    # GIL, a race between them only loses a recency update or finds an entry already
    # gone (KeyError, ignored), and a lost += / -= on the byte count only shifts when
    # eviction starts by at most one node (<= NODE_CACHE_BYTES // 64) per race.
    global _checked_bytes
    ck = (key, lp)
    count = _checked_nodes.get(ck)
    if count is not None:
        try:
            _checked_nodes.move_to_end(ck)
        except KeyError:
            pass
        return count
    count = _check_node(key, lp)
    size = len(key) + len(lp)
    if size <= NODE_CACHE_BYTES // 64 and ck not in _checked_nodes:
        _checked_nodes[ck] = count
        _checked_bytes += size
        while _checked_bytes > NODE_CACHE_BYTES:
            try:
                (k, old), _ = _checked_nodes.popitem(last=False)
            except KeyError:
                _checked_bytes = 0
                break
            _checked_bytes -= len(k) + len(old)
    return count


def _check_node_reference(key: bytes, lp: bytes):
    """Validate one node's listpack and stream layout; returns its live count."""
    try:
        lp_validate(lp, deep=True, max_bytes=_LP_MAX_BYTES)
    except CorruptListpack as exc:
        raise CorruptStream("node %s: %s" % (key.hex(), exc)) from None
    els = lp_decode_all(lp)
    n = len(els)
    if n < 4:
        raise CorruptStream("node %s: no master entry" % key.hex())
    count, deleted, nmf = els[0], els[1], els[2]
    for v in (count, deleted, nmf):
        if v.__class__ is not int or v < 0:
            raise CorruptStream("node %s: bad master counters" % key.hex())
    if nmf < 1 or count + deleted < 1 or 4 + nmf > n or els[3 + nmf] != 0:
        raise CorruptStream("node %s: bad master entry" % key.hex())
    i = 4 + nmf
    live = dead = 0
    while i < n:
        if i + 3 > n:
            raise CorruptStream("node %s: truncated entry" % key.hex())
        flags, msd, seqd = els[i], els[i + 1], els[i + 2]
        if flags.__class__ is not int or not 0 <= flags <= 3 \
                or msd.__class__ is not int or seqd.__class__ is not int:
            raise CorruptStream("node %s: bad entry header" % key.hex())
        if live + dead == 0 and (msd, seqd) != (0, 0):
            raise CorruptStream("node %s: first entry is not the master ID" % key.hex())
        if flags & FLAG_SAMEFIELDS:
            k = i + 3 + nmf
            want = 3 + nmf
        else:
            nf = els[i + 3] if i + 3 < n else None
            if nf.__class__ is not int or nf < 1:
                raise CorruptStream("node %s: bad entry field count" % key.hex())
            k = i + 4 + 2 * nf
            want = 4 + 2 * nf
        if k >= n or els[k] != want:
            raise CorruptStream("node %s: bad entry lp-count" % key.hex())
        if flags & FLAG_DELETED:
            dead += 1
        else:
            live += 1
        i = k + 1
    if live != count or dead != deleted:
        raise CorruptStream("node %s: counters %d/%d, entries %d/%d"
                            % (key.hex(), count, deleted, live, dead))
    return count


# The compiled twin (node/engine/_listpack_c.pyx check_stream_node) answers "valid, with this
# live count" in one C pass; on "not valid" the reference runs and raises its own error, so
# messages never differ. tests/kernels/test_stream_node_kernel.py compares the two.
_kernel = compiled("xraft.node.engine._listpack_c")
if _kernel is None:
    _check_node = _check_node_reference
else:
    _check_node_c = _kernel.check_stream_node

    def _check_node(key: bytes, lp: bytes) -> int:
        count = _check_node_c(lp, _LP_MAX_BYTES)
        return count if count >= 0 else _check_node_reference(key, lp)


def _load(buf) -> Stream:
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise CorruptStream("stream dump must be bytes")
    buf = bytes(buf)
    size = len(buf)
    if size < _DUMP_HEADER.size + _DUMP_CRC.size:
        raise CorruptStream("stream dump of %d bytes is too short" % size)
    # The nodes are sliced from `buf` up to `body_end`, and the CRC runs over a view: a
    # `body = buf[:-4]` copied the whole dump once more (a catch-up decodes state-sized dumps).
    body_end = size - _DUMP_CRC.size
    if zlib.crc32(memoryview(buf)[:body_end]) != _DUMP_CRC.unpack_from(buf, body_end)[0]:
        raise CorruptStream("stream dump CRC mismatch")
    (magic, version, length, last_ms, last_seq, first_ms, first_seq,
     del_ms, del_seq, entries_added, nodes) = _DUMP_HEADER.unpack_from(buf, 0)
    if magic != _DUMP_MAGIC or version != _DUMP_VERSION:
        raise CorruptStream("not a version %d stream dump" % _DUMP_VERSION)
    pos = _DUMP_HEADER.size
    if nodes > (body_end - pos) // (_DUMP_NODE.size + _MIN_NODE_LP):
        raise CorruptStream("stream dump claims %d nodes" % nodes)
    s = Stream()
    total = 0
    prev_key = None
    for _ in range(nodes):
        if pos + _DUMP_NODE.size > body_end:
            raise CorruptStream("stream dump truncated in a node header")
        key, lp_size = _DUMP_NODE.unpack_from(buf, pos)
        pos += _DUMP_NODE.size
        if lp_size < _MIN_NODE_LP or pos + lp_size > body_end:
            raise CorruptStream("stream node of %d bytes does not fit the dump" % lp_size)
        if prev_key is not None and key <= prev_key:
            raise CorruptStream("stream node keys not strictly increasing")
        lp = buf[pos:pos + lp_size]
        pos += lp_size
        total += _check_node_cached(key, lp)
        invariant(s.rax.insert(key, lp), "duplicate key after the order check")
        prev_key = key
    if pos != body_end:
        raise CorruptStream("%d trailing bytes in the stream dump" % (body_end - pos))
    if total != length:
        raise CorruptStream("stream length %d but nodes hold %d entries" % (length, total))
    if entries_added < length:
        raise CorruptStream("entries-added %d below length %d" % (entries_added, length))
    s.length = length
    s.last_id = StreamID(last_ms, last_seq)
    s.first_id = StreamID(first_ms, first_seq)
    s.max_deleted_entry_id = StreamID(del_ms, del_seq)
    s.entries_added = entries_added
    if length == 0:
        if s.first_id != MIN_ID:
            raise CorruptStream("empty stream with a first ID")
    else:
        if s.first_id != s._first_live_id():
            raise CorruptStream("first ID does not match the first entry")
        if s.last_id < s.last_entry()[0]:
            raise CorruptStream("last ID below the last entry")
    return s


register_type(Stream, "stream")
