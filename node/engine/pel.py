"""PelMap: the ordered map behind a pending entries list (group and consumer PELs).

redis keeps PELs in rax trees, but nothing redis reports depends on a PEL's tree
shape (XINFO prints node counts for the stream's rax only), so a PEL needs only
an ordered map by entry ID: insert, delete, lookup, first/last and ordered
iteration from an ID, both ways. A rax pays a walk over up to 16 nodes per
operation; this pays one dict operation plus, for the order, an append or a
short memmove in a bounded chunk.

    PelMap
    +-- _map:     dict  StreamID -> value        the members and their values
    +-- _chunks:  list  [[StreamID, ...], ...]   every key of _map exactly once, in
    |                                            ascending ID order, cut into runs
    +-- _maxes:   list  [StreamID, ...]          _maxes[i] is _chunks[i][-1]
    +-- _version: int                            bumped on every change of the key set

    e.g. keys 1-1 1-2 2-0 5-0 7-3, after a split:

        _chunks: [ [1-1, 1-2], [2-0, 5-0, 7-3] ]     _maxes: [ 1-2, 7-3 ]

Invariants (check()): every chunk holds 1.._CHUNK_MAX keys, strictly ascending
within and across chunks; the concatenated chunks are exactly _map's keys;
len(_maxes) == len(_chunks). Keys are StreamIDs (or plain (ms, seq) tuples,
which hash and compare the same): tuple order is ID order.

Why chunks: deliveries arrive in ID order (an append to the last chunk) and
acks mostly remove the oldest entries (a delete near a chunk's front); a bounded
chunk keeps the memmove of an out-of-order insert or delete (XCLAIM moves) short
however long the PEL grows. Chunks are split at _CHUNK_MAX and dropped when
empty, never merged: their count stays <= the number of keys, which is all
bisect needs. The chunking depends on history, but nothing observable (replies,
dumps) does: those see only the keys in order and the values.

Iteration (items) must not run across a change of the key set: the next step
raises RuntimeError, as a stale rax iterator does. Overwriting a value is fine.

Pure module: standard library only.
"""
from bisect import bisect_left, bisect_right, insort
from itertools import chain
from operator import lt

from ..invariant import invariant

# Longest chunk; a longer one is cut in two halves. 512 keeps a worst-case
# memmove at 4 KiB while a million-entry PEL needs only ~2-4k chunks.
_CHUNK_MAX = 512
_HALF = _CHUNK_MAX // 2

_ABSENT = object()


class PelMap:
    """An ordered map StreamID -> value (see the module docstring)."""

    __slots__ = ("_map", "_chunks", "_maxes", "_version")

    def __init__(self):
        self._map = {}        # StreamID -> value; the authority on membership
        self._chunks = []     # sorted runs of _map's keys; see the module docstring
        self._maxes = []      # last key of each chunk, for bisecting to a chunk
        self._version = 0     # key-set changes so far; iterators compare it

    def __len__(self) -> int:
        return len(self._map)

    @property
    def numele(self) -> int:
        """How many keys (the rax attribute name, kept for callers)."""
        return len(self._map)

    def __repr__(self) -> str:
        return "PelMap(numele=%d, chunks=%d)" % (len(self._map), len(self._chunks))

    def __contains__(self, key) -> bool:
        return key in self._map

    def find(self, key, default=None):
        """The value at `key`, or `default`."""
        return self._map.get(key, default)

    # -- changes ----------------------------------------------------------------

    def insert(self, key, value) -> bool:
        """Store `value` at `key`; True if the key is new, False if overwritten."""
        m = self._map
        if key in m:
            m[key] = value                    # same key set: chunks and iterators stay valid
            return False
        m[key] = value
        self._version += 1
        maxes = self._maxes
        if maxes and key > maxes[-1]:         # the usual case: a delivery in ID order
            chunk = self._chunks[-1]
            chunk.append(key)
            maxes[-1] = key
            if len(chunk) > _CHUNK_MAX:
                self._split(len(maxes) - 1)
            return True
        if not maxes:
            self._chunks.append([key])
            maxes.append(key)
            return True
        # key < maxes[-1] (it is not a member, so not equal): it goes in chunk i.
        i = bisect_left(maxes, key)
        chunk = self._chunks[i]
        insort(chunk, key)
        if len(chunk) > _CHUNK_MAX:
            self._split(i)
        return True

    def extend_sorted(self, keys: list, values: list) -> None:
        """Insert keys[k] -> values[k] for all k, where `keys` is strictly
        ascending, every key is new and greater than every present key (a `>`
        delivery: IDs past the group's last ID). One bulk step instead of
        len(keys) inserts."""
        n = len(keys)
        if not n:
            return
        m = self._map
        before = len(m)
        maxes = self._maxes
        invariant(not maxes or keys[0] > maxes[-1], "PEL extend: keys come after the present ones")
        invariant(n == 1 or all(map(lt, keys, keys[1:])), "PEL extend: keys strictly ascending")
        m.update(zip(keys, values))
        invariant(len(m) == before + n, "PEL extend: keys are new")
        self._version += 1
        chunks = self._chunks
        if not chunks:
            chunks.append([])
            maxes.append(None)
        chunk = chunks[-1]
        chunk.extend(keys)
        if len(chunk) > _CHUNK_MAX:
            # Keep half a chunk here and cut the rest into half chunks, so a
            # huge delivery (COUNT 0) costs one pass, not repeated halving.
            rest = chunk[_HALF:]
            del chunk[_HALF:]
            maxes[-1] = chunk[-1]
            for p in range(0, len(rest), _HALF):
                piece = rest[p:p + _HALF]
                chunks.append(piece)
                maxes.append(piece[-1])
        else:
            maxes[-1] = chunk[-1]

    def _split(self, i: int) -> None:
        """Cut chunk i (longer than _CHUNK_MAX) into two halves."""
        chunk = self._chunks[i]
        half = len(chunk) >> 1
        tail = chunk[half:]
        del chunk[half:]
        self._chunks.insert(i + 1, tail)
        self._maxes[i] = chunk[-1]
        self._maxes.insert(i + 1, tail[-1])

    def remove(self, key):
        """Delete `key`: (True, old value), or (False, None) if absent."""
        value = self._map.pop(key, _ABSENT)
        if value is _ABSENT:
            return False, None
        self._version += 1
        chunks = self._chunks
        chunk = chunks[0]
        if chunk[0] == key:                   # the usual case: acking the oldest entry
            i = j = 0
        else:
            maxes = self._maxes
            i = bisect_left(maxes, key)
            chunk = chunks[i]
            j = bisect_left(chunk, key)
        del chunk[j]
        if not chunk:
            del chunks[i]
            del self._maxes[i]
        elif j == len(chunk):
            self._maxes[i] = chunk[-1]
        return True, value

    # -- ordered access -----------------------------------------------------------

    def first(self):
        """(key, value) of the smallest key, or None when empty."""
        if not self._chunks:
            return None
        key = self._chunks[0][0]
        return key, self._map[key]

    def last(self):
        """(key, value) of the largest key, or None when empty."""
        if not self._maxes:
            return None
        key = self._maxes[-1]
        return key, self._map[key]

    def ceiling(self, key):
        """(k, value) of the smallest k >= key, or None (one seek, no iterator)."""
        maxes = self._maxes
        i = bisect_left(maxes, key)
        if i == len(maxes):
            return None
        chunk = self._chunks[i]
        k = chunk[bisect_left(chunk, key)]
        return k, self._map[k]

    def items(self, start=None, reverse=False):
        """Generate (key, value) in ID order (descending if `reverse`). `start`
        is inclusive: keys >= start forward, <= start in reverse. The key set
        must not change meanwhile (RuntimeError on the next step if it does)."""
        chunks = self._chunks
        if not chunks:
            return
        if reverse:
            yield from self._items_reverse(start)
            return
        m = self._map
        version = self._version
        if start is None:
            ci, j = 0, 0
        else:
            ci = bisect_left(self._maxes, start)
            if ci == len(chunks):
                return
            j = bisect_left(chunks[ci], start)
        while ci < len(chunks):
            # A slice: the walk over this chunk is immune to the list changing
            # under it; the version check turns such a change into an error.
            for key in chunks[ci][j:]:
                yield key, m[key]
                if self._version != version:
                    raise RuntimeError("PEL changed during iteration")
            ci += 1
            j = 0

    def _items_reverse(self, start):
        chunks = self._chunks
        m = self._map
        version = self._version
        ci = len(chunks) - 1
        j = len(chunks[ci])                   # exclusive end within chunk ci
        if start is not None:
            i = bisect_left(self._maxes, start)
            if i < len(chunks):
                ci = i
                j = bisect_right(chunks[ci], start)
        while ci >= 0:
            chunk = chunks[ci]
            for key in chunk[j - 1::-1] if j else ():
                yield key, m[key]
                if self._version != version:
                    raise RuntimeError("PEL changed during iteration")
            ci -= 1
            if ci >= 0:
                j = len(chunks[ci])

    def __iter__(self):
        """Keys in ascending order."""
        for key, _ in self.items():
            yield key

    # -- verification -------------------------------------------------------------

    def check(self) -> None:
        """Verify every invariant of the module docstring. O(n); for tests and
        for loading a snapshot."""
        chunks, maxes, m = self._chunks, self._maxes, self._map
        invariant(len(chunks) == len(maxes), "PEL: one max per chunk")
        invariant(all(1 <= len(c) <= _CHUNK_MAX for c in chunks), "PEL: chunk sizes in 1..max")
        invariant(maxes == [c[-1] for c in chunks], "PEL: maxes are the chunks' last keys")
        keys = list(chain.from_iterable(chunks))
        invariant(len(keys) == len(m), "PEL: chunks hold as many keys as the map")
        invariant(all(map(lt, keys, keys[1:])), "PEL: keys strictly ascending")
        invariant(all(map(m.__contains__, keys)), "PEL: chunk keys are the map's keys")
